"""How a claim of the paper is judged: the verdicts, the quantifier rules read off the paper's
words, the two ends a verdict on the paper's means is taken at, and the lookups over the cells
that every claim shares (report.claims holds the claims themselves; report.uncertainty the
standard errors). The rules and why: report.claims and docs/protocol.md."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from softtokens.report import uncertainty
from softtokens.report.paper import CELL_KEYS
from softtokens.report.uncertainty import Spread
from softtokens.run.names import CONTINUOUS_MODES, MODES, settings_of

TRAINED = MODES
CONTINUOUS = CONTINUOUS_MODES
# the settings whose CoT is hard, and the others (soft or fuzzy CoTs), in the tables' order
HARD_SETTINGS = settings_of(("hard",))
OTHER_SETTINGS = settings_of(CONTINUOUS_MODES)

SUPPORTED, NOT_SUPPORTED, NOT_MEASURED = "supported", "not supported", "not yet measured"
DEPENDS = "depends on the test-set term"
NOT_JUDGED = "not judged: the paper gives this as figures only"
VERDICTS = (SUPPORTED, NOT_SUPPORTED, DEPENDS, NOT_MEASURED, NOT_JUDGED)

# the two ends a claim is judged at on the paper's numbers (means only, so no pairing is possible):
# the seeds' spread alone (strict for "similar", lenient for "differ") and with each cell's unpaired
# test-set term added (the other way round); a verdict stands only where both agree
SEEDS_ONLY, WITH_TEST_SET = "seeds only", "seeds + test set"
ENDS = (SEEDS_ONLY, WITH_TEST_SET)

# a quantifier's share of comparisons that must hold: (share, strictly more than it)
QUANTIFIERS = {"most": (0.5, True), "generally": (2 / 3, False), "every": (1.0, False)}

# "roughly the same entropy profile": mean CoT entropy within this factor of the base's (docs/protocol.md)
ENTROPY_FACTOR = 1.5

TEX = "soft-tokens-hard-truths.tex"

# whose words a claim is: the paper's sentence (quoted), or a statement of ours (no quote; the report says so)
SOURCES = ("paper", "ours")


@dataclass
class Check:
    ok: bool | None     # None: not informative (two identical cells)
    text: str

    def __post_init__(self):
        if self.ok is not None:
            self.ok = bool(self.ok)  # numpy's bools from pandas cells are not `True`

    def line(self) -> str:
        return {True: "holds: ", False: "fails: ", None: "not informative (identical cells): "}[self.ok] + self.text


@dataclass
class Part:
    """One quantified statement of a claim ("at pass@1", "soft"), judged on its own checks."""

    name: str
    quantifier: str
    held: int
    total: int             # checks counted (informative ones)
    not_informative: int
    passed: bool | None    # None: nothing informative to count

    def describe(self) -> str:
        if not self.total:
            return (f"no informative comparison ({self.not_informative} between identical cells)"
                    if self.not_informative else "no cells")
        if self.total == 1 and not self.not_informative:
            return "holds" if self.held else "fails"
        extra = f"; {self.not_informative} between identical cells, not counted" if self.not_informative else ""
        return f"{self.held} of {self.total} hold{extra}"


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
    parts: list[dict] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    comparisons: dict = field(default_factory=dict)   # {"paired": k, "unpaired": m}: how its tolerances were taken
    ends: dict | None = None        # the paper's numbers: each end's verdict, counts and evidence (both_ends)
    source: str = "paper"

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"claim {self.key}: source {self.source!r}, one of {', '.join(SOURCES)}")
        if self.source == "paper" and not self.quotes:
            raise ValueError(f"claim {self.key} is the paper's: quote its words (or mark it source='ours')")

    def judge(self, name: str, checks: list[Check], quantifier: str) -> bool | None:
        """Record one part's checks and its quantified result."""
        passed = share_holds(checks, quantifier)
        part = Part(name, quantifier, sum(c.ok is True for c in checks), sum(c.ok is not None for c in checks),
                    sum(c.ok is None for c in checks), passed)
        self.parts.append(part.__dict__)
        self.held += part.held
        self.total += part.total
        self.not_informative += part.not_informative
        self.evidence += [c.line() for c in checks]
        return passed

    def count(self, spread: Spread) -> Spread:
        self.comparisons[spread.kind] = self.comparisons.get(spread.kind, 0) + 1
        return spread

    def decide(self) -> "Claim":
        """Every part passed: supported; any part failed: not supported; else not yet measured."""
        results = [p["passed"] for p in self.parts]
        if not results or all(r is None for r in results):
            self.verdict = NOT_MEASURED
        elif any(r is False for r in results):
            self.verdict = NOT_SUPPORTED
        elif any(r is None for r in results):
            self.verdict = NOT_MEASURED
        else:
            self.verdict = SUPPORTED
        return self

    def counts(self) -> str:
        """What the verdict rests on, in words: each part's checks that hold."""
        parts = [Part(**p) for p in self.parts]
        if not parts:
            return ""
        if len(parts) == 1:
            return parts[0].describe()
        return "; ".join(f"{p.name}: {p.describe()}" for p in parts)

    def summary(self) -> str:
        """The verdict and what it rests on: each part's count, and on the paper's numbers each end's."""
        if self.verdict == NOT_JUDGED:
            return self.verdict
        if self.ends:
            return f"{self.verdict} — " + " | ".join(
                f"{end}: {e['verdict']}" + (f" ({e['counts']})" if e["counts"] else "") for end, e in self.ends.items())
        counts = self.counts()
        return f"{self.verdict} — {counts}" if counts else self.verdict

    def record(self) -> dict:
        """Everything the report page shows of this claim (claims.json)."""
        return {**self.__dict__, "summary": self.summary()}


