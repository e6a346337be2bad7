"""The paper's hyperparameter search (Appendix D, soft-tokens-hard-truths.tex 800-820) as training runs of a
grid: its ``sweep:`` section expanded into training cells, one variant per swept value (``lr6e-06``,
``noise0.33``), so each search run is an ordinary run of the DAG (trained, selected by greedy validation,
kept with its provenance) and the sweep's table reads them back (report.sweeps).

The paper: "we swept over {1e-5, 9e-6, ..., 2e-6, 1e-6} for each combination of models" for hard and fuzzy
training, by greedy validation, and the noise scale factor over {0.1, ..., 10} for fuzzy only. What it leaves
open (which datasets, how many seeds, how many steps) is the grid's ``sweep`` section, stated in docs/protocol.md.
A swept value equal to the grid's own (the model's ``lr``, the grid's ``noise_factor``) at the grid's steps is
the grid's default run, not a new one: its runs are shared with the grid it reuses (the paper grid's Table 1
runs), never trained twice."""

from __future__ import annotations

from typing import NamedTuple


# what a sweep may search: its key in a grid's `sweep:` section -> (the setting it sets, the variant prefix)
SWEPT = {"learning_rate": ("lr", "lr"), "noise_factor": ("noise_factor", "noise")}
SHARED_KEYS = ("pairs", "seeds", "steps")   # given once for the whole sweep, or per swept parameter


class SweepRun(NamedTuple):
    """One run of a sweep: its cell, the swept parameter and value, and the variant its runs live under
    ("" where the value is the grid's own: the default run)."""
    model: str
    dataset: str
    param: str
    value: float
    mode: str
    seed: int
    variant: str


def variant_name(param: str, value: float) -> str:
    """``lr6e-06``, ``lr1.4e-04``, ``noise0.33``: a variant name (store.paths' pattern) that reads back to its
    value (a learning rate always in scientific notation, so the names of one sweep line up)."""
    if param == "learning_rate":
        mantissa, exponent = f"{value:.6e}".split("e")
        return f"{SWEPT[param][1]}{mantissa.rstrip('0').rstrip('.')}e{exponent}"
    return f"{SWEPT[param][1]}{value:g}"


def spec_of(sweep: dict, param: str) -> dict:
    """One swept parameter's settings, the sweep's shared keys filled in (its own win)."""
    return {**{k: sweep[k] for k in SHARED_KEYS if k in sweep}, **sweep[param]}


def grid_value(param: str, grid: dict, model: str, rl: dict, default: dict | None) -> float:
    """The value the grid itself trains with: the default cell's lr (its own, else its model's; as
    config.grids.cell_lr reads it), its noise factor (``rl``: the default cell's resolved settings)."""
    if param == "learning_rate":
        return float((default or {}).get("lr", grid["models"][model]["lr"]))
    return float(rl["noise_factor"])


def _default_cell(grids: dict, grid: dict, model: str, dataset: str) -> dict | None:
    for g in (grid, grids.get(grid.get("reuse", ""), {})):
        for c in g.get("training", []):
            if (c["model"], c["dataset"], c.get("variant", "")) == (model, dataset, ""):
                return c
    return None


def sweep_runs(grid: dict, grids: dict, rl: dict) -> list[SweepRun]:
    """Every run the grid's ``sweep`` asks for (``rl``: the grid's resolved RL settings, before any cell's).
    A value equal to the grid's own, at the grid's steps, where the default cell trains that mode and seed
    (in this grid or the one it reuses), is that default run (variant "")."""
    sweep = grid.get("sweep") or {}
    out = []
    for param in (p for p in SWEPT if p in sweep):
        spec = spec_of(sweep, param)
        for model, dataset in spec["pairs"]:
            default = _default_cell(grids, grid, model, dataset)
            cell_rl = {**rl, **((default or {}).get("rl") or {})}
            same_steps = spec.get("steps") in (None, cell_rl["steps"])
            for value in spec["values"]:
                own = same_steps and float(value) == grid_value(param, grid, model, cell_rl, default)
                for mode in spec["modes"]:
                    for seed in spec["seeds"]:
                        shared = own and default is not None and mode in default["modes"] and seed in default["seeds"]
                        out.append(SweepRun(model, dataset, param, float(value), mode, int(seed),
                                            "" if shared else variant_name(param, float(value))))
    return out


def sweep_cells(grid: dict, grids: dict, rl: dict) -> list[dict]:
    """The training cells of the grid's sweep (its variants; a default run it shares is the default cell's
    and adds no cell unless this grid lacks it: then the reused grid's cell is copied, runs restricted)."""
    sweep = grid.get("sweep") or {}
    runs = sweep_runs(grid, grids, rl)
    cells: dict[tuple, dict] = {}
    for r in runs:
        key = (r.model, r.dataset, r.variant)
        if key not in cells:
            if r.variant:
                spec = spec_of(sweep, r.param)
                setting = SWEPT[r.param][0]
                cell = {"model": r.model, "dataset": r.dataset, "variant": r.variant, "modes": [], "seeds": [],
                        "rl": ({"steps": spec["steps"]} if "steps" in spec else {})}
                if setting == "lr":
                    cell["lr"] = r.value
                else:
                    cell["rl"][setting] = r.value
            else:
                own = any((c["model"], c["dataset"], c.get("variant", "")) == key for c in grid.get("training", []))
                if own:
                    continue
                default = _default_cell(grids, grid, r.model, r.dataset)
                cell = {"model": r.model, "dataset": r.dataset, "modes": [], "seeds": [],
                        **({"rl": dict(default["rl"])} if default.get("rl") else {})}
            cells[key] = cell
        cell = cells[key]
        if r.mode not in cell["modes"]:
            cell["modes"].append(r.mode)
        if r.seed not in cell["seeds"]:
            cell["seeds"].append(r.seed)
    return list(cells.values())


def expand_sweeps(config: dict, resolved_rl) -> None:
    """Every grid's ``sweep`` section added to its ``training`` cells, in place; a cell already there (a
    second expansion, or one written by hand under the same name) is kept as it is.
    ``resolved_rl(config, grid_name)``: the grid's RL settings (config.grids)."""
    grids = config.get("grids", {})
    for name, grid in grids.items():
        if not isinstance(grid, dict) or not grid.get("sweep"):
            continue
        training = grid.setdefault("training", [])
        have = {(c["model"], c["dataset"], c.get("variant", "")) for c in training}
        grid["training"] = [*training, *(c for c in sweep_cells(grid, grids, resolved_rl(config, name))
                                         if (c["model"], c["dataset"], c.get("variant", "")) not in have)]
