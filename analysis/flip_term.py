"""What the bf16 flip term cost fuzzy's gradient (issue 39; docs/findings.md, "The flip term").

A fuzzy RLOO run in bf16 compute on the CPU (train.loop.Trainer, one process, FSDP2 with float32 master
weights, as the paper grid's path), its first STEPS steps. At each step the update pass is computed three
ways on the same rollouts, before the step's own update (which uses the first):
  score      the Gaussian term at the rollout's own noise: -||eps||^2 / 2, gradient eps / sigma dh0/dtheta
             (train.rloo.embedding_gaussian_term; what training uses now);
  recorded   the recorded-input form -||h~ - h0_replay||^2 / (2 sigma^2) (what training used before): at a step
             whose argmax flipped between rollout and replay it carries (h0_rollout - h0_replay) / sigma^2
             through the softmax's Jacobian;
  flips      the recorded-input form at the flipped steps only, the score elsewhere: flips - score is the
             flip term's gradient, recorded - flips what bf16 rounding adds at the other steps.
A step is counted as flipped where ||h0_rollout - h0_replay||^2 / (d sigma^2) > 1 (a fuzzy flip is ~2 / gamma^2
= 18; an agreeing bf16 step ~1e-5).

Model: the toy base (MODEL = results/toy/models/toy, its data DATA = results/toy/data/toyarith/train.jsonl)
or, with --random, a tiny random Llama (hidden 128, 2 layers) whose final norm's weight is x6 so its
next-token entropy is near a trained model's (as gpu-check builds its model).
Usage: python analysis/flip_term.py [--random] [--model MODEL] [--data DATA] [--steps 4] [--cot 128]
Prints one JSON line per step and a summary; writes analysis/flip_term.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from softtokens.config.grids import PAPER_RL
from softtokens.train import rloo
from softtokens.train.config import TrainConfig
from softtokens.train.loop import Trainer
from softtokens.train.update import accumulate_gradients, check_replay

FLIP_GAP = 1.0


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def recorded_form(noisy, h0, eps, sigma):
    return rloo.gaussian_log_prob(noisy, h0, sigma)


def flips_only_form(noisy, h0, eps, sigma):
    gap = (noisy.float() - sigma * eps - h0.detach()).pow(2).sum(-1) / (h0.shape[-1] * sigma * sigma)
    return torch.where(gap > FLIP_GAP, rloo.gaussian_log_prob(noisy, h0, sigma), rloo.gaussian_score_term(h0, eps, sigma))


def gradient(trainer: Trainer, rollout, adv, n, form) -> tuple[torch.Tensor, object]:
    """The update pass's flat gradient with ``form`` as the embedding term; no optimiser step."""
    real = rloo.embedding_gaussian_term
    rloo.embedding_gaussian_term = form or real
    try:
        trainer.opt.zero_grad(set_to_none=True)
        sums = accumulate_gradients(trainer.policy, rollout, adv, n, trainer.cfg, trainer.sigma,
                                    trainer.engine.vocab_rows, trainer.gaussian_scale).over(trainer.dp)
        flat = torch.cat([_dense(p.grad).float().flatten() for p in trainer.policy.parameters() if p.grad is not None])
    finally:
        rloo.embedding_gaussian_term = real
        trainer.opt.zero_grad(set_to_none=True)
    return flat, sums


def random_model(out: Path) -> tuple[str, list[dict]]:
    from softtokens.data.toy import toy_splits
    from softtokens.model.toy import build_toy_model, build_toy_tokenizer

    rows = toy_splits(400, 8, 8, seed=7)
    tok = build_toy_tokenizer(rows["train"], 256)
    model = build_toy_model(len(tok), 128, 2, 4, 384, tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, 5)
    with torch.no_grad():
        model.model.norm.weight.mul_(6.0)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out), rows["train"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--model", default="results/toy/models/toy")
    ap.add_argument("--data", default="results/toy/data/toyarith/train.jsonl")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--cot", type=int, default=128)
    ap.add_argument("--out", default="analysis/flip_term.json")
    a = ap.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        if a.random:
            model, rows = random_model(Path(tmp) / "model")
        else:
            model = a.model
            rows = [json.loads(x) for x in Path(a.data).read_text().splitlines() if x.strip()]
        cfg = TrainConfig.from_settings({**PAPER_RL, "mode": "fuzzy", "seed": 0, "lr": 3.0e-5, "prompts_per_step": 8,
                                         "samples_per_prompt": 8, "steps": a.steps, "warmup_steps": 1,
                                         "cot_max_tokens": a.cot, "answer_max_tokens": 8, "micro_batch_size": 64,
                                         "compute_dtype": "bfloat16", "replay_h0_gap_max": 1e9,
                                         "replay_argmax_mismatch_max": 1.0})
        # random weights never answer right: every row's reward then differs only by chance of a box
        grader = None
        if a.random:
            from softtokens.reward.grader import Grade

            grader = lambda completion, gold, timeout: Grade(correct=False, boxed=len(completion) % 3 == 0)  # noqa: E731
        trainer = Trainer(cfg, model, rows, [], Path(tmp) / "_resume", threads=2, grader=grader)
        out = []
        for step in range(a.steps):
            rollout, _, _, adv, n, _ = trainer.rollouts(step)
            score, sums = gradient(trainer, rollout, adv, n, None)
            recorded, _ = gradient(trainer, rollout, adv, n, recorded_form)
            flips, _ = gradient(trainer, rollout, adv, n, flips_only_form)
            replay = check_replay(cfg, step, sums)
            row = {"step": step + 1, "cot_steps": int(sums.cot_steps), "argmax_flips": round(replay["replay_argmax_flips"]
                   * sums.cot_steps), "near_ties": int(sums.near_ties), "jacobian_max": round(sums.jacobian_max, 1),
                   "h0_gap": replay["replay_h0_gap"], "h0_gap_flipped": replay["replay_h0_gap_flipped"],
                   "grad_norm_score": float(score.norm()), "grad_norm_recorded": float(recorded.norm()),
                   "flip_term_norm": float((flips - score).norm()),
                   "agreeing_steps_bf16_norm": float((recorded - flips).norm()),
                   "flip_term_share_of_recorded": float((flips - score).norm() / recorded.norm())}
            print(json.dumps(row), flush=True)
            out.append(row)
            trainer.train_step(step)  # the step itself, with the score (the rollouts are drawn again: same seeds)
        trainer.close()
    summary = {"model": "random peaked (hidden 128, 2 layers, final norm x6)" if a.random else model,
               "cot_max_tokens": a.cot, "rows_per_step": 64, "compute_dtype": "bfloat16", "steps": out}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
