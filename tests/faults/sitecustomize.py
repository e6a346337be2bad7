"""Fault injection for tests that run training in another process (the CLI, torchrun, Snakemake).

Production code holds no fault switches: a test puts this directory first on PYTHONPATH and sets
SOFTTOKENS_TEST_FAULT (tests/conftest.py, ``fault_env``); every Python process started below it
then patches the training loop when the loop is first imported:
- ``crash_at_step=N``: the run raises before training step N + 1 (a crash mid-run);
- ``crash_in_save=N``: writing the ``latest`` checkpoint of step N raises after its weights and
  optimizer are written, before its state file (a crash mid-checkpoint)."""

import importlib.abc
import importlib.util
import os
import sys

FAULT = os.environ.get("SOFTTOKENS_TEST_FAULT", "")


def _inject(loop) -> None:
    kind, _, value = FAULT.partition("=")
    n = int(value)
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
    else:
        raise ValueError(f"SOFTTOKENS_TEST_FAULT={FAULT!r}: crash_at_step=N or crash_in_save=N")


class _PatchOnImport(importlib.abc.MetaPathFinder):
    TARGET = "softtokens.train.loop"

    def find_spec(self, name, path, target=None):
        if name != self.TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            _inject(module)
        spec.loader.exec_module = exec_module
        return spec


if FAULT:
    sys.meta_path.insert(0, _PatchOnImport())
