"""Evaluate one model (base or selected checkpoint) on one math benchmark under one of the six
inference settings: per-problem correct counts, pass@1 and the pass@k curve, CoT lengths and
the CoT entropy profile (Section 4 'Inference settings'; Appendix entropy analysis)."""

from __future__ import annotations

import time

import torch
from tqdm import tqdm

from softtokens.data.prompt import format_prompt
from softtokens.engine.cot import CotEngine
from softtokens.engine.rollout import COT
from softtokens.engine.sampling import row_seed
from softtokens.engine.settings import (
    EMBEDDING,
    INFERENCE_SETTINGS,
    Placement,
    cot_settings,
    is_stochastic,
)
from softtokens.eval.metrics import entropy_profile, entropy_sums, mean_pass_at_k
from softtokens.model.cpu_bf16 import bf16_products
from softtokens.model.loading import (
    confirm_checkpoint,
    hub_revision,
    load_model,
    load_tokenizer,
    pick_device,
)
from softtokens.model.scale import noise_scale
from softtokens.reward.grader import GRADING_TIMEOUT_S
from softtokens.reward.pool import GradingPool


class MathEvaluator:
    """One model loaded once for every inference setting a job evaluates (its tokenizer, weights, noise scale and
    grading workers), so a job writing the six settings' files pays its start-up once."""

    def __init__(self, model_path: str, dtype: str = "float32", threads: int = 1,
                 grading_timeout_s: float = GRADING_TIMEOUT_S):
        torch.set_num_threads(threads)
        self.model_path = model_path
        self.tokenizer = load_tokenizer(model_path)
        # the checkpoint's bytes hashed beside the evaluation, confirmed before a result is returned (model.loading)
        self.model = load_model(model_path, dtype, pick_device(), defer_check=True).eval()
        self.engine = CotEngine(self.model, self.tokenizer)
        self.scale, self.sigma_source = noise_scale(model_path, self.model, len(self.tokenizer))
        self.pool = GradingPool(max(1, threads), grading_timeout_s)
        self.grading_timeout_s = grading_timeout_s

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> "MathEvaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, rows: list[dict], setting_name: str, n_samples: int, cot_max_tokens: int, answer_max_tokens: int,
            batch_size: int, seed: int, refill: bool = True, cot: dict | None = None,
            placement: Placement = EMBEDDING) -> dict:
        """Greedy settings draw 1 CoT per problem, sample settings ``n_samples``; answers greedy.
        ``cot``: the config's CoT keys (config.COT_KEYS) the six settings derive from; the
        paper's when absent. ``placement``: where soft / fuzzy settings put their noise (the paper's
        input embedding unless the grid evaluates runs in their own placement). sigma follows
        model.scale.noise_scale: the base model's scales, as in the model's training."""
        settings = INFERENCE_SETTINGS if cot is None else cot_settings(cot)
        if setting_name not in settings:
            raise ValueError(f"unknown inference setting {setting_name!r} (known: {', '.join(settings)})")
        with bf16_products(self.model.dtype, self.model.device):   # model.cpu_bf16: bf16 on a CPU without bf16 units
            return _evaluate(self, rows, setting_name, settings[setting_name], n_samples, cot_max_tokens,
                             answer_max_tokens, batch_size, seed, refill, placement)


def evaluate(model_path: str, rows: list[dict], setting_name: str, n_samples: int, cot_max_tokens: int,
             answer_max_tokens: int, batch_size: int, seed: int, dtype: str = "float32",
             threads: int = 1, grading_timeout_s: float = GRADING_TIMEOUT_S, refill: bool = True,
             cot: dict | None = None, placement: Placement = EMBEDDING) -> dict:
    """One setting of one model (MathEvaluator.run, the model loaded for it alone)."""
    with MathEvaluator(model_path, dtype, threads, grading_timeout_s) as ev:
        return ev.run(rows, setting_name, n_samples, cot_max_tokens, answer_max_tokens, batch_size, seed, refill,
                      cot, placement)


def _evaluate(ev: MathEvaluator, rows: list[dict], setting_name: str, setting, n_samples: int, cot_max_tokens: int,
              answer_max_tokens: int, batch_size: int, seed: int, refill: bool, placement: Placement) -> dict:
    n = n_samples if is_stochastic(setting) else 1
    engine, model, scale, sigma_source = ev.engine, ev.model, ev.scale, ev.sigma_source
    sigma = scale.sigma(setting.noise_factor, placement.where)
    grading_timeout_s = ev.grading_timeout_s

    jobs = [(pi, si) for pi in range(len(rows)) for si in range(n)]
    correct = [0] * len(rows)
    boxed = [0] * len(rows)
    timeouts = 0
    cot_tokens = [0] * len(rows)
    stopped = [0] * len(rows)
    ent_sum = torch.zeros(cot_max_tokens)
    ent_cnt = torch.zeros(cot_max_tokens)
    start = time.time()
    prompts = [format_prompt(rows[pi]["question"]) for pi, _ in jobs]
    seeds = [row_seed(seed, pi, si) for pi, si in jobs]
    finished = engine.stream(prompts, seeds, setting, sigma, cot_max_tokens, answer_max_tokens,
                             answer_temperature=0.0, batch_size=batch_size, refill=refill, placement=placement)
    # rows arrive as they finish (slots are refilled); every sum below is order-free, and the
    # examples are the first problems' first samples whatever the order
    example_rows = {}
    outs = list(tqdm(finished, total=len(jobs), desc=f"eval {setting_name}", mininterval=5))
    # every answer graded in worker processes, each within its budget (reward.pool)
    graded = ev.pool.grade_many([(out.completion, rows[jobs[out.job][0]]["answer"]) for out in outs])
    for out, g in zip(outs, graded):
        pi, si = jobs[out.job]
        correct[pi] += g.correct
        boxed[pi] += g.boxed
        timeouts += g.timed_out
        cot_tokens[pi] += out.cot_len
        stopped[pi] += int(out.stopped)
        if si == 0 and pi < 3:
            example_rows[pi] = {"id": rows[pi]["id"], "cot": out.cot_text, "completion": out.completion,
                                "gold": rows[pi]["answer"], "correct": g.correct}
        # entropy at each CoT position (a row's CoT steps are its first cot_len steps)
        total, count = entropy_sums(out.cot_entropy[None], (out.step_phase == COT)[None], cot_max_tokens)
        ent_sum += total
        ent_cnt += count
    examples = [example_rows[pi] for pi in sorted(example_rows)]

    cot_len = [t / n for t in cot_tokens]
    seconds = time.time() - start
    confirm_checkpoint(model)   # nothing computed from a checkpoint whose bytes are not its training's is kept
    counts = [(n, c) for c in correct]
    return {
        "setting": setting_name, "model_revision": hub_revision(model), "mode": setting.mode, "temperature": setting.temperature,
        "noise_factor": setting.noise_factor, "sigma": sigma, "sigma_source": sigma_source,
        "noise_placement": placement.where, "noise_top_k": placement.top_k,
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
        "seconds": round(seconds, 2),
        # decode work: slot-steps paid vs slot-steps of running rows (docs/engine.md, "Rollout engine")
        "engine": {"batch_size": batch_size, "refill": refill, **engine.stream_stats,
                   "useful_tokens_per_s": round(engine.stream_stats["useful_steps"] / max(seconds, 1e-9), 1)},
        "examples": examples,
        "problems": [{"id": r["id"], "n": n, "correct": c, "boxed": b, "mean_cot_length": round(l, 2)}
                     for r, c, b, l in zip(rows, correct, boxed, cot_len)],
    }
