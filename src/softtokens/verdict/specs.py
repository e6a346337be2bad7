"""The space of specifications a verdict can be read under: each choice of verdict.choices as a dimension
(its default and its alternatives), which choices can act on a claim's plan at all, and a specification's
fingerprint on a plan: what it computes (each comparison's estimate, error and degrees of freedom, its rule, the
margin, each part's count), so that two specifications computing the same numbers for a claim count once.

Why in the verdict's room: the one-at-a-time alternatives (claims.judge) and every combination of them
(robustness.multiverse) count specifications the same way; the fingerprint reads the judge's own estimates
(judging's cache), so it cannot drift from what a verdict is computed from."""

from __future__ import annotations

import math
from dataclasses import dataclass

from softtokens.verdict import uncertainty
from softtokens.verdict.choices import CHOICES, GENERALLY, Choice, Spec
from softtokens.verdict.judging import COMPETITIVE, FIXED, NO_CELL, NOT_WORSE, SAME, cached_estimate, grouped, needed


@dataclass(frozen=True)
class Dimension:
    """One choice as the multiverse varies it: its values, the default first, each (label, fields changed)."""

    choice: Choice
    values: tuple[tuple[str, dict], ...]

    @property
    def name(self) -> str:
        return self.choice.name


def dimensions(source: str) -> list[Dimension]:
    """Every choice with alternatives that can change ``source``'s numbers, in CHOICES' order."""
    return [Dimension(c, ((f"{c.name}: {c.default_text()}", {}), *c.alternatives))
            for c in CHOICES if source in c.sources and c.alternatives]


def size(source: str) -> int:
    """How many specifications the multiverse of ``source`` holds (the product of every choice's values)."""
    return math.prod(len(d.values) for d in dimensions(source))


# ---------------------------------------------------------------- what a claim's plan gives each choice to act on
def _cells(plan, idx):
    return [[idx[k] for k, _ in c.terms if k in idx] for p in plan for c in p.comparisons
            if c.informative and not c.missing]


def _shared(cells, key) -> bool:
    """Whether a comparison holds two cells with the same ``key`` (base models, one evaluation, left out
    where the key is a run)."""
    seen = [key(c) for c in cells]
    seen = [s for s in seen if s is not None]
    return len(seen) != len(set(seen))


def _run(c):
    return None if c["train_mode"] == "none" else tuple(c[k] for k in uncertainty.RUN_KEYS)


def relevant(field: str, plan, idx: dict, margin_kind: str | None) -> bool:
    """Whether the choice setting ``field`` can change this plan's computation (module docstring)."""
    cells = _cells(plan, idx)
    comparisons = [c for p in plan for c in p.comparisons if c.informative and not c.missing]
    if field == "margin_scale":
        return margin_kind is not None and any(c.rule in (SAME, NOT_WORSE, COMPETITIVE) for c in comparisons)
    if field == "rho":
        return any(_shared(cs, _run) for cs in cells)
    if field == "question_rho":
        return any(_shared(cs, lambda c: (c["benchmark"], c["metric"])) for cs in cells)
    if field == "nll_row_cv":
        return any(c["metric"] == "nll_correct" for cs in cells for c in cs)
    if field == "zero_std":
        return any(c["train_mode"] != "none" and c.get("shown_std", 1.0) == 0 for cs in cells for c in cs)
    if field in ("generally", "generally_strict"):
        return any(p.quantifier == GENERALLY for p in plan)
    if field == "multiplicity":
        return any(sum(c.informative and c.missing != NO_CELL for c in p.comparisons) > 1 for p in plan)
    if field == "unit":
        return any(p.units is not None for p in plan)
    if field == "reading":
        return any(c.rule == COMPETITIVE for c in comparisons)
    return True       # alpha, dist, paper_ddof, test_set: every comparison with an error


def relevant_dimensions(dims: list[Dimension], plan, idx: dict, margin_kind: str | None) -> list[Dimension]:
    return [d for d in dims if any(relevant(f, plan, idx, margin_kind)
                                   for _, changes in d.values for f in (changes or {d.choice.field: None}))]


# ---------------------------------------------------------------- one specification
def _digits(x) -> float:
    x = float(x)
    return x if not math.isfinite(x) or x == 0 else float(f"{x:.10g}")


def _estimates_id(plan, idx: dict, spec: Spec, cache: dict) -> tuple:
    """Each comparison's (estimate, se, df) to 10 significant digits, as one id per distinct triple, for every
    comparison of the plan under ``spec``'s estimate fields (computed once per set of cells and fields)."""
    fields = tuple(getattr(spec, f) for f in uncertainty.ESTIMATE_FIELDS)
    memo = cache.setdefault(("ids", id(plan)), {})   # one per plan (the plan outlives the cache: judge_set)
    if fields not in memo:
        canon = cache["canon"]
        ids = []
        for part in plan:
            for c in part.comparisons:
                if not c.informative or c.missing or c.rule == FIXED:
                    ids.append(-1)
                    continue
                est = cached_estimate(c, idx, spec, cache)   # the judge's own, from the same cache
                triple = (_digits(est.value), _digits(est.se), _digits(est.df))
                ids.append(canon.setdefault(triple, len(canon)))
        memo[fields] = tuple(ids)
    return memo[fields]


def fingerprint(plan, idx: dict, spec: Spec, margin: float, cache: dict) -> tuple:
    """What a specification computes on this plan: each comparison's (estimate, se, df) to 10 significant digits,
    the margin where a rule reads it, the reading of one-sided words where the plan has them, and each part's
    count."""
    rules = {c.rule for p in plan for c in p.comparisons}
    uses_margin = bool(rules & {SAME, NOT_WORSE, COMPETITIVE})
    return (_estimates_id(plan, idx, spec, cache), (round(margin, 12) if uses_margin else None),
            spec.alpha, spec.reading if COMPETITIVE in rules else None, tuple(_counting(p, spec) for p in plan))


def _counting(part, spec: Spec) -> tuple:
    """How a part counts under ``spec``: its units k (grouped or not), the m it asks for, and the multiplicity
    rule where it has more than one unit (two specifications asking for the same m of the same k count alike)."""
    by_unit = grouped(part, spec)
    if by_unit:
        k = len({u for c, u in zip(part.comparisons, part.units) if c.informative})
    else:
        k = sum(c.informative for c in part.comparisons)
    m = needed(k, part.quantifier, spec) if k else 0
    return k, m, by_unit, spec.multiplicity if k > 1 else None
