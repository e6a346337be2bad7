"""The fused head loss against the checkpointed path at the paper's head size (train.head_loss): each
path's seconds and peak memory for hard and soft tokens, in the same process, interleaved, measured
as they come (the report is written after each repeat). What decides whether the fused path stays.

Why in gpu-check: a GPU's minutes are spent in one command; this A/B was a script of its own whose
result came back only when it ended (a cut run returned an empty file). benchmarks/head_loss_speed.py
runs the same A/B at any size."""

from __future__ import annotations

import statistics
import time

import torch

from softtokens.engine.rollout import ANSWER, COT, Rollout
from softtokens.engine.settings import INFERENCE_SETTINGS

PAPER_HEAD = {"vocab": 128256, "hidden": 3072, "rows": 16, "steps": 544}   # Llama-3.2-3B, a micro-batch of 16
CHUNK_STEPS = 64


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


def run_once(model, rollout, fused: bool, dev) -> tuple[float, dict]:
    """One update pass's loss and backward by one path: (seconds, float32 copies of the gradients)."""
    import softtokens.train.rloo as rloo

    adv = torch.linspace(-1, 1, rollout.step_ids.shape[0], device=dev)
    model.zero_grad(set_to_none=True)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    if fused:
        loss = rloo.rollout_log_probs(model, rollout, 0.02, 1.0, row_weights=-adv / len(adv)).loss
    else:
        replay = rloo.rollout_log_probs(model, rollout, 0.02, 1.0)
        loss = rloo.rloo_loss(replay.cot + replay.answer, adv, len(adv))
    loss.backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t, {n: p.grad.float().clone() for n, p in model.named_parameters()
                                     if p.grad is not None}


def head_model(vocab: int, hidden: int, dev, dtype):
    """A two-layer Llama of the head's size (head_dim 128, as Llama-3.2-3B): the update's cost is the head's."""
    from softtokens.model.toy import build_toy_model

    return build_toy_model(vocab, hidden, 2, max(1, hidden // 128), 3 * hidden, 0, 1, 2, seed=0).to(dev, dtype)


def head_ab(out: dict, vocab: int, hidden: int, rows: int, steps: int, repeats: int, dev, on_result=None,
            deadline: float | None = None) -> dict:
    """Per mode: each path's median seconds, fused / checkpointed, the largest relative gradient difference and
    (CUDA) each path's peak; ``on_result()`` after each repeat (the caller writes its file)."""
    import softtokens.train.rloo as rloo

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model = head_model(vocab, hidden, dev, dtype)
    chunk_steps, rloo.logit_chunk_steps = rloo.logit_chunk_steps, lambda r: CHUNK_STEPS
    out.update(vocab=vocab, hidden=hidden, rows=rows, steps=steps, chunk_steps=CHUNK_STEPS, dtype=str(dtype))
    try:
        for mode, name in (("hard", "hard_sample"), ("soft", "soft_sample")):
            rollout = synthetic_rollout(INFERENCE_SETTINGS[name], rows, 16, steps, vocab, hidden, dev)
            times, grads, peaks = {False: [], True: []}, {}, {}
            result = out.setdefault("modes", {}).setdefault(mode, {})
            for _ in range(repeats):
                if deadline is not None and time.monotonic() > deadline and times[True]:
                    result["cut"] = "at its deadline"
                    break
                for fused in (False, True):  # interleaved: drift hits both
                    seconds, grads[fused] = run_once(model, rollout, fused, dev)
                    times[fused].append(seconds)
                    if dev.type == "cuda":
                        peaks[fused] = round(torch.cuda.max_memory_allocated() / 1e9, 3)
                plain, fused = statistics.median(times[False]), statistics.median(times[True])
                diff = max(float((grads[True][k] - grads[False][k]).abs().max() / (grads[False][k].abs().max() + 1e-30))
                           for k in grads[False])
                result.update(checkpointed_s=round(plain, 4), fused_s=round(fused, 4),
                              fused_over_checkpointed=round(fused / plain, 3), max_relative_grad_diff=diff,
                              repeats=len(times[True]),
                              **({"peak_GB": {"checkpointed": peaks[False], "fused": peaks[True]}} if peaks else {}))
                if on_result:
                    on_result()
            del rollout, grads
    finally:
        rloo.logit_chunk_steps = chunk_steps
    return out


def check_head(report, shape, dev, deadline: float | None = None) -> None:
    """The A/B at the paper's head size on a GPU (a cut one with --smoke), reported, not pass/fail."""
    smoke = shape.source == "smoke"
    sizes = PAPER_HEAD if not smoke else {"vocab": 2048, "hidden": 128, "rows": 4, "steps": 96}
    out = report.sections.setdefault("head_loss", {})
    head_ab(out, sizes["vocab"], sizes["hidden"], sizes["rows"], sizes["steps"], 1 if smoke else 3, dev,
            on_result=report.write, deadline=deadline)
    for mode, r in out.get("modes", {}).items():
        report.check("head_loss", f"{mode}: fused head loss / checkpointed path (seconds)", None,
                     r.get("fused_over_checkpointed"), "reported" + (f"; peak GB {r['peak_GB']}" if "peak_GB" in r
                                                                     else ""))
