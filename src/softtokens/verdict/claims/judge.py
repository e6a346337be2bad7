"""Every registered claim judged on a set of cells: the verdict at the default specification, what
it rests on, the verdict under each alternative specification ("what would flip it"), and, for an
undecided claim, what would decide it.

Why plan once, evaluate many times: a claim's comparisons are the paper's sentence, fixed by the
cells that exist; each specification (verdict.choices) only changes the statistics, so the plan is
made once and evaluated under every specification (and, in robustness.reproducibility, on simulated
reproductions)."""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Callable
from functools import lru_cache

import numpy as np
import pandas as pd

from softtokens.cells.lookup import entropy_cells
from softtokens.verdict import specs
from softtokens.verdict.choices import DEFAULT, MARGINS, Spec, alternatives
from softtokens.verdict.claims.define import ClaimDef, Context
from softtokens.verdict.design import design_record
from softtokens.verdict.judged import Claim, evidence_line, failed_runs, part_words, status_of
from softtokens.verdict.judging import (
    NOT_JUDGED,
    UNDECIDED,
    claim_code,
    claim_parts,
    index_cells,
    margin_record,
    passk_metric,
    test,
    verdict_of,
)
from softtokens.verdict.reproduction import TABLE_PRECEDENCE, paper_cells

PACKAGE = __name__.rsplit(".", 1)[0]
NOT_CLAIMS = {"define", "judge"}   # the package's modules that declare no claim
MAX_SEEDS = 50                     # "what would decide it" looks this far


@lru_cache(maxsize=1)
def registry() -> tuple[ClaimDef, ...]:
    """Every claim the package's modules declare (CLAIM, or CLAIMS for a family), in report order."""
    package = importlib.import_module(PACKAGE)
    found: dict[str, ClaimDef] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.name in NOT_CLAIMS:
            continue
        module = importlib.import_module(f"{PACKAGE}.{info.name}")
        for d in (*getattr(module, "CLAIMS", ()), *([module.CLAIM] if hasattr(module, "CLAIM") else [])):
            if d.key in found:
                raise ValueError(f"claim {d.key!r} declared twice ({info.name} and another module)")
            found[d.key] = d
    return tuple(sorted(found.values(), key=lambda d: (d.order, d.key)))


class MarginError(ValueError):
    """A judging.margins entry the claims cannot use; the message names the key."""


def margin_problems(margins: dict | None) -> list[str]:
    """What is wrong with a config's ``judging.margins``: a key that is no claim, or a claim that declares
    no margin (a claim of difference keeps its test: a margin there would be silently ignored)."""
    defs = {d.key: d for d in registry()}
    out = []
    for key in sorted(margins or {}):
        if key not in defs:
            close = difflib.get_close_matches(key, defs, n=1)
            out.append(f"judging.margins.{key}: no such claim" + (f" (did you mean {close[0]!r}?)" if close else "")
                       + f"; claims with a margin: {', '.join(k for k, d in defs.items() if d.margin)}")
        elif defs[key].margin is None:
            out.append(f"judging.margins.{key}: this claim declares no margin (its rule is a test of difference, "
                       f"{defs[key].rule.split('.')[0][:80]}...); remove the entry")
    return out


def judging_spec(config: dict | None, base: Spec = DEFAULT) -> Spec:
    """The specification a config asks for: ``base`` with its ``judging.margins`` (checked: MarginError)."""
    margins = ((config or {}).get("judging") or {}).get("margins") or {}
    problems = margin_problems(margins)
    if problems:
        raise MarginError("; ".join(problems))
    return base.with_margins(margins)


def plans_for(idx: dict, entropy: pd.DataFrame | None, keys: tuple[str, ...] | None = None
              ) -> list[tuple[ClaimDef, list | None]]:
    """Each claim's plan on these cells (those of ``keys``, in report order)."""
    ctx = Context(passk_metric(idx), entropy)
    defs = registry()
    if keys is not None:
        unknown = set(keys) - {d.key for d in defs}
        if unknown:
            raise KeyError(f"unknown claim(s) {', '.join(sorted(unknown))} (claims: {', '.join(d.key for d in defs)})")
        defs = tuple(d for d in defs if d.key in keys)
    return [(d, d.plan(idx, ctx)) for d in defs]


