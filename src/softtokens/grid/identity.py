"""A training run is what it computes, not what it is called: two runs with the same base model, data and
settings are one run, trained once, whichever grid or variant name asks for it.

Why: the sweeps grid's `fuzzy@noise0.1` and the ablations grid's `fuzzy@gamma0.1` are the same Llama-3B run (noise
factor 0.1, everything else the default cell's): ~10 GPU-hours trained twice; in the sweep's cheaper reading the
default learning rate's run and the 0.33 noise factor's are the same run at 1,000 steps.

A run's identity is the hash of its model (name and source), its training set (name and settings) and its resolved
training settings less the run's name (`variant`) and the settings that change memory, not the maths
(MEMORY_ONLY: a micro-batch and recomputation change a sum's order, nothing else; tested at world sizes 1, 2, 4 in
tests/test_paper_path.py). The code version is left out: a run made at another commit is the run these settings
ask for (its records name the commit). Every grid that shares a results directory sees the same runs, so every
grid resolves a name the same way: among the runs of one identity, the one already trained is the run (its
directory holds metrics.jsonl), else the first in config order (config.yaml lists the ablations grid before the
sweeps grid: an ablation's name, which is tested, is the home of a run both ask for). The others are
its names: their `selected.json` is written by a selection job that points at the run's (`softtokens select
--share`), and every other file of theirs is read from the run's directory."""

from __future__ import annotations

import functools
from pathlib import Path

from softtokens.store import paths
from softtokens.store.paths import Run
from softtokens.store.provenance import config_hash
from softtokens.config.grids import computing_settings

def run_identity(grid: dict, run: Run, settings: dict) -> str:
    """The identity of ``run`` of ``grid`` whose resolved training settings are ``settings`` (module docstring)."""
    return config_hash({"model": run.model, "source": grid["models"][run.model]["source"], "dataset": run.dataset,
                        "data": grid["datasets"][run.dataset], "settings": computing_settings(settings)})


def grids_sharing(config: dict, results: str) -> list[str]:
    """The grids whose runs live in ``results`` (a grid and the ones reusing its results), in config order."""
    return [name for name, g in config["grids"].items() if isinstance(g, dict) and g.get("results") == results]


def shared_runs(config: dict, grid_name: str, jobs_of) -> dict[Run, tuple[Run, str]]:
    """Each run of ``grid_name`` that is another run's name: run -> (the run it is, the grid whose name that is).
    ``jobs_of(grid) -> GridJobs`` (grid.jobs: its training runs and their settings, handed in: this module sits below
    it). Runs of one identity: the trained one, else the first in config order (whichever grid asks first)."""
    results = config["grids"][grid_name]["results"]
    groups: dict[str, list[tuple[str, Run]]] = {}
    for name in grids_sharing(config, results):
        jobs = jobs_of(name)
        for run in jobs.training_runs():
            settings = jobs.run_settings(run)
            groups.setdefault(run_identity(jobs.grid, run, settings), []).append((name, run))
    out = {}
    for members in groups.values():
        names = list(dict.fromkeys(run for _, run in members))
        if len(names) < 2:
            continue
        trained = [r for r in names if (Path(paths.run_dir(results, r)) / paths.METRICS).exists()]
        canonical = (trained or names)[0]
        where = next(g for g, r in members if r == canonical)
        for grid, run in members:
            if grid == grid_name and run != canonical:
                out[run] = (canonical, where)
    return out


class SharedRuns:
    """A grid's runs that are other runs' names (``grid.names`` of grid.targets.GridTargets), given the grid's
    targets: its config, name, training runs and run files."""

    def __init__(self, targets, jobs_of):
        """``jobs_of(grid name)``: the targets of a grid sharing these results (a run's identity is its settings)."""
        self.targets, self.jobs_of = targets, jobs_of

    @functools.cached_property
    def shared(self) -> dict[Run, tuple[Run, str]]:
        """Each run of this grid that another run of the same identity already is: run -> (that run, its grid)."""
        t = self.targets
        return shared_runs(t.config, t.name, lambda g: t if g == t.name else self.jobs_of(g))

    def trained_runs(self) -> list[Run]:
        """The training runs this grid trains itself: its runs less those another run already is."""
        return [r for r in self.targets.training_runs() if r not in self.shared]

    def select_inputs(self, model: str, dataset: str, arm: str, seed: str) -> dict[str, str]:
        """A selection's inputs: its run's metrics and checkpoints, or, for a run that is another's name, that
        run's selection, which it shares."""
        t, run = self.targets, Run(model, dataset, *paths.parse_arm(arm), int(seed))
        if run in self.shared:
            return {"shared": t.run_file(self.shared[run][0], paths.SELECTED)}
        return {"metrics": t.run_file(run, paths.METRICS), "checkpoints": t.run_file(run, paths.CHECKPOINTS)}


def shared_note(jobs) -> str | None:
    """Which of the grid's runs are trained once under another name (grid.identity), counted once above."""
    if not jobs.shared:
        return None
    names = [f"{r.model}/{r.dataset}/{r.arm}/seed{r.seed} is {grid}'s {c.arm}" for r, (c, grid) in
             sorted(jobs.shared.items())]
    return (f"{len(names)} run(s) of grid {jobs.name!r} compute what another run of these results computes (the same "
            f"model, data and settings: grid.identity), trained once and counted once: " + "; ".join(names))


