"""What a grid will cost before it runs: each GPU job's wall time from measured rates (rates.throughput),
summed per job kind, per table and for the grid, and the wall-clock on N nodes; beside it, what the
paper states its runs took.

Why rates and not the jobs' time limits: a limit is a ceiling chosen with margin (a paper grid's
limits add up to ~17,900 GPU-hours), and it cannot say what a change of CoT budget, batch, model or
GPU count costs. Per job, with S = CoT budget + prefill + answer budget decode steps (a batched decode
runs as long as its longest row: an upper bound where CoTs stop early, close where they do not):

- a training run on P GPUs: ``steps`` x (S x decode step of B·G/P rows on one GPU, every GPU decoding
  its share at once: rollouts do not divide over GPUs, the rows do + the update of B·G x (prompt + S)
  tokens, whose FLOPs divide over the P GPUs) + every greedy validation (its rows over P, in waves of the plan's
  val_batch_size slots, its own CoT cap) + grading every answer (rates.throughput.GRADING_ANSWERS_PER_S) + the saves
  the loop makes (train.config.save_schedule: the resume state at every validation and every ``resume_save_steps``,
  a best checkpoint at most once per validation), each blocking the run while it is staged (train.resume);
- an evaluation: ceil(rows / batch) batches of S steps at the batch's decode step, rows = questions x (n_samples
  for a sampled setting, 1 for a greedy one);
- an out-of-domain evaluation: the log-likelihood pass every protocol runs (the NLL column) and, under
  the generative protocol, one greedy hard CoT per question.

Prompt tokens come from the prepared data under the model's tokenizer where both are on disk (the memory plan
keeps its worst case); otherwise from the grid's memory plan, and the forecast says so. Rates come from a gpu-check
report (``--throughput``), or ``throughput.DEFAULT`` (the committed H100 one), scaled by parameters to each
model; the ledger checks the forecast against the jobs' benchmark files (``vs_actual``).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import pandas as pd

from softtokens.cells.paper import CELL_KEYS
from softtokens.cost import ledger
from softtokens.data.prompt import PREFILL_TOKENS
from softtokens.data.sources import test_size
from softtokens.rates.throughput import (
    DEFAULT,
    DEFAULT_FILES,
    GRADING_ANSWERS_PER_S,
    Throughput,
    throughput_from_gpu_check,
)
from softtokens.reward.pool import pool_size
from softtokens.config.names import is_sampled, setting_mode
from softtokens.config.settings import CellSettings
from softtokens.grid.identity import shared_note
from softtokens.grid.jobs import GridJobs
from softtokens.grid.resources import GPU_KINDS
from softtokens.store import paths
from softtokens.sizing.gpus import with_resolved_gpus
from softtokens.sizing.plan import grid_architecture, resolve_memory
from softtokens.train.config import save_schedule

__all__ = ["DEFAULT", "DEFAULT_FILES", "Throughput", "throughput_from_gpu_check", "load_throughput", "forecast_jobs", "by_kind",
           "wall_clock_hours", "eval_cells", "table_forecast", "vs_actual", "forecast_text", "PAPER_COST"]

# what the paper states its runs took (Computation Details, soft-tokens-hard-truths.tex line 1282): "Every RLOO
# run ... was executed on a dedicated node with 8x NVIDIA H100 GPUs ... Wall-clock time ... was 48-96 hours per
# run end to end."
PAPER_COST = {"hours_per_run": (48.0, 96.0), "gpus_per_run": 8, "steps_per_run": 4000,
              "where": "Computation Details (soft-tokens-hard-truths.tex, line 1282)"}
# prompts measured per prepared split (a mean settles long before; tokenizing all 14,042 MMLU rows would not)
PROMPT_SAMPLE = 2000


def load_throughput(path: str | Path | None) -> Throughput:
    return DEFAULT if path is None else throughput_from_gpu_check(json.loads(Path(path).read_text()),
                                                                  source=f"{path}")


# ---------------------------------------------------------------- prompt lengths
@lru_cache(maxsize=None)
def _tokenizer(source: str):
    """A model's fast tokenizer (``tokenizer.json``) from a local directory or the HF cache, or None: a
    forecast never downloads, and reads it with ``tokenizers`` alone (the report job loads no torch)."""
    from tokenizers import Tokenizer

    local = Path(source) / "tokenizer.json"
    if local.is_file():
        return Tokenizer.from_file(str(local))
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(source, "tokenizer.json")
    except Exception:  # not a hub id
        return None
    return Tokenizer.from_file(cached) if isinstance(cached, str) else None


@lru_cache(maxsize=None)
def _mean_prompt_tokens(data: str, tokenizer_source: str, mtime: float) -> float | None:
    from softtokens.data.prompt import format_prompt
    from softtokens.eval.ood import prompt_of

    tok = _tokenizer(tokenizer_source)
    if tok is None:
        return None
    lines = [json.loads(x) for x in Path(data).read_text().splitlines()[:PROMPT_SAMPLE] if x.strip()]
    if not lines:
        return None
    texts = [prompt_of(r) if "choices" in r else format_prompt(r["question"]) for r in lines]
    return sum(len(e.ids) for e in tok.encode_batch(texts)) / len(texts)


# characters per token of English and math text under the models' BPE tokenizers (Llama 3's and Qwen 2.5's
# ~128k-151k vocabularies): about 4 for prose, fewer where digits and LaTeX split finely; 3.5 is taken, a stated
# choice the forecast names, used only where the data is on disk without the model's tokenizer, or not yet there
CHARS_PER_TOKEN = 3.5


def _estimated_prompt(dataset_loader: str) -> float | None:
    """Tokens of the paper's prompt around a typical question of the set (data.sources.Source.question_chars)."""
    from softtokens.data.prompt import format_prompt
    from softtokens.data.sources import SOURCES

    source = SOURCES.get(dataset_loader)
    if source is None or not source.question_chars:
        return None
    return (len(format_prompt("")) + source.question_chars) / CHARS_PER_TOKEN