def judge_set(index_for: Callable[[Spec], dict], source: str, entropy: pd.DataFrame | None = None,
              spec: Spec = DEFAULT, sensitivity: bool = True, keys: tuple[str, ...] | None = None) -> list[Claim]:
    """Every claim (or those of ``keys``) on the cells ``index_for(spec)`` gives ("paper" or "ours"
    numbers): judged at ``spec``, then, with ``sensitivity``, at each alternative specification."""
    idx = index_for(spec)
    metric = passk_metric(idx)
    plans = [(d, p) for d, p in plans_for(idx, entropy, keys)]
    claims, evaluated = [], []
    for d, plan in plans:
        margin = spec.margin(d.key, d.margin)
        statement, rule = d.words(metric, margin if d.margin else None,
                                  MARGINS[d.margin].unit if d.margin else None)
        c = Claim(d.key, statement, list(d.quotes), rule, margin=margin_record(d.key, d.margin, spec),
                  source=d.source)
        parts = None
        if plan is None:
            c.verdict = NOT_JUDGED
        else:
            parts = claim_parts(plan, idx, spec, margin)
            c.verdict = verdict_of(claim_code(parts))
            c.failed_runs = failed_runs(plan, idx)
            c.parts = [part_record(p) for p in parts]
            c.evidence = evidence(parts, margin, spec)
            for p in parts:
                for e in p["evaluated"]:
                    if e.est is not None:
                        c.comparisons[e.est.kind] = c.comparisons.get(e.est.kind, 0) + 1
            unit = MARGINS[d.margin].unit if d.margin else "points"
            c.design = design_record(parts, c.verdict, spec, margin, unit, UNDECIDED)
            if c.verdict == UNDECIDED:
                c.decide = what_decides(parts, margin, spec)
        claims.append(c)
        evaluated.append(parts)
    if sensitivity:     # every combination of them: robustness.multiverse.attach
        one_at_a_time(claims, plans, index_for, source, spec)
    return claims


def one_at_a_time(claims: list[Claim], plans, index_for, source: str, spec: Spec) -> None:
    """Each claim judged under each alternative specification, one choice changed at a time (``sensitivity``),
    each entry marked with the first earlier one it computes the same as on these numbers (``same_as``:
    verdict.specs.fingerprint), so that a count of specifications counts each computation once."""
    caches: dict[int, dict] = {}
    canon: dict = {}
    seen: dict[str, dict] = {c.key: {} for c in claims}
    for label, alt in alternatives(source, spec):
        alt_idx = index_for(alt)
        cache = caches.setdefault(id(alt_idx), {"canon": canon})
        for c, (d, plan) in zip(claims, plans):
            if plan is None:
                continue
            margin = alt.margin(d.key, d.margin)
            verdict = c.verdict if alt == spec else verdict_of(claim_code(claim_parts(plan, alt_idx, alt, margin, cache)))
            fp = specs.fingerprint(plan, alt_idx, alt, margin, cache)
            first = seen[c.key].setdefault(fp, label)
            c.sensitivity.append({"specification": label, "verdict": verdict,
                                  "same_as": None if first == label else first})
    for c in claims:
        if c.sensitivity:
            c.robust = all(s["verdict"] == c.verdict for s in c.sensitivity)


def part_record(p: dict) -> dict:
    """A part as claims.json keeps it (plain numbers, no arrays)."""
    out = {k: p.get(k) for k in ("name", "quantifier", "unit_name", "k", "m", "not_informative")}
    out["verdict"] = verdict_of(p["code"]) if p["code"] is not None else verdict_of(None)
    for k in ("supported", "contradicted"):
        out[k] = int(p.get(k, 0))
    out["expected"] = None if p.get("expected") is None else round(float(p["expected"]), 2)
    out["difference"] = bool(p.get("difference", False))
    out["code"] = None if p["code"] is None else int(p["code"])
    out["missing"] = dict(p.get("missing") or {})
    out["comparisons"] = len(p.get("evaluated") or [])
    out["words"] = part_words(out)
    return out


def evidence(parts: list[dict], margin: float, spec: Spec) -> list[str]:
    lines = []
    for p in parts:
        prefix = f"[{p['name']}] " if len(parts) > 1 else ""
        lines += [prefix + evidence_line(e, margin, spec) for e in p["evaluated"]]
        lines += [f"{prefix}not informative (identical cells): {c.label}" for c in p.get("skipped", [])]
    return lines


