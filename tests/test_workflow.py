"""The DAG itself: dry-run plan, lint, and the whole toy pipeline at the smallest scale."""

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def snakemake(*args, cwd=ROOT, timeout=600):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([str(BIN / "snakemake"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


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
    assert counts["evaluate"] == 7 * 6  # (base + 6 runs) x six settings
    assert counts["prepare_data"] == 1 and counts["build_toy_base"] == 1


def test_lint_is_clean():
    proc = snakemake("--lint")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr


TINY = {
    "datasets": {"toyarith": {"source": "toy", "train_size": 200, "validation_size": 8, "test_size": 6, "seed": 1}},
    "toy_base": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "vocab_size": 160,
                 "sft_steps": 4, "sft_batch_size": 8, "sft_lr": 3e-3, "seed": 0},
    "training": [{"model": "toy", "dataset": "toyarith", "modes": ["hard", "fuzzy"], "seeds": [0]}],
    "evaluation": {"models": ["toy"], "benchmarks": ["toyarith"], "settings": ["hard_greedy", "fuzzy_sample"],
                   "n_samples": 2, "cot_max_tokens": 10, "answer_max_tokens": 4, "batch_size": 16, "seed": 0},
    "rl": {"prompts_per_step": 2, "samples_per_prompt": 2, "steps": 2, "warmup_steps": 1, "cot_max_tokens": 10,
           "answer_max_tokens": 4, "val_every": 1, "val_size": 8, "micro_batch_size": 4, "dtype": "float32"},
}


@pytest.mark.slow
def test_tiny_dag_end_to_end(tmp_path):
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    grid = copy.deepcopy(config["grids"]["toy"])
    grid.update(copy.deepcopy(TINY))
    config["grids"] = {"toy": grid}
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(config))
    args = ["-d", str(tmp_path), "-s", str(ROOT / "Snakefile"), "--configfile", str(cfg)]

    proc = snakemake(*args, "--cores", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = tmp_path / "results" / "toy"
    for p in ("tables/main.md", "tables/main.tex", "tables/main.csv", "tables/settings_toyarith.md",
              "figures/training_toy_toyarith.png", "figures/entropy_toy_toyarith.png", "figures/passk_toy_toyarith.png",
              "runs/toy/toyarith/fuzzy/seed0/selected.json", "eval/toy/base/toyarith/fuzzy_sample.json"):
        assert (res / p).exists(), p
    assert not (res / "runs/toy/toyarith/hard/seed0/_resume").exists()  # resume state removed on success
    result = json.loads((res / "eval/toy/toyarith-fuzzy-seed0/toyarith/fuzzy_sample.json").read_text())
    assert result["n_samples"] == 2 and len(result["problems"]) == 6 and len(result["pass@k"]) == 2
    assert result["provenance"]["inputs"]["selected"]["sha256"]
    table = (res / "tables/main.md").read_text()
    assert "no finetune" in table and "toyarith fuzzy" in table and "toyarith hard" in table

    # the audit walks the table back to the data, and every link holds
    audit = subprocess.run([str(BIN / "softtokens"), "audit", "results/toy/tables/main.md"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout
    for stage in ("[tables]", "[evaluate]", "[select_checkpoint]", "[train]", "[build_toy_base]", "[prepare_data]"):
        assert stage in audit.stdout

    # nothing left to do; deleting one evaluation remakes it and what depends on it, nothing else
    assert job_counts(snakemake(*args, "-n")) == {}
    (res / "eval/toy/toyarith-hard-seed0/toyarith/hard_greedy.json").unlink()
    counts = job_counts(snakemake(*args, "-n"))
    assert counts == {"evaluate": 1, "tables": 1, "figures": 1, "all": 1, "total": 4}, counts
