"""A judged claim as the report keeps it (``Claim``: its verdict, parts, evidence, what would flip
it, its odds in reproductions) and the words a verdict is said in: each part's count, each
comparison's evidence line, the runs a verdict rests on that failed to learn.

Why apart from judging: judging holds the rules and the statistics; this is what they produce, read
by the claims' judge (verdict.claims.judge), the report page and the docs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from softtokens.verdict import uncertainty
from softtokens.verdict.choices import AVERAGE, EVERY, Spec
from softtokens.verdict.judging import (
    NO_CELL,
    NOT_JUDGED,
    NOT_MEASURED,
    NOT_WORSE,
    SAME,
    SOURCES,
    SUPPORTED,
    Evaluated,
    PartPlan,
)


@dataclass
class Claim:
    key: str
    statement: str                  # the claim in one line
    quotes: list[dict]              # the paper's words: {"text", "where"}
    rule: str
    verdict: str = NOT_MEASURED
    margin: dict | None = None      # {"value", "unit", "why"} where the claim reads sameness
    parts: list[dict] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    comparisons: dict = field(default_factory=dict)   # {"paired": k, "unpaired": m}: how the test set entered
    sensitivity: list[dict] = field(default_factory=list)   # [{"specification", "verdict", "same_as"}], default first
    robust: bool | None = None      # every combination of the choices gives the default's verdict (multiverse)
    multiverse: dict | None = None  # every combination of the choices (robustness.multiverse.claim_multiverse)
    decide: str = ""                # an undecided claim: what would decide it
    reproducibility: dict | None = None   # each verdict's probability in simulated reproductions (robustness.reproducibility)
    source: str = "paper"
    failed_runs: list[str] = field(default_factory=list)   # runs the verdict rests on that failed to learn
    design: dict | None = None      # what this design could decide (verdict.design.design_record)

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"claim {self.key}: source {self.source!r}, one of {', '.join(SOURCES)}")
        if self.source == "paper" and not self.quotes:
            raise ValueError(f"claim {self.key} is the paper's: quote its words (or mark it source='ours')")

    @property
    def held(self) -> int:
        return sum(p["supported"] for p in self.parts)

    @property
    def total(self) -> int:
        return sum(p["k"] for p in self.parts)

    @property
    def not_informative(self) -> int:
        return sum(p["not_informative"] for p in self.parts)

    def counts(self) -> str:
        """What the verdict rests on, in words: each part's units established."""
        words = [part_words(p) for p in self.parts]
        if len(set(words)) == 1 and words[0] == "no cells":
            return words[0]
        if len(words) == 1:
            return words[0]
        return "; ".join(f"{p['name']}: {w}" for p, w in zip(self.parts, words))

    def support(self) -> tuple[int, int]:
        """(distinct specifications that support the claim, distinct specifications): the multiverse's where it was
        judged, else the one-at-a-time list's, each computation counted once."""
        if self.multiverse:
            return self.multiverse["counts"].get(SUPPORTED, 0), self.multiverse["distinct"]
        return self.support_one_at_a_time()

    def support_one_at_a_time(self) -> tuple[int, int]:
        """(distinct specifications that support the claim, distinct specifications), one choice changed at a time:
        each computation counted once (``same_as``)."""
        distinct = [s for s in self.sensitivity if not s.get("same_as")]
        return sum(s["verdict"] == SUPPORTED for s in distinct), len(distinct)

    def flips(self) -> list[str]:
        """What flips the verdict: the smallest sets of choices taken together (the multiverse), else the one-at-a-time
        alternatives whose verdict differs, 'label: verdict'."""
        if self.multiverse:
            m = self.multiverse
            return [" + ".join(s) for s in m["smallest_flips"]] if not m["robust"] else []
        return [f"{s['specification']}: {s['verdict']}" for s in self.sensitivity[1:] if s["verdict"] != self.verdict]

    def summary(self) -> str:
        if self.verdict == NOT_JUDGED:
            return self.verdict
        counts = self.counts()
        text = f"{self.verdict} — {counts}" if counts else self.verdict
        return text + (f"; {failed_text(self.failed_runs)}" if self.failed_runs else "")

    def record(self) -> dict:
        """Everything the report page shows of this claim (claims.json): ``supported_by`` one choice at a time,
        ``multiverse`` every combination."""
        held, tried = self.support_one_at_a_time()
        return {**self.__dict__, "summary": self.summary(), "held": self.held, "total": self.total,
                "supported_by": {"specifications": held, "of": tried, "listed": len(self.sensitivity),
                                 "kind": "distinct, one choice at a time"},
                "flips": self.flips()}


