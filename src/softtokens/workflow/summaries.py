"""Which files summarise which: a table, a figure and the reproduction report are each made from
evaluation files (or training metrics), and after a run of one cell they are older than it.

Why its own module: the workflow says so at the end of such a run (Snakefile, onsuccess), so a
researcher who reran one cell knows which tables and figures no longer show it, and how to remake
them; the grid's targets (grid.targets) say what each summary reads."""

from __future__ import annotations

import os

from softtokens.store import paths
from softtokens.grid.targets import GridTargets


def summaries(targets: GridTargets) -> dict[str, list[str]]:
    """Each file that summarises others (a table, a figure, the reproduction report) -> what it is made from."""
    out = {paths.table_path(targets.results, n, "md"): targets.table_inputs(n) for n in targets.table_names()}
    for name in targets.figures.specs():
        inputs = targets.figures.inputs(name)
        out[paths.figure_path(targets.results, name)] = inputs["metrics"] + inputs["evals"]
    out[paths.report_path(targets.results, "reproduction.md")] = targets.eval_targets() + targets.loglik_targets()
    return out


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def stale_summaries(targets: GridTargets) -> list[str]:
    """Tables, figures and the reproduction report that exist but are older than a file they are made
    from: what a run of one cell (a target other than the whole grid) leaves behind."""
    stale = []
    for summary, inputs in summaries(targets).items():
        made = _mtime(summary)
        if made is not None and any((t := _mtime(p)) is not None and t > made for p in inputs):
            stale.append(summary)
    return stale
