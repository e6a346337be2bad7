"""The decode step's attention through FlexAttention (torch.nn.attention.flex_attention): compiled, a single
query per row runs torch's flash-decoding kernel, which splits each row's keys and values over thread
blocks (split-K) and reduces their partial softmaxes, so a batch of 64 rows x 8 KV heads fills the GPU
instead of the 64 x 8 blocks the memory-efficient kernel launches (issue 44: that kernel was 20 % of the
H100 decode step, at 2.1-2.2x the bandwidth bound).

The mask is each row's length, read from the KV cache's device tensor inside the kernel (a score_mod: a
key column past a row's length scores -inf), so no (rows x window) mask is made per step, and a captured
CUDA graph reads the lengths the step left there. Grouped-query attention is the kernel's own
(``enable_gqa``: query head h reads KV head h // G, as HF's repeat_kv). The arithmetic is attention with a
float32 softmax, as the other two paths (decode_forward.ATTENTIONS); tests hold it to them on the CPU,
eager and compiled. Which path a GPU decodes with is decided by measurement (gpu-check's attention A/B),
not here.
"""

from __future__ import annotations

import functools
import warnings

import torch


def declined(query_heads: int, kv_heads: int) -> str | None:
    """Why inductor's split-K decoding kernel cannot serve a model (None: it can): it needs each KV head's
    group of query heads to be a power of two (Llama-3.2-3B: 24 / 8 = 3 is not), and runs its general
    kernel otherwise (128 query rows computed for 1): then SDPA decodes (decode_forward)."""
    group = query_heads // kv_heads
    if group & (group - 1):
        return f"GQA group {query_heads}/{kv_heads} = {group} is not a power of two: the split-K decode kernel " \
               "does not apply (the general kernel computes 128 query rows for 1); SDPA decodes instead"
    return None


@functools.cache
def function(compiled: bool):
    """flex_attention, compiled (once per process; static shapes: a kernel per row count and read window,
    so inductor sees a fixed batch and picks its split-K decoding kernel: a CUDA graph bucket is one shape)
    or eager (the CPU tests: it materialises the scores, and says so once, which is silenced)."""
    from torch.nn.attention.flex_attention import flex_attention

    if compiled:
        return torch.compile(flex_attention, dynamic=False, fullgraph=True)

    # the eager kernel's advice to compile it, which the CPU tests know; a filter, not a wrapper, so that a
    # traced decode step (torch.compile fullgraph) sees flex_attention itself
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    return flex_attention


def length_mask(lengths: torch.Tensor):
    """A score_mod that lets row b see its key columns 0..lengths[b] (the new token is written at column
    ``lengths[b]``, as kvcache.SlotKVCache.decode_mask has it); made once per cache, so a compiled kernel
    keeps reading the same tensor."""
    def score_mod(score, b, h, q_idx, kv_idx):
        return torch.where(kv_idx <= lengths[b], score, -float("inf"))

    return score_mod


def attend(fn, q: torch.Tensor, K: torch.Tensor, V: torch.Tensor, score_mod, scale: float) -> torch.Tensor:
    """(N, Hk, G, D) queries over the cache's (N, Hk, W, D) keys and values -> (N, Hk * G * D)."""
    n, Hk, G, D = q.shape
    o = fn(q.reshape(n, Hk * G, 1, D), K, V, score_mod=score_mod, scale=scale, enable_gqa=True)
    return o.reshape(n, Hk * G * D)
