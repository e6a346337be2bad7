"""The published numbers of *Soft Tokens, Hard Truths*, as data a reproduction is compared with.

Why a file in the package: the reproduction report, its tests and a user auditing a cell must
read the same numbers, with their source named, without the paper's LaTeX at hand.
``paper_results.csv`` holds every cell of the paper's result tables in long form, transcribed
from the LaTeX source by a script (means and standard deviations over 3 seeds, 2 for the
ablations; percent except the NLL, which is in nats per token). Base models (``train_mode``
``none``) are one evaluation, std 0.
"""

from __future__ import annotations

import difflib
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
# what the paper's hyperparameter search selected (Appendix D, soft-tokens-hard-truths.tex lines 805-819):
# "The same optimal rates were found for both hard and fuzzy", per model; the scale factor 0.33 "across various
# models", "though most values below 1 performed well"
PAPER_SEARCH = {"learning_rate": {"llama-3b": 6e-6, "llama-8b": 3e-6, "qwen-3b": 8e-6},
                "noise_factor": {model: 0.33 for model in ("llama-3b", "llama-8b", "qwen-3b")},
                "where": "Appendix D (soft-tokens-hard-truths.tex, lines 805-819)"}

PAPER_SEEDS = {"main": 3, "ablation": 2, "base": 1}

# the decimals the paper prints a ± with: two in the out-of-domain table, one elsewhere (so a printed ±0.0 is a std
# below 0.05, and ±0.00 below 0.005: printed_bound)
PRINTED_DECIMALS = {"table:stdbenchmarks": 2}


def printed_bound(table: str) -> float:
    """The largest std a printed ±0 of ``table`` can round from (half its last printed digit)."""
    return 0.5 * 10.0 ** -PRINTED_DECIMALS.get(table, 1)


def paper_seeds(train_mode: str, variant: str = "") -> int:
    """How many seeds (evaluations) a published cell averages (PAPER_SEEDS)."""
    return PAPER_SEEDS["base"] if train_mode == "none" else PAPER_SEEDS["ablation" if variant else "main"]
# the key of one cell; a cell may appear in several tables (Table 1's cells recur in the appendix)
CELL_KEYS = ["model", "train_dataset", "train_mode", "variant", "benchmark", "setting", "metric"]


# what the paper's tables hold, by name: a cell naming anything else is a typo or another paper
PAPER_MODELS = ("llama-3b", "llama-8b", "qwen-3b")
PAPER_TRAIN_SETS = ("gsm8k", "math", "deepscaler", "none")     # "none": a base model, not trained
PAPER_BENCHMARKS = ("gsm8k", "math500", "olympiadbench", "arc", "hellaswag", "mmlu")
PAPER_METRICS = ("pass@1", "pass@32", "accuracy", "nll_correct")
# how many numbers each table prints (rows x columns, counted in the LaTeX source): a file that holds
# fewer has lost cells, and each one lost is named where a verdict would have read it
TABLE_CELLS = {"tab:main": 162, "table:stdbenchmarks": 108, "tab:gsm8k": 162, "tab:math500": 162,
               "tab:olympiad": 162, "tab:scale": 36, "tab:temp": 36, "tab:placement": 81}
ROW_KEYS = ["model", "train_dataset", "train_mode", "variant"]
COLUMN_KEYS = ["benchmark", "setting", "metric"]


# questions the paper scored where its printed digits say it scored other than the split we load: ARC-Challenge's
# accuracies admit N = 1,165 only (admitted_sizes; docs/protocol.md, "Which ARC-Challenge the paper scored")
PAPER_TEST_SIZES = {"arc": 1165}


def paper_test_size(benchmark: str) -> int | None:
    """The number of questions behind the paper's cells of ``benchmark`` (the test-set term of its numbers)."""
    from softtokens.data.sources import test_size

    return PAPER_TEST_SIZES.get(benchmark) or test_size(benchmark)   # a paper benchmark is named as its loader


class PaperResultsError(ValueError):
    """A paper-numbers file that cannot be what the paper printed; the message names file:line."""


