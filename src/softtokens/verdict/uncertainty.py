"""The estimate, standard error and degrees of freedom of a contrast of cells, and the one-sided
tests a claim's verdict is made of.

Why one home: a verdict is only as good as the error under it, and the paper's claims compare cells
in three shapes (one against one, an average over many, a shared base model against several
trainings). Each is a *contrast* sum_k w_k x_k of cells (a difference: +1 and -1; an average of m
differences: +-1/m each, a cell in several of them carrying the sum of its weights). Its variance:

- **seeds**, per training run (a run's seeds are scored on every benchmark and setting, so one run's
  cells are not independent; different runs are): ours measured, the per-seed values of the run's
  cells giving the per-seed contrast, its variance over seeds / n; the paper's modelled, from each
  cell's std with correlation ``Spec.rho`` between two cells of one run (by default the bound, 0 or 1,
  that widens the comparison's interval). A base model is one
  evaluation: no seed part.
- **the test set**: paired (ours, Miller 2024, "Adding Error Bars to Evals"): per benchmark, the
  variance over its N questions of sum_k w_k q_k, / N, where q_k is cell k's per-question value
  averaged over its seeds; unpaired (the paper's means): sum_k w_k^2 s_k, each cell's own test-set
  variance; or none (a specification that leaves it out).

Degrees of freedom (Welch-Satterthwaite): each run's seed part has n - 1, the test-set part is
taken as exact (hundreds of questions), so a contrast resting on three seeds is judged with
Student's t at about 2 df and one dominated by the test set as with z. Every function here takes
floats or numpy arrays of draws alike (robustness.reproducibility simulates thousands at once).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from softtokens.cells.paper import CELL_KEYS
from softtokens.verdict.choices import DEFAULT, NO_TEST_SET, PAIRED, UNPAIRED, WIDEN, Spec

RUN_KEYS = ("model", "train_dataset", "train_mode", "variant")   # one training run's cells share these
# the fields of a specification a contrast's estimate depends on (the others act on the cells or on the tests)
ESTIMATE_FIELDS = ("rho", "test_set", "question_rho", "dist")


def cell_key(cell: Mapping) -> tuple:
    return tuple(cell[k] for k in CELL_KEYS)


def questions_of(cell: Mapping) -> pd.Series | None:
    """A cell's per-question values (averaged over its seeds, indexed by question id), or None."""
    q = cell.get("questions") if hasattr(cell, "get") else None
    return q if isinstance(q, pd.Series) and len(q) else None


def test_var(cell: Mapping):
    """The test set's share of a cell's variance (its ``sampling_var``)."""
    v = cell.get("sampling_var", float("nan")) if hasattr(cell, "get") else float("nan")
    return 0.0 if v is None else v


def _isnan(x) -> bool:
    return bool(np.any(np.isnan(x)))


@dataclass(frozen=True)
class Estimate:
    """A contrast's value, standard error and degrees of freedom, and how its error was taken."""

    value: object          # float, or an array of draws
    se: object
    df: object             # inf where no seed part (or a z specification)
    kind: str              # PAIRED / UNPAIRED / NO_TEST_SET: how the test set entered
    seeds_var: object      # the seeds' share of se^2
    test_var: object       # the test set's share of se^2
    seed_df: object        # the seed part's own Welch-Satterthwaite df (inf when it is 0)
    seeds: int             # seeds per run behind the seed part (for "how many would decide it")

    def rescaled(self, seeds) -> "Estimate":
        """The same contrast with ``seeds`` seeds per run (its seed part scaled by n / seeds); ``seeds`` an array
        of counts gives the contrast at each (elementwise: the same numbers as one count at a time)."""
        if self.seeds < 2 or (np.ndim(seeds) == 0 and seeds == self.seeds):
            return self
        sv = self.seeds_var * self.seeds / seeds
        sdf = self.seed_df * (seeds - 1) / (self.seeds - 1)
        return Estimate(self.value, np.sqrt(sv + self.test_var), satterthwaite(sv, sdf, self.test_var), self.kind,
                        sv, self.test_var, sdf, seeds)


def stacked(estimates: list[Estimate]) -> Estimate:
    """Scalar estimates as one Estimate of arrays (a batch of tests in one call; the kind of the first)."""
    def col(name):
        return np.array([float(getattr(e, name)) for e in estimates])

    return Estimate(col("value"), col("se"), col("df"), estimates[0].kind, col("seeds_var"), col("test_var"),
                    col("seed_df"), max(e.seeds for e in estimates))


