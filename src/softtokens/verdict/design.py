"""What a claim's design can decide, before what it decided: whether the claim could be *supported*
at all on these numbers (its verdict if every point estimate were exactly the claim's: no difference
for a claim of sameness or of not being worse), and, for an undecided claim, which way the estimates
lean, with the count.

Why: a test with no power gives the same verdict on every draw, and a reader who sees "undecided,
robust, P(same verdict) 1.00" takes it for a finding. On the paper's unpaired numbers the test sets
alone give a 90% half-width of at least 2.6 points on GSM8K and 5.2 on MATH-500, wider than a
2.5-point margin: no sameness claim can be supported on them whatever they are. That is said first,
and "robust" and the odds of the same verdict are shown only for verdicts that could have gone
another way (report.claim_rows)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from softtokens.verdict import uncertainty
from softtokens.verdict.choices import Spec
from softtokens.verdict.judging import FIXED, LESS, MORE, NOT_WORSE, SAME, needed, quantify, test


def _ideal_p(e, margin: float) -> float:
    """p of the claim's reading at an estimate exactly the claim's (a comparison that cannot be made: 1)."""
    c = e.comparison
    if c.missing:
        return 1.0
    if c.rule == FIXED:
        return 0.0
    if c.rule in (MORE, LESS):   # a claim of difference: any effect large enough establishes it
        return 0.0 if np.all(np.isfinite(np.asarray(e.est.se, dtype=float))) else 1.0
    return float(test(replace(e.est, value=0.0), c.rule, margin)[0])


def can_support(parts: list[dict], spec: Spec, margin: float) -> bool:
    """Whether every measured part would be supported at estimates exactly the claim's (units read as
    comparisons: the conservative count where a unit holds several)."""
    measured = [p for p in parts if p["code"] is not None]
    if not measured:
        return False
    for p in measured:
        ps = np.array([_ideal_p(e, margin) for e in p["evaluated"]])
        m = needed(len(ps), p["quantifier"], spec)
        if int(quantify(ps[:, None], np.ones((len(ps), 1)), m, spec)[0]) != 1:
            return False
    return True


def _distinct(parts: list[dict]) -> list:
    """Each comparison once (two parts of one claim may read the same comparison under two quantifiers)."""
    return list({e.comparison: e for p in parts for e in p["evaluated"]}.values())


def _test_half_widths(parts: list[dict], spec: Spec) -> list[float]:
    """The interval's half-width from the test set alone, per comparison of sameness."""
    crit = float(uncertainty.quantile(1 - spec.alpha, np.inf))
    return [crit * float(np.sqrt(e.est.test_var)) for e in _distinct(parts)
            if e.est is not None and e.comparison.rule in (SAME, NOT_WORSE) and np.ndim(e.est.test_var) == 0]


def why_not(parts: list[dict], spec: Spec, margin: float, unit: str) -> str:
    """Why the claim cannot be supported on this design, in words."""
    missing = sum(bool(e.comparison.missing) for e in _distinct(parts))
    total = len(_distinct(parts))
    halves = _test_half_widths(parts, spec)
    out = []
    if halves and min(halves) >= margin:
        out.append(f"the test sets alone leave ±{min(halves):.2f}–{max(halves):.2f} {unit}, wider than the "
                   f"±{margin:g} margin")
    elif halves and max(halves) >= margin:
        wide = sum(h >= margin for h in halves)
        out.append(f"on {wide} of {len(halves)} comparisons the test sets alone leave more than ±{margin:g} {unit}")
    if missing:
        out.append(f"{missing} of {total} comparisons cannot be made")
    return "; ".join(out) or "too few seeds or questions for the quantifier even at estimates exactly the claim's"


def _holds(e, margin: float) -> bool:
    """The point estimate on the claim's side (a difference at the margin to the printed digits: inside)."""
    v = round(float(e.est.value), 6)
    return {SAME: abs(v) <= margin, NOT_WORSE: v >= -margin, MORE: v > 0, LESS: v < 0}[e.comparison.rule]


def _second(e) -> str:
    """The second cell of a difference, by what tells it from the first ('hard training', 'soft_greedy')."""
    (a, _), (b, _) = e.comparison.terms[0], e.comparison.terms[-1]
    if a[2] != b[2]:
        return "the base model" if b[2] == "none" else f"{b[2]} training"
    return b[5] if a[5] != b[5] else "the second cell"


def lean(parts: list[dict], margin: float) -> str:
    """Which way an undecided claim's point estimates lean, in one line with the count."""
    made = [e for e in _distinct(parts) if e.est is not None and np.ndim(e.est.value) == 0
            and e.comparison.rule in (SAME, NOT_WORSE, MORE, LESS)]
    if not made:
        return "no estimate to lean on"
    held = [e for e in made if _holds(e, margin)]
    against = len(made) - len(held)
    # the words say what _holds counts: an estimate at the margin itself is on the claim's side
    words = {SAME: f"inside ±{margin:g}", NOT_WORSE: f"at or above -{margin:g}", MORE: "above 0", LESS: "below 0"}
    rules = {e.comparison.rule for e in made}
    where = words[next(iter(rules))] if len(rules) == 1 else "on the claim's side"
    text = (f"leans {'toward' if len(held) > against else 'against'} the claim: {len(held)} of {len(made)} point "
            f"estimates {where}")
    behind = [e for e in made if e.comparison.rule == SAME and round(float(e.est.value), 6) < -margin]
    if behind:
        names = {_second(e) for e in behind}
        text += f" ({len(behind)} with {names.pop() if len(names) == 1 else 'the second cell'} ahead by more)"
    units = [(p["contradicted"], p["k"], p["unit_name"]) for p in parts if p["code"] is not None and p["k"] > 1]
    contradicted = [u for u in units if int(u[0])]
    if contradicted:
        text += "; " + ", ".join(f"{int(c)} of {k} {u}s contradicted" for c, k, u in contradicted)
    return text


def design_record(parts: list[dict] | None, verdict: str, spec: Spec, margin: float, unit: str,
                  undecided: str) -> dict | None:
    """What a verdict's design could decide: ``can_support``, ``why_not`` (when it cannot), ``lean`` (an
    undecided verdict) and ``otherwise``: whether the verdict could have gone another way (an undecided
    verdict of a claim the design cannot support is the design's, not a finding)."""
    if parts is None:
        return None
    supportable = can_support(parts, spec, margin)
    return {"can_support": supportable,
            "why_not": None if supportable else why_not(parts, spec, margin, unit),
            "lean": lean(parts, margin) if verdict == undecided else None,
            "otherwise": supportable or verdict != undecided}
