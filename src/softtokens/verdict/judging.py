"""How a claim of the paper is judged: its comparisons and their one-sided tests, the quantifier
that counts them, the three verdicts, and the cell lookups every claim shares (verdict.claims holds
the claims, verdict.uncertainty the errors, verdict.choices every choice a verdict rests on).

A claim is *planned* once on the cells (which comparisons, of which cells, under which rule) and
*evaluated* under a specification (verdict.choices.Spec): the plan is the paper's sentence, the
evaluation the statistics, so the same plan is judged under every alternative reading and, in
robustness.reproducibility, on thousands of simulated reproductions at once.

Rules, each a one-sided test or two at level alpha:
- SAME ("similar", "comparable", "matching", "preserve"): the difference's 1 - 2 alpha interval
  inside +-margin (two one-sided tests); contradicted when |difference| > margin is established at
  alpha: the p-value of |estimate| under the least favourable sameness (a true difference of exactly
  +-margin), both tails counted, so that a large error cannot double the rate (the smaller of two
  one-sided p-values would reach 2 alpha when the error dwarfs the margin).
- NOT_WORSE ("best", "no benefit", "recover", "maintain"): above -margin; contradicted below it.
- COMPETITIVE ("competitive with", "matching", "does not degrade"): words that are one-sided, read as
  NOT_WORSE (a large gain does not count against them) or, under the two-sided reading a specification
  may ask for (Spec.reading), as SAME: claim_parts resolves it before any test.
- MORE / LESS ("outperform", "surpass", "degrade", "lower"): beyond 0 in the claimed direction;
  contradicted beyond 0 in the other. A claim of difference keeps its test: no margin.
Verdicts: supported, contradicted, undecided (neither established). More noise widens every
interval, so it can only move a verdict toward undecided. A comparison that cannot be made (a cell
not there, or with no spread: one seed) is never dropped: it counts as undecided in every quantifier
(it can block "every", never help "most"), and the verdict names it. A claim is supported when every
part is (each at alpha: intersection-union), contradicted when one part is, each part's contradiction
held at alpha / parts (Bonferroni), so the claim's contradiction is held at alpha family-wise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from softtokens.cells.lookup import (  # noqa: F401  (the claims read them from here too)
    NO_CELL,
    TRAINED,
    cell,
    entropy_rows,
    fmt,
    gap,
    groups,
    identical,
    index_cells,
    key_of,
    ood_groups,
    passk_metric,
)
from softtokens.config.names import CONTINUOUS_MODES, settings_of
from softtokens.verdict import uncertainty
from softtokens.verdict.choices import (
    DEFAULT,
    FAMILY_WISE,
    TWO_SIDED,
    GENERALLY,
    MARGINS,
    MOST,
    SENTENCE_UNIT,
    Spec,
)

CONTINUOUS = CONTINUOUS_MODES
# the settings whose CoT is hard, and the others (soft or fuzzy CoTs), in the tables' order
HARD_SETTINGS = settings_of(("hard",))
OTHER_SETTINGS = settings_of(CONTINUOUS_MODES)

SUPPORTED, CONTRADICTED, UNDECIDED = "supported", "contradicted", "undecided"
NOT_MEASURED = "not yet measured"
NOT_JUDGED = "not judged: the paper gives this as figures only"
VERDICTS = (SUPPORTED, UNDECIDED, CONTRADICTED, NOT_MEASURED, NOT_JUDGED)
CODES = {1: SUPPORTED, 0: UNDECIDED, -1: CONTRADICTED}

SAME, NOT_WORSE, MORE, LESS, FIXED = "same", "not worse", "more", "less", "fixed"
COMPETITIVE = "competitive"   # one-sided words: NOT_WORSE as worded, SAME read two-sided (resolved_plan)

TEX = "soft-tokens-hard-truths.tex"
SOURCES = ("paper", "ours")   # whose words a claim is: the paper's sentence (quoted), or a statement of ours


def quote(text: str, where: str, line: int) -> dict:
    return {"text": text, "where": f"{where} ({TEX}, line {line})"}


# ---------------------------------------------------------------- plans
@dataclass(frozen=True)
class Comparison:
    """One comparison: a contrast of cells (their keys and weights) and the rule it is read by."""

    label: str
    terms: tuple[tuple[tuple, float], ...]
    rule: str
    informative: bool = True      # False: two cells with identical per-seed values (says nothing)
    holds: bool | None = None     # a FIXED check's outcome (no statistics: the entropy claim)
    missing: str | None = None    # why it cannot be made (cells.lookup.gap): it counts as undecided


@dataclass(frozen=True)
class PartPlan:
    """One quantified statement of a claim ("at pass@1", "soft"): its comparisons and quantifier.
    ``units``: per comparison, the unit the sentence counts ('model-dataset combination'), or None
    where each comparison is a unit."""

    name: str
    quantifier: str
    comparisons: tuple[Comparison, ...]
    units: tuple[str, ...] | None = None
    unit_name: str = "comparison"


def compare(label: str, a: dict, b: dict, rule: str) -> Comparison:
    """a - b under ``rule``; not informative when the two cells have identical per-seed values; missing
    (undecided, named) when either cannot enter (cells.lookup.gap)."""
    missing = gap(a, b)
    return Comparison(label, ((key_of(a), 1.0), (key_of(b), -1.0)), rule,
                      informative=missing is not None or not identical(a, b), missing=missing)


def average(label: str, pairs: list[tuple[dict, dict]], rule: str) -> Comparison:
    """The mean of (a_i - b_i) over the pairs under ``rule`` (a shared cell carries its summed weight);
    missing when any pair cannot enter: an average over fewer pairs would be another claim."""
    m = len(pairs)
    gaps = [g for a, b in pairs for g in [gap(a, b)] if g]
    missing = f"{len(gaps)} of its {m} pairs: {gaps[0]}" if gaps else None
    return Comparison(label, tuple(t for a, b in pairs for t in ((key_of(a), 1.0 / m), (key_of(b), -1.0 / m))), rule,
                      missing=missing)


# ---------------------------------------------------------------- tests
def test(est: uncertainty.Estimate, rule: str, margin: float):
    """(p of the claim's reading, p of its contradiction) for one contrast (module docstring)."""
    if rule == SAME:
        return (np.maximum(uncertainty.p_greater(est, -margin), uncertainty.p_less(est, margin)),
                uncertainty.p_outside(est, margin))
    if rule == NOT_WORSE:
        return uncertainty.p_greater(est, -margin), uncertainty.p_less(est, -margin)
    if rule == MORE:
        return uncertainty.p_greater(est, 0.0), uncertainty.p_less(est, 0.0)
    if rule == LESS:
        return uncertainty.p_less(est, 0.0), uncertainty.p_greater(est, 0.0)
    raise ValueError(f"unknown rule {rule!r}")


def chance(est: uncertainty.Estimate, rule: str, margin: float, spec: Spec):
    """The probability this comparison alone is supported at alpha if the claim held exactly (a
    difference of 0 for a claim of sameness; for a claim of difference, no difference: alpha)."""
    if rule in (MORE, LESS):
        return spec.alpha
    crit = uncertainty.quantile(1 - spec.alpha, est.df)
    with np.errstate(divide="ignore", invalid="ignore"):
        reach = np.where(np.asarray(est.se) > 0, margin / np.asarray(est.se) - crit, np.inf)
    below = 1 - uncertainty.survival(reach, est.df)
    return np.clip(2 * below - 1, 0, 1) if rule == SAME else below


def needed(k: int, quantifier: str, spec: Spec) -> int:
    """How many of k units the quantifier asks for."""
    if quantifier == MOST:
        return k // 2 + 1
    if quantifier == GENERALLY:
        share = spec.generally
        return math.floor(share * k + 1e-9) + 1 if spec.generally_strict else math.ceil(share * k - 1e-9)
    return k          # every, on average (one contrast)


def quantify(p_sup: np.ndarray, p_con: np.ndarray, m: int, spec: Spec, con_alpha: float | None = None) -> np.ndarray:
    """Per draw, 1 supported / -1 contradicted / 0 undecided: at least m of k units established
    (rows of p_sup), or k - m + 1 failures established (rows of p_con) at ``con_alpha`` (a claim's share
    of alpha: claim_parts). Family-wise: the m-th smallest p-value times k - m + 1 (partial conjunction,
    Bonferroni form; verdict.choices); raw: counts at alpha."""
    k = p_sup.shape[0]
    con_alpha = spec.alpha if con_alpha is None else con_alpha
    p_sup, p_con = np.nan_to_num(p_sup, nan=1.0), np.nan_to_num(p_con, nan=1.0)
    if spec.multiplicity == FAMILY_WISE:
        sup = (k - m + 1) * np.sort(p_sup, axis=0)[m - 1] <= spec.alpha
        con = m * np.sort(p_con, axis=0)[k - m] <= con_alpha
    else:
        sup = (p_sup <= spec.alpha).sum(axis=0) >= m
        con = (p_con <= con_alpha).sum(axis=0) >= k - m + 1
    return np.where(sup, 1, np.where(con, -1, 0))


def by_unit(p_sup: np.ndarray, p_con: np.ndarray, units: list[str]):
    """Units of several comparisons: a unit holds when every comparison in it does (the largest of its
    p-values), fails when one does (the smallest, times its size: Bonferroni)."""
    names = list(dict.fromkeys(units))
    rows = [[i for i, u in enumerate(units) if u == name] for name in names]
    sup = np.stack([p_sup[r].max(axis=0) for r in rows])
    con = np.stack([np.minimum(1.0, len(r) * p_con[r].min(axis=0)) for r in rows])
    return names, sup, con


@dataclass
class Evaluated:
    """One comparison under a specification (``est`` None: a fixed check, or one that cannot be made)."""

    comparison: Comparison
    est: uncertainty.Estimate | None
    p_sup: object
    p_con: object
    chance: object = None


def resolved_plan(plan: list[PartPlan], spec: Spec) -> list[PartPlan]:
    """The plan with every COMPETITIVE comparison read as the specification asks: NOT_WORSE (the words), or
    SAME (two-sided)."""
    rule = SAME if spec.reading == TWO_SIDED else NOT_WORSE
    out = []
    for part in plan:
        if any(c.rule == COMPETITIVE for c in part.comparisons):
            part = replace(part, comparisons=tuple(replace(c, rule=rule) if c.rule == COMPETITIVE else c
                                                   for c in part.comparisons))
        out.append(part)
    return out


def evaluate_comparison(c: Comparison, idx: dict, spec: Spec, margin: float, cache: dict | None = None) -> Evaluated:
    """One comparison under ``spec``; ``cache`` (robustness.multiverse: one per set of cells) keeps each estimate
    by the fields of ``spec`` it depends on, so many specifications share it."""
    if c.missing:      # counts as undecided: established neither way, and 0 expected to hold
        return Evaluated(c, None, 1.0, 1.0, 0.0)
    if c.rule == FIXED:
        p = 0.0 if c.holds else 1.0
        return Evaluated(c, None, p, 1.0 - p)
    return _evaluated(c, cached_estimate(c, idx, spec, cache), spec, margin)


def _evaluated(c: Comparison, est: uncertainty.Estimate, spec: Spec, margin) -> Evaluated:
    p_sup, p_con = test(est, c.rule, margin)
    return Evaluated(c, est, p_sup, p_con, chance(est, c.rule, margin, spec))


def cached_estimate(c: Comparison, idx: dict, spec: Spec, cache: dict | None):
    """The comparison's contrast under ``spec``; with a ``cache`` (one per set of cells), kept by the fields it
    depends on, a normal reference taken from the t one (only its degrees of freedom differ)."""
    if cache is None:
        return uncertainty.contrast([(idx[k], w) for k, w in c.terms], spec)
    key = (c.terms, *(getattr(spec, f) for f in uncertainty.ESTIMATE_FIELDS))
    est = cache.get(key)
    if est is None:
        if spec.dist == "t":
            est = uncertainty.contrast([(idx[k], w) for k, w in c.terms], spec)
        else:
            est = replace(cached_estimate(c, idx, replace(spec, dist="t"), cache), df=math.inf)
        cache[key] = est
    return est


def grouped(part: PartPlan, spec: Spec) -> bool:
    """Whether the part counts the units its sentence names (a unit holds when all its comparisons do), or each
    comparison (Spec.unit)."""
    return part.units is not None and spec.unit == SENTENCE_UNIT


def _scalar(x) -> bool:
    return isinstance(x, (float, int))


def evaluate_comparisons(comparisons: list[Comparison], idx: dict, spec: Spec, margin, cache: dict | None = None
                         ) -> list[Evaluated]:
    """evaluate_comparison of each, the tests of scalar estimates taken together per rule (one array call: the
    multiverse evaluates thousands of specifications); the same numbers as one at a time."""
    ests = [None if c.missing or c.rule == FIXED else cached_estimate(c, idx, spec, cache) for c in comparisons]
    out: list[Evaluated | None] = [None] * len(comparisons)
    scalar = [i for i, e in enumerate(ests) if e is not None and _scalar(e.value) and _scalar(e.se) and _scalar(e.df)]
    if _scalar(margin) and len(scalar) > 1:
        by_rule: dict[str, list[int]] = {}
        for i in scalar:
            by_rule.setdefault(comparisons[i].rule, []).append(i)
        for rule, rows in by_rule.items():
            batch = uncertainty.stacked([ests[i] for i in rows])
            p_sup, p_con = test(batch, rule, margin)
            odds = chance(batch, rule, margin, spec)
            p_sup, p_con, odds = (np.broadcast_to(np.asarray(x, dtype=float), (len(rows),))
                                  for x in (p_sup, p_con, odds))
            for j, i in enumerate(rows):
                out[i] = Evaluated(comparisons[i], ests[i], float(p_sup[j]), float(p_con[j]), float(odds[j]))
    # the rest one at a time, from the estimates already made (a missing comparison or a fixed check has none)
    return [e if e is not None else _evaluated(c, est, spec, margin) if est is not None
            else evaluate_comparison(c, idx, spec, margin, cache) for c, e, est in zip(comparisons, out, ests)]


def evaluate_part(part: PartPlan, idx: dict, spec: Spec, margin: float, con_alpha: float | None = None,
                  cache: dict | None = None) -> dict:
    """A part's verdict code(s) under ``spec`` and what it rests on (scalars where the cells are). A part
    whose every comparison lacks a cell is not measured (the numbers do not have it at all); one that
    lacks some counts those as undecided, and names them (``missing``: reason -> count)."""
    informative = [c for c in part.comparisons if c.informative]
    if cache is None:
        done = evaluate_comparisons(informative, idx, spec, margin, cache)
    else:   # specifications that differ only in how a part counts share its tests (the part kept: its id stays its)
        key = ("part", id(part), *(getattr(spec, f) for f in uncertainty.ESTIMATE_FIELDS), spec.alpha,
               margin if _scalar(margin) else tuple(np.ravel(margin)))
        hit = cache.get(key)
        if hit is None or hit[0] is not part:
            hit = cache[key] = (part, evaluate_comparisons(informative, idx, spec, margin, cache))
        done = hit[1]
    missing: dict[str, int] = {}
    for c in informative:
        if c.missing:
            missing[c.missing] = missing.get(c.missing, 0) + 1
    out = {"name": part.name, "quantifier": part.quantifier, "evaluated": done,
           "skipped": [c for c in part.comparisons if not c.informative],
           "not_informative": len(part.comparisons) - len(informative), "missing": missing}
    if not done or all(c.missing == NO_CELL for c in informative):
        out.update(code=None, k=0, m=0, unit_name=part.unit_name, missing={}, evaluated=[])
        return out
    # draws (or margins): a comparison that cannot be made, or a fixed check, is the same in every column
    width = 1 if all(_scalar(e.p_sup) and _scalar(e.p_con) for e in done) else \
        max(max(np.size(e.p_sup), np.size(e.p_con)) for e in done)
    if width == 1:
        p_sup = np.array([float(np.asarray(e.p_sup)) for e in done])
        p_con = np.array([float(np.asarray(e.p_con)) for e in done])
    else:
        p_sup = np.stack([np.broadcast_to(np.asarray(e.p_sup, dtype=float), (width,)) for e in done])
        p_con = np.stack([np.broadcast_to(np.asarray(e.p_con, dtype=float), (width,)) for e in done])
    units = [u for c, u in zip(part.comparisons, part.units or [None] * len(part.comparisons)) if c.informative]
    unit_name = "comparison"
    if grouped(part, spec):
        _, p_sup, p_con = by_unit(p_sup, p_con, units)
        unit_name = part.unit_name
    k = p_sup.shape[0]
    m = needed(k, part.quantifier, spec)
    con_alpha = spec.alpha if con_alpha is None else con_alpha
    out.update(code=quantify(p_sup, p_con, m, spec, con_alpha), k=k, m=m, unit_name=unit_name,
               supported=(np.nan_to_num(p_sup, nan=1.0) <= spec.alpha).sum(axis=0),
               contradicted=(np.nan_to_num(p_con, nan=1.0) <= con_alpha).sum(axis=0))
    if unit_name == "comparison" and all(e.chance is not None for e in done):
        out["expected"] = sum(np.asarray(e.chance, dtype=float) for e in done)
        out["difference"] = all(e.comparison.rule in (MORE, LESS) for e in done if not e.comparison.missing)
    return out


def claim_parts(plan: list[PartPlan], idx: dict, spec: Spec, margin: float, cache: dict | None = None) -> list[dict]:
    """Every part of a claim evaluated, each part's contradiction at alpha over the parts that have
    comparisons (Bonferroni): a claim is contradicted when one part is, so k parts would otherwise
    give it k chances. The one place a plan becomes verdict codes (judge, simulations, designs, the
    multiverse: its ``cache`` of estimates, evaluate_comparison)."""
    plan = resolved_plan(plan, spec)
    measured = sum(any(c.informative and c.missing != NO_CELL for c in p.comparisons) for p in plan)
    con_alpha = spec.alpha / max(1, measured)
    return [evaluate_part(p, idx, spec, margin, con_alpha, cache) for p in plan]


def claim_code(parts: list[dict]):
    """A claim's code from its parts: any part contradicted: contradicted; any part without an
    informative comparison: not measured (None); every part supported: supported; else undecided."""
    codes = [p["code"] for p in parts]
    if not codes or all(c is None for c in codes):
        return None
    measured = [np.asarray(c) for c in codes if c is not None]
    width = max(c.size for c in measured)
    if width > 1:      # draws or margins: a part whose tests do not read them is the same in every column
        measured = [np.broadcast_to(c, (width,)) for c in measured]
    contradicted = np.any(np.stack([c == -1 for c in measured]), axis=0)
    supported = np.all(np.stack([c == 1 for c in measured]), axis=0)
    code = np.where(contradicted, -1, np.where(supported, 1, 0))
    if any(c is None for c in codes):
        code = np.where(contradicted, -1, 2)    # 2: not yet measured
    return code


def verdict_of(code) -> str:
    if code is None:
        return NOT_MEASURED
    c = int(code)
    return NOT_MEASURED if c == 2 else CODES[c]


def similar_to_hard(idx, groups_: list[tuple], metric: str, rule: str = SAME) -> tuple[list[Comparison], list[str]]:
    """Per (model, training set, benchmark): soft's and fuzzy's hard-greedy ``metric`` against hard
    training's, read by ``rule`` (sameness, or COMPETITIVE); and each comparison's (model, training set) unit."""
    out, units = [], []
    for model, ds, bench in groups_:
        hard = cell(idx, model, ds, "hard", bench, "hard_greedy", metric)
        for mode in CONTINUOUS:
            r = cell(idx, model, ds, mode, bench, "hard_greedy", metric)
            out.append(compare(f"{model} trained on {ds}, {bench}: {mode} {fmt(r)} vs hard {fmt(hard)}", r, hard, rule))
            units.append(f"{model} on {ds}")
    return out, units


def nll_pairs(idx, mode: str, against: str):
    """(mode's cell, the reference cell, evidence line) of NLL_correct per model, training set and
    out-of-domain benchmark; the reference is hard training's cell or the base model's."""
    out = []
    for model, ds, bench in ood_groups(idx, "nll_correct"):
        r = cell(idx, model, ds, mode, bench, "loglik", "nll_correct")
        ref = (cell(idx, model, "none", "none", bench, "loglik", "nll_correct") if against == "base"
               else cell(idx, model, ds, against, bench, "loglik", "nll_correct"))
        out.append((r, ref, f"  {model} trained on {ds}, {bench}: {mode} {fmt(r)} vs {against} {fmt(ref)}"))
    return out


def margin_record(claim: str, kind: str | None, spec: Spec = DEFAULT) -> dict | None:
    if kind is None:
        return None
    return {"value": spec.margin(claim, kind), "unit": MARGINS[kind].unit, "why": MARGINS[kind].why}
