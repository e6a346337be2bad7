"""The engine section: ms per decode step in the six settings beside the bandwidth bound, CUDA graph
capture, greedy equality with HF ``generate``, fresh noise per step and row."""

from __future__ import annotations

import math
import statistics
import time

import torch

from softtokens.data.toy import toy_splits
from softtokens.engine import fused
from softtokens.engine.cot import CotEngine
from softtokens.engine.settings import INFERENCE_SETTINGS
from softtokens.gpucheck.measure import copy_bandwidth, gb, release, timed
from softtokens.gpucheck.models import prompts_of
from softtokens.gpucheck.shape import (
    DECODE_CURVE_COT,
    DECODE_ROWS,
    SMOKE_DECODE_ROWS,
    TIE_THRESHOLD_SCALE,
    CheckShape,
    Report,
)
from softtokens.model.head import Float32Head

# ---------------------------------------------------------------- engine
SPEED_SETTINGS = ("hard_sample", "soft_sample")   # the speed profile's decode: a training step's two paths


def check_engine(report: Report, model, tok, shape: CheckShape, sigma: float, dev: torch.device,
                 speed: bool = False, deadline: float | None = None) -> None:
    """The decode step of every setting, its curve, the attention A/B and the correctness checks; ``speed``:
    the training step's two settings and the A/B only; nothing new is started past ``deadline``."""
    sec, out = "engine", {"settings": {}}
    report.sections[sec] = out
    rl = shape.rl
    rows = toy_splits(64, 1, 256, seed=5)["test"]
    prompts = prompts_of(rows, rl["prompts_per_step"], rl["samples_per_prompt"])  # a training step's B x G rows
    seeds = list(range(len(prompts)))
    cot, answer = rl["cot_max_tokens"], rl["answer_max_tokens"]
    engine = CotEngine(model, tok)
    bandwidth = copy_bandwidth(dev)
    cfg = model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    prompt_len = int(engine.encode_prompts(prompts)[1].sum(1).max())
    out.update(rows=len(prompts), cot=cot, answer=answer, prompt_tokens=prompt_len,
               copy_bandwidth_GBps=round(bandwidth / 1e9, 1), weights_GB=gb(weight_bytes),
               attention=engine.attention, head=Float32Head(model, len(tok), with_input=True).path,
               elementwise=engine.fusion_status)
    report.check(sec, "decode elementwise work fused (torch.compile, four kernels a layer)",
                 engine.fusion_status.startswith("fused") if dev.type == "cuda" else None, engine.fusion_status)
    for name, setting in INFERENCE_SETTINGS.items():
        if speed and name not in SPEED_SETTINGS:
            continue
        if deadline is not None and time.monotonic() > deadline and out["settings"]:
            out["cut"] = f"at its deadline, before {name}"
            break
        engine.generate(prompts, setting, sigma, seeds, min(8, cot), 2)  # warm-up: allocator, capture
        steps = cot + engine.max_prefill + answer
        seconds = statistics.median(timed(lambda: engine.generate(prompts, setting, sigma, seeds, cot, answer), dev)
                                    for _ in range(shape.repeats))
        kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * len(prompts) \
            * (prompt_len + steps / 2) * model.dtype.itemsize  # the mean cache length a step must read
        mix_bytes = len(tok) * cfg.hidden_size * model.dtype.itemsize if setting.mode != "hard" else 0
        bound = (weight_bytes + kv_bytes + mix_bytes) / bandwidth
        out["settings"][name] = {"decode_steps": steps, "seconds_per_rollout": round(seconds, 3),
                                 "ms_per_step": round(1e3 * seconds / steps, 3),
                                 "bound_ms_per_step": round(1e3 * bound, 3),
                                 "ratio_to_bound": round(seconds / steps / bound, 2), "graph": engine.graph_status}
        report.check(sec, f"{name}: decode step captured in a CUDA graph",
                     engine.graph_status == "captured" if dev.type == "cuda" else None, engine.graph_status)
        print(f"[gpu-check] engine {name}: {out['settings'][name]}", flush=True)
        report.write()

    if "soft_sample" in out["settings"]:
        out["attention_ab"] = _attention_ab(report, engine, prompts, seeds, sigma, shape, dev,
                                            out["settings"]["soft_sample"]["bound_ms_per_step"])
        report.write()
        if out["attention_ab"].get("flex", {}).get("declined") and not (deadline and time.monotonic() > deadline):
            out["attention_ab_flex_shape"] = _attention_ab_at_a_flex_shape(report, tok, prompts, seeds, sigma, shape,
                                                                            dev, bandwidth)
            report.write()
    if speed:
        return
    out["decode_curve"] = _decode_curve(engine, rows, sigma, shape, dev)
    report.write()
    if engine.fusion_status.startswith("fused"):
        out["fusion"] = _fusion_gain(report, engine, prompts, seeds, sigma, shape, dev)
        report.write()
    _greedy_equals_hf(report, model, tok, rows, dev)
    short = min(cot, 32)
    if dev.type == "cuda":  # the captured step against the same step run eagerly, bit for bit
        eager = CotEngine(model, tok, cuda_graphs=False, fuse_elementwise=engine.elementwise is not fused.EAGER)
        for name in ("hard_sample", "soft_sample", "fuzzy_sample"):
            a = engine.generate(prompts, INFERENCE_SETTINGS[name], sigma, seeds, short, 4, answer_temperature=1.0)
            b = eager.generate(prompts, INFERENCE_SETTINGS[name], sigma, seeds, short, 4, answer_temperature=1.0)
            same = torch.equal(a.step_ids, b.step_ids) and (a.noisy_inputs is None
                                                             or torch.equal(a.noisy_inputs, b.noisy_inputs))
            report.check(sec, f"{name}: CUDA-graph replay equals the eager step", same,
                         "identical" if same else "differs", "bit for bit")
    else:
        report.check(sec, "CUDA-graph replay equals the eager step", None, "no CUDA device")
    _noise_is_fresh(report, engine, prompts, seeds, sigma, short, dev)
    if dev.type == "cuda":  # where a decode step's time goes, for whoever speeds it up next
        from torch.profiler import ProfilerActivity, profile

        cot_p = min(cot, 128)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.generate(prompts, INFERENCE_SETTINGS["soft_sample"], sigma, seeds, cot_p, 2)
        out["profile"] = {"setting": "soft_sample", "cot": cot_p, "answer": 2,
                          "table": prof.key_averages().table(sort_by="cuda_time_total", row_limit=25,
                                                             max_name_column_width=70)}
    report.write()