def failed_text(runs: list[str]) -> str:
    """What a verdict resting on runs that failed to learn says of them."""
    return (f"rests on {len(runs)} run(s) that failed to learn (below their base model, or no validation "
            f"question right): {', '.join(runs)}")


def failed_runs(parts: list[PartPlan], idx: dict) -> list[str]:
    """The training runs (model, training set, mode, seed) behind a plan's cells whose selected checkpoint
    failed to learn (cells.ours: ``failed_seeds``)."""
    runs = set()
    for part in parts:
        for c in part.comparisons:
            if c.missing == NO_CELL:   # not measured at all: rests on nothing
                continue
            for key, _ in c.terms:
                cell_ = idx.get(key) or {}
                for seed in cell_.get("failed_seeds") or ():
                    runs.add((key[0], key[1], key[2], int(seed)))
    return [f"{m} {d} {mode} seed {s}" for m, d, mode, s in sorted(runs)]


def part_words(p: dict) -> str:
    if not p["k"]:
        return (f"no informative comparison ({p['not_informative']} between identical cells)"
                if p["not_informative"] else "no cells")
    unit = p["unit_name"] + ("s" if p["k"] > 1 else "")
    need = {EVERY: "all", AVERAGE: "all"}.get(p["quantifier"], f"{p['m']} needed")
    if p["k"] == 1 and p["quantifier"] in (EVERY, AVERAGE):
        text = {1: "holds", -1: "fails", 0: "undecided"}[int(p["code"])]
    else:
        text = f"{p['supported']} of {p['k']} {unit} established ({need}), {p['contradicted']} contradicted"
    if p.get("expected") is not None and p["k"] > 1:
        text += (f"; {float(p['expected']):.1f} expected by chance if there were no difference" if p.get("difference")
                 else f"; {float(p['expected']):.1f} expected if the claim held exactly")
    if p.get("missing"):
        text += "; " + missing_words(p["missing"], p.get("comparisons") or p["k"])
    if p["not_informative"]:
        text += f"; {p['not_informative']} between identical cells, not counted"
    return text


def missing_words(missing: dict, of: int) -> str:
    """'3 of 30 comparisons cannot be made (no spread: one seed), counted undecided'."""
    n = sum(missing.values())
    why = "; ".join(f"{reason}: {count}" if len(missing) > 1 else reason for reason, count in missing.items())
    return f"{n} of {of} comparisons cannot be made ({why}), counted undecided"


def status_of(e: Evaluated, alpha: float) -> str:
    if e.p_sup <= alpha:
        return "supported"
    return "contradicted" if e.p_con <= alpha else "undecided"


def evidence_line(e: Evaluated, margin: float, spec: Spec) -> str:
    c = e.comparison
    if c.missing:
        return f"cannot be made ({c.missing}), counted undecided: {c.label}"
    if e.est is None:
        return f"{'holds' if c.holds else 'fails'}: {c.label}"
    lo, hi = uncertainty.interval(e.est, spec.alpha)
    df = "z" if math.isinf(e.est.df) else "t ≈ z" if e.est.df > 100 else f"t, {e.est.df:.1f} df"
    bound = {SAME: f" vs ±{margin:g}", NOT_WORSE: f" vs -{margin:g}"}.get(c.rule, " vs 0")
    return (f"{status_of(e, spec.alpha)}: {c.label}: {number(e.est.value)}, {100 * (1 - 2 * spec.alpha):g}% CI "
            f"[{number(lo)}, {number(hi)}]{bound} ({e.est.kind}, {df})")


def number(x: float) -> str:
    """A signed difference: two decimals for points, three below 1 (NLL nats)."""
    return f"{x:+.2f}" if abs(x) >= 1 else f"{x:+.3f}"
