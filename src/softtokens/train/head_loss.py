"""The update pass's output head and soft mixture as one autograd step: each chunk of steps makes its
float32 logits, its loss terms and their gradients in the forward, and the head's and mixture's weight
gradients are summed over the chunks in one float32 matrix each, handed to autograd once per micro-batch.

Why: the plain path (train.rloo, a checkpoint per chunk) runs the head twice, once in the forward and once
again in the backward to rebuild what it freed, and hands autograd a (V x d) weight gradient per chunk: on
the paper's shapes a 128k x 3k float32 matrix, made and added 1-2 times per micro-batch for W and again
for E under soft / fuzzy tokens (issue 44: ~12.6 + 19 GB of memory traffic a chunk). Here the loss's
weights are known before the forward (w_r = -A_r / BG: the RLOO loss is linear in each row's log-prob,
Appendix A), so, as Liger-Kernel's fused linear cross-entropy does, a chunk's gradients are taken as soon
as its logits exist: the head runs once, and what the backward receives is the gradient itself.

The terms are the plain path's own function (rloo.logit_terms), differentiated by local autograd with
respect to the chunk's logits, its hidden states (the hidden-noise placement) and h0 (the mixture): the
same arithmetic, so the values are the plain path's and the gradients equal its to rounding
(tests/test_head_loss.py). The GEMMs that carry them back to h, W and E are those WideMatmul's backward
runs (bf16 operands, float32 results, on CUDA), or float32 (float64) products of the copies elsewhere.
"""

from __future__ import annotations

import torch

from softtokens.model.head import head_logits, wide_mm
from softtokens.train.config import HEAD_TILE_ROWS


def fused_replay_loss(h: torch.Tensor, W: torch.Tensor, E: torch.Tensor | None, row_weights: torch.Tensor,
                      chunks: list, terms) -> tuple[torch.Tensor, list[tuple]]:
    """(loss, parts): loss = sum_r w_r (cot_r + answer_r), differentiable in h, W and E, and per chunk the
    values rloo._chunk_terms returns (without gradients). ``W``, ``E``: model.head.ReplayHead's tensors (E
    None without a mixture, or W itself when tied); ``chunks``: (lo, hi, args, kw) of rloo.rollout_log_probs;
    ``terms``: rloo.logit_terms (passed, not imported: rloo calls this module)."""
    parts: list[tuple] = []
    mix_on_w = E is W
    loss = FusedReplayLoss.apply(h, W, None if mix_on_w else E, row_weights.detach(), chunks, mix_on_w, parts, terms)
    return loss, parts


def _matmul(a: torch.Tensor, b: torch.Tensor, low: torch.dtype, fused: bool) -> torch.Tensor:
    """a @ b with a float32 (float64) result: bf16 GEMMs with float32 outputs where fused, else plain."""
    if fused:
        return wide_mm(a, b, low)
    wide = torch.promote_types(b.dtype, torch.float32)
    return a.to(wide) @ b.to(wide)


def _accumulate(out: torch.Tensor, a_t: torch.Tensor, b: torch.Tensor, low: torch.dtype, fused: bool) -> None:
    """out += a_t @ b, HEAD_TILE_ROWS of out's rows at a time (a_t: the transposed (V x n) operand; why:
    train.config.HEAD_TILE_ROWS)."""
    for lo in range(0, out.shape[0], HEAD_TILE_ROWS):
        hi = min(lo + HEAD_TILE_ROWS, out.shape[0])
        out[lo:hi] += _matmul(a_t[lo:hi], b, low, fused)


class FusedReplayLoss(torch.autograd.Function):
    """forward(h, W, E, w, chunks, mix_on_w, parts, terms) -> the weighted loss; its gradients are made in the
    forward and scaled by the incoming one in the backward (module docstring)."""

    @staticmethod
    def forward(ctx, h, W, E, weights, chunks, mix_on_w, parts, logit_terms):
        fused = bool(chunks[0][3]["fused"]) if chunks else False
        wide = torch.promote_types(W.dtype, torch.float32)
        need_h, need_w, need_e = ctx.needs_input_grad[:3]
        mix = W if mix_on_w else E
        need_mix = need_w if mix_on_w else need_e
        grad_h = torch.zeros(h.shape, dtype=wide, device=h.device) if need_h else None
        grad_w = torch.zeros(W.shape, dtype=wide, device=W.device) if need_w else None
        grad_e = None  # made at the first mixture (a placement other than the embedding's has none)
        loss = torch.zeros((), dtype=wide, device=h.device)
        w_const, mix_const = W.detach(), None if mix is None else mix.detach()
        for lo, hi, args, kw in chunks:
            hc = h[:, lo:hi].detach()
            logits = head_logits(hc, w_const, fused)
            with torch.enable_grad():
                z = logits.requires_grad_()
                h_leaf = hc.requires_grad_()
                terms = logit_terms(z, h_leaf, mix_const, *args[3:], **kw)
                chunk_loss = (weights.to(terms[0].dtype) * (terms[0] + terms[1])).sum()
                mixture = terms[10]
                wrt = [z, h_leaf] + ([mixture[1]] if mixture is not None else [])
                grads = torch.autograd.grad(chunk_loss, wrt, allow_unused=True) if chunk_loss.requires_grad \
                    else [None] * len(wrt)
            parts.append(tuple(t.detach() for t in terms[:10]))
            loss += chunk_loss.detach()
            g_z, g_hidden = grads[0], grads[1]
            if g_z is None:
                del logits, z, h_leaf, terms, mixture, grads
                continue
            flat_z = g_z.reshape(-1, g_z.shape[-1])
            flat_h = hc.detach().reshape(-1, hc.shape[-1])
            if need_h:
                g = _matmul(flat_z, w_const, W.dtype, fused).view(*hc.shape[:-1], -1)
                grad_h[:, lo:hi] += g if g_hidden is None else g + g_hidden.to(wide)
            if need_w:
                _accumulate(grad_w, flat_z.T, flat_h, W.dtype, fused)
            if mixture is not None and need_mix and grads[2] is not None:
                if not mix_on_w and grad_e is None:
                    grad_e = torch.zeros(E.shape, dtype=wide, device=E.device)
                probs, g_h0 = mixture[0].detach(), grads[2]
                _accumulate(grad_w if mix_on_w else grad_e, probs.reshape(-1, probs.shape[-1]).T,
                            g_h0.reshape(-1, g_h0.shape[-1]), mix.dtype, fused)
            # this chunk's logits, terms and gradients go before the next chunk's logits are made
            del logits, z, h_leaf, terms, mixture, grads, g_z, g_hidden, flat_z, flat_h
        ctx.grads = (grad_h, grad_w, grad_e)
        ctx.dtypes = (h.dtype, W.dtype, None if E is None else E.dtype)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grads, ctx.grads = ctx.grads, None  # freed as soon as handed on
        # scaled in place: no second float32 (V x d) matrix beside the sum (a read of grad_loss would sync)
        out = [None if g is None else g.mul_(grad_loss).to(dtype) for g, dtype in zip(grads, ctx.dtypes)]
        return (*out, None, None, None, None, None)
