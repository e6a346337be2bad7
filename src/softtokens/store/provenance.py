"""Provenance records, so every number can be traced to the data, code and machine behind it.

Where a result's record lives is decided in one place (``record_path``), for writers and readers
alike: a JSON result embeds it (key ``provenance``, with the sha256 of the whole document less that
one hash: ``content_sha256``), a directory (a checkpoint) holds it inside (``provenance.json``), any
other file has a sidecar ``<name>.prov.json`` (with the file's sha256: ``output``). A record names the
sha256 of each input and the hash of its own config, so ``softtokens audit`` (audit.chain) can walk a
table back to the data and say where a link is missing, an input changed, or a record was edited.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from softtokens import __version__
from softtokens.store.files import DIR_RECORD, SIDECAR_SUFFIX, sha256_path, write_json

_LIBRARIES = ("torch", "transformers", "accelerate", "snakemake", "math_verify", "datasets", "pandas")


def config_hash(config: Any) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- the record
def git_state() -> dict:
    root = Path(__file__).resolve().parents[3]  # the checkout: src/softtokens/store/provenance.py
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return {"git_commit": commit or None, "git_dirty": bool(dirty) if commit else None}
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}


def _library_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for lib in _LIBRARIES:
        try:
            out[lib] = version(lib.replace("_", "-"))
        except PackageNotFoundError:
            out[lib] = None
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device() -> dict:
    """What ran the job. On a CPU, torch's kernel capability (e.g. AVX2, AVX512) is recorded too:
    the same seed gives the same numbers on one kind of host, not across vector instruction sets.
    A job that never imported torch (data, selection, tables, figures, the report) computed nothing
    with it: it ran on the CPU, and torch (~1.3 s of start-up) is not loaded just to say so."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return {"kind": "cuda", "name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count()}
    capability = None if torch is None else torch.backends.cpu.get_cpu_capability()
    # whether bf16 products ran on bf16 units or in float32 (model.cpu_bf16: the same arithmetic, another kernel)
    native = None if torch is None else bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return {"kind": "cpu", "name": _cpu_model(), "count": os.cpu_count(), "torch_cpu_capability": capability,
            "cpu_bf16_native": native}


def rel(path: str | os.PathLike) -> str:
    """How a record writes a path: relative to the job's working directory (the workflow's root, where the
    results tree starts) when under it, else absolute. Readers resolve it from the record's own root
    (record_root), never from their own working directory."""
    p = Path(os.path.abspath(path))   # as named, not through its symlinks: a linked results/ stays relative
    try:
        return p.relative_to(os.getcwd()).as_posix()
    except ValueError:
        return p.as_posix()


_rel = rel


