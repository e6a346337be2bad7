"""The runs and files of a grid's hyperparameter search (config.sweeps expands its ``sweep:`` section into
training cells): what the workflow trains, selects and tabulates for it, never tests."""

from __future__ import annotations

import functools
import json
import os

from softtokens.config.grids import cell_rl
from softtokens.config.sweeps import SweepRun, sweep_runs
from softtokens.store import paths
from softtokens.store.paths import Run


class SweepTargets:
    """A grid's search (``grid.sweep`` of grid.targets.GridTargets): given the grid's targets, whose config, results
    and run files it reads."""

    def __init__(self, targets):
        self.targets = targets

    @functools.cached_property
    def runs(self) -> list[SweepRun]:
        """Trained and selected, read by the sweep tables, never tested."""
        t = self.targets
        return sweep_runs(t.grid, t.config["grids"], t.rl) if t.grid.get("sweep") else []

    @functools.cached_property
    def variants(self) -> set[str]:
        return {r.variant for r in self.runs if r.variant}

    def files(self, kind: str | None = None) -> list[str]:
        """Per swept model its table (kind "tables": md, tex, csv, html) and figure ("figures": png, pdf), and the
        summary the report reads ("summary"); every one without ``kind``."""
        models, results = sorted({r.model for r in self.runs}), self.targets.results
        out = {"tables": [paths.table_path(results, paths.sweep_name(m), ext) for m in models
                          for ext in paths.TABLE_EXTS],
               "figures": [paths.figure_path(results, paths.sweep_name(m), ext) for m in models
                           for ext in paths.FIGURE_EXTS],
               "summary": [self.summary_path()] if models else []}
        return out[kind] if kind else [f for files in out.values() for f in files]

    def summary_path(self) -> str:
        return paths.table_path(self.targets.results, paths.SWEEP_SUMMARY, "json")

    def inputs(self, name: str) -> list[str]:
        """The selections (``selected.json``) or the metrics of every run of the sweep, once each."""
        runs = sorted({Run(r.model, r.dataset, r.mode, r.variant, r.seed) for r in self.runs})
        return [self.targets.run_file(r, name) for r in runs]

    def summary_present(self) -> list[str]:
        """The report's sweep section: this grid's summary (a target), else one a grid sharing these results
        made (the sweeps grid's, beside the paper grid's): read when it exists, never planned."""
        path = self.summary_path()
        return [path] if self.runs or os.path.exists(path) else []

    def settings(self) -> str:
        """The sweep tables' job (report.sweeps): every run with its selection file, each pair's validation
        size, the grid's own values (what a model the paper did not train is compared with)."""
        t = self.targets
        runs = [{**r._asdict(), "selected": t.run_file(Run(r.model, r.dataset, r.mode, r.variant, r.seed),
                                                       paths.SELECTED)} for r in self.runs]
        sizes = {f"{r.model}/{r.dataset}": min(cell_rl(t.config, t.name, r.model, r.dataset)["val_size"],
                                               t.grid["datasets"][r.dataset].get("validation_size", 10**9))
                 for r in self.runs}
        configured = {"learning_rate": {m: float(s["lr"]) for m, s in t.grid["models"].items()},
                      "noise_factor": {m: float(t.rl["noise_factor"]) for m in t.grid["models"]}}
        return json.dumps({"grid": t.name, "toy": "toy_base" in t.grid, "runs": runs, "n_validation": sizes,
                           "configured": configured}, sort_keys=True)
