"""Our numbers beside the paper's, cell by cell, each with an uncertainty a statistician accepts.

Why: a reproduction is read one number at a time (does it match, and how close). A cell is one
(model, training set, training mode, variant, benchmark, setting, metric); ours is the mean and
sample std over seeds of the per-seed evaluation files. Values are percent except ``nll_correct``
(nats per token).

The uncertainty of a cell (its standard error ``se``) has two parts:
- **seeds**: the sample variance over its k training seeds divided by k (0 for a base model,
  one evaluation; unknown for a trained cell with one seed);
- **the test set**: the sampling variance of a mean over the benchmark's N questions, which
  does not shrink with more seeds (every seed is tested on the same N questions). Ours is
  measured from the evaluation file's own questions (variance of the per-question value / N).
  The paper publishes only means: a proportion p (pass@1, pass@k, accuracy) gets the binomial
  p (1 - p) / N, which bounds the variance of any mean of per-question values in [0, 1]; an NLL
  gets (Spec.nll_row_cv x mean)^2 / N. The paper's ± is read as its specification says (a
  population std by default: verdict.choices), and stored as the sample std it implies.

se^2 = std^2 / k + sampling variance. Ours beside the paper's is an unpaired comparison (the
paper's per-question results are not published), read as a claim of sameness: the two *agree*
when the difference's interval lies inside the margin, *differ* when it lies outside, and are
undecided otherwise (verdict.judging), so a noisier reproduction cannot agree more easily. Two of
*our* cells are compared paired, on their questions (verdict.uncertainty); our cells keep their
per-question values (``questions``) and per-seed values (``values``, ``seeds``) for that.
docs/protocol.md states the rules with worked cases.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from softtokens.cells.paper import CELL_KEYS, TABLES, paper_seeds, paper_test_size, printed_bound
from softtokens.cells.spread import cell_se, proportion_var
from softtokens.verdict import uncertainty
from softtokens.verdict.choices import DEFAULT, MARGINS, NLL, POINTS, ROUNDING_BOUND, Spec

__all__ = ["paper_cells", "paper_conflicts", "compare", "with_spread", "AGREES", "DIFFERS", "UNDECIDED"]

# ---------------------------------------------------------------- the paper's cells
TABLE_PRECEDENCE = tuple(TABLES)  # a cell two tables print differently takes the first table's number


def paper_conflicts(paper: pd.DataFrame) -> pd.DataFrame:
    """Cells the paper prints in several tables with different numbers (Table 1 and the appendix
    tables disagree on some sample pass@1 cells by up to 0.5 points): one row per (cell, table),
    ``used`` where the claims take it from (TABLE_PRECEDENCE)."""
    rank = {t: i for i, t in enumerate(TABLE_PRECEDENCE)}
    p = paper.assign(_rank=paper.table.map(rank)).sort_values([*CELL_KEYS, "_rank"])
    differ = p.groupby(CELL_KEYS)[["mean", "std"]].transform(lambda s: s.nunique() > 1).any(axis=1)
    out = p[differ].copy()
    out["used"] = ~out.duplicated(CELL_KEYS)
    return out.drop(columns="_rank").reset_index(drop=True)


def paper_cells(paper: pd.DataFrame, spec: Spec = DEFAULT, precedence: tuple[str, ...] = TABLE_PRECEDENCE
                ) -> pd.DataFrame:
    """The paper's numbers as cells: one row per key, from the first table of ``precedence`` that
    prints it (paper_conflicts lists where tables disagree); seeds (3, 2 for the ablations, 1 for a
    base model); ``std`` the sample std its printed ± implies under ``spec`` (``shown_std`` the
    printed one); the test-set variance its benchmark's size implies; se. A cell a table prints that the
    file lacks (cells.paper.missing_cells) is a row with no number and ``missing`` saying so, so that
    every verdict that would have read it names it and counts it undecided (judging)."""
    rank = {t: i for i, t in enumerate(precedence)}
    ordered = paper.assign(_rank=paper.table.map(lambda t: rank.get(t, len(rank)))).sort_values("_rank", kind="stable")
    cells = with_spread(ordered.drop_duplicates(CELL_KEYS)[[*CELL_KEYS, "table", "mean", "std"]], spec)
    cells["missing"] = None
    lost = paper.attrs.get("missing")
    if lost is not None and not lost.empty:
        lost = lost.drop_duplicates(CELL_KEYS)
        lost = lost[~lost.set_index(CELL_KEYS).index.isin(cells.set_index(CELL_KEYS).index)]
        source = paper.attrs.get("source", "the paper-numbers file")
        holes = lost.assign(mean=float("nan"), std=float("nan"), n=0, shown_std=float("nan"),
                            sampling_var=float("nan"), se=float("nan"), missing=f"missing from {source}")
        cells = pd.concat([cells, holes[cells.columns]], ignore_index=True)
    cells["values"] = None
    cells["seeds"] = None
    cells["questions"] = None
    cells["protocol"] = None
    cells["failed_seeds"] = None
    return cells.reset_index(drop=True)


def sample_std(std, n, ddof: int):
    """The sample std (ddof 1) of n values whose std was printed with ``ddof``."""
    if ddof == 1:
        return std
    return np.where(np.asarray(n) > 1, np.asarray(std) * np.sqrt(np.asarray(n) / np.maximum(np.asarray(n) - 1, 1)), std)


def with_spread(paper: pd.DataFrame, spec: Spec = DEFAULT) -> pd.DataFrame:
    """Rows of the paper's numbers with their seeds ``n`` (paper_seeds), the sample ``std`` their ± implies
    (``shown_std`` as printed), test-set variance ``sampling_var`` and standard error ``se``."""
    out = paper.copy()
    out["n"] = [paper_seeds(m, v) for m, v in zip(out.train_mode, out.variant)]
    out["shown_std"] = out["std"]
    if spec.zero_std == ROUNDING_BOUND:   # a trained cell's printed ±0: the largest std it rounds from (choices)
        zero = (out["std"] == 0) & (out["train_mode"] != "none")
        out.loc[zero, "std"] = [printed_bound(t) for t in out.loc[zero, "table"]]
    out["std"] = sample_std(out["std"].to_numpy(dtype=float), out["n"].to_numpy(), spec.paper_ddof)
    out["sampling_var"] = [paper_sampling_var(b, m, x, spec.nll_row_cv)
                           for b, m, x in zip(out.benchmark, out.metric, out["mean"])]
    out["se"] = [cell_se(s, k, v) for s, k, v in zip(out["std"], out["n"], out["sampling_var"])]
    return out


def paper_sampling_var(benchmark: str, metric: str, mean: float, nll_row_cv: float = DEFAULT.nll_row_cv) -> float:
    n = paper_test_size(benchmark)
    if n is None:
        return float("nan")
    if metric == "nll_correct":
        return (nll_row_cv * mean) ** 2 / n
    return proportion_var(mean, n)


# ---------------------------------------------------------------- cell by cell
AGREES, DIFFERS, UNDECIDED = "agrees", "differs", "undecided"


def cell_margin(metric: str, spec: Spec = DEFAULT) -> float:
    """How far ours may sit from the paper's and still agree: the claims' margin of the metric's unit."""
    return MARGINS[NLL if metric == "nll_correct" else POINTS].value * spec.margin_scale


