"""A decode layer's elementwise work (RMSNorm, the residual adds, rotary, the SiLU-gated product) as
four functions, and the same four compiled into fused kernels for the captured CUDA decode step.

Why: on an H100 the soft decode step ran ~170 small elementwise and reduction kernels, 2.35 ms of a
~9.4 ms step at 64 rows (docs/gpu.md, "Where the decode step's time goes"). Each of the four
functions is one kernel when compiled, so a layer's elementwise work is four launches: the residual
add is fused with the RMSNorm that follows it (the next layer's input norm, or the final norm).

The eager functions are the arithmetic the decode forward always had, operation for operation (the
CPU toy's numbers do not change, and do not depend on a compiler). The compiled ones round every
intermediate to the compute dtype as eager does (inductor's ``emulate_precision_casts``); only a
reduction's summation order may differ. ``choose`` compiles them only where asked (the captured
CUDA step), and keeps them only if they compile and agree with the eager ones on sample tensors of
the model's shapes; otherwise it warns and returns the eager ones, saying why.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's LlamaRMSNorm / Qwen2RMSNorm: normalise in float32, scale in the input dtype (in float32
    that is torch's fused rms_norm, which gives the same bits as HF's four operations)."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm(h: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream after adding ``delta``, and its RMSNorm."""
    h = h + delta
    return h, rms_norm(h, weight, eps)


def rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
           sin_signed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary embedding of queries and keys (..., D): x cos + roll(x, D/2) sin_signed, which is HF's
    ``x cos + rotate_half(x) sin`` bit for bit (decode_forward.DecodeForward builds sin_signed)."""
    half = q.shape[-1] // 2
    return q * cos + q.roll(half, -1) * sin_signed, k * cos + k.roll(half, -1) * sin_signed


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The SiLU-gated product of the MLP."""
    return F.silu(gate) * up


class Elementwise(NamedTuple):
    """The four functions a decode layer calls between its GEMMs and its attention."""

    rms_norm: Callable
    add_rms_norm: Callable
    rotary: Callable
    silu_mul: Callable


EAGER = Elementwise(rms_norm, add_rms_norm, rotary, silu_mul)


@functools.cache
def compiled() -> Elementwise:
    """The four compiled (once per process; torch compiles again per dtype and device on first call).
    Dynamic shapes: one kernel serves every row count a job decodes."""
    options = {"emulate_precision_casts": True}  # round intermediates to bf16 where eager does
    return Elementwise(*(torch.compile(f, fullgraph=True, dynamic=True, options=options) for f in EAGER))


def _samples(model, rows: int = 3) -> dict[str, tuple]:
    """Arguments of each function at the model's shapes, dtype and device: its first layer's norm
    weight, random activations."""
    cfg, weight = model.config, model.get_input_embeddings().weight
    dtype, dev = weight.dtype, weight.device
    d, heads, kv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or d // heads
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=dev).to(dtype)

    norm = model.get_decoder().layers[0].input_layernorm
    eps = norm.variance_epsilon
    return {"rms_norm": (rand(rows, d), norm.weight, eps),
            "add_rms_norm": (rand(rows, d), rand(rows, d), norm.weight, eps),
            "rotary": (rand(rows, heads, head_dim), rand(rows, kv, head_dim), rand(rows, 1, head_dim),
                       rand(rows, 1, head_dim)),
            "silu_mul": (rand(rows, cfg.intermediate_size), rand(rows, cfg.intermediate_size))}


def disagreement(fused: Elementwise, model) -> str | None:
    """Where ``fused`` and the eager functions differ beyond the compute dtype's tolerance on the
    model's shapes (``torch.testing.assert_close``'s per-dtype defaults: bf16 rtol 1.6e-2, float32
    rtol 1.3e-6), or None. At one row and at several: dynamic shapes still specialise a size of 1, so
    both compile here, not in the middle of a job."""
    with torch.no_grad():
        for name, args in [item for rows in (1, 3) for item in _samples(model, rows).items()]:
            got, want = getattr(fused, name)(*args), getattr(EAGER, name)(*args)
            try:
                torch.testing.assert_close(got, want)
            except AssertionError as err:
                return f"{name}: {str(err).splitlines()[0]}"
    return None


def choose(model, fuse: bool) -> tuple[Elementwise, str]:
    """(the functions the decode forward calls, a line saying which): the compiled ones when ``fuse``
    and they compile here and agree with the eager ones; else the eager ones."""
    if not fuse:
        return EAGER, "off"
    try:
        fused = compiled()
        why = disagreement(fused, model)
    except Exception as err:  # no compiler or Triton on the node, an unsupported operation
        why = f"did not compile ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    if why is None:
        return fused, "fused (torch.compile)"
    warnings.warn(f"decode elementwise fusion off: {why}; the eager operations run")
    return EAGER, f"off: {why}"
