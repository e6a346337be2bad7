"""One screen for a whole grid, read from its results directory only: every training run with its
step, last reward and validation, ETA, GPU-hours so far, attempts; every evaluation done, running,
failed or pending; totals.

Why from files only: it runs on a login node while Snakemake drives SLURM (no ``squeue``, no
Snakemake API), and after. What it reads:
- a finished run: its declared ``metrics.jsonl``; a run in progress or stopped: its resume state's
  ``_resume/metrics.jsonl`` (one row per step, appended as it trains) and ``attempts.jsonl``;
- whether a run is alive: its process, when its last attempt is on this host, else a heartbeat: its
  metrics were written within ``STALE_AFTER_S`` or three of its steps, whichever is longer;
- an evaluation: its result file (done), else its log (running while written recently, failed
  once stale: Snakemake keeps a failed job's log and deletes its outputs), else pending;
- GPU-hours: finished jobs' Snakemake benchmark files (cost.ledger), plus the step times a run
  in progress has logged.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from softtokens.cost import ledger
from softtokens.store import paths
from softtokens.config.grids import cell_rl
from softtokens.store.files import read_jsonl
from softtokens.grid.jobs import GridJobs

STALE_AFTER_S = 15 * 60   # a run or evaluation silent for longer is not running (a step is minutes at most)
STATES = ("done", "running", "failed", "pending")


def _alive(attempt: dict | None) -> bool | None:
    """True / False when the attempt ran on this host (its pid is checked), None elsewhere."""
    if not attempt or attempt.get("host") != socket.gethostname() or not attempt.get("pid"):
        return None
    try:
        os.kill(int(attempt["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class RunStatus:
    run: str
    state: str
    step: int
    steps: int
    reward: float | None
    val: float | None          # the last greedy validation
    best: float | None         # the best among trained steps
    eta_s: float | None
    hours: float               # wall hours the run has taken (every attempt's steps while unfinished)
    gpu_hours: float
    attempts: int
    failed_to_learn: str | None = None   # why its selected checkpoint is no trained model (selected.json)
    problem: str | None = None           # why a run whose files are there is not done (its files not its job's)


def _failed_to_learn(run_dir: Path) -> str | None:
    from softtokens.store.files import MalformedFile, read_json

    selected = run_dir / paths.SELECTED
    try:
        return read_json(selected).get("failed_to_learn") if selected.is_file() else None
    except MalformedFile:
        return None


def run_status(run_dir: Path, name: str, steps: int, gpus: int, bench: dict, now: float) -> RunStatus:
    """``name``: the run's job name (paths.RUN_JOB); ``bench``: job id -> (wall seconds, GPU-hours)
    of finished jobs (their benchmark files)."""
    done_metrics, resume = run_dir / paths.METRICS, run_dir / paths.RESUME
    attempts = read_jsonl(run_dir / paths.ATTEMPTS, while_written=True)
    # a run being (re)trained writes its resume state's metrics; the declared ones may be a previous run's,
    # kept by Snakemake while a forced retrain runs
    live = resume / paths.METRICS
    rows = read_jsonl(live if live.is_file() else done_metrics, while_written=True)
    train = [r for r in rows if r.get("kind") == "train"]
    vals = [r for r in rows if r.get("kind") == "validation"]
    step = train[-1]["step"] if train else 0
    step_s = [sum(r.get(f"seconds_{k}", 0.0) for k in ("rollout", "reward", "update")) for r in train]
    mean_step = sum(step_s) / len(step_s) if step_s else None
    job = paths.job_id("train", name)
    problem = None
    if done_metrics.is_file() and not resume.exists():
        # done only if what the audit reads holds: the metrics as the job wrote them (a file cut short is not a
        # finished run), every step there, the selection true of its file (audit.records)
        problem = _finished_problem(run_dir, train, steps)
        state = "failed" if problem else "done"
        wall, gpu_h = bench.get(job, (sum(step_s), sum(step_s) * gpus / 3600))
    else:
        wall, gpu_h = sum(step_s), sum(step_s) * gpus / 3600
        beat = max((p.stat().st_mtime for p in (resume / paths.METRICS, run_dir / paths.ATTEMPTS) if p.is_file()),
                   default=None)
        alive = _alive(attempts[-1] if attempts else None)
        fresh = beat is not None and now - beat < max(STALE_AFTER_S, 3 * (mean_step or 0))
        if beat is None:
            state = "pending"
        elif alive is True or (alive is None and fresh):
            state = "running"
        else:
            state = "failed"
    trained_vals = [v["val_greedy_accuracy"] for v in vals if v["step"] >= 1]
    eta = (steps - step) * mean_step if state == "running" and mean_step else None
    return RunStatus(run=name, state=state, step=step, steps=steps,
                     reward=train[-1]["reward"] if train else None,
                     val=vals[-1]["val_greedy_accuracy"] if vals else None,
                     best=max(trained_vals) if trained_vals else None, eta_s=eta, hours=wall / 3600, gpu_hours=gpu_h,
                     attempts=len(attempts), failed_to_learn=_failed_to_learn(run_dir) if state == "done" else None,
                     problem=problem)


def _finished_problem(run_dir: Path, train: list[dict], steps: int) -> str | None:
    """Why a finished run's files are not what its job wrote (None: they are)."""
    from softtokens.audit.records import hash_problems
    from softtokens.store.provenance import read_record

    for f in (run_dir / paths.METRICS, run_dir / paths.SELECTED):
        rec = read_record(f) if f.is_file() else None
        if f.is_file() and rec is None:
            return f"NO PROVENANCE RECORD {f}"
        said = hash_problems(f, rec, deep=False) if rec is not None else []
        if said:
            return said[0]
    if len(train) != steps:
        return f"{run_dir / paths.METRICS} holds {len(train)} of its {steps} steps"
    return None


