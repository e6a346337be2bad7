"""The paper's claims as it states them, each judged on our numbers and on the paper's own.

Why: a reader adopts a reproduction for its verdict, so a claim is the paper's sentence (quoted,
with its place in the LaTeX source) and a rule read off its words, not our paraphrase:
- a quantifier sets the share of comparisons that must hold: "most" more than half,
  "generally" at least two thirds, an unqualified or "universal" statement every one;
- "on average" is a mean over the comparisons, beyond Z standard errors of that mean;
- "similar", "comparable", "matching", "preserve": within Z combined standard errors
  (reproduction.py); "best", "surpass", "degrade", "lower": beyond them, or not below them.
Every rule is applied to the paper's numbers too. A claim its own numbers fail under a faithful
reading is reported so, with the cells that fail it (docs/protocol.md discusses each).

A comparison of two cells with identical per-seed values (on the toy, hard greedy and fuzzy greedy
of a model take the same tokens) says nothing: it is listed as not informative and not counted.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from softtokens.paper import CELL_KEYS
from softtokens.reproduction import Z

TRAINED = ("hard", "soft", "fuzzy")
CONTINUOUS = ("soft", "fuzzy")
HARD_SETTINGS = ("hard_greedy", "hard_sample")
OTHER_SETTINGS = ("soft_greedy", "soft_sample", "fuzzy_greedy", "fuzzy_sample")
SUPPORTED, NOT_SUPPORTED, NOT_MEASURED = "supported", "not supported", "not yet measured"
NOT_JUDGED = "not judged: the paper gives this as figures only"
# a quantifier's share of comparisons that must hold: (share, strictly more than it)
QUANTIFIERS = {"most": (0.5, True), "generally": (2 / 3, False), "every": (1.0, False)}
# "roughly the same entropy profile": mean CoT entropy within this factor of the base's (docs/protocol.md)
ENTROPY_FACTOR = 1.5
TEX = "soft-tokens-hard-truths.tex"


@dataclass
class Claim:
    key: str
    statement: str                  # the claim in one line
    quotes: list[dict]              # the paper's words: {"text", "where"}
    rule: str
    verdict: str = NOT_MEASURED
    held: int = 0
    total: int = 0
    not_informative: int = 0
    evidence: list[str] = field(default_factory=list)

    def summary(self) -> str:
        if not self.total:
            return self.verdict
        extra = f"; {self.not_informative} not informative" if self.not_informative else ""
        return f"{self.verdict} ({self.held}/{self.total}{extra})"

    def record(self, checks: list["Check"]) -> None:
        self.total += sum(c.ok is not None for c in checks)
        self.held += sum(c.ok is True for c in checks)
        self.not_informative += sum(c.ok is None for c in checks)
        self.evidence += [c.line() for c in checks]

    def decide(self, passed: bool | None) -> "Claim":
        self.verdict = NOT_MEASURED if passed is None else (SUPPORTED if passed else NOT_SUPPORTED)
        return self


@dataclass
class Check:
    ok: bool | None     # None: not informative
    text: str

    def __post_init__(self):
        if self.ok is not None:
            self.ok = bool(self.ok)  # numpy's bools from pandas cells are not `True`

    def line(self) -> str:
        return {True: "holds: ", False: "fails: ", None: "not informative (identical cells): "}[self.ok] + self.text


def quote(text: str, where: str, line: int) -> dict:
    return {"text": text, "where": f"{where} ({TEX}, line {line})"}


def share_holds(checks: list[Check], quantifier: str) -> bool | None:
    counted = [c for c in checks if c.ok is not None]
    if not counted:
        return None
    share, strict = QUANTIFIERS[quantifier]
    got = sum(c.ok for c in counted) / len(counted)
    return got > share if strict else got >= share - 1e-12


# ---------------------------------------------------------------- cells
def _index(cells: pd.DataFrame) -> dict:
    main = cells[cells.variant == ""]
    return {tuple(r[k] for k in CELL_KEYS): r for _, r in main.iterrows()}


def _get(idx, model, ds, mode, bench, setting, metric):
    return idx.get((model, ds, mode, "", bench, setting, metric))


def _fmt(r) -> str:
    sd = "" if pd.isna(r["std"]) else f"±{r['std']:.2f}"
    se = "" if pd.isna(r["se"]) else f", se {r['se']:.2f}"
    return f"{r['mean']:.2f}{sd} (n={int(r['n'])}{se})"


def _tol(a, b) -> float:
    return Z * math.sqrt(a["se"] ** 2 + b["se"] ** 2)


def _known(*cells) -> bool:
    return all(c is not None and not pd.isna(c["se"]) for c in cells)


def _identical(a, b) -> bool:
    va, vb = a.get("values"), b.get("values")
    return va is not None and vb is not None and len(va) > 0 and tuple(va) == tuple(vb)


def passk_metric(cells: pd.DataFrame) -> str | None:
    """The sampled metric with the largest k (the paper's pass@32; pass@n of a grid with n samples)."""
    ks = [int(m.split("@")[1]) for m in set(cells.metric) if m.startswith("pass@") and m != "pass@1"]
    return f"pass@{max(ks)}" if ks else None


def _groups(idx, modes=TRAINED, metric_filter=lambda m: m.startswith("pass@")):
    return sorted({(k[0], k[1], k[4]) for k in idx if k[2] in modes and metric_filter(k[6])})


def _average(diffs: list[tuple[float, float]]) -> tuple[float, float]:
    """Mean of differences and its standard error, from (difference, its tolerance) pairs."""
    m = len(diffs)
    mean = sum(d for d, _ in diffs) / m
    se = math.sqrt(sum((t / Z) ** 2 for _, t in diffs)) / m
    return mean, se


# ---------------------------------------------------------------- the claims
def claim_pass1_parity(cells: pd.DataFrame) -> Claim:
    c = Claim("pass1_parity", "Soft and fuzzy training match hard training at greedy pass@1.",
              [quote("competitive with traditional discrete-token CoTs for pass@1 criteria, with a statistically "
                     "similar performance on most model-dataset combinations", "Introduction, contributions", 179),
               quote("the three training schemes are broadly comparable, generally achieving similar greedy pass@1 "
                     "performance", "Section 4, Results", 537)],
              f"For every model, training set and benchmark, soft (and fuzzy) training's hard-greedy pass@1 is "
              f"'similar' to hard training's: within {Z:g} combined standard errors. 'Generally' (the stricter of "
              f"the two quantifiers): at least two thirds of the comparisons.")
    idx, checks = _index(cells), []
    for model, ds, bench in _groups(idx):
        hard = _get(idx, model, ds, "hard", bench, "hard_greedy", "pass@1")
        for mode in CONTINUOUS:
            r = _get(idx, model, ds, mode, bench, "hard_greedy", "pass@1")
            if not _known(hard, r):
                continue
            tol = _tol(r, hard)
            checks.append(Check(None if _identical(r, hard) else abs(r["mean"] - hard["mean"]) <= tol + 1e-9,
                                f"{model} trained on {ds}, {bench}: {mode} {_fmt(r)} vs hard {_fmt(hard)} "
                                f"(tolerance {tol:.2f})"))
    c.record(checks)
    return c.decide(share_holds(checks, "generally"))


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
    idx, held = _index(cells), []
    for mode in CONTINUOUS:
        checks, diffs = [], []
        for model, ds, bench in _groups(idx):
            hard = _get(idx, model, ds, "hard", bench, "hard_sample", metric)
            r = _get(idx, model, ds, mode, bench, "hard_sample", metric)
            if not _known(hard, r):
                continue
            diffs.append((r["mean"] - hard["mean"], _tol(r, hard)))
            checks.append(f"{model} trained on {ds}, {bench}: {mode} {_fmt(r)} vs hard {_fmt(hard)}")
        if not diffs:
            continue
        mean, se = _average(diffs)
        ok = mean > Z * se
        c.record([Check(ok, f"{mode}: mean difference {mean:+.2f} over {len(diffs)} comparisons, {Z:g} se = "
                            f"{Z * se:.2f}")])
        c.evidence += [f"  {line}" for line in checks]
        held.append(ok)
    return c.decide(None if len(held) < 2 else all(held))


def _best(cells_):
    cells_ = [x for x in cells_ if x is not None and not pd.isna(x["se"])]
    return max(cells_, key=lambda x: x["mean"]) if cells_ else None


def _hard_vs_other(idx, m: str, modes=TRAINED):
    """Per model, training, training set and benchmark: (label, the better hard setting, the best
    soft or fuzzy setting, their tolerance) of metric m."""
    for model, ds, bench in _groups(idx, modes=modes):
        for mode in modes:
            hard = _best([_get(idx, model, ds, mode, bench, s, m) for s in HARD_SETTINGS])
            other = _best([_get(idx, model, ds, mode, bench, s, m) for s in OTHER_SETTINGS])
            if hard is not None and other is not None:
                tol = _tol(hard, other)
                yield (f"{m}, {model} trained {mode} on {ds}, {bench}: {hard['setting']} {_fmt(hard)} vs "
                       f"{other['setting']} {_fmt(other)} (tolerance {tol:.2f})"), hard, other, tol


def claim_hard_inference_best(cells: pd.DataFrame) -> Claim:
    metric = passk_metric(cells)
    c = Claim("hard_inference_best", "Hard inference is best for every training method, at pass@1 and pass@k.",
              [quote("For all training methods (hard, soft or fuzzy), hard inference generally performs best, both "
                     "for pass@1 and pass@32", "Section 4, Results", 544)],
              f"For every model, training (hard, soft, fuzzy), training set and benchmark: the better of hard greedy "
              f"and hard sample is not below the best soft or fuzzy setting by more than {Z:g} combined standard "
              f"errors. 'Generally': at least two thirds of the comparisons, for pass@1 and for {metric or 'pass@k'} "
              f"(the grid's largest k) each.")
    idx, verdicts = _index(cells), []
    for m in ("pass@1", metric):
        if m is None:
            continue
        checks = [Check(None if _identical(hard, other) else hard["mean"] >= other["mean"] - tol - 1e-9, label)
                  for label, hard, other, tol in _hard_vs_other(idx, m)]
        c.record(checks)
        verdicts.append(share_holds(checks, "generally"))
    return c.decide(None if not verdicts or None in verdicts else all(verdicts))


def claim_no_soft_inference_gain(cells: pd.DataFrame) -> Claim:
    metric = passk_metric(cells)
    c = Claim("no_soft_inference_gain", "Soft or fuzzy inference brings no benefit to a hard-trained model.",
              [quote("adding continuous CoT at inference on top of a hard-token-finetuned model does not bring "
                     "benefits", "Introduction, contributions", 187)],
              f"For every hard-trained model, training set and benchmark, at pass@1 and {metric or 'pass@k'}: the best "
              f"soft or fuzzy setting is not above the better hard setting by more than {Z:g} combined standard "
              f"errors. Unqualified: every comparison.")
    idx, checks = _index(cells), []
    for m in ("pass@1", metric):
        if m is None:
            continue
        checks += [Check(None if _identical(hard, other) else other["mean"] <= hard["mean"] + tol + 1e-9, label)
                   for label, hard, other, tol in _hard_vs_other(idx, m, modes=("hard",))]
    c.record(checks)
    return c.decide(share_holds(checks, "every"))


def claim_continuous_training_hard_inference_best(cells: pd.DataFrame) -> Claim:
    metric = passk_metric(cells)
    c = Claim("continuous_training_hard_inference_best",
              "Soft/fuzzy training with hard inference is the best combination everywhere.",
              [quote("the combination of soft/fuzzy training and hard inference performs universally best, matching "
                     "hard training at pass@1 and surpassing it at pass@32", "Figure 1 caption", 166)],
              f"'Universally': for every model, training set and benchmark, at pass@1 and {metric or 'pass@k'}, the "
              f"best soft- or fuzzy-trained model under hard inference is not below the best of all (training, "
              f"inference) combinations by more than {Z:g} combined standard errors. (The caption's 'surpassing at "
              f"pass@32' is judged on average by passk_advantage.)")
    idx, checks = _index(cells), []
    for m in ("pass@1", metric):
        if m is None:
            continue
        for model, ds, bench in _groups(idx):
            every = [_get(idx, model, ds, t, bench, s, m) for t in TRAINED for s in (*HARD_SETTINGS, *OTHER_SETTINGS)]
            mine = _best([_get(idx, model, ds, t, bench, s, m) for t in CONTINUOUS for s in HARD_SETTINGS])
            best = _best(every)
            if mine is None or best is None or not any(x is not None and x["train_mode"] == "hard" for x in every):
                continue
            tol = _tol(mine, best)
            same = mine is best or _identical(mine, best)
            checks.append(Check(True if same else mine["mean"] >= best["mean"] - tol - 1e-9,
                                f"{m}, {model} on {ds}, {bench}: {mine['train_mode']} training {mine['setting']} "
                                f"{_fmt(mine)} vs the best, {best['train_mode']} training {best['setting']} "
                                f"{_fmt(best)} (tolerance {tol:.2f})"))
    c.record(checks)
    return c.decide(share_holds(checks, "every"))


def _ood_groups(idx, metric):
    return sorted({(k[0], k[1], k[4]) for k in idx if k[2] in TRAINED and k[6] == metric})


def claim_ood_accuracy_comparable(cells: pd.DataFrame) -> Claim:
    c = Claim("ood_accuracy_comparable", "Out-of-domain success rates are comparable for the three trainings.",
              [quote("The results show comparable success rate for the three training methods (hard, fuzzy, soft).",
                     "Section 4, Out-of-domain robustness", 671)],
              f"For every model, training set and out-of-domain benchmark, soft (and fuzzy) training's accuracy is "
              f"within {Z:g} combined standard errors of hard training's. Unqualified: every comparison.")
    idx, checks = _index(cells), []
    for model, ds, bench in _ood_groups(idx, "accuracy"):
        hard = _get(idx, model, ds, "hard", bench, "hard_greedy", "accuracy")
        for mode in CONTINUOUS:
            r = _get(idx, model, ds, mode, bench, "hard_greedy", "accuracy")
            if not _known(hard, r):
                continue
            tol = _tol(r, hard)
            checks.append(Check(None if _identical(r, hard) else abs(r["mean"] - hard["mean"]) <= tol + 1e-9,
                                f"{model} trained on {ds}, {bench}: {mode} {_fmt(r)} vs hard {_fmt(hard)} "
                                f"(tolerance {tol:.2f})"))
    c.record(checks)
    return c.decide(share_holds(checks, "every"))


def _nll_average(idx, mode: str, against: str):
    """(mean difference, its se, evidence) of NLL_correct, mode minus `against` (hard or the base)."""
    diffs, lines = [], []
    for model, ds, bench in _ood_groups(idx, "nll_correct"):
        r = _get(idx, model, ds, mode, bench, "loglik", "nll_correct")
        ref = (_get(idx, model, "none", "none", bench, "loglik", "nll_correct") if against == "base"
               else _get(idx, model, ds, against, bench, "loglik", "nll_correct"))
        if not _known(r, ref):
            continue
        diffs.append((r["mean"] - ref["mean"], _tol(r, ref)))
        lines.append(f"  {model} trained on {ds}, {bench}: {mode} {_fmt(r)} vs {against} {_fmt(ref)}")
    return (*_average(diffs), lines, len(diffs)) if diffs else (None, None, lines, 0)


def claim_ood_nll_lower_than_hard(cells: pd.DataFrame) -> Claim:
    c = Claim("ood_nll_lower_than_hard", "Soft and fuzzy training leave a lower out-of-domain NLL than hard training.",
              [quote("fuzzy and soft training on average result in lower negative log-likelihood of the correct answer "
                     "compared to hard training", "Out-of-domain table caption", 668)],
              f"'On average': over every model, training set and out-of-domain benchmark, the mean of (soft - hard) "
              f"NLL of the correct answer is below -{Z:g} standard errors of that mean; the same for fuzzy. Both "
              f"must hold.")
    idx, held = _index(cells), []
    for mode in CONTINUOUS:
        mean, se, lines, m = _nll_average(idx, mode, "hard")
        if not m:
            continue
        ok = mean < -Z * se
        c.record([Check(ok, f"{mode}: mean NLL difference {mean:+.3f} over {m} comparisons, {Z:g} se = {Z * se:.3f}")])
        c.evidence += lines
        held.append(ok)
    return c.decide(None if len(held) < 2 else all(held))


def claim_ood_nll_preserved(cells: pd.DataFrame) -> Claim:
    c = Claim("ood_nll_preserved", "Hard training degrades the out-of-domain NLL; soft and fuzzy training preserve it.",
              [quote("Continuous CoT training does not degrade the base model's log-likelihood on HellaSwag, ARC and "
                     "MMLU, whereas discrete CoT training does, on average.", "Introduction, contributions", 182),
               quote("hard training degrades the base model NLL on out-of-domain datasets, while fuzzy and soft "
                     "training preserve it", "Section 4, Out-of-domain robustness", 675)],
              f"'On average': over every model, training set and out-of-domain benchmark, the mean of (hard - base) "
              f"NLL of the correct answer exceeds {Z:g} standard errors of that mean (degrades), while the mean of "
              f"(soft - base), and of (fuzzy - base), does not (preserves). All three must hold.")
    idx, held = _index(cells), []
    for mode in TRAINED:
        mean, se, lines, m = _nll_average(idx, mode, "base")
        if not m:
            continue
        ok = mean > Z * se if mode == "hard" else mean <= Z * se
        word = "degrades" if mode == "hard" else "preserves"
        c.record([Check(ok, f"{mode} {word}: mean NLL change from the base {mean:+.3f} over {m} comparisons, "
                            f"{Z:g} se = {Z * se:.3f}")])
        c.evidence += lines
        held.append(ok)
    return c.decide(None if len(held) < 3 else all(held))


def claim_llama8b_recovery(cells: pd.DataFrame) -> Claim:
    metric = passk_metric(cells) or "pass@32"
    c = Claim("llama8b_math500_recovery",
              "Llama-8B trained on GSM8K: hard training degrades MATH-500, soft and fuzzy recover it.",
              [quote("when training Llama-8B-Instruct on GSM8K and testing on MATH-500, only fuzzy and soft-trained "
                     "models achieve good scores", "Section 4, Results", 607),
               quote("gsm8k-fuzzy and gsm8k-soft trainings recover to 44.6–44.7% greedy and 83.1–83.9% pass@32 while "
                     "maintaining in-distribution performance on GSM8K", "Section 4, Results", 611)],
              f"Llama-3.1-8B trained on GSM8K, on MATH-500 (hard greedy pass@1 and hard sample {metric}): hard "
              f"training is below the base by more than {Z:g} combined standard errors; soft and fuzzy are not "
              f"(they recover); on GSM8K soft and fuzzy greedy pass@1 are not below the base (maintained). Every "
              f"check must hold. Only the paper grid has these cells.")
    idx, checks = _index(cells), []
    for bench, setting, m in (("math500", "hard_greedy", "pass@1"), ("math500", "hard_sample", metric),
                              ("gsm8k", "hard_greedy", "pass@1")):
        base = _get(idx, "llama-8b", "none", "none", bench, setting, m)
        for mode in (("hard", *CONTINUOUS) if bench == "math500" else CONTINUOUS):
            r = _get(idx, "llama-8b", "gsm8k", mode, bench, setting, m)
            if not _known(base, r):
                continue
            tol = _tol(r, base)
            ok = r["mean"] < base["mean"] - tol if mode == "hard" else r["mean"] >= base["mean"] - tol - 1e-9
            checks.append(Check(ok, f"{bench} {setting} {m}: {mode} {_fmt(r)} vs base {_fmt(base)} "
                                    f"(tolerance {tol:.2f})"))
    c.record(checks)
    return c.decide(share_holds(checks, "every") if len(checks) == 8 else None)


def claim_entropy_profile(cells: pd.DataFrame, entropy: pd.DataFrame | None) -> Claim:
    c = Claim("entropy_profile", "Soft and fuzzy training keep the base model's CoT entropy; hard training lowers "
              "the hard-sample entropy to the base's greedy level.",
              [quote("soft or fuzzy training keep roughly the same entropy profile as the base model, whether "
                     "inference is greedy or sampled", "Section 4, Entropy behavior", 695),
               quote("hard training changes the hard sampling entropy profile to resemble greedy sampling on the base "
                     "model: entropy values are substantially lower", "Section 4, Entropy behavior", 696)],
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
    c.record(checks)
    return c.decide(share_holds(checks, "every"))


CLAIMS = (claim_pass1_parity, claim_passk_advantage, claim_hard_inference_best, claim_no_soft_inference_gain,
          claim_continuous_training_hard_inference_best, claim_ood_accuracy_comparable, claim_ood_nll_lower_than_hard,
          claim_ood_nll_preserved, claim_llama8b_recovery)


def judge_claims(cells: pd.DataFrame, entropy: pd.DataFrame | None = None) -> list[Claim]:
    """Every claim on these cells; ``entropy`` (entropy_rows) for the entropy claim, None for the
    paper's numbers (figures only)."""
    return [f(cells) for f in CLAIMS] + [claim_entropy_profile(cells, entropy)]


def entropy_rows(eval_paths) -> pd.DataFrame:
    """Per math evaluation file: its mean CoT entropy over positions, weighted by the number of CoTs
    that reach each position (the profile the paper plots, reduced to one number)."""
    from softtokens.paths import parse_eval_path

    rows = []
    for p in map(Path, eval_paths):
        if p.stem == "loglik":
            continue
        res = json.loads(p.read_text())
        prof, count = res.get("entropy_profile"), res.get("entropy_count")
        if not prof or not count:
            continue
        total = sum(h * n for h, n in zip(prof, count) if h is not None)
        n = sum(c for h, c in zip(prof, count) if h is not None)
        if n:
            keys = parse_eval_path(p)
            if keys["variant"] == "":
                rows.append({**keys, "entropy": total / n})
    return pd.DataFrame(rows, columns=["model", "train_dataset", "train_mode", "variant", "benchmark", "setting",
                                       "seed", "entropy"])
