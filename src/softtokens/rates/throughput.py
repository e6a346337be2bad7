"""The rates a cost forecast reads (cost.forecast), as gpu-check measures them on one GPU.

Why a model of rates rather than one tokens-per-second figure: a decode step reads every weight
whatever the rows it decodes, so its time is nearly flat in the rows up to the GPU's compute
(H100, Llama-3.2-3B: 9.4 ms a step at 64 rows, 15.9 ms at 192); dividing a rollout's time by the
job's GPUs, as if 8 rows per GPU took an eighth of 64, under-forecasts a training job several-fold.
An update is bound by its FLOPs (6 x parameters per token replayed, 8 with activation
checkpointing), which do divide over GPUs. So:

- decode: per CoT mode, seconds per step = fixed + per_row x rows (a line through gpu-check's
  steps at the row counts the grids use; the fixed part is reading the weights);
- update: per mode, parameter-tokens per second per GPU (tokens replayed x parameters / seconds),
  with whether the measurement recomputed activations, and a fixed cost per micro-batch (kernel
  launches, casts, the head's chunks; 0.25-0.32 s on an H100 at 10c3a31) fitted where one GPU
  measured a mode at two micro-batch sizes, so that a rate measured at 2-row micro-batches is not
  applied as it is to a job that runs 8;
- the log-likelihood pass: rows scored per second; saving a checkpoint and the resume state.

Decode and saves scale with the parameter count (bytes read and written), the update rate does not
(it is per FLOP): ``scaled_to`` moves a measurement to another model.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from softtokens.data.prompt import PREFILL_TOKENS
from softtokens.config.names import CONTINUOUS_MODES, MODES, setting_mode

# host memory a save's state is copied to per second (pageable copies on an H100 node; a stated value: no
# gpu-check measures the staging yet): what an asynchronous save costs the run it blocks
STAGING_GBPS = 10.0
# answers one grading worker grades per second (reward.pool, math-verify through the paper's reward): 1,000 at one
# worker, 1,818 at two, on the gold shapes of MATH-500, OlympiadBench, DeepScaleR and GSM8K with right and wrong
# completions (`python benchmarks/grading_speed.py --pool 1 2`, 2026-11-29, a 2-core Xeon: 852 answers x 5 rounds)
GRADING_ANSWERS_PER_S = 1000.0
# the paper's RLOO step replays every row's prompt and steps: forward and backward are 2 + 4 FLOPs per
# parameter and token; activation checkpointing runs the forward again
FLOPS_PER_PARAM_TOKEN = {False: 6.0, True: 8.0}


@dataclass(frozen=True)
class DecodeCurve:
    """Seconds per decode step of one GPU decoding ``rows`` rows at once: fixed + per_row x rows."""

    fixed_s: float
    per_row_s: float

    def step_s(self, rows: float) -> float:
        return self.fixed_s + self.per_row_s * max(1.0, rows)

    def scaled(self, factor: float) -> "DecodeCurve":
        return DecodeCurve(self.fixed_s * factor, self.per_row_s * factor)


def fit_curve(points: list[tuple[float, float]]) -> DecodeCurve:
    """A line through (rows, seconds per step) by least squares; one point (or one row count) is taken
    as flat in the rows (memory-bound: the safe side for fewer rows); a negative slope as flat too."""
    xs = sorted({r for r, _ in points})
    if len(xs) < 2:
        return DecodeCurve(statistics.fmean(s for _, s in points), 0.0)
    mx, my = statistics.fmean(r for r, _ in points), statistics.fmean(s for _, s in points)
    slope = sum((r - mx) * (s - my) for r, s in points) / sum((r - mx) ** 2 for r, _ in points)
    if slope <= 0:
        return DecodeCurve(my, 0.0)
    if my - slope * mx < 0:   # no step takes negative time: the line through the origin instead
        return DecodeCurve(0.0, sum(r * s for r, s in points) / sum(r * r for r, _ in points))
    return DecodeCurve(my - slope * mx, slope)


@dataclass(frozen=True)
class Throughput:
    """What one GPU does per second with one model (``parameters``), as a gpu-check measured it."""

    decode: dict                    # CoT mode -> DecodeCurve
    update: dict                    # mode -> parameter-tokens replayed per second per GPU
    update_checkpointing: bool      # the measured update recomputed activations
    loglik_rows: float              # multiple-choice rows scored per second (the NLL pass)
    save_s: float                   # a consolidated checkpoint of the model
    resume_save_s: float            # the resume state: the model and its sharded optimizer state
    parameters: float
    source: str
    update_fixed_s: float = 0.0     # seconds per micro-batch besides its FLOPs
    staging_GBps: float = STAGING_GBPS   # host copies of a save's state (the part that blocks the run)

    def stage_s(self, processes: int, optimizer: bool) -> float:
        """Seconds a save blocks its run: the consolidated float32 weights gathered to host memory on every
        process (4 bytes a parameter), and with ``optimizer`` each process's AdamW shard (8 bytes a parameter
        over the processes), at ``staging_GBps``; the files are written in the background (train.resume)."""
        staged = 4 * self.parameters + (8 * self.parameters / processes if optimizer else 0.0)
        return staged / (self.staging_GBps * 1e9)

    def scaled_to(self, parameters: float) -> "Throughput":
        f = parameters / self.parameters
        return replace(self, decode={m: c.scaled(f) for m, c in self.decode.items()},
                       loglik_rows=self.loglik_rows / f, save_s=self.save_s * f, resume_save_s=self.resume_save_s * f,
                       parameters=parameters)

    def decode_s(self, mode: str, rows: float) -> float:
        return self.decode[mode].step_s(rows)

    def update_s(self, mode: str, tokens: float, processes: int, checkpointing: bool, micro_batches: int = 0) -> float:
        """Seconds of an update replaying ``tokens`` over ``processes`` GPUs (data-parallel: FLOPs divide),
        each GPU running ``micro_batches`` micro-batches."""
        flops = FLOPS_PER_PARAM_TOKEN[checkpointing] / FLOPS_PER_PARAM_TOKEN[self.update_checkpointing]
        return tokens * self.parameters * flops / (self.update[mode] * processes) + micro_batches * self.update_fixed_s


def _decode_points(report: dict) -> dict[str, list[tuple[float, float]]]:
    """(rows, seconds per step) per CoT mode: the engine's and the evaluation's full-length runs (a
    training step's rows and an evaluation batch, the CoT length the jobs decode), and gpu-check's
    decode curve where it has one, each of its points less the admission and capture its short runs pay
    (the curve's step at the engine's rows minus the full-length run's, per setting)."""
    sec = report.get("sections") or {}
    points: dict[str, list[tuple[float, float]]] = {}
    engine = sec.get("engine") or {}
    full = {name: s["ms_per_step"] / 1e3 for name, s in (engine.get("settings") or {}).items()}
    rows = engine.get("rows")
    for name, seconds in full.items():
        points.setdefault(setting_mode(name), []).append((rows, seconds))
    for name, s in sec.get("evaluation", {}).get("settings", {}).items():
        points.setdefault(setting_mode(name), []).append((s["rows"], s["ms_per_step"] / 1e3))
    curve = engine.get("decode_curve") or []
    at_rows = next((c["ms_per_step"] for c in curve if c["rows"] == rows), {})
    for row in curve:
        for name, ms in row["ms_per_step"].items():
            if row["rows"] == rows or name not in at_rows or name not in full:
                continue
            points.setdefault(setting_mode(name), []).append((row["rows"], ms / 1e3 - (at_rows[name] / 1e3 - full[name])))
    return points


def update_measurements(report: dict) -> dict[str, tuple[float, float, int]]:
    """Per mode: (seconds of its last update, tokens it replayed, micro-batches per GPU) of a gpu-check report."""
    shape, sec = report["shape"], report.get("sections") or {}
    steps = shape["cot_max_tokens"] + PREFILL_TOKENS + shape["answer_max_tokens"]
    rows = shape["prompts_per_step"] * shape["samples_per_prompt"]
    out = {}
    for mode, m in ((sec.get("training") or {}).get("modes") or {}).items():
        if not m.get("steps"):
            continue
        last = m["steps"][-1]
        tokens = last.get("update_tokens") or rows * ((sec.get("engine") or {}).get("prompt_tokens", 0) + steps)
        micro = last.get("micro_batches") or -(-rows // (m.get("processes", 1) * shape["micro_batch_size"]))
        out[mode] = (last["seconds_update"], tokens, micro)
    return out


def micro_batch_cost(*reports: dict) -> float | None:
    """Seconds per micro-batch besides FLOPs: per mode measured at two micro-batch counts on one kind of
    GPU, (t_a - t_b) / (micro-batches_a - micro-batches_b) per token replayed alike, pooled; None where no
    mode was measured twice."""
    by_device: dict[str, list[dict]] = {}
    for r in reports:
        by_device.setdefault(r["device"]["name"], []).append(update_measurements(r))
    fits = []
    for measured in by_device.values():
        for mode in set().union(*measured):
            seen = [m[mode] for m in measured if mode in m]
            seen = {micro: seconds * seen[0][1] / tokens for seconds, tokens, micro in seen}
            if len(seen) >= 2:
                (ma, ta), (mb, tb) = sorted(seen.items())[:2]
                fits.append((tb - ta) / (mb - ma) if mb != ma else 0.0)
    return sum(fits) / len(fits) if fits else None


def missing_parts(report: dict) -> list[str]:
    """What a gpu-check report lacks of what the rates are fitted from (a run cut by its time limit, or a
    speed profile, which leaves the evaluation and the saves out): [] for a whole one."""
    sec = report.get("sections") or {}
    out = []
    if not (sec.get("engine") or {}).get("settings"):
        out.append("decode (engine section)")
    if "loglik" not in (sec.get("evaluation") or {}):
        out.append("the log-likelihood pass (evaluation section)")
    measured = update_measurements(report)
    out += [f"{mode} training" for mode in MODES if mode not in measured]
    if not any("seconds_save" in m for m in ((sec.get("training") or {}).get("modes") or {}).values()):
        out.append("checkpoint saves")
    if not report.get("complete", True):
        out.append(f"the rest of the run ({report.get('interrupted') or 'not marked complete'})")
    return out


def throughput_from_gpu_check(report: dict, source: str = "", earlier: dict | None = None,
                              fallback: "Throughput | None" = None) -> Throughput:
    """The rates a gpu-check report measured (engine, evaluation and training sections). What it lacks (a
    check stopped by its time limit, a speed profile) comes from ``earlier`` (a report of the same model)
    where that has it, else from ``fallback`` (DEFAULT, scaled to the report's model), and the source line
    names each borrowed part; the two reports together fit the update's cost per micro-batch where one kind
    of GPU measured a mode at two micro-batch counts. Never a KeyError on a partial file."""
    fallback = (fallback or DEFAULT).scaled_to(float(report["parameters"]))
    shape, sec = report["shape"], report.get("sections") or {}
    params = float(report["parameters"])
    reports = [report] + ([earlier] if earlier else [])
    fixed = micro_batch_cost(*reports) or 0.0
    update, borrowed, saves, staging = {}, [], [], []
    for r in reports:
        for mode, (seconds, tokens, micro) in update_measurements(r).items():
            if mode in update:
                continue
            update[mode] = tokens * params / max(seconds - micro * fixed, 1e-9)
            if r is not report:
                borrowed.append(f"{mode} training")
        for m in ((r.get("sections") or {}).get("training") or {}).get("modes", {}).values():
            if "seconds_save" in m:
                saves.append((m["seconds_save"], m.get("seconds_optimizer_round_trip", 0.0)))
            if m.get("seconds_save_blocking") and r is report:   # the staging of a weights-only save, measured
                staging.append(4 * float(r["parameters"]) / m["seconds_save_blocking"] / 1e9)
    from_default, twins = [], []
    for mode in MODES:   # soft and fuzzy replay through one code path: a mode not measured takes its twin's rate
        twin = next((m for m in CONTINUOUS_MODES if m in update), None) if mode in CONTINUOUS_MODES else None
        if mode not in update and twin is not None:
            update[mode] = update[twin]
            twins.append(f"{mode} training from {twin}'s")
        elif mode not in update:
            update[mode] = fallback.update[mode]
            from_default.append(f"{mode} training")
    staging_GBps = min(staging) if staging else fallback.staging_GBps
    if not staging:
        from_default.append("the staging of a save")
    if saves:
        save_s, resume_save_s = saves[0][0], saves[0][0] + saves[0][1] / 2
    else:
        save_s, resume_save_s = fallback.save_s, fallback.resume_save_s
        from_default.append("saves")
    loglik = (sec.get("evaluation") or {}).get("loglik")
    if loglik is None and earlier is not None:
        loglik = ((earlier.get("sections") or {}).get("evaluation") or {}).get("loglik")
        if loglik is not None:
            borrowed.append("the log-likelihood pass")
    if loglik is None:
        loglik_rows = fallback.loglik_rows
        from_default.append("the log-likelihood pass")
    else:
        loglik_rows = loglik["rows"] / loglik["seconds"]
    decode = {mode: fit_curve(p) for mode, p in _decode_points(report).items()}
    for mode in MODES:  # soft and fuzzy decode through one code path: a mode not measured takes its twin's line
        twin = next((m for m in CONTINUOUS_MODES if m in decode), None) if mode in CONTINUOUS_MODES else None
        if mode not in decode and twin is not None:
            decode[mode] = decode[twin]
        if mode not in decode:
            decode[mode] = fallback.decode[mode]
            from_default.append(f"{mode} decode")
    name = source or f"gpu-check {report['date'][:10]} on {report['device']['name']} ({report['model']}, " \
                     f"{report['compute_dtype']})"
    if borrowed:
        name += f"; {', '.join(sorted(borrowed))} from gpu-check {earlier['date'][:10]}"
    if twins:
        name += f"; {', '.join(twins)}"
    if from_default:
        name += f"; not measured there, from the default rates: {', '.join(from_default)}"
    if fixed:
        name += f"; {fixed:.3f} s per micro-batch"
    return Throughput(decode=decode, update=update,
                      update_checkpointing=bool(shape.get("activation_checkpointing", False)),
                      loglik_rows=loglik_rows, save_s=save_s, resume_save_s=resume_save_s, parameters=params,
                      source=name, update_fixed_s=fixed, staging_GBps=staging_GBps)


def with_update_from(rates: Throughput, report: dict, fixed_s: float | None = None) -> Throughput:
    """``rates`` with its update rates refit from a newer measurement of the update alone (``report``: a
    gpu-check training section, e.g. the fused-AdamW run at `auto`'s micro-batch), its device named; the cost
    of a micro-batch ``fixed_s`` (default: ``rates``') taken off before the FLOP rate. A mode whose update ran
    slower than a mode that replays more (soft and fuzzy replay the mixture hard does not) on the same shape
    takes that mode's rate: its first step paid what a run's later steps do not."""
    fixed = rates.update_fixed_s if fixed_s is None else fixed_s
    params = float(report["parameters"])
    measured = {mode: tokens * params / max(seconds - micro * fixed, 1e-9)
                for mode, (seconds, tokens, micro) in update_measurements(report).items()}
    update, notes = dict(rates.update), []
    for mode, rate in measured.items():
        update[mode] = rate
    slowest_continuous = min((measured[m] for m in CONTINUOUS_MODES if m in measured), default=None)
    if "hard" in measured and slowest_continuous is not None and measured["hard"] < slowest_continuous:
        update["hard"] = slowest_continuous
        notes.append("hard's update (slower than soft's on the same shape) at soft's rate")
    for mode in CONTINUOUS_MODES:   # one code path: a mode not measured takes its twin's
        if mode not in measured and any(m in measured for m in CONTINUOUS_MODES):
            update[mode] = next(measured[m] for m in CONTINUOUS_MODES if m in measured)
    micro = sorted({m for _, _, m in update_measurements(report).values()})
    size = report.get("shape", {}).get("micro_batch_size")
    source = (rates.source + f"; update refit from {report['device']['name']} {report['date'][:10]} "
              f"(micro-batch {size}, {micro} micro-batches, {report.get('optimizer', 'fused')} AdamW)"
              + (f"; {', '.join(notes)}" if notes else ""))
    return replace(rates, update=update, update_fixed_s=fixed, source=source)


# the newest H100 gpu-check, benchmarks/results/gpu_check_h100_2026-11-26.json (10c3a31), with the earlier one
# (gpu_check_h100.json, 2026-11-24) for hard training, which the newer did not finish, and for the cost of a
# micro-batch (both measured soft and fuzzy, at 8 and at 32 micro-batches a step); then the update alone refit
# (with_update_from) from the newest measurement at `auto`'s micro-batch: the H200 run of fused AdamW at
# micro-batch 16 (update_mb16_fused_adamw_h200_2026-11-26.json, 4.09 s for soft's update of 44,544 tokens), taken
# as an H100's until a gpu-check on one measures it (an H200's HBM is faster; the update is compute-bound, and
# the two share the chip). tests/test_forecast.py derives these numbers from the three files
DEFAULT_FILES = ("benchmarks/results/gpu_check_h100_2026-11-26.json", "benchmarks/results/gpu_check_h100.json",
                 "benchmarks/results/update_mb16_fused_adamw_h200_2026-11-26.json")
DEFAULT = Throughput(
    decode={"hard": DecodeCurve(0.0046532, 4.2606e-05), "soft": DecodeCurve(0.004474, 4.4751e-05),
            "fuzzy": DecodeCurve(0.0049292, 4.366e-05)},
    update={"soft": 4.9070e13, "fuzzy": 4.9070e13, "hard": 4.9070e13}, update_checkpointing=True,
    loglik_rows=50.794, save_s=20.6, resume_save_s=54.95, parameters=3212749824.0, update_fixed_s=0.2939,
    source="gpu-check 2026-11-26 on NVIDIA H100 80GB HBM3 (meta-llama/Llama-3.2-3B-Instruct, bfloat16): "
           "benchmarks/results/gpu_check_h100_2026-11-26.json; hard training from gpu-check 2026-11-24 "
           "(gpu_check_h100.json); 0.294 s per micro-batch; update refit from NVIDIA H200 2026-11-26 (micro-batch "
           "16, fused AdamW: update_mb16_fused_adamw_h200_2026-11-26.json); hard's update (slower than soft's on "
           "the same shape: its first step) at soft's rate")