def agreement(diff, ours_var, ours_n, paper_var, paper_n, margin: float, spec: Spec = DEFAULT) -> tuple:
    """(verdict, interval low, interval high) of ours - the paper's: two independent cells, each a seed
    part (std^2 / n, n - 1 df) and a test-set part; the interval of two one-sided tests at alpha."""
    (o_seed, o_test), (p_seed, p_test) = ours_var, paper_var
    parts = [(v, n) for v, n in ((o_seed, ours_n), (p_seed, paper_n)) if v > 0 and n > 1]
    seeds = o_seed + p_seed
    denom = sum(v * v / (n - 1) for v, n in parts)
    seed_df = seeds ** 2 / denom if denom > 0 else math.inf
    test = (o_test if spec.test_set != "none" else 0.0) + (p_test if spec.test_set != "none" else 0.0)
    est = uncertainty.Estimate(diff, math.sqrt(seeds + test), uncertainty.satterthwaite(seeds, seed_df, test)
                               if spec.dist == "t" else math.inf, uncertainty.UNPAIRED, seeds, test, seed_df,
                               max(ours_n, paper_n))
    lo, hi = uncertainty.interval(est, spec.alpha)
    verdict = AGREES if -margin < lo and hi < margin else DIFFERS if lo >= margin or hi <= -margin else UNDECIDED
    return verdict, lo, hi


def compare(paper: pd.DataFrame, ours: pd.DataFrame, spec: Spec = DEFAULT) -> pd.DataFrame:
    """Every paper cell (every table's row: a cell two tables print differently is compared with
    each) with ours beside it: ``ours_mean`` NaN where we have no such cell; ``agreement`` of ours with
    the paper's within ``margin`` (agreement()), unpaired (the paper's per-question results are not
    published); ours with one seed (spread unknown) counts its sampling variance only. An accuracy
    measured under another protocol than the paper's (generative, softtokens.ood) is shown but not
    compared."""
    spread = with_spread(paper, spec)
    out = paper.assign(paper_se=spread["se"], paper_seed_var=spread["std"] ** 2 / spread["n"],
                       paper_test_var=spread["sampling_var"], paper_n=spread["n"])
    out = out.rename(columns={"mean": "paper_mean", "std": "paper_std"})
    mine = ours.rename(columns={"mean": "ours_mean", "std": "ours_std", "n": "ours_n", "se": "ours_se",
                                "protocol": "ours_protocol"})
    out = out.merge(mine[[*CELL_KEYS, "ours_mean", "ours_std", "ours_n", "ours_se", "sampling_var", "ours_protocol"]],
                    on=CELL_KEYS, how="left")
    out["diff"] = out["ours_mean"] - out["paper_mean"]
    out["margin"] = [cell_margin(m, spec) for m in out.metric]
    other_protocol = (out.metric == "accuracy") & out.ours_protocol.notna() & (out.ours_protocol != "generative")
    verdicts, lows, highs = [], [], []
    for r, other in zip(out.itertuples(), other_protocol):
        if math.isnan(r.diff) or other or pd.isna(r.sampling_var):
            verdicts.append(None), lows.append(float("nan")), highs.append(float("nan"))
            continue
        base = r.train_mode == "none"
        o_seed = 0.0 if base or pd.isna(r.ours_std) or pd.isna(r.ours_n) else r.ours_std ** 2 / r.ours_n
        v, lo, hi = agreement(r.diff, (o_seed, r.sampling_var), 1 if base or pd.isna(r.ours_n) else int(r.ours_n),
                              (r.paper_seed_var, r.paper_test_var), int(r.paper_n), r.margin, spec)
        verdicts.append(v), lows.append(lo), highs.append(hi)
    out["agreement"] = pd.Series(verdicts, index=out.index, dtype=object)
    out["ci_low"], out["ci_high"] = lows, highs
    out["note"] = ["accuracy by the cloze protocol: not the paper's (generative), not compared" if o else ""
                   for o in other_protocol]
    return out.drop(columns=["sampling_var", "paper_seed_var", "paper_test_var", "paper_n"])
