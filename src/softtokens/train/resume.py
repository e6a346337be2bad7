"""A run's resume state, so that a preempted, killed or crashed 4k-step run loses at most the
steps since its last save, and never trains on damaged state. It lives in ``state_dir``
(``_resume/``), which the workflow does not declare as an output: Snakemake deletes a failed job's
declared outputs. On success the checkpoints move into the declared ``checkpoints/`` and the state
is removed. Each attempt of the run is logged beside it (``attempts.jsonl``).

What is in it, and why each piece survives a kill or a power loss at any instant:
- ``latest/`` and ``previous/``: the two newest complete saves (weights, sharded AdamW state,
  schedule). A save blocks training only while its state is copied to host memory; a background
  thread (train.saving.SaveWriter) then writes it to ``.latest.tmp``, fsync'd file by file, its manifest
  (``trainer_state.json``: every file's size and sha256, model.checkpoint) last and fsync'd, and
  only then makes ``latest`` ``previous`` and the new one ``latest`` (each rename fsync'd). A kill
  while it writes leaves the two complete saves as they were;
- ``best-stepN/``: the best checkpoint so far, written once per improvement the same way; a save names
  the one it goes with (``best_step``), so falling back to ``previous`` falls back to its best too;
- ``metrics.jsonl``: one row per step, appended; a last line cut off mid-write is removed on resume,
  with a warning naming the file.
On resume every file of ``latest`` (and its best) is hashed against its manifest, once (the trainer's
load of it does not hash it again: ``verified``); a mismatch falls back to ``previous``, then to a fresh
start, saying so in the log and, as a ``resume`` row, in the metrics.
Damaged saves are moved aside (``_resume.unusable-<time>/``), never deleted."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path


from softtokens.model.checkpoint import TrainerState, checkpoint_problem
from softtokens.store.files import atomic_dir, cut_partial_tail, fsync_path, read_json, read_jsonl, write_jsonl
from softtokens.store.paths import ATTEMPTS, TENSORBOARD
from softtokens.train.saving import SCHEDULER, SaveWriter, agree_on_failure
from softtokens.train.sharding import load_optimizer

STOP_SIGNALS = ("SIGTERM", "SIGUSR1")  # SLURM's time-limit warning, a preemption, scancel
GENERATIONS = ("latest", "previous")   # the complete saves kept, newest first


class ResumeStore:
    """``state_dir`` of one run; ``dp`` (train.distributed.DataParallel) says which process writes.
    ``recovered``: how the state was chosen when the newest save could not be used (None otherwise)."""

    def __init__(self, state_dir: Path, dp):
        self.dir, self.dp = Path(state_dir), dp
        self.latest, self.previous = (self.dir / g for g in GENERATIONS)
        self.recovered: dict | None = None
        self.writer = SaveWriter(self)
        if self.dp.is_main:
            warning = cut_partial_tail(self.dir / "metrics.jsonl")
            if warning:
                print(warning, flush=True)
        self._choose_state()
        self.verified = self.latest.exists()   # every byte of ``latest`` matched its manifest just now

    def best_dir(self, step: int) -> Path:
        return self.dir / f"best-step{step:06d}"

    def best_of(self, state: TrainerState) -> Path | None:
        """The best checkpoint a save goes with (a save from before best_step was recorded: ``best``)."""
        if state.best_step is not None:
            return self.best_dir(state.best_step)
        return self.dir / "best" if state.best_val >= 0 else None

    def _problem(self, generation: Path) -> str | None:
        """Why a save cannot be resumed from (None: every byte is what was written, its best too)."""
        problem = checkpoint_problem(generation, content=True)
        if problem:
            return problem
        best = self.best_of(TrainerState.read(generation))
        if best is not None:
            if not best.exists():
                return f"{best} is missing, but {generation / 'trainer_state.json'} says a best checkpoint was saved"
            return checkpoint_problem(best, content=True)
        return None

    def _choose_state(self) -> None:
        """The newest save whose every file matches its manifest becomes ``latest``; a damaged one is
        moved aside; with none usable the run starts again from step 0 (it is deterministic, so it ends
        where it would have). Only the main process looks and moves; the others wait."""
        self.dp.barrier()
        if self.dp.is_main:
            if not self.latest.exists() and self.previous.exists():   # killed between _rotate's two renames
                os.replace(self.previous, self.latest)
                fsync_path(self.dir)
                print(f"resume state: {self.latest} was being replaced when the run stopped; resuming from the "
                      "save before it", flush=True)
            # newest first, each save hashed only until one is whole: with ``latest`` whole, ``previous`` is not
            # read (the next save rotates it away); the trainer then loads ``latest`` without hashing it again
            damaged, usable = [], []
            for g in (self.latest, self.previous):
                problem = self._problem(g) if g.exists() else None
                if problem:
                    damaged.append((g, problem))
                elif g.exists():
                    usable.append(g)
                    break
            aside = self.dir.with_name(f"{self.dir.name}.unusable-{time.strftime('%Y%m%d-%H%M%S')}")
            if damaged and not usable:
                shutil.move(str(self.dir), str(aside))
                self.recovered = {"state": "fresh", "reason": damaged[0][1], "aside": str(aside)}
                print(f"WARNING: resume state not used ({damaged[0][1]}); moved to {aside}; starting again from "
                      "step 0", flush=True)
            elif damaged:
                aside.mkdir(parents=True, exist_ok=True)
                for g, _ in damaged:
                    shutil.move(str(g), str(aside / g.name))
                if usable[0] != self.latest:
                    os.replace(usable[0], self.latest)
                    fsync_path(self.dir)
                step = TrainerState.read(self.latest).step
                self.recovered = {"state": "previous", "reason": damaged[0][1], "aside": str(aside), "step": step}
                print(f"WARNING: resume state at {damaged[0][0]} not used ({damaged[0][1]}); moved to {aside}; "
                      f"falling back to the previous complete save (step {step})", flush=True)
            self.drop_unreferenced_best()
        self.dp.barrier()

    def drop_unreferenced_best(self) -> None:
        """Best checkpoints no kept save goes with (written after the last complete save, or left by a
        save that was replaced): a resumed run writes them again when it gets there."""
        keep = {self.best_of(TrainerState.read(g)) for g in (self.latest, self.previous) if TrainerState.exists(g)}
        for d in self.dir.glob("best-step*"):
            if d.is_dir() and d not in keep:
                shutil.rmtree(d)

    def state(self) -> TrainerState | None:
        """The saved state to resume from, if any."""
        return TrainerState.read(self.latest) if TrainerState.exists(self.latest) else None

    def saved_step(self) -> int:
        state = self.state()
        return state.step if state else 0

    # ------------------------------------------------------------ metrics
    def metrics(self, upto: int) -> list[dict]:
        return [m for m in read_jsonl(self.dir / "metrics.jsonl") if m["step"] <= upto]

    def rewrite_metrics(self, metrics: list[dict]) -> None:
        """Drop rows past the resumed step (they were logged after the last save)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.dp.is_main:
            write_jsonl(self.dir / "metrics.jsonl", metrics)

    def log(self, row: dict) -> None:
        if self.dp.is_main:
            with open(self.dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")

    # ------------------------------------------------------------ checkpoints
    def save(self, name: str, state: TrainerState, policy, tokenizer, opt=None, sched=None) -> None:
        """A consolidated ``save_pretrained`` directory of the master weights (loads with plain
        from_pretrained), and with ``opt`` the sharded AdamW state and the schedule, for resume: ``latest``
        (the one before it becomes ``previous``) or ``best`` (as best-stepN). Every process takes part and
        returns once its part is in host memory; the files are written in the background (train.saving:
        ``wait`` until they are)."""
        self.writer.save(name, state, policy, tokenizer, opt, sched)

    def wait(self) -> None:
        """Until every save in flight is complete and in place, on every process (collective); a save that failed
        on any process raises SaveFailed on all of them (train.saving.agree_on_failure): the saves before it stand,
        and the run resumes from the last complete one."""
        try:
            self.writer.wait()
        except Exception as err:  # noqa: BLE001 - every process is told
            agree_on_failure(self.dp, err)
            raise
        agree_on_failure(self.dp, None)

    def failure(self) -> BaseException | None:
        """A save of this process that has failed so far (not waiting for one in flight); None: none."""
        return self.writer.failure()

    @contextmanager
    def settling(self):
        """Around a run: on its way out through an exception, the save in flight completes first, and that
        save's own failure is printed instead of hiding the one the run is failing with."""
        try:
            yield
        except BaseException:
            try:
                self.writer.wait()   # this process's own saves: the others may not be here (no collective)
            except Exception as e:  # noqa: BLE001 - reported, the run's own exception goes on
                print(f"WARNING: the save in flight failed too ({type(e).__name__}: {e}); the resume state is the "
                      f"last complete save, {self.latest}", flush=True)
            raise

    def load_optimizer(self, policy, opt, sched) -> None:
        load_optimizer(policy, opt, self.latest / "optimizer")
        sched.load_state_dict(read_json(self.latest / SCHEDULER))

    @property
    def tensorboard(self) -> Path:
        """The live TensorBoard event files (train.telemetry), kept across attempts."""
        return self.dir / TENSORBOARD

    def finish(self, checkpoints_dir: Path, metrics_path: Path, metrics: list[dict],
               tensorboard_dir: Path | None = None) -> None:
        """Move the final checkpoints (and the event files) into the declared outputs and drop the
        resume state. Main process only, after every process's collective ``wait`` (train.loop.Trainer.finish)."""
        self.writer.wait()
        if tensorboard_dir is not None:
            with atomic_dir(tensorboard_dir) as tmp:
                if self.tensorboard.is_dir():
                    for event_file in self.tensorboard.iterdir():
                        shutil.move(str(event_file), str(tmp / event_file.name))
        state = TrainerState.read(self.latest)
        with atomic_dir(checkpoints_dir) as tmp:
            shutil.move(str(self.best_of(state)), str(tmp / "best"))
            shutil.move(str(self.latest), str(tmp / "latest"))
            shutil.rmtree(tmp / "latest" / "optimizer", ignore_errors=True)  # resume state only
            (tmp / "latest" / SCHEDULER).unlink(missing_ok=True)
            state.drop_files(tmp / "latest", "optimizer", SCHEDULER)
        write_jsonl(metrics_path, metrics)
        shutil.rmtree(self.dir)

    # ------------------------------------------------------------ attempts
    @property
    def attempts_path(self) -> Path:
        """Beside the resume state, not in it: a damaged state moved aside, a finished run's state
        removed, a forced rerun from step 0 all keep counting the run's attempts."""
        return self.dir.parent / ATTEMPTS

    def attempts(self) -> list[dict]:
        """Every attempt of this run so far (this one last): job id, host, the step it resumed from."""
        return read_jsonl(self.attempts_path)

    def start_attempt(self, start_step: int) -> None:
        """One line per attempt in the log and in attempts.jsonl (kept in provenance)."""
        record = {"attempt": len(self.attempts()) + 1, "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
                  "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT"), "host": socket.gethostname(),
                  "pid": os.getpid(), "resumed_from_step": start_step,
                  "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        if self.dp.is_main:
            self.attempts_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.attempts_path, "a") as f:
                f.write(json.dumps(record) + "\n")
            start = f"resumed from step {start_step}" if start_step else "fresh start at step 0"
            print(f"=== attempt {record['attempt']}: job {record['slurm_job_id'] or '-'} on {record['host']} "
                  f"(pid {record['pid']}) at {record['started_at']}: {start}", flush=True)


class StopSignals:
    """While active, SIGTERM / SIGUSR1 only set ``received``: the loop finishes its step, saves
    the resume state and exits non-zero, so Snakemake's retry or SLURM's requeue resumes it."""

    def __init__(self):
        self.received: str | None = None
        self._old: dict = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            self._old = {name: signal.signal(getattr(signal, name), self._on_signal) for name in STOP_SIGNALS}
        return self

    def _on_signal(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def __exit__(self, *exc) -> None:
        for name, old in self._old.items():
            signal.signal(getattr(signal, name), old)
