"""Tables (Markdown, LaTeX, CSV) and figures (PNG) from evaluation results and training metrics.

Tables aggregate over seeds as mean ± std (sample std, ddof=1; 0 for a single seed or the
base model), in percent, in the shape of the paper's Table 1 (hard inference) and its
appendix tables (all six inference settings)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from softtokens.report.tables import MODE_ORDER
from softtokens.run import paths
from softtokens.run.files import atomic_path
from softtokens.run.paths import parse_eval_path, parse_run_path
from softtokens.run.provenance import Provenance

# ---------------------------------------------------------------- figures
# one colour per training mode in every figure (seaborn's colour-blind palette; the base model grey)
MODE_COLOURS = {"none": "#7f7f7f", "hard": "#0173b2", "fuzzy": "#de8f05", "soft": "#029e73"}
# one line style per seed: solid, dashed, dotted, dash-dot (matplotlib dash patterns)
SEED_DASHES = ["", (4, 2), (1, 1.5), (5, 1.5, 1, 1.5)]
# greedy pass@1 triangles at k = 1, side by side: each training mode's offset in log2(k)
GREEDY_DODGE = 0.09


def _save_fig(fig, path: Path, prov: Provenance) -> None:
    """The PNG and, beside it, a PDF (vector, for a paper)."""
    for p, fmt in ((path, "png"), (path.with_suffix(".pdf"), "pdf")):
        with atomic_path(p) as tmp:
            fig.savefig(tmp, format=fmt, dpi=120, bbox_inches="tight")
        prov.write_sidecar(p)


def _legend_outside(ax, title: str = "training") -> None:
    """The legend right of the axes, never over the data."""
    handles, labels = ax.get_legend_handles_labels()
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    if handles:
        ax.legend(handles, labels, title=title, fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  borderaxespad=0)


def write_figures(metrics_paths: list[Path], eval_paths: list[Path], out_dir: Path, settings: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.ticker import MaxNLocator

    sns.set_theme(style="whitegrid", context="paper")
    prov = Provenance("figures", settings, inputs={p.as_posix(): p for p in [*metrics_paths, *eval_paths]})
    rows = []
    for p in metrics_paths:
        keys = parse_run_path(p)
        if keys["variant"]:
            continue
        for line in p.read_text().splitlines():
            m = json.loads(line)
            rows.append({**keys, **m})
    runs = pd.DataFrame(rows)
    for (model, dataset), sub in runs.groupby(["model", "train_dataset"]):
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
        train = sub[sub.kind == "train"].copy()
        train["success (%)"] = 100 * train["frac_correct"]
        train["smoothed"] = train.groupby(["train_mode", "seed"])["success (%)"].transform(
            lambda s: s.rolling(max(1, len(s) // 10), min_periods=1).mean())
        # one colour per training mode, one line style per seed (SEED_DASHES), as the paper draws its runs
        train["seed"], val = train["seed"].astype(str), sub[sub.kind == "validation"].copy()
        val["seed"] = val["seed"].astype(str)
        seeds = sorted(set(train.seed) | set(val.seed), key=int)
        dashes = {sd: SEED_DASHES[i % len(SEED_DASHES)] for i, sd in enumerate(seeds)}
        sns.lineplot(train, x="step", y="smoothed", hue="train_mode", style="seed", dashes=dashes,
                     style_order=seeds, estimator=None, ax=axes[0], palette=MODE_COLOURS,
                     hue_order=[m for m in MODE_ORDER if m in set(train.train_mode)], legend=False)
        axes[0].set(title="(a) training success (rolling mean)", xlabel="RL step", ylabel="correct rollouts (%)")
        val["greedy validation (%)"] = 100 * val["val_greedy_accuracy"]
        sns.lineplot(val, x="step", y="greedy validation (%)", hue="train_mode", style="seed", dashes=dashes,
                     style_order=seeds, estimator=None, marker="o", ax=axes[1], palette=MODE_COLOURS,
                     hue_order=[m for m in MODE_ORDER if m in set(val.train_mode)])
        axes[1].set(title="(b) greedy validation (model selection)", xlabel="RL step")
        for ax in axes:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        _legend_outside(axes[1])
        fig.suptitle(f"{model} trained on {dataset}")
        _save_fig(fig, out_dir / f"{paths.figure_name('training', model, dataset)}.png", prov)
        plt.close(fig)

    evals = [(keys, json.loads(p.read_text())) for p in eval_paths if not (keys := parse_eval_path(p))["variant"]]
    palette = MODE_COLOURS
    points = pd.DataFrame([{**keys, "k": int(k), "pass@k (%)": 100 * v}
                           for keys, res in evals for k, v in res["pass@k"].items()])
    if not points.empty:
        for (model, dataset, bench), sub in figure_groups(points):
            fig = passk_figure(plt, sns, sub, palette)
            fig.suptitle(f"pass@k of {model} trained on {dataset} ({bench}; mean ± sd over seeds; none = base "
                         "model; triangles: greedy pass@1)", y=1.04)
            _save_fig(fig, out_dir / f"{paths.figure_name('passk', model, dataset, bench)}.png", prov)
            plt.close(fig)

    ent = pd.DataFrame([{**keys, "position": pos, "entropy": h} for keys, res in evals
                        for pos, h in enumerate(res["entropy_profile"])
                        if h is not None and res["entropy_count"][pos] >= 5])
    if not ent.empty:
        for (model, dataset, bench), sub in figure_groups(ent):
            fig = entropy_figure(plt, sns, sub, palette)
            fig.suptitle(f"CoT entropy of {model} trained on {dataset} ({bench}; none = base model)", y=1.04)
            _save_fig(fig, out_dir / f"{paths.figure_name('entropy', model, dataset, bench)}.png", prov)
            plt.close(fig)


def figure_groups(df: pd.DataFrame):
    """((model, training set, benchmark), rows) for each per-run figure, as the paper draws them:
    the runs trained on one set beside their base model ('none'). A model evaluated with no
    training run gets one figure of its base alone, with 'base' in the training-set slot."""
    for (model, bench), sub in df.groupby(["model", "benchmark"], sort=True):
        for dataset in sorted(set(sub.train_dataset) - {"none"}) or ["base"]:
            yield (model, dataset, bench), sub[sub.train_dataset.isin([dataset, "none"])]


def entropy_figure(plt, sns, sub: pd.DataFrame, palette: dict):
    """CoT entropy by position: one panel per inference setting (rows greedy / sample, columns the
    CoT mode), each training mode's mean over seeds with its sd band, the base model dashed black on
    top (never hidden under the trained runs)."""
    cols = [m for m in ("hard", "fuzzy", "soft") if {f"{m}_greedy", f"{m}_sample"} & set(sub.setting)]
    rows = [r for r in ("greedy", "sample") if any(f"{m}_{r}" in set(sub.setting) for m in cols)]
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(4.2 * len(cols), 3.0 * len(rows)), sharex=True,
                             sharey=True, squeeze=False)
    trainings = [m for m in MODE_ORDER if m in set(sub.train_mode)]
    for r, row in enumerate(rows):
        for c, col in enumerate(cols):
            ax, s = axes[r][c], sub[sub.setting == f"{col}_{row}"]
            trained = s[s.train_mode != "none"]
            if not trained.empty:
                sns.lineplot(trained, x="position", y="entropy", hue="train_mode", errorbar="sd", ax=ax,
                             palette=palette, hue_order=[m for m in trainings if m != "none"], legend=False)
            base = s[s.train_mode == "none"].groupby("position")["entropy"].mean()
            ax.plot(base.index, base.values, color="black", linestyle="--", linewidth=1.3, zorder=6)
            ax.set(title=f"{col} inference, {row}", xlabel="CoT position (token)" if r == len(rows) - 1 else "",
                   ylabel="entropy (nats)" if c == 0 else "")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=palette[m], label=m) for m in trainings if m != "none"]
    handles.append(Line2D([], [], color="black", linestyle="--", label="none (base)"))
    axes[0][-1].legend(handles=handles, title="training (mean ± sd over seeds)", fontsize="small",
                       loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def passk_figure(plt, sns, sub: pd.DataFrame, palette: dict):
    """One panel per CoT inference mode: pass@k of its sample setting against k (lines, mean ±
    sd over seeds) and the pass@1 of its greedy setting at k = 1 (triangles), one colour per
    training mode, as in the paper's pass@k figures."""
    modes = [m for m in ("hard", "fuzzy", "soft") if {f"{m}_sample", f"{m}_greedy"} & set(sub.setting)]
    fig, axes = plt.subplots(1, len(modes), figsize=(3.8 * len(modes), 3.3), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], modes):
        sample = sub[sub.setting == f"{mode}_sample"]
        trainings = [m for m in MODE_ORDER if m in set(sub.train_mode)]
        if not sample.empty:
            sns.lineplot(sample, x="k", y="pass@k (%)", hue="train_mode", marker="o", ax=ax, errorbar="sd",
                         palette=palette, hue_order=[m for m in trainings if m in set(sample.train_mode)], legend=False)
        greedy = sub[sub.setting == f"{mode}_greedy"].groupby("train_mode")["pass@k (%)"].agg(["mean", "std"])
        present = [m for m in trainings if m in greedy.index]
        for i, train_mode in enumerate(present):  # side by side around k = 1, never on top of each other
            g = greedy.loc[train_mode]
            x = 2 ** (GREEDY_DODGE * (i - (len(present) - 1) / 2))
            ax.errorbar([x], [g["mean"]], yerr=[0.0 if pd.isna(g["std"]) else g["std"]], marker="^", markersize=8,
                        color=palette[train_mode], markeredgecolor="black", linestyle="none", zorder=5)
        ks = sorted(sub.k.unique())
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()
        ax.set(title=f"{mode} inference", xlabel="k", ylabel="pass@k (%)")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=palette[m], marker="o", label=m) for m in MODE_ORDER if m in set(sub.train_mode)]
    handles.append(Line2D([], [], color="gray", marker="^", markeredgecolor="black", linestyle="none",
                          label="greedy pass@1"))
    axes[0][-1].legend(handles=handles, title="training", fontsize="small", loc="upper left",
                       bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    return fig
