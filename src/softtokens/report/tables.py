"""Tables (Markdown, LaTeX, CSV, HTML) from evaluation results.

Tables aggregate over seeds as mean ± std (sample std, ddof=1; a single seed or the base model's
one evaluation is printed without ±), in percent, in the shape of the paper's Table 1 (hard
inference), its appendix tables (all six inference settings) and its out-of-domain table."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd

from softtokens.cells.results import load_eval_frame, load_loglik_frame, main_cells, mean_std_text
from softtokens.store import paths
from softtokens.store.files import write_text
from softtokens.config.names import (
    TABLE_MODES,
    is_sampled,
    setting_decoding,
    setting_label,
    settings_of,
    table_settings,
)
from softtokens.store.provenance import Provenance, rel

# rows: the base model ('none'), then the trainings in the paper's order
MODE_ORDER = ["none", *TABLE_MODES]


def main_settings() -> list[str]:
    """Table 1's settings: those whose CoT is hard (config.names decides, in its order)."""
    return list(settings_of(("hard",)))


def ood_caption(protocols: set[str]) -> str:
    """The out-of-domain table's caption: which protocol made the accuracy column (softtokens.ood)."""
    from softtokens.eval.ood import NLL_DEFINITION, PROTOCOLS

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
    marked = df[df.failed_to_learn].groupby(["model", "train_dataset", "train_mode"]).seed.unique()
    if marked.empty:
        return ""
    seeds = df.groupby(["model", "train_dataset", "train_mode"]).seed.nunique()
    rows = "; ".join(f"{m} {d} {mode}: seed {', '.join(map(str, sorted(s)))} of {seeds[(m, d, mode)]}"
                     for (m, d, mode), s in marked.items())
    return (f" {BELOW_BASE_MARK} Failed to learn: the selected checkpoint (best greedy validation among trained "
            f"steps; the base model at step 0 is never selected) scored below the base model on greedy validation, or "
            f"answered no validation question, for: {rows}.")


