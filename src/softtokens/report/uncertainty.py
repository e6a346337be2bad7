"""The standard error of a cell, of a difference of two cells and of an average of differences:
paired where the cells were scored on the same questions, unpaired where only their means are known.

Why one home: a verdict of "similar" or "beyond" is only as good as the standard error under it,
and the paper's claims compare cells in three shapes (one against one, an average over many, a
shared base model against several trainings). Each is a *contrast*, a weighted sum sum_k w_k x_k
of cells (a difference: +1 and -1; an average of m differences: +-1/m each, a cell that enters
several of them carrying the sum of its weights). Its variance has two parts:

- **seeds**: sum_k w_k^2 std_k^2 / n_k. Different cells are different training runs (or a base
  model, one evaluation, no seed spread), so their seeds are independent.
- **the test set**: the questions are the same for every cell of a benchmark, so two cells on it
  are not independent. Paired (ours: the evaluation files keep per-question results): per
  benchmark, the variance over its N questions of sum_k w_k q_k, divided by N, where q_k is cell
  k's per-question value averaged over its seeds (Miller 2024, "Adding Error Bars to Evals":
  paired differences; the covariance of cells on the same questions is inside it, which is why
  a paired difference of two correlated cells has a far smaller error than the unpaired sum).
  Unpaired (the paper's cells, means only; ours against the paper's): sum_k w_k^2 s_k, each cell's
  own test-set variance s_k taken as independent. For a claim that two cells *differ* that is the
  safe side; for a claim that they are *similar* it is the lenient one, so the paper's numbers are
  judged at both ends (seeds alone, and seeds + this term: report.claims).

A single cell's test-set variance (reproduction.py): ours measured from its questions, the paper's
a binomial p (100 - p) / N for a proportion and (NLL_ROW_CV x mean)^2 / N for an NLL.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pandas as pd

from softtokens.report.paper import CELL_KEYS

Z = 2.0            # standard errors: two cells differ beyond Z x the standard error of their difference
# the per-question spread of the paper's NLL of the correct answer, relative to its mean (the
# paper gives means only); a per-token NLL averaged over one answer varies about as much as it is large
NLL_ROW_CV = 1.0

PAIRED, UNPAIRED = "paired", "unpaired"


def proportion_var(mean_percent: float, n: int) -> float:
    """Sampling variance (%^2) of a proportion over n questions: p (100 - p) / n."""
    return mean_percent * (100.0 - mean_percent) / n


def cell_se(std: float, seeds: int, sampling_var: float) -> float:
    """Standard error of one cell: std^2 / seeds + its test-set variance. A base model (std 0, one
    seed) keeps the test-set part; NaN when the seed spread is unknown (one seed of a trained run)."""
    if seeds < 1 or pd.isna(std) or pd.isna(sampling_var):
        return float("nan")
    return math.sqrt(std * std / seeds + sampling_var)


def seed_var(cell: Mapping) -> float:
    """The seeds' share of a cell's variance, std^2 / n (0 for one evaluation of a base model; NaN
    for a trained cell whose spread is unknown)."""
    std, n = cell["std"], cell["n"]
    if pd.isna(std) or pd.isna(n) or n < 1:
        return float("nan")
    return float(std) ** 2 / float(n)


def test_var(cell: Mapping) -> float:
    """The test set's share of a cell's variance: its ``sampling_var``, or, for a cell given only
    its standard error, what of se^2 the seeds leave."""
    v = cell.get("sampling_var", float("nan")) if hasattr(cell, "get") else float("nan")
    if not pd.isna(v):
        return float(v)
    se = cell["se"]
    return float("nan") if pd.isna(se) else max(0.0, float(se) ** 2 - (seed_var(cell) if not pd.isna(seed_var(cell)) else 0.0))


def cell_key(cell: Mapping) -> tuple:
    return tuple(cell[k] for k in CELL_KEYS)


def questions_of(cell: Mapping) -> pd.Series | None:
    """A cell's per-question values (averaged over its seeds, indexed by question id), or None."""
    q = cell.get("questions") if hasattr(cell, "get") else None
    return q if isinstance(q, pd.Series) and len(q) else None


@dataclass(frozen=True)
class Spread:
    """The standard error of a contrast and how its test-set part was taken."""

    se: float
    kind: str             # PAIRED or UNPAIRED
    seeds_var: float      # the seeds' share of se^2
    test_var: float       # the test set's share of se^2

    @property
    def tolerance(self) -> float:
        return Z * self.se

    def __str__(self) -> str:
        return f"{self.kind} tolerance {self.tolerance:.2f}"


def _weights(terms: Iterable[tuple[Mapping, float]]) -> list[tuple[Mapping, float]]:
    """Terms with one entry per cell: a cell in several terms carries the sum of its weights."""
    by_key: dict[tuple, list] = {}
    for cell, w in terms:
        entry = by_key.setdefault(cell_key(cell), [cell, 0.0])
        entry[1] += w
    return [(c, w) for c, w in by_key.values() if w != 0.0]


def _paired_test_var(weighted: list[tuple[Mapping, float]]) -> float | None:
    """sum over benchmarks of Var_q(sum_k w_k q_k) / N, or None when any cell lacks per-question
    values or two cells of one benchmark were not scored on the same questions."""
    by_bench: dict[str, list[tuple[pd.Series, float]]] = {}
    for cell, w in weighted:
        q = questions_of(cell)
        if q is None:
            return None
        by_bench.setdefault(cell["benchmark"], []).append((q, w))
    total = 0.0
    for parts in by_bench.values():
        ids = parts[0][0].index
        if any(not q.index.is_unique or len(q) != len(ids) or not q.index.isin(ids).all() for q, _ in parts):
            return None
        combo = sum(w * q.reindex(ids).to_numpy(dtype=float) for q, w in parts)
        n = len(ids)
        mean = combo.sum() / n
        total += float(((combo - mean) ** 2).sum()) / n / n
    return total


def contrast(terms: Iterable[tuple[Mapping, float]], pair: bool = True) -> Spread:
    """The standard error of sum_k w_k x_k over cells (module docstring): paired when ``pair`` and
    every cell has per-question values on its benchmark's common questions, unpaired otherwise."""
    weighted = _weights(terms)
    seeds = sum(w * w * seed_var(c) for c, w in weighted)
    test = _paired_test_var(weighted) if pair else None
    kind = PAIRED
    if test is None:
        kind = UNPAIRED
        test = sum(w * w * test_var(c) for c, w in weighted)
    total = seeds + test
    se = math.sqrt(total) if not math.isnan(total) else float("nan")
    return Spread(se, kind, seeds, test)


def difference(a: Mapping, b: Mapping, pair: bool = True) -> Spread:
    """The standard error of a - b."""
    return contrast([(a, 1.0), (b, -1.0)], pair)


def average_difference(pairs: list[tuple[Mapping, Mapping]], pair: bool = True) -> tuple[float, Spread]:
    """The mean of (a_i - b_i) over the pairs and its standard error, a cell shared by several pairs
    (one base model against each of its trainings) counted once with the sum of its weights."""
    m = len(pairs)
    mean = sum(float(a["mean"]) - float(b["mean"]) for a, b in pairs) / m
    terms = [t for a, b in pairs for t in ((a, 1.0 / m), (b, -1.0 / m))]
    return mean, contrast(terms, pair)
