"""tables, figures, ablations and report (the reproduction report) from result files; audit (the
provenance chain of a result file or a table cell)."""

from __future__ import annotations

from pathlib import Path

from softtokens.commands.common import grid_config, parse_settings


def cmd_tables(a) -> None:
    from softtokens.audit.inputs import refuse_bad_inputs
    from softtokens.report.tables import write_tables

    refuse_bad_inputs(a.inputs, "tables")
    write_tables([Path(p) for p in a.inputs], Path(a.out_dir), parse_settings(a.settings),
                 names=a.table or None)


def cmd_figures(a) -> None:
    from softtokens.audit.inputs import refuse_bad_inputs
    from softtokens.report.figures import write_figure, write_figures

    settings = parse_settings(a.settings)
    metrics, evals = [Path(p) for p in a.metrics], [Path(p) for p in a.evals]
    refuse_bad_inputs(metrics + evals, "figures")
    if settings.get("figure"):
        write_figure(settings["figure"], metrics, evals, Path(a.out_dir), settings)
    else:
        write_figures(metrics, evals, Path(a.out_dir), settings)


def cmd_ablations(a) -> None:
    from softtokens.audit.inputs import refuse_bad_inputs
    from softtokens.report.ablations import write_ablations

    refuse_bad_inputs([*a.evals, *a.metrics], "ablations")
    write_ablations([Path(p) for p in a.evals], [Path(p) for p in a.metrics], Path(a.tables_dir),
                    Path(a.figures_dir), parse_settings(a.settings))


def cmd_sweeps(a) -> None:
    from softtokens.audit.inputs import refuse_bad_inputs
    from softtokens.report.sweeps import write_sweeps

    refuse_bad_inputs([Path(p) for p in a.selected], "sweeps")
    summary = write_sweeps(parse_settings(a.settings), Path(a.tables_dir), Path(a.figures_dir), Path(a.summary))
    for s in summary["selections"]:
        print(f"{s['model']} {s['dataset']} {s['param']} {s['mode']}: {s['statement']}")


def cmd_report(a) -> None:
    from softtokens.audit.inputs import refuse_bad_inputs
    from softtokens.cells.paper import PaperResultsError
    from softtokens.report.page import write_report

    refuse_bad_inputs([*a.inputs, *([a.sweeps] if a.sweeps else [])], "report")
    try:
        data = write_report([Path(p) for p in a.inputs], Path(a.bench_dir), Path(a.out_dir),
                            parse_settings(a.settings), Path(a.sweeps) if a.sweeps else None)
    except PaperResultsError as err:
        raise SystemExit(f"report: refused the paper's numbers; no output was written:\n{err}") from None
    for c in data["claims_ours"]:
        print(f"{c.summary():<26} {c.statement}")


def cmd_status(a) -> None:
    from softtokens.audit.status import grid_status, status_text

    config, grid = grid_config(a)
    print(status_text(grid_status(config, grid)))


DEFAULT_CONFIG = "config.yaml"


def cmd_audit(a) -> int:
    from softtokens.audit import drift
    from softtokens.audit.chain import audit

    if (a.row is None) != (a.column is None):
        raise SystemExit("--row and --column go together (one table cell)")
    config = drift.load(a.config)
    if config is None and a.config != DEFAULT_CONFIG:
        raise SystemExit(f"--config {a.config}: no such file")
    if a.rerun or a.rerun_sample:
        from softtokens.audit.rerun import cmd_rerun

        return cmd_rerun(a)
    if a.row is not None:
        from softtokens.audit.cell import audit_cell

        try:
            lines, problems = audit_cell(a.path, a.row, a.column, config)
        except KeyError as e:
            raise SystemExit(e.args[0]) from None
        print("\n".join(lines))
        return 1 if problems else 0
    lines, problems = audit(a.path, config=config)
    print("\n".join(lines))
    print(f"\n{problems} problem(s)" if problems else "\nchain complete: every input present and unchanged")
    return 1 if problems else 0


def cmd_docs(a) -> int:
    from softtokens.report.doc_blocks import stale, write

    root = Path(a.root)
    if a.write:
        changed = write(root)
        print("rewrote " + ", ".join(changed) if changed else "every generated block is current")
        return 0
    problems = stale(root)
    print("\n".join(f"stale: {p}" for p in problems) if problems else "every generated block is current")
    return 1 if problems else 0


def cmd_quotes(a) -> int:
    from softtokens.verdict.quotes import EXCERPT, excerpt, paper_tex, write_excerpt

    tex = paper_tex(a.tex)
    out = Path(a.out or EXCERPT)
    if tex is None:
        raise SystemExit("no paper source: give --tex PATH (or set SOFTTOKENS_PAPER_TEX)")
    if a.write:
        print(f"rewrote {out} from {tex}" if write_excerpt(tex, out) else f"{out} is current with {tex}")
        return 0
    import json

    current = out.is_file() and json.loads(out.read_text()) == excerpt(tex)
    print(f"{out} is current with {tex}" if current else f"stale: {out} differs from {tex} (--write remakes it)")
    return 0 if current else 1


