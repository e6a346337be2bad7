"""Every combination of a verdict's choices at once (a multiverse, Steegen et al. 2016; a specification
curve, Simonsohn, Simmons and Nelson 2020): per claim, how many *distinct* specifications support it,
leave it undecided or contradict it, the smallest sets of choices that flip it, the paper's own reading
beside ours, and the verdict across every margin (where it changes is the finding).

Why not one choice at a time (verdict.claims.judge's "what would flip it"): two changes together can flip
a verdict that each change alone leaves standing (no test-set term with a normal reference flips three of
the paper's claims), and a count of specifications that support a claim means nothing while several of
them are the same computation on the data at hand (on the paper's unpaired means, "paired" is
"unpaired"; for a claim without a margin, the margin changes nothing).

How, exactly:
- The choices are verdict.choices.CHOICES, each with its default and its alternatives; the multiverse of
  a source ("paper" or "ours") is the product of every choice that can change that source's numbers
  (verdict.specs.size).
- A choice is *relevant* to a claim when the claim's plan has what the choice acts on (verdict.specs.relevant:
  a margin, two cells of one run, an NLL cell, a printed ±0, a 'generally', a part of several comparisons,
  a unit of several, one-sided words); the others cannot change its computation, so the product is
  enumerated over the relevant ones only (a test holds the verdicts equal to the full product's).
- Two specifications are *the same on these numbers* when every comparison's estimate, standard error and
  degrees of freedom (to 10 significant digits), every rule, the margin where a rule reads one, and every
  part's count (its k units, the m it asks for, the multiplicity rule where k > 1) are equal
  (verdict.specs.fingerprint); shares are of distinct specifications, each counted once.
- *Robust*: every distinct specification gives the default's verdict. *Smallest flips*: the combinations
  with the fewest choices away from the default whose verdict differs (every such set, as labels).
- The specification curve of a claim: per distinct specification, the comparison that decides it (in the
  weakest part, the m-th strongest unit's weakest comparison, m the quantifier's count), its estimate and
  1 - 2 alpha interval, the margin and the verdict (report.spec_curve draws it).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np

from softtokens.verdict import uncertainty
from softtokens.verdict.choices import MARGIN_RANGES, MARGINS, PAPER_READING, Spec
from softtokens.verdict.claims import paper_index, plans_for
from softtokens.verdict.judging import claim_code, claim_parts, grouped, resolved_plan, verdict_of
from softtokens.verdict.specs import dimensions, fingerprint, relevant_dimensions, size

CODE_NAMES = {1: "supported", 0: "undecided", -1: "contradicted", 2: "not yet measured"}
MAX_FLIPS = 6          # the smallest flipping sets a record lists (their count is kept)


def decisive(plan, parts: list[dict], spec: Spec) -> dict | None:
    """The comparison a verdict turns on: in the weakest part (the largest deciding p-value), the m-th strongest
    unit's weakest comparison (module docstring), as {estimate, lo, hi, rule, label}."""
    best = None
    for part, p in zip(resolved_plan(plan, spec), parts):
        if p["code"] is None:
            continue
        informative = [c for c in part.comparisons if c.informative]
        units = [u for c, u in zip(part.comparisons, part.units or [None] * len(part.comparisons)) if c.informative]
        made = [(u, e) for u, e in zip(units, p["evaluated"]) if e.est is not None and isinstance(e.est.value, float)]
        if not made or len(p["evaluated"]) != len(informative):
            continue
        ps = [float(np.asarray(e.p_sup)) for _, e in made]
        if grouped(part, spec):   # a unit's p is its weakest comparison's
            groups: dict[str, list[int]] = {}
            for i, (u, _) in enumerate(made):
                groups.setdefault(u, []).append(i)
            rows = [max(r, key=lambda i: ps[i]) for r in groups.values()]
        else:
            rows = list(range(len(made)))
        rows.sort(key=lambda i: ps[i])
        pick = rows[max(1, min(int(p["m"]), len(rows))) - 1]
        if best is None or ps[pick] > best[0]:
            best = (ps[pick], made[pick][1])
    if best is None:
        return None
    e = best[1]
    lo, hi = uncertainty.interval(e.est, spec.alpha)
    return {"estimate": float(e.est.value), "lo": float(lo), "hi": float(hi), "rule": e.comparison.rule,
            "label": e.comparison.label}