def _decode_curve(engine: CotEngine, rows: list[dict], sigma: float, shape: CheckShape, dev) -> list[dict]:
    """ms per decode step at each row count one GPU decodes in the grids' jobs (shape.DECODE_ROWS), for a
    hard and a soft setting: what the cost forecast fits its decode line to (rates.throughput)."""
    counts = SMOKE_DECODE_ROWS if shape.source == "smoke" else DECODE_ROWS
    cot = min(shape.rl["cot_max_tokens"], DECODE_CURVE_COT)
    steps = cot + engine.max_prefill + 2
    curve = []
    for n in counts:
        prompts = prompts_of(rows, n)
        seeds = list(range(len(prompts)))
        point = {"rows": n, "decode_steps": steps, "ms_per_step": {}}
        for name in ("hard_sample", "soft_sample"):
            setting = INFERENCE_SETTINGS[name]
            engine.generate(prompts, setting, sigma, seeds, min(8, cot), 2)  # warm-up: allocator, capture
            seconds = statistics.median(timed(lambda: engine.generate(prompts, setting, sigma, seeds, cot, 2), dev)
                                        for _ in range(shape.repeats))
            point["ms_per_step"][name] = round(1e3 * seconds / steps, 3)
        curve.append(point)
        print(f"[gpu-check] engine decode curve: {point}", flush=True)
    return curve


