"""How the workflow's jobs are configured (softtokens.grid.jobs), tested as Python: which settings
an evaluation and a training job get, what an ablation variant changes, the paper grid's GPUs,
threads and partitions, and the command a multi-GPU training job runs. (The DAG itself, dry runs
and a real run: tests/test_workflow.py.)"""

import copy
import json
from pathlib import Path

import pytest
import yaml

from softtokens.commands.train import launch_command, without_processes
from softtokens.data.sources import loader_kind
from softtokens.config.grids import check_config
from softtokens.grid.jobs import GridJobs
from softtokens.config.names import SETTINGS

ROOT = Path(__file__).resolve().parents[1]
PAPER_ENV = {"SOFTTOKENS_SLURM_ACCOUNT": "testacct", "SOFTTOKENS_SLURM_GPU_PARTITION": "testgpu"}


@pytest.fixture()
def config():
    return yaml.safe_load((ROOT / "config.yaml").read_text())


def jobs(config: dict, grid: str, environ: dict | None = None) -> GridJobs:
    config = copy.deepcopy(config)
    config["grid"] = grid
    check_config(config, loader_kind)  # completes reused grids, as common.smk does
    from softtokens.sizing.plan import resolve_memory

    return GridJobs(config, {} if environ is None else environ, resolve_rl=resolve_memory)  # as common.smk does


def test_evaluation_takes_the_cot_settings_of_its_grid_and_training_those_of_its_cell(config):
    """`soft_temperature` set for the grid reaches the base model's evaluation; set for one training
    cell, it reaches that run's training, and its evaluations only when the grid tests runs with
    their own settings (`inference_settings: run`; Section 4's, the grid's, otherwise)."""
    config["grids"]["toy"]["rl"]["soft_temperature"] = 0.7
    config["grids"]["toy"]["training"][0]["rl"] = {"soft_temperature": 0.9}
    j = jobs(config, "toy")
    assert json.loads(j.eval_settings("toy", "base"))["soft_temperature"] == 0.7
    assert json.loads(j.train_settings("toy", "toyarith", "soft", 0))["soft_temperature"] == 0.9
    assert json.loads(j.eval_settings("toy", "toyarith-soft-seed0"))["soft_temperature"] == 0.7
    config["grids"]["toy"]["evaluation"]["inference_settings"] = "run"
    assert json.loads(jobs(config, "toy").eval_settings("toy", "toyarith-soft-seed0"))["soft_temperature"] == 0.9


def test_every_job_gets_every_key(config):
    """A training job's settings are every key of TrainConfig; an evaluation's every key its command
    requires: no command falls back on a default of its own."""
    from softtokens.commands.evaluate import EVAL_KEYS, LOGLIK_KEYS
    from softtokens.config.names import COT_KEYS, PLACEMENT_KEYS
    from softtokens.train.config import TrainConfig

    for grid in ("toy", "paper"):
        j = jobs(config, grid)
        run = j.training_runs()[0]
        cfg = TrainConfig.from_settings(json.loads(j.train_settings(run.model, run.dataset, run.mode, run.seed)))
        assert cfg.lr == config["grids"][grid]["models"][run.model]["lr"]
        assert set(json.loads(j.eval_settings(run.model, "base"))) == {*EVAL_KEYS, *COT_KEYS, *PLACEMENT_KEYS}
        assert set(json.loads(j.loglik_settings())) == set(LOGLIK_KEYS)


def test_a_variant_trains_with_its_own_keys_and_is_tested_as_section_4_says(config):
    """A variant's tau / placement / k reach its training; its evaluation takes Section 4's settings
    (tau 0.5 / 1e-4, gamma 0.33, embedding noise), as the paper evaluates its ablations, unless the
    grid asks for the run's own (evaluation.inference_settings: run)."""
    j = jobs(config, "toy-ablations")
    train = json.loads(j.train_settings("toy", "toyarith", "soft@logits-top5", 1))
    assert (train["noise_placement"], train["noise_top_k"], train["soft_temperature"]) == ("logits", 5, 1.0)
    assert train["variant"] == "logits-top5"
    ev = json.loads(j.eval_settings("toy", "toyarith-soft@logits-top5-seed1"))
    assert (ev["soft_temperature"], ev["noise_placement"], ev["noise_top_k"]) == (0.5, "embedding", 0)
    fuzzy = json.loads(j.train_settings("toy", "toyarith", "fuzzy@tau0.01", 0))
    assert fuzzy["fuzzy_temperature"] == 0.01
    assert json.loads(j.eval_settings("toy", "toyarith-fuzzy@tau0.01-seed0"))["fuzzy_temperature"] == 0.0001
    config["grids"]["toy-ablations"]["evaluation"]["inference_settings"] = "run"
    ev = json.loads(jobs(config, "toy-ablations").eval_settings("toy", "toyarith-soft@logits-top5-seed1"))
    assert (ev["soft_temperature"], ev["noise_placement"], ev["noise_top_k"]) == (1.0, "logits", 5)


def test_the_paper_ablations_reuse_the_main_cells_and_test_at_the_grids_gamma(config):
    j = jobs(config, "ablations")
    runs = j.training_runs()
    assert len(runs) == 24 and all(r.variant for r in runs) and {(r.model, r.dataset) for r in runs} == {
        ("llama-3b", "gsm8k")}
    assert len({(r.mode, r.variant) for r in runs}) == 12
    assert json.loads(j.train_settings("llama-3b", "gsm8k", "fuzzy@gamma3.0", 0))["noise_factor"] == 3.0
    assert json.loads(j.eval_settings("llama-3b", "gsm8k-fuzzy@gamma3.0-seed0"))["noise_factor"] == 0.33
    runs_of_default, where, planned = j.ablation_runs("soft")
    assert where == "results/paper" and not planned and len(runs_of_default) == 3  # the paper grid's, never replanned
    metrics = j.ablation_metrics()  # the variants' own runs; the default rows' only where they exist
    assert len(metrics) == 24 and all("@" in m for m in metrics)


