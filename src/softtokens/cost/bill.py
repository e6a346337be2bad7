"""The bill of a grid as whoever pays for the allocation reads it: GPU-hours by model and phase (rollout,
update, validation, saves, evaluation, log-likelihood), beside the paper's stated budget, and which of the
choices a lab can make without touching the paper's maths moves it most (the GPUs a run takes, how often the
resume state is saved). `softtokens plan` prints it; `plan --json` returns it as one object."""

from __future__ import annotations

import copy

import pandas as pd

from softtokens.cost.forecast import (
    PAPER_COST,
    PHASES,
    Throughput,
    forecast_jobs,
)
from softtokens.rates.throughput import DEFAULT, DEFAULT_FILES
from softtokens.store import paths
from softtokens.config.grids import check_config
from softtokens.grid.jobs import GridJobs
from softtokens.store.paths import Run
from softtokens.config.sweeps import SWEPT

# the choices the bill is recomputed under (each on its own, the rest as the grid sets them): the GPUs of a
# training run (sizing.gpus.resolve_gpus) and the resume-save interval in steps (train.config.save_schedule)
GPU_CHOICES = ("auto", "paper", 8)
SAVE_STEP_CHOICES = (1, 10, 25, 100)


def bill(jobs: pd.DataFrame) -> pd.DataFrame:
    """GPU-hours by model (rows, then ``total``) and phase (PHASES columns, then ``total``)."""
    cols = [f"{p}_gpu_h" for p in PHASES]
    out = jobs.groupby("model", sort=True)[cols].sum()
    out.columns = list(PHASES)
    out.loc["total"] = out.sum()
    out["total"] = out.sum(axis=1)
    return out


def _with(config: dict, grid_name: str, **grid_keys) -> dict:
    out = copy.deepcopy(config)
    grid = out["grids"][grid_name]
    for key, value in grid_keys.items():
        if key == "resume_save_steps":
            grid["rl"] = {**grid.get("rl", {}), key: value}
            for cell in grid["training"]:
                if "resume_save_steps" in cell.get("rl", {}):
                    cell["rl"]["resume_save_steps"] = value
        else:
            grid[key] = value
    return out


def levers(config: dict, grid_name: str, rates: Throughput) -> list[dict]:
    """Per choice: the grid's GPU-hours under each of its values (the rest as set), and its spread."""
    grid = config["grids"][grid_name]
    now = {"gpus_per_run": grid.get("gpus_per_run", "paper"),
           "resume_save_steps": (grid.get("rl") or {}).get("resume_save_steps", config.get("rl", {}).get(
               "resume_save_steps", 25))}
    out = []
    for key, values in (("gpus_per_run", GPU_CHOICES), ("resume_save_steps", SAVE_STEP_CHOICES)):
        totals = {str(v): float(forecast_jobs(_with(config, grid_name, **{key: v}), grid_name, rates).gpu_hours.sum())
                  for v in values}
        out.append({"choice": key, "now": str(now[key]), "gpu_hours": totals,
                    "spread": max(totals.values()) - min(totals.values())})
    return sorted(out, key=lambda d: -d["spread"])


def paper_budget(steps: list[int]) -> dict:
    """The paper's stated training cost for runs of ``steps`` RLOO steps each: its 4,000-step runs' hours
    at its per-step time (like for like where a grid's runs are shorter)."""
    lo, hi = PAPER_COST["hours_per_run"]
    gpus, full = PAPER_COST["gpus_per_run"], PAPER_COST["steps_per_run"]
    share = sum(steps) / full
    return {"runs": len(steps), "gpus_per_run": gpus, "hours_per_run": [lo, hi], "steps_per_run": full,
            "gpu_hours": [share * lo * gpus, share * hi * gpus], "where": PAPER_COST["where"],
            "counts": "training runs end to end (the paper states no evaluation cost)"
                      + ("" if set(steps) <= {full} else f", at its per-step time for this grid's "
                         f"{', '.join(f'{n:,}' for n in sorted(set(steps)))}-step runs")}


