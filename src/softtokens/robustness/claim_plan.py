"""The cheapest grid that settles a set of claims: for each claim, how likely a reproduction of the
paper's grid is to reach each verdict, the seeds per run at which it reaches a decided one with the
asked-for probability, the cells it reads; then one grid for them all (each training run shared by
every claim that reads it), its forecast cost, and, under a budget, the claims that fit, best first.

Why: a researcher with an allocation does not rerun 45 trainings to check one sentence. The two
halves already exist: the judge (verdict.claims, robustness.reproducibility) and the forecast
(cost.forecast); this joins them. The grid is written as a YAML file of its own (``grids/NAME.yaml``,
which the Snakefile reads beside config.yaml), reusing the paper grid's results directory, so a run
the paper grid made already (seeds 0-2) is not trained again.

A reproduction made with this project compares two of its cells paired, question by question; the
paper publishes no per-question results to say how correlated two cells' questions are, so the
simulations read them as unpaired with the named choice ``Spec.reproduction_question_rho``
(verdict.choices), the same correlation for the draws and for the judge of each draw (stated with
each answer). The config's ``judging.margins`` apply, as in the report.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import yaml

from softtokens.cells.paper import PAPER_SEEDS as PAPER_SEEDS_OF
from softtokens.config.names import MODES
from softtokens.robustness import reproducibility as repro
from softtokens.verdict.choices import DEFAULT, Spec

PAPER_GRID = "paper"
PAPER_SEEDS = PAPER_SEEDS_OF["main"]   # the seeds behind a published cell of the main tables
GRIDS_DIR = Path("grids")   # from the repository root: the Snakefile reads every grids/*.yaml beside config.yaml


@dataclass
class ClaimCost:
    """One claim: its verdict probabilities (at the paper's seeds and at the seeds chosen), the seeds
    that settle it, the cells and runs it reads, what those cost."""

    claim: str
    p_supported: float | None
    p_undecided: float | None
    p_contradicted: float | None
    seeds_needed: int | None
    seeds_chosen: int
    p_decided_chosen: float | None
    cells: list[str] = field(default_factory=list)
    runs: list[tuple] = field(default_factory=list)        # (model, dataset, mode)
    evaluations: list[tuple] = field(default_factory=list)  # (model, trained|base, benchmark, setting)
    gpu_hours: float | None = None
    note: str = ""

    def record(self) -> dict:
        return {"claim": self.claim, "p_supported": _r(self.p_supported), "p_undecided": _r(self.p_undecided),
                "p_contradicted": _r(self.p_contradicted), "seeds_needed": self.seeds_needed,
                "seeds_chosen": self.seeds_chosen, "p_decided_at_chosen": _r(self.p_decided_chosen),
                "cells": self.cells, "gpu_hours": None if self.gpu_hours is None else round(self.gpu_hours, 1),
                "note": self.note}


def _r(x):
    return None if x is None else round(float(x), 3)


def reproduction_spec(spec: Spec = DEFAULT) -> Spec:
    """How a reproduction made here is drawn and judged: its two cells of one benchmark correlated by
    the named choice ``reproduction_question_rho`` (draws and judge alike: robustness.reproducibility)."""
    return replace(spec, question_rho=spec.reproduction_question_rho)


def cell_name(key: tuple) -> str:
    model, ds, mode, _variant, bench, setting, metric = key
    who = "base" if mode == "none" else f"{ds} {mode}"
    return f"{model} {who} / {bench} {setting} {metric}"


def assess(keys: list[str], paper: pd.DataFrame, power: float = repro.POWER, draws: int = repro.DRAWS,
           spec: Spec = DEFAULT) -> list[ClaimCost]:
    """Each claim of ``keys``: verdict probabilities over reproductions of the paper's grid at its 3
    seeds, the seeds that settle it (a decided verdict with probability ``power``), its cells."""
    from softtokens.verdict.claims import registry

    known = {d.key for d in registry()}
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise KeyError(f"unknown claim(s) {', '.join(unknown)} (claims: {', '.join(sorted(known))})")
    rspec = reproduction_spec(spec)
    truth = repro.paper_truth(paper, rspec)
    out = []
    for defn, plan in repro.paper_plans(truth, tuple(keys)):
        at_paper = repro.simulate(defn, plan, truth, PAPER_SEEDS, draws, repro.RNG_SEED, rspec)
        if at_paper.p_supported is None:
            out.append(ClaimCost(defn.key, None, None, None, None, PAPER_SEEDS, None, note=at_paper.note))
            continue
        needed, tried = repro.seeds_to_settle(defn, plan, truth, power, draws, repro.RNG_SEED, rspec)
        chosen = needed or PAPER_SEEDS
        at_chosen = next(r for r in tried if r.seeds == chosen) if needed else at_paper
        cells = sorted(repro.plan_cells(plan))
        note = "" if needed else (
            f"not settled with up to {repro.SEED_CHOICES[-1]} seeds per run (a decided verdict with probability "
            f"{tried[-1].p_decided:.2f} there): the benchmarks' questions, not the seeds, leave the intervals "
            f"wider than the margin; the grid takes the paper's {PAPER_SEEDS} seeds")
        out.append(ClaimCost(defn.key, at_paper.p_supported, at_paper.p_undecided, at_paper.p_contradicted, needed,
                             chosen, at_chosen.p_decided, [cell_name(k) for k in cells],
                             sorted({(k[0], k[1], k[2]) for k in cells if k[2] in MODES}),
                             sorted({(k[0], "base" if k[2] == "none" else k[1] + "-" + k[2], k[4], k[5])
                                     for k in cells}), note=note))
    return out


def grid_for(claims: list[ClaimCost], config: dict, name: str) -> dict:
    """A grid that reuses the paper grid and makes exactly the runs and evaluations ``claims`` read,
    each run at the most seeds any of its claims asks for."""
    paper = config["grids"][PAPER_GRID]
    seeds: dict[tuple, int] = {}
    for c in claims:
        for run in c.runs:
            seeds[run] = max(seeds.get(run, 0), c.seeds_chosen)
    cells = {}
    for (model, ds, mode), n in sorted(seeds.items()):
        cell = cells.setdefault((model, ds), {"model": model, "dataset": ds, "modes": [], "seeds": list(range(n))})
        cell["modes"].append(mode)
        cell["seeds"] = list(range(max(n, len(cell["seeds"]))))
    rl_of = {(c["model"], c["dataset"]): c.get("rl") for c in paper["training"]}
    training = []
    for (model, ds), cell in cells.items():
        cell["modes"] = [m for m in MODES if m in cell["modes"]]
        if rl_of.get((model, ds)):
            cell["rl"] = copy.deepcopy(rl_of[(model, ds)])
        training.append(cell)
    evals = sorted({e for c in claims for e in c.evaluations})
    ood = set(paper["evaluation"].get("ood_benchmarks", []))
    models = sorted({e[0] for e in evals})
    math_benchmarks = sorted({e[2] for e in evals if e[2] not in ood})
    settings = [s for s in paper["evaluation"].get("settings") or _default_settings()
                if any(e[3] == s for e in evals)]
    evaluation = {"models": models, "benchmarks": math_benchmarks or [], "ood_benchmarks":
                  sorted({e[2] for e in evals if e[2] in ood})}
    if settings:
        evaluation["settings"] = settings
    return {"reuse": PAPER_GRID, "training": training, "evaluation": evaluation}


def _default_settings() -> list[str]:
    from softtokens.config.names import SETTING_NAMES

    return list(SETTING_NAMES)


def grid_cost(config: dict, name: str, grid: dict) -> tuple[float, pd.DataFrame]:
    """(GPU-hours, the forecast's jobs) of ``grid`` added to ``config`` as ``name``."""
    from softtokens.cost.forecast import by_kind, forecast_jobs
    from softtokens.data.sources import loader_kind
    from softtokens.config.grids import check_config

    cfg = copy.deepcopy(config)
    cfg["grids"][name] = copy.deepcopy(grid)
    cfg["grid"] = name
    check_config(cfg, loader_kind)
    if not grid["training"] and not grid["evaluation"]["models"]:
        return 0.0, pd.DataFrame()
    jobs = forecast_jobs(cfg, name)
    return float(jobs.gpu_hours.sum()), by_kind(jobs)


def plan_claims(keys: list[str], config: dict, paper: pd.DataFrame, name: str | None = None,
                power: float = repro.POWER, budget: float | None = None, draws: int = repro.DRAWS) -> dict:
    """Everything `softtokens plan --claims` prints and writes: each claim assessed and costed alone, the
    claims kept (all, or under ``budget`` the best that fit, best first: the likeliest to be settled,
    then the cheapest), their grid and its forecast by job kind."""
    from softtokens.verdict.claims import judging_spec

    spec = judging_spec(config)   # the config's margins, as the report judges with them
    claims = assess(keys, paper, power, draws, spec)
    for c in claims:
        c.gpu_hours = grid_cost(config, "_one", grid_for([c], config, "_one"))[0] if c.runs or c.evaluations else None
    kept = [c for c in claims if c.gpu_hours is not None]
    dropped = [c for c in claims if c.gpu_hours is None]
    if budget is not None:
        order = sorted(kept, key=lambda c: (-(c.p_decided_chosen or 0.0), c.gpu_hours))
        kept = []
        for c in order:
            if grid_cost(config, "_try", grid_for(kept + [c], config, "_try"))[0] <= budget:
                kept.append(c)
            else:
                dropped.append(c)
    name = name or "claims-" + "-".join(sorted(c.claim for c in kept)).replace("_", "")[:60] or "claims"
    grid = grid_for(kept, config, name)
    total, kinds = grid_cost(config, name, grid) if kept else (0.0, pd.DataFrame())
    return {"name": name, "claims": claims, "kept": kept, "dropped": dropped, "grid": grid, "gpu_hours": total,
            "by_kind": kinds, "power": power, "budget": budget, "spec": reproduction_spec(spec), "draws": draws}


def write_grid(result: dict, out: Path) -> Path:
    """The grid as a YAML file of its own (``grids:`` with one entry), which `snakemake` reads from grids/."""
    header = (f"# written by `softtokens plan --claims {','.join(c.claim for c in result['kept'])}`: the runs and "
              f"evaluations these claims read,\n# {result['gpu_hours']:,.1f} GPU-hours by the forecast. Run: "
              f"snakemake --profile slurm --config grid={result['name']}\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + yaml.safe_dump({"grids": {result["name"]: result["grid"]}}, sort_keys=False))
    return out


def plan_text(result: dict) -> str:
    """What `softtokens plan --claims` prints."""
    lines = [f"claims on a budget: simulated reproductions of the paper's grid ({repro.DRAWS} draws each, the paper's "
             f"numbers as the truth; two cells of a benchmark paired with a per-question correlation of "
             f"{result['spec'].question_rho:g}, an assumption: verdict.choices; each probability ±"
             f"{1.96 * 0.5 / result['draws'] ** 0.5:.3f} at most, Monte-Carlo)", "",
             "| claim | P(supported) | P(undecided) | P(contradicted) | seeds that settle it | cells | GPU-hours alone |",
             "|---|---|---|---|---|---|---|"]
    for c in result["claims"]:
        p = [f"{x:.2f}" if x is not None else "-" for x in (c.p_supported, c.p_undecided, c.p_contradicted)]
        settle = (f"{c.seeds_needed} (P decided {c.p_decided_chosen:.2f})" if c.seeds_needed else
                  "not within 50" if c.p_supported is not None else "-")
        cost = "-" if c.gpu_hours is None else f"{c.gpu_hours:,.1f}"
        lines.append(f"| `{c.claim}` | {' | '.join(p)} | {settle} | {len(c.cells)} | {cost} |")
    lines += [f"- `{c.claim}`: {c.note}" for c in result["claims"] if c.note]
    if result["budget"] is not None:
        lines.append(f"\nwithin {result['budget']:,.1f} GPU-hours, best first: "
                     + (", ".join(f"`{c.claim}`" for c in result["kept"]) or "none")
                     + (f"; left out: {', '.join(f'`{c.claim}`' for c in result['dropped'])}" if result["dropped"] else ""))
    g = result["grid"]
    lines += ["", f"grid `{result['name']}` (reuses `{PAPER_GRID}`): " + "; ".join(
        f"{c['model']} x {c['dataset']} {'/'.join(c['modes'])} seeds 0-{len(c['seeds']) - 1}" for c in g["training"])
        + f"; evaluated: {', '.join(g['evaluation']['models'])} on "
        + ", ".join(g["evaluation"]["benchmarks"] + g["evaluation"]["ood_benchmarks"])]
    kinds = result["by_kind"]
    if not kinds.empty:
        lines += ["", "| job kind | jobs | GPU-hours |", "|---|---|---|"]
        lines += [f"| {r.rule} | {r.jobs} | {r.gpu_hours:,.1f} |" for r in kinds.itertuples()]
    lines.append(f"| **total** | | {result['gpu_hours']:,.1f} |")
    return "\n".join(lines)


def plan_json(result: dict) -> str:
    """One JSON object: how the reproductions were drawn and judged (the correlation, the margins, the
    draws and their Monte-Carlo error), each claim's record, the grid kept and its forecast."""
    spec = result["spec"]
    return json.dumps({"question_rho": spec.question_rho, "margins": dict(spec.margins), "draws": result["draws"],
                       "monte_carlo_error_at_most": round(1.96 * 0.5 / result["draws"] ** 0.5, 4),
                       "power": result["power"], "budget": result["budget"],
                       "claims": [c.record() for c in result["claims"]],
                       "kept": [c.claim for c in result["kept"]], "grid_name": result["name"], "grid": result["grid"],
                       "gpu_hours": round(result["gpu_hours"], 1)}, indent=1)
