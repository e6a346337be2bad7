"""RLOO (Appendix A) and the Gaussian log-density of noisy soft inputs (Section 3).

The per-sequence log-probability of a rollout is a sum over its sampled steps:
- a hard CoT token or an answer token: log softmax(logits / tau)[token]
- a soft / fuzzy CoT input h~_t = h0_t + sigma eps_t: log N(h~_t; h0_t, sigma^2 I) =
  -||h~_t - h0_t||^2 / (2 sigma^2) + cst, with h0_t = softmax(logits_{t-1} / tau) @ E (Section 3).
Prefill tokens are forced, not sampled, so they carry no term.

Every noise placement (engine.settings.Placement; docs/ablations.md, "Noise placements") puts the
Gaussian on a quantity m_t: the mixture h0 (the paper's, on the input embedding), the final hidden
state (m = h_t, d dims), the logits (m = W h_t, V dims) or the top-k logits (the rollout's k ids
gathered from W h_t, k dims). The noise eps_t is counter noise of (row seed, CoT step), drawn again
here rather than stored, and the term is taken at the rollout's own noise: the noised value is
sg(m_replay) + sigma eps_t, so the term's value is -||eps||^2 / 2 and its gradient
eps . dm_replay/dtheta / sigma, the score of the rollout's noise (gaussian_score_term). Why not
-||h~ - h0_replay||^2 / (2 sigma^2) with the recorded h~: where the replay rounds differently from
the rollout (bf16; the KV-cache decode and the teacher-forced forward take different paths),
h~ - h0_replay = sigma eps + (h0_rollout - h0_replay), and at a fuzzy step whose argmax flips the
second part is a whole embedding difference E_a - E_b, multiplied through the softmax's Jacobian
(~ p1 p2 / tau, up to 2,500 at tau = 1e-4) into a large, biased term the paper's estimator does not
have. In float32 the two are the same to rounding (docs/findings.md, "The flip term"). What the
noised value fed next is a recorded constant, as every input is; the distance between the
rollout's h0 (the recorded h~ less sigma eps) and the replay's is the replay check (h0_gap).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

from softtokens.model.cpu_bf16 import recompute_as_forward
from softtokens.train.config import logit_chunk_steps

# a CoT step is a near tie when its mixture's second weight is at least this share of its first:
# top-two logits within tau ln(100) ~ 4.6 tau (docs/findings.md, "Why fuzzy training spikes")
TIE_RATIO = 1e-2


def _float(t: torch.Tensor) -> torch.Tensor:
    """At least float32 (bf16 logits are upcast; float64 stays float64 for gradient checks)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A_{b,g} = r_{b,g} - mean_{j != g} r_{b,j} (Appendix A). rewards: (B, G) -> (B, G)."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be (B, G) with G >= 2, got {tuple(rewards.shape)}")
    g = rewards.shape[1]
    loo_mean = (rewards.sum(dim=1, keepdim=True) - rewards) / (g - 1)
    return rewards - loo_mean


def gaussian_log_prob(noisy: torch.Tensor, mean: torch.Tensor, sigma: float) -> torch.Tensor:
    """log N(noisy; mean, sigma^2 I) without its constant: -||noisy - mean||^2 / (2 sigma^2),
    summed over the last dimension (Section 3, 'Since the noise is Gaussian')."""
    if sigma <= 0:
        raise ValueError("the Gaussian log-density needs sigma > 0 (a noiseless soft CoT is not a policy)")
    diff = _float(noisy) - _float(mean)
    return -(diff * diff).sum(-1) / (2.0 * sigma * sigma)


