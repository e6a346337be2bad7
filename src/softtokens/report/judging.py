"""How a claim of the paper is judged: the verdict types, the quantifier rules read off the paper's
words, and the lookups over the table's cells that every claim shares (report.claims holds the
claims themselves). The rules and why: report.claims."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from softtokens.report.paper import CELL_KEYS
from softtokens.report.reproduction import Z
from softtokens.run.names import CONTINUOUS_MODES, MODES

TRAINED = MODES


CONTINUOUS = CONTINUOUS_MODES


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
def index_cells(cells: pd.DataFrame) -> dict:
    main = cells[cells.variant == ""]
    return {tuple(r[k] for k in CELL_KEYS): r for _, r in main.iterrows()}


def cell(idx, model, ds, mode, bench, setting, metric):
    return idx.get((model, ds, mode, "", bench, setting, metric))


def fmt(r) -> str:
    sd = "" if pd.isna(r["std"]) else f"±{r['std']:.2f}"
    se = "" if pd.isna(r["se"]) else f", se {r['se']:.2f}"
    return f"{r['mean']:.2f}{sd} (n={int(r['n'])}{se})"


def tolerance(a, b) -> float:
    return Z * math.sqrt(a["se"] ** 2 + b["se"] ** 2)


def known(*cells) -> bool:
    return all(c is not None and not pd.isna(c["se"]) for c in cells)


def identical(a, b) -> bool:
    va, vb = a.get("values"), b.get("values")
    return va is not None and vb is not None and len(va) > 0 and tuple(va) == tuple(vb)


def passk_metric(cells: pd.DataFrame) -> str | None:
    """The sampled metric with the largest k (the paper's pass@32; pass@n of a grid with n samples)."""
    ks = [int(m.split("@")[1]) for m in set(cells.metric) if m.startswith("pass@") and m != "pass@1"]
    return f"pass@{max(ks)}" if ks else None


def groups(idx, modes=TRAINED, metric_filter=lambda m: m.startswith("pass@")):
    return sorted({(k[0], k[1], k[4]) for k in idx if k[2] in modes and metric_filter(k[6])})


def average(diffs: list[tuple[float, float]]) -> tuple[float, float]:
    """Mean of differences and its standard error, from (difference, its tolerance) pairs."""
    m = len(diffs)
    mean = sum(d for d, _ in diffs) / m
    se = math.sqrt(sum((t / Z) ** 2 for _, t in diffs)) / m
    return mean, se


def best_cell(cells_):
    cells_ = [x for x in cells_ if x is not None and not pd.isna(x["se"])]
    return max(cells_, key=lambda x: x["mean"]) if cells_ else None


def hard_vs_other(idx, m: str, modes=TRAINED):
    """Per model, training, training set and benchmark: (label, the better hard setting, the best
    soft or fuzzy setting, their tolerance) of metric m."""
    for model, ds, bench in groups(idx, modes=modes):
        for mode in modes:
            hard = best_cell([cell(idx, model, ds, mode, bench, s, m) for s in HARD_SETTINGS])
            other = best_cell([cell(idx, model, ds, mode, bench, s, m) for s in OTHER_SETTINGS])
            if hard is not None and other is not None:
                tol = tolerance(hard, other)
                yield (f"{m}, {model} trained {mode} on {ds}, {bench}: {hard['setting']} {fmt(hard)} vs "
                       f"{other['setting']} {fmt(other)} (tolerance {tol:.2f})"), hard, other, tol


def ood_groups(idx, metric):
    return sorted({(k[0], k[1], k[4]) for k in idx if k[2] in TRAINED and k[6] == metric})


def nll_average(idx, mode: str, against: str):
    """(mean difference, its se, evidence) of NLL_correct, mode minus `against` (hard or the base)."""
    diffs, lines = [], []
    for model, ds, bench in ood_groups(idx, "nll_correct"):
        r = cell(idx, model, ds, mode, bench, "loglik", "nll_correct")
        ref = (cell(idx, model, "none", "none", bench, "loglik", "nll_correct") if against == "base"
               else cell(idx, model, ds, against, bench, "loglik", "nll_correct"))
        if not known(r, ref):
            continue
        diffs.append((r["mean"] - ref["mean"], tolerance(r, ref)))
        lines.append(f"  {model} trained on {ds}, {bench}: {mode} {fmt(r)} vs {against} {fmt(ref)}")
    return (*average(diffs), lines, len(diffs)) if diffs else (None, None, lines, 0)


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


def similar_to_hard(idx, groups_: list[tuple], metric: str) -> list[Check]:
    """Per (model, training set, benchmark): soft's and fuzzy's hard-greedy ``metric`` within
    Z combined standard errors of hard training's (identical cells: not informative)."""
    checks = []
    for model, ds, bench in groups_:
        hard = cell(idx, model, ds, "hard", bench, "hard_greedy", metric)
        for mode in CONTINUOUS:
            r = cell(idx, model, ds, mode, bench, "hard_greedy", metric)
            if not known(hard, r):
                continue
            tol = tolerance(r, hard)
            checks.append(Check(None if identical(r, hard) else abs(r["mean"] - hard["mean"]) <= tol + 1e-9,
                                f"{model} trained on {ds}, {bench}: {mode} {fmt(r)} vs hard {fmt(hard)} "
                                f"(tolerance {tol:.2f})"))
    return checks
