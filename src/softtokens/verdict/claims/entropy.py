"""The entropy profile: soft and fuzzy training keep the base model's CoT entropy; hard training
lowers the hard-sample entropy to the base's greedy level. The paper shows profiles as figures only,
so only our numbers can judge it.

Judged as every claim of sameness is, through the same interface: its statistic is each evaluation's
mean CoT entropy (cells.lookup.entropy_cells: the log, averaged over seeds, so a difference is a log
ratio), its margin a declared kind (verdict.choices.RATIO: a factor of 1.5) that `judging.margins.
entropy_profile` overrides, its comparisons two one-sided tests with the seeds' spread. The files keep
no per-question entropies, so no test-set term enters (stated in the rule); one seed is no spread,
and such a comparison counts as undecided."""

from softtokens.cells.lookup import ENTROPY_METRIC
from softtokens.verdict.choices import EVERY, RATIO
from softtokens.verdict.claims.define import ClaimDef
from softtokens.verdict.judging import CONTINUOUS, HARD_SETTINGS, LESS, SAME, PartPlan, cell, compare, quote


def plan(idx, ctx):
    if ctx.entropy is None:
        return None
    groups = sorted({(k[0], k[1], k[4]) for k in idx if k[6] == ENTROPY_METRIC and k[2] != "none"})
    keep, lower, greedy_level = [], [], []
    for model, ds, bench in groups:
        base = {s: cell(idx, model, "none", "none", bench, s, ENTROPY_METRIC) for s in HARD_SETTINGS}
        for mode in CONTINUOUS:
            for setting in HARD_SETTINGS:
                r = cell(idx, model, ds, mode, bench, setting, ENTROPY_METRIC)
                keep.append(compare(f"{model} trained {mode} on {ds}, {bench} {setting}: log entropy {_e(r)} vs base "
                                    f"{_e(base[setting])}", r, base[setting], SAME))
        hard = cell(idx, model, ds, "hard", bench, "hard_sample", ENTROPY_METRIC)
        lower.append(compare(f"{model} trained hard on {ds}, {bench} hard_sample: log entropy {_e(hard)} vs base "
                             f"hard_sample {_e(base['hard_sample'])}", hard, base["hard_sample"], LESS))
        greedy_level.append(compare(f"{model} trained hard on {ds}, {bench} hard_sample: log entropy {_e(hard)} vs "
                                    f"base hard_greedy {_e(base['hard_greedy'])}", hard, base["hard_greedy"], SAME))
    return [PartPlan("soft and fuzzy keep the base's", EVERY, tuple(keep)),
            PartPlan("hard lowers the sampled entropy", EVERY, tuple(lower)),
            PartPlan("to the base's greedy level", EVERY, tuple(greedy_level))]


def _e(c) -> str:
    return "(no cell)" if c.get("missing") else f"{c['mean']:.3f} (n={int(c['n'])})"


CLAIM = ClaimDef(
    "entropy_profile", 100,
    "Soft and fuzzy training keep the base model's CoT entropy; hard training lowers the hard-sample entropy to the "
    "base's greedy level.",
    (quote("soft or fuzzy training keep roughly the same entropy profile as the base model, whether inference is "
           "greedy or sampled", "Section 4, Entropy behavior", 695),
     quote("hard training changes the hard sampling entropy profile to resemble greedy sampling on the base model: "
           "entropy values are substantially lower", "Section 4, Entropy behavior", 695)),
    "On the log of each evaluation's mean CoT entropy (over positions, weighted by how many CoTs reach each), averaged "
    "over seeds, per model, training set and benchmark: 'roughly the same' = the log ratio to the base model's inside "
    "±{margin} {unit} (two one-sided tests), for soft and fuzzy training under hard greedy and hard sample; "
    "'substantially lower' = hard training's hard-sample entropy below the base's hard-sample entropy (one-sided); "
    "'resemble greedy sampling on the base' = it is the same, by that margin, as the base's hard-greedy entropy. "
    "Every comparison of every part. The seeds' spread only: the files keep no per-question entropies. The paper "
    "shows profiles as figures only, so its own numbers cannot judge this claim.",
    plan, margin=RATIO)
