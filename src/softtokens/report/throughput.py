"""The rates a cost forecast reads (report.forecast), as gpu-check measures them on one GPU.

Why a model of rates rather than one tokens-per-second figure: a decode step reads every weight
whatever the rows it decodes, so its time is nearly flat in the rows up to the GPU's compute
(H100, Llama-3.2-3B: 9.4 ms a step at 64 rows, 15.9 ms at 192); dividing a rollout's time by the
job's GPUs, as if 8 rows per GPU took an eighth of 64, under-forecasts a training job several-fold.
An update is bound by its FLOPs (6 x parameters per token replayed, 8 with activation
checkpointing), which do divide over GPUs. So:

- decode: per CoT mode, seconds per step = fixed + per_row x rows (a line through gpu-check's
  steps at the row counts the grids use; the fixed part is reading the weights);
- update: per mode, parameter-tokens per second per GPU (tokens replayed x parameters / seconds),
  with whether the measurement recomputed activations;
- the log-likelihood pass: rows scored per second; saving a checkpoint and the resume state.

Decode and saves scale with the parameter count (bytes read and written), the update rate does not
(it is per FLOP): ``scaled_to`` moves a measurement to another model.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from softtokens.run.names import CONTINUOUS_MODES, MODES, setting_mode

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

    def scaled_to(self, parameters: float) -> "Throughput":
        f = parameters / self.parameters
        return replace(self, decode={m: c.scaled(f) for m, c in self.decode.items()},
                       loglik_rows=self.loglik_rows / f, save_s=self.save_s * f, resume_save_s=self.resume_save_s * f,
                       parameters=parameters)

    def decode_s(self, mode: str, rows: float) -> float:
        return self.decode[mode].step_s(rows)

    def update_s(self, mode: str, tokens: float, processes: int, checkpointing: bool) -> float:
        """Seconds of an update replaying ``tokens`` over ``processes`` GPUs (data-parallel: FLOPs divide)."""
        flops = FLOPS_PER_PARAM_TOKEN[checkpointing] / FLOPS_PER_PARAM_TOKEN[self.update_checkpointing]
        return tokens * self.parameters * flops / (self.update[mode] * processes)


def _decode_points(report: dict) -> dict[str, list[tuple[float, float]]]:
    """(rows, seconds per step) per CoT mode: gpu-check's decode curve when it has one, else the
    engine section's steps (a training step's rows) and the evaluation section's (its batch)."""
    sec = report["sections"]
    points: dict[str, list[tuple[float, float]]] = {}
    curve = sec["engine"].get("decode_curve")
    if curve:
        for row in curve:
            for name, ms in row["ms_per_step"].items():
                points.setdefault(setting_mode(name), []).append((row["rows"], ms / 1e3))
        return points
    rows = sec["engine"]["rows"]
    for name, s in sec["engine"]["settings"].items():
        points.setdefault(setting_mode(name), []).append((rows, s["ms_per_step"] / 1e3))
    for name, s in sec["evaluation"]["settings"].items():
        points.setdefault(setting_mode(name), []).append((s["rows"], s["ms_per_step"] / 1e3))
    return points


def throughput_from_gpu_check(report: dict, source: str = "") -> Throughput:
    """The rates a gpu-check report measured (engine, evaluation and training sections)."""
    from softtokens.train.plan import PREFILL_TOKENS

    shape, sec = report["shape"], report["sections"]
    params = float(report["parameters"])
    steps = shape["cot_max_tokens"] + PREFILL_TOKENS + shape["answer_max_tokens"]
    rows = shape["prompts_per_step"] * shape["samples_per_prompt"]
    prompt = sec["engine"]["prompt_tokens"]
    update, saves = {}, []
    for mode, m in sec["training"]["modes"].items():
        last = m["steps"][-1]
        tokens = last.get("update_tokens", rows * (prompt + steps))
        update[mode] = tokens * params / last["seconds_update"]
        if "seconds_save" in m:
            saves.append((m["seconds_save"], m.get("seconds_optimizer_round_trip", 0.0)))
    save_s, round_trip = saves[0] if saves else (0.0, 0.0)
    ev = sec["evaluation"]
    decode = {mode: fit_curve(p) for mode, p in _decode_points(report).items()}
    for mode in MODES:  # soft and fuzzy decode through one code path: a mode not measured takes its twin's line
        twin = next((m for m in CONTINUOUS_MODES if m in decode), None) if mode in CONTINUOUS_MODES else None
        if mode not in decode and twin is not None:
            decode[mode] = decode[twin]
    return Throughput(decode=decode, update=update,
                      update_checkpointing=bool(shape.get("activation_checkpointing", False)),
                      loglik_rows=ev["loglik"]["rows"] / ev["loglik"]["seconds"], save_s=save_s,
                      resume_save_s=save_s + round_trip / 2, parameters=params,
                      source=source or f"gpu-check {report['date'][:10]} on {report['device']['name']} "
                                       f"({report['model']}, {report['compute_dtype']})")


# benchmarks/results/gpu_check_h100.json (tests/test_forecast.py derives these from the file): decode
# lines through its 64-row (a training step) and 192-row (an evaluation batch) steps, per CoT mode
DEFAULT = Throughput(
    decode={"hard": DecodeCurve(0.0063005, 5.2586e-05), "soft": DecodeCurve(0.0062247, 5.741e-05),
            "fuzzy": DecodeCurve(0.006322, 5.5594e-05)},
    update={"soft": 1.287e13, "fuzzy": 1.7145e13, "hard": 2.5073e13}, update_checkpointing=True,
    loglik_rows=10.92, save_s=21.7, resume_save_s=51.65, parameters=3212749824.0,
    source="gpu-check 2026-11-24 on NVIDIA H100 80GB HBM3 (meta-llama/Llama-3.2-3B-Instruct, bfloat16): "
           "benchmarks/results/gpu_check_h100.json")
