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

    refuse_bad_inputs([*a.inputs, *([a.sweeps] if a.sweeps else []), *([a.paper_claims] if a.paper_claims else [])],
                      "report")
    try:
        data = write_report([Path(p) for p in a.inputs], Path(a.bench_dir), Path(a.out_dir),
                            parse_settings(a.settings), Path(a.sweeps) if a.sweeps else None,
                            Path(a.reruns) if a.reruns else None, Path(a.paper_claims) if a.paper_claims else None,
                            [Path(t) for t in a.tables])
    except PaperResultsError as err:
        raise SystemExit(f"report: refused the paper's numbers; no output was written:\n{err}") from None
    for c in data["claims_ours"]:
        print(f"{c.summary():<26} {c.statement}")


def cmd_judge_paper(a) -> None:
    """The paper's claims judged on its own numbers (robustness.paper_verdicts): a job of its own, beside the grid's."""
    from softtokens.cells.paper import PAPER_RESULTS, PaperResultsError, load_paper_results
    from softtokens.store.files import write_json
    from softtokens.store.provenance import Provenance
    from softtokens.verdict.claims import MarginError, judging_spec
    from softtokens.robustness.paper_verdicts import paper_verdicts

    settings = parse_settings(a.settings)
    source = settings.get("paper_results")
    try:
        spec = judging_spec(settings)
        doc = paper_verdicts(load_paper_results(source or PAPER_RESULTS), spec)
    except (PaperResultsError, MarginError) as err:
        raise SystemExit(f"judge-paper: {err}; nothing was written") from None
    prov = Provenance("paper_claims", settings, params=settings)
    if source:   # a user's numbers file is a leaf; the shipped one is versioned with the code
        prov.add_local_leaf("paper_results", source)
    write_json(a.out, prov.embedded(doc, a.out))
    for c in doc["claims"]:
        print(f"{c['verdict']:<14} {c['key']}")


def cmd_status(a) -> None:
    from softtokens.audit.status import grid_status, status_text

    config, grid = grid_config(a)
    print(status_text(grid_status(config, grid)))


DEFAULT_CONFIG = "config.yaml"


def audit_config(a) -> dict | None:
    """The config each result is held to: --config where given, else the config.yaml of the workflow that made
    the result (at its record's root, found from the file: store.provenance.record_root), else none."""
    from softtokens.audit import drift
    from softtokens.store.provenance import read_record, record_root

    if a.config is not None:
        config = drift.load(a.config)
        if config is None:
            raise SystemExit(f"--config {a.config}: no such file")
        return config
    target = Path(a.path)
    rec = read_record(target) or read_record(target.with_name(target.name.split(".")[0] + ".cells.json")) or {}
    root = record_root(target, rec) if rec else None
    for where in ([root / DEFAULT_CONFIG] if root is not None else []) + [Path(DEFAULT_CONFIG)]:
        if where.is_file():
            return drift.load(where)
    return None


def cmd_audit(a) -> int:
    from softtokens.audit.chain import HASHES_NOTE, audit
    from softtokens.crate.check import is_crate

    if (a.row is None) != (a.column is None):
        raise SystemExit("--row and --column go together (one table cell)")
    if is_crate(Path(a.path)):
        return audit_a_crate(a)
    config = audit_config(a)
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
        print(HASHES_NOTE)
        return 1 if problems else 0
    lines, problems = audit(a.path, config=config)
    print("\n".join(lines))
    print(f"\n{problems} problem(s)" if problems else "\nchain complete: every input present and unchanged")
    print(HASHES_NOTE)
    return 1 if problems else 0


def audit_a_crate(a) -> int:
    """`softtokens audit CRATE` (crate.check); with --rerun-sample N, N of its evaluation files made again from the
    crate alone (it must hold the models' weights: `softtokens crate --with-checkpoints`)."""
    from softtokens.audit.chain import HASHES_NOTE
    from softtokens.crate.check import audit_crate, crate_evaluations, opened

    lines, problems = audit_crate(Path(a.path))
    print("\n".join(lines))
    print(f"\n{problems} problem(s)" if problems else "\ncrate intact: every file as its metadata names it, every cell "
          "as its files give it")
    if a.rerun_sample and not problems:
        import random
        import secrets

        from softtokens.audit.rerun import rerun

        with opened(Path(a.path)) as crate:
            evals = crate_evaluations(crate)
            seed = a.seed if a.seed is not None else secrets.randbits(32)
            chosen = sorted(random.Random(seed).sample(evals, min(a.rerun_sample, len(evals))))
            print(f"--rerun-sample {a.rerun_sample}: drawn with seed {seed}")
            for f in chosen:
                try:
                    o = rerun(f, seed)
                except RuntimeError as err:
                    print(f"  {f.relative_to(crate)}: could not be made again from the crate ({str(err)[-300:]}); a "
                          "crate made with --with-checkpoints holds the weights it needs")
                    problems += 1
                    continue
                print(f"  {f.relative_to(crate)}: {'EQUAL' if o['equal'] else 'DIFFERS: ' + '; '.join(o['differences'][:3])}")
                problems += not o["equal"]
    print(HASHES_NOTE)
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
    c.add_argument("--settings", required=True, help="JSON: the sweep's runs and their selections (grid.jobs)")
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
    c.add_argument("--reruns", default=None, help="the log of `softtokens audit --rerun` (audit.rerun), if any")
    c.add_argument("--tables", nargs="*", default=[], help="the grid's tables, each audited on the first screen")
    c.add_argument("--paper-claims", default=None, help="the paper's claims as judge-paper judged them (else judged "
                                                        "here)")
    c.add_argument("inputs", nargs="+", help="evaluation files (math settings and loglik.json)")
    c.set_defaults(func=cmd_report)

    c = sub.add_parser("judge-paper", help="the paper's claims judged on its own numbers, under every specification, "
                                           "with their odds in reproductions (robustness.paper_verdicts)")
    c.add_argument("--settings", required=True, help="JSON: the config's judging block, optional paper_results")
    c.add_argument("--out", required=True)
    c.set_defaults(func=cmd_judge_paper)

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
    c.add_argument("--config", default=None,
                   help="the config each result is held to (a result made under other settings is named, a table "
                        "made from other files than its grid asks for); default: the config.yaml of the workflow "
                        "that made the result (at its records' root), else ./config.yaml where there is one")
    c.add_argument("--rerun", action="store_true",
                   help="re-evaluate the cell's (or the file's) evaluation files from their checkpoints and data in a "
                        "scratch directory and compare the results with the files (audit.rerun)")
    c.add_argument("--rerun-sample", type=int, default=0, metavar="N",
                   help="re-evaluate N of the table's evaluation files, drawn at random with a fresh seed (printed and "
                        "logged; --seed draws a given sample)")
    c.add_argument("--seed", type=int, default=None, help="the seed of --rerun-sample's draw (default: a fresh one)")
    c.set_defaults(func=cmd_audit)
