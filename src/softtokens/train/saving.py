"""A save of the resume state (or of a best checkpoint) off the training's critical path: every process
copies its part to host memory (the consolidated weights on the main process, each process's AdamW shards
through ``dcp.async_save``) and goes back to training; one writer thread of the main process then writes
the files into a temporary directory, fsyncs them, writes the manifest last (model.checkpoint) and only
then puts the save in place (train.resume: ``latest`` rotated to ``previous``). A kill at any point of
that leaves the complete saves as they were; the order is tested point by point (tests/faults)."""

from __future__ import annotations

import os
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from softtokens.model.checkpoint import TrainerState
from softtokens.store.files import fsync_path, fsync_tree, write_json
from softtokens.train.sharding import (
    checkpoint_shell,
    save_optimizer_async,
    staged_weights,
    write_pretrained,
)

SCHEDULER = "scheduler.json"   # the learning-rate schedule's state, as JSON (a resume state holds data only)


class SaveWriter:
    """The saves of one ResumeStore (``store``: its directories and process group). One writer thread:
    saves complete in the order they were made (a best checkpoint before the ``latest`` that names it). Its
    thread is not a daemon: a run that ends, or fails, with a save in flight finishes writing it before the
    process exits (a kill does not: the manifest-last order covers that)."""

    def __init__(self, store):
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="resume-save")
        self._pending: list[Future] = []
        self.step: int | None = None                      # the step the saves in flight hold
        self._staged: tuple[int, dict] | None = None       # (step, its weights in host memory) while they run
        self._shell = None   # what save_pretrained reads besides the weights (train.sharding.checkpoint_shell)

    def save(self, name: str, state: TrainerState, policy, tokenizer, opt=None, sched=None) -> None:
        """Stage ``name``'s save of ``state`` (collective: every process) and queue its write. Saves of one
        step share their weights' snapshot; a save of a later step first waits for the ones in flight, so
        host memory holds one step's state at most."""
        store, dp = self.store, self.store.dp
        if self.step not in (None, state.step):
            store.wait()   # collective: a save that failed on any process stops every one (train.resume)
        final = store.latest if name == "latest" else store.best_dir(state.step)
        tmp = store.dir / f".{name}.tmp"
        if dp.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dp.barrier()
        if self._staged is None or self._staged[0] != state.step:
            weights = staged_weights(policy)   # collective: every process, the main one keeps it
            self._staged = (state.step, weights if dp.is_main else {})
        optimizer = save_optimizer_async(policy, opt, tmp / "optimizer", dp.save_group) if opt is not None else None
        if not dp.is_main:   # its optimizer shards are its whole part
            self._submit(state.step, optimizer.result if optimizer is not None else (lambda: None))
            return
        tokenizer.save_pretrained(tmp)
        if sched is not None:   # JSON: a resume state holds data only (model.data_only)
            write_json(tmp / SCHEDULER, sched.state_dict())
        weights = self._staged[1]
        self._shell = shell = self._shell or checkpoint_shell(policy)

        def write() -> None:
            self._write_files(shell, weights, tmp, optimizer)
            self._seal(tmp, state)
            if name == "latest":
                self._rotate(tmp)
            else:
                self._place(tmp, final)
        self._submit(state.step, write)

    def _submit(self, step: int, write) -> None:
        self._pending.append(self._pool.submit(write))
        self.step = step

    def wait(self) -> None:
        """Until every save in flight is complete and in place; the first that failed raises here (the saves
        before it stand)."""
        pending, self._pending, self.step, self._staged = self._pending, [], None, None
        first = next((e for e in (f.exception() for f in pending) if e is not None), None)
        if first is not None:
            raise first

    def failure(self) -> BaseException | None:
        """The first save of this process that has failed so far, without waiting for the rest (None: none)."""
        return next((f.exception() for f in self._pending if f.done() and f.exception() is not None), None)

    # the background write of one save (the main process), in the order a kill must be survived at
    def _write_files(self, shell, weights: dict, tmp: Path, optimizer: Future | None) -> None:
        write_pretrained(shell, weights, tmp)
        if optimizer is not None:
            optimizer.result()   # every process's shards and the metadata written (collective, in DCP's thread)

    def _seal(self, tmp: Path, state: TrainerState) -> None:
        fsync_tree(tmp)
        state.write(tmp, durable=True)  # last, with every other file's size and sha256 (model.checkpoint)

    def _place(self, tmp: Path, final: Path) -> None:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        fsync_path(self.store.dir)

    def _rotate(self, tmp: Path) -> None:
        """``latest`` -> ``previous``, the new save -> ``latest``: at every instant a complete save is
        under one of the two names (a kill between the renames leaves ``previous`` and the new one aside:
        train.resume puts ``previous`` back)."""
        self._retire_latest()
        os.replace(tmp, self.store.latest)
        fsync_path(self.store.dir)
        self.store.drop_unreferenced_best()

    def _retire_latest(self) -> None:
        store = self.store
        if store.latest.exists():
            shutil.rmtree(store.previous, ignore_errors=True)
            os.replace(store.latest, store.previous)


class SaveFailed(RuntimeError):
    """A save that failed on some process of a run: raised on every process (agree_on_failure)."""


def agree_on_failure(dp, failure: BaseException | None, failed_somewhere: bool | None = None) -> None:
    """Collective: raise SaveFailed on every process when ``failure`` is set on any (``failed_somewhere``: already
    summed by the caller's own collective), naming each failing rank and its cause. Why: a save that failed on one
    process only left the others waiting in their next collective until the group's time-out (30 minutes)."""
    if failed_somewhere is None:
        (failed_somewhere,) = (v > 0 for v in dp.sum([float(failure is not None)]))
    if not failed_somewhere:
        return
    said = dp.gather_objects(None if failure is None else f"{type(failure).__name__}: {failure}")
    causes = "; ".join(f"rank {r}: {cause}" for r, cause in enumerate(said) if cause is not None)
    raise SaveFailed(f"a save failed ({causes}); every process of the run stops (rank {dp.rank} here). The last "
                     "complete save stands: a rerun resumes from it") from failure
