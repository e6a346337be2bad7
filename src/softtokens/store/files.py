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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# a result that is not JSON (JSONL, tables, figures) has its provenance record beside it, in
# <name>.prov.json; a directory (a checkpoint) holds its record inside, in provenance.json
# (store.provenance.record_path decides which, for writers and readers alike)
SIDECAR_SUFFIX = ".prov.json"
DIR_RECORD = "provenance.json"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def shared_mode(path: Path, directory: bool = False) -> None:
    """The mode a plain ``open`` or ``mkdir`` would give under the user's umask (mkstemp and
    mkdtemp make 0600 / 0700, which a group on a shared cluster file system cannot read)."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def fsync_path(path: str | os.PathLike) -> None:
    """Ask the kernel to put a file's (or a directory's entries') bytes on the disk: a rename is
    atomic, but without this a power loss can leave the renamed file with zeros where its data was."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file under ``root`` and every directory (its entries), deepest first, then ``root``."""
    root = Path(root)
    for f in root.rglob("*"):
        if f.is_file() and not f.is_symlink():
            fsync_path(f)
    for d in sorted((d for d in root.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
        fsync_path(d)
    fsync_path(root)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, durable: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling path; rename it onto ``path`` only if the block succeeds. ``durable``:
    the file is fsync'd before the rename and its directory after (what a power loss must not undo)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    shared_mode(tmp_path)
    try:
        yield tmp_path
        if durable:
            fsync_path(tmp_path)
        os.replace(tmp_path, path)
        if durable:
            fsync_path(path.parent)
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


def write_text(path: str | os.PathLike, text: str, durable: bool = False) -> None:
    with atomic_path(path, durable) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, obj: Any, durable: bool = False) -> None:
    write_text(path, json.dumps(obj, indent=1, sort_keys=False) + "\n", durable)


def write_jsonl(path: str | os.PathLike, rows: list[dict]) -> None:
    write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


# ---------------------------------------------------------------- hashing
def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_files(paths: list[Path], workers: int | None = None) -> list[str]:
    """sha256 of several files at once, one thread each up to ``workers`` (hashlib releases the GIL:
    the threads hash on as many cores), in the order given."""
    if len(paths) <= 1:
        return [sha256_file(p) for p in paths]
    workers = workers or min(len(paths), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(sha256_file, paths))


# written into a directory output by Snakemake after its job: a marker of when, not content
SNAKEMAKE_MARKERS = (".snakemake_timestamp",)


def hashed_files(path: Path) -> list[Path]:
    """The files a directory's hash covers: every file, provenance records inside left out (stamping
    a directory does not change it), and Snakemake's timestamp marker (written after the job)."""
    return sorted(p for p in path.rglob("*") if p.is_file() and not p.name.endswith(SIDECAR_SUFFIX)
                  and p.name != DIR_RECORD and p.name not in SNAKEMAKE_MARKERS)


def directory_sha256(file_hashes: dict[str, str]) -> str:
    """A directory's sha256 from its files' (relative path -> sha256): the hash of the sorted
    'path NUL sha256 LF' lines. Why a function: the directory hash a provenance record holds can be
    recomputed from a checkpoint's manifest (model.checkpoint) without reading its files again."""
    h = hashlib.sha256()
    for rel in sorted(file_hashes):
        h.update(f"{rel}\0{file_hashes[rel]}\n".encode())
    return h.hexdigest()


def sha256_path(path: str | os.PathLike) -> str:
    """sha256 of a file, or of a directory (directory_sha256 of hashed_files, hashed in parallel)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    files = hashed_files(path)
    return directory_sha256({f.relative_to(path).as_posix(): h for f, h in zip(files, sha256_files(files))})


class JsonlError(ValueError):
    """A line of a JSONL file that is not JSON; the message names the file and the line."""


class MalformedFile(ValueError):
    """A result file that cannot be read as what it should be (empty, cut short, binary bytes, another type):
    one line naming the file and what is wrong. Commands print it without a traceback (cli.main), the audit
    reports it as a problem of that file."""


def read_json(path: str | os.PathLike, kind: type = dict) -> Any:
    """A JSON document of type ``kind`` (a dict by default), or MalformedFile naming the file and the fault.
    Why one reader: a truncated evaluation file gave a JSONDecodeError traceback in the audit and 300 random bytes
    in a selected.json a UnicodeDecodeError in an evaluation job, neither naming the file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise MalformedFile(f"{path}: a directory, not a JSON file") from None
    except FileNotFoundError:
        raise MalformedFile(f"{path}: no such file") from None
    if not raw.strip():
        raise MalformedFile(f"{path}: empty ({len(raw)} bytes), not a JSON document (cut short or never written)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise MalformedFile(f"{path}: binary bytes, not JSON text (byte {err.start} is 0x{raw[err.start]:02x})") \
            from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        cut = " (cut short?)" if err.pos >= len(text.rstrip()) - 1 else ""
        raise MalformedFile(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno}){cut}") from None
    if not isinstance(obj, kind):
        raise MalformedFile(f"{path}: a JSON {type(obj).__name__}, not the {kind.__name__} it should hold")
    return obj


def _parse(path: Path, number: int, line: str) -> dict:
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise JsonlError(f"{path}:{number}: not valid JSON ({err.msg} at column {err.colno})") from None


def read_jsonl(path: Path, while_written: bool = False) -> list[dict]:
    """One dict per line. ``while_written``: the file may be read as a running job appends to it,
    so a last line half-way through being written is left out (any other bad line still raises,
    naming the file and line)."""
    if not path.exists():
        return []
    lines = [(i, line) for i, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    rows = [_parse(path, i, line) for i, line in (lines[:-1] if while_written else lines)]
    if while_written and lines:
        try:
            rows.append(json.loads(lines[-1][1]))
        except json.JSONDecodeError:
            pass
    return rows


def cut_partial_tail(path: Path) -> str | None:
    """An append-only log whose last line is not JSON was cut off mid-write (a kill or a power loss
    during an append): that line is removed, durably, and the warning naming the file is returned
    (None when the log is whole). A bad line before the last is not an interrupted append: it raises."""
    if not path.is_file():
        return None
    text = path.read_text()
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        return None
    try:
        json.loads(lines[-1])
    except json.JSONDecodeError:
        cut = lines.pop()
        for i, line in enumerate(lines, 1):
            if line.strip():
                _parse(path, i, line)
        write_text(path, "".join(line + "\n" for line in lines), durable=True)
        return (f"WARNING: {path}: its last line ({len(cut)} characters, line {len(lines) + 1}) was cut off "
                f"mid-write by an interrupted run; removed, the {len(lines)} whole lines before it kept")
    if not text.endswith("\n"):  # a whole row whose newline was lost: the next append would join it
        write_text(path, text + "\n", durable=True)
    return None
