"""The audit of one table cell: the cell, the evaluation files it was made from, and every link
further up (provenance.audit), with the value recomputed from the files as the table computed it."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from softtokens.cells.results import load_eval_frame, load_loglik_frame, mean_std_text
from softtokens.run import paths


# ---------------------------------------------------------------- audit of one table cell
def audit_cell(table: str | Path, row: str, column: str) -> tuple[list[str], int]:
    """The chain of one table cell: the cell -> its evaluation files (one per seed) -> selected
    checkpoint -> training run -> base model and data, each link with code version, config hash
    and input hashes (provenance.audit). Flags a missing or changed evaluation file, a value that
    no longer follows from the files, and every broken link further up."""
    from softtokens.run.files import sha256_path
    from softtokens.run.provenance import audit, read_record

    table = Path(table)
    cells_path = paths.cells_path(table)
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
    values, changed = [], 0
    for p in map(Path, cell["evals"]):
        if not p.exists():
            lines.append(f"  MISSING {p}")
            problems += 1
            continue
        recorded = made_from.get(p.as_posix())
        if recorded and recorded != sha256_path(p):
            lines.append(f"  CHANGED {p} since the table was made (recorded {recorded[:12]}, now {sha256_path(p)[:12]})")
            problems += 1
            changed += 1
        load = load_loglik_frame if p.stem == "loglik" else load_eval_frame  # as the table read it
        values.append(float(load([p])[cell["metric"]].iloc[0]))
        sub, sub_problems = audit(p, 1)
        lines.extend(sub)
        problems += sub_problems
    if values and len(values) == len(cell["evals"]):
        s = pd.Series(values)
        d = cell["digits"]
        now = mean_std_text(s.mean(), s.std(), len(s), d)
        if now != cell["value"]:
            lines.append(f"  CHANGED VALUE: the files now give {now}, the table says {cell['value']}")
            problems += 1
        elif changed:
            # remade files (a rerun, new provenance) that give the same number: say so, the link is still stale
            lines.append(f"  VALUE UNCHANGED: the changed file(s) still give {now}, as the table says; rebuild the "
                         f"table (snakemake {table.with_suffix('.md')}) to link it to them")
    lines.append(f"{problems} problem(s)" if problems else "chain intact: every link present and unchanged")
    return lines, problems
