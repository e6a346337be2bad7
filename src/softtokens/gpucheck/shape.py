"""What a gpu-check measures at which sizes (the paper grid's, or ``--smoke``'s), its pass bounds, and
the report it fills."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

PAPER_MODEL, PAPER_DATASET = "llama-3b", "math"   # the paper grid's cell this checks
TIE_THRESHOLD_SCALE = 6.0   # |cos| of fresh noise vectors in d dims is ~sqrt(2 / (pi d)); frozen noise gives ~1


PLAN_TOLERANCE = 0.15        # measured peak memory within 15 % of `softtokens plan`'s estimate


MOVED_MIN = 0.99             # share of float32 master entries an AdamW step must change


# Random weights give nearly flat next-token distributions (entropy ~11 nats over 128k tokens), where
# every step is a near tie that bf16 noise flips. A trained model's are peaked. The final norm's weight
# is scaled so the next-token entropy after a prompt is this (the scale and both entropies go in the
# JSON); shapes, bytes and timings do not change, only how often a replay meets a near tie.
TARGET_ENTROPY = 1.0  # nats


# the tiny model of --smoke: Llama-3's shape in miniature (grouped-query attention, tied embeddings)
SMOKE_ARCHITECTURE = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
                      "rope_theta": 500000.0, "max_position_embeddings": 2048}


SMOKE_SIZES = {"prompts_per_step": 2, "samples_per_prompt": 4, "cot_max_tokens": 8, "answer_max_tokens": 4,
               "micro_batch_size": 4}

# rows one GPU decodes at once in the paper grid's jobs: a training step's B·G/P (64 rows over 8, 4, 2 or 1
# GPUs), a validation's share, an evaluation's batch; the forecast reads a line through them (rates.throughput)
DECODE_ROWS = (8, 16, 32, 64, 192)
SMOKE_DECODE_ROWS = (2, 4)
DECODE_CURVE_COT = 64   # CoT steps per measurement: long enough to amortise admission, short enough to repeat


@dataclass(frozen=True)
class CheckShape:
    """What the check runs: the paper cell's settings, or --smoke's cut sizes of the same."""

    source: str                 # the architecture: a hub id whose config.json ships with the package, or "smoke"
    rl: dict                    # the training cell's resolved rl settings (TrainConfig keys)
    lr: float
    eval_batch: int
    eval_cot: int
    eval_answer: int
    loglik_batch: int
    train_steps: int
    modes: tuple[str, ...]
    repeats: int

    @property
    def rows(self) -> int:
        return self.rl["prompts_per_step"] * self.rl["samples_per_prompt"]


def check_shape(config: dict, smoke: bool, modes: tuple[str, ...], steps: int | None, repeats: int | None,
                eval_cot: int | None = None) -> CheckShape:
    """The paper grid's llama-3b x math cell and its evaluation, from config.yaml (one home for
    the paper's numbers); --smoke keeps every setting but the sizes."""
    from softtokens.config.grids import cell_rl
    from softtokens.sizing.plan import resolve_memory

    grid = config["grids"]["paper"]
    # the check trains on this one GPU: `auto` memory settings are chosen for one process
    one_gpu = {**config, "grids": {**config["grids"], "paper": {**grid, "models": {
        **grid["models"], PAPER_MODEL: {**grid["models"][PAPER_MODEL], "train_gpus": 1}}}}}
    rl = resolve_memory(one_gpu, "paper", PAPER_MODEL, dict(cell_rl(config, "paper", PAPER_MODEL, PAPER_DATASET)))
    ev = grid["evaluation"]
    model = grid["models"][PAPER_MODEL]
    if smoke:
        rl.update(SMOKE_SIZES)
        return CheckShape("smoke", rl, model["lr"], eval_batch=6, eval_cot=eval_cot or 8, eval_answer=4,
                          loglik_batch=4, train_steps=steps or 2, modes=modes, repeats=repeats or 1)
    return CheckShape(model["source"], rl, model["lr"], eval_batch=int(ev.get("batch_size", 64)),
                      eval_cot=eval_cot or int(ev["cot_max_tokens"]), eval_answer=int(ev["answer_max_tokens"]),
                      loglik_batch=int(ev.get("loglik_batch_size", 32)), train_steps=steps or 2, modes=modes,
                      repeats=repeats or 2)