def _known(path, df: pd.DataFrame) -> list[str]:
    from softtokens.config.names import MODES, SETTING_NAMES

    allowed = {"model": PAPER_MODELS, "train_dataset": PAPER_TRAIN_SETS, "train_mode": (*MODES, "none"),
               "benchmark": PAPER_BENCHMARKS, "setting": (*SETTING_NAMES, "loglik"), "metric": PAPER_METRICS,
               "table": tuple(TABLES)}
    out = []
    for i, row in enumerate(df.to_dict("records")):
        line = i + 2   # the header is line 1
        for column, known in allowed.items():
            if row[column] not in known:
                close = difflib.get_close_matches(str(row[column]), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(known)})"
                out.append(f"{path}:{line}: {column} {row[column]!r} is not one of the paper's{hint}")
        if row["variant"] and row["variant"] not in VARIANTS:
            out.append(f"{path}:{line}: ablation row {row['variant']!r} has no variant key (VARIANTS)")
        for column in ("mean", "std"):
            try:
                value = float(row[column])
            except (TypeError, ValueError):
                out.append(f"{path}:{line}: {column} {row[column]!r} is not a number")
                continue
            if value != value or value in (float("inf"), float("-inf")):
                out.append(f"{path}:{line}: {column} {row[column]!r} is not a finite number")
            elif column == "std" and value < 0:
                out.append(f"{path}:{line}: std {value} is negative")
        if (row["train_mode"] == "none") != (row["train_dataset"] == "none"):
            out.append(f"{path}:{line}: a base model has train_dataset and train_mode 'none', a trained one neither")
    return out


def _duplicates(path, df: pd.DataFrame) -> list[str]:
    """One cell printed twice in one table (two tables may print a cell: verdict.reproduction)."""
    out = []
    keys = ["table", *CELL_KEYS]
    first: dict[tuple, int] = {}
    for i, row in enumerate(df[keys].itertuples(index=False, name=None)):
        if row in first:
            out.append(f"{path}:{i + 2}: the cell of line {first[row]} again ({', '.join(map(str, row))})")
        else:
            first[row] = i + 2
    return out


def missing_cells(df: pd.DataFrame) -> pd.DataFrame:
    """The cells each table prints that the file lacks: a table is rows x columns, so a row (model,
    training set, mode, variant) present in it is expected in every column present in it; a trained
    (model, training set) is expected in every mode the table trains. Rows ``table`` + CELL_KEYS."""
    out = []
    for table, sub in df.groupby("table", sort=False):
        rows = set(map(tuple, sub[ROW_KEYS].values))
        trained_modes = {r[2] for r in rows if r[2] != "none"}
        if not set(sub.variant) - {""}:   # a main table: every mode of every trained pair
            rows |= {(m, d, mode, "") for m, d, _, _ in rows if d != "none" for mode in trained_modes}
        columns = set(map(tuple, sub[COLUMN_KEYS].values))
        have = set(map(tuple, sub[CELL_KEYS].values))
        out += [(table, *r, *c) for r in sorted(rows) for c in sorted(columns) if (*r, *c) not in have]
    return pd.DataFrame(out, columns=["table", *CELL_KEYS])


def load_paper_results(path: str | Path = PAPER_RESULTS) -> pd.DataFrame:
    """One row per published cell: ``table``, the CELL_KEYS (``variant`` in our naming, the paper's
    label in ``paper_variant``), ``mean``, ``std``, ``highlight``. Checked as it is read: known
    models, training sets, benchmarks, settings, metrics and tables, numbers that are numbers, no cell
    twice in one table (each mistake named by file:line). Cells a table prints that the file lacks are
    listed in ``attrs["missing"]`` (missing_cells), for the verdicts that would have read them."""
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as err:
        raise PaperResultsError(f"{path}: cannot be read as CSV ({err})") from None
    missing = {"table", *CELL_KEYS, "mean", "std"} - set(df.columns)
    if missing:
        raise PaperResultsError(f"{path}:1: missing columns {sorted(missing)}")
    if "highlight" not in df:
        df["highlight"] = ""
    problems = _known(path, df) + _duplicates(path, df)
    if problems:
        shown = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        raise PaperResultsError(f"{path}: {len(problems)} problem(s) with the paper's numbers:\n  {shown}")
    df["paper_variant"] = df["variant"]
    df["variant"] = df["variant"].map(lambda v: VARIANTS.get(v, v))
    df["mean"] = df["mean"].astype(float)
    df["std"] = df["std"].astype(float)
    df.attrs["missing"] = missing_cells(df)
    df.attrs["source"] = str(path)
    return df


def missing_text(paper: pd.DataFrame) -> str:
    """The paper's cells this file lacks, per table, in words ("" when it holds every one)."""
    lost = paper.attrs.get("missing")
    counts = paper.groupby("table").size()
    short = {t: n - int(counts.get(t, 0)) for t, n in TABLE_CELLS.items() if int(counts.get(t, 0)) < n}
    if (lost is None or lost.empty) and not short:
        return ""
    parts = [f"{t}: {n} of its {TABLE_CELLS[t]} numbers missing" for t, n in short.items()]
    return f"{paper.attrs.get('source', 'the paper-numbers file')} lacks cells the paper prints ({'; '.join(parts)})"


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