def test_paper_jobs_gpus_threads_and_partitions(config):
    j = jobs(config, "paper", PAPER_ENV)
    train = j.resources("train")
    assert callable(train["gpu"]) and train["gpu"]("llama-3b") == 2 and train["gpu"]("llama-8b") == 8
    assert train["nodes"] == 1 and train["runtime"] == 2880 and train["mem_mb_per_cpu"] == 8000
    assert "mem_mb" not in train  # never both (SLURM refuses)
    assert train["slurm_partition"] == "testgpu" and train["slurm_account"] == "testacct"
    assert j.threads("train", "llama-3b") == 2 * train["cpus_per_gpu"]
    assert j.resources("evaluate")["gpu"] == 1 and j.resources("evaluate_loglik")["gpu"] == 1
    assert j.ledger_gpus()["train"] == {"llama-3b": 2, "llama-8b": 8, "qwen-3b": 2}
    assert j.gpu_rule_env().endswith("softtokens-gpu.yaml")
    toy = jobs(config, "toy")
    assert toy.threads("train", "toy") == 1 and toy.gpu_rule_env().endswith("softtokens.yaml")
    s = json.loads(j.train_settings("llama-3b", "math", "soft", 1))
    assert (s["cot_max_tokens"], s["param_dtype"], s["compute_dtype"]) == (512, "float32", "bfloat16")
    ev = json.loads(j.eval_settings("llama-3b", "math-soft-seed1"))
    assert ev["n_samples"] == 32 and (ev["soft_temperature"], ev["fuzzy_temperature"], ev["noise_factor"]) == (
        0.5, 0.0001, 0.33)
    loglik = json.loads(j.loglik_settings())
    assert loglik["protocol"] == "generative" and loglik["cot_max_tokens"] == 512
    assert j.eval_model_arg("qwen-3b", "base") == "--model Qwen/Qwen2.5-3B-Instruct"
    assert j.eval_model_arg("llama-3b", "math-soft-seed1") == \
        "--selected results/paper/runs/llama-3b/math/soft/seed1/selected.json"


def test_a_multi_gpu_training_job_starts_itself_once_per_gpu():
    argv = ["train", "--processes", "2", "--settings", "{}", "--base", "m", "--processes=4", "--threads", "16"]
    assert without_processes(argv) == ["train", "--settings", "{}", "--base", "m", "--threads", "16"]
    cmd = launch_command(8, without_processes(argv), 31234)
    assert cmd[:6] == ["accelerate", "launch", "--multi_gpu", "--num_processes", "8", "--num_machines"]
    assert cmd[cmd.index("--main_process_port") + 1] == "31234"
    assert cmd[cmd.index("-m"):] == ["-m", "softtokens", *without_processes(argv)]


def test_one_cell_of_each_kind_is_a_target(config):
    """Every cell of the layout is a target, so a deleted evaluation is remade by a plain run."""
    j = jobs(config, "paper")
    targets = set(j.all_targets())
    assert "results/paper/eval/llama-8b/gsm8k-fuzzy-seed0/gsm8k/hard_greedy.json" in targets
    assert "results/paper/eval/qwen-3b/base/mmlu/loglik.json" in targets
    assert "results/paper/runs/llama-3b/math/soft/seed2/selected.json" in targets
    assert "results/paper/tables/main.md" in targets
    assert len(j.eval_targets()) == (45 + 3) * 3 * len(SETTINGS) and len(j.loglik_targets()) == (45 + 3) * 3


def test_each_job_declares_the_host_memory_its_plan_needs_and_the_slurm_request_covers_it(config):
    """As common.smk builds them (sizing.host's plan handed in): a llama-8b training job on its 4 GPUs declares
    the larger of the grid's request (8,000 MB a CPU x 32 CPUs) and its planned host peak over its 4 processes (all
    loading the float32 model at once; the main one later staging a save's consolidated weights), one figure, never
    mem_mb_per_cpu beside it (SLURM refuses both). On the CPU real grid a job's plan alone decides (no request)."""
    from types import SimpleNamespace

    from softtokens.sizing.gpus import resolve_gpus
    from softtokens.sizing.host import HOST_MARGIN, MB, HostPlan
    from softtokens.sizing.plan import resolve_memory

    c = copy.deepcopy(config)
    c["grid"] = "paper"
    check_config(c, loader_kind)
    resolve_gpus(c, "paper")
    plan = HostPlan(c, "paper")
    j = GridJobs(c, PAPER_ENV, resolve_rl=resolve_memory, host_mb=plan.mb)
    train = j.resources("train")
    assert "mem_mb_per_cpu" not in train and callable(train["mem_mb"])
    eight = SimpleNamespace(model="llama-8b", dataset="gsm8k", arm="soft")
    needed = plan.train_job_bytes("llama-8b", "gsm8k", "soft")
    assert needed >= 4 * 32.1e9   # four processes, each the whole float32 model while it loads
    assert train["mem_mb"](eight) >= max(needed * HOST_MARGIN / MB, 8000 * j.threads("train", "llama-8b"))
    real = copy.deepcopy(config)
    real["grid"] = "real"
    check_config(real, loader_kind)
    rj = GridJobs(real, {}, resolve_rl=resolve_memory, host_mb=HostPlan(real, "real").mb)
    soft = SimpleNamespace(model="smollm2", dataset="gsm8k", arm="soft")
    assert rj.resources("train")["mem_mb"](soft) == HostPlan(real, "real").mb("train", soft) < 16000
