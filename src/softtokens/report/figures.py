"""Figures (PNG and PDF) from training metrics and evaluation results: per (model, training set)
the training curves, per (model, training set, benchmark) the pass@k curves and the CoT entropy
profile. Each figure is a target of its own (one job each in the workflow); which settings a panel
shows comes from config.names's registry, never from a setting's spelling."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from softtokens.report.tables import MODE_ORDER
from softtokens.store import paths
from softtokens.store.files import atomic_path
from softtokens.config.names import DECODINGS, SETTINGS, setting_label, table_settings
from softtokens.store.paths import parse_eval_path, parse_run_path
from softtokens.store.provenance import Provenance

# ---------------------------------------------------------------- figures
# one colour per training mode in every figure (seaborn's colour-blind palette; the base model grey)
MODE_COLOURS = {"none": "#7f7f7f", "hard": "#0173b2", "fuzzy": "#de8f05", "soft": "#029e73"}
# one line style per seed: solid, dashed, dotted, dash-dot (matplotlib dash patterns)
SEED_DASHES = ["", (4, 2), (1, 1.5), (5, 1.5, 1, 1.5)]
# greedy pass@1 triangles at k = 1, side by side: each training mode's offset in log2(k)
GREEDY_DODGE = 0.09


def _save_fig(fig, path: Path, prov: Provenance) -> None:
    """The PNG and, beside it, a PDF (vector, for a paper)."""
    both = ((path, "png"), (path.with_suffix(".pdf"), "pdf"))
    for p, fmt in both:
        with atomic_path(p) as tmp:
            fig.savefig(tmp, format=fmt, dpi=120, bbox_inches="tight")
        prov.write_sidecar(p, outputs=[q for q, _ in both])


# a line of the entropy profile is drawn where at least this many of its CoTs reach the position
MIN_COTS = 10
# training success is smoothed over about this share of a run's steps (at least 1, at most 50 steps)
SMOOTHING_SHARE = 1 / 8


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    return plt, sns


def smoothing_window(steps: int) -> int:
    """Steps in training success's rolling mean: SMOOTHING_SHARE of the run, between 1 and 50."""
    return max(1, min(50, round(steps * SMOOTHING_SHARE)))


