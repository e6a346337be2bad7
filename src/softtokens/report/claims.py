"""The paper's claims as it states them, each judged on our numbers and on the paper's own.

Why: a reader adopts a reproduction for its verdict, so a claim is the paper's sentence (quoted,
with its place in the LaTeX source) and a rule read off its words, not our paraphrase:
- a quantifier sets the share of comparisons that must hold: "most" more than half,
  "generally" at least two thirds, an unqualified or "universal" statement every one;
- "on average" is a mean over the comparisons, beyond Z standard errors of that mean (a cell
  shared by several comparisons, one base model against three trainings, counted once with its
  weights: report.uncertainty);
- "similar", "comparable", "matching", "preserve": within Z standard errors of the difference;
  "degrade", "lower", "recover": beyond them, or not below them;
- "best", "surpass", "outperform": the point estimate is the highest (a difference that is not
  significant is still reported beside it), not "within the tolerance of the best".

Standard errors (report.uncertainty): two of our cells are compared paired, on the questions both
were scored on; the paper publishes means only, so its claims are judged twice, with the seeds'
spread alone and with each cell's unpaired test-set term added. A verdict on the paper's numbers
stands only where both ends agree; otherwise it "depends on the test-set term", with both counts.
Every rule is applied to the paper's numbers too. A claim its own numbers fail under a faithful
reading is reported so, with the cells that fail it (docs/protocol.md discusses each).

A comparison of two cells with identical per-seed values (on the toy, hard greedy and fuzzy greedy
of a model take the same tokens) says nothing: it is listed as not informative and not counted.
"""

from __future__ import annotations

import math

import pandas as pd

from softtokens.report.judging import (
    CONTINUOUS,
    ENDS,
    ENTROPY_FACTOR,
    HARD_SETTINGS,
    NOT_JUDGED,
    OTHER_SETTINGS,
    TRAINED,
    Check,
    Claim,
    best_cell,
    both_ends,
    cell,
    fmt,
    groups,
    hard_vs_other,
    identical,
    index_cells,
    known,
    nll_pairs,
    ood_groups,
    passk_metric,
    quote,
    significance,
    similar_to_hard,
    spread,
)
from softtokens.report.reproduction import TABLE_PRECEDENCE, paper_cells
from softtokens.report.uncertainty import Z, average_difference

SIMILAR = (f"within {Z:g} standard errors of their difference (ours: paired on the questions both were scored on; "
           f"the paper's: at both ends, seeds alone and seeds + the test-set term)")


# ---------------------------------------------------------------- the claims
def claim_pass1_parity(cells: pd.DataFrame) -> Claim:
    c = Claim("pass1_parity", "Soft and fuzzy training match hard training at greedy pass@1.",
              [quote("competitive with traditional discrete-token CoTs for pass@1 criteria, with a statistically "
                     "similar performance on most model-dataset combinations", "Introduction, contributions", 179),
               quote("the three training schemes are broadly comparable, generally achieving similar greedy pass@1 "
                     "performance", "Section 4, Results", 536)],
              f"For every model, training set and benchmark, soft (and fuzzy) training's hard-greedy pass@1 is "
              f"'similar' to hard training's: {SIMILAR}. 'Generally' (the stricter of the two quantifiers): at least "
              f"two thirds of the comparisons.")
    idx = index_cells(cells)
    c.judge("hard-greedy pass@1", similar_to_hard(c, idx, groups(idx), "pass@1"), "generally")
    return c.decide()


