"""A run's resume state, so that a preempted, killed or crashed 4k-step run loses at most the
steps since its last save. It lives in ``state_dir`` (``_resume/``: ``latest``, ``best`` so far,
metrics so far), which the workflow does not declare as an output: Snakemake deletes a failed
job's declared outputs. On success the checkpoints move into the declared ``checkpoints/`` and
the state is removed. Each attempt of the run is logged beside it (``attempts.jsonl``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import torch

from softtokens.model.checkpoint import TrainerState, checkpoint_problem
from softtokens.run.files import (
    atomic_dir,
    read_jsonl,
    recover_dir,
    replace_dir,
    write_jsonl,
)
from softtokens.run.paths import ATTEMPTS, TENSORBOARD
from softtokens.train.sharding import (
    load_optimizer,
    save_optimizer,
    save_pretrained_consolidated,
)

STOP_SIGNALS = ("SIGTERM", "SIGUSR1")  # SLURM's time-limit warning, a preemption, scancel


class ResumeStore:
    """``state_dir`` of one run; ``dp`` (train.distributed.DataParallel) says which process writes."""

    def __init__(self, state_dir: Path, dp):
        self.dir, self.dp = Path(state_dir), dp
        self.latest, self.best = self.dir / "latest", self.dir / "best"
        recover_dir(self.latest)  # a crash inside replace_dir left the previous directory aside
        recover_dir(self.best)
        self._discard_unusable()

    def _discard_unusable(self) -> None:
        """A resume state with a missing, truncated or unreadable file is moved aside, never loaded:
        the run starts again from step 0 (it is deterministic, so it ends where it would have)."""
        problem = None
        if self.latest.exists():
            problem = checkpoint_problem(self.latest)
            if problem is None and self.best.exists():
                problem = checkpoint_problem(self.best)
            elif problem is None and TrainerState.read(self.latest).best_val >= 0:
                problem = f"{self.best} is missing, but latest says a best checkpoint was saved"
        if problem is None:
            return
        self.dp.barrier()
        if self.dp.is_main:
            aside = self.dir.with_name(f"{self.dir.name}.unusable-{time.strftime('%Y%m%d-%H%M%S')}")
            shutil.move(str(self.dir), str(aside))
            print(f"WARNING: resume state not used ({problem}); moved to {aside}; starting again from step 0",
                  flush=True)
        self.dp.barrier()

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
        from_pretrained), and with ``opt`` the sharded AdamW state and the schedule, for resume.
        Every process takes part (the gathers are collective); the main process writes all but the
        optimizer shards, into a temporary directory that replaces ``name`` once complete."""
        final, tmp = self.dir / name, self.dir / f".{name}.tmp"
        if self.dp.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self.dp.barrier()
        save_pretrained_consolidated(policy, tmp, self.dp.is_main)
        if opt is not None:
            save_optimizer(policy, opt, tmp / "optimizer")
        if self.dp.is_main:
            tokenizer.save_pretrained(tmp)
            if sched is not None:
                torch.save(sched.state_dict(), tmp / "scheduler.pt")
            state.write(tmp)  # last, with every other file's size (model.checkpoint)
            replace_dir(tmp, final)
        self.dp.barrier()

    def load_optimizer(self, policy, opt, sched) -> None:
        load_optimizer(policy, opt, self.latest / "optimizer")
        sched.load_state_dict(torch.load(self.latest / "scheduler.pt", weights_only=True))

    @property
    def tensorboard(self) -> Path:
        """The live TensorBoard event files (train.telemetry), kept across attempts."""
        return self.dir / TENSORBOARD

    def finish(self, checkpoints_dir: Path, metrics_path: Path, metrics: list[dict],
               tensorboard_dir: Path | None = None) -> None:
        """Move the final checkpoints (and the event files) into the declared outputs and drop the
        resume state."""
        if tensorboard_dir is not None:
            with atomic_dir(tensorboard_dir) as tmp:
                if self.tensorboard.is_dir():
                    for event_file in self.tensorboard.iterdir():
                        shutil.move(str(event_file), str(tmp / event_file.name))
        with atomic_dir(checkpoints_dir) as tmp:
            for name in ("best", "latest"):
                shutil.move(str(self.dir / name), str(tmp / name))
            shutil.rmtree(tmp / "latest" / "optimizer", ignore_errors=True)  # resume state only
            (tmp / "latest" / "scheduler.pt").unlink(missing_ok=True)
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