def register(sub) -> None:
    c = sub.add_parser("status", help="every run and evaluation of a grid: state, step, reward, ETA, GPU-hours "
                                      "(from the results directory only: works on a login node while Snakemake runs)")
    c.add_argument("--config", default="config.yaml")
    c.add_argument("--grid", default=None, help="default: the config's `grid`")
    c.set_defaults(func=cmd_status)

    c = sub.add_parser("tables", help="tables of mean ± std over seeds (md, tex, csv, html, cells.json)")
    c.add_argument("--settings", required=True)
    c.add_argument("--out-dir", required=True)
    c.add_argument("--table", action="append", help="only this table (main, ood, settings_<benchmark>); repeatable")
    c.add_argument("inputs", nargs="+")
    c.set_defaults(func=cmd_tables)

    c = sub.add_parser("figures", help="training curves, pass@k and entropy profiles (png, pdf)")
    c.add_argument("--settings", required=True, help="JSON; its `figure` (kind, model, dataset, benchmark) makes "
                                                     "that one figure, else every figure the files make")
    c.add_argument("--out-dir", required=True)
    c.add_argument("--metrics", nargs="*", default=[])
    c.add_argument("--evals", nargs="*", default=[])
    c.set_defaults(func=cmd_figures)

    c = sub.add_parser("ablations", help="the appendix ablation tables and greedy-validation figures")
    c.add_argument("--settings", required=True)
    c.add_argument("--tables-dir", required=True)
    c.add_argument("--figures-dir", required=True)
    c.add_argument("--metrics", nargs="*", default=[])
    c.add_argument("--evals", nargs="*", default=[])
    c.set_defaults(func=cmd_ablations)

    c = sub.add_parser("sweeps", help="the hyperparameter search's table and figure per model, and its summary")
    c.add_argument("--settings", required=True, help="JSON: the sweep's runs and their selections (run.jobs)")
    c.add_argument("--tables-dir", required=True)
    c.add_argument("--figures-dir", required=True)
    c.add_argument("--summary", required=True, help="the summary JSON the reproduction report reads")
    c.add_argument("selected", nargs="*", help="the runs' selected.json (checked before they are read)")
    c.set_defaults(func=cmd_sweeps)

    c = sub.add_parser("report", help="reproduction report: ours beside the paper, claims, cost ledger")
    c.add_argument("--settings", required=True, help="JSON: grid, gpus per rule, optional paper_results")
    c.add_argument("--bench-dir", required=True, help="the grid's Snakemake benchmark files")
    c.add_argument("--out-dir", required=True)
    c.add_argument("--sweeps", default=None, help="the hyperparameter search's summary (report.sweeps), if any")
    c.add_argument("inputs", nargs="+", help="evaluation files (math settings and loglik.json)")
    c.set_defaults(func=cmd_report)

    c = sub.add_parser("docs", help="check (or --write) the numbers the docs quote from the code: verdicts on the "
                                    "paper's numbers, job counts (report.doc_blocks)")
    c.add_argument("--root", default=".", help="the repository root")
    c.add_argument("--write", action="store_true", help="rewrite every generated block in place")
    c.set_defaults(func=cmd_docs)

    c = sub.add_parser("quotes", help="check (or --write) the shipped excerpt of the paper's quoted lines against "
                                      "its LaTeX source (verdict.quotes)")
    c.add_argument("--tex", help="the paper's .tex (default: $SOFTTOKENS_PAPER_TEX, else ../shared/paper)")
    c.add_argument("--out", help="the excerpt (default: tests/fixtures/paper_quotes.json)")
    c.add_argument("--write", action="store_true", help="rewrite the excerpt from the source")
    c.set_defaults(func=cmd_quotes)

    c = sub.add_parser("audit", help="print the provenance chain of a result file, or of one table cell")
    c.add_argument("path", help="a result file, or a table (results/<grid>/tables/main.md) with --row/--column")
    c.add_argument("--row", help='table row: model and training as printed, e.g. "toy toyarith hard", "toy no finetune"')
    c.add_argument("--column", help='table column as printed, e.g. "toyarith Greedy pass@1"')
    c.add_argument("--config", default=DEFAULT_CONFIG,
                   help="the config each result is held to (a result made under other settings is named); default "
                        "config.yaml where there is one")
    c.add_argument("--rerun", action="store_true",
                   help="re-evaluate the cell's (or the file's) evaluation files from their checkpoints and data in a "
                        "scratch directory and compare the results with the files (audit.rerun)")
    c.add_argument("--rerun-sample", type=int, default=0, metavar="N",
                   help="re-evaluate N of the table's evaluation files, chosen at random (seeded: --seed)")
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(func=cmd_audit)