def claim_passk_advantage(cells: pd.DataFrame) -> Claim:
    metric = passk_metric(cells)
    c = Claim("passk_advantage", f"Soft and fuzzy training beat hard training at pass@k on average ({metric or 'pass@k'}).",
              [quote("Under sampling (pass@32), continuous CoT training outperforms discrete CoT on average",
                     "Introduction, contributions", 181),
               quote("soft and fuzzy training have a clear overall advantage for pass@32 over hard training",
                     "Section 4, Results", 539)],
              f"'On average', 'clear overall advantage': over every model, training set and benchmark, the mean of "
              f"(soft - hard) hard-sample {metric or 'pass@k'} exceeds {Z:g} standard errors of that mean; the same "
              f"for fuzzy. Both must hold. ({metric or 'pass@k'} is the grid's largest k; the paper's is pass@32.)")
    if metric is None:
        return c
    idx = index_cells(cells)
    for mode in CONTINUOUS:
        pairs, lines = [], []
        for model, ds, bench in groups(idx):
            hard = cell(idx, model, ds, "hard", bench, "hard_sample", metric)
            r = cell(idx, model, ds, mode, bench, "hard_sample", metric)
            if known(hard, r):
                pairs.append((r, hard))
                lines.append(f"  {model} trained on {ds}, {bench}: {mode} {fmt(r)} vs hard {fmt(hard)}")
        checks = []
        if pairs:
            mean, s = average_difference(pairs)
            c.count(s)
            checks = [Check(mean > s.tolerance, f"{mode}: mean difference {mean:+.2f} over {len(pairs)} comparisons, "
                                                f"{s}")]
        c.judge(mode, checks, "every")
        c.evidence += lines
    return c.decide()


def claim_hard_inference_best(cells: pd.DataFrame) -> Claim:
    metric = passk_metric(cells)
    c = Claim("hard_inference_best", "Hard inference is best for every training method, at pass@1 and pass@k.",
              [quote("For all training methods (hard, soft or fuzzy), hard inference generally performs best, both "
                     "for pass@1 and pass@32", "Section 4, Results", 544)],
              f"'Best', as the paper says it: for every model, training (hard, soft, fuzzy), training set and "
              f"benchmark, the better of hard greedy and hard sample is at or above the best soft or fuzzy setting by "
              f"point estimate (whether the difference is significant, {Z:g} standard errors, is shown beside it). "
              f"'Generally': at least two thirds of the comparisons, for pass@1 and for {metric or 'pass@k'} (the "
              f"grid's largest k) each.")
    idx = index_cells(cells)
    for m in ("pass@1", metric):
        if m is None:
            continue
        checks = []
        for label, hard, other in hard_vs_other(idx, m):
            if other is None:
                checks.append(Check(None, label))
                continue
            d = hard["mean"] - other["mean"]
            s = c.count(spread(hard, other))
            checks.append(Check(d >= 0, f"{label}: hard {'highest' if d >= 0 else 'below'} ({significance(d, s)})"))
        c.judge(m, checks, "generally")
    return c.decide()


def claim_no_soft_inference_gain(cells: pd.DataFrame) -> Claim:
    metric = passk_metric(cells)
    c = Claim("no_soft_inference_gain", "Soft or fuzzy inference brings no benefit to a hard-trained model.",
              [quote("adding continuous CoT at inference on top of a hard-token-finetuned model does not bring "
                     "benefits", "Introduction, contributions", 187)],
              f"'Does not bring benefits': for every hard-trained model, training set and benchmark, at pass@1 and "
              f"{metric or 'pass@k'}, the best soft or fuzzy setting is not above the better hard setting by more than "
              f"{Z:g} standard errors of their difference (a benefit is a significant gain). Unqualified: every "
              f"comparison.")
    idx = index_cells(cells)
    for m in ("pass@1", metric):
        if m is None:
            continue
        checks = []
        for label, hard, other in hard_vs_other(idx, m, modes=("hard",)):
            if other is None:
                checks.append(Check(None, label))
                continue
            s = c.count(spread(other, hard))
            checks.append(Check(other["mean"] - hard["mean"] <= s.tolerance + 1e-9, f"{label} ({s})"))
        c.judge(m, checks, "every")
    return c.decide()