def _fusion_gain(report: Report, engine: CotEngine, prompts, seeds, sigma: float, shape: CheckShape, dev) -> dict:
    """The soft decode step of a training step's rows with the elementwise work fused (the engine's
    default on CUDA) and not: ms per step of each, and the share of CoT tokens the two agree on
    before their first difference (bf16: the norms' summation order may differ in the last bit, and
    a near tie then flips)."""
    sec, setting = "engine", INFERENCE_SETTINGS["soft_sample"]
    plain = CotEngine(engine.model, engine.tokenizer, fuse_elementwise=False)
    cot = min(shape.rl["cot_max_tokens"], DECODE_CURVE_COT)
    steps = cot + engine.max_prefill + 2
    ms, ids = {}, {}
    for name, e in (("fused", engine), ("eager", plain)):
        e.generate(prompts, setting, sigma, seeds, min(8, cot), 2)  # warm-up: allocator, capture
        seconds = statistics.median(timed(lambda: e.generate(prompts, setting, sigma, seeds, cot, 2), dev)
                                    for _ in range(shape.repeats))
        ms[name] = round(1e3 * seconds / steps, 3)
        ids[name] = e.generate(prompts, setting, sigma, seeds, cot, 2).step_ids[:, :cot]
    agree = (ids["fused"] == ids["eager"]).float().cumprod(-1).sum(-1)
    out = {"setting": "soft_sample", "rows": len(prompts), "ms_per_step": ms,
           "fused_over_eager": round(ms["fused"] / ms["eager"], 3),
           "token_agreement": round(float(agree.sum() / agree.numel() / cot), 4)}
    report.check(sec, "fused elementwise decode step no slower than the eager one", ms["fused"] <= ms["eager"],
                 out["fused_over_eager"], "<= 1.0 (ms per step, fused / eager)")
    print(f"[gpu-check] engine fusion: {out}", flush=True)
    return out


def _attention_ab(report: Report, engine: CotEngine, prompts, seeds, sigma: float, shape: CheckShape, dev,
                  bound_ms: float) -> dict:
    """The soft decode step of a training step's rows at the runs' CoT length with each GPU attention
    (decode_forward.ATTENTIONS: the memory-efficient SDPA kernel, FlexAttention's split-K decoding kernel):
    ms per step, its ratio to the bandwidth bound, and the share of CoT tokens each agrees with SDPA on
    before their first difference. What decides the engine's default attention on CUDA (engine.flex_decode)."""
    sec, setting = "engine", INFERENCE_SETTINGS["soft_sample"]
    cot, answer = shape.rl["cot_max_tokens"], 2
    steps = cot + engine.max_prefill + answer
    default, out, ids = engine.attention, {"setting": "soft_sample", "rows": len(prompts), "cot": cot}, {}
    try:
        for attention in ("sdpa", "flex"):
            engine.attention = attention
            result = []
            from softtokens.engine.flex_decode import declined

            why = declined(engine.model.config.num_attention_heads, engine.model.config.num_key_value_heads) \
                if attention == "flex" and dev.type == "cuda" else None
            if why:
                out["flex"] = {"declined": why}
                continue
            try:
                engine.generate(prompts, setting, sigma, seeds, min(8, cot), 2)  # warm-up: compile, capture
                # one full-length rollout each (the A/B's cost in a gpu-check of 10 minutes), its tokens kept
                seconds = timed(lambda: result.append(engine.generate(prompts, setting, sigma, seeds, cot, answer)),
                                dev)
            except Exception as err:  # a kernel that does not compile or capture here
                out[attention] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
                continue
            ms = 1e3 * seconds / steps
            out[attention] = {"ms_per_step": round(ms, 3), "ratio_to_bound": round(ms / bound_ms, 2),
                              "graph": engine.graph_status}
            ids[attention] = result[0].step_ids[:, :cot]
    finally:
        engine.attention = default
    if "flex" in ids and "sdpa" in ids:
        agree = (ids["flex"] == ids["sdpa"]).float().cumprod(-1).sum(-1)
        out["flex"]["token_agreement"] = round(float(agree.sum() / agree.numel() / cot), 4)
        # speed is reported, not judged: what decides the default is flex against SDPA in this same run
        out["flex_over_sdpa"] = round(out["flex"]["ms_per_step"] / out["sdpa"]["ms_per_step"], 3)
        out["faster"] = "flex" if out["flex_over_sdpa"] < 1.0 else "sdpa"
        report.check(sec, "soft decode step: FlexAttention's ms / SDPA's (same run; below 1: flex faster)", None,
                     out["flex_over_sdpa"], f"reported; flex {out['flex']['ratio_to_bound']}x its bound, SDPA "
                                            f"{out['sdpa']['ratio_to_bound']}x")
    else:
        report.check(sec, "FlexAttention decode ran", None, out.get("flex", {}).get("error", "not run"),
                     "reported (SDPA stays the default)")
    print(f"[gpu-check] engine attention A/B: {out}", flush=True)
    return out


