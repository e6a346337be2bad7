"""bf16 compute on this CPU: torch's own bf16 kernels against model.cpu_bf16's float32 products (what the jobs run
where the CPU has no bf16 units), on the real grid's model (SmolLM2-135M-Instruct, bf16 weights), in one process:
one forward and backward of the update pass's shape (2 rows of 141 tokens: a 1 x 2 RL step on a GSM8K prompt), and
one prefill forward, the median of --repeats interleaved runs each; and how far apart the two are (the summed
log-normaliser of the logits, the gradient's norm), against the float32 model's.

    python benchmarks/cpu_bf16.py --out benchmarks/results/cpu_bf16_HOST.json [--model-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from real_model import model_dir   # benchmarks/real_model.py: the packaged SmolLM2 built once, or a given one

from softtokens.model.cpu_bf16 import Float32Products, native_bf16
from softtokens.store.provenance import device

ROOT = Path(__file__).resolve().parents[1]


def one_pass(model, ids: torch.Tensor, backward: bool) -> tuple[float, float, float]:
    """(seconds, the summed log-normaliser, the gradient's norm or 0)."""
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with torch.set_grad_enabled(backward):
        out = model(ids).logits.float().logsumexp(-1).sum()
        if backward:
            out.backward()
    seconds = time.perf_counter() - start
    norm = 0.0
    if backward:
        norm = torch.stack([p.grad.float().norm() for p in model.parameters() if p.grad is not None]).norm().item()
    return seconds, out.item(), norm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as scratch:
        path = model_dir(a.model_dir, Path(scratch))
        reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        bf16 = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    ids = torch.randint(0, reference.config.vocab_size, (2, 141))
    _, ref_value, ref_norm = one_pass(reference, ids, True)
    runs: dict[str, dict[str, list]] = {k: {"update": [], "prefill": []} for k in ("native", "float32_products")}
    values: dict[str, tuple[float, float]] = {}
    for _ in range(a.repeats):   # interleaved: a slow spell of the machine falls on both
        for kind in runs:
            with Float32Products() if kind == "float32_products" else contextlib.nullcontext():
                seconds, value, norm = one_pass(bf16, ids, True)
                runs[kind]["update"].append(seconds)
                runs[kind]["prefill"].append(one_pass(bf16, ids[:1], False)[0])
            values[kind] = (value, norm)
    median = {k: {phase: statistics.median(v) for phase, v in r.items()} for k, r in runs.items()}
    result = {
        "device": device(), "cpu_bf16_native": native_bf16(), "threads": a.threads, "tokens": list(ids.shape),
        "seconds_median": median, "runs": runs,
        "native_over_float32_products": {p: median["native"][p] / median["float32_products"][p] for p in
                                         ("update", "prefill")},
        "vs_float32_model": {k: {"logsumexp_sum_rel_diff": abs(v - ref_value) / abs(ref_value),
                                 "grad_norm_rel_diff": abs(n - ref_norm) / ref_norm} for k, (v, n) in values.items()},
    }
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("seconds_median", "native_over_float32_products", "vs_float32_model")},
                     indent=1))


if __name__ == "__main__":
    main()
