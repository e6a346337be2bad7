"""The CoT decoding engine: one loop for hard, soft and fuzzy chains of thought.

Each row runs a small state machine, all rows in lockstep, one forward per step:

    COT ──(shadow text ends with "The final answer is:")──► PREFILL " \boxed{" ──► ANSWER ──► DONE
        └─(CoT limit reached)──► PREFILL "The final answer is: \boxed{" ─┘

At a CoT step the next input is, with p = softmax(logits / tau) (tau = 0: argmax):
- hard: the embedding E[x] of x ~ p (the greedy shadow token is x itself);
- soft / fuzzy: h~ = p @ E + sigma * N(0, I) (Section 3), shadow token argmax(logits).
Soft and fuzzy differ only in tau (0.5 vs 0.0001); they are one code path. Answer tokens are
always hard (sampled at the answer temperature, 0 = greedy). Everything fed is recorded, so
the training pass replays exactly the inputs the rollout consumed and never re-samples noise.

Randomness is drawn per row from a generator seeded by that row's seed (a function of run
seed, step, prompt and sample), so a row's result does not depend on what it is batched with.

Stopping rule (Appendix C): the paper stops when the text 'ends with "The final answer is: "'.
BPE tokenizers attach a space to the following word (" \boxed"), so that text is rarely ever
the end of a generated prefix; we stop when the text, trailing whitespace removed, ends with
"The final answer is:", which fires on the paper's condition and one token earlier when the
model writes "is:" without a lone space token. The prefill " \boxed{" then yields exactly
"The final answer is: \boxed{"."""

from __future__ import annotations

import hashlib

import torch


def row_seed(*parts: int) -> int:
    """A stable 63-bit seed for one rollout row from (run seed, step, prompt, sample)."""
    digest = hashlib.sha256(",".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def probs_at_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / tau) in float32, safe for tau = 1e-4 (max-subtracted: no inf, no NaN);
    tau = 0 gives the one-hot of the argmax (the limit by continuity)."""
    logits = logits.float()
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return torch.softmax(logits / temperature, dim=-1)


def sample_tokens(logits: torch.Tensor, temperature: float, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from softmax(logits / tau) with one given uniform per row (tau = 0: argmax)."""
    if temperature == 0:
        return logits.argmax(-1)
    cdf = probs_at_temperature(logits, temperature).cumsum(-1)
    idx = (cdf < uniforms.unsqueeze(-1) * cdf[..., -1:]).sum(-1)
    return idx.clamp(max=logits.shape[-1] - 1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(logits) over the last dimension, computed in float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)