# ---------------------------------------------------------------- the multiverse of one claim
def claim_multiverse(defn, plan, index_for, source: str, base: Spec) -> dict | None:
    """The multiverse record of one claim (module docstring): sizes, shares, robustness, smallest flips, the
    paper's reading, the curve and the margin curve."""
    if not plan:
        return None
    dims = dimensions(source)
    idx0 = index_for(base)
    used = relevant_dimensions(dims, plan, idx0, defn.margin)
    caches: dict[int, dict] = {}         # per set of cells: its estimates (judging's cache) and their ids
    canon: dict[tuple, int] = {}         # (estimate, se, df) -> id, across every set of cells
    seen: dict[tuple, int] = {}          # fingerprint -> row of ``rows``
    rows: list[dict] = []
    default_code = None
    flips: list[tuple[int, tuple[str, ...]]] = []
    for combo in itertools.product(*(range(len(d.values)) for d in used)):
        changes: dict = {}
        for d, i in zip(used, combo):
            changes.update(d.values[i][1])
        spec = replace(base, **changes) if changes else base
        idx = index_for(spec)
        cache = caches.setdefault(id(idx), {"canon": canon})
        margin = spec.margin(defn.key, defn.margin)
        fp = fingerprint(plan, idx, spec, margin, cache)
        if fp in seen:
            row = rows[seen[fp]]
            row["combinations"] += 1
        else:
            parts = claim_parts(plan, idx, spec, margin, cache)
            code = claim_code(parts)
            row = {"code": 2 if code is None else int(code), "margin": margin, "combinations": 1,
                   "choices": [d.values[i][0] for d, i in zip(used, combo) if i],
                   "decisive": decisive(plan, parts, spec)}
            seen[fp] = len(rows)
            rows.append(row)
        if not any(combo):
            default_code = row["code"]
        else:
            flips.append((sum(1 for i in combo if i), tuple(d.values[i][0] for d, i in zip(used, combo) if i),
                          row["code"]))
    flipping = [(n, labels) for n, labels, code in flips if code != default_code]
    smallest = min((n for n, _ in flipping), default=None)
    minimal = sorted(list(labels) for n, labels in flipping if n == smallest)
    counts = {name: sum(r["code"] == code for r in rows) for code, name in CODE_NAMES.items()}
    paper_reading = _paper_reading(defn, plan, index_for, base, caches, canon)
    return {
        "specifications": size(source), "enumerated": math.prod(len(d.values) for d in used),
        "distinct": len(rows), "choices": [d.name for d in used],
        "dimensions": [{"choice": d.name, "values": [label for label, _ in d.values]} for d in used],
        "not_acting": [d.name for d in dims if d not in used],
        "counts": {k: v for k, v in counts.items() if v}, "default": CODE_NAMES[default_code],
        "robust": all(r["code"] == default_code for r in rows),
        "smallest_flips": minimal[:MAX_FLIPS], "smallest_flip_size": smallest, "smallest_flip_count": len(minimal),
        "paper_reading": paper_reading,
        "curve": compact_curve(rows),
        "margin_curve": margin_curve(defn, plan, idx0, base, caches.setdefault(id(idx0), {"canon": canon})),
    }


CURVE_COLUMNS = ("code", "margin", "combinations", "choices", "comparison", "rule", "estimate", "lo", "hi")


def _sig(x: float) -> float:
    return float(f"{x:.6g}")


def compact_curve(rows: list[dict]) -> dict:
    """The curve as claims.json keeps it: one row per distinct specification (CURVE_COLUMNS), its choices and its
    deciding comparison as indices into ``labels`` and ``comparisons`` (a claim of 1,296 specifications over one
    average of 15 cells would otherwise repeat that comparison's label 1,296 times)."""
    labels: dict[str, int] = {}
    comparisons: dict[str, int] = {}
    out = []
    for r in rows:
        d = r["decisive"] or {}
        out.append([r["code"], _sig(r["margin"]), r["combinations"],
                    [labels.setdefault(c, len(labels)) for c in r["choices"]],
                    comparisons.setdefault(d["label"], len(comparisons)) if d else None, d.get("rule"),
                    *(_sig(d[k]) if d else None for k in ("estimate", "lo", "hi"))])
    return {"columns": list(CURVE_COLUMNS), "rows": out, "labels": list(labels), "comparisons": list(comparisons)}


def curve_rows(m: dict) -> list[dict]:
    """The curve's rows as dicts (compact_curve undone): choices as labels, the deciding comparison as a dict."""
    curve = m["curve"]
    out = []
    for row in curve["rows"]:
        r = dict(zip(curve["columns"], row))
        out.append({"code": r["code"], "margin": r["margin"], "combinations": r["combinations"],
                    "choices": [curve["labels"][i] for i in r["choices"]],
                    "decisive": None if r["comparison"] is None else
                    {"label": curve["comparisons"][r["comparison"]], "rule": r["rule"], "estimate": r["estimate"],
                     "lo": r["lo"], "hi": r["hi"]}})
    return out