def _mode_seed_legend(ax, modes: list[str], seeds: list[str], dashes: dict, marker: str | None = None) -> None:
    """The legend right of the axes: a colour per training mode, a line style per seed (titled in
    words, not the frame's column names)."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=MODE_COLOURS[m], marker=marker, label=m) for m in modes]
    handles.append(Line2D([], [], linestyle="none", label=""))
    handles += [Line2D([], [], color="0.35", dashes=dashes[sd] or (None, None), label=f"seed {sd}") for sd in seeds]
    if ax.get_legend() is not None:
        ax.get_legend().remove()
    ax.legend(handles=handles, title="training", fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0),
              borderaxespad=0)


def training_figure(metrics_paths: list[Path], model: str, dataset: str):
    """(a) training success per step (a rolling mean whose window the title states), (b) greedy
    validation, one colour per training mode and one line style per seed."""
    plt, sns = _pyplot()
    from matplotlib.ticker import MaxNLocator

    rows = []
    for p in metrics_paths:
        keys = parse_run_path(p)
        if keys["variant"] or (keys["model"], keys["train_dataset"]) != (model, dataset):
            continue
        rows += [{**keys, **json.loads(line)} for line in Path(p).read_text().splitlines() if line.strip()]
    sub = pd.DataFrame(rows)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    train = sub[sub.kind == "train"].copy()
    train["success (%)"] = 100 * train["frac_correct"]
    window = smoothing_window(int(train.groupby(["train_mode", "seed"]).size().max()))
    train["smoothed"] = train.groupby(["train_mode", "seed"])["success (%)"].transform(
        lambda s: s.rolling(window, min_periods=1).mean())
    # one colour per training mode, one line style per seed (SEED_DASHES), as the paper draws its runs
    train["seed"], val = train["seed"].astype(str), sub[sub.kind == "validation"].copy()
    val["seed"] = val["seed"].astype(str)
    seeds = sorted(set(train.seed) | set(val.seed), key=int)
    dashes = {sd: SEED_DASHES[i % len(SEED_DASHES)] for i, sd in enumerate(seeds)}
    modes = [m for m in MODE_ORDER if m in set(train.train_mode) | set(val.train_mode)]
    sns.lineplot(train, x="step", y="smoothed", hue="train_mode", style="seed", dashes=dashes,
                 style_order=seeds, estimator=None, ax=axes[0], palette=MODE_COLOURS,
                 hue_order=[m for m in modes if m in set(train.train_mode)], legend=False)
    smooth = "per step" if window == 1 else f"rolling mean over {window} steps"
    axes[0].set(title=f"(a) training success ({smooth})", xlabel="RL step", ylabel="correct rollouts (%)")
    val["greedy validation (%)"] = 100 * val["val_greedy_accuracy"]
    sns.lineplot(val, x="step", y="greedy validation (%)", hue="train_mode", style="seed", dashes=dashes,
                 style_order=seeds, estimator=None, marker="o", ax=axes[1], palette=MODE_COLOURS,
                 hue_order=[m for m in modes if m in set(val.train_mode)], legend=False)
    axes[1].set(title="(b) greedy validation (model selection)", xlabel="RL step")
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1))   # percentages: none below 0 (all-zero runs too)
    _mode_seed_legend(axes[1], modes, seeds, dashes)
    fig.suptitle(f"{model} trained on {dataset}")
    return fig


def _eval_rows(eval_paths: list[Path]) -> list[tuple[dict, dict]]:
    return [(keys, json.loads(Path(p).read_text())) for p in eval_paths if not (keys := parse_eval_path(p))["variant"]]


def _group(df: pd.DataFrame, model: str, dataset: str, benchmark: str) -> pd.DataFrame:
    """The rows of one per-run figure (figure_groups' rule)."""
    for key, sub in figure_groups(df[(df.model == model) & (df.benchmark == benchmark)]):
        if key == (model, dataset, benchmark):
            return sub
    return df.iloc[0:0]


def passk_figure_of(eval_paths: list[Path], model: str, dataset: str, benchmark: str):
    plt, sns = _pyplot()
    points = pd.DataFrame([{**keys, "k": int(k), "pass@k (%)": 100 * v}
                           for keys, res in _eval_rows(eval_paths) for k, v in res["pass@k"].items()])
    fig = passk_figure(plt, sns, _group(points, model, dataset, benchmark), MODE_COLOURS)
    fig.suptitle(f"pass@k of {model} trained on {dataset} ({benchmark}; mean ± sd over seeds; none = base "
                 "model; triangles: greedy pass@1)", y=1.04)
    return fig


def entropy_figure_of(eval_paths: list[Path], model: str, dataset: str, benchmark: str):
    plt, sns = _pyplot()
    ent = pd.DataFrame([{**keys, "position": pos, "entropy": h, "cots": res["entropy_count"][pos]}
                        for keys, res in _eval_rows(eval_paths) for pos, h in enumerate(res["entropy_profile"])
                        if h is not None])
    sub = _group(ent, model, dataset, benchmark)
    fig = entropy_figure(plt, sns, sub, MODE_COLOURS)
    fig.suptitle(f"CoT entropy of {model} trained on {dataset} ({benchmark}; none = base model)\n"
                 f"a line is drawn where at least {MIN_COTS} of its CoTs reach the position; grey (right axis, lowest "
                 f"quarter): CoTs reaching each position, every line of the panel", y=1.07)
    return fig


def hard_passk_figure_of(eval_paths: list[Path], spec: dict):
    """The paper's Figure 3: hard inference pass@k of every cell of a model family (rows: (model, training set);
    columns: benchmarks), one colour per training mode (none = the base model), the greedy pass@1 triangles at k = 1."""
    plt, sns = _pyplot()
    points = pd.DataFrame([{**keys, "k": int(k), "pass@k (%)": 100 * v}
                           for keys, res in _eval_rows(eval_paths) for k, v in res["pass@k"].items()])
    cells, benchmarks = [tuple(c) for c in spec["cells"]], spec["benchmarks"]
    fig, axes = plt.subplots(len(cells), len(benchmarks), figsize=(3.6 * len(benchmarks), 3.0 * len(cells)),
                             sharey="row", squeeze=False)
    for i, (model, dataset) in enumerate(cells):
        for j, bench in enumerate(benchmarks):
            sub = _group(points, model, dataset, bench)
            hard = sub[sub.setting.map(lambda s: SETTINGS[s].mode == "hard")]
            _passk_panel(axes[i][j], sns, hard, MODE_COLOURS)
            axes[i][j].set(title=f"{model} trained on {dataset}\n{bench}")
    _passk_legend(axes[0][-1], [m for m in MODE_ORDER if m in set(points.train_mode)], MODE_COLOURS)
    fig.suptitle(f"Hard inference pass@k for {spec['family']} models (the paper's Figure 3; mean ± sd over seeds; "
                 "triangles: greedy pass@1)", y=1.0)
    fig.tight_layout()
    return fig


FIGURES = {"training": training_figure, "passk": passk_figure_of, "entropy": entropy_figure_of}


def write_figure(spec: dict, metrics_paths: list[Path], eval_paths: list[Path], out_dir: Path, settings: dict) -> Path:
    """One figure (``spec``: kind, model, dataset and, per run, benchmark; grid.targets.figure_specs)
    as PNG and PDF, with provenance."""
    import matplotlib.pyplot as plt

    kind = spec["kind"]
    inputs = metrics_paths if kind == "training" else eval_paths
    prov = Provenance("figures", {**settings, "figure": spec}, inputs={p.as_posix(): p for p in map(Path, inputs)})
    if kind == paths.FIG3_KIND:
        keys = [spec["family"]]
        fig = hard_passk_figure_of(list(map(Path, inputs)), spec)
    else:
        keys = [spec["model"], spec["dataset"]] + ([spec["benchmark"]] if kind != "training" else [])
        fig = FIGURES[kind](list(map(Path, inputs)), *keys)
    path = out_dir / f"{paths.figure_name(kind, *keys)}.png"
    _save_fig(fig, path, prov)
    plt.close(fig)
    return path


def write_figures(metrics_paths: list[Path], eval_paths: list[Path], out_dir: Path, settings: dict) -> None:
    """Every figure these files make (the workflow makes each as a job of its own: write_figure)."""
    runs = sorted({(k["model"], k["train_dataset"]) for k in map(parse_run_path, metrics_paths) if not k["variant"]})
    specs = [{"kind": "training", "model": m, "dataset": d} for m, d in runs]
    df = pd.DataFrame([parse_eval_path(p) for p in eval_paths])
    if not df.empty:
        df = df[df.variant == ""]
        specs += [{"kind": kind, "model": m, "dataset": d, "benchmark": b}
                  for kind in ("passk", "entropy") for (m, d, b), _ in figure_groups(df)]
    for spec in specs:
        write_figure(spec, metrics_paths, eval_paths, out_dir, settings)


def figure_groups(df: pd.DataFrame):
    """((model, training set, benchmark), rows) for each per-run figure, as the paper draws them:
    the runs trained on one set beside their base model ('none'). A model evaluated with no
    training run gets one figure of its base alone, with 'base' in the training-set slot."""
    for (model, bench), sub in df.groupby(["model", "benchmark"], sort=True):
        for dataset in sorted(set(sub.train_dataset) - {"none"}) or ["base"]:
            yield (model, dataset, bench), sub[sub.train_dataset.isin([dataset, "none"])]


def setting_grid(present) -> tuple[list[tuple], list[str], dict]:
    """The panels of a per-setting figure: columns (CoT mode, temperature override), rows decodings,
    and which setting sits at (column, row), in config.names's order."""
    cols, rows, at = [], [], {}
    for name in table_settings():
        spec = SETTINGS[name]
        if name not in present:
            continue
        col = (spec.mode, spec.temperature)
        cols += [col] if col not in cols else []
        rows += [spec.decoding] if spec.decoding not in rows else []
        at[(col, spec.decoding)] = name
    return cols, sorted(rows, key=DECODINGS.index), at


def _column_title(col: tuple) -> str:
    mode, tau = col
    return mode + ("" if tau is None else f" τ={tau:g}")


COUNT_HEADROOM = 4.0   # the CoT-count axis spans 4x its largest count: its bars fill the lowest quarter


def entropy_figure(plt, sns, sub: pd.DataFrame, palette: dict):
    """CoT entropy by position: one panel per inference setting (rows greedy / sample, columns the
    CoT mode), each training mode's mean over seeds with its sd band where at least MIN_COTS of its
    CoTs reach the position, the base model dashed black on top (never hidden under the trained
    runs), and in grey on a right-hand axis how many CoTs reach each position."""
    cols, rows, at = setting_grid(set(sub.setting))
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(4.4 * len(cols), 3.0 * len(rows)), sharex=True,
                             sharey=True, squeeze=False)
    trainings = [m for m in MODE_ORDER if m in set(sub.train_mode)]
    reached = sub.groupby(["setting", "train_mode", "position"])["cots"].transform("sum")
    shown = sub[reached >= MIN_COTS]
    for r, row in enumerate(rows):
        for c, col in enumerate(cols):
            ax, name = axes[r][c], at.get((col, row))
            if name is None:
                ax.set_visible(False)
                continue
            s, every = shown[shown.setting == name], sub[sub.setting == name]
            cots = every.groupby("position")["cots"].sum()
            twin = ax.twinx()
            # the counts in the bottom quarter of the panel, as a context for the lines, never over them
            twin.fill_between(cots.index, cots.values, step="mid", color="0.88", zorder=0)
            twin.set_ylim(0, max(1, cots.max()) * COUNT_HEADROOM)
            twin.set_yticks([0, int(cots.max())])
            twin.grid(False)
            twin.tick_params(labelsize="x-small", colors="0.5", labelright=True)
            if c == len(cols) - 1:
                twin.set_ylabel("CoTs reaching the position", color="0.5", fontsize="small")
            ax.set_zorder(twin.get_zorder() + 1)
            ax.patch.set_visible(False)
            trained = s[s.train_mode != "none"]
            if not trained.empty:
                sns.lineplot(trained, x="position", y="entropy", hue="train_mode", errorbar="sd", ax=ax,
                             palette=palette, hue_order=[m for m in trainings if m != "none"], legend=False)
            base = s[s.train_mode == "none"].groupby("position")["entropy"].mean()
            ax.plot(base.index, base.values, color="black", linestyle="--", linewidth=1.3, zorder=6)
            ax.set(title=f"{setting_label(name).lower()} inference", xlabel="CoT position (token)"
                   if r == len(rows) - 1 else "", ylabel="entropy (nats)" if c == 0 else "")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=palette[m], label=m) for m in trainings if m != "none"]
    handles.append(Line2D([], [], color="black", linestyle="--", label="none (base)"))
    handles.append(Line2D([], [], color="0.85", linewidth=6, label="CoTs (right axis)"))
    axes[0][-1].legend(handles=handles, title="training (mean ± sd over seeds)", fontsize="small",
                       loc="upper left", bbox_to_anchor=(1.3, 1.0), borderaxespad=0)
    fig.tight_layout()
    return fig


