"""What a grid will cost before it runs: each GPU job's wall time from a throughput model (tokens
per second per GPU), summed per job kind, per table and for the grid, and the wall-clock on N nodes.

Why a throughput model and not the jobs' time limits: a limit is a ceiling chosen with margin (a
paper grid's limits add up to ~17,900 GPU-hours), and it cannot say what a change of CoT budget,
batch or model costs. The model counts the tokens a job decodes and the tokens its updates replay,
and divides by rates measured on a GPU:

- a training run: ``steps`` x (B·G rows x S decode steps / rollout rate + B·G x (prompt + S) /
  update rate of its mode) + every greedy validation (``val_size`` x S / evaluation rate), over
  its P GPUs; S = CoT budget + prefill + answer budget. A batched decode runs as long as its
  longest row, so S is the budget, not the mean length: the forecast is an upper bound where
  CoTs stop early, and close to exact where they do not (the paper's 512-token CoTs mostly do not);
- an evaluation: questions x (1 for a greedy setting, n_samples for a sampled one) x S at the
  evaluation rate; an out-of-domain one: one greedy hard CoT per question (generative protocol),
  or its rows at the scoring rate (cloze).

Rates come from a gpu-check report (``softtokens gpu-check`` writes one: docs/gpu.md), read by
``throughput_from_gpu_check``; without one, ``DEFAULT`` is that of the H100 report committed in
``benchmarks/results/gpu_check_h100.json`` (a test derives it from the file). Decode is bound by
reading the weights and an update by their FLOPs, both about linear in the parameter count, so a
rate measured on one model is scaled by parameters to another: an approximation the ledger then
checks (``vs_actual``: forecast beside the benchmark files of a finished grid, per job kind).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from softtokens.data.sources import test_size
from softtokens.report import ledger
from softtokens.report.paper import CELL_KEYS
from softtokens.run import paths
from softtokens.run.config import cell_rl
from softtokens.run.jobs import GPU_KINDS, GridJobs, train_processes
from softtokens.run.names import is_sampled
from softtokens.train.plan import PREFILL_TOKENS, grid_architecture


@dataclass(frozen=True)
class Throughput:
    """Tokens per second per GPU (rows per second for cloze scoring) of one model on one device."""

    rollout_decode: float           # a training step's rollouts (B·G/P rows at once)
    eval_decode: float              # an evaluation's decode (its batch_size rows at once)
    update: dict                    # mode -> tokens replayed (forward + backward) per second
    loglik_rows: float              # multiple-choice rows scored per second (cloze protocol)
    parameters: float               # of the model measured
    source: str

    def scaled_to(self, parameters: float) -> "Throughput":
        f = self.parameters / parameters
        return replace(self, rollout_decode=self.rollout_decode * f, eval_decode=self.eval_decode * f,
                       update={m: v * f for m, v in self.update.items()}, loglik_rows=self.loglik_rows * f,
                       parameters=parameters)


def throughput_from_gpu_check(report: dict, source: str = "") -> Throughput:
    """The rates a gpu-check report measured (its training, evaluation and out-of-domain sections)."""
    shape, sec = report["shape"], report["sections"]
    steps = shape["cot_max_tokens"] + PREFILL_TOKENS + shape["answer_max_tokens"]
    rows = shape["prompts_per_step"] * shape["samples_per_prompt"]
    prompt = sec["engine"]["prompt_tokens"]
    rollout, update = [], {}
    for mode, m in sec["training"]["modes"].items():
        last = m["steps"][-1]
        rollout.append(last.get("rollout_tokens", rows * steps) / last["seconds_rollout"])
        update[mode] = last.get("update_tokens", rows * (prompt + steps)) / last["seconds_update"]
    ev = sec["evaluation"]
    eval_rates = [s["rows"] * s["decode_steps"] / s["seconds"] for s in ev["settings"].values()]
    return Throughput(rollout_decode=sum(rollout) / len(rollout), eval_decode=sum(eval_rates) / len(eval_rates),
                      update=update, loglik_rows=ev["loglik"]["rows"] / ev["loglik"]["seconds"],
                      parameters=float(report["parameters"]),
                      source=source or f"gpu-check {report['date'][:10]} on {report['device']['name']} "
                                       f"({report['model']}, {report['compute_dtype']})")


# benchmarks/results/gpu_check_h100.json (tests/test_forecast.py derives these from the file)
DEFAULT = Throughput(rollout_decode=6296.0, eval_decode=11384.0,
                     update={"soft": 4006.0, "fuzzy": 5336.0, "hard": 7804.0}, loglik_rows=10.92,
                     parameters=3212749824.0,
                     source="gpu-check 2026-11-24 on NVIDIA H100 80GB HBM3 (meta-llama/Llama-3.2-3B-Instruct, "
                            "bfloat16): benchmarks/results/gpu_check_h100.json")


def load_throughput(path: str | Path | None) -> Throughput:
    return DEFAULT if path is None else throughput_from_gpu_check(json.loads(Path(path).read_text()),
                                                                  source=f"{path}")


# ---------------------------------------------------------------- a grid's jobs
def _questions(grid: dict, benchmark: str) -> int:
    spec = grid["datasets"][benchmark]
    n = spec.get("test_size") or test_size(spec["loader"])
    if n is None:
        raise ValueError(f"datasets.{benchmark}: no test_size, and loader {spec['loader']!r} has no known size "
                         "(data.sources.SOURCES' test_size)")
    return int(n)


def forecast_jobs(config: dict, grid_name: str, rates: Throughput = DEFAULT) -> pd.DataFrame:
    """One row per GPU job of the grid, named as its benchmark file (report.ledger's job ids): its
    kind, GPUs, forecast wall seconds and GPU-hours (GPUs 0 on a grid that declares none)."""
    jobs = GridJobs({**config, "grid": grid_name})
    grid, ev = jobs.grid, jobs.eval
    gpus = jobs.ledger_gpus()
    params = {m: grid_architecture(grid, m).parameters for m in grid["models"]}
    prompt = int(grid.get("memory_plan", {}).get("prompt_tokens", 512))
    rows = []

    def add(rule: str, job: str, wall: float, n_gpus: int) -> None:
        rows.append({"job": paths.job_id(rule, job), "rule": rule, "wall_s": wall, "gpus": n_gpus,
                     "gpu_hours": wall * n_gpus / 3600})

    for run in jobs.training_runs():
        rl = cell_rl(config, grid_name, run.model, run.dataset, run.variant)
        t = rates.scaled_to(params[run.model])
        P, n = train_processes(grid, run.model), rl["prompts_per_step"] * rl["samples_per_prompt"]
        S = rl["cot_max_tokens"] + PREFILL_TOKENS + rl["answer_max_tokens"]
        per_step = n * S / t.rollout_decode + n * (prompt + S) / t.update[run.mode]
        validations = 1 + math.ceil(rl["steps"] / rl["val_every"])
        val_rows = min(rl["val_size"], grid["datasets"][run.dataset].get("validation_size", rl["val_size"]))
        wall = (rl["steps"] * per_step + validations * val_rows * S / t.eval_decode) / P
        add("train", run.wildcards, wall, gpus["train"][run.model])
    S = ev["cot_max_tokens"] + PREFILL_TOKENS + ev["answer_max_tokens"]
    for model, trained in jobs.evaluated_models():
        t = rates.scaled_to(params[model])
        for b in ev["benchmarks"]:
            q = _questions(grid, b)
            seconds = {s: q * (ev["n_samples"] if is_sampled(s) else 1) * S / t.eval_decode for s in ev["settings"]}
            if ev["one_job_per_setting"]:
                for s, wall in seconds.items():
                    add("evaluate", paths.eval_job(s, model, trained, b), wall, gpus["evaluate"])
            else:
                add("evaluate", paths.eval_job(paths.ALL_SETTINGS, model, trained, b), sum(seconds.values()),
                    gpus["evaluate"])
        for b in jobs.ood:
            q = _questions(grid, b)
            wall = q * S / t.eval_decode if ev["ood_protocol"] == "generative" else q / t.loglik_rows
            add("evaluate_loglik", paths.EVAL_JOB.format(model=model, trained=trained, benchmark=b), wall,
                gpus["evaluate_loglik"])
    return pd.DataFrame(rows, columns=["job", "rule", "wall_s", "gpus", "gpu_hours"])


def by_kind(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per job kind (rule): jobs, GPU-hours, summed and longest wall hours."""
    g = jobs.groupby("rule", sort=False)
    out = pd.DataFrame({"jobs": g.size(), "gpu_hours": g.gpu_hours.sum(), "wall_hours": g.wall_s.sum() / 3600,
                        "longest_hours": g.wall_s.max() / 3600})
    return out.reindex([k for k in GPU_KINDS if k in out.index]).reset_index()


def wall_clock_hours(jobs: pd.DataFrame, nodes: int, gpus_per_node: int) -> float:
    """Hours to run every job on ``nodes`` x ``gpus_per_node`` GPUs: the GPU-hours spread over them
    (perfect packing), but never less than the critical path, the longest training run followed by
    the longest evaluation of a trained model."""
    spread = jobs.gpu_hours.sum() / (nodes * gpus_per_node)
    longest = {k: jobs.wall_s[jobs.rule == k].max() for k in GPU_KINDS}
    path = sum(v for v in (longest["train"], max(longest["evaluate"], longest["evaluate_loglik"]))
               if pd.notna(v)) / 3600
    return max(spread, path)


def eval_cells(config: dict, grid_name: str) -> pd.DataFrame:
    """The table cells each evaluation file makes, as report.reproduction.seed_rows names them (pass@1,
    and pass@n of a sampled setting; accuracy and the NLL of an out-of-domain file), so that
    report.ledger's cell and table sums apply to forecast jobs as to measured ones."""
    jobs = GridJobs({**config, "grid": grid_name})
    n = jobs.eval["n_samples"]
    rows = []
    for path in jobs.eval_targets():
        keys = paths.parse_eval_path(path)
        rows.append({**keys, "metric": "pass@1", "path": path})
        if is_sampled(keys["setting"]) and n > 1:
            rows.append({**keys, "metric": f"pass@{n}", "path": path})
    for path in jobs.loglik_targets():
        keys = paths.parse_eval_path(path)
        rows.append({**keys, "setting": "hard_greedy", "metric": "accuracy", "path": path})
        rows.append({**keys, "setting": "loglik", "metric": "nll_correct", "path": path})
    return pd.DataFrame(rows, columns=[*CELL_KEYS, "seed", "path"])


def table_forecast(config: dict, grid_name: str, jobs: pd.DataFrame, tables: dict) -> pd.DataFrame:
    """Per table (report.page.our_tables): the GPU-hours of the union of its cells' jobs."""
    cost_rows = jobs.assign(cpu_s=0.0, cpu_hours=0.0)
    cells = ledger.cell_costs(eval_cells(config, grid_name), cost_rows, CELL_KEYS)
    return ledger.table_costs(cells, cost_rows, tables)[["table", "cells", "jobs", "wall_s", "gpu_hours"]]


def vs_actual(forecast: pd.DataFrame, actual: pd.DataFrame) -> pd.DataFrame:
    """Per job kind: forecast beside measured (report.ledger.read_jobs) GPU-hours and wall hours,
    over the jobs that have both (a grid part-way through compares what ran)."""
    both = forecast.merge(actual[["job", "wall_s", "gpu_hours"]], on="job", suffixes=("_forecast", "_actual"))
    rows = []
    for kind in GPU_KINDS:
        sub = both[both.rule == kind]
        if sub.empty:
            continue
        f, a = sub.wall_s_forecast.sum(), sub.wall_s_actual.sum()
        rows.append({"kind": kind, "jobs": len(sub), "wall_h_forecast": f / 3600, "wall_h_actual": a / 3600,
                     "gpu_h_forecast": sub.gpu_hours_forecast.sum(), "gpu_h_actual": sub.gpu_hours_actual.sum(),
                     "actual/forecast": a / f if f else float("nan")})
    return pd.DataFrame(rows, columns=["kind", "jobs", "wall_h_forecast", "wall_h_actual", "gpu_h_forecast",
                                       "gpu_h_actual", "actual/forecast"])


def forecast_text(config: dict, grid_name: str, rates: Throughput, nodes: int, gpus_per_node: int,
                  tables: dict) -> str:
    """What `softtokens plan` prints after the memory table."""
    jobs = forecast_jobs(config, grid_name, rates)
    kinds = by_kind(jobs)
    lines = [f"\ncost forecast (throughput: {rates.source}; scaled by parameter count to each model)",
             "| job kind | jobs | GPU-hours | job hours (summed) | longest job (h) |", "|---|---|---|---|---|"]
    lines += [f"| {r.rule} | {r.jobs} | {r.gpu_hours:,.1f} | {r.wall_hours:,.1f} | {r.longest_hours:,.2f} |"
              for r in kinds.itertuples()]
    lines.append(f"| **grid** | {len(jobs)} | {jobs.gpu_hours.sum():,.1f} | {jobs.wall_s.sum() / 3600:,.1f} | "
                 f"{jobs.wall_s.max() / 3600 if len(jobs) else 0:,.2f} |")
    lines += ["", "| table | cells | GPU jobs | GPU-hours |", "|---|---|---|---|"]
    lines += [f"| {r.table} | {r.cells} | {r.jobs} | {r.gpu_hours:,.1f} |"
              for r in table_forecast(config, grid_name, jobs, tables).itertuples()]
    lines.append(f"\nwall-clock on {nodes} node(s) x {gpus_per_node} GPUs: "
                 f"{wall_clock_hours(jobs, nodes, gpus_per_node):,.1f} h "
                 "(GPU-hours spread over the GPUs, at least the longest training run then the longest evaluation)")
    return "\n".join(lines)
