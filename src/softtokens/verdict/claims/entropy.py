"""The entropy profile: soft and fuzzy training keep the base model's CoT entropy; hard training
lowers the hard-sample entropy to the base's greedy level. The paper shows profiles as figures
only, so only our numbers can judge it (a ratio rule, no standard error: docs/protocol.md)."""

import math

from softtokens.verdict.choices import EVERY
from softtokens.verdict.claims.define import ClaimDef
from softtokens.verdict.judging import (
    CONTINUOUS,
    FIXED,
    HARD_SETTINGS,
    TRAINED,
    Comparison,
    PartPlan,
    quote,
)

# "roughly the same entropy profile": mean CoT entropy within this factor of the base's
ENTROPY_FACTOR = 1.5


def plan(idx, ctx):
    if ctx.entropy is None:
        return None
    if ctx.entropy.empty:
        return []
    means = ctx.entropy.groupby(["model", "train_dataset", "train_mode", "benchmark", "setting"])["entropy"].mean()
    checks = []
    for (model, ds, mode, bench, setting), h in means.items():
        if mode not in TRAINED:
            continue
        base = means.get((model, "none", "none", bench, setting))
        if base is None or base <= 0:
            continue
        if mode in CONTINUOUS and setting in HARD_SETTINGS:
            ratio = h / base
            checks.append(Comparison(f"{model} trained {mode} on {ds}, {bench} {setting}: mean entropy {h:.3f} vs "
                                     f"base {base:.3f} (ratio {ratio:.2f})", (), FIXED,
                                     holds=1 / ENTROPY_FACTOR <= ratio <= ENTROPY_FACTOR))
        elif mode == "hard" and setting == "hard_sample":
            greedy = means.get((model, "none", "none", bench, "hard_greedy"))
            if greedy is None or greedy <= 0:
                continue
            lower = h < base / ENTROPY_FACTOR
            nearer = abs(math.log(h / greedy)) < abs(math.log(h / base))
            checks.append(Comparison(f"{model} trained hard on {ds}, {bench} hard_sample: mean entropy {h:.3f} vs "
                                     f"base hard_sample {base:.3f}, base hard_greedy {greedy:.3f}", (), FIXED,
                                     holds=lower and nearer))
    return [PartPlan("entropy", EVERY, tuple(checks))]


CLAIM = ClaimDef(
    "entropy_profile", 100,
    "Soft and fuzzy training keep the base model's CoT entropy; hard training lowers the hard-sample entropy to the "
    "base's greedy level.",
    (quote("soft or fuzzy training keep roughly the same entropy profile as the base model, whether inference is "
           "greedy or sampled", "Section 4, Entropy behavior", 695),
     quote("hard training changes the hard sampling entropy profile to resemble greedy sampling on the base model: "
           "entropy values are substantially lower", "Section 4, Entropy behavior", 695)),
    f"On the mean CoT entropy (over positions, weighted by how many CoTs reach each) of every model, training set and "
    f"benchmark: 'roughly the same' = within a factor {ENTROPY_FACTOR:g} of the base model's, for soft and fuzzy "
    f"training under hard greedy and hard sample; 'substantially lower' and 'resemble greedy sampling on the base' = "
    f"hard training's hard-sample entropy is below the base's hard-sample entropy by more than that factor and nearer "
    f"(in ratio) to the base's hard-greedy entropy. Unqualified: every comparison. The paper shows profiles as "
    f"figures only, so its own numbers cannot judge this claim.",
    plan)
