"""Tables and figures from result files laid out as the workflow writes them: one model trained on
two datasets must give one pass@k and one entropy figure per (model, training set, benchmark),
never one figure pooling both training sets; tables mark runs whose selected checkpoint scored
below the base on validation."""

import json
from pathlib import Path

import pandas as pd
import pytest

from softtokens.cells.results import load_eval_frame
from softtokens.report.figures import figure_groups, write_figures
from softtokens.report.tables import BELOW_BASE_MARK, main_table, write_tables
from softtokens.store.paths import parse_eval_path

SETTINGS = ("hard_greedy", "hard_sample", "soft_greedy", "soft_sample")
N = 4


def eval_result(pass1: float, n: int, below_base: bool | None) -> dict:
    res = {"n_samples": n, "pass@1": pass1, "pass@k": {str(k): min(1.0, pass1 + 0.05 * (k - 1)) for k in range(1, n + 1)},
           "mean_cot_length": 10.0, "entropy_profile": [1.0, 0.8, 0.5], "entropy_count": [8, 8, 8]}
    if below_base is not None:
        res["selection"] = {"step": 8, "val_greedy_accuracy": 0.4 if below_base else 0.6,
                            "base_val_greedy_accuracy": 0.5, "improved_over_base": not below_base}
    return res


@pytest.fixture()
def grid(tmp_path) -> tuple[list[Path], list[Path]]:
    """toy trained on dsa (hard, soft) and dsb (hard), two seeds, evaluated on two benchmarks."""
    evals, metrics = [], []
    trained = [("base", None)]
    for dataset, modes in (("dsa", ("hard", "soft")), ("dsb", ("hard",))):
        for mode in modes:
            for seed in (0, 1):
                trained.append((f"{dataset}-{mode}-seed{seed}", dataset == "dsa" and mode == "soft" and seed == 1))
                run = tmp_path / "runs" / "toy" / dataset / mode / f"seed{seed}" / "metrics.jsonl"
                run.parent.mkdir(parents=True)
                run.write_text("".join(json.dumps(m) + "\n" for m in (
                    {"kind": "validation", "step": 0, "val_greedy_accuracy": 0.5},
                    {"kind": "train", "step": 1, "frac_correct": 0.3}, {"kind": "train", "step": 2, "frac_correct": 0.4},
                    {"kind": "validation", "step": 2, "val_greedy_accuracy": 0.6})))
                metrics.append(run)
    for name, below in trained:
        for bench in ("benchx", "benchy"):
            for setting in SETTINGS:
                p = tmp_path / "eval" / "toy" / name / bench / f"{setting}.json"
                p.parent.mkdir(parents=True, exist_ok=True)
                n = N if setting.endswith("sample") else 1
                p.write_text(json.dumps(eval_result(0.5, n, below)))
                evals.append(p)
    return metrics, evals


@pytest.mark.slow
def test_one_passk_and_entropy_figure_per_model_training_set_and_benchmark(grid, tmp_path):
    metrics, evals = grid
    out = tmp_path / "figures"
    out.mkdir()
    write_figures(metrics, evals, out, {"grid": "test"})
    made = sorted(p.name for p in out.glob("*.png"))
    per_run = [f"{kind}_toy_{d}_{b}.png" for kind in ("entropy", "passk") for d in ("dsa", "dsb") for b in ("benchx", "benchy")]
    assert made == sorted(per_run + ["training_toy_dsa.png", "training_toy_dsb.png"])
    assert all((out / f"{name}.prov.json").exists() for name in made)


def test_the_papers_figure_3_draws_every_cell_of_a_family_under_hard_inference(grid, tmp_path):
    """Figure 3 ("Hard inference pass@k for Llama models"): one panel per (model, training set) x benchmark, hard
    settings only (a soft file among its inputs draws nothing), each training mode and the base."""
    from softtokens.report.figures import write_figure

    _, evals = grid
    out = tmp_path / "figures"
    out.mkdir()
    spec = {"kind": "hardpassk", "family": "toy", "cells": [["toy", "dsa"], ["toy", "dsb"]],
            "benchmarks": ["benchx", "benchy"]}
    made = write_figure(spec, [], evals, out, {"grid": "test"})
    assert made.name == "hardpassk_toy.png" and made.with_suffix(".pdf").exists()
    from softtokens.report.figures import hard_passk_figure_of

    fig = hard_passk_figure_of(evals, spec)
    axes = fig.axes
    assert len(axes) == 4 and [a.get_title() for a in axes[:2]] == ["toy trained on dsa\nbenchx",
                                                                      "toy trained on dsa\nbenchy"]
    # dsa's panel: the base, hard and soft lines of hard_sample (soft training is a training mode, drawn in hard
    # inference); greedy triangles for each
    assert len(axes[0].get_lines()) >= 3 and "Figure 3" in fig._suptitle.get_text()


def test_figure_groups_keep_training_sets_apart(grid):
    _, evals = grid
    df = pd.DataFrame([parse_eval_path(p) for p in evals])
    groups = {key: sub for key, sub in figure_groups(df)}
    assert set(groups) == {("toy", d, b) for d in ("dsa", "dsb") for b in ("benchx", "benchy")}
    dsb = groups[("toy", "dsb", "benchx")]
    assert set(dsb.train_dataset) == {"dsb", "none"} and set(dsb.train_mode) == {"hard", "none"}
    assert set(groups[("toy", "dsa", "benchy")].train_mode) == {"hard", "soft", "none"}
    base_only = {key for key, _ in figure_groups(df[df.train_mode == "none"])}
    assert base_only == {("toy", "base", "benchx"), ("toy", "base", "benchy")}  # a model with no run


def test_tables_mark_runs_selected_below_their_base(grid, tmp_path):
    _, evals = grid
    table = main_table(load_eval_frame(evals))
    labels = list(table.training)
    assert f"dsa soft {BELOW_BASE_MARK}" in labels and "dsa hard" in labels and "no finetune" in labels
    (tmp_path / "tables").mkdir()
    write_tables(evals, tmp_path / "tables", {"grid": "test"})
    md = (tmp_path / "tables" / "main.md").read_text()
    assert "toy dsa soft: seed 1 of 2" in md and "never selected" in md
    assert "$^\\dagger$" in (tmp_path / "tables" / "main.tex").read_text()


def test_ood_table_marks_runs_selected_below_their_base(tmp_path):
    from softtokens.cells.results import load_loglik_frame
    from softtokens.report.tables import ood_table

    paths = []
    for name, below in (("base", None), ("dsa-soft-seed0", True), ("dsa-soft-seed1", False), ("dsa-hard-seed0", False)):
        p = tmp_path / "eval" / "toy" / name / "mc" / "loglik.json"
        p.parent.mkdir(parents=True)
        res = {"accuracy": 0.9, "accuracy_norm": 0.9, "nll_correct": 0.1, "n_problems": 5}
        res.update({k: v for k, v in eval_result(0.5, 1, below).items() if k == "selection"})
        p.write_text(json.dumps(res))
        paths.append(p)
    labels = list(ood_table(load_loglik_frame(paths)).training)
    assert labels == ["no finetune", "dsa hard", f"dsa soft {BELOW_BASE_MARK}"]