def measurements(rates: Throughput) -> list[str]:
    """The committed files the rates were read from (the default's), or the report given (--throughput)."""
    return list(DEFAULT_FILES) if rates is DEFAULT else [rates.source]


def bill_json(config: dict, grid_name: str, rates: Throughput) -> dict:
    """What `plan --json` prints: the total, the bill, the GPUs each model's runs take and why, the saves a
    run makes, the rates and the files they come from, the paper's budget and the levers. ``config`` as
    written (checked, its ``gpus_per_run`` not yet applied: `paper` reads the train_gpus written)."""
    jobs = forecast_jobs(config, grid_name, rates)
    train = jobs[jobs.rule == "train"]
    table = bill(jobs)
    gpus = jobs.attrs["gpus_per_run"]   # as the forecast resolved them (sizing.gpus)
    return {
        "grid": grid_name,
        "gpu_hours": float(jobs.gpu_hours.sum()),
        "by_kind": {k: float(v) for k, v in jobs.groupby("rule").gpu_hours.sum().items()},
        "bill": {model: {p: round(float(v), 2) for p, v in row.items()} for model, row in table.iterrows()},
        "gpus_per_run": {"setting": str(config["grids"][grid_name].get("gpus_per_run", "paper")),
                         **{m: {"gpus": g, "why": why} for m, (g, why) in gpus.items()}},
        "saves_per_run": {"latest": sorted({int(x) for x in train.saves_latest}),
                          "best_at_most": sorted({int(x) for x in train.saves_best})},
        "rates": {"source": rates.source, "measurements": measurements(rates),
                  "staging_GBps": rates.staging_GBps},
        "paper_budget": paper_budget([int(n) for n in train.steps]),
        "levers": levers(config, grid_name, rates),
    }


def bill_text(config: dict, grid_name: str, rates: Throughput) -> str:
    """The bill as `softtokens plan` prints it, after the per-kind forecast."""
    data = bill_json(config, grid_name, rates)
    table = data["bill"]
    if not data["saves_per_run"]["latest"]:
        return ""
    lines = ["", f"the bill by model x phase (GPU-hours; gpus_per_run: {data['gpus_per_run']['setting']})",
             "| model | GPUs a run | " + " | ".join(PHASES) + " | total |", "|---|---|" + "---|" * (len(PHASES) + 1)]
    for model, row in table.items():
        g = data["gpus_per_run"].get(model, {}).get("gpus", "")
        lines.append(f"| {model if model != 'total' else '**total**'} | {g} | "
                     + " | ".join(f"{row[p]:,.1f}" for p in PHASES) + f" | {row['total']:,.1f} |")
    budget = data["paper_budget"]
    lo, hi = budget["gpu_hours"]
    lines.append(f"\nthe paper's stated budget for these {budget['runs']} runs: {lo:,.0f}-{hi:,.0f} GPU-hours "
                 f"({budget['gpus_per_run']} GPUs x {budget['hours_per_run'][0]:g}-{budget['hours_per_run'][1]:g} h "
                 f"a run, {budget['where']}; {budget['counts']}); this forecast {data['gpu_hours']:,.0f} in all")
    lines.append("GPUs a run: " + "; ".join(f"{m} {v['gpus']} ({v['why']})" for m, v in data["gpus_per_run"].items()
                                           if m != "setting"))
    lines.append(f"saves a run makes: {', '.join(map(str, data['saves_per_run']['latest']))} of the resume state (the "
                 f"last: its weights alone), at most {', '.join(map(str, data['saves_per_run']['best_at_most']))} "
                 f"best checkpoints (written in the "
                 f"background; each blocks its run while staged to host memory at {rates.staging_GBps:g} GB/s)")
    top = data["levers"][0]
    for lever in data["levers"]:
        values = ", ".join(f"{v}: {h:,.0f}" for v, h in lever["gpu_hours"].items())
        lines.append(f"{lever['choice']} (now {lever['now']}): {values} GPU-hours")
    lines.append(f"moves it most: {top['choice']} ({top['spread']:,.0f} GPU-hours between its values)")
    return "\n".join(lines)


