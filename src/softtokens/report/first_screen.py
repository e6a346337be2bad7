"""The report's first screen: the three questions a reader opens it with, answered before any scrolling (1400 x 900):
did the paper reproduce (each claim in words, our verdict beside the paper's), what did it cost (the wall time waited,
job-hours and GPU-hours, beside the forecast), and where did each number come from (the commit and whether the tree
was clean, the config, every table's audit with a link to it, the re-runs, the crate).

Why a module of its own: the page below it is the detail (every specification, every cell, every job); this is what
a reader decides from, and it is checked in a browser (benchmarks/report_screen.py)."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import pandas as pd

from softtokens.report.claim_rows import could_be_otherwise
from softtokens.verdict import judging
from softtokens.verdict.choices import PAPER_READING_NAME, PAPER_READING_WHY

SATURATED = "no information"


def saturated(c) -> bool:
    """Every comparison of the claim is between identical cells (a benchmark at ceiling): measured, and silent."""
    parts = c.parts or []
    return bool(parts) and all(not p["k"] and p["not_informative"] for p in parts)


def verdict_words(c) -> str:
    """A claim's verdict in words that tell apart what differs: not measured (no cell), no information (measured at
    ceiling), undecided (and whether these numbers could decide it), supported or contradicted (and whether every
    specification agrees: "robust" only for a decided verdict)."""
    if c.verdict == judging.NOT_MEASURED:
        return "not measured (no cell of this grid)"
    if c.verdict == judging.NOT_JUDGED:
        return "not judged"
    if saturated(c):
        return f"{SATURATED} (every comparison between identical cells: saturated)"
    if c.verdict == judging.UNDECIDED:
        could = "these numbers could decide it" if could_be_otherwise(c) else "cannot be supported on these numbers"
        return f"undecided ({could})"
    held, tried = c.support()
    robust = (f"robust: all {tried:,} distinct specifications agree" if c.robust
              else f"{held:,} of {tried:,} distinct specifications support it")
    return f"**{c.verdict}** ({robust})"


def paper_reading_words(c) -> str:
    """The paper's own reading (its ± over seeds alone, a normal reference: verdict.choices.PAPER_READING), said
    beside ours where it differs."""
    m = c.multiverse
    if not m or m["paper_reading"] == c.verdict:
        return ""
    return f"; {PAPER_READING_NAME}: **{m['paper_reading']}**"


def verdicts_frame(theirs: list, ours: list, metric: str | None) -> pd.DataFrame:
    """One row per claim, in words: the paper's verdict on its own numbers (and under its own reading, where that
    differs) and ours."""
    column = "on this grid's numbers" + (f" (pass@k read at {metric})" if metric else "")
    return pd.DataFrame([{"the paper's claim": p.statement,
                          "on the paper's numbers": verdict_words(p) + paper_reading_words(p),
                          column: verdict_words(o)} for p, o in zip(theirs, ours)])


def reading_note(theirs: list) -> str | None:
    """Why the paper's own reading and ours differ, where they do on any claim."""
    differ = [c.key for c in theirs if c.multiverse and c.multiverse["paper_reading"] != c.verdict]
    if not differ:
        return None
    return (f"*{PAPER_READING_NAME}* ({len(differ)} claim(s) differ: {', '.join(f'`{k}`' for k in differ)}) takes "
            f"its ± over seeds alone with a normal reference; {PAPER_READING_WHY}. Every combination of these "
            "choices is judged below (the specification curves).")


SCOPES = {
    "toy": ("a {params}-parameter Llama trained on synthetic arithmetic, on CPUs. What it can show: every stage of the "
            "paper's path runs, is judged by the paper's rules and is audited. What it cannot: the paper's numbers "
            "(no cell of it is a cell of the paper)."),
    "real": ("SmolLM2-135M-Instruct on a few real GSM8K questions, on CPUs, a few RLOO steps. What it can show: the "
             "paper's path on a real pretrained model, offline. What it cannot: the paper's numbers."),
    "paper": ("the paper's models, data and budgets. What it can show: whether the paper's numbers and claims "
              "reproduce, cell by cell."),
}


def scope_text(grid: str, toy: bool, params: str) -> str:
    kind = "toy" if toy else grid if grid in SCOPES else "paper"
    return f"**Grid `{grid}`**: " + SCOPES[kind].format(params=params)