def claim_continuous_training_hard_inference_best(cells: pd.DataFrame) -> Claim:
    metric = passk_metric(cells)
    c = Claim("continuous_training_hard_inference_best",
              "Soft/fuzzy training with hard inference is the best combination everywhere.",
              [quote("the combination of soft/fuzzy training and hard inference performs universally best, matching "
                     "hard training at pass@1 and surpassing it at pass@32", "Figure 1 caption", 166)],
              f"The whole sentence, per model, training set and benchmark ('universally': every one). At pass@1, the "
              f"best soft- or fuzzy-trained cell under hard inference is at or above every soft- or fuzzy-trained "
              f"cell under soft or fuzzy inference (best, by point estimate) and within {Z:g} standard errors of "
              f"hard training's best cell (matching). At {metric or 'pass@k'} (the grid's largest k; the paper's "
              f"pass@32) it is at or above every (training, inference) combination and above hard training's best "
              f"cell (best, surpassing; point estimates, significance shown beside).")
    idx = index_cells(cells)
    every = (*HARD_SETTINGS, *OTHER_SETTINGS)
    for m in ("pass@1", metric):
        if m is None:
            continue
        checks = []
        for model, ds, bench in groups(idx):
            mine = best_cell([cell(idx, model, ds, t, bench, s, m) for t in CONTINUOUS for s in HARD_SETTINGS])
            hard = best_cell([cell(idx, model, ds, "hard", bench, s, m) for s in every])
            soft_inference = best_cell([cell(idx, model, ds, t, bench, s, m) for t in CONTINUOUS for s in OTHER_SETTINGS])
            if mine is None or hard is None:
                continue
            label = (f"{m}, {model} on {ds}, {bench}: {mine['train_mode']} training {mine['setting']} {fmt(mine)}; "
                     f"hard training's best {hard['setting']} {fmt(hard)}")
            s = c.count(spread(mine, hard))
            d = mine["mean"] - hard["mean"]
            above_soft = soft_inference is None or mine["mean"] >= soft_inference["mean"] or identical(mine, soft_inference)
            vs_soft = ("" if soft_inference is None else
                       f"; soft/fuzzy inference's best {soft_inference['train_mode']} training "
                       f"{soft_inference['setting']} {fmt(soft_inference)}")
            if m == "pass@1":
                ok = above_soft and abs(d) <= s.tolerance + 1e-9
                words = f"matching hard training: {significance(d, s)}"
            else:
                ok = above_soft and d > 0 and not identical(mine, hard)
                words = f"surpassing hard training: {significance(d, s)}"
            checks.append(Check(ok, f"{label}{vs_soft} ({words})"))
        c.judge(m, checks, "every")
    return c.decide()


def claim_ood_accuracy_comparable(cells: pd.DataFrame) -> Claim:
    c = Claim("ood_accuracy_comparable", "Out-of-domain success rates are comparable for the three trainings.",
              [quote("The results show comparable success rate for the three training methods (hard, fuzzy, soft).",
                     "Section 4, Out-of-domain robustness", 671)],
              f"For every model, training set and out-of-domain benchmark, soft (and fuzzy) training's accuracy is "
              f"'comparable' to hard training's: {SIMILAR}. Unqualified: every comparison.")
    idx = index_cells(cells)
    c.judge("accuracy", similar_to_hard(c, idx, ood_groups(idx, "accuracy"), "accuracy"), "every")
    return c.decide()


def claim_ood_nll_lower_than_hard(cells: pd.DataFrame) -> Claim:
    c = Claim("ood_nll_lower_than_hard", "Soft and fuzzy training leave a lower out-of-domain NLL than hard training.",
              [quote("fuzzy and soft training on average result in lower negative log-likelihood of the correct answer "
                     "compared to hard training", "Out-of-domain table caption", 668)],
              f"'On average': over every model, training set and out-of-domain benchmark, the mean of (soft - hard) "
              f"NLL of the correct answer is below -{Z:g} standard errors of that mean; the same for fuzzy. Both "
              f"must hold.")
    idx = index_cells(cells)
    for mode in CONTINUOUS:
        pairs = nll_pairs(idx, mode, "hard")
        checks = []
        if pairs:
            mean, s = average_difference([(r, ref) for r, ref, _ in pairs])
            c.count(s)
            checks = [Check(mean < -s.tolerance, f"{mode}: mean NLL difference {mean:+.3f} over {len(pairs)} "
                                                 f"comparisons, {s.kind} tolerance {s.tolerance:.3f}")]
        c.judge(mode, checks, "every")
        c.evidence += [line for _, _, line in pairs]
    return c.decide()


