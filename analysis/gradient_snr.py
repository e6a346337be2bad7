"""Why soft/fuzzy RLOO is fragile where hard RLOO is not: gradient statistics at one model.

For each training mode, draw K independent RLOO batches (same prompts, fresh rollouts) at a
fixed model and measure, per parameter group (input/output embedding E vs the rest):
  - the norm of the CoT-term and answer-term gradients,
  - the signal-to-noise ratio ||mean g||^2 / (trace Cov(g) / K) of the full RLOO gradient,
  - the cosine between the mean gradient and each single-batch gradient.
Usage: python analysis/gradient_snr.py MODEL_DIR [K]
"""

import json
import sys

import torch

from softtokens.data.prompt import format_prompt
from softtokens.data.toy import toy_splits
from softtokens.engine.cot import CotEngine
from softtokens.engine.sampling import row_seed
from softtokens.model.loading import load_model, load_tokenizer
from softtokens.model.scale import embedding_scale
from softtokens.reward.grader import grade, reward_of_grade
from softtokens.train.config import TrainConfig
from softtokens.train.rloo import rloo_advantages, rloo_loss, rollout_log_probs


def grads(model, rollout, adv, sigma, which):
    model.zero_grad(set_to_none=True)
    replay = rollout_log_probs(model, rollout, sigma, 1.0, None)
    cot, ans = replay.cot, replay.answer
    lp = {"cot": cot, "answer": ans, "all": cot + ans}[which]
    rloo_loss(lp, adv, len(adv)).backward()
    emb = model.get_input_embeddings().weight
    g_emb = emb.grad.flatten().clone()
    g_rest = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None and p is not emb])
    return g_emb, g_rest


def main(model_dir, k=8, b=8, g=8):
    torch.set_num_threads(2)
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir).eval()
    engine = CotEngine(model, tok)
    scale = embedding_scale(model, len(tok))
    problems = toy_splits(4000, 128, 128, 1234)["train"][:b]
    prompts = [format_prompt(p["question"]) for p in problems for _ in range(g)]
    golds = [p["answer"] for p in problems for _ in range(g)]
    report = {}
    for mode in ("hard", "soft", "fuzzy"):
        cfg = TrainConfig(mode=mode, seed=0, lr=1.0)
        sigma = scale.sigma(cfg.noise_factor) if mode != "hard" else 0.0
        full_e, full_r, parts = [], [], {"cot": [0.0, 0.0], "answer": [0.0, 0.0]}
        for i in range(k):
            r = engine.generate(prompts, cfg.cot_setting, sigma, [row_seed(99, i, j) for j in range(len(prompts))],
                                80, 8, answer_temperature=1.0)
            rewards = torch.tensor([reward_of_grade(grade(c, y)) for c, y in zip(r.completions, golds)])
            adv = rloo_advantages(rewards.view(b, g)).flatten()
            for which in ("cot", "answer"):
                ge, gr = grads(model, r, adv, sigma, which)
                parts[which][0] += ge.norm().item() / k
                parts[which][1] += gr.norm().item() / k
            ge, gr = grads(model, r, adv, sigma, "all")
            full_e.append(ge)
            full_r.append(gr)
        stats = {}
        for name, gs in (("E", full_e), ("rest", full_r)):
            gs = torch.stack(gs)
            mean = gs.mean(0)
            noise = gs.var(0, unbiased=True).sum() / k
            stats[name] = {"snr": (mean.norm() ** 2 / noise).item(),
                           "mean_cos_single_vs_mean": torch.nn.functional.cosine_similarity(gs, mean.expand_as(gs)).mean().item()}
        report[mode] = {"sigma": sigma, "grad_norm_cot_term": {"E": parts["cot"][0], "rest": parts["cot"][1]},
                        "grad_norm_answer_term": {"E": parts["answer"][0], "rest": parts["answer"][1]}, **stats}
        print(mode, json.dumps(report[mode], indent=1), flush=True)
    return report


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8)
