"""The DAG itself: dry-run plans, lint, and the whole toy pipeline at the smallest scale (how each job
is configured is Python, tested in tests/test_jobs.py)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def snakemake(*args, cwd=ROOT, timeout=600, env=None):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **(env or {})}
    return subprocess.run([str(BIN / "snakemake"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def tiny_args(d: Path) -> list[str]:
    """Snakemake's arguments for the tiny DAG in ``d`` (its config: d/tiny.yaml)."""
    return ["-d", str(d), "-s", str(ROOT / "Snakefile"), "--configfile", str(d / "tiny.yaml")]


def job_counts(proc) -> dict:
    """Job stats of a (dry) run; Snakemake prints them on stdout or stderr depending on the call."""
    text = proc.stdout + proc.stderr
    counts = {}
    block = text.split("Job stats:")[-1]
    for line in block.splitlines():
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if m:
            counts[m.group(1)] = int(m.group(2))
    return counts


def test_toy_grid_plan(tmp_path):
    proc = snakemake("-n", "-d", str(tmp_path), "-s", str(ROOT / "Snakefile"), "--configfile", str(ROOT / "config.yaml"))
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc)
    assert counts["train"] == 6 and counts["select_checkpoint"] == 6
    # (base + 6 runs), each writing its six settings' files in one job (evaluation.one_job_per_setting: false)
    assert counts["evaluate"] == 7
    assert counts["evaluate_loglik"] == 7  # (base + 6 runs) x the synthetic multiple-choice set
    assert counts["prepare_data"] == 1 and counts["prepare_benchmark"] == 2 and counts["build_toy_base"] == 1


def test_one_evaluate_job_per_setting_unless_the_grid_says_otherwise(tmp_path):
    """The toy's evaluate job writes a model's six files (one process start-up); with
    one_job_per_setting (the default, the paper grid's) each file is a job of its own."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    target = "results/toy/eval/toy/toyarith-soft-seed0/toyarith/hard_greedy.json"
    args = ["-n", "-p", "-d", str(tmp_path), "-s", str(ROOT / "Snakefile"), "--configfile"]
    together = snakemake(target, *args, str(ROOT / "config.yaml"))
    assert together.returncode == 0, together.stderr
    shell = [line for line in together.stdout.splitlines() if "softtokens evaluate " in line]
    assert len(shell) == 1 and "--setting hard_greedy hard_sample soft_greedy soft_sample fuzzy_greedy fuzzy_sample" in shell[0]
    assert shell[0].count("toyarith-soft-seed0/toyarith/") >= 6  # six --out files
    config["grids"]["toy"]["evaluation"]["one_job_per_setting"] = True
    cfg = tmp_path / "apart.yaml"
    cfg.write_text(yaml.safe_dump(config))
    apart = snakemake(target, *args, str(cfg))
    assert apart.returncode == 0, apart.stderr
    shell = [line for line in apart.stdout.splitlines() if "softtokens evaluate " in line]
    assert len(shell) == 1 and "--setting hard_greedy --selected" in shell[0]
    assert job_counts(apart)["evaluate"] == 1


PAPER_ENV = {"SOFTTOKENS_SLURM_ACCOUNT": "testacct", "SOFTTOKENS_SLURM_GPU_PARTITION": "testgpu"}


@pytest.mark.parametrize("profile", ["slurm", "profiles/slurm"])
def test_paper_grid_plan_with_the_slurm_profile(profile):
    """`snakemake --profile slurm -n` at the repository root: no SLURM, GPU or network needed."""
    proc = snakemake("--profile", profile, "-n", "--quiet", "rules")
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc)
    runs = 5 * 3 * 3                    # Table 1's (model, dataset) cells x modes x seeds
    models = runs + 3                   # + the three base models
    assert counts["train"] == runs and counts["select_checkpoint"] == runs
    assert counts["evaluate"] == models * 3 * 6       # x GSM8K, MATH-500, OlympiadBench x six settings
    assert counts["evaluate_loglik"] == models * 3    # x HellaSwag, ARC, MMLU
    assert counts["prepare_data"] == 3 and counts["prepare_benchmark"] == 6
    assert "build_toy_base" not in counts
    assert counts["total"] == 1111


def test_ablations_grid_plans_24_variant_runs_and_reuses_the_main_cells():
    """The appendix ablations: 12 (mode, variant) arms x 2 seeds, each evaluated under the six
    settings on GSM8K; the default rows are the paper grid's runs, never planned here."""
    proc = snakemake("--profile", "slurm", "-n", "--config", "grid=ablations", env=PAPER_ENV)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    counts = job_counts(proc)
    assert counts["train"] == 24 and counts["select_checkpoint"] == 24
    assert counts["evaluate"] == 24 * 6 and "evaluate_loglik" not in counts
    assert counts["ablation_tables"] == 1 and "tables" not in counts and "build_toy_base" not in counts
    assert counts["total"] == 196
    arms = re.findall(r"rule train:.*?wildcards: model=([\w.-]+), dataset=(\w+), arm=([\w@.+-]+), seed=(\d)", text,
                      flags=re.S)
    assert len(arms) == 24 and all("@" in a for _, _, a, _ in arms)          # no default (main-grid) run
    assert {(m, d) for m, d, _, _ in arms} == {("llama-3b", "gsm8k")}
    assert len({a for _, _, a, _ in arms}) == 12
    assert "results/paper/runs/llama-3b/gsm8k/soft@logits-top50/seed1/metrics.jsonl" in text
    # gamma = 3 trains at 3.0 and, as the paper's noise-factor table, is tested at the grid's 0.33
    blocks = text.split("\n\n")
    train = next(b for b in blocks if "rule train:" in b and "arm=fuzzy@gamma3.0" in b)
    evaluate = next(b for b in blocks if "rule evaluate:" in b and "trained=gsm8k-fuzzy@gamma3.0-seed0" in b)
    assert '"noise_factor": 3.0' in train and '"noise_factor": 0.33' in evaluate