def eval_state(result: Path, log: Path, now: float) -> tuple[str, str | None]:
    """(state, why a file that is there is not done): done only if it is the document its job wrote (its embedded
    hash: audit.records) and the file its path names (store.eval_identity)."""
    if result.is_file():
        from softtokens.audit.records import hash_problems
        from softtokens.store.eval_identity import identity_problems
        from softtokens.store.files import MalformedFile, read_json
        from softtokens.store.provenance import read_record

        try:
            doc = read_json(result)
        except MalformedFile as err:
            return "failed", f"MALFORMED {err}"
        rec = read_record(result)
        if rec is None:
            return "failed", f"NO PROVENANCE RECORD {result}"
        problems = hash_problems(result, rec, deep=False) + identity_problems(result, doc)
        return ("failed", problems[0]) if problems else ("done", None)
    if log.is_file():
        return ("running" if now - log.stat().st_mtime < STALE_AFTER_S else "failed"), None
    return "pending", None


def eval_file_job(jobs, path: str) -> tuple[str, str]:
    """(rule, job) that writes an evaluation file: its setting's or out-of-domain set's own job, or its evaluated
    model's (evaluation.one_job_per_setting: false)."""
    k = paths.parse_eval_path(path)
    trained = Path(path).parent.parent.name
    if jobs.per_model_eval:
        return "evaluate", paths.model_eval_job(k["model"], trained)
    if Path(path).stem == "loglik":
        return "evaluate_loglik", paths.EVAL_JOB.format(model=k["model"], trained=trained, benchmark=k["benchmark"])
    return "evaluate", paths.eval_job(k["setting"], k["model"], trained, k["benchmark"])


def grid_status(config: dict, grid_name: str, now: float | None = None) -> dict:
    """Every run's RunStatus and every evaluation file's state (with its job), and the GPU-hours
    of finished jobs, for ``config``'s grid ``grid_name``."""
    now = time.time() if now is None else now
    jobs = GridJobs({**config, "grid": grid_name})
    gpus = jobs.ledger_gpus()
    bench = ledger.read_jobs(Path(jobs.results) / "benchmarks", gpus)
    bench_gpu = dict(zip(bench.job, zip(bench.wall_s, bench.gpu_hours)))
    runs = []
    for run in jobs.training_runs():
        steps = cell_rl(config, grid_name, run.model, run.dataset, run.variant)["steps"]
        # a run that is another's name (grid.identity) is read from that run's directory
        runs.append(run_status(Path(jobs.run_file(run, paths.METRICS)).parent, run.wildcards, steps,
                               gpus["train"].get(run.model, 0), bench_gpu, now))
    evals = []
    for kind, targets in (("evaluate", jobs.eval_targets()), ("evaluate_loglik", jobs.loglik_targets())):
        for path in targets:
            rule, job = eval_file_job(jobs, path)
            state, problem = eval_state(Path(path), Path(paths.log_path(jobs.results, rule, job)), now)
            evals.append({"kind": kind, "file": path, "rule": rule, "job": job, "state": state, "problem": problem})
    ev = bench[bench.rule.isin(["evaluate", "evaluate_loglik"])]
    other = bench[~bench.rule.isin(["train", "evaluate", "evaluate_loglik"])]
    bases = [toy_base_status(jobs.model_source(m), now) for m, spec in jobs.grid["models"].items()
             if spec.get("source") == "toy"]
    return {"grid": grid_name, "results": jobs.results, "runs": runs, "evals": evals, "bases": bases,
            "eval_gpu_hours": float(ev.gpu_hours.sum()), "eval_hours": float(ev.wall_s.sum()) / 3600,
            "other_gpu_hours": float(other.gpu_hours.sum()), "other_hours": float(other.wall_s.sum()) / 3600}


