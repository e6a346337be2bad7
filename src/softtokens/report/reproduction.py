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
  gets (NLL_ROW_CV x mean)^2 / N.

se^2 = std^2 / k + sampling variance. Two cells differ when |a - b| > Z sqrt(se_a^2 + se_b^2);
ours matches the paper's when it does not. docs/protocol.md states the rule with worked cases.
"""

from __future__ import annotations

import math

import pandas as pd

from softtokens.data.sources import TEST_SIZES
from softtokens.report.paper import CELL_KEYS
from softtokens.report.results import load_eval_frame, load_loglik_frame

Z = 2.0            # standard errors: two cells differ beyond Z sqrt(se_a^2 + se_b^2)
# the per-question spread of the paper's NLL of the correct answer, relative to its mean (the
# paper gives means only); a per-token NLL averaged over one answer varies about as much as it is large
NLL_ROW_CV = 1.0
PAPER_SEEDS = {"main": 3, "ablation": 2, "base": 1}


def proportion_var(mean_percent: float, n: int) -> float:
    """Sampling variance (%^2) of a proportion over n questions: p (100 - p) / n."""
    return mean_percent * (100.0 - mean_percent) / n


def cell_se(std: float, seeds: int, sampling_var: float) -> float:
    """Standard error of a cell: std^2 / seeds + sampling variance (module docstring). A base
    model (std 0, one seed) keeps the sampling part; NaN when the seed spread is unknown."""
    if seeds < 1 or pd.isna(std) or pd.isna(sampling_var):
        return float("nan")
    return math.sqrt(std * std / seeds + sampling_var)


# ---------------------------------------------------------------- our cells
def seed_rows(eval_paths) -> pd.DataFrame:
    """One row per (evaluation file, metric): the CELL_KEYS, ``seed``, ``value``, its sampling
    variance ``sampling_var`` over the file's questions, ``n_problems``, ``path`` (and for the
    out-of-domain files their ``protocol``). Math settings give pass@1 and, when sampled, pass@n
    (n = samples per problem); the multiple-choice files (``loglik.json``) give accuracy (the
    paper files it under hard_greedy) and nll_correct (setting ``loglik``)."""
    from pathlib import Path

    paths = [Path(p) for p in eval_paths]
    keys = ["model", "train_dataset", "train_mode", "variant", "benchmark", "seed", "path", "n_problems"]
    parts = []
    math_paths = [p for p in paths if p.stem != "loglik"]
    if math_paths:
        df = load_eval_frame(math_paths)
        parts.append(df[keys + ["setting"]].assign(metric="pass@1", value=df["pass@1"], sampling_var=df["pass@1_var"]))
        sampled = df[df.setting.str.endswith("_sample")]
        parts.append(sampled[keys + ["setting"]].assign(metric="pass@" + sampled["n"].astype(str),
                                                        value=sampled["pass@n"], sampling_var=sampled["pass@n_var"]))
    loglik = [p for p in paths if p.stem == "loglik"]
    if loglik:
        df = load_loglik_frame(loglik)
        parts.append(df[keys + ["protocol"]].assign(setting="hard_greedy", metric="accuracy", value=df["accuracy"],
                                                    sampling_var=df["accuracy_var"]))
        parts.append(df[keys + ["protocol"]].assign(setting="loglik", metric="nll_correct", value=df["nll_correct"],
                                                    sampling_var=df["nll_correct_var"]))
    columns = [*CELL_KEYS, "seed", "value", "sampling_var", "n_problems", "protocol", "path"]
    if not parts:
        return pd.DataFrame(columns=columns)
    out = pd.concat(parts, ignore_index=True)
    if "protocol" not in out:
        out["protocol"] = None
    # a file without per-question results: the binomial bound for a proportion, unknown for an NLL
    missing = out.sampling_var.isna() & (out.metric != "nll_correct") & (out.n_problems.fillna(0) > 0)
    out.loc[missing, "sampling_var"] = [proportion_var(v, n) for v, n in zip(out.value[missing], out.n_problems[missing])]
    return out[columns]


def aggregate(seeds: pd.DataFrame) -> pd.DataFrame:
    """Per cell: mean, sample std (NaN for one seed of a trained run; 0 for a base model), seed
    count ``n``, the mean sampling variance, ``se``, the per-seed values in seed order (a claim
    calls two cells identical, so not informative, when these are equal), the evaluation files."""
    columns = [*CELL_KEYS, "mean", "std", "n", "sampling_var", "se", "values", "protocol", "paths"]
    if seeds.empty:
        return pd.DataFrame(columns=columns)
    seeds = seeds.sort_values("seed")
    g = seeds.groupby(CELL_KEYS, sort=False)
    out = g["value"].agg(["mean", "std", "count"]).reset_index().rename(columns={"count": "n"})
    # a file without per-question rows (written before they were kept): its seeds' spread only
    out["sampling_var"] = g["sampling_var"].mean().fillna(0.0).values
    out["values"] = g["value"].agg(lambda s: tuple(round(v, 9) for v in s)).values
    out["protocol"] = g["protocol"].agg(lambda s: next((p for p in s if p), None)).values
    out["paths"] = g["path"].agg(lambda s: sorted(s)).values
    base = out.train_mode == "none"
    out.loc[base, "std"] = out.loc[base, "std"].fillna(0.0)
    out["se"] = [cell_se(s, 1 if b else k, v) for s, k, v, b in zip(out["std"], out["n"], out["sampling_var"], base)]
    return out[columns]


def paper_cells(paper: pd.DataFrame) -> pd.DataFrame:
    """The paper's numbers as cells (one row per key, whatever tables repeat it): seeds (3, 2 for
    the ablations, 1 for a base model), the sampling variance its benchmark's size implies, se."""
    cells = paper.drop_duplicates(CELL_KEYS)[[*CELL_KEYS, "mean", "std"]].copy()
    cells["n"] = [PAPER_SEEDS["base"] if m == "none" else PAPER_SEEDS["ablation" if v else "main"]
                  for m, v in zip(cells.train_mode, cells.variant)]
    cells["sampling_var"] = [paper_sampling_var(b, m, x) for b, m, x in zip(cells.benchmark, cells.metric, cells["mean"])]
    cells["se"] = [cell_se(s, k, v) for s, k, v in zip(cells["std"], cells["n"], cells["sampling_var"])]
    cells["values"] = None
    cells["protocol"] = None
    return cells


