"""Figure 1's caption, the whole sentence: soft/fuzzy training with hard inference is universally
best, matching hard training at pass@1 and surpassing it at pass@32. Like for like, as the
inference claims (verdict.claims.inference): each soft- or fuzzy-trained model's hard setting against
its own soft and fuzzy setting of the same decoding, and against hard training's same setting."""

from softtokens.config.names import setting_name
from softtokens.verdict.choices import EVERY, POINTS
from softtokens.verdict.claims.define import ClaimDef
from softtokens.verdict.claims.inference import like_for_like
from softtokens.verdict.judging import (
    CONTINUOUS,
    MORE,
    NOT_WORSE,
    PartPlan,
    cell,
    compare,
    fmt,
    groups,
    quote,
)


def plan(idx, ctx):
    parts = []
    for metric, decoding in (("pass@1", "greedy"), (ctx.metric, "sample")):
        if metric is None:
            continue
        hard_setting = setting_name("hard", decoding)
        best = like_for_like(idx, CONTINUOUS, metric, (decoding,))   # its hard inference against its soft and fuzzy
        against_hard = []
        for model, ds, bench in groups(idx):
            hard_trained = cell(idx, model, ds, "hard", bench, hard_setting, metric)
            for mode in CONTINUOUS:
                mine = cell(idx, model, ds, mode, bench, hard_setting, metric)
                where = f"{metric}, {model} on {ds}, {bench}: {mode} training {hard_setting} {fmt(mine)}"
                rule = NOT_WORSE if metric == "pass@1" else MORE
                against_hard.append(compare(f"{where} vs hard training's {fmt(hard_trained)}", mine, hard_trained, rule))
        parts += [PartPlan(f"{metric}: best among inference settings", EVERY, best),
                  PartPlan(f"{metric}: {'matching' if metric == 'pass@1' else 'surpassing'} hard training", EVERY,
                           tuple(against_hard))]
    return parts


CLAIM = ClaimDef(
    "continuous_training_hard_inference_best", 50,
    "Soft/fuzzy training with hard inference is the best combination everywhere.",
    (quote("the combination of soft/fuzzy training and hard inference performs universally best, matching hard "
           "training at pass@1 and surpassing it at pass@32", "Figure 1 caption", 166),),
    "The whole sentence, per model, training set and benchmark, for soft and for fuzzy training ('universally': "
    "every comparison of every part). Best: the training's hard setting not below its soft or fuzzy setting of the "
    "same decoding by more than {margin} {unit} (greedy at pass@1, sample at {metric}). Matching hard training at "
    "pass@1: its hard-greedy pass@1 not below hard training's by more than {margin} ('matching' in a sentence that "
    "claims 'best': a pass@1 far above hard training's does not contradict it, so one-sided). Surpassing at {metric} (the grid's largest "
    "k; the paper's pass@32): its hard-sample {metric} above hard training's (one-sided test).",
    plan, margin=POINTS)
