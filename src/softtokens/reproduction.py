"""Our numbers beside the paper's, cell by cell, and the paper's claims judged on both.

Why: a reproduction is read one number at a time (does it match, and how close), and one claim
at a time (does the conclusion hold). Every rule here is stated in the report beside its verdict
and applied to the paper's own numbers too, so a reader sees how strict it is: a rule the paper's
numbers fail is a rule, not a finding.

A cell is one (model, training set, training mode, variant, benchmark, setting, metric); ours is
the mean and sample std over seeds of the per-seed evaluation files. Values are percent except
``nll_correct`` (nats per token). A base model (training mode ``none``) is one evaluation, std 0,
as in the paper. A trained cell with one seed has no std: its comparisons use only the paper's,
and the claims that need a spread say "not yet measured".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from softtokens.paper import CELL_KEYS
from softtokens.reporting import load_eval_frame, load_loglik_frame

SIGMAS = 2.0      # a cell matches when |ours - paper| <= SIGMAS * sqrt(sd_paper² + sd_ours²)
MAJORITY = 0.75   # a claim is supported when it holds in at least this share of its comparisons
TRAINED = ("hard", "soft", "fuzzy")
SUPPORTED, NOT_SUPPORTED, NOT_MEASURED = "supported", "not supported", "not yet measured"


# ---------------------------------------------------------------- our cells
def seed_rows(eval_paths: list[Path]) -> pd.DataFrame:
    """One row per (evaluation file, metric): the CELL_KEYS, ``seed``, ``value``, ``path``, read by
    the tables' own loaders (reporting.load_eval_frame / load_loglik_frame). Math settings give
    pass@1 and, when sampled, pass@n (n = samples per problem); the multiple-choice files
    (``loglik.json``) give accuracy (the paper files it under hard_greedy) and nll_correct
    (setting ``loglik``)."""
    paths = [Path(p) for p in eval_paths]
    keys = ["model", "train_dataset", "train_mode", "variant", "benchmark", "seed", "path"]
    parts = []
    math = [p for p in paths if p.stem != "loglik"]
    if math:
        df = load_eval_frame(math)
        parts.append(df[keys + ["setting"]].assign(metric="pass@1", value=df["pass@1"]))
        sampled = df[df.setting.str.endswith("_sample")]
        parts.append(sampled[keys + ["setting"]].assign(metric="pass@" + sampled["n"].astype(str),
                                                        value=sampled["pass@n"]))
    loglik = [p for p in paths if p.stem == "loglik"]
    if loglik:
        df = load_loglik_frame(loglik)
        parts.append(df[keys].assign(setting="hard_greedy", metric="accuracy", value=df["accuracy"]))
        parts.append(df[keys].assign(setting="loglik", metric="nll_correct", value=df["nll_correct"]))
    columns = [*CELL_KEYS, "seed", "value", "path"]
    if not parts:
        return pd.DataFrame(columns=columns)
    out = pd.concat(parts, ignore_index=True)
    return out[columns]


def aggregate(seeds: pd.DataFrame) -> pd.DataFrame:
    """Mean, sample std (NaN for one seed of a trained run; 0 for a base model), seed count and
    the evaluation files of each cell."""
    if seeds.empty:
        return pd.DataFrame(columns=[*CELL_KEYS, "mean", "std", "n", "paths"])
    g = seeds.groupby(CELL_KEYS, sort=False)
    out = g["value"].agg(["mean", "std", "count"]).reset_index().rename(columns={"count": "n"})
    out["paths"] = g["path"].agg(lambda s: sorted(s)).values
    out.loc[out.train_mode == "none", "std"] = out.loc[out.train_mode == "none", "std"].fillna(0.0)
    return out


def paper_cells(paper: pd.DataFrame) -> pd.DataFrame:
    """The paper's numbers as cells (one row per key, whatever tables repeat it), n = its seeds."""
    cells = paper.drop_duplicates(CELL_KEYS)[[*CELL_KEYS, "mean", "std"]].copy()
    cells["n"] = cells.apply(lambda r: 1 if r.train_mode == "none" else (2 if r.variant else 3), axis=1)
    return cells


# ---------------------------------------------------------------- cell by cell
def compare(paper: pd.DataFrame, ours: pd.DataFrame) -> pd.DataFrame:
    """Every paper cell with ours beside it: ``ours_mean`` NaN where we have no such cell."""
    mine = ours.rename(columns={"mean": "ours_mean", "std": "ours_std", "n": "ours_n"})
    out = paper.rename(columns={"mean": "paper_mean", "std": "paper_std"}).merge(
        mine[[*CELL_KEYS, "ours_mean", "ours_std", "ours_n"]], on=CELL_KEYS, how="left")
    out["diff"] = out["ours_mean"] - out["paper_mean"]
    out["tolerance"] = SIGMAS * (out["paper_std"] ** 2 + out["ours_std"].fillna(0.0) ** 2) ** 0.5
    out["within"] = [None if math.isnan(d) else bool(abs(d) <= t + 1e-9)
                     for d, t in zip(out["diff"], out["tolerance"])]
    return out