def satterthwaite(seeds_var, seed_df, test_var):
    """Welch-Satterthwaite df of seeds_var (seed_df df) + test_var (exact)."""
    total = seeds_var + test_var
    with np.errstate(divide="ignore", invalid="ignore"):
        df = np.where(np.asarray(seeds_var) > 0, total ** 2 / (np.asarray(seeds_var) ** 2 / seed_df), np.inf)
    return float(df) if np.ndim(df) == 0 else df


def _seed_parts(weighted: list[tuple[Mapping, float]], rho) -> list[tuple[object, int]]:
    """(variance, seeds) of each training run's share of the contrast's seed variance."""
    runs: dict[tuple, list[tuple[Mapping, float]]] = {}
    for cell, w in weighted:
        if cell["train_mode"] != "none":          # a base model: one evaluation, no seed part
            runs.setdefault(tuple(cell[k] for k in RUN_KEYS), []).append((cell, w))
    parts = []
    for members in runs.values():
        measured = _measured(members)
        if measured is not None:
            parts.append(measured)
            continue
        n = min(int(c["n"]) for c, _ in members)
        sds = [(c["std"], w, int(c["n"])) for c, w in members]
        var = sum(w * w * s * s / k for s, w, k in sds)
        shared = 0.0     # the covariance terms at a correlation of 1 (the variance is linear in it)
        for i in range(len(sds)):
            for j in range(i + 1, len(sds)):
                si, wi, ki = sds[i]
                sj, wj, kj = sds[j]
                shared = shared + 2 * wi * wj * si * sj / math.sqrt(ki * kj)
        # WIDEN: whichever bound (0 or 1) gives the larger variance, per comparison (verdict.choices)
        var = var + (np.maximum(shared, 0.0) if rho == WIDEN else rho * shared)
        parts.append((var, n))
    return parts


def _measured(members: list[tuple[Mapping, float]]):
    """One run's seed variance from its per-seed values (ours), or None where the cells do not carry
    the same seeds (then it is modelled from their stds)."""
    seeds = [c.get("seeds") if hasattr(c, "get") else None for c, _ in members]
    values = [c.get("values") if hasattr(c, "get") else None for c, _ in members]
    if any(s is None or v is None or len(v) != len(s) for s, v in zip(seeds, values)):
        return None
    if len(set(map(tuple, seeds))) != 1 or len(seeds[0]) < 2:
        return None
    per_seed = sum(w * np.asarray(v, dtype=float) for (_, w), v in zip(members, values))
    n = len(seeds[0])
    return float(np.var(per_seed, ddof=1)) / n, n


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
        total += float(((combo - combo.mean()) ** 2).sum()) / n / n
    return total


def _question_covariance(weighted: list[tuple[Mapping, float]], rho: float):
    """2 rho sum_{k<l} w_k w_l s_k s_l over two cells of one benchmark and metric (unpaired cells scored on
    the same questions, their test-set errors correlated ``rho``: verdict.choices)."""
    if not rho:
        return 0.0
    total = 0.0
    for i, (a, wa) in enumerate(weighted):
        for b, wb in weighted[i + 1:]:
            if (a["benchmark"], a["metric"]) == (b["benchmark"], b["metric"]):
                total = total + 2 * rho * wa * wb * np.sqrt(test_var(a) * test_var(b))
    return total


