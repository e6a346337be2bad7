"""`softtokens audit PATH`: a result's provenance chain walked back to its sources, every link
checked: the file against the hash its record holds (an edit of a number, of the record, or a
damaged checkpoint), the record's config against its own hash, an evaluation's numbers against its
per-problem rows and its checkpoint against its run's selection, the job's other outputs present,
and every input against the hash recorded when the result was made.

Why every check at every node: an edited evaluation file that a rebuild re-recorded once passed
("chain complete") because only the inputs' hashes were compared, never what a file says of itself."""

from __future__ import annotations

import json
from pathlib import Path

import softtokens
from softtokens.audit.drift import drift_problem
from softtokens.audit.leaves import leaf_lines
from softtokens.audit.links import link_problems
from softtokens.audit.records import current_sha256, record_problems
from softtokens.audit.rows import (
    identical_seed_problems,
    row_problems,
    selection_problems,
    shared_selection_problems,
)
from softtokens.run.provenance import _rel, read_record, record_path

PACKAGE = Path(softtokens.__file__).resolve().parent
EVAL_STAGES = ("evaluate", "evaluate_loglik")
SELECT_STAGE = "select_checkpoint"   # commands.train.cmd_select's Provenance stage
SHARE_STAGE = "share_selection"      # commands.train.cmd_select_shared's: a run that is another's name


def shipped(path: Path) -> bool:
    """A file the package ships (the paper's numbers): made by no job, versioned with the code."""
    return PACKAGE in path.resolve().parents


def node_problems(path: Path, rec: dict, deep: bool = True) -> list[str]:
    """Everything a result's own record and content say that is not so (the inputs aside)."""
    out = record_problems(path, rec, deep)
    if rec.get("stage") in EVAL_STAGES and record_path(path) == path:
        doc = json.loads(path.read_text())
        out += row_problems(path, doc, rec)
        out += link_problems(path, rec, doc)
    elif rec.get("stage") == SELECT_STAGE and record_path(path) == path:
        out += selection_problems(path, json.loads(path.read_text()), rec)
    elif rec.get("stage") == SHARE_STAGE and record_path(path) == path:
        out += shared_selection_problems(path, json.loads(path.read_text()))
    return out


def audit(path: str | Path, _depth: int = 0, _seen: set | None = None, config: dict | None = None) -> tuple[list[str], int]:
    """Walk a result's provenance chain back to its sources: printable lines and the number of
    problems found (module docstring). ``config``: the current config (audit.drift), each result held to the
    settings it gives that result's job."""
    seen = _seen if _seen is not None else set()
    pad = "  " * _depth
    path = Path(path)
    key = path.resolve().as_posix()
    if key in seen:
        return [f"{pad}{_rel(path)} (see above)"], 0
    seen.add(key)
    if not path.exists():
        return [f"{pad}MISSING {_rel(path)}"], 1
    if shipped(path):
        return [f"{pad}{_rel(path)}  [shipped with softtokens {softtokens.__version__}: versioned with the code]"], 0
    rec = read_record(path)
    if rec is None:
        return [f"{pad}{_rel(path)}: NO PROVENANCE RECORD"], 1
    code = rec.get("git_commit") or "unknown-commit"
    dirty = " (dirty)" if rec.get("git_dirty") else ""
    lines = [f"{pad}{_rel(path)}  [{rec.get('stage')}]  code {code[:10]}{dirty} v{rec.get('softtokens_version')}  "
             f"config {rec.get('config_hash')}  {rec.get('finished')}  {rec.get('device', {}).get('name')}"]
    own = node_problems(path, rec)
    drift = drift_problem(config, path, rec)
    own += [drift] if drift else []
    lines += [f"{pad}  {p}" for p in own]
    problems = len(own)
    for name, leaf in rec.get("external_inputs", {}).items():
        said, bad = leaf_lines(name, leaf)
        lines += [f"{pad}  {line}" for line in said]
        problems += bad
    copies = identical_seed_problems([Path(i["path"]) for i in rec.get("inputs", {}).values()
                                      if Path(i["path"]).is_file()])
    lines += [f"{pad}  {c}" for c in copies]
    problems += len(copies)
    expected = rec.get("expected_inputs") or {}
    for name, inp in rec.get("inputs", {}).items():
        p = Path(inp["path"])
        if not p.exists():
            lines.append(f"{pad}  {name}: MISSING {inp['path']}")
            problems += 1
            continue
        if not shipped(p):
            now, damaged = current_sha256(p)
            if damaged:
                lines.append(f"{pad}  {name}: DAMAGED {inp['path']}: {damaged}")
                problems += 1
            elif now != inp["sha256"]:
                lines.append(f"{pad}  {name}: CHANGED {inp['path']} (recorded {inp['sha256'][:12]}, now {now[:12]})")
                problems += 1
        want = expected.get(inp["path"]) or expected.get(p.as_posix())
        made = (read_record(p) or {}).get("params_hash")
        if want and made != want:
            lines.append(f"{pad}  {name}: STALE {inp['path']} was made with settings {made}, the config of this "
                         f"job gave it {want}")
            problems += 1
        sub, sub_problems = audit(p, _depth + 1, seen, config)
        lines.extend(sub)
        problems += sub_problems
    return lines, problems
