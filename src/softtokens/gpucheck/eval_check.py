"""The evaluation section: one batch of each setting at the evaluation batch size, the out-of-domain
scorer, peak memory beside the plan."""

from __future__ import annotations

import math
import time

import torch

from softtokens.data.toy import toy_choice_rows, toy_splits
from softtokens.engine.cot import CotEngine
from softtokens.engine.settings import INFERENCE_SETTINGS
from softtokens.gpucheck.measure import gb, memory_check, peak_bytes, reset_peak, sync
from softtokens.gpucheck.models import prompts_of
from softtokens.gpucheck.shape import CheckShape, Report


# ---------------------------------------------------------------- evaluation
@torch.no_grad()
def check_evaluation(report: Report, model, tok, shape: CheckShape, arch, sigma: float, dev: torch.device) -> None:
    from softtokens.eval.loglik import score_rows
    from softtokens.sizing.plan import eval_memory, loglik_memory

    sec, out = "evaluation", {"settings": {}}
    report.sections[sec] = out
    rows = toy_splits(64, 1, shape.eval_batch, seed=6)["test"]
    prompts = prompts_of(rows, shape.eval_batch)
    engine = CotEngine(model, tok)
    prompt_len = max(len(x) for x in tok(prompts)["input_ids"])
    peak = 0.0
    for name, setting in INFERENCE_SETTINGS.items():
        reset_peak(dev)
        t0 = time.perf_counter()
        finished = list(engine.stream(prompts, list(range(len(prompts))), setting, sigma, shape.eval_cot,
                                      shape.eval_answer, batch_size=shape.eval_batch))
        sync(dev)
        seconds = time.perf_counter() - t0
        stats = dict(engine.stream_stats)
        peak = max(peak, peak_bytes(dev) or 0.0)
        out["settings"][name] = {"rows": len(finished), "seconds": round(seconds, 2),
                                 "ms_per_step": round(1e3 * seconds / max(1, stats["decode_steps"]), 3),
                                 "peak_GB": gb(peak_bytes(dev)), "graph": engine.graph_status, **stats}
        report.check(sec, f"{name}: a batch of {shape.eval_batch} rows decodes", len(finished) == len(prompts),
                     f"{len(finished)} rows, {seconds:.1f} s", f"{len(prompts)} rows")
        report.write()
    plan = eval_memory(arch, shape.eval_batch, prompt_len, shape.eval_cot, shape.eval_answer,
                       str(model.dtype).removeprefix("torch."))
    memory_check(report, sec, "evaluation peak memory", peak if dev.type == "cuda" else None, plan["peak"],
                  {k: gb(v) for k, v in plan.items()})
    out["memory"] = {"measured_peak_GB": gb(peak) if dev.type == "cuda" else None, "planned_GB": gb(plan["peak"])}

    mc = toy_choice_rows(max(8, shape.loglik_batch), seed=3)
    reset_peak(dev)
    t0 = time.perf_counter()
    scored = score_rows(model, tok, mc, batch_size=shape.loglik_batch)
    seconds = time.perf_counter() - t0
    finite = all(math.isfinite(s["nll_correct"]) for s in scored)
    context = max(len(x) for x in tok([r["context"] for r in mc])["input_ids"])
    lplan = loglik_memory(arch, shape.loglik_batch, context, compute_dtype=str(model.dtype).removeprefix("torch."))
    out["loglik"] = {"rows": len(scored), "seconds": round(seconds, 2), "peak_GB": gb(peak_bytes(dev)),
                     "planned_GB": gb(lplan["peak"])}
    report.check(sec, "out-of-domain scorer: every row scored, finite NLL", finite and len(scored) == len(mc),
                 f"{len(scored)} rows, {seconds:.1f} s")
    report.write()
