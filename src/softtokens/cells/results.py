"""Evaluation files read back as frames (one row per file), and how a cell of a table is printed.

Why one home: the tables, the ablation tables, the audit of a cell and the reproduction report
read the same files; each computing a number or printing a cell its own way would let a table and
its audit disagree."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from softtokens.store.paths import parse_eval_path


def mean_std_text(mean: float, std: float, n: int, digits: int = 1) -> str:
    """How a table prints a cell: mean±std over its n seeds; a single seed or a base model's one
    evaluation has no spread, so the mean alone (the table's ``seeds`` column says n = 1)."""
    if n < 2 or pd.isna(std):
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f}±{std:.{digits}f}"


def parse_mean_std(text: str) -> tuple[float, float]:
    """(mean, std) of a printed cell (mean_std_text); a cell printed without spread gives std 0."""
    mean, _, std = str(text).partition("±")
    return float(mean), float(std) if std else 0.0


def main_cells(df: pd.DataFrame) -> pd.DataFrame:
    """The paper's main cells (default variant): Table 1, the appendix and OOD tables and the
    per-run figures show these; ablation variants have tables of their own (ablations.py)."""
    return df[df["variant"] == ""] if "variant" in df else df


def failed_to_learn(result: dict) -> bool:
    """The evaluated checkpoint's run failed to learn (train.selection.select_best): its best trained
    step scored below its base model on greedy validation (selection never picks the base itself, so
    a run that only hurt reports its best trained step), or at or below the floor (a diverged run)."""
    sel = result.get("selection") or {}
    if sel.get("failed_to_learn"):
        return True
    base = sel.get("base_val_greedy_accuracy")
    return base is not None and sel.get("val_greedy_accuracy") is not None and sel["val_greedy_accuracy"] < base


def _sampling_var(values: list[float]) -> float:
    """Variance of a mean over problems, from its problems' own values: var / N (population var)."""
    n = len(values)
    if n < 2:
        return float("nan")
    mean = sum(values) / n
    return sum((v - mean) ** 2 for v in values) / n / n


def per_question(problems: list[dict], values: list[float]) -> pd.Series | None:
    """Per-question values indexed by question id (what a paired comparison of two cells reads:
    verdict.uncertainty), or None when the file's problems carry no ids or repeat one."""
    ids = [pr.get("id") for pr in problems]
    if not ids or any(i is None for i in ids) or len(set(map(str, ids))) != len(ids):
        return None
    return pd.Series(values, index=pd.Index(list(map(str, ids)), name="id"), dtype=float)


def load_eval_frame(paths: list[Path]) -> pd.DataFrame:
    """One row per evaluation file: pass@1 and pass@n in %, the sampling variance of each over
    the file's problems (``*_var``, %^2: the test set's share of the number's uncertainty;
    reproduction.py) and their per-question values (``*_q``, by question id: paired comparisons)."""
    from softtokens.eval.metrics import pass_at_k

    rows = []
    for p in paths:
        res = json.loads(Path(p).read_text())
        n = res["n_samples"]
        problems = res.get("problems", [])
        p1 = [100 * pr["correct"] / pr["n"] for pr in problems]
        pn = [100 * pass_at_k(pr["n"], pr["correct"], pr["n"]) for pr in problems]
        rows.append({**parse_eval_path(Path(p)), "pass@1": 100 * res["pass@1"], "pass@n": 100 * res["pass@k"][str(n)],
                     "pass@1_var": _sampling_var(p1), "pass@n_var": _sampling_var(pn),
                     "pass@1_q": per_question(problems, p1), "pass@n_q": per_question(problems, pn),
                     "n": n, "n_problems": res.get("n_problems", len(problems)),
                     "mean_cot_length": res["mean_cot_length"], "failed_to_learn": failed_to_learn(res), "path": str(p)})
    return pd.DataFrame(rows)


def load_loglik_frame(paths: list[Path]) -> pd.DataFrame:
    """One row per out-of-domain file: the protocol's accuracy (%), the NLL of the correct answer,
    their sampling variances over the file's questions, and the protocol that made them (files
    written before protocols existed were cloze)."""
    rows = []
    for p in paths:
        res = json.loads(Path(p).read_text())
        problems = res.get("problems", [])
        correct = [100.0 * bool(pr["correct"] if "correct" in pr else pr["pred"] == pr["label"]) for pr in problems]
        rows.append({**parse_eval_path(Path(p)), "accuracy": 100 * res["accuracy"],
                     "accuracy_norm": 100 * res.get("accuracy_cloze_norm", res.get("accuracy_norm", float("nan"))),
                     "nll_correct": res["nll_correct"], "protocol": res.get("protocol", "cloze"),
                     "accuracy_var": _sampling_var(correct),
                     "nll_correct_var": _sampling_var([pr["nll_correct"] for pr in problems]),
                     "accuracy_q": per_question(problems, correct),
                     "nll_correct_q": per_question(problems, [pr["nll_correct"] for pr in problems]),
                     "n_problems": res["n_problems"], "failed_to_learn": failed_to_learn(res), "path": str(p)})
    return pd.DataFrame(rows)
