"""Tables (Markdown, LaTeX, CSV) and figures (PNG) from evaluation results and training metrics.

Tables aggregate over seeds as mean ± std (sample std, ddof=1; 0 for a single seed or the
base model), in percent, in the shape of the paper's Table 1 (hard inference) and its
appendix tables (all six inference settings)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from softtokens.paths import parse_eval_path, parse_run_path
from softtokens.provenance import Provenance, atomic_path, write_text

SETTING_ORDER = ["hard_greedy", "hard_sample", "fuzzy_greedy", "fuzzy_sample", "soft_greedy", "soft_sample"]
MODE_ORDER = ["none", "hard", "fuzzy", "soft"]


def main_cells(df: pd.DataFrame) -> pd.DataFrame:
    """The paper's main cells (default variant): Table 1, the appendix and OOD tables and the
    per-run figures show these; ablation variants have tables of their own (ablations.py)."""
    return df[df["variant"] == ""] if "variant" in df else df


def _below_base(result: dict) -> bool:
    """The evaluated checkpoint scored below its base model on greedy validation (selection
    never picks the base itself, so a run that only hurt reports its best trained step)."""
    sel = result.get("selection") or {}
    base = sel.get("base_val_greedy_accuracy")
    return base is not None and sel.get("val_greedy_accuracy") is not None and sel["val_greedy_accuracy"] < base


def _sampling_var(values: list[float]) -> float:
    """Variance of a mean over problems, from its problems' own values: var / N (population var)."""
    n = len(values)
    if n < 2:
        return float("nan")
    mean = sum(values) / n
    return sum((v - mean) ** 2 for v in values) / n / n


def load_eval_frame(paths: list[Path]) -> pd.DataFrame:
    """One row per evaluation file: pass@1 and pass@n in %, and the sampling variance of each over
    the file's problems (``*_var``, %^2: the test set's share of the number's uncertainty;
    reproduction.py)."""
    from softtokens.metrics import pass_at_k

    rows = []
    for p in paths:
        res = json.loads(Path(p).read_text())
        n = res["n_samples"]
        problems = res.get("problems", [])
        p1 = [100 * pr["correct"] / pr["n"] for pr in problems]
        pn = [100 * pass_at_k(pr["n"], pr["correct"], pr["n"]) for pr in problems]
        rows.append({**parse_eval_path(Path(p)), "pass@1": 100 * res["pass@1"], "pass@n": 100 * res["pass@k"][str(n)],
                     "pass@1_var": _sampling_var(p1), "pass@n_var": _sampling_var(pn),
                     "n": n, "n_problems": res.get("n_problems", len(problems)),
                     "mean_cot_length": res["mean_cot_length"], "below_base": _below_base(res), "path": str(p)})
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
                     "n_problems": res["n_problems"], "below_base": _below_base(res), "path": str(p)})
    return pd.DataFrame(rows)


def ood_caption(protocols: set[str]) -> str:
    """The out-of-domain table's caption: which protocol made the accuracy column (softtokens.ood)."""
    from softtokens.ood import NLL_DEFINITION, PROTOCOLS

    names = sorted(protocols)
    if len(names) != 1:
        head = f"Out-of-domain multiple choice; the accuracy columns mix protocols ({', '.join(names)}): do not compare them. "
    else:
        head = f"Out-of-domain multiple choice, {names[0]} protocol. Accuracy (%): {PROTOCOLS[names[0]]}. "
    return head + f"NLL Correct: {NLL_DEFINITION}. Mean ± std over seeds."


def ood_table(df: pd.DataFrame) -> pd.DataFrame:
    """Table 4's shape: per benchmark, accuracy and NLL of the correct answer."""
    cols = {("loglik", "accuracy"): "Accuracy", ("loglik", "nll_correct"): "NLL Correct"}
    return _wide(df, cols, digits=2)


