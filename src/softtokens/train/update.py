"""The update pass of one RLOO step: the loss of this process's rollouts, micro-batch by
micro-batch, into the gradients, and the checks that the pass scored the rollouts it was given
(the replay of a soft / fuzzy rollout must reproduce its inputs, or the gradient is not the
policy gradient of those rollouts; docs/engine.md, "Replay consistency")."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from softtokens.train.rloo import rloo_loss


class ReplayMismatch(RuntimeError):
    """The update pass does not see the rollout it is meant to score."""


class NonFiniteUpdate(RuntimeError):
    """A step's loss or gradient is NaN or infinite: the update is not applied."""


# fields reduced by maximum over processes; every other is summed
_MAX_FIELDS = ("jacobian_max", "flip_gap_max")


@dataclass
class UpdateSums:
    """What the update pass measured, summed over micro-batches (and processes, after ``over``)."""

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

    def add(self, loss: torch.Tensor, replay) -> None:
        self.loss += loss.item()
        self.cot_lp += replay.cot.detach().sum().item()
        self.answer_lp += replay.answer.detach().sum().item()
        self.h0_gap += replay.h0_gap_sum
        self.h0_gap_steps += replay.h0_gap_steps
        self.h0_gap_flipped += replay.h0_gap_flipped_sum
        self.mismatches += replay.argmax_mismatches
        self.cot_steps += replay.cot_steps
        self.near_ties += replay.near_ties
        self.flips += replay.argmax_flips
        self.jacobian_max = max(self.jacobian_max, replay.jacobian_max)
        self.flip_gap_max = max(self.flip_gap_max, replay.flip_gap_max)

    def over(self, dp) -> "UpdateSums":
        """Every process's sums together (``dp``: train.distributed.DataParallel)."""
        summed = [f.name for f in fields(self) if f.name not in _MAX_FIELDS]
        totals = dict(zip(summed, dp.sum([getattr(self, k) for k in summed])))
        totals.update(zip(_MAX_FIELDS, dp.max([getattr(self, k) for k in _MAX_FIELDS])))
        return UpdateSums(**totals)


def accumulate_gradients(policy, rollout, adv: torch.Tensor, rows: int, cfg, sigma: float, vocab_rows: int,
                         gaussian_scale: float) -> UpdateSums:
    """The RLOO loss of this process's rows into the gradients, divided by the global row count
    ``rows``; FSDP reduce-scatters in float32 into the float32 gradient shards."""
    policy.train()
    sums = UpdateSums()
    for start in range(0, len(adv), cfg.micro_batch_size):
        idx = slice(start, min(len(adv), start + cfg.micro_batch_size))
        replay = policy(rollout.rows(idx), sigma, cfg.answer_temperature, vocab_rows, gaussian_scale,
                        cfg.replay_logit_tolerance)
        loss = rloo_loss(replay.cot + replay.answer, adv[idx], rows)
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