@lru_cache(maxsize=None)
def _mean_prompt_chars(data: str, mtime: float) -> float | None:
    from softtokens.data.prompt import format_prompt
    from softtokens.eval.ood import prompt_of

    lines = [json.loads(x) for x in Path(data).read_text().splitlines()[:PROMPT_SAMPLE] if x.strip()]
    if not lines:
        return None
    return sum(len(prompt_of(r) if "choices" in r else format_prompt(r["question"])) for r in lines) / len(lines)


def prompt_tokens(jobs: GridJobs, model: str, dataset: str, split: str) -> tuple[float, str]:
    """(mean prompt tokens of a split, where the number comes from): measured on the prepared data under the
    model's tokenizer; else its characters at CHARS_PER_TOKEN; else the set's typical question
    (data.sources) in the paper's prompt at CHARS_PER_TOKEN; else the memory plan's worst case."""
    data = Path(paths.data_path(jobs.results, dataset, split))
    source = jobs.model_source(model)
    if data.exists():
        mean = _mean_prompt_tokens(str(data), source, data.stat().st_mtime)
        if mean is not None:
            return mean, f"measured on {data}"
        chars = _mean_prompt_chars(str(data), data.stat().st_mtime)
        if chars is not None:
            return chars / CHARS_PER_TOKEN, (f"{data}'s prompts at {CHARS_PER_TOKEN} characters a token (the "
                                             "model's tokenizer is not cached here)")
    estimate = _estimated_prompt(jobs.grid["datasets"][dataset]["loader"])
    if estimate is not None:
        return estimate, (f"estimated: the paper's prompt around a typical {dataset} question at {CHARS_PER_TOKEN} "
                          "characters a token (prepare the data and cache the tokenizer to measure)")
    assumed = int(jobs.grid.get("memory_plan", {}).get("prompt_tokens", 512))
    return float(assumed), "assumed (the memory plan's worst case; prepare the data and cache the tokenizer to measure)"


