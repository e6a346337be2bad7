"""Gradient clipping. The paper states none (max_grad_norm 0); the ratio rule is our remedy for
fuzzy training's spikes (docs/findings.md): bound each step's gradient by k times the median
norm of the recent steps, of the whole gradient or of the input embedding E and the rest each."""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

import torch

GRAD_NORM_HISTORY_MIN = 5  # steps of gradient norms before max_grad_norm_ratio clips


class Clipped(NamedTuple):
    norm: float                   # the whole gradient's norm before clipping
    group_norms: dict[str, float]  # the norm of E's gradient and of the rest's, before clipping
    bounds: dict[str, float]       # the bounds applied ("all": the whole gradient's; inf: none)


def scalar(t) -> float:
    """A float from a norm that may be a DTensor (FSDP)."""
    from torch.distributed.tensor import DTensor

    return float(t.full_tensor() if isinstance(t, DTensor) else t)


def clip_threshold(cfg, metrics: list[dict], key: str = "grad_norm", with_ratio: bool = True,
                   absolute: bool = True) -> float:
    """A gradient-norm bound: max_grad_norm (``absolute``), and max_grad_norm_ratio x the median
    of ``key`` (a norm before clipping) over the previous grad_norm_window steps with a gradient,
    once GRAD_NORM_HISTORY_MIN of them exist (or the window, if smaller). The history is the
    run's metrics, reloaded on resume, so a resumed run clips as an unbroken one."""
    bounds = [cfg.max_grad_norm] if absolute and cfg.max_grad_norm > 0 else []
    if with_ratio and cfg.max_grad_norm_ratio > 0:
        # steps whose rewards all tied have no gradient: they are not part of the history
        past = [m[key] for m in metrics if m["kind"] == "train" and m.get(key, 0) > 0]
        past = past[-cfg.grad_norm_window:]
        if len(past) >= min(GRAD_NORM_HISTORY_MIN, cfg.grad_norm_window):
            bounds.append(cfg.max_grad_norm_ratio * statistics.median(past))
    return min(bounds, default=float("inf"))


def clip_gradients(policy, cfg, metrics: list[dict]) -> Clipped:
    """Clip the accumulated gradients of ``policy``. With grad_clip_groups: embedding_rest,
    max_grad_norm_ratio bounds each group by its own history instead of the whole: fuzzy spikes
    land on the rest, whose usual norm is ~1 % of E's."""
    params = list(policy.parameters())
    emb = policy.lm.get_input_embeddings().weight
    groups = {"embedding": [emb], "rest": [p for p in params if p is not emb]}
    by_group = cfg.grad_clip_groups == "embedding_rest"
    bounds, norms = {}, {}
    for name, ps in groups.items():
        bound = clip_threshold(cfg, metrics, f"grad_norm_{name}", absolute=False) if by_group else float("inf")
        norms[name] = scalar(torch.nn.utils.clip_grad_norm_(ps, bound))  # an infinite bound leaves it as is
        if by_group:
            bounds[name] = bound
    # the whole gradient: max_grad_norm, and the ratio too unless the groups took it
    bounds["all"] = clip_threshold(cfg, metrics, "grad_norm", with_ratio=not by_group)
    total = scalar(torch.nn.utils.clip_grad_norm_(params, bounds["all"]))  # after any group clipping
    if by_group:
        total = math.sqrt(sum(n * n for n in norms.values()))  # before clipping
    return Clipped(total, norms, bounds)