def _order(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["_mode"] = df["train_mode"].map({m: i for i, m in enumerate(MODE_ORDER)})
    return df.sort_values(["model", "_mode", "train_dataset"]).drop(columns="_mode")


def setting_columns(settings: list[str], n: int | str, label=setting_label) -> dict:
    """(setting, metric) -> column title: pass@1 of every setting, and pass@n of a sampled one
    (``n`` the samples per problem, or the letter "n" where it is put in later)."""
    cols = {}
    for s in settings:
        cols[(s, "pass@1")] = f"{label(s)} pass@1"
        if is_sampled(s):
            cols[(s, "pass@n")] = f"{label(s)} pass@{n}"
    return cols


def _samples(df: pd.DataFrame) -> int:
    """The n of the sampled settings' pass@n (the grid's n_samples)."""
    sampled = df[df["n"] > 1]
    return int(sampled["n"].max()) if not sampled.empty else 1


def main_table(df: pd.DataFrame) -> pd.DataFrame:
    """Table 1's shape: per benchmark, the hard settings' pass@1 and the sampled one's pass@n."""
    cols = setting_columns(main_settings(), _samples(df), label=lambda s: setting_decoding(s).capitalize())
    return _wide(df, cols)


def settings_table(df: pd.DataFrame, benchmark: str) -> pd.DataFrame:
    """The appendix tables' shape: one benchmark, every inference setting."""
    sub = df[df.benchmark == benchmark]
    return _wide(sub, setting_columns(list(table_settings()), _samples(sub)), by_benchmark=False)


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
            rec[col] = mean_std_text(r["mean"], r["std"], int(r["count"]), digits)
            rec["_seeds"] = int(r["count"])
            rows = sub[(sub[keys + ["benchmark"]] == pd.Series({k: r[k] for k in keys + ["benchmark"]})).all(axis=1)]
            cells[(_row_label(r), col)] = {"value": rec[col], "setting": setting, "metric": metric,
                                           "digits": digits, "evals": sorted(rel(p) for p in rows["path"])}
    table = _order(pd.DataFrame(records.values()))
    below = set(map(tuple, df.loc[df.failed_to_learn, keys].drop_duplicates().itertuples(index=False)))
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


TABLE_CSS = ("body{font-family:system-ui,sans-serif;margin:1em;color:#222}"
             "table{border-collapse:collapse;font-size:14px}th,td{padding:4px 10px;text-align:right;"
             "border-bottom:1px solid #ddd}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}"
             "tr:hover td{background:#fafafa}p{max-width:70em}")


def table_html(table: pd.DataFrame, caption: str) -> str:
    """A page of its own: what `snakemake --report` shows inline (a CSV would be a download link)."""
    return (f"<!doctype html><html><head><meta charset='utf-8'><style>{TABLE_CSS}</style></head><body>"
            f"<p>{html.escape(caption)}</p>" + table.to_html(index=False, border=0, escape=True) + "</body></html>\n")


def write_table(table: pd.DataFrame, out_dir: Path, name: str, caption: str, prov: Provenance) -> list[Path]:
    # disable_numparse: a cell is printed text ("38.3", "56.2±3.3"), never re-read as a number ("0.0" -> 0)
    texts = {out_dir / f"{name}.{ext}": text for ext, text in (
        ("md", f"{caption}\n\n" + table.to_markdown(index=False, disable_numparse=True) + "\n"),
        ("tex", _to_latex(table, caption)), ("csv", table.to_csv(index=False)), ("html", table_html(table, caption)))}
    if table.attrs.get("cells"):
        cells = [{"row": row, "column": col, **cell} for (row, col), cell in table.attrs["cells"].items()]
        texts[out_dir / f"{name}.{paths.CELLS_EXT}"] = json.dumps(cells, indent=1) + "\n"
    for path, text in texts.items():
        write_text(path, text)
        prov.write_sidecar(path, outputs=list(texts))   # each file's record names the table's whole set
    return list(texts)


def write_tables(eval_paths: list[Path], out_dir: Path, settings: dict, names: list[str] | None = None) -> list[str]:
    """Tables from math results (one JSON per inference setting) and out-of-domain results
    (loglik.json): those ``names`` lists (main, settings_<benchmark>, ood), or every one the files
    make. The workflow makes each table as a job of its own, from the files it needs only."""
    eval_paths = [Path(p) for p in eval_paths]
    prov = Provenance("tables", settings, inputs={p.as_posix(): p for p in eval_paths})
    made = []

    def wanted(name: str) -> bool:
        return names is None or name in names

    loglik_paths = [p for p in eval_paths if p.stem == "loglik"]
    if loglik_paths and wanted(paths.OOD_TABLE):
        ood = main_cells(load_loglik_frame(loglik_paths))
        write_table(ood_table(ood), out_dir, paths.OOD_TABLE, ood_caption(set(ood.protocol)) + below_base_note(ood), prov)
        made.append(paths.OOD_TABLE)
    math_paths = [p for p in eval_paths if p.stem != "loglik"]
    if math_paths:
        df = main_cells(load_eval_frame(math_paths))
        note = below_base_note(df)
        if wanted(paths.MAIN_TABLE):
            caption = ("Hard inference (CoT greedy tau=0 / sampled tau=1, answers greedy): pass@1 and pass@n in %, "
                       "mean ± std over seeds (sample std; one seed: no ±)." + note)
            write_table(main_table(df[df.setting.isin(main_settings())]), out_dir, paths.MAIN_TABLE, caption, prov)
            made.append(paths.MAIN_TABLE)
        for bench in sorted(df.benchmark.unique()):
            if wanted(paths.settings_table(bench)):
                write_table(settings_table(df, bench), out_dir, paths.settings_table(bench),
                            f"{bench}: every inference setting, pass@1 and pass@n in %, mean ± std over seeds (one "
                            f"seed: no ±)." + note, prov)
                made.append(paths.settings_table(bench))
    missing = sorted(set(names or []) - set(made))
    if missing:
        raise ValueError(f"no evaluation files for table(s) {', '.join(missing)} among the {len(eval_paths)} given")
    return made