# ---------------------------------------------------------------- a grid's jobs
def _questions(grid: dict, benchmark: str) -> int:
    spec = grid["datasets"][benchmark]
    n = spec.get("test_size") or test_size(spec["loader"])
    if n is None:
        raise ValueError(f"datasets.{benchmark}: no test_size, and loader {spec['loader']!r} has no known size "
                         "(data.sources.SOURCES' test_size)")
    return int(n)


def _batches(rows: int, batch: int) -> tuple[int, int]:
    """(batches, rows decoded at once) of ``rows`` through an engine of ``batch`` slots."""
    return max(1, math.ceil(rows / batch)), min(rows, batch)


def train_seconds(jobs: GridJobs, cell: CellSettings, rates: Throughput) -> dict[str, float]:
    """A training run's forecast seconds by part (module docstring), on its P GPUs (``cell``: its settings resolved
    once, grid.jobs.GridJobs.cell)."""
    rl, P, n = cell.rl, cell.processes, cell.rows_per_step
    S = cell.decode_steps + PREFILL_TOKENS
    prompt, _ = prompt_tokens(jobs, cell.model, cell.dataset, "train")
    rollout = S * rates.decode_s(cell.mode, math.ceil(n / P))
    micro_batches = math.ceil(math.ceil(n / P) / rl["micro_batch_size"])
    update = rates.update_s(cell.mode, n * (prompt + S), P, bool(rl["activation_checkpointing"]), micro_batches)
    # greedy validation decodes a process's rows through its val_batch_size slots, in waves (the plan's choice)
    waves, at_once = _batches(math.ceil(cell.validation_rows / P), int(rl["val_batch_size"]))
    validation = cell.validations * waves * (cell.validation_decode_steps + PREFILL_TOKENS) * rates.decode_s(
        cell.mode, at_once)
    # a step's answers (and a validation's) graded by the process's workers while its GPU waits (reward.pool)
    workers = pool_size(max(1, jobs.threads("train", cell.model) // P))
    grading = (rl["steps"] * math.ceil(n / P / workers)
               + cell.validations * math.ceil(cell.validation_rows / P / workers)) / GRADING_ANSWERS_PER_S
    compute = rl["steps"] * (rollout + update) + validation + grading
    # the saves the loop makes (train.config.save_schedule: the last one its weights alone), each blocking the run
    # only while staged to host memory (train.resume writes it in the background); a best at most per validation
    counts = save_schedule(rl["steps"], rl["val_every"], rl["resume_save_steps"])
    saves = ((counts["latest"] - counts["final"]) * rates.stage_s(P, optimizer=True)
             + (counts["final"] + counts["best"]) * rates.stage_s(P, optimizer=False))
    return {"rollout_step": rollout, "update_step": update, "rollout": rl["steps"] * rollout,
            "update": rl["steps"] * update, "validation": validation, "grading": grading, "saves": saves,
            "saves_latest": counts["latest"], "saves_best": counts["best"], "total": compute + saves}


# where a job's GPU-hours go: a training run's parts (train_seconds), an evaluation, a log-likelihood job
TRAIN_PHASES = ("rollout", "update", "validation", "grading", "saves")
PHASES = (*TRAIN_PHASES, "evaluate", "loglik")
PHASE_OF_RULE = {"evaluate": "evaluate", "evaluate_loglik": "loglik"}
JOB_COLUMNS = ["job", "rule", "model", "wall_s", "gpus", "gpu_hours", "step_s", *(f"{p}_gpu_h" for p in PHASES),
               "saves_latest", "saves_best", "steps"]


def forecast_jobs(config: dict, grid_name: str, rates: Throughput = DEFAULT) -> pd.DataFrame:
    """One row per GPU job of the grid, named as its benchmark file (cost.ledger's job ids): its
    kind, model, GPUs, forecast wall seconds and GPU-hours (GPUs 0 on a grid that declares none) and where
    they go (``<phase>_gpu_h``, PHASES); a training run also its seconds per RLOO step (``step_s``) and the
    saves it makes (``saves_latest``, ``saves_best``: train.config.save_schedule)."""
    config, chosen = with_resolved_gpus(config, grid_name)   # gpus_per_run: the GPUs each run would take
    jobs = GridJobs({**config, "grid": grid_name}, resolve_rl=resolve_memory)   # each cell's `auto` chosen once
    grid, ev = jobs.grid, jobs.eval
    gpus = jobs.ledger_gpus()
    params = {m: grid_architecture(grid, m).parameters for m in grid["models"]}
    rows = []

    def add(rule: str, job: str, model: str, wall: float, n_gpus: int, step_s: float = float("nan"),
            phases: dict | None = None, saves: tuple = (0, 0), steps: int = 0) -> None:
        phases = phases or {PHASE_OF_RULE[rule]: wall}
        rows.append({"job": paths.job_id(rule, job), "rule": rule, "model": model, "wall_s": wall, "gpus": n_gpus,
                     "gpu_hours": wall * n_gpus / 3600, "step_s": step_s,
                     **{f"{p}_gpu_h": phases.get(p, 0.0) * n_gpus / 3600 for p in PHASES},
                     "saves_latest": saves[0], "saves_best": saves[1], "steps": steps})

    for run in jobs.names.trained_runs():   # a run that is another's name is trained once (grid.identity)
        cell = jobs.cell(run)
        t = train_seconds(jobs, cell, rates.scaled_to(params[run.model]))
        add("train", run.wildcards, run.model, t["total"], gpus["train"][run.model],
            t["rollout_step"] + t["update_step"], {p: t[p] for p in TRAIN_PHASES},
            (t["saves_latest"], t["saves_best"]), steps=int(cell.rl["steps"]))
    S = ev["cot_max_tokens"] + PREFILL_TOKENS + ev["answer_max_tokens"]
    for model, trained in jobs.evaluated_models():
        t = rates.scaled_to(params[model])
        whole = 0.0   # the evaluated model's one job (evaluation.one_job_per_setting: false)
        for b in ev["benchmarks"]:
            q = _questions(grid, b)
            for s in ev["settings"]:
                batches, at_once = _batches(q * (ev["n_samples"] if is_sampled(s) else 1), ev["batch_size"])
                wall = batches * S * t.decode_s(setting_mode(s), at_once)
                whole += wall
                if ev["one_job_per_setting"]:
                    add("evaluate", paths.eval_job(s, model, trained, b), model, wall, gpus["evaluate"])
        for b in jobs.ood:
            q = _questions(grid, b)
            wall = q / t.loglik_rows  # the NLL pass, under every protocol
            if ev["ood_protocol"] == "generative":
                batches, at_once = _batches(q, ev["batch_size"])
                wall += batches * S * t.decode_s("hard", at_once)
            whole += wall
            if ev["one_job_per_setting"]:
                add("evaluate_loglik", paths.EVAL_JOB.format(model=model, trained=trained, benchmark=b), model, wall,
                    gpus["evaluate_loglik"])
        if not ev["one_job_per_setting"]:
            add("evaluate", paths.model_eval_job(model, trained), model, whole, gpus["evaluate"])
    out = pd.DataFrame(rows, columns=JOB_COLUMNS)
    out.attrs["gpus_per_run"] = chosen   # {model: (GPUs, why)}: what the bill says of each model's runs
    return out


def by_kind(jobs: pd.DataFrame) -> pd.DataFrame:
    """Per job kind (rule): jobs, GPU-hours, summed and longest wall hours."""
    g = jobs.groupby("rule", sort=False)
    out = pd.DataFrame({"jobs": g.size(), "gpu_hours": g.gpu_hours.sum(), "wall_hours": g.wall_s.sum() / 3600,
                        "longest_hours": g.wall_s.max() / 3600})
    return out.reindex([k for k in GPU_KINDS if k in out.index]).reset_index()


def grid_gpus_per_node(config: dict, grid_name: str) -> int:
    """The GPUs per node a grid declares: the most any one of its jobs asks for (a training job's
    model's, an evaluation's), so a one-GPU grid is forecast on one-GPU nodes; 8 where it declares none."""
    gpus = GridJobs({**config, "grid": grid_name}).ledger_gpus()
    counts = [*gpus["train"].values(), *(v for k, v in gpus.items() if k != "train")]
    return max([c for c in counts if c], default=8)


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
    """The table cells each evaluation file makes, as cells.ours.seed_rows names them (pass@1,
    and pass@n of a sampled setting; accuracy and the NLL of an out-of-domain file), so that
    cost.ledger's cell and table sums apply to forecast jobs as to measured ones."""
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
    """Per job kind: forecast beside measured (cost.ledger.read_jobs) GPU-hours and wall hours,
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


def paper_cost_text(jobs: pd.DataFrame, train_steps: list[int] | None = None) -> list[str]:
    """The paper's stated cost beside this forecast's, per run and per RLOO step, and why they differ;
    where the grid's runs are shorter than the paper's (``train_steps``), the paper's at their length."""
    train = jobs[jobs.rule == "train"]
    if train.empty:
        return []
    lo, hi = PAPER_COST["hours_per_run"]
    gpus, steps = PAPER_COST["gpus_per_run"], PAPER_COST["steps_per_run"]
    hours = train.wall_s / 3600
    ours = sorted(set(train_steps)) if train_steps else [steps]
    same = [] if ours == [steps] else [
        f"at this grid's {', '.join(f'{n:,}' for n in ours)} steps a run (like for like, the paper's per-step time): "
        + "; ".join(f"{lo * n / steps:.1f}-{hi * n / steps:.1f} h, {lo * gpus * n / steps:,.0f}-{hi * gpus * n / steps:,.0f} "
                    f"GPU-hours" for n in ours) + f"; for {len(train)} runs {len(train) * lo * gpus * ours[0] / steps:,.0f}-"
                                                  f"{len(train) * hi * gpus * ours[0] / steps:,.0f} GPU-hours."]
    return [
        "",
        f"the paper's stated cost ({PAPER_COST['where']}): each run on a dedicated {gpus}-GPU node, {lo:g}-{hi:g} h "
        f"end to end = {lo * gpus:,.0f}-{hi * gpus:,.0f} GPU-hours a run, {3600 * lo / steps:.0f}-"
        f"{3600 * hi / steps:.0f} s a step over its {steps} steps; for {len(train)} runs {len(train) * lo * gpus:,.0f}-"
        f"{len(train) * hi * gpus:,.0f} GPU-hours.",
        *same,
        f"this forecast: a run {hours.min():.1f}-{hours.max():.1f} h on its {train.gpus.min()}-{train.gpus.max()} GPUs "
        f"({train.gpu_hours.min():,.0f}-{train.gpu_hours.max():,.0f} GPU-hours), a step {train.step_s.min():.1f}-"
        f"{train.step_s.max():.1f} s; {len(train)} runs {train.gpu_hours.sum():,.0f} GPU-hours.",
        "where the difference comes from: this forecast counts compute at rates gpu-check measured (a decode step "
        "in a CUDA graph, one process per GPU, only the GPUs a run's memory plan asks for (a model's train_gpus)), plus "
        "validations and saves; the paper gave every run a whole 8-GPU node whatever its size, decoded with 'a "
        "custom PyTorch-based generation function', and reports wall-clock end to end (start-up, I/O, waiting). "
        "Which part is a faster engine and which a forecasting error only a timed run can tell: the reproduction "
        "report's ledger puts this forecast beside the jobs' measured times.",
    ]


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
    lines += prompt_sources(config, grid_name)
    lines += paper_cost_text(jobs, [int(n) for n in jobs.steps[jobs.rule == "train"]])
    note = shared_note(GridJobs({**config, "grid": grid_name}))
    return "\n".join(lines + ([f"\n{note}"] if note else []))


def prompt_sources(config: dict, grid_name: str) -> list[str]:
    """Where each training set's prompt length came from (measured on the data, or assumed)."""
    jobs = GridJobs({**config, "grid": grid_name})
    seen = sorted({(r.model, r.dataset) for r in jobs.training_runs()})
    out = [f"prompt tokens, {m} on {d}: {n:.0f}, {where}" for m, d in seen
           for n, where in [prompt_tokens(jobs, m, d, "train")]]
    return ([""] + out) if out else []
