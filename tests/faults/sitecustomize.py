"""Fault injection for tests that run training in another process (the CLI, torchrun, Snakemake).

Production code holds no fault switches: a test puts this directory first on PYTHONPATH and sets
SOFTTOKENS_TEST_FAULT (tests/conftest.py, ``fault_env``); every Python process started below it
then patches the training loop when the loop is first imported:
- ``crash_at_step=N``: the run raises before training step N + 1 (a crash mid-run);
- ``crash_in_save=N``: writing the ``latest`` checkpoint of step N raises after its weights and
  optimizer are written, before its state file (a crash mid-checkpoint);
- ``kill_in_save=N:PHASE``: the process is SIGKILLed by the background writer of step N's ``latest``
  save (train.saving), at PHASE: ``staged`` (in host memory, nothing written), ``files`` (weights,
  tokenizer, schedule and optimizer shards written, no manifest), ``sealed`` (the manifest written,
  not yet in place) or ``retired`` (the old ``latest`` renamed ``previous``, the new one not yet
  ``latest``);
- ``fail_save_on_rank=R``: every background save of process R fails (as a full disk fails a write), the other
  processes' saves succeed;
- ``sigkill_at_step=N``: the training process is SIGKILLed before step N + 1, as the kernel's OOM killer
  ends a process (exit status 137, nothing flushed);
- ``sigkill_in_finish``: the training process is SIGKILLed once every step is done and saved, before its outputs
  are moved into place (Trainer.finish);
- ``machine_memory=TOTAL_MB:AVAILABLE_MB``: this machine reports that much memory (sizing.host.machine_memory),
  so a test can run a workflow on a machine smaller than its jobs."""

import importlib.abc
import importlib.util
import os
import signal
import sys
import threading

FAULT = os.environ.get("SOFTTOKENS_TEST_FAULT", "")


def _inject(loop) -> None:
    kind, _, value = FAULT.partition("=")
    n = int(value) if value.isdigit() else None
    if kind == "crash_at_step":
        real_step = loop.Trainer.train_step

        def train_step(self, step):
            if step == n:
                raise RuntimeError(f"injected crash before step {step + 1} (SOFTTOKENS_TEST_FAULT={FAULT})")
            return real_step(self, step)
        loop.Trainer.train_step = train_step
    elif kind == "crash_in_save":
        real_write = loop.TrainerState.write

        def write(self, checkpoint, *args, **kwargs):
            if self.step == n and os.path.basename(str(checkpoint)) == ".latest.tmp":
                raise RuntimeError(f"injected crash while writing the latest checkpoint of step {n}")
            return real_write(self, checkpoint, *args, **kwargs)
        loop.TrainerState.write = write
    elif kind == "fail_save_on_rank":
        writer = sys.modules["softtokens.train.saving"].SaveWriter
        real_submit = writer._submit

        def _submit(self, step, write):
            if self.store.dp.rank == n:
                def write(step=step):
                    raise OSError(28, f"No space left on device (injected in the save of step {step})")
            return real_submit(self, step, write)
        writer._submit = _submit
    elif kind == "sigkill_at_step":
        real_step = loop.Trainer.train_step

        def train_step(self, step):
            if step == n:
                sys.stderr.write(f"injected SIGKILL before step {step + 1}\n")
                sys.stderr.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return real_step(self, step)
        loop.Trainer.train_step = train_step
    elif kind == "sigkill_in_finish":
        real_finish = loop.Trainer.finish

        def finish(self, *args, **kwargs):
            self.store.wait()   # the last step's save complete and in place
            sys.stderr.write("injected SIGKILL before finish\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
            return real_finish(self, *args, **kwargs)
        loop.Trainer.finish = finish
    elif kind == "kill_in_save":
        step, _, phase = value.partition(":")
        _kill_in_save(sys.modules["softtokens.train.saving"].SaveWriter, int(step), phase)
    else:
        raise ValueError(f"SOFTTOKENS_TEST_FAULT={FAULT!r}: crash_at_step=N, crash_in_save=N, kill_in_save=N:PHASE, "
                         "fail_save_on_rank=R, sigkill_at_step=N, sigkill_in_finish or machine_memory=TOTAL_MB:AVAILABLE_MB")


def _machine(host) -> None:
    total, _, available = FAULT.partition("=")[2].partition(":")
    host.machine_memory = lambda: (int(total) * 10**6, int(available) * 10**6)


def _kill_in_save(writer, n: int, phase: str) -> None:
    # the step of the save this writer thread is writing (the writer's own ``step`` is the latest one submitted:
    # by the time step N's write reaches a phase, the next step may have been submitted, or a wait begun)
    writing = threading.local()
    real_submit = writer._submit

    def _submit(self, step, write):
        def tagged():
            writing.step = step
            return write()
        return real_submit(self, step, tagged)
    writer._submit = _submit

    def kill(self, where, args):
        tmp = next((a for a in args if isinstance(a, os.PathLike)), self.store.dir / ".latest.tmp")
        if getattr(writing, "step", None) == n and os.path.basename(tmp) == ".latest.tmp" and os.path.exists(tmp):
            sys.stderr.write(f"injected SIGKILL in the latest save of step {n}: {where}\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    method, after = {"staged": ("_write_files", False), "files": ("_seal", False), "sealed": ("_rotate", False),
                     "retired": ("_retire_latest", True)}[phase]
    real = getattr(writer, method)

    def patched(self, *args, **kwargs):
        if not after:
            kill(self, phase, args)
        out = real(self, *args, **kwargs)
        if after:
            kill(self, phase, args)
        return out
    setattr(writer, method, patched)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    TARGET, PATCH = ("softtokens.sizing.host", staticmethod(_machine)) if FAULT.startswith("machine_memory=") else (
        "softtokens.train.loop", staticmethod(_inject))

    def find_spec(self, name, path, target=None):
        if name != self.TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            self.PATCH(module)
        spec.loader.exec_module = exec_module
        return spec


if FAULT:
    sys.meta_path.insert(0, _PatchOnImport())