def token_log_prob(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log softmax(logits / tau)[token], in float32. logits: (..., V), tokens: (...)."""
    scaled = _float(logits) / (temperature if temperature > 0 else 1.0)
    return torch.log_softmax(scaled, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def rloo_loss(seq_log_probs: torch.Tensor, advantages: torch.Tensor, total_rows: int) -> torch.Tensor:
    """-(1/BG) sum_{b,g} sg(A_{b,g}) * l_{b,g} (Appendix A). Dividing by the whole batch size,
    not the micro-batch's, makes gradients accumulated over micro-batches equal the full loss's."""
    return -(advantages.detach() * seq_log_probs).sum() / total_rows


# The update pass's diagnostics of a batch (docs/engine.md, "Replay consistency"): sums over its CoT steps, but
# for the two maxima. They stay on the device as one vector, read once per update (train.update), never per
# micro-batch or chunk: a read is a host sync, and 29 of them a micro-batch cost the H100 update its pace.
REPLAY_STATS = ("h0_gap_sum",          # sum over h0_gap_steps of ||h0_rollout - h0_replay||^2 / (d sigma^2)
                "argmax_mismatches",   # CoT steps whose rollout argmax token the replay puts > logit_tolerance below its top
                "cot_steps",           # CoT steps in the batch
                "near_ties",           # embedding-noise CoT steps whose mixture's 2nd weight is >= TIE_RATIO x its 1st
                "argmax_flips",        # CoT steps whose replayed argmax differs from the rollout's at all (near ties too)
                "h0_gap_steps",        # embedding-noise CoT steps whose replayed argmax is the rollout's
                "h0_gap_flipped_sum",  # the same distance summed over the CoT steps whose argmax flipped
                "jacobian_max",        # the largest p_(1) p_(2) / tau over near ties: the softmax Jacobian's top-two scale
                "flip_gap_max")        # the largest (replay's top logit - its logit of the rollout's argmax) over flips
REPLAY_MAXIMA = ("jacobian_max", "flip_gap_max")
_COUNTS = ("argmax_mismatches", "cot_steps", "near_ties", "argmax_flips", "h0_gap_steps")


class Replay(NamedTuple):
    """The update pass's log-probabilities of a rollout batch and how well the replay matched the
    rollout: ``stats`` (REPLAY_STATS, float64, on the device), each readable by name (a read syncs)."""

    cot: torch.Tensor           # (N,) CoT log-prob, with gradients
    answer: torch.Tensor        # (N,) answer log-prob, with gradients
    stats: torch.Tensor         # (len(REPLAY_STATS),) the diagnostics, without gradients
    # with row_weights: sum_r w_r (cot_r + answer_r), whose gradients were made in the forward (cot and answer
    # then carry none; train.head_loss)
    loss: torch.Tensor | None = None

    def __getattr__(self, name: str):
        if name in REPLAY_STATS:
            value = float(self.stats[REPLAY_STATS.index(name)])
            return int(value) if name in _COUNTS else value
        raise AttributeError(name)


def rollout_log_probs(model, rollout, sigma: float, answer_temperature: float,
                      vocab_rows: int | None = None, gaussian_scale: float = 1.0, logit_tolerance: float = 0.0,
                      row_weights: torch.Tensor | None = None) -> Replay:
    """Per-row (CoT log-prob, answer log-prob) of a recorded rollout, with gradients.

    One teacher-forced forward over [prompt | recorded step inputs]: hard and prefill/answer
    steps are re-embedded from their token ids (so E gets its usual gradient), continuous CoT
    steps use the recorded noisy inputs h~ as constants (fed in the model's compute dtype, as
    the rollout fed them). Hidden states before step s give the distribution that produced step
    s: logits in float32 (model.head), a token log-prob for hard CoT and answer steps,
    the Gaussian log-density of the float32 h~_s around h0_s = softmax(logits / tau) @ E (float32)
    for soft / fuzzy CoT steps. ``gaussian_scale`` multiplies the Gaussian terms (1 = the paper's
    REINFORCE loss; 1/d weighs them per dimension, see docs/engine.md). A CoT step's argmax counts as a
    mismatch when the replay's logit of the rollout's argmax token is more than ``logit_tolerance``
    below the replay's top logit: bf16 forwards flip near ties (docs/gpu.md), a broken replay puts
    the rollout's token nats below.

    With ``row_weights`` (N,) w, the Replay also holds the loss sum_r w_r (cot_r + answer_r) (w = -A / BG:
    the RLOO loss, rloo_loss), and the head's part of its gradient is made in the forward, chunk by chunk,
    with the head's and mixture's weight gradients summed once in float32 (train.head_loss): no second head
    pass in the backward; cot and answer are then values without gradients.

    Every weight is read inside this call, so it can run as the forward of a sharded (FSDP)
    module whose parameters are gathered for exactly that forward."""
    from softtokens.engine.rollout import ANSWER, COT
    from softtokens.engine.settings import CONTINUOUS_MODES
    from softtokens.model.head import ReplayHead

    setting = rollout.setting
    n, steps = rollout.step_ids.shape
    is_cot = rollout.step_phase == COT
    is_answer = rollout.step_phase == ANSWER
    continuous = setting.mode in CONTINUOUS_MODES
    if continuous and rollout.row_keys is None:
        raise ValueError("a soft / fuzzy rollout without row_keys: its noise (keyed by each row's seed) cannot be "
                         "drawn again, so its Gaussian term cannot be taken at the rollout's noise")
    h = step_hidden(model, rollout)  # h[:, s] produced step s
    # float32 logits and mixtures: bf16 GEMMs with float32 results where the device has them, else float32
    # copies of W and E (one copy when E is tied to W)
    head = ReplayHead(model, vocab_rows, with_input=continuous)
    W32, E32 = head.tensors
    # The (N, S, V) float32 logits never exist at once: each chunk of steps computes its terms and,
    # under autograd, is recomputed in the backward pass (docs/engine.md, "Rollout engine"). A rollout that
    # fits one chunk keeps it for the backward instead: the same peak, no recomputation.
    chunk = logit_chunk_steps(n)
    recompute = torch.is_grad_enabled() and steps > chunk
    chunks = []
    for lo in range(0, steps, chunk):
        hi = min(lo + chunk, steps)
        args = (h[:, lo:hi], W32, E32, rollout.step_ids[:, lo:hi], is_cot[:, lo:hi], is_answer[:, lo:hi],
                None if not continuous else rollout.noisy_inputs[:, lo:hi],
                None if rollout.argmax_ids is None else rollout.argmax_ids[:, lo:hi],
                None if rollout.topk_ids is None else rollout.topk_ids[:, lo:hi],
                None if rollout.row_keys is None else rollout.row_keys.to(h.device))
        kw = dict(setting=setting, sigma=sigma, answer_temperature=answer_temperature, gaussian_scale=gaussian_scale,
                  placement=rollout.placement if continuous else None, first_step=lo, logit_tolerance=logit_tolerance,
                  fused=head.fused)
        chunks.append((lo, hi, args, kw))
    loss = None
    if row_weights is not None:  # the loss with its gradients made chunk by chunk (train.head_loss)
        from softtokens.train.head_loss import fused_replay_loss

        loss, parts = fused_replay_loss(h, W32, E32, row_weights, chunks, logit_terms)
    elif recompute:
        parts = [checkpoint(_chunk_terms, *args, use_reentrant=False, context_fn=recompute_as_forward, **kw)
                 for _, _, args, kw in chunks]
    else:
        parts = [_chunk_terms(*args, **kw) for _, _, args, kw in chunks]
    cot_lp = sum(p[0] for p in parts)
    answer_lp = sum(p[1] for p in parts)
    embedding_noise = continuous and rollout.placement.where == "embedding"
    per_dim = 1.0 / (h.shape[-1] * sigma * sigma) if embedding_noise else 0.0  # ||.||^2 / (d sigma^2)
    checked = rollout.argmax_ids is not None
    zero = h.new_zeros((), dtype=torch.float64)

    def total(i: int, keep: bool = True) -> torch.Tensor:
        return torch.stack([p[i].detach().double() for p in parts]).sum() if keep else zero

    def peak(i: int, keep: bool = True) -> torch.Tensor:
        return torch.stack([p[i].detach().double() for p in parts]).max() if keep else zero

    stats = {"h0_gap_sum": total(2) * per_dim, "argmax_mismatches": total(3, checked),
             "cot_steps": is_cot.sum().double(), "near_ties": total(4, embedding_noise),
             "argmax_flips": total(6, checked), "h0_gap_steps": total(8, embedding_noise),
             "h0_gap_flipped_sum": total(9) * per_dim, "jacobian_max": peak(5, embedding_noise),
             "flip_gap_max": peak(7, checked)}
    return Replay(cot_lp, answer_lp, torch.stack([stats[k] for k in REPLAY_STATS]), loss)


def step_hidden(model, rollout) -> torch.Tensor:
    """(N, S, d) final hidden states of a teacher-forced forward over [prompt | recorded step
    inputs]: entry s is the state whose logits chose step s. Hard, prefill and answer steps are
    re-embedded from their token ids (so E gets its usual gradient); continuous CoT steps feed the
    recorded noisy inputs h~ as constants, in the model's compute dtype, as the rollout fed them."""
    from softtokens.engine.kvcache import prefill_mask
    from softtokens.engine.rollout import COT
    from softtokens.engine.settings import CONTINUOUS_MODES
    from softtokens.model.head import decoder_hidden

    emb = model.get_input_embeddings()
    steps = rollout.step_ids.shape[1]
    x_steps = emb(rollout.step_ids)
    if rollout.setting.mode in CONTINUOUS_MODES:
        is_cot = (rollout.step_phase == COT).unsqueeze(-1)
        x_steps = torch.where(is_cot, rollout.noisy_inputs.to(x_steps.dtype), x_steps)
    x = torch.cat([emb(rollout.prompt_ids), x_steps], dim=1)
    mask = torch.cat([rollout.prompt_mask, torch.ones_like(rollout.step_ids)], dim=1)
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    # the causal mask with the prompts' padding, made here on the device: given a 2-D mask, transformers
    # asks whether every entry is 1 (a host sync per micro-batch) before making the same one
    hidden = decoder_hidden(model, inputs_embeds=x, attention_mask=prefill_mask(mask, x.dtype), position_ids=pos)
    return hidden[:, -(steps + 1):-1]


def gaussian_score_term(mean: torch.Tensor, eps: torch.Tensor, sigma: float) -> torch.Tensor:
    """The Gaussian term at the rollout's own noise (module docstring): log N(sg(m) + sigma eps; m, sigma^2 I)
    without its constant. Its value is -||eps||^2 / 2 whatever m is, and its gradient eps . dm/dtheta /
    sigma: the REINFORCE score of an input drawn as m + sigma eps (Section 3)."""
    return gaussian_log_prob(mean.detach() + sigma * eps, mean, sigma)


def embedding_gaussian_term(noisy: torch.Tensor, h0: torch.Tensor, eps: torch.Tensor, sigma: float) -> torch.Tensor:
    """(N, C) the Gaussian term of embedding-noise CoT steps: the score of the rollout's own noise eps
    around the replay's h0 (gaussian_score_term). The recorded input ``noisy`` is h0_rollout + sigma eps;
    it is not in the term (only in the replay check), which is what keeps a bf16 flip out of the
    gradient. analysis/flip_term.py puts the recorded-input form here to measure what it cost."""
    return gaussian_score_term(h0, eps, sigma)


def rollout_noise(row_keys: torch.Tensor, first_step: int, steps: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """(N, C, dim) the rollout's Gaussian draws at CoT steps first_step.. (a row's CoT steps are its first
    steps, so a step's column is its CoT index): the counter noise the engine drew (engine.noise)."""
    from softtokens.engine.noise import counter_normal

    n = row_keys.shape[0]
    cols = torch.arange(first_step, first_step + steps, device=row_keys.device).expand(n, steps)
    return counter_normal(row_keys.unsqueeze(1).expand(n, steps), cols, dim).to(dtype)


def placement_gaussian(h, logits, placement, sigma: float, row_keys, topk_ids, first_step: int) -> torch.Tensor:
    """(N, C) Gaussian term of the CoT steps first_step.. of a chunk under a hidden or logits placement
    (module docstring): at the rollout's noise, around the replay's m. Steps that are not CoT steps are
    masked by the caller."""
    if placement.where == "hidden":
        mean = _float(h)
    elif placement.top_k:
        mean = logits.gather(-1, topk_ids)
    else:
        mean = logits
    eps = rollout_noise(row_keys, first_step, h.shape[1], mean.shape[-1], mean.dtype)
    return gaussian_score_term(mean, eps, sigma)


def _chunk_terms(h, W32, E32, step_ids, is_cot, is_answer, noisy, argmax_ids, topk_ids, row_keys, *, setting, sigma,
                 answer_temperature, gaussian_scale, placement, first_step, logit_tolerance=0.0, fused=False):
    """(CoT log-prob, answer log-prob, sum of ||h0_rollout - h0_replay||^2 over the CoT steps whose
    replayed argmax is the rollout's, argmax mismatches, near ties, largest softmax-Jacobian scale,
    argmax flips, largest flip gap, those steps' count, the same distance summed over flipped steps)
    of a chunk of steps; the distances, near ties and Jacobian scale only under embedding noise. The
    rollout's h0 is the recorded h~ less sigma eps: apart from where a bf16 replay rounds otherwise,
    it is the replay's; at a flip h0 moves to another token's embedding (a fuzzy flip: ~2 / gamma^2 =
    18 per dimension and sigma^2), which is bf16 meeting a near tie, counted by the flips, not a sign
    of a broken replay."""
    from softtokens.model.head import head_logits

    logits = head_logits(h, W32, fused)  # float32 (model.head.ReplayHead)
    return logit_terms(logits, h, E32, step_ids, is_cot, is_answer, noisy, argmax_ids, topk_ids, row_keys,
                       setting=setting, sigma=sigma, answer_temperature=answer_temperature,
                       gaussian_scale=gaussian_scale, placement=placement, first_step=first_step,
                       logit_tolerance=logit_tolerance, fused=fused)[:10]


def logit_terms(logits, h, E32, step_ids, is_cot, is_answer, noisy, argmax_ids, topk_ids, row_keys, *, setting, sigma,
                answer_temperature, gaussian_scale, placement, first_step, logit_tolerance=0.0, fused=False):
    """_chunk_terms from a chunk's float32 logits, and last the mixture's (probabilities, h0) (None but under
    embedding noise): what train.head_loss differentiates by the logits and h0 in its forward."""
    from softtokens.engine.settings import CONTINUOUS_MODES
    from softtokens.model.head import head_mixture

    mixture = None
    mismatches = flips = gap_max = logits.new_zeros(())
    flipped = torch.zeros_like(is_cot)
    if argmax_ids is not None:
        z = logits.detach()
        top = z.max(-1)
        gap = top.values - z.gather(-1, argmax_ids.unsqueeze(-1)).squeeze(-1)  # >= 0; 0 where they agree
        flipped = is_cot & (top.indices != argmax_ids)
        flips = flipped.sum()
        mismatches = (flipped & (gap > logit_tolerance)).sum()
        gap_max = torch.where(flipped, gap, 0.0).max()
    agree = is_cot & ~flipped
    answer_terms = token_log_prob(logits, step_ids, answer_temperature)
    answer_lp = torch.where(is_answer, answer_terms, 0.0).sum(-1)
    gap_sum = gap_flipped = logits.new_zeros(())
    ties = jacobian_max = logits.new_zeros(())
    if setting.mode in CONTINUOUS_MODES and placement.where != "embedding":
        gauss = placement_gaussian(h, logits, placement, sigma, row_keys, topk_ids, first_step)
        cot_terms = gaussian_scale * gauss
    elif setting.mode in CONTINUOUS_MODES:
        probs = torch.softmax(_float(logits) / setting.temperature, dim=-1)
        h0 = head_mixture(probs, E32, fused)  # the replay's h0 = softmax(logits / tau) @ E
        mixture = (probs, h0)
        eps = rollout_noise(row_keys, first_step, h.shape[1], h0.shape[-1], h0.dtype)
        cot_terms = gaussian_scale * embedding_gaussian_term(noisy, h0, eps, sigma)
        # the replay check: the rollout's h0 (what it fed, less its noise) against the replay's
        gap = (_float(noisy) - sigma * eps - h0.detach()).pow(2).sum(-1)
        gap_sum = torch.where(agree, gap, 0.0).sum()
        gap_flipped = torch.where(flipped, gap, 0.0).sum()
        # d h0 / d logits = (diag p - p p^T) E / tau: near a tie of the top two weights it is ~ p1 p2 / tau
        # (2500 at tau = 1e-4), elsewhere ~ 0 at a fuzzy temperature; a diagnostic, without gradients
        top2 = probs.detach().topk(2, dim=-1).values
        ties = (is_cot & (top2[..., 1] >= TIE_RATIO * top2[..., 0])).sum()
        jacobian_max = torch.where(is_cot, top2[..., 0] * top2[..., 1], 0.0).max() / setting.temperature
    elif setting.temperature == answer_temperature:
        cot_terms = answer_terms  # same distribution: one log-softmax, not two
    else:
        cot_terms = token_log_prob(logits, step_ids, setting.temperature)
    cot_lp = torch.where(is_cot, cot_terms, 0.0).sum(-1)
    return cot_lp, answer_lp, gap_sum, mismatches, ties, jacobian_max, flips, gap_max, agree.sum(), gap_flipped, mixture
