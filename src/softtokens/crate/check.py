"""`softtokens audit CRATE`: a crate checked where it lands (a directory or a zip, copied anywhere, without the
project's results tree): every file against the sha256 the crate's metadata names, every JSON result against its own
record (its document hash, its numbers recomputed from its rows, its identity held to its path), and every table cell
recomputed from the crate's evaluation files. A model's weights left out of the crate are named, not failed.

Why it can: the files sit in the crate at their paths relative to the workflow's root, so their records (relative to
that root, found from each file: store.provenance.record_root) read the same inside the crate as in the tree."""

from __future__ import annotations

import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

from softtokens.audit.cell import cells_root, value_from_rows
from softtokens.audit.chain import EVAL_STAGES
from softtokens.audit.records import hash_problems
from softtokens.audit.rows import row_problems
from softtokens.cells.results import mean_std_text
from softtokens.crate.build import NOT_INCLUDED
from softtokens.store import paths
from softtokens.store.eval_identity import identity_problems
from softtokens.store.files import MalformedFile, read_json, sha256_file
from softtokens.store.provenance import at_root, read_record, record_path, record_root

METADATA = "ro-crate-metadata.json"


def is_crate(path: Path) -> bool:
    path = Path(path)
    return (path.is_dir() and (path / METADATA).is_file()) or (path.suffix == ".zip" and zipfile.is_zipfile(path))


@contextmanager
def opened(path: Path):
    """The crate's directory: itself, or a zip unpacked in a scratch directory."""
    path = Path(path)
    if path.is_dir():
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="softtokens-crate-") as tmp:
        with zipfile.ZipFile(path) as z:
            z.extractall(tmp)
        yield Path(tmp)


def file_problems(crate: Path, graph: dict) -> tuple[list[str], int, int]:
    """(problems, files checked, files named but not included) of every entity with a sha256."""
    out, checked, absent = [], 0, 0
    for eid, e in graph.items():
        want = e.get("sha256")
        types = e.get("@type") if isinstance(e.get("@type"), list) else [e.get("@type")]
        if not want or "Dataset" in types or ("File" not in types and e.get("description") != NOT_INCLUDED):
            continue   # a directory (its files are entities of their own), a leaf outside the workflow
        if e.get("description") == NOT_INCLUDED:
            absent += 1
            continue
        f = crate / unquote(eid)   # an @id is a URI path: "hard@lr3.5e-05" is written "hard%40lr3.5e-05"
        if not f.is_file():
            out.append(f"MISSING {eid}: the crate's metadata names it (sha256 {want[:12]}), the crate holds no such file")
        elif (got := sha256_file(f)) != want:
            out.append(f"CHANGED {eid}: its bytes hash to {got[:12]}, the crate's metadata says {want[:12]}")
        checked += 1
    return out, checked, absent


def result_problems(crate: Path) -> list[str]:
    """Every JSON result with an embedded record: its document hash; an evaluation file also its numbers from its rows
    and its identity against its path."""
    out = []
    for f in sorted(crate.rglob("*.json")):
        if f.name == METADATA or f.parent.name == "workflow":
            continue
        try:
            doc = read_json(f, kind=object)
        except MalformedFile as err:
            out.append(f"MALFORMED {err}")
            continue
        if not isinstance(doc, dict):   # a table's cell index: checked by its sidecar's hash, and cell by cell below
            continue
        rec = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else None
        if rec is None or record_path(f) != f:
            continue
        rel = f.relative_to(crate)
        out += [p.replace(str(f), str(rel)) for p in hash_problems(f, rec, deep=False)]
        if rec.get("stage") in EVAL_STAGES:
            out += [p.replace(str(f), str(rel)) for p in
                    identity_problems(f, doc) + row_problems(f, doc, rec, record_root(f, rec))]
    return out


def table_problems(crate: Path) -> tuple[list[str], int]:
    """Every table cell recomputed from the crate's evaluation files' rows, against the value its cell index says."""
    out, cells = [], 0
    for index in sorted(crate.rglob(f"*.{paths.CELLS_EXT}")):
        table = index.with_name(index.name.split(".")[0] + ".md")
        root = cells_root(table) or crate   # never a path outside the crate
        for cell in read_json(index, kind=list):
            files = [at_root(root, p) for p in cell["evals"]]
            values = [value_from_rows(p, cell["metric"]) if p.is_file() else None for p in files]
            cells += 1
            if any(v is None for v in values):
                out.append(f"MISSING {index.relative_to(crate)}: cell [{cell['row']}] [{cell['column']}] rests on "
                           "evaluation files the crate does not hold whole")
                continue
            import pandas as pd

            s = pd.Series(values)
            now = mean_std_text(s.mean(), s.std(), len(s), cell["digits"])
            if now != cell["value"]:
                out.append(f"CHANGED VALUE {index.relative_to(crate)}: cell [{cell['row']}] [{cell['column']}] says "
                           f"{cell['value']}, the crate's evaluation files give {now}")
    return out, cells


def audit_crate(path: Path) -> tuple[list[str], int]:
    """Printable lines and the problems found (module docstring)."""
    with opened(path) as crate:
        try:
            meta = read_json(crate / METADATA)
        except MalformedFile as err:
            return [f"MALFORMED {err}"], 1
        graph = {e.get("@id"): e for e in meta.get("@graph", []) if isinstance(e, dict)}
        files, checked, absent = file_problems(crate, graph)
        results = result_problems(crate)
        tables, cells = table_problems(crate)
        runs = [e for e in graph.values() if e.get("@type") == "CreateAction"]
    problems = files + results + tables
    lines = [f"crate {path}: {checked} file(s) held to the sha256 its metadata names"
             + (f" ({absent} named by hash, not included: a model's weights)" if absent else "")
             + f"; {len(runs)} action(s); {cells} table cell(s) recomputed from its evaluation files"]
    lines += [f"  {p}" for p in problems]
    return lines, len(problems)


def crate_evaluations(path: Path) -> list[Path]:
    """The evaluation files a crate holds (what `--rerun-sample N CRATE` draws from)."""
    return sorted(p for p in Path(path).rglob("*.json") if "eval" in p.parts and (read_record(p) or {}).get(
        "stage") in EVAL_STAGES)
