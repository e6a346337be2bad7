"""The reproduction report: one page (Markdown and HTML) with the paper's claims judged on our
numbers and on the paper's, every paper cell beside ours, and what each table cost.

Why one page: it is what a reader opens first, and what ``snakemake --report`` embeds. The CSVs
beside it (``cells.csv``, ``ledger.csv``, ``ledger_cells.csv``, ``ledger_tables.csv``) hold
the same numbers unrounded for a script.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from softtokens.cells import ours as our_cells
from softtokens.cells.paper import (
    CELL_KEYS,
    PAPER_RESULTS,
    SOURCE,
    TABLES,
    load_paper_results,
    paper_seeds,
)
from softtokens.cost import forecast, ledger
from softtokens.report.claim_rows import (
    answer,
    choices_frame,
    claims_frame,
    glance_frame,
    method,
    multiverse_rows,
    one_at_a_time_rows,
    readings_frame,
    robustness,
    words,
)
from softtokens.report.first_screen import (
    cost_lines,
    crate_link,
    first_screen,
    provenance_lines,
    scope_text,
    table_audits,
)
from softtokens.report.render import MISSING, to_html, to_markdown
from softtokens.report.spec_curve import curve_blocks
from softtokens.report.sweeps import sweep_blocks
from softtokens.report.tables import main_settings, table_html
from softtokens.store import paths
from softtokens.store.files import read_json, write_text
from softtokens.store.provenance import Provenance, config_hash, git_state, read_record
from softtokens.verdict import claims, judging, reproduction
from softtokens.robustness.multiverse import our_claims
from softtokens.verdict.choices import MARGINS, Spec
from softtokens.verdict.judging import passk_metric

MARGINS_TEXT = ", ".join(f"{m.value:g} {m.unit}" for m in MARGINS.values())


def _pm(mean, std, n=None, digits=1, show_n: bool = True) -> str:
    """mean ± std (n=k); a single seed or evaluation has no spread to print (n=1, no ±)."""
    if pd.isna(mean):
        return MISSING
    single = n is not None and not pd.isna(n) and int(n) < 2
    sd = "" if pd.isna(std) or single else f" ± {std:.{digits}f}"
    return f"{mean:.{digits}f}{sd}" + (f" (n={int(n)})" if show_n and n is not None and not pd.isna(n) else "")



def _training(r) -> str:
    return "base" if r["train_mode"] == "none" else f"{r['train_dataset']} {r['train_mode']}"


def cell_table(comparison: pd.DataFrame) -> pd.DataFrame:
    """The printable cell-by-cell table (missing cells say so; never 0)."""
    digits = comparison.metric.map(lambda m: 2 if m in ("nll_correct", "accuracy") else 1)
    return pd.DataFrame({
        "model": comparison.model, "training": comparison.apply(_training, axis=1),
        "variant": comparison.paper_variant.replace("", "-"), "benchmark": comparison.benchmark,
        "setting": comparison.setting, "metric": comparison.metric,
        # each ± labelled as what it is: the paper's as printed (read as a population std: verdict.choices),
        # ours the sample std over seeds
        "paper (± as printed: population std)": [
            _pm(m, s, paper_seeds(t, v), d, show_n=False) for m, s, t, v, d in
            zip(comparison.paper_mean, comparison.paper_std, comparison.train_mode, comparison.variant, digits)],
        "ours (± sample std)": [_pm(m, s, n, d) for m, s, n, d in
                                zip(comparison.ours_mean, comparison.ours_std, comparison.ours_n, digits)],
        "diff": ["" if pd.isna(x) else f"{x:+.{d}f}" for x, d in zip(comparison["diff"], digits)],
        "interval": ["" if pd.isna(lo) else f"[{lo:+.{d}f}, {hi:+.{d}f}]"
                     for lo, hi, d in zip(comparison.ci_low, comparison.ci_high, digits)],
        "agreement (± margin)": ["—" if a is None else f"{a} (±{m:g})" for a, m in
                                 zip(comparison.agreement, comparison.margin)],
        "note": comparison.get("note", pd.Series([""] * len(comparison))).fillna(""),
    })


def conflict_frame(conflicts: pd.DataFrame) -> pd.DataFrame:
    """One row per disagreeing cell: each table's number, the one the claims use first."""
    rows = []
    for key, sub in conflicts.groupby(CELL_KEYS, sort=False):
        rec = dict(zip(CELL_KEYS, key))
        rows.append({"model": rec["model"], "training": _training(rec), "benchmark": rec["benchmark"],
                     "setting": rec["setting"], "metric": rec["metric"],
                     "numbers": "; ".join(f"{t}: {_pm(m, s_, paper_seeds(rec['train_mode'], v), show_n=False)}"
                                          + (" (used)" if u else "")
                                          for t, m, s_, v, u in zip(sub.table, sub["mean"], sub["std"], sub.variant,
                                                                    sub.used))})
    return pd.DataFrame(rows)


