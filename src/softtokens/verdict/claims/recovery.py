"""Llama-8B trained on GSM8K: hard training collapses on MATH-500, soft and fuzzy training recover
it and keep GSM8K (only the paper grid has these cells)."""

from softtokens.verdict.choices import EVERY, POINTS
from softtokens.verdict.claims.define import ClaimDef
from softtokens.verdict.judging import (
    CONTINUOUS,
    LESS,
    NOT_WORSE,
    PartPlan,
    cell,
    compare,
    fmt,
    quote,
)

MODEL, TRAINED_ON, OTHER = "llama-8b", "gsm8k", "math500"


def plan(idx, ctx):
    metric = ctx.metric or "pass@32"
    checks = {"hard below the base on MATH-500": [], "soft and fuzzy recover on MATH-500": [],
              "soft and fuzzy maintain GSM8K": []}
    for bench, setting, m in ((OTHER, "hard_greedy", "pass@1"), (OTHER, "hard_sample", metric),
                              (TRAINED_ON, "hard_greedy", "pass@1")):
        base = cell(idx, MODEL, "none", "none", bench, setting, m)
        for mode in (("hard", *CONTINUOUS) if bench == OTHER else CONTINUOUS):
            r = cell(idx, MODEL, TRAINED_ON, mode, bench, setting, m)
            part = ("hard below the base on MATH-500" if mode == "hard" else
                    "soft and fuzzy recover on MATH-500" if bench == OTHER else "soft and fuzzy maintain GSM8K")
            checks[part].append(compare(f"{bench} {setting} {m}: {mode} {fmt(r)} vs base {fmt(base)}", r, base,
                                        LESS if mode == "hard" else NOT_WORSE))
    # a cell of the eight that is missing (or has no spread) leaves its check undecided, named; none of them
    # there at all: not measured (only the paper grid has these cells)
    return [PartPlan(name, EVERY, tuple(c)) for name, c in checks.items()]


CLAIM = ClaimDef(
    "llama8b_math500_recovery", 90,
    "Llama-8B trained on GSM8K: hard training degrades MATH-500, soft and fuzzy recover it.",
    (quote("when training Llama-8B-Instruct on GSM8K and testing on MATH-500, only fuzzy and soft-trained models "
           "achieve good scores", "Section 4, Results", 606),
     quote("gsm8k-fuzzy and gsm8k-soft trainings recover to 44.6–44.7% greedy and 83.1–83.9% pass@32 while "
           "maintaining in-distribution performance on GSM8K", "Section 4, Results", 610)),
    "Llama-3.1-8B trained on GSM8K, on MATH-500 (hard greedy pass@1 and hard sample {metric}): hard training below "
    "the base (one-sided test); soft and fuzzy not below the base by more than {margin} {unit} (recover); on GSM8K "
    "soft and fuzzy greedy pass@1 not below the base by more than {margin} (maintained). Every check, all eight "
    "cells present. Only the paper grid has these cells.",
    plan, margin=POINTS)