def claim_ood_nll_preserved(cells: pd.DataFrame) -> Claim:
    c = Claim("ood_nll_preserved", "Hard training degrades the out-of-domain NLL; soft and fuzzy training preserve it.",
              [quote("Continuous CoT training does not degrade the base model's log-likelihood on HellaSwag, ARC and "
                     "MMLU, whereas discrete CoT training does, on average.", "Introduction, contributions", 182),
               quote("hard training degrades the base model NLL on out-of-domain datasets, while fuzzy and soft "
                     "training preserve it", "Section 4, Out-of-domain robustness", 674)],
              f"'On average': over every model, training set and out-of-domain benchmark, the mean of (hard - base) "
              f"NLL of the correct answer exceeds {Z:g} standard errors of that mean (degrades), while the mean of "
              f"(soft - base), and of (fuzzy - base), does not (preserves). All three must hold. A base model enters "
              f"one comparison per training set: its variance is counted once, with its summed weight.")
    idx = index_cells(cells)
    for mode in TRAINED:
        pairs = nll_pairs(idx, mode, "base")
        word = "degrades" if mode == "hard" else "preserves"
        checks = []
        if pairs:
            mean, s = average_difference([(r, ref) for r, ref, _ in pairs])
            c.count(s)
            ok = mean > s.tolerance if mode == "hard" else mean <= s.tolerance
            checks = [Check(ok, f"{mode} {word}: mean NLL change from the base {mean:+.3f} over {len(pairs)} "
                                f"comparisons, {s.kind} tolerance {s.tolerance:.3f}")]
        c.judge(f"{mode} {word}", checks, "every")
        c.evidence += [line for _, _, line in pairs]
    return c.decide()


def claim_llama8b_recovery(cells: pd.DataFrame) -> Claim:
    metric = passk_metric(cells) or "pass@32"
    c = Claim("llama8b_math500_recovery",
              "Llama-8B trained on GSM8K: hard training degrades MATH-500, soft and fuzzy recover it.",
              [quote("when training Llama-8B-Instruct on GSM8K and testing on MATH-500, only fuzzy and soft-trained "
                     "models achieve good scores", "Section 4, Results", 606),
               quote("gsm8k-fuzzy and gsm8k-soft trainings recover to 44.6–44.7% greedy and 83.1–83.9% pass@32 while "
                     "maintaining in-distribution performance on GSM8K", "Section 4, Results", 610)],
              f"Llama-3.1-8B trained on GSM8K, on MATH-500 (hard greedy pass@1 and hard sample {metric}): hard "
              f"training is below the base by more than {Z:g} standard errors of the difference; soft and fuzzy are "
              f"not (they recover); on GSM8K soft and fuzzy greedy pass@1 are not below the base (maintained). Every "
              f"check must hold. Only the paper grid has these cells.")
    idx, checks = index_cells(cells), []
    for bench, setting, m in (("math500", "hard_greedy", "pass@1"), ("math500", "hard_sample", metric),
                              ("gsm8k", "hard_greedy", "pass@1")):
        base = cell(idx, "llama-8b", "none", "none", bench, setting, m)
        for mode in (("hard", *CONTINUOUS) if bench == "math500" else CONTINUOUS):
            r = cell(idx, "llama-8b", "gsm8k", mode, bench, setting, m)
            if not known(base, r):
                continue
            s = c.count(spread(r, base))
            ok = r["mean"] < base["mean"] - s.tolerance if mode == "hard" else r["mean"] >= base["mean"] - s.tolerance - 1e-9
            checks.append(Check(ok, f"{bench} {setting} {m}: {mode} {fmt(r)} vs base {fmt(base)} ({s})"))
    c.judge("every check", checks if len(checks) == 8 else [], "every")
    return c.decide()


