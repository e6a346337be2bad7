"""What each job, each table cell and each table cost, from Snakemake's ``benchmark:`` files.

Why: a reader deciding whether to rerun a cell needs its price, and a paper reproduction is
budgeted in GPU-hours. Every rule writes ``{results}/benchmarks/{rule}/{wildcards}.tsv`` (wall
seconds ``s``, ``cpu_time`` in seconds, ``max_rss`` in MB); the GPUs a job held come from the
grid's resources (a training job: its model's ``train_gpus``). GPU-hours = wall hours × GPUs;
CPU-hours = the job's measured CPU time. A cell costs every job upstream of it (its evaluation
files, the training and selection of each seed, the base model and the data); a training run
feeds every cell it trained, so cell costs overlap and a table's total counts each job once.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from softtokens.store.paths import EVAL_JOB, eval_job, eval_run, job_id, model_eval_job

LEDGER_COLUMNS = ["job", "rule", "wall_s", "cpu_s", "max_rss_mb", "gpus", "gpu_hours", "cpu_hours"]


def job_gpus(rule: str, wildcards: list[str], gpus: dict) -> int:
    """GPUs held by one job: ``gpus`` maps a rule to a count, or (train) to {model: count}."""
    spec = gpus.get(rule, 0)
    if isinstance(spec, dict):
        return int(spec.get(wildcards[0], 0)) if wildcards else 0
    return int(spec or 0)


def read_jobs(bench_dir: str | Path, gpus: dict) -> pd.DataFrame:
    """One row per benchmark file: its job id (the file's path under ``bench_dir`` without .tsv)."""
    bench_dir = Path(bench_dir)
    rows = []
    for tsv in sorted(bench_dir.rglob("*.tsv")):
        try:
            df = pd.read_csv(tsv, sep="\t")
        except (pd.errors.EmptyDataError, pd.errors.ParserError):
            continue
        if df.empty or "s" not in df.columns:
            continue
        last = df.iloc[-1]  # with `repeat`, the latest measurement
        parts = tsv.relative_to(bench_dir).with_suffix("").parts
        n_gpus = job_gpus(parts[0], list(parts[1:]), gpus)
        wall = float(last["s"])
        cpu = float(last["cpu_time"]) if "cpu_time" in df.columns and pd.notna(last["cpu_time"]) else float("nan")
        rows.append({"job": "/".join(parts), "rule": parts[0], "wall_s": wall, "cpu_s": cpu,
                     "max_rss_mb": float(last.get("max_rss", float("nan"))), "gpus": n_gpus,
                     "gpu_hours": wall * n_gpus / 3600, "cpu_hours": cpu / 3600})
    return pd.DataFrame(rows, columns=LEDGER_COLUMNS)


def upstream_jobs(eval_path: str | Path, keys: dict, has_toy_base: bool = True) -> list[str]:
    """Job ids a result file depends on (rule/wildcards, as the benchmark files are named)."""
    p = Path(eval_path)
    model, bench = keys["model"], keys["benchmark"]
    run = eval_run(keys)
    trained = "base" if run is None else run.trained
    # an evaluation file is its setting's (or out-of-domain set's) job, or the job of its whole evaluated model
    # (evaluation.one_job_per_setting: false: counted whole in each of its cells, once in a table's union); only
    # the one with a benchmark file is counted
    job = EVAL_JOB.format(model=model, trained=trained, benchmark=bench)
    own = job_id("evaluate_loglik", job) if p.stem == "loglik" else job_id("evaluate", eval_job(p.stem, model, trained, bench))
    jobs = [own, job_id("evaluate", model_eval_job(model, trained))]
    jobs += [job_id("prepare_data", bench), job_id("prepare_benchmark", bench)]
    if run is not None:
        jobs += [job_id("train", run.wildcards), job_id("select", run.wildcards), job_id("prepare_data", run.dataset)]
    if has_toy_base:
        jobs.append(job_id("build_toy_base", model))
    return jobs


def cell_costs(seeds: pd.DataFrame, jobs: pd.DataFrame, cell_keys: list[str]) -> pd.DataFrame:
    """Per cell: the jobs upstream of its evaluation files (those that have a benchmark file)
    and their summed wall time, CPU time and GPU-hours."""
    known = jobs.set_index("job")
    rows = []
    for key, sub in seeds.groupby(cell_keys, sort=False):
        ids = sorted({j for _, r in sub.iterrows() for j in upstream_jobs(r["path"], r) if j in known.index})
        part = known.loc[ids]
        rows.append({**dict(zip(cell_keys, key)), "jobs": len(ids), "job_ids": ids,
                     "wall_s": part.wall_s.sum(), "cpu_s": part.cpu_s.sum(), "gpu_hours": part.gpu_hours.sum(),
                     "cpu_hours": part.cpu_hours.sum()})
    return pd.DataFrame(rows)


def table_costs(cells: pd.DataFrame, jobs: pd.DataFrame, tables: dict) -> pd.DataFrame:
    """Per table (a name -> a predicate on cell rows): the union of its cells' jobs, each once."""
    known = jobs.set_index("job")
    rows = []
    for name, select in tables.items():
        sub = cells[cells.apply(select, axis=1)] if not cells.empty else cells
        ids = sorted({j for js in sub.get("job_ids", []) for j in js})
        part = known.loc[ids]
        rows.append({"table": name, "cells": len(sub), "jobs": len(ids), "wall_s": part.wall_s.sum(),
                     "cpu_s": part.cpu_s.sum(), "gpu_hours": part.gpu_hours.sum(), "cpu_hours": part.cpu_hours.sum()})
    rows.append({"table": "whole grid (every job)", "cells": len(cells), "jobs": len(jobs),
                 "wall_s": jobs.wall_s.sum(), "cpu_s": jobs.cpu_s.sum(), "gpu_hours": jobs.gpu_hours.sum(),
                 "cpu_hours": jobs.cpu_hours.sum()})
    return pd.DataFrame(rows)
