"""Load a causal LM and its tokenizer (hub id or local directory, the same code path), the
embedding scale that sets the soft-token noise, and the toy Llama built from scratch."""

from __future__ import annotations

import torch


def check_plain_output_head(model) -> None:
    """The engine and the replay compute logits themselves (``output_logits``), so a model whose
    head does more than ``hidden @ W.T`` (soft-capping, a logit scale) would be silently mis-read."""
    cfg = model.config
    for key in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        if getattr(cfg, key, None) not in (None, 1, 1.0):
            raise ValueError(f"{type(model).__name__}: config.{key}={getattr(cfg, key)!r}; the output head must be "
                             "a plain projection (hidden @ W.T), as in Llama and Qwen2")


def decoder_hidden(model, **inputs) -> torch.Tensor:
    """Last hidden states of the decoder stack (after its final norm), without the vocabulary
    projection, which ``output_logits`` does in float32."""
    return model.get_decoder()(**inputs).last_hidden_state


def float32_weights(model, vocab_rows: int | None = None, with_input: bool = False):
    """The output projection W[:vocab_rows] and, for the soft mixture, E[:vocab_rows], widened to
    at least float32 once per call site; a tied model gets one copy for both (a float32 copy of a
    128k x 3k matrix is 1.5 GB, and under autograd its gradient is another). float64 stays float64
    (gradient checks). Rows past ``vocab_rows`` (Qwen pads E) are never used."""
    W = model.get_output_embeddings().weight
    rows = vocab_rows or W.shape[0]
    wide = torch.promote_types(W.dtype, torch.float32)
    W32 = W[:rows].to(wide)
    if not with_input:
        return W32, None
    E = model.get_input_embeddings().weight
    return W32, (W32 if E.data_ptr() == W.data_ptr() else E[:rows].to(wide))


def output_logits(model, hidden: torch.Tensor, vocab_rows: int | None = None,
                  weight: torch.Tensor | None = None) -> torch.Tensor:
    """Logits in float32 from (bf16) hidden states: ``hidden.float() @ W[:vocab_rows].float().T``
    (``weight``: that widened W, from float32_weights, when the caller already has it).

    Every product of two bf16 numbers is exact in float32 and the sum is accumulated and kept in
    float32, so the logits are not rounded to bf16's 8 significant bits. That matters for fuzzy
    tokens (tau = 1e-4): bf16 logits of magnitude 16-32 are spaced 0.125 apart, so two candidate
    tokens either tie exactly (a 50/50 mixture whose replay may not tie) or differ by >= 1250 tau
    (a one-hot); see docs/engine.md, "Precision and sharding"."""
    if weight is None:
        weight = float32_weights(model, vocab_rows)[0]
    return hidden.to(weight.dtype) @ weight.T


_FUSED_OK: dict[str, bool] = {}


def fused_wide_matmul(device: torch.device) -> bool:
    """Whether this device multiplies bf16 / fp16 matrices into a float32 result in one GEMM
    (``torch.mm(..., out_dtype=torch.float32)``: CUDA in recent torch; CPUs have no kernel). Probed
    once per device type; a torch without it answers False and callers keep float32 copies."""
    key = str(torch.device(device).type)
    if key not in _FUSED_OK:
        ok = False
        if key == "cuda":
            try:
                a = torch.ones(2, 8, dtype=torch.bfloat16, device=device)
                ok = bool(torch.mm(a, a.T, out_dtype=torch.float32).dtype == torch.float32)
            except (RuntimeError, TypeError, NotImplementedError):
                ok = False
        _FUSED_OK[key] = ok
    return _FUSED_OK[key]


