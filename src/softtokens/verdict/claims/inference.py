"""Hard inference against soft and fuzzy inference, one rule for the paragraph's two halves
(tex lines 544-546): 'hard inference generally performs best' and 'we do not confirm previously
reported benefits of soft inference on hard training' (also the introduction's line 187).

Like for like: each hard setting against the soft and the fuzzy setting of the same decoding
(greedy against greedy, sample against sample) of the same trained model, so no side is the best
of several settings (hard's best of two against the best of four others would favour the four).
Both read 'hard is not worse than the other by more than the margin' (non-inferiority)."""

from softtokens.config.names import DECODINGS, setting_name
from softtokens.verdict.choices import EVERY, GENERALLY, POINTS
from softtokens.verdict.claims.define import ClaimDef
from softtokens.verdict.judging import (
    CONTINUOUS,
    NOT_WORSE,
    TRAINED,
    PartPlan,
    cell,
    compare,
    fmt,
    groups,
    quote,
)


def like_for_like(idx, trainings, metric: str, decodings=DECODINGS):
    """Per trained model, benchmark and decoding: the hard setting against each soft / fuzzy one."""
    out = []
    for model, ds, bench in groups(idx, modes=trainings):
        for mode in trainings:
            for decoding in decodings:
                hard = cell(idx, model, ds, mode, bench, setting_name("hard", decoding), metric)
                for other in CONTINUOUS:
                    o = cell(idx, model, ds, mode, bench, setting_name(other, decoding), metric)
                    out.append(compare(f"{metric}, {model} trained {mode} on {ds}, {bench}: hard_{decoding} "
                                       f"{fmt(hard)} vs {other}_{decoding} {fmt(o)}", hard, o, NOT_WORSE))
    return tuple(out)


def parts(idx, ctx, trainings, quantifier):
    out = [PartPlan("pass@1", quantifier, like_for_like(idx, trainings, "pass@1"))]
    if ctx.metric:
        out.append(PartPlan(ctx.metric, quantifier, like_for_like(idx, trainings, ctx.metric, ("sample",))))
    return out


RULE = ("'{rule}': per trained model ({trainings}), training set, benchmark and decoding, the hard setting "
        "against the soft and the fuzzy setting of the same decoding, at pass@1 (greedy and sample) and at {{metric}} "
        "(sample): hard not below the other by more than {{margin}} {{unit}} (the interval's lower end above "
        "-{{margin}}). The paragraph's two halves read by this one rule. {quantifier}")

HARD_INFERENCE_BEST = ClaimDef(
    "hard_inference_best", 30, "Hard inference is best for every training method, at pass@1 and pass@k.",
    (quote("For all training methods (hard, soft or fuzzy), hard inference generally performs best, both for "
           "pass@1 and pass@32", "Section 4, Results", 544),),
    RULE.format(rule="performs best", trainings="hard, soft, fuzzy",
                quantifier="'Generally': at least two thirds of the comparisons, at pass@1 and at {metric} each."),
    lambda idx, ctx: parts(idx, ctx, TRAINED, GENERALLY), margin=POINTS)

NO_SOFT_INFERENCE_GAIN = ClaimDef(
    "no_soft_inference_gain", 40, "Soft or fuzzy inference brings no benefit to a hard-trained model.",
    (quote("adding continuous CoT at inference on top of a hard-token-finetuned model does not bring benefits",
           "Introduction, contributions", 187),
     quote("we do not confirm previously reported benefits of soft inference on hard (normal) training",
           "Section 4, Results", 545)),
    RULE.format(rule="does not bring benefits", trainings="hard training only",
                quantifier="Unqualified: every comparison."),
    lambda idx, ctx: parts(idx, ctx, ("hard",), EVERY), margin=POINTS)

CLAIMS = (HARD_INFERENCE_BEST, NO_SOFT_INFERENCE_GAIN)
