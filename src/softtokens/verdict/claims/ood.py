"""Out-of-domain robustness (the out-of-domain table): comparable success rates, a lower NLL of the
correct answer than hard training, and the base model's NLL preserved."""

from softtokens.verdict.choices import AVERAGE, EVERY, NLL, POINTS
from softtokens.verdict.claims.define import ClaimDef
from softtokens.verdict.judging import (
    COMPETITIVE,
    CONTINUOUS,
    LESS,
    MORE,
    TRAINED,
    PartPlan,
    average,
    nll_pairs,
    ood_groups,
    quote,
    similar_to_hard,
)


def plan_accuracy(idx, ctx):
    comparisons, _ = similar_to_hard(idx, ood_groups(idx, "accuracy"), "accuracy")
    return [PartPlan("accuracy", EVERY, tuple(comparisons))]


def _average(label, pairs, rule):
    lines = "; ".join(line.strip() for _, _, line in pairs)
    return (average(f"{label} over {len(pairs)} comparisons ({lines})", [(r, ref) for r, ref, _ in pairs], rule),)


def plan_lower(idx, ctx):
    return [PartPlan(mode, AVERAGE, _average(f"{mode}: mean NLL difference from hard", pairs, LESS) if pairs else ())
            for mode in CONTINUOUS for pairs in [nll_pairs(idx, mode, "hard")]]


def plan_preserved(idx, ctx):
    parts = []
    for mode in TRAINED:
        pairs = nll_pairs(idx, mode, "base")
        if mode == "hard":
            comparisons = _average("hard degrades: mean NLL change from the base", pairs, MORE) if pairs else ()
            parts.append(PartPlan("hard degrades", AVERAGE, comparisons))
            continue
        # 'does not degrade' (line 182) is one-sided: the base's NLL minus the training's not below -margin (a lower
        # NLL than the base's does not count against it); read two-sided in the multiverse (judging.COMPETITIVE)
        flipped = [(ref, r, line) for r, ref, line in pairs]
        comparisons = (_average(f"{mode} preserves: mean NLL of the base minus {mode}'s", flipped, COMPETITIVE)
                       if pairs else ())
        parts.append(PartPlan(f"{mode} preserves", AVERAGE, comparisons))
    return parts


ACCURACY = ClaimDef(
    "ood_accuracy_comparable", 60, "Out-of-domain success rates are comparable for the three trainings.",
    (quote("The results show comparable success rate for the three training methods (hard, fuzzy, soft).",
           "Section 4, Out-of-domain robustness", 671),),
    "Per model, training set and out-of-domain benchmark, soft (and fuzzy) training's accuracy against hard "
    "training's: 'comparable' = the difference's interval inside ±{margin} {unit}. Unqualified: every comparison.",
    plan_accuracy, margin=POINTS)

NLL_LOWER = ClaimDef(
    "ood_nll_lower_than_hard", 70, "Soft and fuzzy training leave a lower out-of-domain NLL than hard training.",
    (quote("fuzzy and soft training on average result in lower negative log-likelihood of the correct answer "
           "compared to hard training", "Out-of-domain table caption", 668),),
    "'On average': the mean over every model, training set and out-of-domain benchmark of (soft - hard) NLL of the "
    "correct answer is below 0 (one-sided test); the same for fuzzy. Both must hold.",
    plan_lower)

NLL_PRESERVED = ClaimDef(
    "ood_nll_preserved", 80, "Hard training degrades the out-of-domain NLL; soft and fuzzy training preserve it.",
    (quote("Continuous CoT training does not degrade the base model's log-likelihood on HellaSwag, ARC and MMLU, "
           "whereas discrete CoT training does, on average.", "Introduction, contributions", 182),
     quote("hard training degrades the base model NLL on out-of-domain datasets, while fuzzy and soft training "
           "preserve it", "Section 4, Out-of-domain robustness", 674)),
    "'On average', over every model, training set and out-of-domain benchmark: the mean of (hard - base) NLL of the "
    "correct answer is above 0 (degrades: one-sided test); the mean of (base - soft), and of (base - fuzzy), is not "
    "below -{margin} {unit} ('does not degrade', 'preserve': soft's NLL not above the base's by more than the margin, "
    "one-sided; read two-sided, within ±{margin}, in the multiverse). All three. A base model enters one comparison "
    "per training set: its variance is counted once, with its summed weight.",
    plan_preserved, margin=NLL)

CLAIMS = (ACCURACY, NLL_LOWER, NLL_PRESERVED)
