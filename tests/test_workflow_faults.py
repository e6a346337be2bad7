"""Faults around a job, where Snakemake acts (it deletes a job's declared outputs before it runs and
after it fails): each scenario on a copy of one finished tiny toy DAG, with a real `snakemake`.
docs/reliability.md lists them with their outcomes."""

import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest
from conftest import fault_env
from test_workflow import BIN, ROOT, snakemake, tiny_args

RUN = "results/toy/runs/toy/toyarith/hard/seed0"


@pytest.fixture
def finished(tiny_dag):
    """The tiny toy DAG, run once to the end (conftest.tiny_dag: 4 steps, a resume state after each)."""
    return tiny_dag


def _args(d: Path) -> list[str]:
    return tiny_args(d)


def _copy(finished: Path, tmp_path: Path) -> Path:
    d = tmp_path / "dag"
    shutil.copytree(finished, d, symlinks=True)
    return d


def _train_rows(path: Path) -> list[dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith("seconds")} for r in rows]


def test_a_failing_rerun_keeps_the_results_it_was_to_replace(finished, tmp_path):
    """A malformed benchmark row, then a forced rerun of the base model's evaluation: the job fails,
    the previous evaluation files are back with their provenance, and the console says where."""
    d = _copy(finished, tmp_path)
    evals = sorted((d / "results/toy/eval/toy/base/toyarith").glob("*.json"))
    before = {p: p.read_bytes() for p in evals}
    data = d / "results/toy/data/toyarith/test.jsonl"
    lines = data.read_text().splitlines()
    data.write_text("\n".join(lines) + "\n{not json\n")
    proc = snakemake(*_args(d), "--cores", "1", "--forcerun", "evaluate",
                     "results/toy/eval/toy/base/toyarith/hard_greedy.json")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"test.jsonl:{len(lines) + 1}" in out and "not valid JSON" in out  # the first error line, on the console
    assert "Restored previous version" in out
    assert {p: p.read_bytes() for p in evals} == before


def test_an_interrupted_retrain_leaves_nothing_resting_on_a_deleted_checkpoint(finished, tmp_path):
    """A forced retrain that crashes: the run's previous metrics and checkpoints are back, every table
    still audits to intact links, and the run's attempts are numbered on (1, 2; the rerun 3)."""
    d = _copy(finished, tmp_path)
    before = (d / RUN / "metrics.jsonl").read_bytes()
    # the target first (--configfile and --forcerun take every word after them): only this run retrains
    proc = snakemake(f"{RUN}/metrics.jsonl", *_args(d), "--cores", "1", "--forcerun", "train",
                     env=fault_env("crash_at_step=2"))
    assert proc.returncode != 0 and "injected crash" in proc.stdout + proc.stderr
    assert (d / RUN / "metrics.jsonl").read_bytes() == before and (d / RUN / "checkpoints/best").is_dir()
    audit = subprocess.run([str(BIN / "softtokens"), "audit", "results/toy/tables/main.md"], cwd=d,
                           capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout[-3000:]
    attempts = [json.loads(x) for x in (d / RUN / "attempts.jsonl").read_text().splitlines()]
    assert [a["attempt"] for a in attempts] == [1, 2]
    proc = snakemake(f"{RUN}/metrics.jsonl", *_args(d), "--cores", "1", "--forcerun", "train")
    assert proc.returncode == 0, proc.stderr[-3000:]
    attempts = [json.loads(x) for x in (d / RUN / "attempts.jsonl").read_text().splitlines()]
    assert [a["attempt"] for a in attempts] == [1, 2, 3] and attempts[-1]["resumed_from_step"] == 2
    assert _train_rows(d / RUN / "metrics.jsonl") == _train_rows(finished / RUN / "metrics.jsonl")


def test_a_truncated_checkpoint_is_named_before_evaluation(finished, tmp_path):
    d = _copy(finished, tmp_path)
    target = "results/toy/eval/toy/toyarith-hard-seed0/toyarith/hard_greedy.json"
    before = (d / target).read_bytes()
    weights = d / RUN / "checkpoints/best/model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    proc = snakemake(*_args(d), "--cores", "1", "--forcerun", "evaluate", target)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "checkpoint" in out and "model.safetensors has 100 bytes" in out
    assert (d / target).read_bytes() == before


def test_sigkill_of_the_whole_run_mid_training_then_a_rerun_is_bit_identical(finished, tmp_path):
    """SIGKILL to Snakemake and its jobs while a forced retrain runs, then `--unlock` and a plain rerun
    (which reruns the incomplete job; profiles/default): the run resumes from its saved step, and
    its metrics and weights equal the uninterrupted run's."""
    d = _copy(finished, tmp_path)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen([str(BIN / "snakemake"), *_args(d), "--cores", "1", "--forcerun", "train",
                             f"{RUN}/metrics.jsonl"], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = d / RUN / "_resume/latest/trainer_state.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if state.exists() and 1 <= json.loads(state.read_text() or "{}").get("step", 0) < 4:
            break
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert state.exists(), "the retrain never saved a resume state before it was killed"
    assert snakemake(*_args(d), "--unlock").returncode == 0
    rerun = snakemake(*_args(d), "--cores", "1", f"{RUN}/metrics.jsonl")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert _train_rows(d / RUN / "metrics.jsonl") == _train_rows(finished / RUN / "metrics.jsonl")
    for f in ("best/model.safetensors", "latest/model.safetensors"):
        assert (d / RUN / "checkpoints" / f).read_bytes() == (finished / RUN / "checkpoints" / f).read_bytes()


def test_outputs_are_group_readable(finished):
    """Results respect the umask (a plain open's mode), not mkstemp's 0600: a group on a shared file
    system reads them."""
    mask = os.umask(0)
    os.umask(mask)
    want = 0o444 & ~mask
    unreadable = [p for p in (finished / "results/toy").rglob("*")
                  if p.is_file() and stat.S_IMODE(p.stat().st_mode) & 0o444 != want]
    assert not unreadable, unreadable[:5]


def test_settle_removes_stale_backups_and_restores_lost_outputs(tmp_path):
    from softtokens.run.backups import settle

    whole, lost = tmp_path / "out" / "whole.json", tmp_path / "out" / "lost"
    whole.parent.mkdir()
    whole.write_text("new")
    backups = tmp_path / ".snakemake" / "backups"
    (backups / "whole.json").parent.mkdir(parents=True)
    (backups / "whole.json").write_text("old")
    (backups / "lost").mkdir()
    (backups / "lost" / "model.safetensors").write_text("weights")
    done = settle([(whole, backups / "whole.json"), (lost, backups / "lost"), (tmp_path / "x", backups / "x")])
    assert whole.read_text() == "new" and not (backups / "whole.json").exists()
    assert (lost / "model.safetensors").read_text() == "weights" and not (backups / "lost").exists()
    assert len(done) == 2
