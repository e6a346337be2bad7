"""Faults around a job of the tiny toy DAG, where Snakemake acts (it deletes a job's declared outputs before it runs
and after it fails): failed and interrupted reruns, killed jobs, damaged, swapped, malformed and pickled inputs, each
on a copy of the session's DAG (tests/shared_dag.py). docs/reliability.md lists the faults with their outcomes."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import fault_env
from shared_dag import (
    EVAL,
    RUN,
    SUMMARIES,
    args_of,
    bytes_of,
    copy_of,
    edit,
    flip,
    refused_rebuild,
    run_audit,
    train_rows,
)
from test_workflow import BIN, ROOT, snakemake


@pytest.mark.slow
def test_a_failing_rerun_keeps_the_results_it_was_to_replace(dag, tmp_path):
    """A malformed benchmark row, then a forced rerun of the base model's evaluation: the job fails,
    the previous evaluation files are back with their provenance, and the console says where."""
    d = copy_of(dag, tmp_path)
    evals = sorted((d / "results/toy/eval/toy/base/toyarith").glob("*.json"))
    before = {p: p.read_bytes() for p in evals}
    data = d / "results/toy/data/toyarith/test.jsonl"
    lines = data.read_text().splitlines()
    data.write_text("\n".join(lines) + "\n{not json\n")
    proc = snakemake(*args_of(d), "--cores", "1", "-f", "results/toy/eval/toy/base/toyarith/hard_greedy.json")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"test.jsonl:{len(lines) + 1}" in out and "not valid JSON" in out  # the first error line, on the console
    assert "Restored previous version" in out
    assert {p: p.read_bytes() for p in evals} == before


@pytest.mark.slow
def test_an_interrupted_retrain_leaves_nothing_resting_on_a_deleted_checkpoint(dag, tmp_path):
    """A forced retrain that crashes: the run's previous metrics and checkpoints are back, every table
    still audits to intact links, and the run's attempts are numbered on (1, 2; the rerun 3)."""
    d = copy_of(dag, tmp_path)
    before = (d / RUN / "metrics.jsonl").read_bytes()
    # the target first (--configfile and --forcerun take every word after them): only this run retrains
    proc = snakemake(f"{RUN}/metrics.jsonl", *args_of(d), "--cores", "1", "--forcerun", "train",
                     env=fault_env("crash_at_step=2"))
    assert proc.returncode != 0 and "injected crash" in proc.stdout + proc.stderr
    assert (d / RUN / "metrics.jsonl").read_bytes() == before and (d / RUN / "checkpoints/best").is_dir()
    audit = subprocess.run([str(BIN / "softtokens"), "audit", "results/toy/tables/main.md"], cwd=d,
                           capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout[-3000:]
    attempts = [json.loads(x) for x in (d / RUN / "attempts.jsonl").read_text().splitlines()]
    assert [a["attempt"] for a in attempts] == [1, 2]
    proc = snakemake(f"{RUN}/metrics.jsonl", *args_of(d), "--cores", "1", "--forcerun", "train")
    assert proc.returncode == 0, proc.stderr[-3000:]
    attempts = [json.loads(x) for x in (d / RUN / "attempts.jsonl").read_text().splitlines()]
    assert [a["attempt"] for a in attempts] == [1, 2, 3] and attempts[-1]["resumed_from_step"] == 2
    assert train_rows(d / RUN / "metrics.jsonl") == train_rows(dag / RUN / "metrics.jsonl")


@pytest.mark.slow
def test_a_job_killed_as_the_oom_killer_kills_says_so_on_the_console_and_in_its_log(dag, tmp_path):
    """SIGKILL inside a training job (what the kernel's OOM killer does: exit 137, nothing flushed): the console
    and the job's log name it as most likely out of memory, with what the job declared and what the machine has;
    the run's previous results are back."""
    d = copy_of(dag, tmp_path)
    before = (d / RUN / "metrics.jsonl").read_bytes()
    proc = snakemake(f"{RUN}/metrics.jsonl", *args_of(d), "--cores", "1", "--forcerun", "train",
                     env=fault_env("sigkill_at_step=1"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "injected SIGKILL before step 2" in out
    said = next(line for line in out.splitlines() if "was killed by SIGKILL (exit status 137)" in line)
    assert "most likely out of memory" in said and "it declared mem_mb=" in said and "this machine has" in said
    assert "was killed by SIGKILL" in (d / "results/toy/logs/train/toy/toyarith/hard/seed0.log").read_text()
    assert (d / RUN / "metrics.jsonl").read_bytes() == before


@pytest.mark.slow
def test_swapped_best_checkpoints_are_refused_before_anything_is_written_naming_both_runs(dag, tmp_path):
    """Two runs' best checkpoints swapped (each a whole checkpoint: its manifest and record valid for its bytes): the
    forced evaluation of one cell and its run's selection refuse before writing, naming the run and where the
    checkpoint came from; the cell's file is unchanged; the audit names it too."""
    d = copy_of(dag, tmp_path)
    fuzzy = RUN.replace("/hard/", "/fuzzy/")
    a, b = d / RUN / "checkpoints/best", d / fuzzy / "checkpoints/best"
    a.rename(d / "aside")
    b.rename(a)
    (d / "aside").rename(b)
    # and the runs' own records of their checkpoints made to agree with the swap (what a forger edits next)
    from softtokens.model.checkpoint import manifest_sha256

    for run in (RUN, fuzzy):
        ckpt = d / run / "checkpoints"
        edit(ckpt / "provenance.json", lambda rec, c=ckpt: rec["output"].update(
            {"sha256": manifest_sha256(c, ("best", "latest"))}))
    cell = "results/toy/eval/toy/toyarith-hard-seed0/toyarith/hard_greedy.json"
    before = (d / cell).read_bytes()
    proc = snakemake(cell, *args_of(d), "--cores", "1", "--forcerun", cell)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"is not run {RUN}'s" in out, out[-3000:]
    assert f"its training wrote it as {fuzzy}/checkpoints/best" in out and "fuzzy run, seed 0" in out
    assert (d / cell).read_bytes() == before
    proc = snakemake(f"{RUN}/selected.json", *args_of(d), "--cores", "1", "--forcerun", f"{RUN}/selected.json")
    assert proc.returncode != 0 and f"is not run {RUN}'s" in proc.stdout + proc.stderr
    audit = run_audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and "NOT ITS RUN'S" in audit.stdout and fuzzy in audit.stdout


def test_a_truncated_checkpoint_is_named_before_evaluation(dag, tmp_path):
    d = copy_of(dag, tmp_path)
    target = "results/toy/eval/toy/toyarith-hard-seed0/toyarith/hard_greedy.json"
    before = (d / target).read_bytes()
    weights = d / RUN / "checkpoints/best/model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    proc = snakemake(*args_of(d), "--cores", "1", target, "--forcerun", "evaluate")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "checkpoint" in out and "model.safetensors has 100 bytes" in out
    assert (d / target).read_bytes() == before


def test_sigkill_of_the_whole_run_mid_training_then_a_rerun_is_bit_identical(dag, tmp_path):
    """SIGKILL to Snakemake and its jobs while a forced retrain runs, then `--unlock` and a plain rerun
    (which reruns the incomplete job; profiles/default): the run resumes from its saved step, and
    its metrics and weights equal the uninterrupted run's."""
    d = copy_of(dag, tmp_path)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen([str(BIN / "snakemake"), *args_of(d), "--cores", "1", f"{RUN}/metrics.jsonl",
                             "--forcerun", "train"], cwd=ROOT, env=env, start_new_session=True,
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
    assert snakemake(*args_of(d), "--unlock").returncode == 0
    rerun = snakemake(*args_of(d), "--cores", "1", f"{RUN}/metrics.jsonl")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert train_rows(d / RUN / "metrics.jsonl") == train_rows(dag / RUN / "metrics.jsonl")
    for f in ("best/model.safetensors", "latest/model.safetensors"):
        assert (d / RUN / "checkpoints" / f).read_bytes() == (dag / RUN / "checkpoints" / f).read_bytes()


@pytest.mark.slow
def test_a_checkpoint_with_flipped_bytes_is_refused_wherever_it_is_read(dag, tmp_path):
    """4,000 bytes flipped inside the selected checkpoint, size unchanged: the evaluation and the
    selection refuse it naming the file, every earlier output stays as it was, the audit fails."""
    d = copy_of(dag, tmp_path)
    weights = d / RUN / "checkpoints/best/model.safetensors"
    selected = f"{RUN}/selected.json"
    before = bytes_of(d, EVAL, selected, *SUMMARIES)
    flip(weights)
    proc = snakemake(*args_of(d), "--cores", "1", "-f", EVAL)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"{weights.relative_to(d)} has other bytes than were written" in out, out[-3000:]
    proc = snakemake(*args_of(d), "--cores", "1", "-f", selected)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "has other bytes than were written" in out, out[-3000:]
    assert bytes_of(d, EVAL, selected, *SUMMARIES) == before
    audit = run_audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and "DAMAGED" in audit.stdout and "model.safetensors" in audit.stdout


@pytest.mark.slow
def test_malformed_files_are_named_in_one_line_wherever_they_are_read(dag, tmp_path):
    """A truncated evaluation file (audit, status, the table job), 300 random bytes in a selected.json (the evaluation
    job), an empty file and a JSON of the wrong type: one line naming the file, no traceback, nothing overwritten."""
    import random

    d = copy_of(dag, tmp_path)
    before = bytes_of(d, *SUMMARIES)
    text = (d / EVAL).read_text()
    (d / EVAL).write_text(text[: len(text) // 2])
    audit = run_audit(d, "results/toy/tables/main.md")
    said = audit.stdout + audit.stderr
    assert audit.returncode == 1 and "Traceback" not in said and f"MALFORMED {EVAL}" in said, said[-3000:]
    status = subprocess.run([str(BIN / "softtokens"), "status", "--config", "tiny.yaml"], cwd=d, capture_output=True,
                            text=True)
    assert "Traceback" not in status.stdout + status.stderr and f"failed: {EVAL} (MALFORMED" in status.stdout
    out = refused_rebuild(d, before, f"MALFORMED {EVAL}")
    assert "Traceback" not in out
    (d / EVAL).write_text(text)
    selected = d / RUN / "selected.json"
    selected.write_bytes(random.Random(0).randbytes(300))
    proc = snakemake(*args_of(d), "--cores", "1", "-f", EVAL)
    logged = proc.stdout + proc.stderr   # the failed job's log, shown on the console (profiles/default)
    assert proc.returncode != 0 and f"{RUN}/selected.json: binary bytes, not JSON text" in logged, logged[-2000:]
    assert "Traceback" not in logged
    for content, what in (("", "empty"), ("[1, 2]", "a JSON list, not the dict")):
        (d / EVAL).write_text(content)
        audit = run_audit(d, EVAL)
        assert audit.returncode == 1 and what in audit.stdout and "Traceback" not in audit.stdout + audit.stderr


def test_a_pickled_weights_file_is_refused_before_it_is_opened(dag, tmp_path):
    """The selected checkpoint's weights replaced by a pickle that runs code on load, the manifest, the checkpoint's
    record and the run's rehashed (a careful forger): the evaluation refuses it, naming the file, before anything
    reads it: the code never runs. The honest twin: the real checkpoint evaluates (test_tiny_dag_end_to_end)."""
    import pickle

    from softtokens.model.checkpoint import TrainerState, manifest_sha256

    class Payload:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "pwned",))

    d = copy_of(dag, tmp_path)
    best = d / RUN / "checkpoints/best"
    (best / "model.safetensors").unlink()
    (best / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(), protocol=4))
    record = (best / "provenance.json").rename(tmp_path / "provenance.json")   # as training writes: manifest first
    TrainerState.read(best).write(best)   # the manifest redone over the new file
    record.rename(best / "provenance.json")
    edit(best / "provenance.json", lambda rec: rec["output"].update({"sha256": manifest_sha256(best)}))
    proc = snakemake(*args_of(d), "--cores", "1", "-f", EVAL)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "pytorch_model.bin is a pickle" in log, log[-3000:]
    assert not (tmp_path / "pwned").exists()
    audit = run_audit(d, EVAL)
    assert audit.returncode == 1 and "pytorch_model.bin is a pickle" in audit.stdout