# ---------------------------------------------------------------- results
@dataclass
class Report:
    """Every check's outcome and every measurement, written after each section."""

    out: Path
    meta: dict
    checks: list[dict] = field(default_factory=list)
    sections: dict = field(default_factory=dict)

    def check(self, section: str, name: str, passed: bool | None, value=None, expected=None, detail: str = "") -> bool:
        """passed None: not applicable here (e.g. CUDA graphs on a CPU); not counted."""
        self.checks.append({"section": section, "check": name, "passed": passed, "value": plain(value),
                            "expected": expected, "detail": detail})
        mark = {True: "ok  ", False: "FAIL", None: "n/a "}[passed]
        print(f"[gpu-check] {mark} {section}: {name}: {plain(value)}" + (f" ({expected})" if expected else ""),
              flush=True)
        return bool(passed)

    @property
    def passed(self) -> bool:
        """Every check that applies passed, and at least one check applied: a run that checked nothing
        (no section, or only checks that do not apply here) has passed nothing."""
        applied = [c for c in self.checks if c["passed"] is not None]
        return bool(applied) and all(c["passed"] for c in applied)

    def write(self) -> None:
        """gpu_check.json and .md, each written whole and renamed into place (store.files): a run cut at any
        second leaves a valid file of everything measured so far, ``complete`` false until the end."""
        from softtokens.store.files import write_json, write_text

        self.out.mkdir(parents=True, exist_ok=True)
        failed = [f"{c['section']}: {c['check']}" for c in self.checks if c["passed"] is False]
        write_json(self.out / "gpu_check.json", {"complete": False, **self.meta, "passed": self.passed,
                                                 "failed": failed, "checks": self.checks, "sections": self.sections})
        write_text(self.out / "gpu_check.md", self.summary())

    def summary(self) -> str:
        m = self.meta
        applied = sum(c["passed"] is not None for c in self.checks)
        verdict = "PASSED" if self.passed else ("FAILED: no check applied" if not applied else "FAILED")
        if not m.get("complete", False):
            verdict += " (incomplete: " + (m.get("interrupted") or "still running, or cut") + ")"
        lines = [f"# gpu-check: {verdict}", "",
                 f"{m['device']['name']} · torch {m['torch']} (CUDA {m['cuda']}) · transformers {m['transformers']} · "
                 f"{m['model']} ({m['parameters'] / 1e9:.3g}B parameters, {m['compute_dtype']}) · {m['date']}", ""]
        eng = self.sections.get("engine", {}).get("settings", {})
        if eng:
            lines += ["| setting | ms / decode step | bound (ms) | × bound | CUDA graph |", "|---|---|---|---|---|"]
            lines += [f"| {k} | {v['ms_per_step']} | {v['bound_ms_per_step']} | {v['ratio_to_bound']} | "
                      f"{v['graph']} |" for k, v in eng.items()]
            lines.append("")
        for mode, t in self.sections.get("training", {}).get("modes", {}).items():
            steps = t.get("steps", [])
            if steps:
                last = steps[-1]
                lines.append(f"- training {mode}: step {last['seconds_step']} s (rollout {last['seconds_rollout']}, "
                             f"reward {last['seconds_reward']}, update {last['seconds_update']}); peak "
                             f"{t.get('memory', {}).get('measured_peak_GB')} GB, plan "
                             f"{t.get('memory', {}).get('planned_peak_GB')} GB")
        lines += ["", "| section | check | result | value | expected |", "|---|---|---|---|---|"]
        for c in self.checks:
            result = {True: "ok", False: "**FAIL**", None: "n/a"}[c["passed"]]
            lines.append(f"| {c['section']} | {c['check']} | {result} | {c['value']} | {c['expected'] or ''} |")
        return "\n".join(lines) + "\n"


def plain(v):
    if isinstance(v, float):
        return round(v, 6) if math.isfinite(v) else str(v)
    if isinstance(v, torch.Tensor):
        return plain(v.item()) if v.numel() == 1 else v.tolist()
    return v