# ---------------------------------------------------------------- the claims
@dataclass
class Claim:
    key: str
    statement: str
    rule: str
    verdict: str = NOT_MEASURED
    held: int = 0
    total: int = 0
    evidence: list[str] = field(default_factory=list)

    def decide(self, checks: list[tuple[bool, str]]) -> "Claim":
        self.total = len(checks)
        self.held = int(sum(bool(ok) for ok, _ in checks))
        self.evidence = [("holds: " if ok else "fails: ") + text for ok, text in checks]
        if self.total:
            self.verdict = SUPPORTED if self.held >= MAJORITY * self.total else NOT_SUPPORTED
        return self

    def summary(self) -> str:
        return f"{self.verdict} ({self.held}/{self.total})" if self.total else self.verdict


def _fmt(r) -> str:
    sd = "?" if pd.isna(r["std"]) else f"{r['std']:.2f}"
    return f"{r['mean']:.2f}±{sd} (n={int(r['n'])})"


def _spread_known(r) -> bool:
    return r["train_mode"] == "none" or (r["n"] >= 2 and not pd.isna(r["std"]))


def _combined(a, b) -> float:
    return SIGMAS * math.sqrt(a["std"] ** 2 + b["std"] ** 2)


def _index(cells: pd.DataFrame) -> dict:
    return {tuple(r[k] for k in CELL_KEYS): r for _, r in cells.iterrows()}


def passk_metric(cells: pd.DataFrame) -> str | None:
    """The sampled metric with the largest k (the paper's pass@32; pass@n of a grid with n samples)."""
    ks = [int(m.split("@")[1]) for m in set(cells.metric) if m.startswith("pass@") and m != "pass@1"]
    return f"pass@{max(ks)}" if ks else None


def _groups(cells: pd.DataFrame):
    main = cells[cells.variant == ""]
    return main, sorted({(r.model, r.train_dataset, r.benchmark) for r in main.itertuples() if r.train_mode in TRAINED})


def claim_match_pass1(cells: pd.DataFrame) -> Claim:
    c = Claim("match_pass1", "Soft and fuzzy training match hard training at pass@1 (hard inference).",
              f"For every model, training set and benchmark, soft and fuzzy training's hard-greedy and hard-sample "
              f"pass@1 are not below hard training's by more than {SIGMAS:g} combined standard deviations; needs "
              f"≥ 2 seeds per run. Supported when this holds in ≥ {MAJORITY:.0%} of the comparisons.")
    main, groups = _groups(cells)
    idx, checks = _index(main), []
    for model, ds, bench in groups:
        for setting in ("hard_greedy", "hard_sample"):
            hard = idx.get((model, ds, "hard", "", bench, setting, "pass@1"))
            for mode in ("soft", "fuzzy"):
                r = idx.get((model, ds, mode, "", bench, setting, "pass@1"))
                if hard is None or r is None or not (_spread_known(hard) and _spread_known(r)):
                    continue
                tol = _combined(r, hard)
                checks.append((r["mean"] >= hard["mean"] - tol - 1e-9,
                               f"{model} trained on {ds}, {bench} {setting}: {mode} {_fmt(r)} vs hard {_fmt(hard)} (tolerance {tol:.2f})"))
    return c.decide(checks)


def claim_beat_passk(cells: pd.DataFrame) -> Claim:
    metric = passk_metric(cells)
    c = Claim("beat_passk", "Soft and fuzzy training beat hard training at pass@32 (hard inference).",
              f"For every model, training set and benchmark, soft and fuzzy training's hard-sample "
              f"{metric or 'pass@k'} mean is above hard training's (pass@n with this grid's n samples stands in "
              f"for pass@32); needs ≥ 2 seeds per run. Supported when this holds in ≥ {MAJORITY:.0%} of the comparisons.")
    if metric is None:
        return c
    main, groups = _groups(cells)
    idx, checks = _index(main), []
    for model, ds, bench in groups:
        hard = idx.get((model, ds, "hard", "", bench, "hard_sample", metric))
        for mode in ("soft", "fuzzy"):
            r = idx.get((model, ds, mode, "", bench, "hard_sample", metric))
            if hard is None or r is None or not (_spread_known(hard) and _spread_known(r)):
                continue
            checks.append((r["mean"] > hard["mean"], f"{model} trained on {ds}, {bench} {metric}: {mode} {_fmt(r)} vs hard {_fmt(hard)}"))
    return c.decide(checks)


