"""The tiny toy DAG, built once per test session and read by every module that needs one (test_tiny_dag,
test_dag_faults, test_dag_audit, test_crate): modules run on different pytest-xdist workers at once, so the first
to ask builds it under a file lock in the session's shared temporary directory and the others wait for it. No test
changes it: a test that changes something works on its own copy (``copy_of``)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from filelock import FileLock

from test_workflow import BIN, ROOT, TINY, snakemake, tiny_args

BUILD_TIMEOUT_S = 900


def session_dir(tmp_path_factory) -> Path:
    """A directory every worker of this session sees: the parent of the worker's own base directory under
    pytest-xdist, the base directory itself without it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def tiny_config() -> dict:
    """config.yaml's toy grid at TINY's scale, with a resume state after every step."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    grid = copy.deepcopy(config["grids"]["toy"])
    grid.update(copy.deepcopy(TINY))
    grid["rl"] = {**grid["rl"], "steps": 4, "resume_save_steps": 1}
    config["grids"] = {"toy": grid}
    return config


def built_once(tmp_path_factory, name: str, build) -> Path:
    """``build(directory)`` run once for the session; a failure is kept and reported to every later caller."""
    root = session_dir(tmp_path_factory)
    d, failed = root / name, root / f"{name}.failed"
    with FileLock(str(root / f"{name}.lock"), timeout=BUILD_TIMEOUT_S + 60):
        if failed.exists():
            pytest.fail(f"the shared {name} failed to build (another module's set-up): {failed.read_text()[-3000:]}")
        if not (d / ".built").exists():
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir()
            try:
                build(d)
            except BaseException as e:
                failed.write_text(str(e))
                raise
            (d / ".built").touch()
    return d


def _build_tiny(d: Path) -> None:
    (d / "tiny.yaml").write_text(yaml.safe_dump(tiny_config()))
    proc = snakemake(*tiny_args(d), "--cores", "2", timeout=BUILD_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-4000:]


def tiny_dag(tmp_path_factory) -> Path:
    return built_once(tmp_path_factory, "tiny_dag", _build_tiny)


def copy_of(dag: Path, tmp_path: Path) -> Path:
    """A copy of a built DAG a test may change (links copied as links; no Snakemake lock of a reader beside it)."""
    d = tmp_path / "dag"
    shutil.copytree(dag, d, symlinks=True, ignore=shutil.ignore_patterns("locks", ".built"))
    return d


# ---------------------------------------------------------------- what the tests of a DAG share
RUN = "results/toy/runs/toy/toyarith/hard/seed0"
EVAL = "results/toy/eval/toy/toyarith-hard-seed0/toyarith/hard_greedy.json"      # a cell of the main table
SAMPLE = "results/toy/eval/toy/toyarith-hard-seed0/toyarith/fuzzy_sample.json"   # another setting's, same model
LOGLIK = "results/toy/eval/toy/toyarith-hard-seed0/toychoice/loglik.json"        # out of domain
SUMMARIES = ("results/toy/tables/main.md", "results/toy/tables/main.cells.json", "results/toy/report/reproduction.md")


def args_of(d: Path) -> list[str]:
    return tiny_args(d)


def train_rows(path: Path) -> list[dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith("seconds")} for r in rows]


def bytes_of(d: Path, *files: str) -> dict:
    return {f: (d / f).read_bytes() for f in files}


def run_audit(d: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "softtokens"), "audit", *args], cwd=d, capture_output=True, text=True)


def flip(path: Path, n: int = 4000) -> None:
    """n bytes inverted in the middle of a file, its size unchanged (what a bad sector leaves)."""
    data = bytearray(path.read_bytes())
    start = len(data) // 2 - n // 2
    data[start:start + n] = bytes(b ^ 0xFF for b in data[start:start + n])
    path.write_bytes(data)


def edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=1))


def refused_rebuild(d: Path, before: dict, *names: str) -> str:
    """A plain `snakemake` after an edit: the table and report jobs refuse, naming the file; the
    summaries are as they were."""
    proc = snakemake(*args_of(d), "--cores", "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "refused to read" in out and all(n in out for n in names), out[-4000:]
    assert bytes_of(d, *SUMMARIES) == before
    return out


def rehash(path: Path, change) -> None:
    """An edit by a careful forger: the document's own hash redone (it is unkeyed: anyone can)."""
    from softtokens.store.provenance import CONTENT_HASH, content_sha256

    def both(doc):
        change(doc)
        doc["provenance"][CONTENT_HASH] = content_sha256(doc)
    edit(path, both)
