"""The update pass of one RLOO step: the loss of this process's rollouts, micro-batch by
micro-batch, into the gradients, and the checks that the pass scored the rollouts it was given
(the replay of a soft / fuzzy rollout must reproduce its inputs, or the gradient is not the
policy gradient of those rollouts; docs/engine.md, "Replay consistency")."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from softtokens.train.rloo import REPLAY_MAXIMA, REPLAY_STATS


class ReplayMismatch(RuntimeError):
    """The update pass does not see the rollout it is meant to score."""


class NonFiniteUpdate(RuntimeError):
    """A step's loss or gradient is NaN or infinite: the update is not applied."""


@dataclass
class UpdateSums:
    """What the update pass measured, summed over micro-batches (and processes): read once per update."""

    loss: float = 0.0
    cot_lp: float = 0.0
    answer_lp: float = 0.0
    h0_gap: float = 0.0
    h0_gap_steps: float = 0.0
    h0_gap_flipped: float = 0.0
    mismatches: float = 0.0
    cot_steps: float = 0.0
    near_ties: float = 0.0
    flips: float = 0.0
    jacobian_max: float = 0.0
    flip_gap_max: float = 0.0


# UpdateSums' fields from the replay's (rloo.REPLAY_STATS), and the loss terms summed beside them
_FROM_REPLAY = {"h0_gap_sum": "h0_gap", "argmax_mismatches": "mismatches", "cot_steps": "cot_steps",
                "near_ties": "near_ties", "argmax_flips": "flips", "h0_gap_steps": "h0_gap_steps",
                "h0_gap_flipped_sum": "h0_gap_flipped", "jacobian_max": "jacobian_max", "flip_gap_max": "flip_gap_max"}
_LOSS_TERMS = ("loss", "cot_lp", "answer_lp")


class DeviceSums:
    """The sums while the update pass runs: one float64 vector on the device, added to per micro-batch
    and read once (``over``), so the pass never waits on the host (docs/gpu.md, "Host syncs")."""

    def __init__(self):
        self.summed: torch.Tensor | None = None   # _LOSS_TERMS, then REPLAY_STATS but the maxima
        self.maxima: torch.Tensor | None = None   # REPLAY_MAXIMA

    def add(self, loss: torch.Tensor, replay) -> None:
        summed_stats = [i for i, k in enumerate(REPLAY_STATS) if k not in REPLAY_MAXIMA]
        maxima = [REPLAY_STATS.index(k) for k in REPLAY_MAXIMA]
        terms = torch.stack([loss.detach(), replay.cot.detach().sum(), replay.answer.detach().sum()]).double()
        summed = torch.cat([terms, replay.stats[summed_stats]])
        peak = replay.stats[maxima]
        self.summed = summed if self.summed is None else self.summed + summed
        self.maxima = peak if self.maxima is None else torch.maximum(self.maxima, peak)

    def over(self, dp) -> UpdateSums:
        """Every process's sums together (``dp``: train.distributed.DataParallel), read to the host once."""
        if self.summed is None:
            return UpdateSums()
        values = torch.cat([dp.sum_tensor(self.summed), dp.max_tensor(self.maxima)]).tolist()
        names = [*_LOSS_TERMS, *(_FROM_REPLAY[k] for k in REPLAY_STATS if k not in REPLAY_MAXIMA),
                 *(_FROM_REPLAY[k] for k in REPLAY_MAXIMA)]
        return UpdateSums(**dict(zip(names, values)))


def accumulate_gradients(policy, rollout, adv: torch.Tensor, rows: int, cfg, sigma: float, vocab_rows: int,
                         gaussian_scale: float) -> DeviceSums:
    """The RLOO loss of this process's rows, -(1/rows) sum_r A_r (cot_r + answer_r) with ``rows`` the global
    row count (rloo.rloo_loss), into the gradients; FSDP reduce-scatters in float32 into the float32 gradient
    shards. The sums stay on the device (``.over(dp)`` reads them once)."""
    policy.train()
    sums = DeviceSums()
    for start in range(0, len(adv), cfg.micro_batch_size):
        idx = slice(start, min(len(adv), start + cfg.micro_batch_size))
        # the RLOO loss's weights go into the forward: the head's gradients are made there (train.head_loss)
        weights = -adv[idx].detach() / rows
        replay = policy(rollout.rows(idx), sigma, cfg.answer_temperature, vocab_rows, gaussian_scale,
                        cfg.replay_logit_tolerance, weights)
        loss = replay.loss
        loss.backward()
        sums.add(loss, replay)
    return sums


def check_replay(cfg, step: int, sums: UpdateSums) -> dict:
    """How far the teacher-forced replay is from the cached rollout it scores: the distance between
    the rollout's h0 (its recorded input less its noise) and the replay's, ||h0_rollout - h0_replay||^2
    / (d sigma^2), averaged over the embedding-noise CoT steps whose replayed argmax is the rollout's
    (0 when the replay reproduces the rollout; bf16 rounding leaves a little) and, apart, over the
    steps whose argmax flipped (a near tie bf16 rounded the other way: ~2 / gamma^2 each); the share
    of CoT steps whose argmax flipped, and of those whose rollout token the replay puts more than
    replay_logit_tolerance below its top (a mismatch). A step past the bounds is not applied."""
    gap = sums.h0_gap / sums.h0_gap_steps if sums.h0_gap_steps else None
    flips = sums.flips / sums.cot_steps if sums.cot_steps else 0.0
    mismatch = sums.mismatches / sums.cot_steps if sums.cot_steps else 0.0
    problems = []
    if gap is not None and gap > cfg.replay_h0_gap_max:
        problems.append(f"replay h0 gap {gap:.4f} > replay_h0_gap_max {cfg.replay_h0_gap_max} (the mean over CoT steps "
                        f"that did not flip of ||h0_rollout - h0_replay||^2 / (d sigma^2))")
    if mismatch > cfg.replay_argmax_mismatch_max:
        problems.append(f"argmax mismatch (the rollout's token > {cfg.replay_logit_tolerance} nats below the "
                        f"replay's top) {mismatch:.2%} of CoT steps > replay_argmax_mismatch_max "
                        f"{cfg.replay_argmax_mismatch_max:.2%}")
    if problems:
        raise ReplayMismatch(
            f"step {step + 1}: the update pass does not reproduce the rollout it scores ({'; '.join(problems)}; "
            f"compute_dtype {cfg.compute_dtype}, {int(sums.cot_steps)} CoT steps). The gradient would not be the "
            "policy gradient of the rollouts: the step was not applied. See docs/engine.md, 'Replay consistency'.")
    at_flips = sums.h0_gap_flipped / sums.flips if gap is not None and sums.flips else None
    return {"replay_h0_gap": gap, "replay_h0_gap_flipped": at_flips,
            "replay_argmax_mismatch": mismatch, "replay_argmax_flips": flips,  # near ties included
            "replay_flip_gap_max": sums.flip_gap_max}