def _minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def wall_span(bench_dir: Path) -> tuple[float, str, str] | None:
    """(seconds, first start, last end) of the jobs whose benchmark files are in ``bench_dir``: each file is written
    as its job ends (its mtime) and holds the job's wall seconds; the span is what a user waited for them."""
    spans = []
    for tsv in Path(bench_dir).rglob("*.tsv"):
        try:
            wall = float(pd.read_csv(tsv, sep="\t").iloc[-1]["s"])
        except (ValueError, KeyError, IndexError, pd.errors.EmptyDataError, pd.errors.ParserError):
            continue
        end = tsv.stat().st_mtime
        spans.append((end - wall, end))
    if not spans:
        return None
    start, end = min(s for s, _ in spans), max(e for _, e in spans)
    fmt = "%Y-%m-%d %H:%M:%S"
    return (end - start, _dt.datetime.fromtimestamp(start).strftime(fmt),
            _dt.datetime.fromtimestamp(end).strftime(fmt))


def cost_lines(jobs: pd.DataFrame, forecast: pd.DataFrame, bench_dir: Path) -> list[str]:
    """What the grid cost: the wall time the user waited, the job time, GPU-hours beside the forecast's."""
    if jobs.empty:
        return ["no job has finished yet"]
    span = wall_span(bench_dir)
    lines = []
    if span:
        lines.append(f"**Wall time waited: {_minutes(span[0])}** (the first job started {span[1]}, the last ended "
                     f"{span[2]})")
    lines.append(f"**Job time: {jobs.wall_s.sum() / 3600:.2f} job-hours** over {len(jobs)} jobs (CPU "
                 f"{jobs.cpu_s.sum() / 3600:.2f} h); the largest: " + ", ".join(
                     f"{rule} {_minutes(s)}" for rule, s in jobs.groupby("rule").wall_s.sum().nlargest(3).items()))
    gpu = float(jobs.gpu_hours.sum())
    if gpu == 0:
        lines.append("**GPU-hours: 0** (no job held a GPU; the forecast prices GPU jobs only)")
    else:
        predicted = float(forecast.gpu_h_forecast.sum()) if not forecast.empty else None
        lines.append(f"**GPU-hours: {gpu:.2f}**" + (f", forecast {predicted:.2f} for the same jobs "
                                                     f"(`softtokens plan`)" if predicted else ""))
    return lines


def provenance_lines(code: dict, made: list[dict], config_hash: str, audits: list[tuple[str, str, int]],
                     reruns: str | None, crate: str | None) -> list[str]:
    """Where the numbers came from: the code now and the code the results were made with (commit, dirty), the
    config, each table's audit (with a link), the re-runs and the crate."""
    commits = sorted({(r.get("git_commit") or "unknown", bool(r.get("git_dirty"))) for r in made})
    said = "; ".join(f"`{c[:10]}`" + (" (dirty: uncommitted changes)" if d else " (clean)") for c, d in commits)
    lines = [f"**Made by code** {said or 'unknown'} ({len(made)} evaluation files); this page by `"
             f"{(code.get('git_commit') or 'unknown')[:10]}`" + (" (dirty)" if code.get("git_dirty") else " (clean)"),
             f"**Config** `{config_hash}`"]
    for name, link, problems in audits:
        lines.append(f"**Audit** [{name}]({link}): " + ("intact: every link present and unchanged" if not problems
                                                          else f"{problems} problem(s): `softtokens audit {link}`"))
    lines.append(f"**Re-execution**: {reruns}" if reruns else
                 "**Re-execution**: none yet (the hashes show that nothing changed, not who wrote it): "
                 "`softtokens audit --rerun-sample 3 TABLE` makes files again and compares them")
    if crate:
        lines.append(f"**Crate**: [{crate}]({crate}) (a Provenance Run RO-Crate: `softtokens audit CRATE` checks it "
                     "anywhere)")
    return lines


def table_audits(tables: list[Path], out_dir: Path) -> list[tuple[str, str, int]]:
    """(table, its link from the report, the audit's problems) of every table, each walked to its data (audit.chain;
    a checkpoint by its manifest and record, its bytes not read again here: `softtokens audit TABLE` reads them)."""
    import os

    from softtokens.audit.chain import audit

    out = []
    for t in map(Path, tables):
        _, problems = audit(t, deep=False)
        out.append((t.stem, Path(os.path.relpath(t, out_dir)).as_posix(), problems))
    return out


def crate_link(out_dir: Path) -> str | None:
    """The grid's Provenance Run Crate beside the report, where one was written (`softtokens crate`)."""
    crate = out_dir.parent / "crate" / "ro-crate-metadata.json"
    return "../crate/ro-crate-metadata.json" if crate.is_file() else None


def first_screen(data: dict, scope: str, metric: str | None, cost: list[str], provenance: list[str]) -> list[tuple]:
    """The blocks of the first screen (report.render draws them)."""
    note = reading_note(data["claims_paper"])
    return [("p", scope),
            ("h2", "Did it reproduce?"),
            ("table", verdicts_frame(data["claims_paper"], data["claims_ours"], metric)),
            *([("p", note)] if note else []),
            ("columns", [("What it cost", cost), ("Where the numbers came from", provenance)])]
