"""One cell's standard error: the spread of its seeds and the sampling variance of its test set.

Why its own module: our cells (cells.ours) and the paper's (verdict.reproduction) are given their
standard error by the same two formulas, and the verdict's contrasts (verdict.uncertainty) are sums of
the same parts.
"""

from __future__ import annotations

import math

import pandas as pd


def proportion_var(mean_percent: float, n: int) -> float:
    """Sampling variance (%^2) of a proportion over n questions: p (100 - p) / n."""
    return mean_percent * (100.0 - mean_percent) / n


def cell_se(std: float, seeds: int, sampling_var: float) -> float:
    """Standard error of one cell: std^2 / seeds + its test-set variance (std a sample std). A base
    model (std 0, one seed) keeps the test-set part; NaN when the seed spread is unknown."""
    if seeds < 1 or pd.isna(std) or pd.isna(sampling_var):
        return float("nan")
    return math.sqrt(std * std / seeds + sampling_var)
