"""Our cells: the evaluation files of a grid, one row per (file, metric), then per cell the mean and
sample std over seeds with the cell's standard error, its per-seed and per-question values.

Why below the verdict and the report: the tables, the reproduction report, the audit and the judge
read our numbers the same way; one home for how a file becomes a cell (the paper's cells: cells.paper).
A cell's standard error (cells.spread): the seeds' variance over k seeds / k plus the test set's
sampling variance, measured from the file's own questions.
"""

from __future__ import annotations

import pandas as pd

from softtokens.cells.paper import CELL_KEYS
from softtokens.cells.results import load_eval_frame, load_loglik_frame
from softtokens.cells.spread import cell_se, proportion_var


def seed_rows(eval_paths) -> pd.DataFrame:
    """One row per (evaluation file, metric): the CELL_KEYS, ``seed``, ``value``, its sampling
    variance ``sampling_var`` over the file's questions, ``n_problems``, ``path`` (and for the
    out-of-domain files their ``protocol``). Math settings give pass@1 and, when sampled, pass@n
    (n = samples per problem); the multiple-choice files (``loglik.json``) give accuracy (the
    paper files it under hard_greedy) and nll_correct (setting ``loglik``). ``questions``: the
    file's per-question values by question id (None for a file without per-question rows)."""
    from pathlib import Path

    paths = [Path(p) for p in eval_paths]
    keys = ["model", "train_dataset", "train_mode", "variant", "benchmark", "seed", "path", "n_problems",
            "failed_to_learn"]
    parts = []
    math_paths = [p for p in paths if p.stem != "loglik"]
    if math_paths:
        df = load_eval_frame(math_paths)
        parts.append(df[keys + ["setting"]].assign(metric="pass@1", value=df["pass@1"], sampling_var=df["pass@1_var"],
                                                   questions=df["pass@1_q"]))
        sampled = df[df["n"] > 1]  # a sampled setting: n CoTs per problem, so pass@n
        parts.append(sampled[keys + ["setting"]].assign(metric="pass@" + sampled["n"].astype(str),
                                                        value=sampled["pass@n"], sampling_var=sampled["pass@n_var"],
                                                        questions=sampled["pass@n_q"]))
    loglik = [p for p in paths if p.stem == "loglik"]
    if loglik:
        df = load_loglik_frame(loglik)
        parts.append(df[keys + ["protocol"]].assign(setting="hard_greedy", metric="accuracy", value=df["accuracy"],
                                                    sampling_var=df["accuracy_var"], questions=df["accuracy_q"]))
        parts.append(df[keys + ["protocol"]].assign(setting="loglik", metric="nll_correct", value=df["nll_correct"],
                                                    sampling_var=df["nll_correct_var"], questions=df["nll_correct_q"]))
    columns = [*CELL_KEYS, "seed", "value", "sampling_var", "n_problems", "protocol", "questions", "path",
               "failed_to_learn"]
    if not parts:
        return pd.DataFrame(columns=columns)
    out = pd.concat(parts, ignore_index=True)
    if "protocol" not in out:
        out["protocol"] = None
    # a file without per-question results: the binomial bound for a proportion, unknown for an NLL
    missing = out.sampling_var.isna() & (out.metric != "nll_correct") & (out.n_problems.fillna(0) > 0)
    out.loc[missing, "sampling_var"] = [proportion_var(v, n) for v, n in zip(out.value[missing], out.n_problems[missing])]
    return out[columns]


def _mean_questions(series) -> pd.Series | None:
    """A cell's per-question values averaged over its seeds, or None when a seed has none or the
    seeds were not scored on the same questions (then the cell cannot be paired)."""
    parts = list(series)
    if not parts or any(not isinstance(q, pd.Series) for q in parts):
        return None
    ids = parts[0].index
    if any(len(q) != len(ids) or not q.index.isin(ids).all() for q in parts):
        return None
    return sum(q.reindex(ids) for q in parts) / len(parts)


def aggregate(seeds: pd.DataFrame) -> pd.DataFrame:
    """Per cell: mean, sample std (NaN for one seed of a trained run; 0 for a base model), seed
    count ``n``, the mean sampling variance, ``se``, the per-seed values in seed order and the seeds
    (a claim calls two cells identical, so not informative, when the values are equal; one run's
    cells give a contrast's seed variance from them: verdict.uncertainty), the per-question values
    averaged over seeds (``questions``: paired comparisons), the evaluation files, and the seeds whose
    run failed to learn (``failed_seeds``: cells.results.failed_to_learn; a verdict resting on them says so)."""
    columns = [*CELL_KEYS, "mean", "std", "n", "sampling_var", "se", "values", "seeds", "questions", "protocol",
               "paths", "failed_seeds"]
    if seeds.empty:
        return pd.DataFrame(columns=columns)
    seeds = seeds.sort_values("seed")
    g = seeds.groupby(CELL_KEYS, sort=False)
    out = g["value"].agg(["mean", "std", "count"]).reset_index().rename(columns={"count": "n"})
    # a file without per-question rows (written before they were kept): its seeds' spread only
    out["sampling_var"] = g["sampling_var"].mean().fillna(0.0).values
    out["values"] = g["value"].agg(lambda s: tuple(round(v, 9) for v in s)).values
    out["seeds"] = g["seed"].agg(tuple).values
    out["questions"] = [_mean_questions(sub["questions"]) for _, sub in g]
    out["protocol"] = g["protocol"].agg(lambda s: next((p for p in s if p), None)).values
    out["paths"] = g["path"].agg(lambda s: sorted(s)).values
    out["failed_seeds"] = [tuple(sub.seed[sub.failed_to_learn.fillna(False).astype(bool)]) for _, sub in g]
    base = out.train_mode == "none"
    out.loc[base, "std"] = out.loc[base, "std"].fillna(0.0)
    out["se"] = [cell_se(s, 1 if b else k, v) for s, k, v, b in zip(out["std"], out["n"], out["sampling_var"], base)]
    return out[columns]