def _split(x: torch.Tensor, low: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A matrix as (its rounding to ``low``, the remainder in ``low``), or (it, None) when it is ``low``."""
    if x.dtype == low:
        return x, None
    hi = x.to(low)
    return hi, (x - hi.to(x.dtype)).to(low)


def wide_mm(a: torch.Tensor, b: torch.Tensor, low: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """(n, k) @ (k, m) -> float32 from GEMMs of ``low`` (bf16 / fp16, the weights' dtype) operands with a
    float32 result (fused_wide_matmul). An operand wider than ``low`` (float32 probabilities, a noised
    float32 hidden state, a float32 gradient) is split into its rounding to ``low`` plus the remainder: the
    result carries ~16 bits of its mantissa instead of 8, each product exact and summed in float32. A wide
    ``a`` and its remainder share one GEMM (the decode step's mixture: one launch); a wide ``b`` adds one;
    the remainder x remainder product (~2^-16 of the result) is left out."""
    a_hi, a_lo = _split(a, low)
    b_hi, b_lo = _split(b, low)
    if a_lo is None:
        out = torch.mm(a_hi, b_hi, out_dtype=torch.float32)
    else:
        both = torch.mm(torch.cat((a_hi, a_lo)), b_hi, out_dtype=torch.float32)  # (2n, m)
        out = both[: a.shape[0]] + both[a.shape[0]:]
    if b_lo is not None:
        out = out + torch.mm(a_hi, b_lo, out_dtype=torch.float32)
    return out


class WideMatmul(torch.autograd.Function):
    """a @ b with a float32 result from bf16 GEMMs, forward and backward (wide_mm), for the update pass's
    output head and soft mixture: the bf16 W and E are read as they are, with no float32 copy of a
    128k x 3k matrix and its gradient (1.5 GB each), and the GEMMs run at bf16's rate, not float32's.
    ``b`` is the weight (bf16 / fp16: the GEMMs' operand dtype). Each gradient comes back in its operand's
    dtype. Without autograd (decoding, Float32Head) it is wide_mm."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        return wide_mm(a, b, b.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        a, b = ctx.saved_tensors
        grad_a = wide_mm(grad, b.T, b.dtype).to(a.dtype) if ctx.needs_input_grad[0] else None
        grad_b = wide_mm(a.T, grad, b.dtype).to(b.dtype) if ctx.needs_input_grad[1] else None
        return grad_a, grad_b


def head_weights(model, vocab_rows: int | None, with_input: bool):
    """(fused, W, E) of a float32-result head: the bf16 W[:rows] and E[:rows] as they are where the device
    has the fused bf16 -> float32 GEMM, else their float32 copies (float32_weights)."""
    W = model.get_output_embeddings().weight
    rows = vocab_rows or W.shape[0]
    if W.dtype in (torch.bfloat16, torch.float16) and fused_wide_matmul(W.device):
        E = model.get_input_embeddings().weight if with_input else None
        return True, W[:rows], (None if E is None else E[:rows])
    return (False, *float32_weights(model, vocab_rows, with_input))


class ReplayHead:
    """The output projection and the soft mixture of the update pass, with autograd and float32 results.

    Where the device has the fused bf16 -> float32 GEMM (CUDA) and the weights are bf16, the bf16 W and E
    are used as they are through WideMatmul; elsewhere (CPU, float32 models) float32 copies, as
    ``float32_weights`` makes them (the CPU's numbers are unchanged). ``tensors`` are what a checkpointed
    chunk of the update receives (torch.utils.checkpoint passes tensors)."""

    def __init__(self, model, vocab_rows: int | None = None, with_input: bool = False):
        self.fused, self.W, self.E = head_weights(model, vocab_rows, with_input)

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.W, self.E


def head_logits(hidden: torch.Tensor, W: torch.Tensor, fused: bool) -> torch.Tensor:
    """(..., d) -> (..., V) float32 logits (head_weights' W): of the update pass (ReplayHead) and of
    decoding (Float32Head). A float32 hidden state (noised, hidden placement) keeps ~16 bits (wide_mm)."""
    if fused:
        flat = hidden.reshape(-1, hidden.shape[-1])
        return WideMatmul.apply(flat, W.T).view(*hidden.shape[:-1], -1)
    return hidden.to(W.dtype) @ W.T


def head_mixture(probs: torch.Tensor, E: torch.Tensor, fused: bool) -> torch.Tensor:
    """(..., V) float32 weights -> (..., d) float32 p @ E (head_weights' E), of the update pass and of decoding."""
    if fused:
        flat = probs.reshape(-1, probs.shape[-1])
        return WideMatmul.apply(flat, E).view(*probs.shape[:-1], -1)
    return probs.to(E.dtype) @ E


class Float32Head:
    """The output projection and the soft mixture with float32 results, for decoding (no autograd).

    ``logits(hidden)`` = hidden @ W[:rows].T and ``mixture(p)`` = p @ E[:rows], both float32.
    Where the device has a fused bf16 -> float32 GEMM (CUDA), they read the bf16 W and E as they
    are: no float32 copy of a 128k x 3k matrix (1.5 GB, read at every decode step at twice the
    bytes). Elsewhere (CPU, float32 models) W and E are widened once, as ``float32_weights`` does;
    the CPU's numbers are unchanged by this class."""

    def __init__(self, model, vocab_rows: int | None = None, with_input: bool = False):
        self.fused, self.W, self.E = head_weights(model, vocab_rows, with_input)
        self.dtype = torch.float32 if self.fused else self.W.dtype  # of the results

    @property
    def path(self) -> str:
        return "fused bf16 GEMM, float32 output" if self.fused else f"{self.W.dtype} copies of W and E"

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., d) -> (..., V) float32 logits."""
        return head_logits(hidden, self.W, self.fused)

    def mixture(self, probs: torch.Tensor) -> torch.Tensor:
        """(N, V) float32 weights -> (N, d) float32 p @ E."""
        return head_mixture(probs, self.E, self.fused)
