"""What each row is fed at one decode step (Section 3): a hard token, or at a soft / fuzzy CoT
step the mixture p @ E of the (noised) next-token distribution. Kept apart from the state
machine and the recording so that the paper's step reads in one place, with every noise
placement of the ablations next to the paper's."""

from __future__ import annotations

import torch

from softtokens.engine.noise import counter_normal
from softtokens.engine.sampling import probs_at_temperature, sample_tokens
from softtokens.engine.settings import (
    CONTINUOUS_MODES,
    EMBEDDING,
    CotSetting,
    Placement,
)


class StepInputs:
    """Chooses the fed token (and, for continuous CoT steps, the fed mixture) of every row.

    Randomness is the row's own: uniforms drawn at admission from its seed, and every placement's
    Gaussian noise (the embedding's included) as counter noise keyed by that seed and the CoT step
    (noise.py), which the update pass draws again instead of storing it: the Gaussian term of an
    update is the score of the rollout's own noise (train.rloo)."""

    def __init__(self, setting: CotSetting, sigma: float, answer_temperature: float, placement: Placement,
                 head, dim: int):
        self.setting, self.sigma, self.answer_temperature, self.head, self.dim = (
            setting, sigma, answer_temperature, head, dim)
        self.continuous = setting.mode in CONTINUOUS_MODES
        self.placement = placement if self.continuous else EMBEDDING
        self.noisy = self.continuous and sigma > 0
        self.needs_hidden = self.noisy and self.placement.where == "hidden"

    def choose(self, logits: torch.Tensor, argmax: torch.Tensor, is_cot: torch.Tensor, is_ans: torch.Tensor, queued: torch.Tensor,
               u_cot: torch.Tensor, u_ans: torch.Tensor, keys: torch.Tensor, cot_idx: torch.Tensor,
               hidden: torch.Tensor | None):
        """(token, mixture or None, top-k ids or None) per row. ``argmax``: the logits' mode;
        ``queued``: each row's prefill token; ``u_cot`` / ``u_ans`` its uniform for this step; ``keys``
        and ``cot_idx`` its seed and CoT step, which key its noise."""
        setting, t_ans = self.setting, self.answer_temperature
        tok = queued
        if not self.continuous and setting.temperature == t_ans:
            # hard CoT and answer tokens from the same distribution: one draw, each row with its own uniform
            drawn = argmax if t_ans == 0 else sample_tokens(logits, t_ans, torch.where(is_cot, u_cot, u_ans))
            return torch.where(is_cot | is_ans, drawn, tok), None, None
        tok = torch.where(is_ans, argmax if t_ans == 0 else sample_tokens(logits, t_ans, u_ans), tok)
        if not self.continuous:
            cot_tok = argmax if setting.temperature == 0 else sample_tokens(logits, setting.temperature, u_cot)
            return torch.where(is_cot, cot_tok, tok), None, None
        if self.placement.where == "embedding":
            mix = self.head.mixture(probs_at_temperature(logits, setting.temperature))
            if self.noisy:  # h~ = p @ E + sigma eps, eps = counter_normal(seed, CoT step)
                mix = mix + self.sigma * counter_normal(keys, cot_idx, self.dim).to(mix.dtype)
            return torch.where(is_cot, argmax, tok), mix, None
        noised, topk_ids = self.noised_logits(logits, keys, cot_idx, hidden)
        mix = self.head.mixture(probs_at_temperature(noised, setting.temperature))
        # the shadow token: the noised distribution's mode
        return torch.where(is_cot, noised.argmax(-1), tok), mix, topk_ids

    def noised_logits(self, logits: torch.Tensor, keys: torch.Tensor, cot_idx: torch.Tensor,
                      hidden: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The logits a hidden- or logits-placed CoT step mixes (Placement), and the top-k ids
        (top-k placement). The noise of row i at CoT step t is counter_normal(seed_i, t)."""
        where, k = self.placement
        if where == "hidden":
            if not self.noisy:  # W h is the current logits: no second projection
                return logits, None
            return self.head.logits(hidden + self.sigma * counter_normal(keys, cot_idx, self.dim)), None
        if k:
            values, ids = logits.topk(k, dim=-1)
            if self.noisy:
                values = values + self.sigma * counter_normal(keys, cot_idx, k)
            return torch.full_like(logits, float("-inf")).scatter(-1, ids, values), ids
        if self.noisy:
            return logits + self.sigma * counter_normal(keys, cot_idx, logits.shape[-1]), None
        return logits, None