def our_tables(benchmarks: list[str]) -> dict:
    """Our tables (and the paper table each reproduces) -> which cells they hold."""
    main = set(main_settings())
    out = {"main (tab:main)": lambda r: r["setting"] in main and r["metric"].startswith("pass@")}
    paper_label = {"gsm8k": "tab:gsm8k", "math500": "tab:math500", "olympiadbench": "tab:olympiad"}
    for b in benchmarks:
        label = paths.settings_table(b) + (f" ({paper_label[b]})" if b in paper_label else "")
        out[label] = lambda r, b=b: r["benchmark"] == b and r["metric"].startswith("pass@")
    out["ood (table:stdbenchmarks)"] = lambda r: r["metric"] in ("accuracy", "nll_correct")
    return out


def judging_spec(settings: dict) -> Spec:
    """The default specification with the config's `judging` block applied (margins per claim)."""
    try:
        return claims.judging_spec(settings.get("config"))
    except claims.MarginError as err:
        raise SystemExit(f"config.yaml {err}") from None


def build(eval_paths: list[Path], bench_dir: Path, settings: dict, judged_paper: dict | None = None) -> dict:
    """Everything the page shows, as frames and claims; ``judged_paper``: the paper's claims as the paper_claims job
    judged them (robustness.paper_verdicts), judged here where not given."""
    spec = judging_spec(settings)
    paper = load_paper_results(settings.get("paper_results") or PAPER_RESULTS)
    seeds = our_cells.seed_rows(eval_paths)
    ours = our_cells.aggregate(seeds)
    comparison = reproduction.compare(paper, ours, spec)
    jobs = ledger.read_jobs(bench_dir, settings.get("gpus", {}))
    cells = ledger.cell_costs(seeds, jobs, CELL_KEYS) if not seeds.empty else pd.DataFrame()
    math_benchmarks = sorted({b for b, m in zip(seeds.benchmark, seeds.metric) if m.startswith("pass@")})
    tables = ledger.table_costs(cells, jobs, our_tables(math_benchmarks))
    vs_forecast = pd.DataFrame()
    # like with like: the forecast's rates are a GPU's, so only jobs that held GPUs are held against it
    if settings.get("config") and not jobs.empty and jobs.gpus.sum() > 0:
        predicted = forecast.forecast_jobs(settings["config"], settings["grid"])
        vs_forecast = forecast.vs_actual(predicted, jobs[jobs.gpus > 0])
    from softtokens.robustness.paper_verdicts import claims_from, paper_verdicts

    judged_paper = judged_paper or paper_verdicts(paper, spec)   # every specification, each verdict's odds
    return {"forecast": vs_forecast, "paper": paper, "seeds": seeds, "ours": ours, "comparison": comparison,
            "claims_ours": our_claims(ours, judging.entropy_rows(eval_paths), spec),
            "claims_paper": claims_from(judged_paper), "spec": spec,
            "conflicts": reproduction.paper_conflicts(paper),
            "precedence_sensitivity": [tuple(t) for t in judged_paper["precedence_sensitivity"]],
            "jobs": jobs, "cell_costs": cells, "table_costs": tables, "bench_dir": bench_dir}


# ---------------------------------------------------------------- rendering
def _cost_frame(tables: pd.DataFrame, gpu: bool) -> pd.DataFrame:
    out = tables[["table", "cells", "jobs"]].copy()
    out["wall (h)"] = (tables.wall_s / 3600).round(3)
    out["CPU (h)" if gpu else "CPU (s)"] = (tables.cpu_hours.round(3) if gpu else tables.cpu_s.round(1))
    if gpu:
        out["GPU-hours"] = tables.gpu_hours.round(2)
    else:
        out["wall (s)"] = tables.wall_s.round(1)
        out = out.drop(columns=["wall (h)"])
    return out


def _rule_costs(jobs: pd.DataFrame) -> pd.DataFrame:
    if jobs.empty:
        return pd.DataFrame(columns=["rule", "jobs", "wall (s)", "CPU (s)", "GPU-hours"])
    g = jobs.groupby("rule").agg(jobs=("job", "count"), wall=("wall_s", "sum"), cpu=("cpu_s", "sum"),
                                 gpu=("gpu_hours", "sum")).reset_index()
    return g.rename(columns={"wall": "wall (s)", "cpu": "CPU (s)", "gpu": "GPU-hours"}).round(2)


