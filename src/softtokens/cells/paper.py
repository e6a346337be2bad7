"""The published numbers of *Soft Tokens, Hard Truths*, as data a reproduction is compared with.

Why a file in the package: the reproduction report, its tests and a user auditing a cell must
read the same numbers, with their source named, without the paper's LaTeX at hand.
``paper_results.csv`` holds every cell of the paper's result tables in long form, transcribed
from the LaTeX source by a script (means and standard deviations over 3 seeds, 2 for the
ablations; percent except the NLL, which is in nats per token). Base models (``train_mode``
``none``) are one evaluation, std 0.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

PAPER_RESULTS = Path(__file__).with_name("paper_results.csv")
SOURCE = ("Butt, Kwiatkowski, Labiad, Kempe, Ollivier (Meta FAIR, 2025), 'Soft Tokens, Hard Truths', LaTeX "
          "source: Table 1 (tab:main), the out-of-domain table (table:stdbenchmarks), the six-setting appendix "
          "tables (tab:gsm8k, tab:math500, tab:olympiad) and the ablations (tab:scale, tab:temp, tab:placement)")

# the paper's table labels, in the order the report lists them, with what each one is
TABLES = {
    "tab:main": "Table 1: hard inference, pass@1 and pass@32, every model and training set",
    "table:stdbenchmarks": "Out-of-domain multiple choice: accuracy and NLL of the correct answer",
    "tab:gsm8k": "Appendix: all six inference settings on GSM8K",
    "tab:math500": "Appendix: all six inference settings on MATH-500",
    "tab:olympiad": "Appendix: all six inference settings on OlympiadBench",
    "tab:scale": "Ablation: noise factor",
    "tab:temp": "Ablation: fuzzy temperature",
    "tab:placement": "Ablation: noise placement",
}
# the paper's ablation row labels -> the variant key of a run in our layout ("" = the paper's
# default cell, which the ablation tables repeat from the main runs: same runs, not retrained)
VARIANTS = {
    "gamma=0.33": "", "tau=0.0001": "", "Fuzzy Embedding 0.0001 -": "", "Soft Embedding 0.5 -": "",
    "Training None Tokens 1.0 1": "",
    "gamma=0.1": "gamma0.1", "gamma=1.0": "gamma1.0", "gamma=3.0": "gamma3.0",
    "tau=0.001": "tau0.001", "tau=0.01": "tau0.01", "tau=0.1": "tau0.1",
    "Fuzzy Final Hidden 0.0001 -": "hidden", "Soft Final Hidden 0.5 -": "hidden",
    "Fuzzy Logits 0.0001 -": "logits", "Soft Logits 0.5 -": "logits",
    "Soft Logits 1.0 5": "logits-top5", "Soft Logits 1.0 50": "logits-top50",
}
# seeds behind a published cell: 3 in the main tables, 2 in the ablations, 1 evaluation of a base model
PAPER_SEEDS = {"main": 3, "ablation": 2, "base": 1}


def paper_seeds(train_mode: str, variant: str = "") -> int:
    """How many seeds (evaluations) a published cell averages (PAPER_SEEDS)."""
    return PAPER_SEEDS["base"] if train_mode == "none" else PAPER_SEEDS["ablation" if variant else "main"]
# the key of one cell; a cell may appear in several tables (Table 1's cells recur in the appendix)
CELL_KEYS = ["model", "train_dataset", "train_mode", "variant", "benchmark", "setting", "metric"]


def load_paper_results(path: str | Path = PAPER_RESULTS) -> pd.DataFrame:
    """One row per published cell: ``table``, the CELL_KEYS (``variant`` in our naming, the paper's
    label in ``paper_variant``), ``mean``, ``std``, ``highlight``."""
    df = pd.read_csv(path, dtype={"variant": str, "highlight": str}, keep_default_na=False)
    missing = {"table", *CELL_KEYS, "mean", "std"} - set(df.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")
    unknown = set(df.table) - set(TABLES)
    if unknown:
        raise ValueError(f"{path}: unknown tables {sorted(unknown)} (known: {', '.join(TABLES)})")
    unmapped = set(df.variant) - set(VARIANTS) - {""}
    if unmapped:
        raise ValueError(f"{path}: ablation rows with no variant key: {sorted(unmapped)}")
    df["paper_variant"] = df["variant"]
    df["variant"] = df["variant"].map(lambda v: VARIANTS.get(v, v))
    df["mean"] = df["mean"].astype(float)
    df["std"] = df["std"].astype(float)
    return df


def attainable(value: float, denominator: int, decimals: int) -> bool:
    """Whether a printed percentage (``decimals`` places) is 100 k / denominator for an integer k."""
    near = round(value * denominator / 100)
    return any(abs(100 * k / denominator - value) <= 0.5 * 10 ** -decimals + 1e-9 for k in (near - 1, near, near + 1))


def admitted_sizes(paper: pd.DataFrame, benchmark: str, metric: str, sizes, decimals: int = 2) -> dict[int, int]:
    """For each test-set size N: how many of the paper's ``metric`` cells on ``benchmark`` it can
    produce. A base model's number is k / N; a trained cell's is a mean over its seeds, k / (seeds N).
    Why: a size the printed numbers cannot come from is not the set the paper scored (docs/protocol.md,
    "Which ARC-Challenge the paper scored")."""
    sub = paper[(paper.benchmark == benchmark) & (paper.metric == metric) & (paper.variant == "")]
    sub = sub.drop_duplicates(CELL_KEYS)
    seeds = [paper_seeds(m) for m in sub.train_mode]
    return {n: sum(attainable(v, k * n, decimals) for v, k in zip(sub["mean"], seeds)) for n in sizes}


def admits_seeds(mean: float, std: float, denominator: int, seeds: int, decimals: int, ddof: int) -> bool:
    """Whether ``seeds`` values k_i / denominator (integers k_i, in percent) have the printed mean and,
    with ``ddof``, the printed std (both to ``decimals`` places)."""
    import itertools
    import math

    half = 0.5 * 10 ** -decimals + 1e-9
    step = 100.0 / denominator
    lo = math.ceil((mean - half) * seeds / step - 1e-9)
    hi = math.floor((mean + half) * seeds / step + 1e-9)
    reach = int((std + half) * math.sqrt(seeds) / step) + 2   # no value lies further than this from the mean
    for total in range(lo, hi + 1):
        centre = total // seeds
        for head in itertools.combinations_with_replacement(range(centre - reach, centre + reach + 1), seeds - 1):
            last = total - sum(head)
            if last < head[-1]:
                continue
            values = [100.0 * k / denominator for k in (*head, last)]
            m = sum(values) / seeds
            sd = math.sqrt(sum((v - m) ** 2 for v in values) / (seeds - ddof))
            if abs(sd - std) <= half:
                return True
    return False


def admitted_ddof(paper: pd.DataFrame, benchmark: str, metric: str, denominator: int, ddof: int,
                  decimals: int = 2) -> tuple[int, int]:
    """(trained cells whose printed mean and ± some seed values k / denominator give with ``ddof``,
    trained cells). Why: the paper does not say whether its ± is a sample or a population std, and the
    seeds' variance of a mean depends on it; where the printed digits are fine enough (ARC-Challenge's
    accuracies, two decimals over 1,165 questions) only one reading fits (verdict.choices)."""
    sub = paper[(paper.benchmark == benchmark) & (paper.metric == metric) & (paper.variant == "")
                & (paper.train_mode != "none")].drop_duplicates(CELL_KEYS)
    seeds = [paper_seeds(m) for m in sub.train_mode]
    fits = sum(admits_seeds(m, s, denominator, k, decimals, ddof) for m, s, k in zip(sub["mean"], sub["std"], seeds))
    return fits, len(sub)
