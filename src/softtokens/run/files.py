"""Every result file is written here, atomically: to a temporary sibling renamed into place
once complete, so that a crash or a Snakemake kill never leaves a half-written result that a
later job could read as whole. Modes follow the user's umask, so a group on a shared cluster
file system can read what a run wrote."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# a result that is not JSON (JSONL, tables, figures, checkpoint directories) has its provenance
# record beside it, in <name>.prov.json
SIDECAR_SUFFIX = ".prov.json"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def shared_mode(path: Path, directory: bool = False) -> None:
    """The mode a plain ``open`` or ``mkdir`` would give under the user's umask (mkstemp and
    mkdtemp make 0600 / 0700, which a group on a shared cluster file system cannot read)."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling path; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    shared_mode(tmp_path)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling directory; it replaces ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    shared_mode(tmp, directory=True)
    try:
        yield tmp
        for f in tmp.rglob("*"):  # some writers (safetensors) make 0600 files
            if not f.is_symlink():
                shared_mode(f, directory=f.is_dir())
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


def write_jsonl(path: str | os.PathLike, rows: list[dict]) -> None:
    write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


# ---------------------------------------------------------------- hashing
def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_path(path: str | os.PathLike) -> str:
    """sha256 of a file, or of a directory as the hash of its files' (relative path, sha256)
    list; provenance sidecars inside are left out so stamping a directory does not change it."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        if f.name.endswith(SIDECAR_SUFFIX) or f.name == "provenance.json":
            continue
        h.update(f"{f.relative_to(path).as_posix()}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def replace_dir(tmp: Path, final: Path) -> None:
    """Put a finished directory in place: the old one is moved aside before the new one is
    renamed in, so a crash in between leaves ``final`` or ``.final.old`` (recover_dir)."""
    old = final.with_name(f".{final.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)


def recover_dir(final: Path) -> None:
    """After a crash inside replace_dir: bring back the previous directory."""
    old = final.with_name(f".{final.name}.old")
    if not final.exists() and old.exists():
        os.replace(old, final)


def read_jsonl(path: Path, while_written: bool = False) -> list[dict]:
    """One dict per line. ``while_written``: the file may be read as a running job appends to it,
    so a last line half-way through being written is left out (any other bad line still raises)."""
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = [json.loads(line) for line in (lines[:-1] if while_written else lines)]
    if while_written and lines:
        try:
            rows.append(json.loads(lines[-1]))
        except json.JSONDecodeError:
            pass
    return rows