def toy_parameters(settings: dict) -> str:
    """The toy base's size in words (sizing.plan reads it off the grid's toy_base settings)."""
    config, grid = settings.get("config"), settings.get("grid")
    try:
        from softtokens.sizing.plan import toy_architecture

        n = toy_architecture(config["grids"][grid]["toy_base"]).parameters
    except (KeyError, TypeError):
        return "tiny"
    return f"{n / 1e6:.2g}M"


def sections(data: dict, settings: dict) -> list[tuple[str, object]]:
    """(heading or paragraph kind, content) blocks shared by the Markdown and HTML renderings."""
    grid = settings.get("grid", "?")
    comparison, ours = data["comparison"], data["ours"]
    measured = comparison.ours_mean.notna()
    toy = settings.get("toy", grid == "toy")
    gpu = bool(data["jobs"].gpus.sum()) if not data["jobs"].empty else False
    compared = [a for a in comparison.agreement if a is not None]
    n_files = len(data["seeds"].path.unique()) if not data["seeds"].empty else 0
    blocks: list[tuple[str, object]] = [("h1", f"Reproduction report: grid `{grid}`")]
    blocks += first_screen(data, scope_text(grid, toy, toy_parameters(settings)), passk_metric(data["ours"]),
                           cost_lines(data["jobs"], data["forecast"], data["bench_dir"]), data.get("provenance") or [])
    blocks.append(("h2", "The answer, in detail"))
    blocks.append(("p", answer(data)))
    blocks.append(("table", glance_frame(data["claims_paper"], data["claims_ours"], passk_metric(data["ours"]))))
    if toy:
        blocks.append(("p", f"This is the toy grid: a {toy_parameters(settings)}-parameter Llama trained on synthetic arithmetic on a CPU. "
                            "None of its cells is a cell of the paper (the models, data and budgets differ), so the "
                            "cell-by-cell comparison below is empty by construction. The claims are judged on the "
                            "toy's own numbers with the paper's rules: they say whether the toy shows the paper's "
                            "effects, not whether the paper's numbers reproduce. The toy's k is its n samples."))
    blocks.append(("h2", "The paper's claims"))
    blocks.append(("p", "Each claim's verdict under every specification, and how likely a reproduction of the paper's "
                        "grid is to reach the same one (shown only where the verdict could have gone another way: an "
                        "undecided verdict of a claim its numbers cannot support is the design's, not a finding)."))
    blocks.append(("table", claims_frame(data["claims_paper"], data["claims_ours"])))
    blocks.append(("p", method(data["spec"])))
    for c in data["claims_paper"]:
        if c.verdict == judging.NOT_JUDGED:
            continue
        rows = [f"the paper's words: {words(c)}", f"rule: {c.rule}",
                f"verdict at the default specification: {c.summary()}"]
        if c.decide:
            rows.append(f"what would decide it: {c.decide}")
        rows += multiverse_rows(c) + one_at_a_time_rows(c)
        blocks.append(("details", (f"The paper's numbers: `{c.key}` — {c.verdict} ({robustness(c)})",
                                   rows + c.evidence)))
        blocks += curve_blocks(c, "the paper's numbers")
    for c in data["claims_ours"]:
        rows = [f"rule: {c.rule}", f"verdict: {c.summary()}"] + ([f"what would decide it: {c.decide}"] if c.decide else [])
        rows += multiverse_rows(c) + one_at_a_time_rows(c)
        blocks.append(("details", (f"Ours: `{c.key}` — {c.verdict} ({robustness(c)})", rows + c.evidence)))
        blocks += curve_blocks(c, "this grid's numbers")
    blocks.append(("h3", "Every choice a verdict depends on"))
    blocks.append(("table", choices_frame()))
    if data.get("reruns"):
        blocks.append(("p", data["reruns"]))
    blocks.append(("h3", "Readings of the protocol the paper does not state"))
    blocks.append(("table", readings_frame(settings.get("config"), grid)))
    blocks.append(("p", f"Paper numbers: {SOURCE}. Ours: {n_files} evaluation files, {len(ours)} cells, mean ± "
                        f"sample std over seeds (n = seeds; one seed or a base model's one evaluation has no spread, "
                        f"so no ±). {int(measured.sum())} of {len(comparison)} paper cells have a counterpart here, "
                        f"{len(compared)} of them comparable. Ours beside the paper's is unpaired (the paper publishes "
                        f"means only) and read as sameness: they *agree* when the difference's interval lies inside "
                        f"the margin (±{MARGINS_TEXT}), *differ* when outside, otherwise undecided."))
    conflicts = data.get("conflicts")
    if conflicts is not None and not conflicts.empty:
        blocks.append(("h3", "Where the paper's tables disagree"))
        used = conflicts[conflicts.used]
        changed = data.get("precedence_sensitivity") or []
        blocks.append(("p", f"{len(used)} cells are printed with different numbers in two of the paper's tables "
                            f"(Table 1 against the appendix's six-setting tables, or those against the placement "
                            f"ablation). The claims read each from the first table in the order "
                            f"{', '.join(reproduction.TABLE_PRECEDENCE)}; the cell-by-cell comparison below compares "
                            f"ours with every table's number. "
                            + ("Read from the appendix tables first instead, no claim's verdict changes." if not changed
                               else "Read from the appendix tables first instead, these verdicts change: "
                               + "; ".join(f"`{k}` {a} → {b}" for k, a, b in changed) + ".")))
        blocks.append(("table", conflict_frame(conflicts)))
    blocks.append(("h2", "Cell by cell"))
    for table, label in TABLES.items():
        sub = comparison[comparison.table == table]
        n_meas = int(sub.ours_mean.notna().sum())
        if n_meas == 0:
            blocks.append(("p", f"**{table}** ({label}): 0 of {len(sub)} cells measured in this grid (all missing)."))
            continue
        verdicts = [a for a in sub.agreement if a is not None]
        blocks.append(("h3", f"{table}: {label}"))
        counts = ", ".join(f"{sum(a == v for a in verdicts)} {v}" for v in
                           (reproduction.AGREES, reproduction.UNDECIDED, reproduction.DIFFERS))
        blocks.append(("p", f"{n_meas} of {len(sub)} cells measured; of {len(verdicts)} comparable: {counts} "
                            f"(unpaired: ours against the paper's means)."))
        blocks.append(("table", cell_table(sub)))
    blocks += sweep_blocks(data.get("sweeps"), toy)
    blocks.append(("h2", "Cost ledger"))
    blocks.append(("p", "From each job's Snakemake benchmark file: wall time, CPU time (the job's measured CPU "
                        "seconds) and GPU-hours (wall × GPUs held). A table's total counts each job once (a training "
                        "run feeds many cells); per-cell and per-job numbers are in ledger_cells.csv and ledger.csv."
                        + (" The toy grid runs on CPUs only: costs are CPU seconds." if not gpu else "")))
    blocks.append(("table", _cost_frame(data["table_costs"], gpu)))
    blocks.append(("h3", "Per rule"))
    blocks.append(("p", "CPU seconds are Snakemake's samples of each job's processes: a job shorter than its first sample "
                        "(about a second: a selection, a small table) shows 0."))
    blocks.append(("table", _rule_costs(data["jobs"])))
    blocks.append(("h3", "Forecast beside actual, per job kind"))
    if data["forecast"].empty:
        blocks.append(("p", "Left out: " + ("this grid's jobs held no GPU, and the forecast's rates are a GPU's (gpu-check "
                                            "on an H100), so a ratio of the two would measure the machines, not the "
                                            "forecast." if not gpu else "no job of the forecast has finished yet.")))
    else:
        blocks.append(("p", f"The forecast `softtokens plan` printed before the run (throughput: "
                            f"{forecast.DEFAULT.source}, scaled by parameters), beside what the jobs that held GPUs "
                            f"took: the ratio is actual over forecast wall time (1 = the forecast held; 2 = the jobs took "
                            f"twice as long; none where the forecast is zero)."))
        blocks.append(("table", forecast_frame(data["forecast"])))
    return blocks


