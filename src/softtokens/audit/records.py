"""One provenance record held against what it describes: the file's bytes (the hash the record
holds of its output, or of the whole JSON document it is embedded in), the hash of its own config,
and the job's other outputs.

Why: a record nobody checks is decoration. The hashes were written so that an edited number, an
edited record or a damaged file could be told from a made one; these checks are where that happens,
for `softtokens audit` (audit.chain) and for every table, figure and report job before it reads an
input (audit.inputs)."""

from __future__ import annotations

from pathlib import Path

from softtokens.model.checkpoint import TrainerState, checkpoint_problem, manifest_sha256
from softtokens.store.files import MalformedFile, read_json, sha256_path
from softtokens.store.provenance import (
    CONTENT_HASH,
    at_root,
    config_hash,
    content_sha256,
    placement_problem,
    read_record,
    record_conflict,
    record_path,
    record_root,
)


def current_sha256(path: Path, deep: bool = True) -> tuple[str, str | None]:
    """(sha256 of a file or directory as a record would hold it now, the damaged file of a checkpoint
    when there is one). A checkpoint's hash comes from its manifest; ``deep``: every byte read first."""
    if path.is_dir() and TrainerState.exists(path):
        problem = checkpoint_problem(path, content=deep)
        if problem:
            return "", problem
        from_manifest = manifest_sha256(path)
        if from_manifest:
            return from_manifest, None
    return sha256_path(path), None


def record_problems(path: Path, rec: dict, deep: bool = True) -> list[str]:
    """What a record says that is no longer true of ``path``: an edit of the file or of the record,
    a config that no longer hashes to its recorded hash, another output of the same job missing."""
    out = []
    if "config" in rec and rec.get("config_hash") and config_hash(rec["config"]) != rec["config_hash"]:
        out.append(f"EDITED RECORD {path}: its config hashes to {config_hash(rec['config'])}, the record says "
                   f"{rec['config_hash']} (the settings were changed after the job ran)")
    conflict = record_conflict(path)
    if conflict:
        out.append(conflict)
    misplaced = placement_problem(path, rec)
    if misplaced:
        out.append(misplaced)
    out += hash_problems(path, rec, deep)
    root = record_root(path, rec)
    for other in rec.get("outputs") or []:   # the job's other outputs, each by its own record's hash
        other = at_root(root, other)
        if not other.exists():
            out.append(f"MISSING {other}: written by the same job as {path}, and gone")
        elif other != path:
            theirs = read_record(other)
            out += ([f"NO PROVENANCE RECORD {other}: written by the same job as {path}"] if theirs is None
                    else hash_problems(other, theirs, deep))
    return out


def hash_problems(path: Path, rec: dict, deep: bool = True) -> list[str]:
    """The file against the hash its record holds of it; a record that holds none is a failure, never a skipped
    check (a hash removed with the edit it would have caught passed once)."""
    if record_path(path) == path:  # embedded in a JSON document
        want = rec.get(CONTENT_HASH)
        if not want:
            return [f"NO HASH {path}: its embedded record holds no {CONTENT_HASH}: the document cannot be checked"]
        try:
            got = content_sha256(read_json(path))
        except MalformedFile as err:
            return [f"MALFORMED {err}"]
        if got != want:
            return [f"EDITED {path}: the document (its numbers, rows or record) hashes to {got[:12]}, its "
                    f"record holds {want[:12]}: changed after its job wrote it"]
        return []
    want = (rec.get("output") or {}).get("sha256")
    if not want:
        return [f"NO HASH {path}: its record ({record_path(path)}) holds no sha256 of it: it cannot be checked"]
    got, damaged = current_sha256(path, deep)
    if damaged:
        return [f"DAMAGED {path}: {damaged}"]
    if got != want:
        return [f"CHANGED {path} since its job wrote it (recorded {want[:12]}, now {got[:12]})"]
    return []
