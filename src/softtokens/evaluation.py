"""Evaluate one model (base or selected checkpoint) on one math benchmark under one of the six
inference settings: per-problem correct counts, pass@1 and the pass@k curve, CoT lengths and
the CoT entropy profile (Section 4 'Inference settings'; Appendix entropy analysis)."""

from __future__ import annotations

import time

import torch
from tqdm import tqdm

from softtokens.data import format_prompt
from softtokens.generation import COT, INFERENCE_SETTINGS, CotEngine, is_stochastic, row_seed
from softtokens.metrics import entropy_profile, entropy_sums, mean_pass_at_k
from softtokens.modeling import hub_revision, load_model, load_tokenizer, noise_scale, pick_device
from softtokens.rewards import GRADING_TIMEOUT_S, grade


def evaluate(model_path: str, rows: list[dict], setting_name: str, n_samples: int, cot_max_tokens: int,
             answer_max_tokens: int, batch_size: int, seed: int, dtype: str = "float32",
             threads: int = 1, grading_timeout_s: float = GRADING_TIMEOUT_S) -> dict:
    """Greedy settings draw 1 CoT per problem, sample settings ``n_samples``; answers greedy.
    sigma follows modeling.noise_scale: the base model's E, as in the model's training."""
    torch.set_num_threads(threads)
    setting = INFERENCE_SETTINGS[setting_name]
    n = n_samples if is_stochastic(setting) else 1
    tokenizer = load_tokenizer(model_path)
    model = load_model(model_path, dtype, pick_device()).eval()
    engine = CotEngine(model, tokenizer)
    scale, sigma_source = noise_scale(model_path, model, len(tokenizer))
    sigma = scale.sigma(setting.noise_factor)

    jobs = [(pi, si) for pi in range(len(rows)) for si in range(n)]
    correct = [0] * len(rows)
    boxed = [0] * len(rows)
    timeouts = 0
    cot_len = [0.0] * len(rows)
    stopped = [0] * len(rows)
    ent_sum = torch.zeros(cot_max_tokens)
    ent_cnt = torch.zeros(cot_max_tokens)
    examples = []
    start = time.time()
    for i in tqdm(range(0, len(jobs), batch_size), desc=f"eval {setting_name}", mininterval=5):
        chunk = jobs[i:i + batch_size]
        out = engine.generate([format_prompt(rows[pi]["question"]) for pi, _ in chunk], setting, sigma,
                              [row_seed(seed, pi, si) for pi, si in chunk], cot_max_tokens, answer_max_tokens,
                              answer_temperature=0.0)
        for j, (pi, si) in enumerate(chunk):
            g = grade(out.completions[j], rows[pi]["answer"], grading_timeout_s)
            correct[pi] += g.correct
            boxed[pi] += g.boxed
            timeouts += g.timed_out
            cot_len[pi] += out.cot_len[j].item() / n
            stopped[pi] += int(out.stopped[j])
            if si == 0 and len(examples) < 3:
                examples.append({"id": rows[pi]["id"], "cot": out.cot_texts[j], "completion": out.completions[j],
                                 "gold": rows[pi]["answer"], "correct": g.correct})
        # entropy at each CoT position (a row's CoT steps are its first cot_len steps)
        total, count = entropy_sums(out.cot_entropy, out.step_phase == COT, cot_max_tokens)
        ent_sum += total
        ent_cnt += count

    counts = [(n, c) for c in correct]
    return {
        "setting": setting_name, "model_revision": hub_revision(model), "mode": setting.mode, "temperature": setting.temperature,
        "noise_factor": setting.noise_factor, "sigma": sigma, "sigma_source": sigma_source,
        "embedding_scale": scale.as_dict(),
        "n_problems": len(rows), "n_samples": n,
        "pass@1": mean_pass_at_k(counts, 1),
        "pass@k": {str(k): mean_pass_at_k(counts, k) for k in range(1, n + 1)},
        "boxed_rate": sum(boxed) / (n * len(rows)),
        "stop_rate": sum(stopped) / (n * len(rows)),
        "grading_timeouts": timeouts, "grading_timeout_s": grading_timeout_s,
        "mean_cot_length": sum(cot_len) / len(rows),
        "entropy_profile": entropy_profile(ent_sum, ent_cnt),
        "entropy_count": ent_cnt.tolist(),
        "seconds": round(time.time() - start, 2),
        "examples": examples,
        "problems": [{"id": r["id"], "n": n, "correct": c, "boxed": b, "mean_cot_length": round(l, 2)}
                     for r, c, b, l in zip(rows, correct, boxed, cot_len)],
    }