def claim_hard_inference_best(cells: pd.DataFrame) -> Claim:
    c = Claim("hard_inference_best", "Hard inference is best for every training (base model included).",
              f"For every model, training (none, hard, soft, fuzzy) and benchmark, the better pass@1 of hard greedy "
              f"and hard sample inference is not below the best of the four soft and fuzzy inference settings by "
              f"more than {SIGMAS:g} combined standard deviations. Supported when this holds in ≥ {MAJORITY:.0%} "
              f"of the comparisons.")
    main = cells[(cells.variant == "") & (cells.metric == "pass@1")]
    checks = []
    for (model, ds, mode, bench), sub in main.groupby(["model", "train_dataset", "train_mode", "benchmark"]):
        sub = sub[sub.apply(_spread_known, axis=1)]
        hard = sub[sub.setting.isin(["hard_greedy", "hard_sample"])]
        other = sub[~sub.setting.isin(["hard_greedy", "hard_sample"])]
        if hard.empty or other.empty:
            continue
        h, o = hard.loc[hard["mean"].idxmax()], other.loc[other["mean"].idxmax()]
        tol = _combined(h, o)
        checks.append((h["mean"] >= o["mean"] - tol - 1e-9,
                       f"{model} {'base' if mode == 'none' else f'trained {mode} on {ds}'}, {bench}: {h['setting']} {_fmt(h)} vs "
                       f"{o['setting']} {_fmt(o)} (tolerance {tol:.2f})"))
    return c.decide(checks)


def claim_ood_nll(cells: pd.DataFrame) -> Claim:
    c = Claim("ood_nll", "Out-of-domain NLL of the correct answer is preserved by soft and fuzzy training and hurt "
              "by hard training.",
              f"For every model, training set and out-of-domain benchmark: hard training raises the NLL of the "
              f"correct answer above the base model's, and soft (resp. fuzzy) training leaves it lower than hard "
              f"training does. Supported when these hold in ≥ {MAJORITY:.0%} of the comparisons.")
    nll = cells[(cells.variant == "") & (cells.metric == "nll_correct")]
    idx, checks = _index(nll), []
    for model, ds, bench in sorted({(r.model, r.train_dataset, r.benchmark) for r in nll.itertuples()
                                    if r.train_mode in TRAINED}):
        base = idx.get((model, "none", "none", "", bench, "loglik", "nll_correct"))
        hard = idx.get((model, ds, "hard", "", bench, "loglik", "nll_correct"))
        if base is None or hard is None:
            continue
        checks.append((hard["mean"] > base["mean"], f"{model} trained on {ds}, {bench}: hard {_fmt(hard)} vs base {_fmt(base)}"))
        for mode in ("soft", "fuzzy"):
            r = idx.get((model, ds, mode, "", bench, "loglik", "nll_correct"))
            if r is not None:
                checks.append((r["mean"] < hard["mean"], f"{model} trained on {ds}, {bench}: {mode} {_fmt(r)} vs hard {_fmt(hard)}"))
    return c.decide(checks)


def claim_llama8b_gsm8k_hard(cells: pd.DataFrame) -> Claim:
    c = Claim("llama8b_gsm8k_hard_math500", "Llama-8B hard training on GSM8K degrades MATH-500.",
              f"Llama-3.1-8B trained with hard tokens on GSM8K scores below its base model on MATH-500 (hard "
              f"greedy and hard sample pass@1) by more than {SIGMAS:g} combined standard deviations. Only the "
              f"paper grid has these cells.")
    idx, checks = _index(cells[cells.variant == ""]), []
    for setting in ("hard_greedy", "hard_sample"):
        base = idx.get(("llama-8b", "none", "none", "", "math500", setting, "pass@1"))
        hard = idx.get(("llama-8b", "gsm8k", "hard", "", "math500", setting, "pass@1"))
        if base is None or hard is None or not _spread_known(hard):
            continue
        tol = _combined(hard, base)
        checks.append((hard["mean"] < base["mean"] - tol, f"math500 {setting}: hard {_fmt(hard)} vs base {_fmt(base)}"))
    if checks:  # both settings must hold
        c.decide(checks)
        c.verdict = SUPPORTED if c.held == c.total else NOT_SUPPORTED
    return c


CLAIMS = (claim_match_pass1, claim_beat_passk, claim_hard_inference_best, claim_ood_nll, claim_llama8b_gsm8k_hard)


def judge_claims(cells: pd.DataFrame) -> list[Claim]:
    return [f(cells) for f in CLAIMS]
