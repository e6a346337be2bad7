"""Pass@1 parity: soft and fuzzy training match hard training at greedy pass@1 (two sentences,
one part each: each keeps its own quantifier and unit of count). 'Competitive with' is one-sided: a
continuous training far ahead of hard training does not count against it (judging.COMPETITIVE; the
two-sided reading is one of the multiverse's choices)."""

from softtokens.verdict.choices import GENERALLY, MOST, POINTS
from softtokens.verdict.claims.define import ClaimDef
from softtokens.verdict.judging import COMPETITIVE, PartPlan, groups, quote, similar_to_hard


def plan(idx, ctx):
    comparisons, units = similar_to_hard(idx, groups(idx), "pass@1", COMPETITIVE)
    return [PartPlan("most model-dataset combinations (line 179)", MOST, tuple(comparisons), tuple(units),
                     "model-dataset combination"),
            PartPlan("generally (line 536)", GENERALLY, tuple(comparisons))]


CLAIM = ClaimDef(
    "pass1_parity", 10, "Soft and fuzzy training match hard training at greedy pass@1.",
    (quote("competitive with traditional discrete-token CoTs for pass@1 criteria, with a statistically "
           "similar performance on most model-dataset combinations", "Introduction, contributions", 179),
     quote("the three training schemes are broadly comparable, generally achieving similar greedy pass@1 "
           "performance", "Section 4, Results", 536)),
    "Per model, training set and benchmark, soft (and fuzzy) training's hard-greedy pass@1 against hard "
    "training's: 'competitive', 'broadly comparable' = not below hard training's by more than {margin} {unit} (the "
    "difference's interval above -{margin}: one-sided, so a continuous training far ahead does not count against "
    "it; read two-sided, inside ±{margin}, in the multiverse). Line 179: "
    "'most model-dataset combinations' = more than half of the (model, training set) combinations, a combination "
    "similar when all its comparisons are. Line 536: 'generally' = at least two thirds of the comparisons. Both.",
    plan, margin=POINTS)