def claim_entropy_profile(cells: pd.DataFrame, entropy: pd.DataFrame | None) -> Claim:
    c = Claim("entropy_profile", "Soft and fuzzy training keep the base model's CoT entropy; hard training lowers "
              "the hard-sample entropy to the base's greedy level.",
              [quote("soft or fuzzy training keep roughly the same entropy profile as the base model, whether "
                     "inference is greedy or sampled", "Section 4, Entropy behavior", 695),
               quote("hard training changes the hard sampling entropy profile to resemble greedy sampling on the base "
                     "model: entropy values are substantially lower", "Section 4, Entropy behavior", 695)],
              f"On the mean CoT entropy (over positions, weighted by how many CoTs reach each) of every model, "
              f"training set and benchmark: 'roughly the same' = within a factor {ENTROPY_FACTOR:g} of the base "
              f"model's, for soft and fuzzy training under hard greedy and hard sample; 'substantially lower' and "
              f"'resemble greedy sampling on the base' = hard training's hard-sample entropy is below the base's "
              f"hard-sample entropy by more than that factor and nearer (in ratio) to the base's hard-greedy entropy. "
              f"Unqualified: every comparison. The paper shows profiles as figures only, so its own numbers cannot "
              f"judge this claim.")
    if entropy is None:
        c.verdict = NOT_JUDGED
        return c
    if entropy.empty:
        return c
    means = entropy.groupby(["model", "train_dataset", "train_mode", "benchmark", "setting"])["entropy"].mean()
    checks = []
    for (model, ds, mode, bench, setting), h in means.items():
        if mode not in TRAINED:
            continue
        base = means.get((model, "none", "none", bench, setting))
        if base is None or base <= 0:
            continue
        if mode in CONTINUOUS and setting in HARD_SETTINGS:
            ratio = h / base
            checks.append(Check(1 / ENTROPY_FACTOR <= ratio <= ENTROPY_FACTOR,
                                f"{model} trained {mode} on {ds}, {bench} {setting}: mean entropy {h:.3f} vs base "
                                f"{base:.3f} (ratio {ratio:.2f})"))
        elif mode == "hard" and setting == "hard_sample":
            greedy = means.get((model, "none", "none", bench, "hard_greedy"))
            if greedy is None or greedy <= 0:
                continue
            lower = h < base / ENTROPY_FACTOR
            nearer = abs(math.log(h / greedy)) < abs(math.log(h / base))
            checks.append(Check(lower and nearer, f"{model} trained hard on {ds}, {bench} hard_sample: mean entropy "
                                                  f"{h:.3f} vs base hard_sample {base:.3f}, base hard_greedy {greedy:.3f}"))
    c.judge("entropy", checks, "every")
    return c.decide()


CLAIMS = (claim_pass1_parity, claim_passk_advantage, claim_hard_inference_best, claim_no_soft_inference_gain,
          claim_continuous_training_hard_inference_best, claim_ood_accuracy_comparable, claim_ood_nll_lower_than_hard,
          claim_ood_nll_preserved, claim_llama8b_recovery)


def judge_claims(cells: pd.DataFrame, entropy: pd.DataFrame | None = None) -> list[Claim]:
    """Every claim on these cells; ``entropy`` (entropy_rows) for the entropy claim, None for the
    paper's numbers (figures only)."""
    idx = index_cells(cells)
    return [f(idx) for f in CLAIMS] + [claim_entropy_profile(idx, entropy)]


def judge_paper_claims(paper: pd.DataFrame, precedence: tuple[str, ...] = TABLE_PRECEDENCE) -> list[Claim]:
    """Every claim on the paper's own numbers, at both ends (module docstring): the seeds alone and
    seeds + each cell's unpaired test-set term; ``precedence``: which table's number a cell two
    tables print differently takes (reproduction.paper_conflicts)."""
    ends = {end: judge_claims(paper_cells(paper, test_set=(end != ENDS[0]), precedence=precedence)) for end in ENDS}
    return [both_ends(a, b) for a, b in zip(*ends.values())]


def precedence_sensitivity(paper: pd.DataFrame, first: list[Claim] | None = None) -> list[tuple[str, str, str]]:
    """(claim, verdict with Table 1's numbers first, verdict with the appendix tables' first) for
    every claim whose verdict on the paper's numbers changes with which table a disagreeing cell
    is read from: empty when no verdict depends on that choice. ``first``: the claims already judged
    in TABLE_PRECEDENCE's order (judge_paper_claims), when the caller has them."""
    first = judge_paper_claims(paper) if first is None else first
    appendix_first = tuple(t for t in TABLE_PRECEDENCE if t != "tab:main") + ("tab:main",)
    other = judge_paper_claims(paper, appendix_first)
    return [(a.key, a.verdict, b.verdict) for a, b in zip(first, other) if a.verdict != b.verdict]