def duration(seconds: float) -> str:
    """A wall time in the unit that shows it: never 0.0 h for a job of seconds."""
    if pd.isna(seconds):
        return ""
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def forecast_frame(vs: pd.DataFrame) -> pd.DataFrame:
    """cost.forecast.vs_actual for reading: durations in their units, the ratio as a number of times."""
    return pd.DataFrame({"kind": vs.kind, "jobs": vs.jobs, "forecast (wall)": (vs.wall_h_forecast * 3600).map(duration),
                         "actual (wall)": (vs.wall_h_actual * 3600).map(duration),
                         "GPU-hours forecast": vs.gpu_h_forecast.map(lambda x: f"{x:.3g}"),
                         "GPU-hours actual": vs.gpu_h_actual.map(lambda x: f"{x:.3g}"),
                         "actual / forecast": [("—" if not f or pd.isna(x) else f"{x:,.2f}x" if x < 100 else f"{x:,.0f}x")
                                               for x, f in zip(vs["actual/forecast"], vs.wall_h_forecast)]})


LEDGER_CAPTIONS = {
    "jobs": "Cost ledger, one row per job: wall and CPU seconds and peak memory (Snakemake's benchmark file), "
            "the GPUs it held and GPU-hours = wall hours x GPUs.",
    "tables": "Cost of each table: the jobs upstream of its cells, each counted once.",
}


