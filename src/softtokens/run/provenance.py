"""Provenance records, so every number can be traced to the data, code and machine behind it.

A result file either embeds its record (JSON results: key ``provenance``) or sits beside a
sidecar ``<name>.prov.json`` (JSONL, tables, figures, checkpoint directories). A record names
the sha256 of each input, so ``softtokens audit`` can walk a table back to the data and say
where a link is missing or an input changed since.
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
from pathlib import Path
from typing import Any

from softtokens import __version__
from softtokens.run.files import SIDECAR_SUFFIX, sha256_path, write_json

_LIBRARIES = ("torch", "transformers", "accelerate", "snakemake", "math_verify", "datasets", "pandas")


def config_hash(config: Any) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- the record
def _git_state() -> dict:
    root = Path(__file__).resolve().parents[3]  # the checkout: src/softtokens/run/provenance.py
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


def _device() -> dict:
    """What ran the job. On a CPU, torch's kernel capability (e.g. AVX2, AVX512) is recorded too:
    the same seed gives the same numbers on one kind of host, not across vector instruction sets.
    A job that never imported torch (data, selection, tables, figures, the report) computed nothing
    with it: it ran on the CPU, and torch (~1.3 s of start-up) is not loaded just to say so."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return {"kind": "cuda", "name": torch.cuda.get_device_name(0), "count": torch.cuda.device_count()}
    capability = None if torch is None else torch.backends.cpu.get_cpu_capability()
    return {"kind": "cpu", "name": _cpu_model(), "count": os.cpu_count(), "torch_cpu_capability": capability}


def _rel(path: str | os.PathLike) -> str:
    p = Path(path).resolve()
    try:
        return p.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return p.as_posix()


class Provenance:
    """Collects one node's provenance while it runs; ``record()`` is called when it ends."""

    def __init__(self, stage: str, config: Any, inputs: dict[str, str | os.PathLike] | None = None,
                 seeds: dict | None = None, params: Any = None):
        self.stage = stage
        self.config = config
        # the settings exactly as the rule passed them: a downstream job checks it (check_expected)
        self.params_hash = None if params is None else config_hash(params)
        self.expected: dict[str, str] = {}  # upstream path -> the settings hash the config gave it (audit)
        self.seeds = seeds or {}
        self.started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self.inputs = {name: {"path": _rel(p), "sha256": sha256_path(p)} for name, p in (inputs or {}).items()
                       if p is not None and Path(p).exists()}
        self.external = {}  # inputs that are not files here (hub ids)

    def add_external(self, name: str, ref: str) -> None:
        self.external[name] = ref

    def add_input(self, name: str, path: str | os.PathLike) -> None:
        """An input found while running (a local dataset copy): hashed like the declared ones."""
        self.inputs[name] = {"path": _rel(path), "sha256": sha256_path(path)}

    def record(self, extra: dict | None = None) -> dict:
        rec = {
            "stage": self.stage,
            "softtokens_version": __version__,
            **_git_state(),
            "config": self.config,
            "config_hash": config_hash(self.config),
            "params_hash": self.params_hash,
            "expected_inputs": self.expected,
            "inputs": self.inputs,
            "external_inputs": self.external,
            "seeds": self.seeds,
            "libraries": _library_versions(),
            "device": _device(),
            "host": socket.gethostname(),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "started": self.started,
            "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        if extra:
            rec.update(extra)
        return rec

    def write_sidecar(self, result_path: str | os.PathLike, extra: dict | None = None) -> None:
        rec = self.record(extra)
        rec["output"] = {"path": _rel(result_path), "sha256": sha256_path(result_path)}
        target = Path(result_path)
        if target.is_dir():
            write_json(target / "provenance.json", rec)
        else:
            write_json(sidecar_path(target), rec)


def sidecar_path(path: str | os.PathLike) -> Path:
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
    """The provenance record of a result: embedded, directory-level or sidecar."""
    path = Path(path)
    if path.is_dir():
        p = path / "provenance.json"
        return json.loads(p.read_text()) if p.exists() else None
    side = sidecar_path(path)
    if side.exists():
        return json.loads(side.read_text())
    if path.suffix == ".json" and path.exists():
        try:
            obj = json.loads(path.read_text())
        except json.JSONDecodeError:
            return None
        if isinstance(obj, dict):
            return obj.get("provenance")
    return None


# ---------------------------------------------------------------- audit
def audit(path: str | os.PathLike, _depth: int = 0, _seen: set | None = None) -> tuple[list[str], int]:
    """Walk a result's provenance chain back to its sources.

    Returns printable lines and the number of problems found (missing record, missing input,
    or an input whose sha256 no longer matches the one recorded when the result was made)."""
    seen = _seen if _seen is not None else set()
    pad = "  " * _depth
    path = Path(path)
    lines, problems = [], 0
    key = path.resolve().as_posix()
    if key in seen:
        return [f"{pad}{_rel(path)} (see above)"], 0
    seen.add(key)
    if not path.exists():
        return [f"{pad}MISSING {_rel(path)}"], 1
    rec = read_record(path)
    if rec is None:
        return [f"{pad}{_rel(path)}: NO PROVENANCE RECORD"], 1
    code = rec.get("git_commit") or "unknown-commit"
    dirty = " (dirty)" if rec.get("git_dirty") else ""
    lines.append(f"{pad}{_rel(path)}  [{rec.get('stage')}]  code {code[:10]}{dirty} "
                 f"v{rec.get('softtokens_version')}  config {rec.get('config_hash')}  "
                 f"{rec.get('finished')}  {rec.get('device', {}).get('name')}")
    for name, ref in rec.get("external_inputs", {}).items():
        lines.append(f"{pad}  {name}: external {ref}")
    expected = rec.get("expected_inputs") or {}
    for name, inp in rec.get("inputs", {}).items():
        p = Path(inp["path"])
        if not p.exists():
            lines.append(f"{pad}  {name}: MISSING {inp['path']}")
            problems += 1
            continue
        now = sha256_path(p)
        if now != inp["sha256"]:
            lines.append(f"{pad}  {name}: CHANGED {inp['path']} (recorded {inp['sha256'][:12]}, now {now[:12]})")
            problems += 1
        want = expected.get(inp["path"]) or expected.get(p.as_posix())
        made = (read_record(p) or {}).get("params_hash")
        if want and made != want:
            lines.append(f"{pad}  {name}: STALE {inp['path']} was made with settings {made}, the config of this "
                         f"job gave it {want}")
            problems += 1
        sub, sub_problems = audit(p, _depth + 1, seen)
        lines.extend(sub)
        problems += sub_problems
    return lines, problems