def passk_figure(plt, sns, sub: pd.DataFrame, palette: dict):
    """One panel per CoT inference mode: pass@k of its sampled setting against k (lines, mean ±
    sd over seeds) and the pass@1 of its greedy setting at k = 1 (triangles), one colour per
    training mode, as in the paper's pass@k figures."""
    cols, _, at = setting_grid(set(sub.setting))
    fig, axes = plt.subplots(1, len(cols), figsize=(3.8 * len(cols), 3.3), sharey=True, squeeze=False)
    for ax, col in zip(axes[0], cols):
        _passk_panel(ax, sns, sub[sub.setting.isin([at.get((col, "sample")), at.get((col, "greedy"))])], palette)
        ax.set(title=f"{_column_title(col)} inference")
    _passk_legend(axes[0][-1], [m for m in MODE_ORDER if m in set(sub.train_mode)], palette)
    return fig


def _passk_panel(ax, sns, sub: pd.DataFrame, palette: dict) -> None:
    """pass@k of one CoT mode's sampled setting (lines) and its greedy pass@1 (triangles at k = 1, side by side)."""
    trainings = [m for m in MODE_ORDER if m in set(sub.train_mode)]
    sample = sub[sub.setting.map(lambda s: SETTINGS[s].decoding == "sample")]
    if not sample.empty:
        sns.lineplot(sample, x="k", y="pass@k (%)", hue="train_mode", marker="o", ax=ax, errorbar="sd",
                     palette=palette, hue_order=[m for m in trainings if m in set(sample.train_mode)], legend=False)
    greedy = sub[sub.setting.map(lambda s: SETTINGS[s].decoding == "greedy")].groupby("train_mode")[
        "pass@k (%)"].agg(["mean", "std"])
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
    ax.set(xlabel="k", ylabel="pass@k (%)")


def _passk_legend(ax, trainings: list[str], palette: dict) -> None:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=palette[m], marker="o", label=m) for m in trainings]
    handles.append(Line2D([], [], color="gray", marker="^", markeredgecolor="black", linestyle="none",
                          label="greedy pass@1"))
    ax.legend(handles=handles, title="training", fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0),
              borderaxespad=0)
