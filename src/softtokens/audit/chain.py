"""`softtokens audit PATH`: a result's provenance chain walked back to its sources, every link
checked: the file against the hash its record holds (an edit of a number, of the record, or a
damaged checkpoint), the record's config against its own hash, an evaluation's numbers against its
per-problem rows and its checkpoint against its run's selection, the job's other outputs present,
and every input against the hash recorded when the result was made.

Why every check at every node: an edited evaluation file that a rebuild re-recorded once passed
("chain complete") because only the inputs' hashes were compared, never what a file says of itself."""

from __future__ import annotations

from pathlib import Path

import softtokens
from softtokens.audit.drift import drift_problem
from softtokens.audit.grid import grid_problems
from softtokens.audit.leaves import leaf_lines
from softtokens.audit.links import link_problems
from softtokens.audit.records import current_sha256, record_problems
from softtokens.audit.rows import (
    identical_seed_problems,
    row_problems,
    selection_problems,
    shared_selection_problems,
)
from softtokens.store.eval_identity import identity_problems
from softtokens.store.files import MalformedFile, read_json
from softtokens.store.provenance import at_root, read_record, record_path, record_root, rel

PACKAGE = Path(softtokens.__file__).resolve().parent
EVAL_STAGES = ("evaluate", "evaluate_loglik")
SELECT_STAGE = "select_checkpoint"   # commands.train.cmd_select's Provenance stage
SHARE_STAGE = "share_selection"      # commands.train.cmd_select_shared's: a run that is another's name
# what the hashes cannot prove, said under every audit (docs/reliability.md, "What the hashes protect against")
HASHES_NOTE = ("The hashes are unkeyed: they show that nothing changed since each file was written, not who wrote it "
               "(a forger with the code can redo them). `softtokens audit --rerun` makes evaluation files again from "
               "their checkpoints and test sets and compares them.")


def shipped(path: Path) -> bool:
    """A file the package ships (the paper's numbers): made by no job, versioned with the code."""
    return PACKAGE in path.resolve().parents


def root_of(path: Path, rec: dict) -> Path:
    """The root a record's paths are relative to (store.provenance.record_root); for a file that is not where its job
    wrote it (named by the node's checks), the job's working directory where it still exists, else this one."""
    root = record_root(path, rec)
    if root is not None:
        return root
    workdir = Path(rec.get("workdir") or ".")
    return workdir if workdir.is_dir() else Path.cwd()


def malformed(path: Path) -> str | None:
    """A JSON result that cannot be read (empty, cut short, binary, another type), in one line; None otherwise."""
    if path.suffix != ".json" or not path.is_file():
        return None
    try:
        read_json(path)
    except MalformedFile as err:
        return f"MALFORMED {err}"
    return None


def node_problems(path: Path, rec: dict, deep: bool = True) -> list[str]:
    """Everything a result's own record and content say that is not so (the inputs aside)."""
    out = record_problems(path, rec, deep)
    if record_path(path) != path:
        return out
    root = root_of(path, rec)
    try:
        doc = read_json(path)
    except MalformedFile as err:
        return out + [f"MALFORMED {err}"]
    stage = rec.get("stage")
    if stage in EVAL_STAGES:
        out += identity_problems(path, doc)
        out += row_problems(path, doc, rec, root)
        out += link_problems(path, rec, doc, root)
    elif stage == SELECT_STAGE:
        out += selection_problems(path, doc, rec, root)
    elif stage == SHARE_STAGE:
        out += shared_selection_problems(path, doc, root)
    return out


def audit(path: str | Path, _depth: int = 0, _seen: set | None = None, config: dict | None = None,
          deep: bool = True) -> tuple[list[str], int]:
    """Walk a result's provenance chain back to its sources: printable lines and the number of
    problems found (module docstring). ``config``: the current config (audit.drift), each result held to the
    settings it gives that result's job, and each table to the files its grid asks for (audit.grid). ``deep``
    False: a checkpoint is held to its manifest and record, its bytes not read (the report's audit of its tables)."""
    seen = _seen if _seen is not None else set()
    pad = "  " * _depth
    path = Path(path)
    key = path.resolve().as_posix()
    if key in seen:
        return [f"{pad}{rel(path)} (see above)"], 0
    seen.add(key)
    if not path.exists():
        return [f"{pad}MISSING {rel(path)}"], 1
    link = [f"{pad}  SYMLINK {rel(path)} -> {path.resolve().as_posix()} (checked as the file it points to)"] \
        if path.is_symlink() else []
    if shipped(path):
        return [f"{pad}{rel(path)}  [shipped with softtokens {softtokens.__version__}: versioned with the code]"], 0
    rec = read_record(path)
    if rec is None:
        return [f"{pad}{rel(path)}: {malformed(path) or 'NO PROVENANCE RECORD'}", *link], 1
    root = root_of(path, rec)
    code = rec.get("git_commit") or "unknown-commit"
    dirty = " (dirty)" if rec.get("git_dirty") else ""
    lines = [f"{pad}{rel(path)}  [{rec.get('stage')}]  code {code[:10]}{dirty} v{rec.get('softtokens_version')}  "
             f"config {rec.get('config_hash')}  {rec.get('finished')}  {rec.get('device', {}).get('name')}", *link]
    own = node_problems(path, rec, deep)
    drift = drift_problem(config, path, rec, root)
    own += [drift] if drift else []
    own += grid_problems(config, path, rec, root)
    lines += [f"{pad}  {p}" for p in own]
    problems = len(own)
    for name, leaf in rec.get("external_inputs", {}).items():
        said, bad = leaf_lines(name, leaf, root)
        lines += [f"{pad}  {line}" for line in said]
        problems += bad
    inputs = {name: (inp, at_root(root, inp["path"])) for name, inp in rec.get("inputs", {}).items()}
    copies = identical_seed_problems([p for _, p in inputs.values() if p.is_file()])
    lines += [f"{pad}  {c}" for c in copies]
    problems += len(copies)
    expected = rec.get("expected_inputs") or {}
    for name, (inp, p) in inputs.items():
        if not p.exists():
            lines.append(f"{pad}  {name}: MISSING {inp['path']}")
            problems += 1
            continue
        if not shipped(p):
            now, damaged = current_sha256(p, deep)
            if damaged:
                lines.append(f"{pad}  {name}: DAMAGED {inp['path']}: {damaged}")
                problems += 1
            elif now != inp["sha256"]:
                lines.append(f"{pad}  {name}: CHANGED {inp['path']} (recorded {inp['sha256'][:12]}, now {now[:12]})")
                problems += 1
        want = expected.get(inp["path"])
        made = (read_record(p) or {}).get("params_hash")
        if want and made != want:
            lines.append(f"{pad}  {name}: STALE {inp['path']} was made with settings {made}, the config of this "
                         f"job gave it {want}")
            problems += 1
        sub, sub_problems = audit(p, _depth + 1, seen, config, deep)
        lines.extend(sub)
        problems += sub_problems
    return lines, problems
