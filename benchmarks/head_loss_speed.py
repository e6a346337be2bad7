"""The update pass's loss and backward with the fused head (train.head_loss: the head once, its weight
gradients summed in float32) against the checkpointed path (the head again in the backward, a weight
gradient per chunk), in the same process, on a head-dominated model (V / d = 64; the paper's Llama-3.2-3B
has 42), for hard and soft tokens.

    python benchmarks/head_loss_speed.py [--vocab 16384 --hidden 256 --rows 8 --steps 256 --repeats 5]

Prints one JSON object: per mode, the median seconds of each path, fused / checkpointed, the largest
relative gradient difference and, on CUDA (bf16, the paper's path), the peak memory of each.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import softtokens.train.rloo as rloo
from softtokens.engine.rollout import ANSWER, COT, Rollout
from softtokens.engine.settings import INFERENCE_SETTINGS


def synthetic_rollout(setting, rows: int, prompt: int, steps: int, vocab: int, hidden: int, dev) -> Rollout:
    """A rollout of random ids and inputs (the update pass's cost does not depend on what they say)."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, steps), generator=gen)
    phase = torch.full((rows, steps), COT)
    phase[:, -32:] = ANSWER
    noisy = 0.02 * torch.randn(rows, steps, hidden, generator=gen) if setting.mode != "hard" else None
    return Rollout(setting, 0.02, torch.randint(0, vocab, (rows, prompt), generator=gen).to(dev),
                   torch.ones(rows, prompt, dtype=torch.long, device=dev), ids.to(dev), phase.to(dev),
                   None if noisy is None else noisy.to(dev), torch.zeros(rows, steps, device=dev),
                   torch.full((rows,), steps - 32, device=dev), torch.ones(rows, dtype=torch.bool, device=dev),
                   [""] * rows, [""] * rows, ids.to(dev), row_keys=torch.arange(rows, device=dev))


def run(model, rollout, fused: bool, dev) -> tuple[float, dict]:
    adv = torch.linspace(-1, 1, rollout.step_ids.shape[0], device=dev)
    model.zero_grad(set_to_none=True)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    if fused:
        replay = rloo.rollout_log_probs(model, rollout, 0.02, 1.0, row_weights=-adv / len(adv))
        loss = replay.loss
    else:
        replay = rloo.rollout_log_probs(model, rollout, 0.02, 1.0)
        loss = rloo.rloo_loss(replay.cot + replay.answer, adv, len(adv))
    loss.backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t, {n: p.grad.float().clone() for n, p in model.named_parameters()
                                     if p.grad is not None}


def main() -> None:
    from softtokens.model.toy import build_toy_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    heads = max(1, a.hidden // 128)  # head_dim 128, as Llama-3.2-3B
    model = build_toy_model(a.vocab, a.hidden, 2, heads, 3 * a.hidden, 0, 1, 2, seed=0).to(dev, dtype)
    rloo.logit_chunk_steps = lambda rows: 64  # several chunks, as the paper's micro-batches of 16 rows have
    out = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "dtype": str(dtype),
           "vocab": a.vocab, "hidden": a.hidden, "rows": a.rows, "steps": a.steps, "chunk_steps": 64, "modes": {}}
    for mode, name in (("hard", "hard_sample"), ("soft", "soft_sample")):
        rollout = synthetic_rollout(INFERENCE_SETTINGS[name], a.rows, 16, a.steps, a.vocab, a.hidden, dev)
        times, grads, peaks = {False: [], True: []}, {}, {}
        for _ in range(a.repeats):
            for fused in (False, True):  # interleaved: drift hits both
                seconds, grads[fused] = run(model, rollout, fused, dev)
                times[fused].append(seconds)
                if dev.type == "cuda":
                    peaks[fused] = round(torch.cuda.max_memory_allocated() / 1e9, 3)
        plain, fused = statistics.median(times[False]), statistics.median(times[True])
        diff = max(float((grads[True][k] - grads[False][k]).abs().max() / (grads[False][k].abs().max() + 1e-30))
                   for k in grads[False])
        out["modes"][mode] = {"checkpointed_s": round(plain, 4), "fused_s": round(fused, 4),
                              "fused_over_checkpointed": round(fused / plain, 3), "max_relative_grad_diff": diff,
                              **({"peak_GB": {"checkpointed": peaks[False], "fused": peaks[True]}} if peaks else {})}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
