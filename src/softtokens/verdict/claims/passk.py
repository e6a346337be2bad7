"""Pass@k gains: soft and fuzzy training beat hard training at pass@k, on average."""

from softtokens.verdict.choices import AVERAGE
from softtokens.verdict.claims.define import ClaimDef
from softtokens.verdict.judging import (
    CONTINUOUS,
    MORE,
    PartPlan,
    average,
    cell,
    fmt,
    groups,
    quote,
)


def plan(idx, ctx):
    if ctx.metric is None:
        return []
    parts = []
    for mode in CONTINUOUS:
        pairs, lines = [], []
        for model, ds, bench in groups(idx):
            hard = cell(idx, model, ds, "hard", bench, "hard_sample", ctx.metric)
            r = cell(idx, model, ds, mode, bench, "hard_sample", ctx.metric)
            pairs.append((r, hard))
            lines.append(f"{model} trained on {ds}, {bench}: {mode} {fmt(r)} vs hard {fmt(hard)}")
        comparisons = (average(f"{mode}: mean difference over {len(pairs)} comparisons ("
                               + "; ".join(lines) + ")", pairs, MORE),) if pairs else ()
        parts.append(PartPlan(mode, AVERAGE, comparisons))
    return parts


CLAIM = ClaimDef(
    "passk_advantage", 20, "Soft and fuzzy training beat hard training at pass@k on average ({metric}).",
    (quote("Under sampling (pass@32), continuous CoT training outperforms discrete CoT on average",
           "Introduction, contributions", 181),
     quote("soft and fuzzy training have a clear overall advantage for pass@32 over hard training",
           "Section 4, Results", 539)),
    "'On average', 'clear overall advantage': the mean over every model, training set and benchmark of (soft - "
    "hard) hard-sample {metric} is above 0 (one-sided test); the same for fuzzy. Both must hold. ({metric} is the "
    "grid's largest k; the paper's is pass@32.)",
    plan)
