"""The chain's leaves: what a job read from outside the workflow, held against what its record says.

Why a leaf is not a problem but a changed leaf is: a cluster reads its models from a local directory and its
data from a local copy, a laptop reads a model a pip package ships; none of them carries a provenance record,
and none needs one. What the record holds of it (the sha256 of the bytes read, or the hub's revision) is what
a reader of a result can check: the bytes again here, or the revision on the hub."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from softtokens.store.files import sha256_path
from softtokens.store.provenance import at_root


@lru_cache(maxsize=None)
def _sha256(path: str, signature: tuple) -> str:
    return sha256_path(path)


def _signature(path: Path) -> tuple:
    """What tells two reads of a path apart within one audit: a leaf read by many records (a 3B model directory
    by every training job and base evaluation) is hashed once while it stays the same."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return tuple((f.as_posix(), os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files)


def current_leaf_sha256(path: Path) -> str:
    return _sha256(path.as_posix(), _signature(path))


def leaf_lines(name: str, leaf, root: Path | None = None) -> tuple[list[str], int]:
    """Printable lines for one leaf and the problems found: a local or packaged file whose bytes changed or
    that is gone. A hub leaf is named with its revision (checked on the hub, which an audit does not reach).
    ``root``: what the record's relative paths are relative to (store.provenance.record_root)."""
    if not isinstance(leaf, dict):   # a record written before leaves were recorded by content
        return [f"{name}: external {leaf} (a reference only: recorded before leaves carried their content hash)"], 0
    kind = leaf.get("kind")
    if kind == "hub":
        ref = leaf.get("ref") or f"{leaf.get('id')}@{leaf.get('revision') or 'unknown revision'}"
        pinned = leaf.get("ref") or leaf.get("revision")
        return [f"{name}: leaf on the hub {ref}" + ("" if pinned else " (no revision recorded: not pinned)")], 0
    path = at_root(root, leaf.get("path", ""))
    what = (f"package {leaf.get('distribution')} {leaf.get('version')}: " if kind == "package" else "local ")
    want = leaf.get("sha256") or ""
    if not path.exists():
        return [f"{name}: MISSING leaf {what}{path} (recorded sha256 {want[:12]}): gone from this machine, "
                "so the chain cannot be checked at its source"], 1
    now = current_leaf_sha256(path)
    if now != want:
        return [f"{name}: CHANGED leaf {what}{path} (recorded {want[:12]}, now {now[:12]}): the result was made "
                "from other bytes than are there now"], 1
    return [f"{name}: leaf {what}{path} sha256 {want[:12]} (unchanged)"], 0
