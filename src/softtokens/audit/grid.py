"""A table held to its grid: the evaluation files its record says it was made of against the files the config asks
that table to rest on (every run, seed and setting), so that a table made from a chosen subset is named.

Why: a main table made by `softtokens tables` from every file but seed 1's printed `hard | 1 | 96.1` and audited
clean ("chain complete"): each file it read was whole, and nothing asked whether it read every file it should have.
The reproduction report is held the same way to every evaluation file of its grid."""

from __future__ import annotations

from pathlib import Path

from softtokens.audit.drift import grid_jobs, under_root

SHOWN = 4   # file names listed per problem line


def owning_grids(config: dict, path: Path) -> list[str]:
    """The grids whose results directory holds ``path`` (a path relative to the workflow's root), the config's own
    grid first."""
    names = [n for n, g in config["grids"].items() if isinstance(g, dict) and g.get("results")
             and path.as_posix().startswith(g["results"].rstrip("/") + "/")]
    return sorted(names, key=lambda n: n != config.get("grid"))


def wanted_inputs(config: dict, path: Path, stage: str) -> list[str] | None:
    """The evaluation files the config asks the table (or report) at ``path`` to be made of; None where no grid
    makes such a file (an ablation table, a file outside every grid's results)."""
    name = path.name.split(".")[0]
    for grid in owning_grids(config, path):
        jobs = grid_jobs(config, grid)
        try:
            if stage == "report":
                wanted = [*jobs.eval_targets(), *jobs.loglik_targets()]
            else:
                wanted = jobs.table_inputs(name)
        except (KeyError, ValueError):
            continue
        if wanted:
            return wanted
    return None


def _root_relative(recorded: str, root: Path | None) -> str:
    """A recorded path as the grid names its targets: relative to the workflow's root."""
    p = Path(recorded)
    if root is not None and p.is_absolute() and p.is_relative_to(root.absolute()):
        return p.relative_to(root.absolute()).as_posix()
    return p.as_posix()


def _listed(files: list[str]) -> str:
    return ", ".join(files[:SHOWN]) + (f" and {len(files) - SHOWN} more" if len(files) > SHOWN else "")


def grid_problems(config: dict | None, path: Path, rec: dict, root: Path | None) -> list[str]:
    """A table or report made from other evaluation files than its grid asks for: those it lacks (a seed, a run, a
    setting left out) and those it read that the grid does not ask for."""
    stage = rec.get("stage")
    if config is None or stage not in ("tables", "report"):
        return []
    if stage == "report" and not path.name.startswith("reproduction."):
        return []
    here = under_root(path, root)
    wanted = wanted_inputs(config, here, stage)
    if wanted is None:
        return []
    evals = {p for p in (_root_relative(i["path"], root) for i in (rec.get("inputs") or {}).values())
             if "/eval/" in p}
    missing = sorted(set(wanted) - evals)
    # a report also reads the ablation variants' files its results directory holds (grid.targets): none is extra
    extra = sorted(evals - set(wanted)) if stage == "tables" else []
    out = []
    if missing:
        out.append(f"INCOMPLETE {path}: made without {len(missing)} of the {len(wanted)} evaluation file(s) its grid "
                   f"asks for: {_listed(missing)}")
    if extra:
        out.append(f"NOT ITS GRID'S {path}: made from {len(extra)} evaluation file(s) its grid does not ask for: "
                   f"{_listed(extra)}")
    return out