# the cheaper reading of a sweep `plan` offers beside the grid's own, and what it gives up
CHEAP_SWEEP_STEPS = 1000
CHEAP_SWEEP_GIVES_UP = ("runs of 1,000 steps favour values that learn fast early, where the paper selected on runs "
                        "of its full length; one train set per model cannot show whether the best value differs "
                        "between train sets; one seed leaves seed-to-seed noise unmeasured (report.sweeps says so), "
                        "and no run is the paper grid's own (none is shared at 1,000 steps)")


def cheaper_sweep(raw: dict, grid_name: str) -> dict:
    """``raw`` (a config as read, before the checks expand its sweep) with the grid's sweep cut to the cheaper
    reading: every swept parameter at CHEAP_SWEEP_STEPS steps, one seed, each model's first train set."""
    out = copy.deepcopy(raw)
    sweep = out["grids"][grid_name]["sweep"]
    for part in [sweep, *(sweep[p] for p in SWEPT if p in sweep)]:
        if "pairs" in part:
            firsts: dict[str, list] = {}
            for model, dataset in part["pairs"]:
                firsts.setdefault(model, [model, dataset])
            part["pairs"] = list(firsts.values())
        if "seeds" in part:
            part["seeds"] = part["seeds"][:1]
        part.pop("steps", None)
    sweep["steps"] = CHEAP_SWEEP_STEPS
    return out


def sweep_text(raw: dict, grid_name: str, rates: Throughput, loader_kind) -> str:
    """`plan` on a grid with a sweep: its runs (how many the reused grid already trains), its GPU-hours, and
    the cheaper reading's, with what that gives up."""
    config = copy.deepcopy(raw)
    check_config(config, loader_kind)
    jobs = GridJobs({**config, "grid": grid_name})
    runs = {(r.model, r.dataset, r.mode, r.variant, r.seed) for r in jobs.sweep.runs}
    shared = {r for r in runs if not r[3]}
    priced = forecast_jobs(config, grid_name, rates)
    full = float(priced.gpu_hours.sum())
    shared_ids = {paths.job_id("train", Run(m, d, mode, v, seed).wildcards) for m, d, mode, v, seed in shared}
    shared_h = float(priced[priced.job.isin(shared_ids)].gpu_hours.sum())
    cheap_config = cheaper_sweep(raw, grid_name)
    check_config(cheap_config, loader_kind)
    cheap_jobs = forecast_jobs(cheap_config, grid_name, rates)
    cheap = GridJobs({**cheap_config, "grid": grid_name})
    cheap_runs = {Run(r.model, r.dataset, r.mode, r.variant, r.seed) for r in cheap.sweep.runs}
    same = {r for r in runs if Run(*r) in jobs.shared}
    cheap_same = cheap_runs & set(cheap.shared)
    lines = ["", f"the hyperparameter search: {len(runs)} runs of the sweep, {len(shared)} of them the reused grid's "
                 f"own (a swept value equal to its own: trained once, shared)"
                 + (f" and {len(same)} another grid's run under another name (the same settings: grid.identity)"
                    if same else "")
                 + f", {full:,.0f} GPU-hours as this grid reads the paper (docs/protocol.md), {full - shared_h:,.0f} "
                   "once the reused grid has run",
             f"a cheaper reading: {len(cheap_runs) - len(cheap_same)} runs"
             + (f" ({len(cheap_same)} of its {len(cheap_runs)} values ask for a run another already is: the same "
                "settings, trained once)" if cheap_same else "")
             + f", {cheap_jobs.gpu_hours.sum():,.0f} GPU-hours (each model's first train set, one seed, "
               f"{CHEAP_SWEEP_STEPS:,} steps); it gives up: {CHEAP_SWEEP_GIVES_UP}"]
    return "\n".join(lines)
