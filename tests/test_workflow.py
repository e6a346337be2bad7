"""The DAG itself: dry-run plans and lint (how each job is configured is Python, tested in
tests/test_jobs.py; the whole toy pipeline at the smallest scale runs in tests/test_tiny_dag.py)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from softtokens.config.names import SETTINGS

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


@pytest.mark.slow
def test_toy_grid_plan(tmp_path):
    proc = snakemake("-n", "-d", str(tmp_path), "-s", str(ROOT / "Snakefile"), "--configfile", str(ROOT / "config.yaml"))
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc)
    # the 3 runs of the grid, one seed per mode (the second seed is the toy-seeds grid's: `make demo-seeds`; its
    # learning-rate search the toy-sweeps grid's: `make demo-sweeps`)
    assert counts["train"] == 3 and counts["select_checkpoint"] == 3 and "sweep_tables" not in counts
    # base + 3 runs, each writing every setting's file and its out-of-domain file in one job
    # (evaluation.one_job_per_setting: false)
    assert counts["evaluate"] == 4 and "evaluate_loglik" not in counts
    assert counts["prepare_data"] == 1 and counts["prepare_benchmark"] == 2 and counts["build_toy_base"] == 1
    # the search: three values, of which 7e-5 is the toy grid's own hard seed-0 run (trained under that name, once),
    # its table; nothing tested
    sweeps = job_counts(snakemake("-n", "-d", str(tmp_path), "-s", str(ROOT / "Snakefile"), "--configfile",
                                  str(ROOT / "config.yaml"), "--config", "grid=toy-sweeps"))
    assert sweeps["train"] == 3 and sweeps["sweep_tables"] == 1 and "evaluate" not in sweeps, sweeps
    # the second seed: seed 1 of each mode beside the toy grid's seed 0, in the same results directory
    seeds = job_counts(snakemake("-n", "-d", str(tmp_path), "-s", str(ROOT / "Snakefile"), "--configfile",
                                 str(ROOT / "config.yaml"), "--config", "grid=toy-seeds"))
    assert seeds["train"] == 6 and seeds["evaluate"] == 7, seeds


@pytest.mark.slow
def test_one_evaluate_job_per_setting_unless_the_grid_says_otherwise(tmp_path):
    """The toy's evaluate job writes a model's file of every setting and its out-of-domain file (one process
    start-up); with one_job_per_setting (the default, the paper grid's) each file is a job of its own."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    target = "results/toy/eval/toy/toyarith-soft-seed0/toyarith/hard_greedy.json"
    args = ["-n", "-p", "-d", str(tmp_path), "-s", str(ROOT / "Snakefile"), "--configfile"]
    together = snakemake(target, *args, str(ROOT / "config.yaml"))
    assert together.returncode == 0, together.stderr
    shell = [line for line in together.stdout.splitlines() if "softtokens evaluate-model " in line]
    assert len(shell) == 1 and all(f'"{s}"' in shell[0] for s in SETTINGS)
    assert shell[0].count("toyarith-soft-seed0/toyarith/") >= len(SETTINGS)  # an out file per setting
    assert "toyarith-soft-seed0/toychoice/loglik.json" in shell[0]           # and the out-of-domain file
    config["grids"]["toy"]["evaluation"]["one_job_per_setting"] = True
    cfg = tmp_path / "apart.yaml"
    cfg.write_text(yaml.safe_dump(config))
    apart = snakemake(target, *args, str(cfg))
    assert apart.returncode == 0, apart.stderr
    shell = [line for line in apart.stdout.splitlines() if "softtokens evaluate " in line]
    assert len(shell) == 1 and "--setting hard_greedy --selected" in shell[0]
    assert job_counts(apart)["evaluate"] == 1


# HF_HUB_OFFLINE: the pre-flight of a slurm run asks the hub for the data it will fetch (a dry run only says so)
PAPER_ENV = {"SOFTTOKENS_SLURM_ACCOUNT": "testacct", "SOFTTOKENS_SLURM_GPU_PARTITION": "testgpu", "HF_HUB_OFFLINE": "1"}


@pytest.mark.slow
def test_paper_grid_plan_with_the_slurm_profile():
    """`snakemake --profile profiles/slurm -n` at the repository root: no SLURM, GPU or network
    needed (`--profile slurm`, through the ./slurm link, plans the tests below)."""
    proc = snakemake("--profile", "profiles/slurm", "-n", "--quiet", "rules")
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = job_counts(proc)
    runs = 5 * 3 * 3                    # Table 1's (model, dataset) cells x modes x seeds
    models = runs + 3                   # + the three base models
    settings = len(SETTINGS)            # the inference settings (config.names: the paper's six)
    assert counts["train"] == runs and counts["select_checkpoint"] == runs
    assert counts["evaluate"] == models * 3 * settings   # x GSM8K, MATH-500, OlympiadBench x every setting
    assert counts["evaluate_loglik"] == models * 3    # x HellaSwag, ARC, MMLU
    assert counts["prepare_data"] == 3 and counts["prepare_benchmark"] == 6
    assert "build_toy_base" not in counts
    # a job per table (Table 1, one per benchmark, out-of-domain) and per figure (training curves per
    # (model, training set); pass@k and entropy per (model, training set, benchmark))
    cells = 5
    summaries = {"main_table": 1, "settings_table": 3, "ood_table": 1, "training_figure": cells,
                 "passk_figure": cells * 3, "entropy_figure": cells * 3, "hard_passk_figure": 1,   # the paper's Fig. 3
                 "paper_claims": 1, "reproduction_report": 1, "all": 1}
    assert {k: counts[k] for k in summaries} == summaries
    assert counts["total"] == 2 * runs + models * 3 * settings + models * 3 + 3 + 6 + sum(summaries.values())


@pytest.mark.slow
def test_one_table_plans_only_what_it_rests_on():
    """The out-of-domain table reads the out-of-domain files only: its dry run plans the 45 runs and the
    48 models' out-of-domain evaluations (189 GPU jobs), their data, and no math evaluation."""
    proc = snakemake("--profile", "slurm", "-n", "results/paper/tables/ood.md", "--quiet", "rules", env=PAPER_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert job_counts(proc) == {"prepare_data": 3, "prepare_benchmark": 3, "train": 45, "select_checkpoint": 45,
                                "evaluate_loglik": 144, "ood_table": 1, "total": 241}
    proc = snakemake("--profile", "slurm", "-n", "results/paper/tables/settings_math500.md", "--quiet", "rules",
                     env=PAPER_ENV)
    counts = job_counts(proc)
    assert counts["evaluate"] == 48 * len(SETTINGS) and "evaluate_loglik" not in counts and counts["settings_table"] == 1


def test_ablations_grid_plans_24_variant_runs_and_reuses_the_main_cells():
    """The appendix ablations: 12 (mode, variant) arms x 2 seeds, each evaluated under every inference
    setting on GSM8K; the default rows are the paper grid's runs, never planned here."""
    # `--quiet host` replaces the slurm profile's `quiet: rules` (a summary by rule): every job's block is printed
    proc = snakemake("--profile", "slurm", "-n", "--quiet", "host", "--config", "grid=ablations", env=PAPER_ENV)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    counts = job_counts(proc)
    assert counts["train"] == 24 and counts["select_checkpoint"] == 24
    assert counts["evaluate"] == 24 * len(SETTINGS) and "evaluate_loglik" not in counts
    assert counts["ablation_tables"] == 1 and "tables" not in counts and "build_toy_base" not in counts
    assert counts["total"] == 24 + 24 + 24 * len(SETTINGS) + 1 + 1 + 1 + 1
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
    """Llama-8B's training on one 80 GB GPU (`gpus_per_run: 1`) does not fit: the DAG stops before any job
    starts, naming the job and the gigabytes."""
    over = tmp_path / "one_gpu.yaml"
    over.write_text("grids:\n  paper:\n    gpus_per_run: 1\n")
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
    # the toy-sweeps grid's learning-rate search, here in the toy grid itself: the tiny DAG runs it end to end
    "sweep": {"pairs": [["toy", "toyarith"]], "seeds": [0],
              "learning_rate": {"values": [3.5e-5, 7.0e-5, 1.4e-4], "modes": ["hard"]}},
}


@pytest.mark.slow
def test_every_paper_grid_plans_from_local_copies_and_local_model_directories(tmp_path):
    """A cluster whose nodes have no internet: every dataset of the paper grid read from a local `{split}` file and
    every model from a local directory. The paper, mini, ablations and sweeps grids plan (a `{split}` path once
    stopped the DAG: Snakemake read it as a wildcard), and the path reaches each data job as written."""
    import json as _json

    from softtokens.data.sources import SOURCES
    from softtokens.sizing.architecture import architecture_file

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    for name, spec in config["grids"]["paper"]["datasets"].items():
        for split in SOURCES[spec["loader"]].splits.values():
            (tmp_path / "copies" / name).mkdir(parents=True, exist_ok=True)
            (tmp_path / "copies" / name / f"{split}.jsonl").write_text("{}\n")
        spec["path"] = f"{tmp_path}/copies/{name}/{{split}}.jsonl"
    for grid in ("paper", "mini"):
        for model, spec in config["grids"][grid]["models"].items():
            local = tmp_path / "models" / model
            local.mkdir(parents=True, exist_ok=True)
            (local / "config.json").write_text(architecture_file(spec["source"]).read_text())
            spec["source"] = str(local)
    (tmp_path / "offline.yaml").write_text(yaml.safe_dump(config))
    for grid in ("paper", "mini", "ablations", "sweeps"):
        proc = snakemake("-n", "-p", "-d", str(tmp_path), "-s", str(ROOT / "Snakefile"), "--configfile",
                         str(tmp_path / "offline.yaml"), "--config", f"grid={grid}",
                         env={"HF_HUB_OFFLINE": "1"})
        assert proc.returncode == 0, (grid, proc.stderr[-3000:])
        counts = job_counts(proc)
        assert counts["train"] > 0 and counts["prepare_data"] > 0, (grid, counts)
        assert _json.dumps(f"{tmp_path}/copies/gsm8k/{{split}}.jsonl") in proc.stdout, grid
        assert f"--base {tmp_path}/models/llama-3b" in proc.stdout, grid


@pytest.mark.slow
def test_a_run_another_grid_has_trained_is_not_trained_again(tmp_path):
    """Run identity (grid.identity): the sweeps grid's noise-factor runs 0.1, 1.0 and 3.0 on llama-3b x gsm8k compute
    what the ablations grid's gamma runs compute. Once those exist, `snakemake -n --config grid=sweeps` plans no
    training whose settings (less the run's name and memory-only keys) equal one of theirs: it plans a shared
    selection pointing at each instead."""
    import json as _json

    from softtokens.config.grids import computing_settings

    res = tmp_path / "results/paper"
    for split in ("train", "validation"):
        (res / "data/gsm8k").mkdir(parents=True, exist_ok=True)
        (res / "data/gsm8k" / f"{split}.jsonl").write_text("{}\n")
    for gamma in ("0.1", "1.0", "3.0"):
        run = res / f"runs/llama-3b/gsm8k/fuzzy@gamma{gamma}/seed0"
        for d in ("checkpoints", "tensorboard"):
            (run / d).mkdir(parents=True)
        (run / "metrics.jsonl").write_text("{}\n")
        (run / "selected.json").write_text("{}\n")
    from softtokens.data.sources import loader_kind
    from softtokens.config.grids import load_config
    from softtokens.grid.jobs import GridJobs
    from softtokens.store.paths import Run
    from softtokens.sizing.plan import resolve_memory

    config = {**load_config(ROOT / "config.yaml", loader_kind), "grid": "ablations"}
    jobs = GridJobs(config, {}, resolve_rl=resolve_memory)   # as the workflow resolves each run's settings
    ablation_settings = [computing_settings(jobs.run_settings(Run("llama-3b", "gsm8k", "fuzzy", f"gamma{g}", 0)))
                         for g in ("0.1", "1.0", "3.0")]
    args = ["-d", str(tmp_path), "-s", str(ROOT / "Snakefile"), "--configfile", str(ROOT / "config.yaml")]
    proc = snakemake("-n", "-p", *args, "--config", "grid=sweeps")
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = [computing_settings(_json.loads(line.split("--settings '")[1].split("'")[0]))
               for line in proc.stdout.splitlines() if "softtokens train " in line]
    assert len(trained) == job_counts(proc)["train"] == 109   # the sweep's 112 less the three
    assert not any(s in ablation_settings for s in trained)
    shares = [line for line in proc.stdout.splitlines() if "softtokens select --share" in line]
    assert len(shares) == 3 and all("fuzzy@gamma" in line and "fuzzy@noise" in line for line in shares)