# the model whose attention FlexAttention's split-K decoding kernel can take (a group of 4 query heads per key-value
# head, a power of two): Llama-3.1-8B's layout, its first FLEX_AB_LAYERS layers (the A/B is per attention call)
FLEX_AB_MODEL, FLEX_AB_LAYERS = "meta-llama/Llama-3.1-8B-Instruct", 4


def _attention_ab_at_a_flex_shape(report: Report, tok, prompts, seeds, sigma: float, shape: CheckShape, dev,
                                  bandwidth: float) -> dict:
    """The attention A/B where the checked model's group declines flex (Llama-3.2-3B's is 3): the same rows and
    CoT on random weights of Llama-3.1-8B's attention layout, FLEX_AB_LAYERS layers, in the compute dtype, so
    the choice of the default attention rests on a shape a paper model decodes with (engine.flex_decode)."""
    from softtokens.gpucheck.models import architecture_config, random_model

    if dev.type != "cuda":
        report.check("engine", "attention A/B at a shape flex can take (group 4)", None, "no CUDA device")
        return {"skipped": "no CUDA device"}
    fields = {**architecture_config(FLEX_AB_MODEL), "num_hidden_layers": FLEX_AB_LAYERS}
    model = random_model(fields, tok, getattr(torch, shape.rl["compute_dtype"]), dev)
    engine = CotEngine(model, tok)
    try:
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        bound_ms = 1e3 * weight_bytes / bandwidth
        out = _attention_ab(report, engine, prompts, seeds, sigma, shape, dev, bound_ms)
        out["model"] = f"{FLEX_AB_MODEL}, first {FLEX_AB_LAYERS} layers, random weights"
    finally:
        del engine, model
        release(dev)
    return out


@torch.no_grad()
def _greedy_equals_hf(report: Report, model, tok, rows, dev) -> None:
    """Hard greedy CoT tokens against HF generate(do_sample=False) on the same prompts: in float32
    (pass/fail: the same tokens), and in the compute dtype (reported: HF rounds its logits to bf16,
    where ties among 128k tokens are common, so a divergence there says nothing of the engine)."""
    import copy

    sec = "engine"
    prompts = prompts_of(rows, 8)
    k = 24
    for dtype in (torch.float32, model.dtype):
        m = model if dtype == model.dtype else copy.deepcopy(model).to(dtype)
        engine = CotEngine(m, tok)
        ids, mask = engine.encode_prompts(prompts)
        eos, m.generation_config.eos_token_id = m.generation_config.eos_token_id, None  # k tokens, as the CoT
        hf = m.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=k,
                        pad_token_id=tok.pad_token_id)[:, ids.shape[1]:]
        m.generation_config.eos_token_id = eos
        ours = engine.generate(prompts, INFERENCE_SETTINGS["hard_greedy"], 0.0, list(range(len(prompts))), k, 1)
        ours_ids = ours.step_ids[:, :k]
        agree = (hf == ours_ids).float().cumprod(-1).sum(-1)  # tokens equal before the first difference
        share = float(agree.sum() / agree.numel() / k)
        if dtype == torch.float32:
            report.check(sec, "hard greedy tokens equal HF generate (float32)", share == 1.0, round(share, 4),
                         "1.0: every token of every row")
        else:
            report.sections[sec]["hf_generate_agreement_compute_dtype"] = round(share, 4)
            report.check(sec, f"hard greedy tokens vs HF generate ({str(dtype).removeprefix('torch.')}, "
                              "HF rounds logits to it)", None, round(share, 4), "reported")
        if m is not model:
            del m
            release(dev)