def _mean_std(df: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    g = df.groupby(keys, sort=False)[value]
    out = g.agg(["mean", "std", "count"]).reset_index()
    out["std"] = out["std"].fillna(0.0)
    return out


BELOW_BASE_MARK = "†"


def _training_label(row) -> str:
    return "no finetune" if row["train_mode"] == "none" else f"{row['train_dataset']} {row['train_mode']}"


def below_base_note(df: pd.DataFrame) -> str:
    """The footnote for table rows marked BELOW_BASE_MARK, naming each row and its seeds."""
    marked = df[df.below_base].groupby(["model", "train_dataset", "train_mode"]).seed.unique()
    if marked.empty:
        return ""
    seeds = df.groupby(["model", "train_dataset", "train_mode"]).seed.nunique()
    rows = "; ".join(f"{m} {d} {mode}: seed {', '.join(map(str, sorted(s)))} of {seeds[(m, d, mode)]}"
                     for (m, d, mode), s in marked.items())
    return (f" {BELOW_BASE_MARK} The selected checkpoint (best greedy validation among trained steps; the base "
            f"model at step 0 is never selected) scored below the base model on greedy validation for: {rows}.")


def _order(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["_mode"] = df["train_mode"].map({m: i for i, m in enumerate(MODE_ORDER)})
    return df.sort_values(["model", "_mode", "train_dataset"]).drop(columns="_mode")


def main_table(df: pd.DataFrame) -> pd.DataFrame:
    """Table 1's shape: per benchmark, hard greedy pass@1, hard sample pass@1 and pass@n."""
    n = int(df.loc[df.setting == "hard_sample", "n"].max()) if (df.setting == "hard_sample").any() else 1
    cols = {("hard_greedy", "pass@1"): "Greedy pass@1", ("hard_sample", "pass@1"): "Sample pass@1",
            ("hard_sample", "pass@n"): f"Sample pass@{n}"}
    return _wide(df, cols)


def settings_table(df: pd.DataFrame, benchmark: str) -> pd.DataFrame:
    """The appendix tables' shape: one benchmark, all six inference settings."""
    sub = df[df.benchmark == benchmark]
    n = int(sub["n"].max())
    cols = {}
    for mode in ("hard", "fuzzy", "soft"):
        cols[(f"{mode}_greedy", "pass@1")] = f"{mode.capitalize()} Greedy pass@1"
        cols[(f"{mode}_sample", "pass@1")] = f"{mode.capitalize()} Sample pass@1"
        cols[(f"{mode}_sample", "pass@n")] = f"{mode.capitalize()} Sample pass@{n}"
    return _wide(sub, cols, by_benchmark=False)


def _wide(df: pd.DataFrame, cols: dict, by_benchmark: bool = True, digits: int = 1) -> pd.DataFrame:
    keys = ["model", "train_dataset", "train_mode"]
    records: dict[tuple, dict] = {}
    cells: dict[tuple[str, str], dict] = {}
    for (setting, metric), label in cols.items():
        sub = df[df.setting == setting]
        if sub.empty:
            continue
        agg = _mean_std(sub, keys + ["benchmark"], metric)
        for _, r in agg.iterrows():
            rec = records.setdefault(tuple(r[k] for k in keys), {k: r[k] for k in keys})
            col = f"{r['benchmark']} {label}" if by_benchmark else label
            rec[col] = f"{r['mean']:.{digits}f}±{r['std']:.{digits}f}"
            rec["_seeds"] = int(r["count"])
            rows = sub[(sub[keys + ["benchmark"]] == pd.Series({k: r[k] for k in keys + ["benchmark"]})).all(axis=1)]
            cells[(_row_label(r), col)] = {"value": rec[col], "setting": setting, "metric": metric,
                                           "digits": digits, "evals": sorted(rows["path"])}
    table = _order(pd.DataFrame(records.values()))
    below = set(map(tuple, df.loc[df.below_base, keys].drop_duplicates().itertuples(index=False)))
    table.insert(1, "training", table.apply(
        lambda r: _training_label(r) + (f" {BELOW_BASE_MARK}" if tuple(r[k] for k in keys) in below else ""), axis=1))
    table = table.drop(columns=["train_dataset", "train_mode"]).rename(columns={"_seeds": "seeds"})
    table = table[["model", "training", "seeds"] + [c for c in table.columns if c not in ("model", "training", "seeds")]]
    table.attrs["cells"] = cells
    return table


def _row_label(r) -> str:
    """How `softtokens audit TABLE --row` names a table row: model and training, no marks."""
    return f"{r['model']} {_training_label(r)}"


def _to_latex(table: pd.DataFrame, caption: str) -> str:
    body = table.to_latex(index=False, escape=True)
    body = body.replace("±", r"$\pm$").replace(BELOW_BASE_MARK, r"$^\dagger$")
    return "\\begin{table}[ht]\\centering\\footnotesize\n" + body + f"\\caption{{{caption}}}\n\\end{{table}}\n"


def write_table(table: pd.DataFrame, out_dir: Path, name: str, caption: str, prov: Provenance) -> list[Path]:
    paths = []
    for ext, text in (("md", f"{caption}\n\n" + table.to_markdown(index=False) + "\n"),
                      ("tex", _to_latex(table, caption)), ("csv", table.to_csv(index=False))):
        path = out_dir / f"{name}.{ext}"
        write_text(path, text)
        prov.write_sidecar(path)
        paths.append(path)
    if table.attrs.get("cells"):
        cells = [{"row": row, "column": col, **cell} for (row, col), cell in table.attrs["cells"].items()]
        path = out_dir / f"{name}.cells.json"
        write_text(path, json.dumps(cells, indent=1) + "\n")
        prov.write_sidecar(path)
        paths.append(path)
    return paths


def write_tables(eval_paths: list[Path], out_dir: Path, settings: dict) -> None:
    """Math results (one JSON per inference setting) and out-of-domain results (loglik.json)."""
    prov = Provenance("tables", settings, inputs={p.as_posix(): p for p in eval_paths})
    loglik_paths = [p for p in eval_paths if p.stem == "loglik"]
    if loglik_paths:
        ood = main_cells(load_loglik_frame(loglik_paths))
        write_table(ood_table(ood), out_dir, "ood", ood_caption(set(ood.protocol)) + below_base_note(ood), prov)
    df = main_cells(load_eval_frame([p for p in eval_paths if p.stem != "loglik"]))
    note = below_base_note(df)
    caption = ("Hard inference (CoT greedy tau=0 / sampled tau=1, answers greedy): pass@1 and pass@n in %, "
               "mean ± std over seeds (sample std)." + note)
    write_table(main_table(df), out_dir, "main", caption, prov)
    for bench in sorted(df.benchmark.unique()):
        write_table(settings_table(df, bench), out_dir, f"settings_{bench}",
                    f"{bench}: all six inference settings, pass@1 and pass@n in %, mean ± std over seeds." + note,
                    prov)
    long = _mean_std(df, ["model", "train_dataset", "train_mode", "benchmark", "setting"], "pass@1")
    write_text(out_dir / "pass1_long.csv", long.to_csv(index=False))
    prov.write_sidecar(out_dir / "pass1_long.csv")


# ---------------------------------------------------------------- figures
# one colour per training mode in every figure (seaborn's colour-blind palette; the base model grey)
MODE_COLOURS = {"none": "#7f7f7f", "hard": "#0173b2", "fuzzy": "#de8f05", "soft": "#029e73"}


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
        sns.lineplot(train, x="step", y="smoothed", hue="train_mode", units="seed", estimator=None, ax=axes[0],
                     palette=MODE_COLOURS, hue_order=[m for m in MODE_ORDER if m in set(train.train_mode)], legend=False)
        axes[0].set(title="(a) training success (rolling mean)", xlabel="RL step", ylabel="correct rollouts (%)")
        val = sub[sub.kind == "validation"].copy()
        val["greedy validation (%)"] = 100 * val["val_greedy_accuracy"]
        sns.lineplot(val, x="step", y="greedy validation (%)", hue="train_mode", units="seed", estimator=None,
                     marker="o", ax=axes[1], palette=MODE_COLOURS,
                     hue_order=[m for m in MODE_ORDER if m in set(val.train_mode)])
        axes[1].set(title="(b) greedy validation (model selection)", xlabel="RL step")
        for ax in axes:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        _legend_outside(axes[1])
        fig.suptitle(f"{model} trained on {dataset}")
        _save_fig(fig, out_dir / f"training_{model}_{dataset}.png", prov)
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
            _save_fig(fig, out_dir / f"passk_{model}_{dataset}_{bench}.png", prov)
            plt.close(fig)

    ent = pd.DataFrame([{**keys, "position": pos, "entropy": h} for keys, res in evals
                        for pos, h in enumerate(res["entropy_profile"])
                        if h is not None and res["entropy_count"][pos] >= 5])
    if not ent.empty:
        for (model, dataset, bench), sub in figure_groups(ent):
            settings_present = [s for s in SETTING_ORDER if s in set(sub.setting)]
            fig, axes = plt.subplots(1, len(settings_present), figsize=(3.2 * len(settings_present), 3), sharex=True,
                                     sharey=True, squeeze=False)
            for ax, setting in zip(axes[0], settings_present):
                s = sub[sub.setting == setting]
                sns.lineplot(s, x="position", y="entropy", hue="train_mode", units="seed", estimator=None,
                             alpha=0.7, ax=ax, palette=palette, hue_order=[m for m in MODE_ORDER if m in set(s.train_mode)],
                             legend=ax is axes[0][0])
                ax.set(title=setting.replace("_", " "), xlabel="CoT position (token)", ylabel="entropy (nats)")
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            handles, labels = axes[0][0].get_legend_handles_labels()
            if axes[0][0].get_legend() is not None:
                axes[0][0].get_legend().remove()
            if handles:  # right of the last panel, off the data
                axes[0][-1].legend(handles, labels, title="training", fontsize="small", loc="upper left",
                                   bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
            fig.suptitle(f"CoT entropy of {model} trained on {dataset} ({bench}; none = base model)", y=1.04)
            _save_fig(fig, out_dir / f"entropy_{model}_{dataset}_{bench}.png", prov)
            plt.close(fig)


def figure_groups(df: pd.DataFrame):
    """((model, training set, benchmark), rows) for each per-run figure, as the paper draws them:
    the runs trained on one set beside their base model ('none'). A model evaluated with no
    training run gets one figure of its base alone, with 'base' in the training-set slot."""
    for (model, bench), sub in df.groupby(["model", "benchmark"], sort=True):
        for dataset in sorted(set(sub.train_dataset) - {"none"}) or ["base"]:
            yield (model, dataset, bench), sub[sub.train_dataset.isin([dataset, "none"])]


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
        for train_mode, g in greedy.iterrows():
            ax.errorbar([1], [g["mean"]], yerr=[0.0 if pd.isna(g["std"]) else g["std"]], marker="^", markersize=9,
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


# ---------------------------------------------------------------- audit of one table cell
def audit_cell(table: str | Path, row: str, column: str) -> tuple[list[str], int]:
    """The chain of one table cell: the cell -> its evaluation files (one per seed) -> selected
    checkpoint -> training run -> base model and data, each link with code version, config hash
    and input hashes (provenance.audit). Flags a missing or changed evaluation file, a value that
    no longer follows from the files, and every broken link further up."""
    from softtokens.provenance import audit, read_record, sha256_path

    table = Path(table)
    cells_path = table.with_name(table.name.split(".")[0] + ".cells.json")
    if not cells_path.exists():
        return [f"MISSING {cells_path} (the cell index written beside every table)"], 1
    cells = json.loads(cells_path.read_text())
    match = [c for c in cells if c["row"] == row.strip() and c["column"] == column.strip()]
    if not match:
        rows = sorted({c["row"] for c in cells})
        cols = sorted({c["column"] for c in cells})
        raise KeyError(f"no cell ({row!r}, {column!r}) in {table}; rows: {rows}; columns: {cols}")
    cell = match[0]
    lines = [f"cell {table.name.split('.')[0]} [{cell['row']}] [{cell['column']}] = {cell['value']} "
             f"({cell['setting']}, {cell['metric']}, {len(cell['evals'])} seed file(s))"]
    problems = 0
    made_from = {inp["path"]: inp["sha256"] for inp in (read_record(cells_path) or {}).get("inputs", {}).values()}
    values = []
    for p in map(Path, cell["evals"]):
        if not p.exists():
            lines.append(f"  MISSING {p}")
            problems += 1
            continue
        recorded = made_from.get(p.as_posix())
        if recorded and recorded != sha256_path(p):
            lines.append(f"  CHANGED {p} since the table was made (recorded {recorded[:12]}, now {sha256_path(p)[:12]})")
            problems += 1
        load = load_loglik_frame if p.stem == "loglik" else load_eval_frame  # as the table read it
        values.append(float(load([p])[cell["metric"]].iloc[0]))
        sub, sub_problems = audit(p, 1)
        lines.extend(sub)
        problems += sub_problems
    if values and len(values) == len(cell["evals"]):
        s = pd.Series(values)
        d = cell["digits"]
        now = f"{s.mean():.{d}f}±{(s.std() if len(s) > 1 else 0.0):.{d}f}"
        if now != cell["value"]:
            lines.append(f"  CHANGED VALUE: the files now give {now}, the table says {cell['value']}")
            problems += 1
    lines.append(f"{problems} problem(s)" if problems else "chain intact: every link present and unchanged")
    return lines, problems