def seeds_to_decide(e, margin: float, spec: Spec) -> int | None:
    """At this comparison's estimate, the seeds per run that decide it either way (None: no number
    of seeds up to MAX_SEEDS does: the test-set term alone is too large)."""
    est = e.est
    if est is None or est.seeds < 2:
        return None
    counts = np.arange(est.seeds + 1, MAX_SEEDS + 1)   # every count at once: the report's job is mostly this
    if not len(counts):
        return None
    p_sup, p_con = test(est.rescaled(counts), e.comparison.rule, margin)
    decided = np.flatnonzero((np.asarray(p_sup) <= spec.alpha) | (np.asarray(p_con) <= spec.alpha))
    return int(counts[decided[0]]) if len(decided) else None


def what_decides(parts: list[dict], margin: float, spec: Spec) -> str:
    """An undecided claim: its undecided comparisons, and how many seeds (or questions) would decide them."""
    pending = list({e.comparison: e for p in parts if p["code"] is not None and int(p["code"]) == 0
                    for e in p["evaluated"] if e.est is not None and status_of(e, spec.alpha) == "undecided"}.values())
    if not pending:
        return ("each comparison is decided on its own, but not enough of them at the family-wise level: "
                "more seeds narrow every interval")
    seeds = [seeds_to_decide(e, margin, spec) for e in pending]
    by_seeds = [n for n in seeds if n is not None]
    text = f"{len(pending)} comparison(s) undecided"
    if by_seeds:
        text += (f"; at their estimates {max(by_seeds)} seeds per run would decide "
                 f"{'all' if len(by_seeds) == len(pending) else len(by_seeds)} of them")
    rest = len(pending) - len(by_seeds)
    if rest:
        text += (f"; {rest} stay undecided with any number of seeds (up to {MAX_SEEDS}): their benchmark's "
                 f"questions leave too wide an interval (more questions, or per-question results to pair on)")
    return text


# ---------------------------------------------------------------- the two sources
def our_index(cells: pd.DataFrame | dict, entropy: pd.DataFrame | None = None) -> dict:
    """Our cells as the claims read them; ``entropy`` (judging.entropy_rows) joins the entropy claim's cells
    (cells.lookup.entropy_cells)."""
    return {**index_cells(cells), **entropy_cells(entropy)}


def judge_claims(cells: pd.DataFrame | dict, entropy: pd.DataFrame | None = None, spec: Spec = DEFAULT,
                 sensitivity: bool = True, keys: tuple[str, ...] | None = None) -> list[Claim]:
    """Every claim (or those of ``keys``) on our cells (our_index)."""
    idx = our_index(cells, entropy)
    return judge_set(lambda _: idx, "ours", entropy, spec, sensitivity, keys)


def judge_claim(key: str, cells: pd.DataFrame | dict, entropy: pd.DataFrame | None = None, spec: Spec = DEFAULT,
                sensitivity: bool = True):
    """One claim on our cells."""
    return judge_claims(cells, entropy, spec, sensitivity, (key,))[0]


def paper_index(paper: pd.DataFrame, precedence: tuple[str, ...] = TABLE_PRECEDENCE) -> Callable[[Spec], dict]:
    """The paper's cells under a specification (its ± read by paper_ddof, its NLL spread), cached."""
    cache: dict[tuple, dict] = {}

    def index_for(spec: Spec) -> dict:
        key = (spec.paper_ddof, spec.nll_row_cv, spec.zero_std)
        if key not in cache:
            cache[key] = index_cells(paper_cells(paper, spec, precedence=precedence))
        return cache[key]

    return index_for


def judge_paper_claims(paper: pd.DataFrame, precedence: tuple[str, ...] = TABLE_PRECEDENCE, spec: Spec = DEFAULT,
                       sensitivity: bool = True, keys: tuple[str, ...] | None = None) -> list[Claim]:
    """Every claim (or those of ``keys``) on the paper's own numbers; ``precedence``: which table's number a cell
    two tables print differently takes (reproduction.paper_conflicts)."""
    return judge_set(paper_index(paper, precedence), "paper", None, spec, sensitivity, keys)


def precedence_sensitivity(paper: pd.DataFrame, first: list[Claim] | None = None,
                           spec: Spec = DEFAULT) -> list[tuple[str, str, str]]:
    """(claim, verdict with Table 1's numbers first, verdict with the appendix tables' first) for every
    claim whose verdict on the paper's numbers changes with which table a disagreeing cell is read from."""
    first = judge_paper_claims(paper, spec=spec, sensitivity=False) if first is None else first
    appendix_first = tuple(t for t in TABLE_PRECEDENCE if t != "tab:main") + ("tab:main",)
    other = judge_paper_claims(paper, appendix_first, spec=spec, sensitivity=False)
    return [(a.key, a.verdict, b.verdict) for a, b in zip(first, other) if a.verdict != b.verdict]