def paper_sampling_var(benchmark: str, metric: str, mean: float) -> float:
    n = TEST_SIZES.get(benchmark)  # a paper benchmark is named as its loader
    if n is None:
        return float("nan")
    if metric == "nll_correct":
        return (NLL_ROW_CV * mean) ** 2 / n
    return proportion_var(mean, n)


# ---------------------------------------------------------------- cell by cell
def compare(paper: pd.DataFrame, ours: pd.DataFrame) -> pd.DataFrame:
    """Every paper cell with ours beside it: ``ours_mean`` NaN where we have no such cell; the
    tolerance Z sqrt(se_paper^2 + se_ours^2), where ours with one seed (spread unknown) counts its
    sampling variance only. An accuracy measured under another protocol than the paper's
    (generative, softtokens.ood) is shown but not compared."""
    pcells = paper_cells(paper)
    out = paper.merge(pcells[[*CELL_KEYS, "se"]].rename(columns={"se": "paper_se"}), on=CELL_KEYS, how="left")
    out = out.rename(columns={"mean": "paper_mean", "std": "paper_std"})
    mine = ours.rename(columns={"mean": "ours_mean", "std": "ours_std", "n": "ours_n", "se": "ours_se",
                                "protocol": "ours_protocol"})
    out = out.merge(mine[[*CELL_KEYS, "ours_mean", "ours_std", "ours_n", "ours_se", "sampling_var", "ours_protocol"]],
                    on=CELL_KEYS, how="left")
    ours_se = out["ours_se"].fillna(out["sampling_var"].pow(0.5))
    out["diff"] = out["ours_mean"] - out["paper_mean"]
    out["tolerance"] = Z * (out["paper_se"] ** 2 + ours_se ** 2) ** 0.5
    other_protocol = (out.metric == "accuracy") & out.ours_protocol.notna() & (out.ours_protocol != "generative")
    out["within"] = [None if math.isnan(d) or math.isnan(t) or o else bool(abs(d) <= t + 1e-9)
                     for d, t, o in zip(out["diff"], out["tolerance"], other_protocol)]
    out["note"] = ["accuracy by the cloze protocol: not the paper's (generative), not compared" if o else ""
                   for o in other_protocol]
    return out.drop(columns=["sampling_var"])
