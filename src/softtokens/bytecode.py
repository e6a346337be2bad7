"""`python -m softtokens.bytecode`: the bytecode of what the workflow's jobs and the tests import, compiled once at
set-up by importing it, in two processes side by side.

Why: every job is a process that imports torch and transformers; without their bytecode each import compiles them
from source again (and a shell that sets PYTHONDONTWRITEBYTECODE, as some CI and sandbox shells do, never keeps it).
Compiling the whole environment at install (`uv pip install --compile-bytecode`: 15,500 files) took 57 s of a 66 s
set-up on a 2-core EPYC, for the ~4,000 modules the jobs read. Importing them compiles exactly those; a module this
list misses is compiled by the first process that imports it (the Makefile lets Python keep what it compiles).
`make setup` and `make test` run it before anything else; `make demo` runs it beside the DAG's first jobs, which
import neither torch nor transformers (the Makefile's BYTECODE_BESIDE)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

# two groups of about equal weight, each imported by a process of its own: the model side and the rest
GROUPS = (
    ("torch", "transformers", "transformers.models.llama.modeling_llama", "transformers.models.qwen2.modeling_qwen2",
     "accelerate", "safetensors.torch", "tokenizers", "torch.distributed.checkpoint", "torch.distributed.fsdp",
     "tensorboard.summary.writer.event_file_writer", "softtokens.train.loop", "softtokens.eval.math_eval",
     "softtokens.eval.ood", "softtokens.model.toy", "softtokens.model.packaged", "softtokens.gpucheck.run"),
    ("pandas", "matplotlib.pyplot", "seaborn", "math_verify", "yaml", "jsonschema", "datasets", "snakemake.cli",
     "snakemake.workflow", "snakemake.dag", "snakemake.scheduling", "snakemake.executors.local", "snakemake.report",
     "snakemake.api", "snakemake.persistence",
     "snakemake_executor_plugin_slurm", "pytest", "xdist", "softtokens.cli", "softtokens.report.page",
     "softtokens.report.figures", "softtokens.audit.chain", "softtokens.audit.status", "softtokens.cost.bill",
     "softtokens.robustness.claim_plan"),
)


def _import_all(names: tuple[str, ...]) -> str:
    import importlib

    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:   # noqa: BLE001 - an optional module absent here is compiled by no one: said, not fatal
            missing.append(f"{name} ({type(err).__name__})")
    return ", ".join(missing)


def main() -> int:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.setdefault("MPLBACKEND", "Agg")
    start = time.time()
    procs = [subprocess.Popen([sys.executable, "-c", f"from softtokens.bytecode import _import_all; "
                                                    f"print(_import_all({group!r}))"],
                              env=env, stdout=subprocess.PIPE, text=True) for group in GROUPS]
    missing = [p.communicate()[0].strip() for p in procs]
    if any(p.returncode for p in procs):
        print("softtokens.bytecode: an import process failed; the jobs compile what they import themselves",
              file=sys.stderr)
    said = "; ".join(m for m in missing if m)
    print(f"bytecode of the jobs' imports compiled in {time.time() - start:.0f} s"
          + (f" (not installed here: {said})" if said else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
