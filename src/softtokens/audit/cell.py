"""The audit of one table cell: the cell, the evaluation files it was made from, and every link
further up (audit.chain), with the value recomputed from each file's per-problem rows, not from the
summary a hand could have edited."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from softtokens.cells.results import mean_std_text
from softtokens.eval.metrics import mean_pass_at_k
from softtokens.store import paths
from softtokens.store.files import MalformedFile, read_json, sha256_path
from softtokens.store.provenance import at_root, read_record, record_root


def value_from_rows(path: Path, metric: str) -> float | None:
    """A file's value of ``metric`` in the table's units (%; the NLL in nats), from its rows only
    (None: the file has no rows to recompute it from)."""
    try:
        doc = read_json(path)
        rows = doc.get("problems") or []
        if not rows:
            return None
        if metric == "accuracy":
            return 100 * sum(bool(r["correct"] if "correct" in r else r.get("pred") == r.get("label"))
                             for r in rows) / len(rows)
        if metric == "nll_correct":
            return sum(r["nll_correct"] for r in rows) / len(rows)
        k = metric.split("@")[1]
        k = int(doc["n_samples"]) if k == "n" else int(k)   # pass@n: the file's own samples per problem
        return 100 * mean_pass_at_k([(r["n"], r["correct"]) for r in rows], k)
    except (MalformedFile, KeyError, TypeError, ValueError, ZeroDivisionError):
        return None   # named by the file's own checks (audit.chain)


def read_cells(table: Path) -> list[dict]:
    """A table's cell index (TABLE.cells.json), or MalformedFile naming it."""
    cells = read_json(paths.cells_path(table), kind=list)
    if not all(isinstance(c, dict) and {"row", "column", "evals"} <= set(c) for c in cells):
        raise MalformedFile(f"{paths.cells_path(table)}: not a table's cell index (each cell a row, a column and "
                            "its evaluation files)")
    return cells


def find_cell(table: Path, row: str, column: str) -> dict:
    """One cell of a table's index (TABLE.cells.json: its value and the evaluation files it was made of)."""
    cells = read_cells(table)
    match = [c for c in cells if c["row"] == row.strip() and c["column"] == column.strip()]
    if not match:
        rows = sorted({c["row"] for c in cells})
        cols = sorted({c["column"] for c in cells})
        raise KeyError(f"no cell ({row!r}, {column!r}) in {table}; rows: {rows}; columns: {cols}")
    return match[0]


def cells_root(table: Path) -> Path | None:
    """What the cell index's paths are relative to: its record's root (store.provenance.record_root)."""
    cells_path = paths.cells_path(table)
    rec = read_record(cells_path) or {}
    return record_root(cells_path, rec) if rec else None


def cell_files(table: str | Path, row: str, column: str) -> list[Path]:
    """The evaluation files one table cell was made of (one per seed), as paths here."""
    table = Path(table)
    root = cells_root(table)
    return [at_root(root, p) for p in find_cell(table, row, column)["evals"]]


def audit_cell(table: str | Path, row: str, column: str, config: dict | None = None) -> tuple[list[str], int]:
    """The chain of one table cell: the cell -> its evaluation files (one per seed) -> selected
    checkpoint -> training run -> base model and data, each link with code version, config hash
    and input hashes (audit.chain). Flags a missing, changed or edited evaluation file, a value that
    does not follow from the files' rows, and every broken link further up."""
    from softtokens.audit.chain import audit

    table = Path(table)
    cells_path = paths.cells_path(table)
    if not cells_path.exists():
        return [f"MISSING {cells_path} (the cell index written beside every table)"], 1
    cell = find_cell(table, row, column)
    lines = [f"cell {table.name.split('.')[0]} [{cell['row']}] [{cell['column']}] = {cell['value']} "
             f"({cell['setting']}, {cell['metric']}, {len(cell['evals'])} seed file(s))"]
    problems = 0
    root = cells_root(table)
    made_from = {inp["path"]: inp["sha256"] for inp in (read_record(cells_path) or {}).get("inputs", {}).values()}
    values, changed = [], 0
    for recorded in cell["evals"]:
        p = at_root(root, recorded)
        if not p.exists():
            lines.append(f"  MISSING {recorded}")
            problems += 1
            continue
        want = made_from.get(recorded)
        if want is None:
            lines.append(f"  NOT AN INPUT {recorded}: the cell names a file its table's record does not list")
            problems += 1
        elif want != sha256_path(p):
            lines.append(f"  CHANGED {recorded} since the table was made (recorded {want[:12]}, now "
                         f"{sha256_path(p)[:12]})")
            problems += 1
            changed += 1
        value = value_from_rows(p, cell["metric"])
        if value is None:
            lines.append(f"  NO ROWS {recorded}: its {cell['metric']} cannot be recomputed from per-problem results")
            problems += 1
        else:
            values.append(value)
        sub, sub_problems = audit(p, 1, config=config)
        lines.extend(sub)
        problems += sub_problems
    if values and len(values) == len(cell["evals"]):
        s = pd.Series(values)
        d = cell["digits"]
        now = mean_std_text(s.mean(), s.std(), len(s), d)
        if now != cell["value"]:
            lines.append(f"  CHANGED VALUE: the files' rows now give {now}, the table says {cell['value']}")
            problems += 1
        elif changed:
            # remade files (a rerun, new provenance) that give the same number: say so, the link is still stale
            lines.append(f"  VALUE UNCHANGED: the changed file(s) still give {now}, as the table says; rebuild the "
                         f"table (snakemake {table.with_suffix('.md')}) to link it to them")
    lines.append(f"{problems} problem(s)" if problems else "chain intact: every link present and unchanged")
    return lines, problems
