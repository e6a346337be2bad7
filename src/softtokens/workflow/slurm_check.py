"""Start-up check of how the SLURM executor will follow its jobs.

Why: the executor plugin asks ``sacct`` for job states whenever the binary exists. On a cluster
without accounting (common on small ones) every ``sacct`` call fails ("Slurm accounting storage
is disabled"); after a few failed checks the plugin drops the jobs from its list and Snakemake
waits for nothing, forever, printing nothing without ``--verbose``. ``squeue`` works there. So
before any job is submitted we ask ``sacct`` once, and stop with the flag to use if it fails.
"""

from __future__ import annotations

import shutil
import subprocess

FLAG = "--slurm-status-command squeue"


def status_command_problem(chosen: str | None, run=subprocess.run, which=shutil.which) -> str | None:
    """Why the chosen status command would lose track of jobs (None when it will not).
    ``chosen``: the executor's status_command setting ('sacct', 'squeue', or empty = the plugin's
    default, which is sacct when the binary exists)."""
    command = chosen or ("sacct" if which("sacct") else "squeue")
    if command != "sacct":
        return None
    try:
        proc = run(["sacct", "--noheader", "-X", "--format=JobID", "--starttime", "now"], capture_output=True,
                   text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        said = f"{type(err).__name__}: {err}"
    else:
        if proc.returncode == 0:
            return None
        said = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
    return (f"SLURM job states come from `sacct` here, and `sacct` fails on this cluster ({said}); "
            f"Snakemake would lose track of every job and wait forever. Run with `{FLAG}` (or set "
            "`slurm-status-command: squeue` in profiles/slurm/config.yaml). See docs/cluster.md.")