def test_dry_run_refuses_a_grid_whose_jobs_cannot_fit(tmp_path):
    """Llama-8B's training on one 80 GB GPU needs ~166 GB: the DAG stops before any job starts,
    naming the job and the gigabytes."""
    over = tmp_path / "one_gpu.yaml"
    over.write_text("grids:\n  paper:\n    models:\n      llama-8b: {source: meta-llama/Llama-3.1-8B-Instruct, "
                    "lr: 3.0e-6, train_gpus: 1}\n")
    proc = snakemake("--profile", "slurm", "-n", "--configfile", str(over), env=PAPER_ENV)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "PlanError" in text and "train llama-8b/gsm8k on 1 GPU(s)" in text and "GB per GPU" in text
    assert "train llama-3b" not in text  # only the job that does not fit is named


def test_listing_what_one_cell_depends_on():
    """The README's recipe: a forced dry run of one cell lists its whole upstream chain."""
    proc = snakemake("results/paper/eval/llama-8b/gsm8k-fuzzy-seed0/gsm8k/hard_greedy.json",
                     "--profile", "slurm", "-n", "--forceall", "--quiet", "rules")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert job_counts(proc) == {"prepare_data": 1, "prepare_benchmark": 1, "train": 1, "select_checkpoint": 1,
                                "evaluate": 1, "total": 5}


def test_lint_is_clean():
    proc = snakemake("--lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr


TINY = {
    "datasets": {"toyarith": {"loader": "toy", "train_size": 200, "validation_size": 8, "test_size": 6, "seed": 1},
                 "toychoice": {"loader": "toy_mc", "test_size": 5, "seed": 2}},
    "toy_base": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "vocab_size": 160,
                 "sft_steps": 4, "sft_batch_size": 8, "sft_lr": 3e-3, "seed": 0},
    "training": [{"model": "toy", "dataset": "toyarith", "modes": ["hard", "fuzzy"], "seeds": [0]}],
    "evaluation": {"models": ["toy"], "benchmarks": ["toyarith"], "settings": ["hard_greedy", "fuzzy_sample"],
                   "n_samples": 2, "cot_max_tokens": 10, "answer_max_tokens": 4, "batch_size": 16, "seed": 0,
                   "ood_benchmarks": ["toychoice"], "loglik_batch_size": 4},
    "rl": {"prompts_per_step": 2, "samples_per_prompt": 2, "steps": 2, "warmup_steps": 1, "cot_max_tokens": 10,
           "answer_max_tokens": 4, "val_every": 1, "val_size": 8, "micro_batch_size": 4, "compute_dtype": "float32"},
}