def rerun_text(log: Path | None) -> str | None:
    """What `softtokens audit --rerun` found when it made this grid's evaluation files again: the last outcome of
    each file that still holds (its line's hash, and the file unchanged since: audit.rerun.holding_outcomes), and
    what was set aside; None where nothing was re-run."""
    from softtokens.audit.rerun import holding_outcomes

    if log is None or not Path(log).is_file():
        return None
    last, set_aside = holding_outcomes(Path(log))
    differ = [f for f, o in last.items() if not o["equal"]]
    said = (f"Re-execution (`softtokens audit --rerun`, its log {Path(log).name} recorded by its sha256 in this "
            f"report's record): {len(last)} evaluation file(s) as they are now made again from their checkpoints and "
            f"test sets, " + ("all equal to the files, bit for bit." if last and not differ else
                              "none that still holds." if not last else
                              f"{len(differ)} differ: {', '.join(differ[:5])}."))
    return said + "".join(f" {s_}." for s_ in set_aside)


def write_report(eval_paths: list[Path], bench_dir: Path, out_dir: Path, settings: dict,
                 sweeps: Path | None = None, reruns: Path | None = None, paper_claims: Path | None = None,
                 tables: list[Path] | None = None) -> dict:
    """reproduction.{md,html}, cells.csv and the ledger CSVs, each with a provenance sidecar; with ``sweeps``
    (report.sweeps' summary) the hyperparameter search's section shows its selections; with ``reruns`` (the log of
    `softtokens audit --rerun`, a leaf by its hash) what re-execution found; with ``paper_claims`` the paper's claims
    as the paper_claims job judged them (robustness.paper_verdicts)."""
    data = build(eval_paths, bench_dir, settings, read_json(paper_claims) if paper_claims is not None else None)
    data["sweeps"] = read_json(sweeps) if sweeps is not None else None
    data["reruns"] = rerun_text(reruns)
    data["provenance"] = provenance_lines(git_state(), [read_record(p) or {} for p in eval_paths],
                                          config_hash(settings.get("config")), table_audits(tables or [], out_dir),
                                          data["reruns"], crate_link(out_dir))
    blocks = sections(data, settings)
    paper = settings.get("paper_results")   # a CSV of the user's is a leaf; the shipped one is versioned with the code
    prov = Provenance("report", settings, inputs={**{p.as_posix(): p for p in eval_paths},
                                                   **({} if paper else {"paper_results": PAPER_RESULTS}),
                                                   **({"sweeps": sweeps} if sweeps is not None else {}),
                                                   **({"paper_claims": paper_claims} if paper_claims else {})})
    if paper:
        prov.add_local_leaf("paper_results", paper)
    if reruns is not None:
        prov.add_local_leaf("reruns", reruns)
    outputs = {
        "reproduction.md": to_markdown(blocks),
        "reproduction.html": to_html(blocks, f"softtokens reproduction report ({settings.get('grid')})"),
        "cells.csv": data["comparison"].to_csv(index=False),
        "ledger.csv": data["jobs"].to_csv(index=False),
        "ledger_cells.csv": (data["cell_costs"].assign(job_ids=lambda d: d.job_ids.map(" ".join))
                             if not data["cell_costs"].empty else data["cell_costs"]).to_csv(index=False),
        "ledger_tables.csv": data["table_costs"].to_csv(index=False),
        "ledger.html": table_html(data["jobs"], LEDGER_CAPTIONS["jobs"]),
        "ledger_tables.html": table_html(data["table_costs"], LEDGER_CAPTIONS["tables"]),
        "claims.json": json.dumps({side: [c.record() for c in data[f"claims_{side}"]] for side in ("ours", "paper")},
                                  indent=1) + "\n",
    }
    if set(outputs) != set(paths.REPORT_FILES):
        raise AssertionError(f"the report writes {sorted(outputs)}, the layout names {sorted(paths.REPORT_FILES)}")
    for name, text in outputs.items():
        write_text(out_dir / name, text)
        prov.write_sidecar(out_dir / name, outputs=[out_dir / n for n in outputs])
    return data