class Provenance:
    """Collects one node's provenance while it runs; ``record()`` is called when it ends."""

    def __init__(self, stage: str, config: Any, inputs: dict[str, str | os.PathLike] | None = None,
                 seeds: dict | None = None, params: Any = None, hashed: dict | None = None):
        """``hashed``: the inputs as hashed_inputs made them already (one job writing several results)."""
        self.stage = stage
        self.config = config
        # the settings exactly as the rule passed them: a downstream job checks it (check_expected)
        self.params_hash = None if params is None else config_hash(params)
        self.expected: dict[str, str] = {}  # upstream path -> the settings hash the config gave it (audit)
        self.seeds = seeds or {}
        self.started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        # the chain's leaves: what the job read from outside the workflow (a hub model or dataset at a revision, a
        # local model directory or data copy by its content, a packaged file), checked again by audit.leaves
        self.external: dict[str, dict] = {}
        if hashed is not None:
            self.inputs = dict(hashed)
        else:   # a file no job made (it has no record: a user's own data file) is a leaf, not an input
            given = {k: v for k, v in (inputs or {}).items() if v is not None and Path(v).exists()}
            self.inputs = hashed_inputs({k: v for k, v in given.items() if _has_record(v)})
            self.external.update({k: local_leaf(v) for k, v in given.items() if not _has_record(v)})
        self._pending: dict[str, threading.Thread] = {}

    def add_external(self, name: str, ref: str) -> None:
        """A leaf on the hub, by the reference its reader gave (the dataset's hub id, split and revision)."""
        self.external[name] = {"kind": "hub", "ref": ref}

    def add_leaf(self, name: str, leaf: dict) -> None:
        self.external[name] = leaf

    def leaves(self) -> dict[str, dict]:
        """Every leaf, the ones hashed in the background included (joined here)."""
        self._join()
        return dict(self.external)

    def add_leaves(self, leaves: dict[str, dict]) -> None:
        self.external.update(leaves)

    def add_local_leaf(self, name: str, path: str | os.PathLike, background: bool = False) -> None:
        """A file or directory read from outside the workflow, recorded by its content (local_leaf). ``background``:
        hashed beside the job's work (a model directory of several GB), joined before the record is made."""
        if not background:
            self.external[name] = local_leaf(path)
            return

        def run():
            self.external[name] = local_leaf(path)

        self._pending[name] = threading.Thread(target=run, name=f"leaf-{name}", daemon=True)
        self._pending[name].start()

    def _join(self) -> None:
        for name, thread in list(self._pending.items()):
            thread.join()
            if name not in self.external:
                raise RuntimeError(f"hashing the leaf {name!r} failed (see the traceback above)")
            del self._pending[name]

    def record(self, extra: dict | None = None) -> dict:
        self._join()
        rec = {
            "stage": self.stage,
            "softtokens_version": __version__,
            **git_state(),
            "config": self.config,
            "config_hash": config_hash(self.config),
            "params_hash": self.params_hash,
            "expected_inputs": self.expected,
            "inputs": self.inputs,
            "external_inputs": self.external,
            "seeds": self.seeds,
            "libraries": _library_versions(),
            "device": device(),
            "workdir": os.getcwd(),
            "host": socket.gethostname(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "started": self.started,
            "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        if extra:
            rec.update(extra)
        return rec

    def write_sidecar(self, result_path: str | os.PathLike, extra: dict | None = None,
                      sha256: str | None = None, outputs: list | None = None) -> None:
        """The record of a file or a directory, where record_path puts it, with the output's sha256
        (``sha256``: already computed, e.g. from a checkpoint's manifest: model.checkpoint) and the
        job's whole output set (``outputs``: a table's md, tex, csv, html and cells.json), so that
        the audit of any one of them misses none."""
        rec = self.record(extra)
        rec["output"] = {"path": rel(result_path), "sha256": sha256 or sha256_path(result_path)}
        if outputs:
            rec["outputs"] = [_rel(o) for o in outputs]
        write_json(record_path(result_path), rec)

    def embedded(self, result: dict, path: str | os.PathLike, extra: dict | None = None) -> dict:
        """``result`` with this record embedded, and the document's own hash in it (embed); ``path``: where it
        is written (the record says where, so that a reader finds the record's root from the file: record_root,
        and a file copied over another is told by its place)."""
        return embed(result, {**self.record(extra), OWN_PATH: rel(path)})


def hashed_inputs(inputs: dict[str, str | os.PathLike | None]) -> dict[str, dict]:
    """Each input that exists, by path and sha256: what a record holds of the job outputs it was made from."""
    return {name: {"path": _rel(p), "sha256": sha256_path(p)} for name, p in inputs.items()
            if p is not None and Path(p).exists()}


def _has_record(path: str | os.PathLike) -> bool:
    """Whether a job made ``path`` (it carries a record), cheaply: a JSON file is taken to embed its own (an
    evaluation file is megabytes; the audit reads it in full)."""
    path = Path(path)
    return path.suffix == ".json" or record_path(path).is_file()


def local_leaf(path: str | os.PathLike) -> dict:
    """A leaf read from this machine's disk: where, and the sha256 of its bytes (a directory: of every file in it)."""
    return {"kind": "local", "path": _rel(path), "sha256": sha256_path(path)}


def hub_leaf(repo: str, revision: str | None) -> dict:
    """A leaf on the Hugging Face hub: its id and the commit whose files were read (None: not known)."""
    return {"kind": "hub", "id": repo, "revision": revision}


def made_by_workflow(path: str | os.PathLike) -> bool:
    """Whether a path is a job's output (it carries a record: a built base model, a prepared data file) rather
    than a leaf read from outside (a local model directory, a local data copy)."""
    return read_record(path) is not None


CONTENT_HASH = "content_sha256"   # in an embedded record: the sha256 of the document without this field
OWN_PATH = "path"                  # in an embedded record: where its job wrote the document (rel)


def content_sha256(document: dict) -> str:
    """The hash a JSON result's embedded record holds of the whole document (its numbers, its
    per-problem rows and the record itself), less that hash: any edit of the file changes it."""
    doc = dict(document)
    rec = doc.get("provenance")
    if isinstance(rec, dict):
        doc["provenance"] = {k: v for k, v in rec.items() if k != CONTENT_HASH}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def embed(result: dict, record: dict) -> dict:
    """A JSON result with its record embedded (key ``provenance``) and stamped with content_sha256."""
    doc = {**result, "provenance": record}
    doc["provenance"] = {**record, CONTENT_HASH: content_sha256(doc)}
    return doc


def record_path(path: str | os.PathLike) -> Path:
    """Where the provenance record of ``path`` lives: inside a directory (provenance.json), inside a
    JSON result that embeds one (the file itself: a sidecar beside it is never read, and is an error,
    record_conflict), else the sidecar <name>.prov.json. The one rule writers (write_sidecar) and
    readers (read_record, train.selection) follow."""
    path = Path(path)
    if path.is_dir():
        return path / DIR_RECORD
    if path.suffix == ".json" and _embeds_record(path):
        return path
    return path.with_name(path.name + SIDECAR_SUFFIX)


def record_conflict(path: str | os.PathLike) -> str | None:
    """Two records for one file: a JSON result that embeds its record with a sidecar beside it. Once, a sidecar
    copied from the embedded record (its hash filled in for an edited file) switched every check of the file off."""
    path = Path(path)
    side = path.with_name(path.name + SIDECAR_SUFFIX)
    if path.suffix == ".json" and side.exists() and _embeds_record(path):
        return (f"TWO RECORDS {path}: it embeds its record and {side} beside it is another; one record per file: "
                "the embedded one is the file's, remove the sidecar")
    return None


def _embeds_record(path: Path) -> bool:
    try:
        obj = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(obj, dict) and isinstance(obj.get("provenance"), dict)


def sidecar_path(path: str | os.PathLike) -> Path:
    """The sidecar of a file that does not embed its record (record_path for any path)."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


class StaleInput(RuntimeError):
    """An upstream output was made from other settings than the current config gives it."""


def expected_map(expected: list[str]) -> dict[str, str]:
    """'PATH=HASH' items -> {path: hash} (recorded in the consumer's provenance for the audit)."""
    return {_rel(path): want for path, _, want in (item.rpartition("=") for item in expected)}


def check_expected(expected: list[str]) -> dict[str, str]:
    """Refuse upstream outputs made from other settings than the current config's. ``expected``:
    'PATH=HASH' items, HASH the config_hash of the settings the workflow would give the job that
    makes PATH now. Why: Snakemake remakes an output whose rule parameters changed only if its
    metadata survived; after an interrupted run it may not have, and a stale base model or data
    set was once reused silently."""
    for item in expected:
        path, _, want = item.rpartition("=")
        rec = read_record(path)
        if rec is None:
            raise StaleInput(f"{path} has no provenance record: it cannot be checked against the current config; "
                             "remake it (snakemake --forcerun on the rule that makes it, or delete it)")
        got = rec.get("params_hash")
        if got != want:
            raise StaleInput(
                f"{path} was made by {rec.get('stage')} with settings {got}, but the current config gives "
                f"{want}: it is stale. Remake it: `snakemake --forcerun {rec.get('stage')}` (or delete it and rerun)")
    return expected_map(expected)  # recorded by the job that checked them (Provenance.expected)


def read_record(path: str | os.PathLike) -> dict | None:
    """The provenance record of a result, from where record_path says it lives (None: it has none,
    or it cannot be read)."""
    where = record_path(path)
    if not where.is_file():
        return None
    try:
        obj = json.loads(where.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict):
        return None
    return obj.get("provenance") if where == Path(path) else obj


# ---------------------------------------------------------------- reading a record's paths
def own_path(rec: dict) -> str | None:
    """Where the record says its job wrote the file it describes (an embedded record's OWN_PATH, a sidecar's or a
    directory's ``output.path``); None in records written before they said so."""
    return rec.get(OWN_PATH) if isinstance(rec.get(OWN_PATH), str) else (rec.get("output") or {}).get("path")


def record_root(path: str | os.PathLike, rec: dict) -> Path | None:
    """The directory the paths of ``path``'s record are relative to, found from the file itself: its location less
    the path its job wrote it as (so a tree copied or moved elsewhere, or audited from another directory, reads
    the same). None where the file is not where its record says it was written (moved inside the tree, or copied
    over another file: placement_problem names it). Records written before they named their own path: the
    reader's working directory, as they were read then."""
    here = Path(os.path.abspath(path))
    own = own_path(rec)
    if not own:
        return Path.cwd()
    own_p = Path(own)
    if own_p.is_absolute():
        workdir = rec.get("workdir")
        if here == own_p:
            return Path(workdir) if workdir else Path.cwd()
        if not workdir or not own_p.is_relative_to(workdir):
            return None
        own_p = own_p.relative_to(workdir)
    parts = own_p.parts
    if len(here.parts) <= len(parts) or here.parts[-len(parts):] != parts:
        return None
    return Path(*here.parts[: -len(parts)])


def placement_problem(path: str | os.PathLike, rec: dict) -> str | None:
    """A file that is not where its job wrote it: copied over another result (a seed's file over another's, one
    setting's over another's) or moved inside the tree. None where it is in place (or its record is too old to say)."""
    if record_root(path, rec) is not None:
        return None
    return (f"NOT WHERE IT WAS WRITTEN {path}: its record says its job wrote it as {own_path(rec)} (a copy of "
            "another result, or a file moved inside the tree)")


def at_root(root: Path | None, recorded: str | os.PathLike) -> Path:
    """A path a record holds, as it is on this machine now: relative ones from the record's root (record_root)."""
    p = Path(recorded)
    if p.is_absolute() or root is None or os.path.abspath(root) == os.getcwd():
        return p   # read from the root itself: as recorded (and as every message names it)
    return root / p
