"""Faults a cluster run meets, each reproduced here on CPU (one process): SIGKILL at a random
step, SIGTERM (scancel, preemption, SLURM's time-limit warning), a crash while writing a
checkpoint, a truncated or missing resume file, a NaN loss. After each, the rerun ends where
an uninterrupted run ends, bit for bit: the same metrics (less wall-clock timings) and the same
checkpoint bytes. docs/reliability.md lists every fault and its outcome.

The faulted run is a process of its own (signalled, or crashed by tests/faults); the reruns and the
uninterrupted run it is compared with are the same CLI called in this process (one thread, as the
child's OMP_NUM_THREADS=1), which saves an interpreter, torch and transformers start-up per run."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import fault_env, identified

from softtokens.config.grids import PAPER_RL
from softtokens.train.config import TrainConfig
from softtokens.train.loop import Trainer
from softtokens.train.update import NonFiniteUpdate

# a run's resolved settings, as the workflow hands them to the job: every key (grid.jobs)
SETTINGS = dict(PAPER_RL, mode="fuzzy", seed=4, lr=1e-3, prompts_per_step=2, samples_per_prompt=4, steps=6, warmup_steps=1,
                cot_max_tokens=10, answer_max_tokens=4, val_every=3, val_size=6, micro_batch_size=4,
                compute_dtype="float32", resume_save_steps=1)
TIMINGS = ("seconds_rollout", "seconds_reward", "seconds_update")




def train_cmd(base: Path, out: Path, settings: dict = SETTINGS) -> list[str]:
    return [sys.executable, "-m", "softtokens", "train", "--settings", json.dumps(settings), "--base",
            str(base / "model"), "--train", str(base / "train.jsonl"), "--validation", str(base / "validation.jsonl"),
            "--state-dir", str(out / "_resume"), "--checkpoints", str(out / "checkpoints"), "--metrics",
            str(out / "metrics.jsonl")]


def run(base, out, fault=None, settings=SETTINGS):
    """The training command in a process of its own, meeting ``fault`` (tests/faults)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(train_cmd(base, out, settings), capture_output=True, text=True, timeout=600,
                          env=fault_env(fault, env) if fault else env)


def run_here(base, out, capsys) -> str:
    """The same command, no fault, in this process (cli.main, --threads 1): what it printed."""
    from softtokens.cli import main

    capsys.readouterr()
    assert main(train_cmd(base, out)[3:]) == 0  # less the interpreter, "-m softtokens"
    done = capsys.readouterr()
    return done.out + done.err


def outcome(out: Path) -> tuple[list[dict], dict[str, bytes]]:
    """What a finished run produced, less what a clock measures."""
    metrics = [{k: v for k, v in json.loads(line).items() if k not in TIMINGS}
               for line in (out / "metrics.jsonl").read_text().splitlines()
               if json.loads(line)["kind"] != "resume"]  # what a resume fell back to: not training
    files = {str(p.relative_to(out / "checkpoints")): p.read_bytes()
             for p in sorted((out / "checkpoints").rglob("*"))
             if p.is_file() and p.name not in ("trainer_state.json", "provenance.json")}  # paths, clock times
    states = {n: {k: v for k, v in json.loads((out / "checkpoints" / n / "trainer_state.json").read_text()).items()
                  if k not in ("files",)} for n in ("best", "latest")}
    return metrics, {**files, "states": json.dumps(states, sort_keys=True).encode()}


def assert_same(got, want, what=""):
    assert got[0] == want[0], f"{what}: metrics differ"
    assert got[1].keys() == want[1].keys(), f"{what}: {sorted(set(got[1]) ^ set(want[1]))}"
    for name in want[1]:
        assert got[1][name] == want[1][name], f"{what}: {name} differs"


@pytest.fixture(scope="module")
def straight(base, tmp_path_factory):
    from softtokens.cli import main

    out = tmp_path_factory.mktemp("straight")
    assert main(train_cmd(base, out)[3:]) == 0
    return outcome(out)


def _steps_done(out: Path) -> int:
    f = out / "_resume" / "metrics.jsonl"
    if not f.exists():
        return 0
    return sum('"kind": "train"' in line for line in f.read_text().splitlines())


