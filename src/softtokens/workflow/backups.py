"""Settling the backups Snakemake keeps of ``update()`` outputs, when Snakemake itself was killed.

Why: the rules that rerun expensive work (train, evaluate, evaluate_loglik) declare their outputs
``update()``, so Snakemake keeps them while the job runs, backs them up, and puts them back if the
job fails: a failed rerun never leaves results resting on deleted ones. When Snakemake itself dies
(SIGKILL, a lost login node) the backup stays behind, and the next run fails copying a new backup
over it. Our jobs write their outputs only at their end, atomically, so an output that exists is
the previous good one (its stale backup goes) and one that is missing was lost in the instant of
its replacement (its backup comes back).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def settle(pairs: list[tuple[Path, Path]]) -> list[str]:
    """(output, its backup) pairs -> what was done, one line each."""
    done = []
    for output, backup in pairs:
        if not backup.exists():
            continue
        if output.exists():
            shutil.rmtree(backup) if backup.is_dir() else backup.unlink()
            done.append(f"removed a stale backup of {output} (the output is whole)")
        else:
            output.parent.mkdir(parents=True, exist_ok=True)
            os.replace(backup, output)
            done.append(f"restored {output} from the backup left by an interrupted run")
    return done