def contrast(terms: Iterable[tuple[Mapping, float]], spec: Spec = DEFAULT) -> Estimate:
    """sum_k w_k x_k over cells, with its error (module docstring) under ``spec``: its test-set
    term paired where it asks for that and every cell has per-question values on its benchmark's
    common questions, unpaired where it cannot be paired, none where the specification leaves it out."""
    weighted = _weights(terms)
    value = sum(w * c["mean"] for c, w in weighted) if weighted else 0.0
    parts = _seed_parts(weighted, spec.rho)
    seeds = sum((v for v, _ in parts), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        denom = sum((v * v / (n - 1) if n > 1 else v * np.inf for v, n in parts), 0.0)
        seed_df = np.where(np.asarray(denom) > 0, np.asarray(seeds) ** 2 / denom, np.inf)
    seed_df = float(seed_df) if np.ndim(seed_df) == 0 else seed_df
    if spec.test_set == NO_TEST_SET:
        kind, test = NO_TEST_SET, 0.0
    else:
        test = _paired_test_var(weighted) if spec.test_set == PAIRED else None
        kind = PAIRED
        if test is None:
            kind = UNPAIRED
            test = sum(w * w * test_var(c) for c, w in weighted) + _question_covariance(weighted, spec.question_rho)
    total = seeds + test
    se = np.sqrt(total)
    se = float(se) if np.ndim(se) == 0 else se
    df = satterthwaite(seeds, seed_df, test) if spec.dist == "t" else math.inf
    n = max((k for _, k in parts), default=1)
    return Estimate(value, se, df, kind, seeds, test, seed_df, n)


def difference(a: Mapping, b: Mapping, spec: Spec = DEFAULT) -> Estimate:
    """a - b."""
    return contrast([(a, 1.0), (b, -1.0)], spec)


def average_difference(pairs: list[tuple[Mapping, Mapping]], spec: Spec = DEFAULT) -> Estimate:
    """The mean of (a_i - b_i) over the pairs, a cell shared by several pairs (one base model against
    each of its trainings) counted once with the sum of its weights."""
    m = len(pairs)
    return contrast([t for a, b in pairs for t in ((a, 1.0 / m), (b, -1.0 / m))], spec)


# ---------------------------------------------------------------- one-sided tests
def survival(x, df):
    """P(T > x) for Student's t with ``df`` degrees of freedom (normal where df is infinite)."""
    from scipy.special import ndtr, stdtr

    if np.ndim(x) == 0 and np.ndim(df) == 0:   # one comparison (most calls): the same functions, no array round trip
        x, df = float(x), float(df)
        return float(ndtr(-x)) if np.isinf(df) else float(stdtr(df, -x))
    x = np.asarray(x, dtype=float)
    df = np.broadcast_to(np.asarray(df, dtype=float), x.shape)
    out = np.where(np.isinf(df), ndtr(-x), stdtr(np.where(np.isinf(df), 1.0, df), -x))
    return float(out) if out.ndim == 0 else out


def quantile(p: float, df):
    """The t (normal where df is infinite) quantile: P(T <= q) = p."""
    from scipy.special import ndtri, stdtrit

    df = np.asarray(df, dtype=float)
    out = np.where(np.isinf(df), ndtri(p), stdtrit(np.where(np.isinf(df), 1.0, df), p))
    return float(out) if out.ndim == 0 else out


def p_greater(est: Estimate, threshold) -> object:
    """One-sided p-value of 'the true contrast is above threshold' (small: established)."""
    value, se = np.asarray(est.value, dtype=float), np.asarray(est.se, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, (value - threshold) / se, np.where(value > threshold, np.inf, -np.inf))
    return survival(z, est.df)


def p_less(est: Estimate, threshold) -> object:
    """One-sided p-value of 'the true contrast is below threshold'."""
    neg = Estimate(-np.asarray(est.value, dtype=float), est.se, est.df, est.kind, est.seeds_var, est.test_var,
                   est.seed_df, est.seeds)
    return p_greater(neg, -threshold)


def p_outside(est: Estimate, margin) -> object:
    """p-value of 'the true contrast lies outside +-margin': the chance of an estimate at least as far from
    0 as this one when the truth is the least favourable inside, exactly +-margin (both tails), so the
    test holds its level however large the error (each one-sided test alone would, at a true difference
    of +margin, also fire below -margin: up to twice the level when the error dwarfs the margin)."""
    value, se = np.abs(np.asarray(est.value, dtype=float)), np.asarray(est.se, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        near = np.where(se > 0, (value - margin) / se, np.where(value > margin, np.inf, -np.inf))
        far = np.where(se > 0, (value + margin) / se, np.inf)
    out = np.minimum(1.0, np.asarray(survival(near, est.df)) + np.asarray(survival(far, est.df)))
    return float(out) if out.ndim == 0 else out


def interval(est: Estimate, alpha: float):
    """The two-sided 1 - 2 alpha confidence interval (the one two one-sided tests at alpha read)."""
    half = quantile(1 - alpha, est.df) * est.se
    return est.value - half, est.value + half