@torch.no_grad()
def _noise_is_fresh(report: Report, engine: CotEngine, prompts, seeds, sigma: float, cot: int, dev) -> None:
    """Soft CoT noise as the model saw it: equal across two runs with the same seeds, different
    with other seeds, and, recovered from a teacher-forced replay (noise = (h~ - h0) / sigma), of
    unit variance per dimension and uncorrelated across a row's steps and across rows at a step.
    A noise draw frozen by graph replay (the same vector at every step) fails the last two."""
    from softtokens.engine.rollout import COT
    from softtokens.train.rloo import step_hidden

    sec, setting = "engine", INFERENCE_SETTINGS["soft_sample"]
    a = engine.generate(prompts, setting, sigma, seeds, cot, 2)
    b = engine.generate(prompts, setting, sigma, seeds, cot, 2)
    c = engine.generate(prompts, setting, sigma, [s + 10_000 for s in seeds], cot, 2)
    report.check(sec, "soft_sample: the same seeds give the same inputs", torch.equal(a.noisy_inputs, b.noisy_inputs),
                 "identical" if torch.equal(a.noisy_inputs, b.noisy_inputs) else "differ", "bit for bit")
    report.check(sec, "soft_sample: other seeds give other inputs", not torch.equal(a.noisy_inputs, c.noisy_inputs),
                 "differ" if not torch.equal(a.noisy_inputs, c.noisy_inputs) else "identical", "differ")
    model = engine.model
    head = Float32Head(model, engine.vocab_rows, with_input=True)
    h = step_hidden(model, a)  # (N, S, d)
    is_cot = a.step_phase == COT
    steps = int(is_cot.sum(1).min())
    noise, agree = [], []
    for t in range(steps):
        logits = head.logits(h[:, t])
        agree.append(logits.argmax(-1) == a.argmax_ids[:, t])  # bf16 flips a near tie's argmax now and then
        p = torch.softmax(logits / setting.temperature, dim=-1)
        noise.append((a.noisy_inputs[:, t] - head.mixture(p)) / sigma)
    n = torch.stack(noise, dim=1)  # (N, T, d)
    agree = torch.stack(agree, dim=1)  # (N, T)
    d = n.shape[-1]
    energy = float(n.pow(2).mean(-1)[agree].mean())  # where the replay's argmax is the rollout's, as the h0 gap
    unit = torch.nn.functional.normalize(n, dim=-1)
    along = float((unit[:, 1:] * unit[:, :-1]).sum(-1).abs().mean()) if steps > 1 else 0.0
    across = float((unit[1:] * unit[:-1]).sum(-1).abs().mean())
    bound = min(0.5, TIE_THRESHOLD_SCALE / math.sqrt(d))
    report.sections[sec]["noise"] = {"energy_per_dim": round(energy, 4), "argmax_flips": round(1 - float(
                                         agree.float().mean()), 4), "mean_abs_cos_consecutive_steps": round(along, 4),
                                     "mean_abs_cos_across_rows": round(across, 4), "fresh_noise_expected_abs_cos":
                                     round(math.sqrt(2 / (math.pi * d)), 4), "steps": steps}
    report.check(sec, "soft_sample: replayed noise has unit variance per dimension", 0.8 <= energy <= 1.25,
                 round(energy, 3), "0.8 to 1.25, at steps whose replayed argmax is the rollout's")
    report.check(sec, "soft_sample: noise fresh at every step (|cos| of consecutive steps)", along < bound,
                 round(along, 4), f"< {bound:.3f}; frozen noise gives ~1")
    report.check(sec, "soft_sample: noise fresh in every row (|cos| across rows)", across < bound,
                 round(across, 4), f"< {bound:.3f}")
