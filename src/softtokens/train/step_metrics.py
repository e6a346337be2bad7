"""The row a training step adds to ``metrics.jsonl``: the names TRL and verl use where one exists
(``reward``, ``reward_std``, ``frac_reward_zero_std``, ``completions/mean_length``, ``entropy``,
``grad_norm``), summed over every process so the row is the step's, not one GPU's."""

from __future__ import annotations

import math

from softtokens.engine.rollout import DONE


def _bound(b: float) -> float | None:
    return None if math.isinf(b) else b


def step_metrics(step: int, cfg, rollout, graded: list, rewards, sums, replay: dict, clipped, dp, lr: float,
                 seconds: dict[str, float], sigma: float = 0.0, noise_dims: int = 1) -> dict:
    """``sums``: train.update.UpdateSums over every process; ``replay``: train.update.check_replay;
    ``clipped``: train.clipping.Clipped; ``seconds``: rollout, reward and update wall times;
    ``sigma`` and ``noise_dims``: the Gaussian of a CoT step (0 for hard runs)."""
    r = rewards.view(cfg.prompts_per_step, cfg.samples_per_prompt)
    n = r.numel()
    cot_mask = rollout.step_phase == 0
    decoded = (rollout.step_phase != DONE).sum().item()
    (n_correct, n_boxed, n_timeouts, cot_len, n_stopped, ent_sum, ent_count, tokens, update_tokens) = dp.sum([
        sum(g.correct for g in graded), sum(g.boxed for g in graded), sum(g.timed_out for g in graded),
        rollout.cot_len.float().sum().item(), rollout.stopped.float().sum().item(),
        rollout.cot_entropy.sum().item(), cot_mask.sum().item(), decoded,
        decoded + rollout.prompt_mask.sum().item()])
    return {
        "kind": "train", "step": step + 1,
        "reward": r.mean().item(), "reward_std": r.std(dim=1).mean().item(),
        "frac_correct": n_correct / n, "frac_boxed": n_boxed / n, "grading_timeouts": int(n_timeouts),
        "frac_reward_zero_std": (r.std(dim=1) == 0).float().mean().item(),
        "completions/mean_length": cot_len / n,
        # tokens decoded by the rollout (CoT, prefill, answer) and tokens the update's replay ran
        # (prompts too): the throughputs the cost forecast is built on (train.cost)
        "completions/tokens": int(tokens), "update_tokens": int(update_tokens),
        "stop_rate": n_stopped / n,
        "entropy": ent_sum / max(1.0, ent_count),
        "loss": sums.loss, "cot_logp": sums.cot_lp / n, "answer_logp": sums.answer_lp / n,
        **replay,
        "grad_norm": clipped.norm, "grad_clip": _bound(clipped.bounds["all"]),
        "clipped": bool(clipped.norm > clipped.bounds["all"]),
        **{f"grad_norm_{g}": v for g, v in clipped.group_norms.items()},
        **{f"grad_clip_{g}": _bound(b) for g, b in clipped.bounds.items() if g != "all"},
        "near_ties": int(sums.near_ties), "jacobian_max": sums.jacobian_max,
        "lr": lr, "noise_sigma": sigma, "noise_expected_norm": sigma * math.sqrt(noise_dims),
        **{f"seconds_{k}": round(v, 3) for k, v in seconds.items()},
    }
