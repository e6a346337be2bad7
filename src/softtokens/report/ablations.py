"""The appendix ablations in the paper's shape: noise factor, temperature and noise placement
tables (Appendix "Ablations") and their greedy-validation figures.

Why a module of its own: an ablation table's rows are training *variants* of one (model,
dataset) cell, described by what each varies (gamma, tau, placement, top-k), not trainings of
different cells as in Table 1; and its default rows are another grid's runs, which may not
exist yet. A row whose files are missing says so ("not yet run") instead of vanishing.

Beside our numbers, for a paper grid, each table lists the paper's (paper.py) for the same rows
and whether they agree within 2 sigma (the reproduction report's rule).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from softtokens.cells.results import load_eval_frame, mean_std_text, parse_mean_std
from softtokens.report.figures import _save_fig
from softtokens.report.tables import setting_columns, write_table
from softtokens.store import paths
from softtokens.config.names import table_settings
from softtokens.store.paths import arm as arm_name
from softtokens.store.paths import parse_run_path
from softtokens.store.provenance import Provenance

# (setting, metric, column title) of the paper's nine ablation columns, from config.names's registry
# ("pass@n": n is put in when the table is made)
COLUMNS = [(s, metric, title) for (s, metric), title in setting_columns(list(table_settings()), "n").items()]
PLACEMENT_NAMES = {"embedding": "Embedding", "hidden": "Final Hidden", "logits": "Logits"}
DESCRIBE = {"mode": ("Training", lambda r: r["mode"].capitalize()),
            "placement": ("Noise Loc", lambda r: PLACEMENT_NAMES[r["placement"]]),
            "temperature": ("Temp", lambda r: f"{r['temperature']:g}"),
            "top_k": ("Top-k", lambda r: str(r["top_k"]) if r["top_k"] else "-"),
            "noise_factor": ("Noise Factor", lambda r: f"{r['noise_factor']:g}"),
            "clip_ratio": ("Clip (x median)", lambda r: f"{r['clip_ratio']:g}" if r.get("clip_ratio") else "-"),
            "clip_groups": ("Clipped", lambda r: ("-" if not r.get("clip_ratio") else
                                                  {"global": "whole gradient", "embedding_rest": "E and rest apart"}[
                                                      r.get("clip_groups", "global")]))}
NOT_RUN = "not yet run"
# our table names -> the paper's (its default rows differ slightly between tables: read each from its own)
PAPER_TABLE = {"noise_factor": "tab:scale", "temperature": "tab:temp", "placement": "tab:placement"}


def _label(row: dict) -> str:
    """How `softtokens audit` names a row: its arm (mode or mode@variant), or 'base'."""
    return row["arm"]


def ablation_table(df: pd.DataFrame, spec: dict) -> pd.DataFrame:
    """One table: a row per spec row (base first when asked), descriptor columns, then the nine
    metric columns as 'mean±std' over seeds ('not yet run' when the row has no files)."""
    n = int(df["n"].max()) if not df.empty else 0
    base_row = {"arm": "base", "mode": "none", "variant": "", "placement": None}
    rows = ([base_row] if spec.get("base") else []) + spec["rows"]
    records, cells = [], {}
    for row in rows:
        rec = {"row": _label(row)}
        for key in spec["describe"]:
            title, fmt = DESCRIBE[key]
            rec[title] = ("None" if key == "mode" else "-") if row["mode"] == "none" else fmt(row)
        if df.empty:
            sub = df
        elif row["mode"] == "none":
            sub = df[df.train_mode == "none"]
        else:
            sub = df[(df.train_mode == row["mode"]) & (df.variant == row["variant"])]
        rec["seeds"] = int(sub.seed.nunique()) if not sub.empty else 0
        for setting, metric, label in COLUMNS:
            col = label.replace("pass@n", f"pass@{n}")
            vals = sub[sub.setting == setting]
            if vals.empty:
                rec[col] = NOT_RUN
                continue
            v = vals[metric]
            rec[col] = mean_std_text(v.mean(), v.std(), len(v))
            cells[(rec["row"], col)] = {"value": rec[col], "setting": setting, "metric": metric, "digits": 1,
                                        "evals": sorted(vals["path"])}
        records.append(rec)
    table = pd.DataFrame(records)
    table.attrs["cells"] = cells
    return table


def paper_rows(spec: dict, model: str, dataset: str, table: str | None = None) -> pd.DataFrame:
    """The paper's numbers for the same rows (paper.VARIANTS maps its labels to our variants):
    one row per table row, the nine columns as 'mean±std'; absent rows are left out. ``table``:
    the paper table to read first (PAPER_TABLE), others fill rows it lacks."""
    from softtokens.cells.paper import load_paper_results, paper_seeds

    paper = load_paper_results()
    paper = paper[(paper.model == model) & (paper.benchmark == dataset)]
    if table:
        paper = paper.assign(_own=paper.table != table).sort_values("_own", kind="stable")
    out = []
    base = [{"arm": "base", "mode": "none", "variant": ""}] if spec.get("base") else []
    for row in base + spec["rows"]:
        if row["mode"] == "none":
            sub = paper[paper.train_mode == "none"]
        else:
            sub = paper[(paper.train_mode == row["mode"]) & (paper.variant == row["variant"])
                        & (paper.train_dataset == dataset)]
        if sub.empty:
            continue
        rec = {"row": row["arm"]}
        for setting, metric, label in COLUMNS:
            want = "pass@1" if metric == "pass@1" else "pass@32"
            hit = sub[(sub.setting == setting) & (sub.metric == want)].drop_duplicates(["setting", "metric"])
            seeds = paper_seeds(row["mode"], row.get("variant", ""))
            rec[label.replace("pass@n", "pass@32")] = (mean_std_text(hit["mean"].iloc[0], hit["std"].iloc[0], seeds)
                                                       if not hit.empty else "-")
        out.append(rec)
    return pd.DataFrame(out)


def agreement(ours: pd.DataFrame, paper: pd.DataFrame, sigmas: float = 2.0) -> pd.DataFrame:
    """Per row and column of both tables: |ours - paper| <= sigmas * sqrt(sd_o² + sd_p²)."""
    out = []
    if ours.empty or paper.empty:
        return pd.DataFrame(out)
    for _, p in paper.iterrows():
        o = ours[ours.row == p["row"]]
        if o.empty:
            continue
        rec = {"row": p["row"]}
        for col in paper.columns.drop("row"):
            a, b = o.iloc[0].get(col), p[col]
            if not isinstance(a, str) or a == NOT_RUN or b == "-":
                rec[col] = "-"
                continue
            (mo, so), (mp, sp) = parse_mean_std(a), parse_mean_std(b)
            tol = sigmas * math.sqrt(so ** 2 + sp ** 2)
            rec[col] = f"{mo - mp:+.1f} ({'within' if abs(mo - mp) <= tol else 'outside'} {sigmas:g}σ)"
        out.append(rec)
    return pd.DataFrame(out)


def write_ablations(eval_paths: list[Path], metrics_paths: list[Path], tables_dir: Path, figures_dir: Path,
                    settings: dict) -> None:
    prov = Provenance("ablation_tables", settings,
                      inputs={p.as_posix(): p for p in [*eval_paths, *metrics_paths]})
    tables_dir.mkdir(parents=True, exist_ok=True)
    figures_dir.mkdir(parents=True, exist_ok=True)
    frame = load_eval_frame([p for p in eval_paths if p.stem != "loglik"]) if eval_paths else pd.DataFrame()
    if not frame.empty:
        frame = frame[(frame.model == settings["model"]) & (frame.benchmark == settings["dataset"])
                      | (frame.benchmark == settings["dataset"]) & (frame.train_mode == "none")]
    curves = _validation_curves(metrics_paths)
    for name, spec in settings["tables"].items():
        table = ablation_table(frame, spec)
        caption = (f"{spec['title']}: {settings['model']} trained on {settings['dataset']}, tested on "
                   f"{settings['dataset']} under the six inference settings; pass@1 and pass@n in %, mean ± sample "
                   f"std over seeds. Rows marked '{NOT_RUN}' have no evaluation files yet (a default row is the "
                   "reused grid's runs: run that grid first).")
        if not settings.get("toy"):
            paper = paper_rows(spec, settings["model"], settings["dataset"], PAPER_TABLE.get(name))
            if not paper.empty:
                caption += ("\n\nThe paper's numbers for the same rows:\n\n"
                            + paper.to_markdown(index=False, disable_numparse=True)
                            + "\n\nOurs minus the paper's, and whether within 2σ (σ = sqrt(sd_ours² + sd_paper²)):\n\n"
                            + agreement(table, paper).to_markdown(index=False))
        write_table(table, tables_dir, paths.ablation_name(name), caption, prov)
        _figure(curves, spec, name, settings, figures_dir / f"{paths.ablation_name(name)}.png", prov)


def _validation_curves(metrics_paths: list[Path]) -> pd.DataFrame:
    rows = []
    for p in metrics_paths:
        keys = parse_run_path(p)
        for line in Path(p).read_text().splitlines():
            m = json.loads(line)
            if m.get("kind") == "validation":
                rows.append({**keys, "arm": arm_name(keys["train_mode"], keys["variant"]), "step": m["step"],
                             "greedy validation (%)": 100 * m["val_greedy_accuracy"]})
    return pd.DataFrame(rows)


def _figure(curves: pd.DataFrame, spec: dict, name: str, settings: dict, path: Path, prov: Provenance) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns
    from matplotlib.ticker import MaxNLocator

    sns.set_theme(style="whitegrid", context="paper")
    arms = [r["arm"] for r in spec["rows"]]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    palette = dict(zip(arms, sns.color_palette("colorblind", len(arms))))
    sub = curves[curves.arm.isin(arms)] if not curves.empty else curves
    for arm in arms:
        c = sub[sub.arm == arm] if not sub.empty else sub
        if c.empty:
            ax.plot([], [], color=palette[arm], label=f"{arm} ({NOT_RUN})", linestyle=":")
            continue
        for _, seed in c.groupby("seed"):
            ax.plot(seed.step, seed["greedy validation (%)"], color=palette[arm], alpha=0.3, linewidth=0.8)
        mean = c.groupby("step")["greedy validation (%)"].mean()
        style = "-" if "@" in arm else "--"
        ax.plot(mean.index, mean.values, color=palette[arm], marker="o", markersize=3, linestyle=style,
                label=f"{arm} ({c.seed.nunique()} seeds)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="RL step", ylabel="greedy validation (%)",
           title=f"{spec['title']}: {settings['model']} on {settings['dataset']}")
    ax.legend(title="training (dashed: default)", fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0),
              borderaxespad=0)
    _save_fig(fig, path, prov)
    plt.close(fig)