def _kill_at(base, out, step: int, sig) -> subprocess.Popen:
    """Start the run and send ``sig`` once ``step`` training steps are logged."""
    proc = subprocess.Popen(train_cmd(base, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 300
    while _steps_done(out) < step and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    proc.wait(timeout=120)
    return proc


@pytest.mark.slow
def test_sigkill_at_a_random_step_then_rerun_equals_an_uninterrupted_run(base, tmp_path, straight, capsys):
    step = random.Random(os.getpid()).randint(1, SETTINGS["steps"] - 1)
    killed = _kill_at(base, tmp_path, step, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL, f"killed at step {step}: {killed.stdout.read()[-2000:]}"
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing declared was left half-made
    assert "=== attempt 2" in run_here(base, tmp_path, capsys)
    assert_same(outcome(tmp_path), straight, f"killed at step {step}")


@pytest.mark.slow
def test_sigterm_saves_the_resume_state_and_the_rerun_equals_an_uninterrupted_run(base, tmp_path, straight,
                                                                                  capsys):
    termed = _kill_at(base, tmp_path, 2, signal.SIGTERM)
    text = termed.stdout.read()
    assert termed.returncode != 0 and "SIGTERM received: resume state saved at step" in text, text[-2000:]
    saved = json.loads((tmp_path / "_resume" / "latest" / "trainer_state.json").read_text())["step"]
    assert saved >= 2  # the step in flight finished and was saved, not lost
    assert f"resumed from step {saved}" in run_here(base, tmp_path, capsys)
    assert_same(outcome(tmp_path), straight)
    attempts = json.loads(Path(str(tmp_path / "metrics.jsonl") + ".prov.json").read_text())["attempts"]
    assert [a["resumed_from_step"] for a in attempts] == [0, saved]


@pytest.mark.slow
def test_a_crash_while_writing_a_checkpoint_resumes_from_the_previous_one(base, tmp_path, straight, capsys):
    r = run(base, tmp_path, fault="crash_in_save=4")
    assert r.returncode != 0 and "injected crash while writing the latest checkpoint of step 4" in r.stderr
    assert json.loads((tmp_path / "_resume" / "latest" / "trainer_state.json").read_text())["step"] == 3
    assert "resumed from step 3" in run_here(base, tmp_path, capsys)
    assert_same(outcome(tmp_path), straight)


@pytest.mark.parametrize("phase", ["staged", "files", "sealed", "retired"])
@pytest.mark.slow
def test_a_kill_during_a_background_save_resumes_bit_identically_from_the_last_complete_one(base, tmp_path, straight,
                                                                                            phase, capsys):
    """The resume state is written by a background thread while training goes on (train.resume): a SIGKILL at
    each point of that write leaves a complete save to resume from, never the half-written one."""
    r = run(base, tmp_path, fault=f"kill_in_save=4:{phase}")
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    assert f"injected SIGKILL in the latest save of step 4: {phase}" in r.stderr
    tmp = tmp_path / "_resume" / ".latest.tmp"
    assert tmp.is_dir()   # the save in flight was cut: it is not what the run resumes from
    assert (tmp / "trainer_state.json").exists() == (phase in ("sealed", "retired"))
    printed = run_here(base, tmp_path, capsys)
    assert "resumed from step 3" in printed, printed[-2000:]
    assert_same(outcome(tmp_path), straight, f"killed in the step-4 save at {phase}")


@pytest.mark.slow
def test_a_kill_after_the_last_steps_save_finishes_from_it_training_no_step(base, tmp_path, straight, capsys):
    """The last step's save holds its weights alone (no step follows it; finish drops the resume state): a run
    killed between that save and finish trains no step again, and ends as an uninterrupted run, bit for bit."""
    r = run(base, tmp_path, fault="sigkill_in_finish")
    assert r.returncode == -signal.SIGKILL and "injected SIGKILL before finish" in r.stderr, r.stderr[-3000:]
    latest = tmp_path / "_resume" / "latest"
    assert json.loads((latest / "trainer_state.json").read_text())["step"] == SETTINGS["steps"]
    assert not (latest / "optimizer").exists() and not (latest / "scheduler.json").exists()
    assert (tmp_path / "_resume" / "previous" / "optimizer").is_dir()   # the step before it: a full resume state
    rows = {s: [json.loads(x) for x in (base / f"{s}.jsonl").read_text().splitlines()] for s in ("train", "validation")}
    longer = TrainConfig.from_settings(dict(SETTINGS, steps=SETTINGS["steps"] + 2))   # a run that cannot go on from it
    said = r"latest/optimizer: no optimizer state to resume from: .* \(remove .*_resume to train from step 0"
    with pytest.raises(FileNotFoundError, match=said):
        Trainer(longer, str(base / "model"), rows["train"], rows["validation"], tmp_path / "_resume")
    printed = run_here(base, tmp_path, capsys)
    assert f"resumed from step {SETTINGS['steps']}" in printed, printed[-2000:]
    assert_same(outcome(tmp_path), straight)


@pytest.fixture(scope="module")
def crashed(base, tmp_path_factory):
    """A run crashed before step 5, its resume state saved at step 4 (each damage below on a copy)."""
    out = tmp_path_factory.mktemp("crashed")
    r = run(base, out, fault="crash_at_step=4")
    assert r.returncode != 0 and "injected crash before step 5" in r.stderr, r.stderr[-3000:]
    return out


def damage_checkpoint(checkpoint: Path, damage: str) -> None:
    """What a disk, a power loss or a hand can do to a saved checkpoint (sizes kept where they say so)."""
    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if damage == "truncate":
        weights.write_bytes(data[:1000])
    elif damage == "delete":
        weights.unlink()
    elif damage == "garble_state":
        (checkpoint / "trainer_state.json").write_text('{"step": 4, "best')
    elif damage == "flip_bytes":         # 4,000 bytes inverted past the header, size unchanged
        start = len(data) // 2
        data[start:start + 4000] = bytes(b ^ 0xFF for b in data[start:start + 4000])
        weights.write_bytes(data)
    elif damage == "zeros":              # a power loss's zeros (64 KiB, or the file's second half), size unchanged
        n = min(64 * 1024, len(data) // 2)
        data[len(data) - n:] = bytes(n)
        weights.write_bytes(data)
    else:
        raise ValueError(damage)


DAMAGES = ["truncate", "delete", "garble_state", "flip_bytes", "zeros"]


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.slow
def test_a_damaged_resume_state_falls_back_to_the_previous_complete_save(base, tmp_path, straight, crashed, damage,
                                                                         capsys):
    shutil.copytree(crashed, tmp_path, dirs_exist_ok=True)
    damage_checkpoint(tmp_path / "_resume" / "latest", damage)
    text = run_here(base, tmp_path, capsys)
    assert "falling back to the previous complete save (step 3)" in text and "resumed from step 3" in text, text
    assert "_resume/latest" in text   # the save refused, named
    assert_same(outcome(tmp_path), straight)   # never trained on the damaged state
    resume = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()
              if json.loads(x)["kind"] == "resume"]
    assert [(r["step"], r["state"]) for r in resume] == [(3, "previous")] and "latest" in resume[0]["reason"]
    assert list(tmp_path.glob("_resume.unusable-*/latest"))  # kept aside for a look, not deleted


@pytest.mark.parametrize("damage", ["flip_bytes", "truncate"])
@pytest.mark.slow
def test_with_every_save_damaged_the_run_starts_again(base, tmp_path, straight, crashed, damage, capsys):
    shutil.copytree(crashed, tmp_path, dirs_exist_ok=True)
    for generation in ("latest", "previous"):
        damage_checkpoint(tmp_path / "_resume" / generation, damage)
    text = run_here(base, tmp_path, capsys)
    assert "resume state not used" in text and "fresh start at step 0" in text
    assert_same(outcome(tmp_path), straight)
    assert list(tmp_path.glob("_resume.unusable-*"))  # kept aside for a look, not deleted


@pytest.mark.slow
def test_a_damaged_best_checkpoint_falls_back_with_the_save_it_goes_with(base, tmp_path, straight, crashed, capsys):
    """The best checkpoint the newest save goes with is damaged: that save is not used either."""
    shutil.copytree(crashed, tmp_path, dirs_exist_ok=True)
    state = json.loads((tmp_path / "_resume" / "latest" / "trainer_state.json").read_text())
    previous = json.loads((tmp_path / "_resume" / "previous" / "trainer_state.json").read_text())
    assert state["best_step"] is not None
    damage_checkpoint(tmp_path / "_resume" / f"best-step{state['best_step']:06d}", "flip_bytes")
    text = run_here(base, tmp_path, capsys)
    if previous["best_step"] == state["best_step"]:   # both saves rest on it: a fresh start
        assert "fresh start at step 0" in text
    else:
        assert "falling back to the previous complete save" in text
    assert_same(outcome(tmp_path), straight)


@pytest.mark.slow
def test_a_log_line_cut_mid_write_is_removed_with_a_warning(base, tmp_path, straight, crashed, capsys):
    """A kill during an append leaves half a row at the end of the metrics log: the resume cuts it,
    naming the file, and goes on (it once stopped every retry with a JSONDecodeError naming nothing)."""
    shutil.copytree(crashed, tmp_path, dirs_exist_ok=True)
    log = tmp_path / "_resume" / "metrics.jsonl"
    log.write_text(log.read_text() + '{"kind": "train", "step": 5, "rew')
    text = run_here(base, tmp_path, capsys)
    assert f"WARNING: {log}: its last line" in text and "cut off mid-write" in text
    assert_same(outcome(tmp_path), straight)


def test_a_nan_loss_stops_the_run_naming_the_step_and_keeps_the_last_good_state(base, toy_rows, tmp_path,
                                                                                 monkeypatch):
    cfg = TrainConfig.from_settings(SETTINGS)
    trainer = Trainer(cfg, str(base / "model"), toy_rows["train"], toy_rows["validation"], tmp_path / "_resume")
    import softtokens.train.head_loss as head_loss

    real = head_loss.fused_replay_loss  # the update pass's loss (train.update passes the RLOO row weights)
    calls = {"n": 0}

    def poisoned(*args):
        calls["n"] += 1
        loss, parts = real(*args)
        return (loss * float("nan") if calls["n"] > 4 else loss), parts  # 2 micro-batches a step: step 3 turns NaN
    monkeypatch.setattr(head_loss, "fused_replay_loss", poisoned)
    with pytest.raises(NonFiniteUpdate, match=r"step 3: the loss is not finite .* last good state .* \(step 2\)"):
        trainer.run()
    state = json.loads((tmp_path / "_resume" / "latest" / "trainer_state.json").read_text())
    assert state["step"] == 2
    assert [m["step"] for m in trainer.metrics if m["kind"] == "train"] == [1, 2]


# ---------------------------------------------------------------- bad input
def test_a_stale_upstream_output_is_refused(tmp_path):
    """An output made from other settings than the current config gives it stops the job that
    would read it (the stale toy base once reused silently after an interrupted run)."""
    from test_evaluate_cli import SETTINGS as EVAL_SETTINGS

    from softtokens.cli import main
    from softtokens.store.provenance import StaleInput, check_expected, config_hash

    made = {"loader": "toy", "seed": 1, "train_size": 40, "validation_size": 8, "test_size": 8}
    assert main(["prepare-data", "--dataset", "toyarith", "--splits", "train,validation", "--settings",
                 json.dumps(made), "--out-dir", str(tmp_path)]) == 0
    data = tmp_path / "train.jsonl"
    check_expected([f"{data}={config_hash(made)}"])  # the same settings: accepted
    now = {**made, "train_size": 50}
    with pytest.raises(StaleInput, match=r"made by prepare_data with settings .* current config gives .* stale.*"
                                         r"--forcerun prepare_data"):
        check_expected([f"{data}={config_hash(now)}"])
    with pytest.raises(SystemExit, match="stale input"):
        main(["evaluate", "--settings", json.dumps(EVAL_SETTINGS), "--expect", f"{data}={config_hash(now)}",
              "--setting", "hard_greedy", "--model", "nowhere", "--data", str(data), "--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("name", ["/nonexistent/model/dir", "no-such-org/no-such-model-xyz"])
def test_an_unreadable_base_model_is_named(name, monkeypatch):
    import huggingface_hub.constants

    from softtokens.model.loading import ModelLoadError, load_model, load_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub id on a node without internet (read at import,
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # hence the constant too)
    for load in (load_model, load_tokenizer):
        with pytest.raises(ModelLoadError, match=name):
            load(name)


def test_a_row_with_a_missing_field_names_file_and_line(tmp_path):
    from softtokens.data.rows import DataFormatError, read_jsonl

    p = tmp_path / "rows.jsonl"
    p.write_text('{"id": "a", "question": "q", "answer": "1"}\n\n{"id": "b", "question": "q"}\n')
    with pytest.raises(DataFormatError, match=rf"{p}:3: missing field\(s\) answer"):
        read_jsonl(p)


def test_a_cluster_without_accounting_is_caught_before_any_job():
    """The plugin follows jobs with sacct whenever the binary exists; without accounting sacct
    fails and Snakemake would wait forever. The start-up check names the flag to use."""
    from softtokens.workflow.slurm_check import FLAG, status_command_problem

    class Done:
        def __init__(self, rc, err=""):
            self.returncode, self.stderr, self.stdout = rc, err, ""

    off = lambda *a, **k: Done(1, "sacct: error: Slurm accounting storage is disabled")  # noqa: E731
    on = lambda *a, **k: Done(0)  # noqa: E731
    has_sacct = lambda name: f"/usr/bin/{name}"  # noqa: E731
    problem = status_command_problem(None, run=off, which=has_sacct)
    assert "accounting storage is disabled" in problem and FLAG in problem
    assert status_command_problem("sacct", run=off, which=has_sacct) is not None
    assert status_command_problem("squeue", run=off, which=has_sacct) is None      # the fix
    assert status_command_problem(None, run=on, which=has_sacct) is None           # accounting on
    assert status_command_problem(None, run=off, which=lambda name: None) is None  # no sacct: squeue


def test_the_audit_flags_a_result_made_from_a_stale_input(tmp_path, monkeypatch):
    """A consumer records the settings hash the config gave each input; the audit compares it with
    the input's own record (a result made while the job-side check was bypassed is flagged)."""
    from softtokens.audit.chain import audit
    from softtokens.store.files import write_json
    from softtokens.store.provenance import Provenance, config_hash, expected_map

    monkeypatch.chdir(tmp_path)
    made, now = {"train_size": 40}, {"train_size": 50}
    data = Path("data.jsonl")
    data.write_text('{"id": "a"}\n')
    Provenance("prepare_data", made, params=made).write_sidecar(data)
    for want, flagged in ((config_hash(made), False), (config_hash(now), True)):
        prov = Provenance("evaluate", {}, inputs={"data": data})
        prov.expected = expected_map([f"{data}={want}"])
        write_json("result.json", identified(prov, "result.json", {"n_samples": 1, "pass@1": 1.0,
                                                                   "problems": [{"id": "a", "n": 1, "correct": 1}]}))
        lines, problems = audit("result.json")
        assert (problems == 1) is flagged and any("STALE data.jsonl" in line for line in lines) is flagged, lines


@pytest.mark.slow
def test_a_resume_hashes_the_state_it_resumes_from_once_and_no_other(base, tmp_path, straight, crashed, capsys,
                                                                     monkeypatch):
    """The resume state is read for its hashes once: ``latest`` (and its best) by the store's choice, not
    again by the trainer's load of it, and ``previous`` not at all while ``latest`` is whole (an 8B state
    is ~100 GB: each needless read is minutes of a node's time)."""
    import collections

    import softtokens.model.checkpoint as checkpoint
    import softtokens.store.files as files

    shutil.copytree(crashed, tmp_path, dirs_exist_ok=True)
    resume = (tmp_path / "_resume").resolve()
    reads = collections.Counter()
    real = files.sha256_file

    def counted(path):
        p = Path(path).resolve()
        if p.is_relative_to(resume):
            reads[p.relative_to(resume).as_posix()] += 1
        return real(path)

    monkeypatch.setattr(files, "sha256_file", counted)
    monkeypatch.setattr(checkpoint, "sha256_file", counted)
    run_here(base, tmp_path, capsys)
    latest = [n for n in reads if n.startswith("latest/") and n.endswith(".safetensors")]
    assert latest and all(reads[n] == 1 for n in latest), reads
    assert not [n for n in reads if n.startswith("previous/")], reads
    assert_same(outcome(tmp_path), straight)