def toy_base_status(model_dir: str, now: float) -> dict:
    """A toy base: done (its directory), building (its progress file, written recently), failed (a
    stale progress file: the job stopped before writing the model) or pending."""
    from softtokens.store.files import MalformedFile, read_json

    if Path(model_dir).is_dir():
        return {"model": model_dir, "state": "done"}
    progress = Path(paths.model_progress(model_dir))
    if not progress.is_file():
        return {"model": model_dir, "state": "pending"}
    try:
        row = read_json(progress)
        row["step"], row["steps"], row["seconds"], row["loss"]
    except (MalformedFile, KeyError):   # a progress file being replaced, or not one: no step to show
        return {"model": model_dir, "state": "running" if now - progress.stat().st_mtime < STALE_AFTER_S else "failed"}
    state = "running" if now - row.get("updated", 0) < STALE_AFTER_S else "failed"
    done = row["step"] + 1
    eta = row["seconds"] / done * (row["steps"] - done) if done else None
    return {"model": model_dir, "state": state, "step": done, "steps": row["steps"], "loss": row["loss"],
            "eta_s": eta}


def _fmt(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def _pct(x: float | None) -> str:
    """A fraction in percent, as the tables and the reward (0-100) read."""
    return "-" if x is None else f"{100 * x:.1f}"


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    h, m = divmod(int(round(s / 60)), 60)
    return f"{h}h{m:02d}m" if h else f"{m}m"


def status_text(status: dict) -> str:
    runs, evals = status["runs"], status["evals"]
    lines = [f"grid {status['grid']} ({status['results']}); reward: the last step's mean on its 0-100 scale; val %, "
             "best %: the last and the best greedy validation accuracy", ""]
    for b in status.get("bases", []):
        lines.append(f"toy base {b['model']}: {b['state']}" + (
            f", supervised step {b['step']}/{b['steps']}, loss {b['loss']:.3f}, ETA {_duration(b['eta_s'])}"
            if "step" in b else ""))
    if status.get("bases"):
        lines.append("")
    lines.append(f"{'training run':<44} {'state':<8} {'step':>11} {'reward':>8} {'val %':>6} {'best %':>6} "
                 f"{'ETA':>7} {'hours':>6} {'GPU-h':>8} {'attempts':>8}")
    for r in runs:
        lines.append(f"{r.run:<44} {r.state:<8} {f'{r.step}/{r.steps}':>11} {_fmt(r.reward, '.1f'):>8} "
                     f"{_pct(r.val):>6} {_pct(r.best):>6} {_duration(r.eta_s):>7} {r.hours:>6.2f} {r.gpu_hours:>8.2f} "
                     f"{r.attempts:>8}")
    lines += [f"    failed: {r.run} ({r.problem or 'log: ' + paths.log_path(status['results'], 'train', r.run)})"
              for r in runs if r.state == "failed"]
    logs = Path(status["results"]) / "logs"
    if not runs and not evals and logs.is_dir():
        lines.append(f"    logs of earlier jobs: {logs}")
    flagged = [r for r in runs if r.failed_to_learn]
    if flagged:
        lines += ["", f"{len(flagged)} run(s) failed to learn (their cells are marked † in the tables and named in the "
                      "verdicts that rest on them):"]
        lines += [f"    {r.run}: {r.failed_to_learn}" for r in flagged]
    lines.append("")
    for kind in ("evaluate", "evaluate_loglik"):
        sub = [e for e in evals if e["kind"] == kind]
        if sub:
            counts = ", ".join(f"{sum(e['state'] == s for e in sub)} {s}" for s in STATES)
            lines.append(f"{kind + ' files':<26} {len(sub):>5}: {counts}")
            lines += [f"    failed: {e['file']} ({e.get('problem') or 'log: ' + paths.log_path(status['results'], e['rule'], e['job'])})"
                      for e in sub if e["state"] == "failed"]
    run_counts = ", ".join(f"{sum(r.state == s for r in runs)} {s}" for s in STATES)
    eta = max((r.eta_s for r in runs if r.eta_s is not None), default=None)
    gpu = sum(r.gpu_hours for r in runs) + status["eval_gpu_hours"] + status["other_gpu_hours"]
    hours = sum(r.hours for r in runs) + status["eval_hours"] + status["other_hours"]
    lines += ["", f"training runs {len(runs)}: {run_counts}; attempts {sum(r.attempts for r in runs)} "
                  f"({sum(max(0, r.attempts - 1) for r in runs)} restarts)",
              f"GPU-hours so far: {gpu:.2f} (training {sum(r.gpu_hours for r in runs):.2f}, evaluation "
              f"{status['eval_gpu_hours']:.2f}); job hours {hours:.2f} (training {sum(r.hours for r in runs):.2f}, "
              f"evaluation {status['eval_hours']:.2f}); longest running ETA {_duration(eta)}"]
    return "\n".join(lines)