def both_ends(seeds_only: Claim, with_test_set: Claim) -> Claim:
    """One claim on the paper's numbers from its two ends: the verdict where they agree, DEPENDS
    where they do not; each end's verdict, counts and evidence kept."""
    out = Claim(**{k: v for k, v in with_test_set.__dict__.items() if k != "ends"})
    out.ends = {end: {"verdict": c.verdict, "counts": c.counts(), "held": c.held, "total": c.total,
                      "not_informative": c.not_informative, "parts": c.parts, "evidence": c.evidence}
                for end, c in ((SEEDS_ONLY, seeds_only), (WITH_TEST_SET, with_test_set))}
    if seeds_only.verdict != with_test_set.verdict and NOT_JUDGED not in (seeds_only.verdict, with_test_set.verdict):
        out.verdict = DEPENDS
    return out


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
def index_cells(cells: pd.DataFrame | dict) -> dict:
    """The main (default-variant) cells by their key, each a plain dict of its columns (an index
    already made is returned as it is: judge_claims makes it once for every claim)."""
    if isinstance(cells, dict):
        return cells
    main = cells[cells.variant == ""]
    return {tuple(r[k] for k in CELL_KEYS): r for r in main.to_dict("records")}


def cell(idx, model, ds, mode, bench, setting, metric):
    return idx.get((model, ds, mode, "", bench, setting, metric))


def fmt(r) -> str:
    """mean ± std (n seeds, se): one seed or one evaluation has no spread, so no ±."""
    n = 0 if pd.isna(r["n"]) else int(r["n"])
    sd = "" if pd.isna(r["std"]) or n < 2 else f"±{r['std']:.2f}"
    se = "" if pd.isna(r["se"]) else f", se {r['se']:.2f}"
    return f"{r['mean']:.2f}{sd} (n={n}{se})"


def spread(a, b) -> Spread:
    """The standard error of a - b: paired on their questions where both have them (ours), else
    unpaired (report.uncertainty)."""
    return uncertainty.difference(a, b)


def known(*cells) -> bool:
    return all(c is not None and not pd.isna(c["se"]) for c in cells)


def identical(a, b) -> bool:
    va, vb = a.get("values"), b.get("values")
    return va is not None and vb is not None and len(va) > 0 and tuple(va) == tuple(vb)


def significance(diff: float, s: Spread) -> str:
    """How a point-estimate difference stands against its tolerance, in words."""
    if math.isnan(s.se):
        return "significance unknown"
    word = "significant" if abs(diff) > s.tolerance + 1e-9 else "not significant"
    return f"{word}: {diff:+.2f} vs {s}"