@pytest.mark.slow
def test_tiny_dag_end_to_end(tiny_dag, tmp_path):
    args = tiny_args(tiny_dag)
    res = tiny_dag / "results" / "toy"
    for p in ("tables/main.md", "tables/main.tex", "tables/main.csv", "tables/settings_toyarith.md",
              "figures/training_toy_toyarith.png", "figures/entropy_toy_toyarith_toyarith.png",
              "figures/passk_toy_toyarith_toyarith.png",
              "runs/toy/toyarith/fuzzy/seed0/selected.json", "eval/toy/base/toyarith/fuzzy_sample.json",
              "tables/ood.md", "tables/ood.csv", "eval/toy/toyarith-hard-seed0/toychoice/loglik.json",
              "figures/passk_toy_toyarith_toyarith.pdf", "report/reproduction.md", "report/reproduction.html",
              "report/ledger.csv", "report/ledger_tables.csv", "report/ledger.html", "tables/main.cells.json"):
        assert (res / p).exists(), p
    assert not (res / "runs/toy/toyarith/hard/seed0/_resume").exists()  # resume state removed on success
    result = json.loads((res / "eval/toy/toyarith-fuzzy-seed0/toyarith/fuzzy_sample.json").read_text())
    assert result["n_samples"] == 2 and len(result["problems"]) == 6 and len(result["pass@k"]) == 2
    assert result["provenance"]["inputs"]["selected"]["sha256"]
    selected = json.loads((res / "runs/toy/toyarith/fuzzy/seed0/selected.json").read_text())
    assert selected["step"] >= 1 and 0 in selected["validated_steps"]       # the base is the reference only
    assert result["selection"]["step"] == selected["step"] and "improved_over_base" in result["selection"]
    assert result["grading_timeouts"] == 0 and result["sigma_source"].startswith("base model's E")
    loglik = json.loads((res / "eval/toy/toyarith-hard-seed0/toychoice/loglik.json").read_text())
    assert loglik["selection"]["step"] >= 1
    table = (res / "tables/main.md").read_text()
    assert "no finetune" in table and "toyarith fuzzy" in table and "toyarith hard" in table
    ood = (res / "tables/ood.md").read_text()
    assert "toychoice Accuracy" in ood and "toychoice NLL Correct" in ood and "toyarith fuzzy" in ood

    # the audit walks the table back to the data, and every link holds
    audit = subprocess.run([str(BIN / "softtokens"), "audit", "results/toy/tables/main.md"], cwd=tiny_dag,
                           capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout
    for stage in ("[tables]", "[evaluate]", "[select_checkpoint]", "[train]", "[build_toy_base]", "[prepare_data]"):
        assert stage in audit.stdout

    # the reproduction report: toy claims, no paper cell, a ledger of every job in CPU seconds
    report = (res / "report/reproduction.md").read_text()
    assert "This is the toy grid" in report and "0 of 162 cells measured" in report
    ledger = pd.read_csv(res / "report/ledger.csv")
    assert {"build_toy_base", "train", "select", "evaluate", "evaluate_loglik", "tables"} <= set(ledger.rule)
    assert (ledger.gpu_hours == 0).all() and (ledger.wall_s > 0).all()
    # one table cell back to its data, seed file by seed file
    cell = subprocess.run([str(BIN / "softtokens"), "audit", "results/toy/tables/main.md", "--row", "toy toyarith hard",
                           "--column", "toyarith Greedy pass@1"], cwd=tiny_dag, capture_output=True, text=True)
    assert cell.returncode == 0, cell.stdout + cell.stderr
    assert "chain intact" in cell.stdout and "[build_toy_base]" in cell.stdout and "[prepare_data]" in cell.stdout
    # Snakemake's own report of the run: every table as an HTML page (shown inline, not a CSV link)
    proc = snakemake(*args, "--report", str(tmp_path / "report.html"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (tmp_path / "report.html").read_text()
    for table in ("main.html", "settings_toyarith.html", "ood.html", "ledger.html", "ledger_tables.html"):
        assert table in page, table
    assert "<table" in (res / "tables/main.html").read_text()

    # every training run streamed its scalars to TensorBoard, read back with TensorBoard's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for arm in ("hard", "fuzzy"):
        acc = EventAccumulator(str(res / f"runs/toy/toyarith/{arm}/seed0/tensorboard"))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        assert {"reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio",
                "entropy", "cot/effective_tokens", "grad_norm", "learning_rate", "perf/rollout_tokens_per_s",
                "perf/step_time_s", "reward/frac_100_correct", "reward/grading_timeouts",
                "val/greedy_accuracy"} <= tags, tags
        assert [e.step for e in acc.Scalars("reward")] == [1, 2, 3, 4]
        assert ("replay/residual" in tags) == (arm == "fuzzy")

    # one screen for the grid, from the results directory only
    status = subprocess.run([str(BIN / "softtokens"), "status", "--config", "tiny.yaml"], cwd=tiny_dag,
                            capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    assert "training runs 2: 2 done, 0 running, 0 failed, 0 pending" in status.stdout
    assert "evaluate files" in status.stdout and "6: 6 done, 0 running, 0 failed, 0 pending" in status.stdout
    assert "3: 3 done" in status.stdout  # out-of-domain: base and both runs

    # nothing left to do; deleting one evaluation (of a copy) remakes it and what depends on it, nothing else
    assert job_counts(snakemake(*args, "-n")) == {}
    shutil.copytree(tiny_dag, tmp_path / "dag", symlinks=True)
    args, res = tiny_args(tmp_path / "dag"), tmp_path / "dag" / "results" / "toy"
    (res / "eval/toy/toyarith-hard-seed0/toyarith/hard_greedy.json").unlink()
    counts = job_counts(snakemake(*args, "-n"))
    assert counts == {"evaluate": 1, "tables": 1, "figures": 1, "reproduction_report": 1, "all": 1, "total": 5}, counts
