"""The hyperparameter search's table and figure per model, and the summary the reproduction report reads:
greedy validation pass@1 of each run's selected checkpoint against the swept value, per training mode (seeds
as points), the value each search selects beside the paper's, and whether the selection is a finding
(search.selection). A value whose runs are not all selected yet is listed as not yet run, never dropped."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from softtokens.cells.paper import PAPER_SEARCH
from softtokens.report.figures import _save_fig
from softtokens.report.tables import write_table
from softtokens.store import paths
from softtokens.store.files import write_json
from softtokens.store.provenance import Provenance
from softtokens.search.selection import COMBINED, Search, Selection, across_modes, combine, select, value_text

PARAM_TITLES = {"learning_rate": "learning rate", "noise_factor": "noise factor γ"}


def sweep_frame(runs: list[dict]) -> pd.DataFrame:
    """One row per run of the sweep: its keys and its selected checkpoint's greedy validation accuracy (NaN:
    no selection yet)."""
    rows = []
    for r in runs:
        path = Path(r["selected"])
        chosen = json.loads(path.read_text()) if path.exists() else {}
        rows.append({**{k: r[k] for k in ("model", "dataset", "param", "value", "mode", "seed", "variant")},
                     "val_greedy_accuracy": chosen.get("val_greedy_accuracy", math.nan),
                     "val_correct": chosen.get("val_correct", "")})
    return pd.DataFrame(rows)


def reference(param: str, model: str, settings: dict) -> tuple[float | None, str]:
    """What a search is compared with: the paper's selection for its models, else the grid's own value."""
    paper = PAPER_SEARCH[param].get(model)
    if paper is not None and not settings.get("toy"):
        return paper, "paper"
    return settings["configured"][param].get(model), "configured"


def selections(frame: pd.DataFrame, settings: dict) -> list[Selection]:
    """Per (model, train set, parameter, mode) its selection, and per model its train sets combined (the paper's
    one value per model: search.selection.combine) where it searched more than one."""
    out, searches = [], {}
    for (model, dataset, param, mode), g in frame.groupby(["model", "dataset", "param", "mode"], sort=True):
        done = g.dropna(subset=["val_greedy_accuracy"]).sort_values("seed")
        missing = [float(m) for m in sorted(set(g.value) - set(done.value))]
        if done.empty:
            continue
        runs = {float(v): list(s.val_greedy_accuracy) for v, s in done.groupby("value")}
        outcomes = {float(v): list(s.val_correct) for v, s in done.groupby("value")}
        n = settings["n_validation"][f"{model}/{dataset}"]
        ref, source = reference(param, model, settings)
        out.append(select(model, dataset, param, mode, runs, n, ref, source, missing, outcomes))
        searches.setdefault((model, param, mode), {})[dataset] = (Search(runs, outcomes, n), missing)
    for (model, param, mode), by_set in sorted(searches.items()):
        if len(by_set) > 1:
            ref, source = reference(param, model, settings)
            missing = sorted({m for _, ms in by_set.values() for m in ms})
            out.append(combine({d: s for d, (s, _) in by_set.items()}, model, param, mode, ref, source, missing))
    return out


def sweep_table(frame: pd.DataFrame, chosen: list[Selection], model: str) -> pd.DataFrame:
    rows = []
    by_key = {(s.dataset, s.param, s.mode): s for s in chosen if s.model == model}
    for (dataset, param, mode, value), g in frame[frame.model == model].groupby(
            ["dataset", "param", "mode", "value"], sort=True):
        s = by_key.get((dataset, param, mode))
        accs = [a for a in g.sort_values("seed").val_greedy_accuracy]
        done = [a for a in accs if not math.isnan(a)]
        stats = next((v for v in (s.values if s else []) if math.isclose(v["value"], value)), None)
        marks = []
        if s is not None and math.isclose(value, s.selected):
            marks.append("selected")
        elif s is not None and any(math.isclose(value, t) for t in s.tied):
            marks.append("within noise")
        if s is not None and s.reference is not None and math.isclose(value, s.reference):
            marks.append(f"{s.reference_source}'s")
        rows.append({"train set": dataset, "searched": PARAM_TITLES[param], "mode": mode,
                     "value": value_text(param, value),
                     "seeds (greedy validation %)": ", ".join(f"{100 * a:.1f}" for a in done) or "not yet run",
                     "mean ± se (%)": f"{100 * stats['mean']:.1f} ± {100 * stats['se']:.1f}" if stats else "-",
                     "note": ", ".join(marks)})
    for s in (c for c in chosen if c.model == model and c.dataset == COMBINED):   # the paper's one value per model
        for v in s.values:
            marks = (["selected"] if math.isclose(v["value"], s.selected) else ["within noise"]
                     if any(math.isclose(v["value"], x) for x in s.tied) else [])
            marks += [f"{s.reference_source}'s"] if s.reference is not None and math.isclose(v["value"], s.reference) \
                else []
            rows.append({"train set": COMBINED, "searched": PARAM_TITLES[s.param], "mode": s.mode,
                         "value": value_text(s.param, v["value"]), "seeds (greedy validation %)": "(train sets' means)",
                         "mean ± se (%)": f"{100 * v['mean']:.1f} ± {100 * v['se']:.1f}", "note": ", ".join(marks)})
    return pd.DataFrame(rows)


def _figure(frame: pd.DataFrame, chosen: list[Selection], model: str, path: Path, prov: Provenance) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    sub = frame[frame.model == model]
    params = [p for p in PARAM_TITLES if p in set(sub.param)]
    fig, axes = plt.subplots(1, len(params), figsize=(5.2 * len(params), 3.6), squeeze=False)
    lines = sorted({(d, m) for d, m in zip(sub.dataset, sub["mode"])})
    palette = dict(zip(lines, sns.color_palette("colorblind", len(lines))))
    for ax, param in zip(axes[0], params):
        part = sub[sub.param == param]
        for (dataset, mode), g in part.groupby(["dataset", "mode"], sort=True):
            color = palette[(dataset, mode)]
            done = g.dropna(subset=["val_greedy_accuracy"])
            ax.scatter(done.value, 100 * done.val_greedy_accuracy, color=color, alpha=0.45, s=14)
            mean = done.groupby("value").val_greedy_accuracy.mean()
            s = next((c for c in chosen if (c.model, c.dataset, c.param, c.mode) == (model, dataset, param, mode)),
                     None)
            se = [100 * next((v["se"] for v in (s.values if s else []) if math.isclose(v["value"], x)), 0.0)
                  for x in mean.index]
            ax.errorbar(mean.index, 100 * mean.values, yerr=se, color=color, marker="o", markersize=3, capsize=3,
                        label=f"{mode} on {dataset} (mean ± se)")
            if s is not None:
                ax.scatter([s.selected], [100 * mean.get(s.selected, math.nan)], marker="*", s=120, color=color,
                           edgecolor="black", zorder=5)
        refs = {c.reference for c in chosen if c.model == model and c.param == param and c.reference is not None}
        for ref in refs:
            source = next(c.reference_source for c in chosen if c.model == model and c.param == param)
            ax.axvline(ref, color="grey", linestyle="--", linewidth=1, label=f"{source}'s {value_text(param, ref)}")
        ax.set_xscale("log")
        ax.set_xlabel(PARAM_TITLES[param])
        ax.set_ylabel("greedy validation pass@1 (%)")
        lo, hi = ax.get_ylim()   # at least 5 points tall: a flat search looks flat, not like noise blown up
        if hi - lo < 5:
            mid = (lo + hi) / 2
            ax.set_ylim(max(mid - 2.5, 0), max(mid - 2.5, 0) + 5)
        ax.set_title(f"{model}: {PARAM_TITLES[param]} search\n(each run's selected checkpoint; ★ selected)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    _save_fig(fig, path, prov)
    plt.close(fig)


def write_sweeps(settings: dict, tables_dir: Path, figures_dir: Path, summary_path: Path) -> dict:
    """Per swept model its table and figure, and the summary (every selection, its statement, the modes'
    agreement) with its record embedded."""
    runs = settings["runs"]
    prov = Provenance("sweep_tables", settings, inputs={r["selected"]: r["selected"] for r in runs})
    frame = sweep_frame(runs)
    chosen = selections(frame, settings)
    tables_dir.mkdir(parents=True, exist_ok=True)
    figures_dir.mkdir(parents=True, exist_ok=True)
    for model in sorted(set(frame.model)):
        statements = [f"- {s.dataset}, {PARAM_TITLES[s.param]}, {s.mode}: {s.statement()} (differences "
                      f"{s.noise}; the winner's score optimistic by ~{100 * s.optimism:.1f} points were all values "
                      "equal)" for s in chosen if s.model == model]
        caption = (f"The hyperparameter search of {model} (the paper's Appendix D): each run's selected checkpoint's "
                   f"greedy validation pass@1 against the swept value; mean ± standard error over seeds (one seed: "
                   f"the validation set's binomial error, a lower bound). Values within noise of the selected one "
                   f"(|difference| <= z standard errors of the difference, paired on the validation questions, z "
                   f"family-wise over the values compared) are marked: where there are any, the selection is not a "
                   f"finding. `{COMBINED}`: the model's train sets combined, each weighted equally (the paper "
                   "reports one value per model).\n\n" + "\n".join(statements))
        write_table(sweep_table(frame, chosen, model), tables_dir, paths.sweep_name(model), caption, prov)
        _figure(frame, chosen, model, figures_dir / f"{paths.sweep_name(model)}.png", prov)
    summary = {"selections": [s.record() for s in chosen], "across_modes": across_modes(chosen),
               "z": "family-wise: search.selection.family_z (two-sided 5 % over each search's comparisons)",
               "statistic": "the greedy validation pass@1 of each run's selected checkpoint, mean over seeds; per "
                            f"model ({COMBINED}) the mean of its train sets' means",
               "paper": PAPER_SEARCH["where"], "runs": len(runs),
               "not_yet_run": int(frame.val_greedy_accuracy.isna().sum())}
    write_json(summary_path, prov.embedded(summary, summary_path))
    return summary


def sweep_blocks(summary: dict | None, toy: bool) -> list[tuple[str, object]]:
    """The reproduction report's section on the paper's hyperparameter search: each search's selection beside
    the paper's and whether it is a finding, or that the search has not been run (and how to run it)."""
    blocks: list[tuple[str, object]] = [("h2", "The hyperparameter search (Appendix D)")]
    if summary is None:
        blocks.append(("p", "Not yet run: the paper chose its learning rates (Llama 3B 6e-6, Llama 8B 3e-6, Qwen 3B "
                            "8e-6) and noise factor (0.33) by greedy validation over sweeps this grid takes as given. "
                            "`softtokens plan --grid sweeps` forecasts re-deriving them and a cheaper reading; "
                            "`snakemake --profile slurm --config grid=sweeps` runs it, and this section then shows "
                            "what each search selects beside the paper's (docs/protocol.md)."))
        return blocks
    rows = [{"model": s["model"], "train set": s["dataset"], "searched": PARAM_TITLES[s["param"]], "mode": s["mode"],
             "selection": s["statement"], "a finding": "yes" if s["finding"] else "no"}
            for s in summary["selections"]]
    blocks.append(("p", f"{summary['runs']} runs; each value's number is {summary['statistic']}; a value within z "
                        f"standard errors of the selected one (the difference paired on the same validation "
                        f"questions; z {summary['z']}) is within noise, and then the selection is not a finding. The "
                        f"winner of many values is optimistic: each selection says by how much were all values "
                        f"equal. The paper's choices: {summary['paper']}."
                        + (" The toy's values are compared with the grid's own (configured) choice." if toy else "")
                        + (f" {summary['not_yet_run']} runs not yet run." if summary.get("not_yet_run") else "")))
    blocks.append(("table", pd.DataFrame(rows)))
    for agreement in summary.get("across_modes", []):
        blocks.append(("p", f"{agreement['model']} on {agreement['dataset']}, {PARAM_TITLES[agreement['param']]}: "
                            f"{agreement['statement']} (the paper found the same rates for hard and fuzzy)."))
    return blocks