def _paper_reading(defn, plan, index_for, base: Spec, caches: dict, canon: dict) -> str:
    spec = replace(PAPER_READING, margins=base.margins)
    idx = index_for(spec)
    code = claim_code(claim_parts(plan, idx, spec, spec.margin(defn.key, defn.margin),
                                 caches.setdefault(id(idx), {"canon": canon})))
    return verdict_of(code)


def margin_curve(defn, plan, idx: dict, spec: Spec, cache: dict) -> dict | None:
    """The verdict at every margin of the claim's range (choices.MARGIN_RANGES), the rest of ``spec`` kept, and the
    margins where it changes."""
    if defn.margin is None:
        return None
    margins = MARGIN_RANGES[defn.margin]
    codes = np.broadcast_to(claim_code(claim_parts(plan, idx, spec, np.array(margins), cache)), (len(margins),))
    verdicts = [verdict_of(c) for c in codes]
    changes = [{"from": verdicts[i - 1], "to": verdicts[i], "at": margins[i]}
               for i in range(1, len(margins)) if verdicts[i] != verdicts[i - 1]]
    return {"unit": MARGINS[defn.margin].unit, "margins": list(margins), "verdicts": verdicts, "changes": changes,
            "stated": spec.margin(defn.key, defn.margin)}


def judge_multiverse(plans, index_for, source: str, base: Spec) -> dict[str, dict | None]:
    """claim key -> its multiverse record, for every planned claim."""
    return {d.key: claim_multiverse(d, plan, index_for, source, base) for d, plan in plans if plan}


def attach(claims: list, index_for, source: str, spec: Spec, entropy=None) -> list:
    """Each judged claim with its multiverse (``Claim.multiverse``) and robust only where every combination of the
    choices agrees (the one-at-a-time ``robust`` replaced)."""
    plans = plans_for(index_for(spec), entropy, tuple(c.key for c in claims))
    records = judge_multiverse(plans, index_for, source, spec)
    for c in claims:
        c.multiverse = records.get(c.key)
        if c.multiverse:
            c.robust = c.multiverse["robust"]
    return claims


def paper_claims(paper, spec: Spec, keys: tuple[str, ...] | None = None) -> list:
    """Every claim (or those of ``keys``) on the paper's own numbers, each alternative one at a time and every
    combination of the choices."""
    from softtokens.verdict.claims import judge_paper_claims

    return attach(judge_paper_claims(paper, spec=spec, keys=keys), paper_index(paper), "paper", spec)


def our_claims(cells, entropy, spec: Spec, keys: tuple[str, ...] | None = None) -> list:
    """Every claim (or those of ``keys``) on our cells, likewise."""
    from softtokens.verdict.claims import judge_claims, our_index

    idx = our_index(cells, entropy)
    return attach(judge_claims(cells, entropy, spec, keys=keys), lambda _: idx, "ours", spec, entropy)


# ---------------------------------------------------------------- words
def shares_text(m: dict | None) -> str:
    """'12 distinct of 3,456 specifications: 12 support' (the first screen and the claims table)."""
    if not m:
        return "—"
    counts = ", ".join(f"{n} {'support' if k == 'supported' else k}" for k, n in m["counts"].items())
    return f"{m['distinct']:,} distinct of {m['specifications']:,} specifications: {counts}"


def flips_text(m: dict | None) -> str:
    """The smallest sets of choices that flip the verdict, or that none does."""
    if not m:
        return "—"
    if m["robust"]:
        return f"nothing: all {m['distinct']:,} distinct specifications agree"
    sets = "; ".join(" + ".join(s) for s in m["smallest_flips"])
    more = m["smallest_flip_count"] - len(m["smallest_flips"])
    n = m["smallest_flip_size"]
    head = "one choice alone" if n == 1 else f"{n} choices together, no fewer"
    return f"{head}: {sets}" + (f" (and {more} more such sets)" if more > 0 else "")


def margin_text(m: dict | None) -> str:
    """Where the verdict changes along the margin's range."""
    curve = (m or {}).get("margin_curve")
    if not curve:
        return "—"
    lo, hi = curve["margins"][0], curve["margins"][-1]
    if not curve["changes"]:
        return f"{curve['verdicts'][0]} at every margin from {lo:g} to {hi:g} {curve['unit']}"
    steps = "; ".join(f"{c['to']} from {c['at']:g}" for c in curve["changes"])
    return f"{curve['verdicts'][0]} at {lo:g} {curve['unit']}; {steps}"