def passk_metric(cells: pd.DataFrame | dict) -> str | None:
    """The sampled metric with the largest k (the paper's pass@32; pass@n of a grid with n samples)."""
    metrics = {k[-1] for k in cells} if isinstance(cells, dict) else set(cells.metric)
    ks = [int(m.split("@")[1]) for m in metrics if m.startswith("pass@") and m != "pass@1"]
    return f"pass@{max(ks)}" if ks else None


def groups(idx, modes=TRAINED, metric_filter=lambda m: m.startswith("pass@")):
    return sorted({(k[0], k[1], k[4]) for k in idx if k[2] in modes and metric_filter(k[6])})


def best_cell(cells_):
    cells_ = [x for x in cells_ if x is not None and not pd.isna(x["se"])]
    return max(cells_, key=lambda x: x["mean"]) if cells_ else None


def distinct_others(others: list, hards: list) -> list:
    """The soft / fuzzy settings' cells that are not a hard setting's cell under another name (on
    the toy fuzzy greedy takes hard greedy's tokens): comparing those says nothing."""
    return [o for o in others if o is not None and not any(h is not None and identical(o, h) for h in hards)]


def hard_vs_other(idx, m: str, modes=TRAINED):
    """Per model, training, training set and benchmark: (label, the better hard setting, the best
    soft or fuzzy setting that is not a hard one under another name, or None when every one is)
    of metric m, by point estimate."""
    for model, ds, bench in groups(idx, modes=modes):
        for mode in modes:
            hards = [cell(idx, model, ds, mode, bench, s, m) for s in HARD_SETTINGS]
            others = [cell(idx, model, ds, mode, bench, s, m) for s in OTHER_SETTINGS]
            hard = best_cell(hards)
            if hard is None or best_cell(others) is None:
                continue
            other = best_cell(distinct_others(others, hards))
            label = f"{m}, {model} trained {mode} on {ds}, {bench}"
            if other is None:
                yield f"{label}: every soft or fuzzy setting decodes as a hard one", hard, None
            else:
                yield f"{label}: {hard['setting']} {fmt(hard)} vs {other['setting']} {fmt(other)}", hard, other


def ood_groups(idx, metric):
    return sorted({(k[0], k[1], k[4]) for k in idx if k[2] in TRAINED and k[6] == metric})


def nll_pairs(idx, mode: str, against: str):
    """(mode's cell, the reference cell, evidence line) of NLL_correct per model, training set and
    out-of-domain benchmark; the reference is hard training's cell or the base model's."""
    out = []
    for model, ds, bench in ood_groups(idx, "nll_correct"):
        r = cell(idx, model, ds, mode, bench, "loglik", "nll_correct")
        ref = (cell(idx, model, "none", "none", bench, "loglik", "nll_correct") if against == "base"
               else cell(idx, model, ds, against, bench, "loglik", "nll_correct"))
        if known(r, ref):
            out.append((r, ref, f"  {model} trained on {ds}, {bench}: {mode} {fmt(r)} vs {against} {fmt(ref)}"))
    return out


def entropy_rows(eval_paths) -> pd.DataFrame:
    """Per math evaluation file: its mean CoT entropy over positions, weighted by the number of CoTs
    that reach each position (the profile the paper plots, reduced to one number)."""
    from softtokens.run.paths import parse_eval_path

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


def similar_to_hard(claim: Claim, idx, groups_: list[tuple], metric: str) -> list[Check]:
    """Per (model, training set, benchmark): soft's and fuzzy's hard-greedy ``metric`` within
    Z standard errors of its difference from hard training's (identical cells: not informative)."""
    checks = []
    for model, ds, bench in groups_:
        hard = cell(idx, model, ds, "hard", bench, "hard_greedy", metric)
        for mode in CONTINUOUS:
            r = cell(idx, model, ds, mode, bench, "hard_greedy", metric)
            if not known(hard, r):
                continue
            s = claim.count(spread(r, hard))
            checks.append(Check(None if identical(r, hard) else abs(r["mean"] - hard["mean"]) <= s.tolerance + 1e-9,
                                f"{model} trained on {ds}, {bench}: {mode} {fmt(r)} vs hard {fmt(hard)} ({s})"))
    return checks
