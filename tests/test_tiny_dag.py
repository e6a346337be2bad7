"""The tiny toy DAG, run once to the end with a real `snakemake` (the one ~100 s run of the
suite): what it produced, end to end, then the faults around a job, where Snakemake acts (it deletes
a job's declared outputs before it runs and after it fails), each scenario on a copy of it.
docs/reliability.md lists the faults with their outcomes. One module, so that pytest-xdist runs it on
one worker and the DAG is built once."""

import copy
import json
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import fault_env

from softtokens.store.files import sha256_file
from test_workflow import BIN, ROOT, TINY, job_counts, snakemake, tiny_args

RUN = "results/toy/runs/toy/toyarith/hard/seed0"


@pytest.fixture(scope="module")
def tiny_dag(tmp_path_factory):
    """The tiny toy DAG run once to the end with a real `snakemake`, shared by the end-to-end test
    and the fault scenarios (each of which works on a copy)."""
    d = tmp_path_factory.mktemp("dag")
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    grid = copy.deepcopy(config["grids"]["toy"])
    grid.update(copy.deepcopy(TINY))
    grid["rl"] = {**grid["rl"], "steps": 4, "resume_save_steps": 1}  # a resume state after every step
    config["grids"] = {"toy": grid}
    (d / "tiny.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(*tiny_args(d), "--cores", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return d


@pytest.mark.slow
def test_tiny_dag_end_to_end(tiny_dag, tmp_path):
    args = tiny_args(tiny_dag)
    res = tiny_dag / "results" / "toy"
    for p in ("tables/main.md", "tables/main.tex", "tables/main.csv", "tables/settings_toyarith.md",
              "figures/training_toy_toyarith.png", "figures/entropy_toy_toyarith_toyarith.png",
              "figures/passk_toy_toyarith_toyarith.png",
              "runs/toy/toyarith/fuzzy/seed0/selected.json", "eval/toy/base/toyarith/fuzzy_sample.json",
              "tables/ood.md", "tables/ood.csv", "eval/toy/toyarith-hard-seed0/toychoice/loglik.json",
              "figures/passk_toy_toyarith_toyarith.pdf", "report/reproduction.md", "report/reproduction.html",
              "report/ledger.csv", "report/ledger_tables.csv", "report/ledger.html", "tables/main.cells.json"):
        assert (res / p).exists(), p
    assert not (res / "runs/toy/toyarith/hard/seed0/_resume").exists()  # resume state removed on success
    # the hyperparameter search in small (config.yaml's toy sweep: three learning rates, the toy's own 7e-5 its
    # hard seed-0 run): expanded, trained, selected, tabled, drawn and reported; its table names what it selects
    sweep = (res / "tables/sweep_toy.md").read_text()
    assert "- toyarith, learning rate, hard: selected " in sweep and "(configured: 7e-05" in sweep
    assert all(v in sweep for v in ("3.5e-05", "7e-05", "1.4e-04")) and (res / "figures/sweep_toy.png").exists()
    assert (res / "runs/toy/toyarith/hard@lr3.5e-05/seed0/selected.json").exists()
    assert not (res / "eval/toy/toyarith-hard@lr3.5e-05-seed0").exists()   # selected on validation, never tested
    page = (res / "report/reproduction.md").read_text()
    assert "## The hyperparameter search (Appendix D)" in page and "Not yet run" not in page
    result = json.loads((res / "eval/toy/toyarith-fuzzy-seed0/toyarith/fuzzy_sample.json").read_text())
    assert result["n_samples"] == 2 and len(result["problems"]) == 6 and len(result["pass@k"]) == 2
    assert result["provenance"]["inputs"]["selected"]["sha256"]
    selected = json.loads((res / "runs/toy/toyarith/fuzzy/seed0/selected.json").read_text())
    assert selected["step"] >= 1 and 0 in selected["validated_steps"]       # the base is the reference only
    assert result["selection"]["step"] == selected["step"] and "improved_over_base" in result["selection"]
    assert result["grading_timeouts"] == 0 and result["sigma_source"].startswith("base model's E")
    loglik = json.loads((res / "eval/toy/toyarith-hard-seed0/toychoice/loglik.json").read_text())
    assert loglik["selection"]["step"] >= 1
    # the jobs that run no model never load torch (~1.3 s each): their records name no torch capability
    for path, ran_a_model in (("data/toyarith/test.jsonl.prov.json", False), ("tables/main.md.prov.json", False),
                              ("figures/passk_toy_toyarith_toyarith.png.prov.json", False),
                              ("report/reproduction.md.prov.json", False),
                              ("runs/toy/toyarith/fuzzy/seed0/metrics.jsonl.prov.json", True)):
        device = json.loads((res / path).read_text())["device"]
        assert (device["torch_cpu_capability"] is not None) == ran_a_model, (path, device)
    assert selected["provenance"]["device"]["torch_cpu_capability"] is None
    assert result["provenance"]["device"]["torch_cpu_capability"] is not None
    table = (res / "tables/main.md").read_text()
    assert "no finetune" in table and "toyarith fuzzy" in table and "toyarith hard" in table
    # a single evaluation (the base) or seed (every run here) has no spread to print: no ±, and the
    # mean as the table wrote it (a bare "0.0" is not re-read as the number 0)
    rows = [line for line in table.splitlines() if line.startswith("| toy")]
    assert len(rows) == 3 and not any("±" in r for r in rows) and all(r.rstrip(" |").endswith(".0") for r in rows)
    ood = (res / "tables/ood.md").read_text()
    assert "toychoice Accuracy" in ood and "toychoice NLL Correct" in ood and "toyarith fuzzy" in ood

    # the audit walks the table back to the data, and every link holds
    audit = subprocess.run([str(BIN / "softtokens"), "audit", "results/toy/tables/main.md"], cwd=tiny_dag,
                           capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout
    for stage in ("[tables]", "[evaluate]", "[select_checkpoint]", "[train]", "[build_toy_base]", "[prepare_data]"):
        assert stage in audit.stdout

    # the reproduction report: toy claims, no paper cell, a ledger of every job in CPU seconds
    report = (res / "report/reproduction.md").read_text()
    assert "This is the toy grid" in report and "0 of 162 cells measured" in report
    # one seed per run: its spread is unknown, so no comparison can be made; none is dropped: each counts as
    # undecided, named (a verdict is never bought by missing data), and the page says what a verdict rests on
    claims_file = json.loads((res / "report/claims.json").read_text())
    parity = next(c for c in claims_file["ours"] if c["key"] == "pass1_parity")
    assert parity["comparisons"] == {} and parity["verdict"] == "undecided"
    # soft is not trained in the tiny grid (no cell); fuzzy has one seed (no spread): both named, counted undecided
    assert "2 of 2 comparisons cannot be made (no cell: 1; no spread: one seed: 1), counted undecided" in parity["summary"]
    assert all(c["summary"] in report for c in claims_file["ours"])
    assert all(c["sensitivity"] for c in claims_file["paper"] if c["key"] != "entropy_profile")
    # the paper's claims as docs/protocol.md states them: the same margin, verdict and share of specifications
    doc = (Path(__file__).resolve().parents[1] / "docs/protocol.md").read_text()
    for c in claims_file["paper"]:
        row = next(line for line in doc.splitlines() if line.startswith(f"| `{c['key']}`"))
        assert f"**{c['verdict']}**" in row, c["key"]
        if c["sensitivity"] and c["design"]["otherwise"]:   # robustness is shown for a verdict that could differ
            held = c["supported_by"]
            assert f"{held['specifications']} of {held['of']} support" in row, c["key"]
        if c["margin"]:
            assert f"±{c['margin']['value']:g} {c['margin']['unit']}" in row, c["key"]
        assert c["summary"].split(" — ")[0] in report
    # forecast beside actual compares like with like: the toy's CPU jobs are left out, saying why, no ratio
    assert "Left out: this grid's jobs held no GPU" in report and "x |" not in report.split("Forecast beside")[1]
    ledger = pd.read_csv(res / "report/ledger.csv")
    assert {"build_toy_base", "train", "select", "evaluate", "evaluate_loglik", "tables"} <= set(ledger.rule)
    assert (ledger.gpu_hours == 0).all() and (ledger.wall_s > 0).all()
    # one table cell back to its data, seed file by seed file
    cell = subprocess.run([str(BIN / "softtokens"), "audit", "results/toy/tables/main.md", "--row", "toy toyarith hard",
                           "--column", "toyarith Greedy pass@1"], cwd=tiny_dag, capture_output=True, text=True)
    assert cell.returncode == 0, cell.stdout + cell.stderr
    assert "chain intact" in cell.stdout and "[build_toy_base]" in cell.stdout and "[prepare_data]" in cell.stdout
    # Snakemake's own report of the run: every table as an HTML page (shown inline, not a CSV link)
    proc = snakemake(*args, "--report", str(tmp_path / "report.html"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (tmp_path / "report.html").read_text()
    for table in ("main.html", "settings_toyarith.html", "ood.html", "ledger.html", "ledger_tables.html"):
        assert table in page, table
    assert "<table" in (res / "tables/main.html").read_text()

    # every training run streamed its scalars to TensorBoard, read back with TensorBoard's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for arm in ("hard", "fuzzy"):
        acc = EventAccumulator(str(res / f"runs/toy/toyarith/{arm}/seed0/tensorboard"))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        assert {"reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "completions/clipped_ratio",
                "entropy", "cot/effective_tokens", "grad_norm", "learning_rate", "perf/rollout_tokens_per_s",
                "perf/step_time_s", "reward/frac_100_correct", "reward/grading_timeouts",
                "val/greedy_accuracy"} <= tags, tags
        assert [e.step for e in acc.Scalars("reward")] == [1, 2, 3, 4]
        assert ("replay/h0_gap" in tags) == (arm == "fuzzy")

    # one screen for the grid, from the results directory only
    status = subprocess.run([str(BIN / "softtokens"), "status", "--config", "tiny.yaml"], cwd=tiny_dag,
                            capture_output=True, text=True)
    assert status.returncode == 0, status.stderr
    assert "training runs 4: 4 done, 0 running, 0 failed, 0 pending" in status.stdout   # 2 of them the sweep's
    assert "evaluate files" in status.stdout and "6: 6 done, 0 running, 0 failed, 0 pending" in status.stdout
    assert "3: 3 done" in status.stdout  # out-of-domain: base and both runs

    # nothing left to do; deleting one evaluation (of a copy) remakes it and what depends on it, nothing else
    assert job_counts(snakemake(*args, "-n")) == {}
    # after a code change, the README's commands: one cell (-f: its own job, nothing upstream), one table and
    # the evaluations under it (the target before --forcerun, which takes every word after it as a rule name)
    one = "results/toy/eval/toy/toyarith-hard-seed0/toyarith/hard_greedy.json"
    assert job_counts(snakemake(*args, "-n", "-f", one)) == {"evaluate": 1, "total": 1}
    table = job_counts(snakemake(*args, "-n", "results/toy/tables/main.md", "--forcerun", "evaluate"))
    assert table == {"evaluate": 3, "main_table": 1, "total": 4}, table
    wrong = snakemake(*args, "-n", "--forcerun", "evaluate", one)   # the order the README warns of: caught
    said = wrong.stdout + wrong.stderr
    assert wrong.returncode != 0 and f"Put the target first: snakemake {one} --forcerun evaluate" in said
    shutil.copytree(tiny_dag, tmp_path / "dag", symlinks=True)
    args, res = tiny_args(tmp_path / "dag"), tmp_path / "dag" / "results" / "toy"
    (res / "eval/toy/toyarith-hard-seed0/toyarith/hard_greedy.json").unlink()
    counts = job_counts(snakemake(*args, "-n"))
    # the tables and figures that read it, not the others (the training curves, the out-of-domain table)
    assert counts == {"evaluate": 1, "main_table": 1, "settings_table": 1, "passk_figure": 1, "entropy_figure": 1,
                      "reproduction_report": 1, "all": 1, "total": 7}, counts
    # remade alone (a single-cell rerun): the run names what now summarises an older file, and the
    # audit of a cell over it says the number has not changed
    cell_file = "results/toy/eval/toy/toyarith-hard-seed0/toyarith/hard_greedy.json"
    proc = snakemake(*args, "--cores", "1", cell_file)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "summary file(s) are older than a result they are made from" in proc.stdout + proc.stderr
    assert "results/toy/tables/main.md" in proc.stdout + proc.stderr
    audit = subprocess.run([str(BIN / "softtokens"), "audit", "results/toy/tables/main.md", "--row", "toy toyarith hard",
                            "--column", "toyarith Greedy pass@1"], cwd=tmp_path / "dag", capture_output=True, text=True)
    assert audit.returncode == 1 and "VALUE UNCHANGED" in audit.stdout, audit.stdout



def _args(d: Path) -> list[str]:
    return tiny_args(d)


def _copy(tiny_dag: Path, tmp_path: Path) -> Path:
    d = tmp_path / "dag"
    shutil.copytree(tiny_dag, d, symlinks=True)
    return d


def _train_rows(path: Path) -> list[dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [{k: v for k, v in r.items() if not k.startswith("seconds")} for r in rows]


def test_a_failing_rerun_keeps_the_results_it_was_to_replace(tiny_dag, tmp_path):
    """A malformed benchmark row, then a forced rerun of the base model's evaluation: the job fails,
    the previous evaluation files are back with their provenance, and the console says where."""
    d = _copy(tiny_dag, tmp_path)
    evals = sorted((d / "results/toy/eval/toy/base/toyarith").glob("*.json"))
    before = {p: p.read_bytes() for p in evals}
    data = d / "results/toy/data/toyarith/test.jsonl"
    lines = data.read_text().splitlines()
    data.write_text("\n".join(lines) + "\n{not json\n")
    proc = snakemake(*_args(d), "--cores", "1", "-f", "results/toy/eval/toy/base/toyarith/hard_greedy.json")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"test.jsonl:{len(lines) + 1}" in out and "not valid JSON" in out  # the first error line, on the console
    assert "Restored previous version" in out
    assert {p: p.read_bytes() for p in evals} == before


def test_an_interrupted_retrain_leaves_nothing_resting_on_a_deleted_checkpoint(tiny_dag, tmp_path):
    """A forced retrain that crashes: the run's previous metrics and checkpoints are back, every table
    still audits to intact links, and the run's attempts are numbered on (1, 2; the rerun 3)."""
    d = _copy(tiny_dag, tmp_path)
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
    assert _train_rows(d / RUN / "metrics.jsonl") == _train_rows(tiny_dag / RUN / "metrics.jsonl")


def test_a_job_killed_as_the_oom_killer_kills_says_so_on_the_console_and_in_its_log(tiny_dag, tmp_path):
    """SIGKILL inside a training job (what the kernel's OOM killer does: exit 137, nothing flushed): the console
    and the job's log name it as most likely out of memory, with what the job declared and what the machine has;
    the run's previous results are back."""
    d = _copy(tiny_dag, tmp_path)
    before = (d / RUN / "metrics.jsonl").read_bytes()
    proc = snakemake(f"{RUN}/metrics.jsonl", *_args(d), "--cores", "1", "--forcerun", "train",
                     env=fault_env("sigkill_at_step=1"))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "injected SIGKILL before step 2" in out
    said = next(line for line in out.splitlines() if "was killed by SIGKILL (exit status 137)" in line)
    assert "most likely out of memory" in said and "it declared mem_mb=" in said and "this machine has" in said
    assert "was killed by SIGKILL" in (d / "results/toy/logs/train/toy/toyarith/hard/seed0.log").read_text()
    assert (d / RUN / "metrics.jsonl").read_bytes() == before


def test_swapped_best_checkpoints_are_refused_before_anything_is_written_naming_both_runs(tiny_dag, tmp_path):
    """Two runs' best checkpoints swapped (each a whole checkpoint: its manifest and record valid for its bytes): the
    forced evaluation of one cell and its run's selection refuse before writing, naming the run and where the
    checkpoint came from; the cell's file is unchanged; the audit names it too."""
    d = _copy(tiny_dag, tmp_path)
    fuzzy = RUN.replace("/hard/", "/fuzzy/")
    a, b = d / RUN / "checkpoints/best", d / fuzzy / "checkpoints/best"
    a.rename(d / "aside")
    b.rename(a)
    (d / "aside").rename(b)
    # and the runs' own records of their checkpoints made to agree with the swap (what a forger edits next)
    from softtokens.model.checkpoint import manifest_sha256

    for run in (RUN, fuzzy):
        ckpt = d / run / "checkpoints"
        _edit(ckpt / "provenance.json", lambda rec, c=ckpt: rec["output"].update(
            {"sha256": manifest_sha256(c, ("best", "latest"))}))
    cell = "results/toy/eval/toy/toyarith-hard-seed0/toyarith/hard_greedy.json"
    before = (d / cell).read_bytes()
    proc = snakemake(cell, *_args(d), "--cores", "1", "--forcerun", cell)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"is not run {RUN}'s" in out, out[-3000:]
    assert f"its training wrote it as {fuzzy}/checkpoints/best" in out and "fuzzy run, seed 0" in out
    assert (d / cell).read_bytes() == before
    proc = snakemake(f"{RUN}/selected.json", *_args(d), "--cores", "1", "--forcerun", f"{RUN}/selected.json")
    assert proc.returncode != 0 and f"is not run {RUN}'s" in proc.stdout + proc.stderr
    audit = _audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and "NOT ITS RUN'S" in audit.stdout and fuzzy in audit.stdout


def test_a_truncated_checkpoint_is_named_before_evaluation(tiny_dag, tmp_path):
    d = _copy(tiny_dag, tmp_path)
    target = "results/toy/eval/toy/toyarith-hard-seed0/toyarith/hard_greedy.json"
    before = (d / target).read_bytes()
    weights = d / RUN / "checkpoints/best/model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    proc = snakemake(*_args(d), "--cores", "1", target, "--forcerun", "evaluate")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "checkpoint" in out and "model.safetensors has 100 bytes" in out
    assert (d / target).read_bytes() == before


def test_sigkill_of_the_whole_run_mid_training_then_a_rerun_is_bit_identical(tiny_dag, tmp_path):
    """SIGKILL to Snakemake and its jobs while a forced retrain runs, then `--unlock` and a plain rerun
    (which reruns the incomplete job; profiles/default): the run resumes from its saved step, and
    its metrics and weights equal the uninterrupted run's."""
    d = _copy(tiny_dag, tmp_path)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen([str(BIN / "snakemake"), *_args(d), "--cores", "1", f"{RUN}/metrics.jsonl",
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
    assert snakemake(*_args(d), "--unlock").returncode == 0
    rerun = snakemake(*_args(d), "--cores", "1", f"{RUN}/metrics.jsonl")
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert _train_rows(d / RUN / "metrics.jsonl") == _train_rows(tiny_dag / RUN / "metrics.jsonl")
    for f in ("best/model.safetensors", "latest/model.safetensors"):
        assert (d / RUN / "checkpoints" / f).read_bytes() == (tiny_dag / RUN / "checkpoints" / f).read_bytes()


def test_outputs_are_group_readable(tiny_dag):
    """Results respect the umask (a plain open's mode), not mkstemp's 0600: a group on a shared file
    system reads them."""
    mask = os.umask(0)
    os.umask(mask)
    want = 0o444 & ~mask
    unreadable = [p for p in (tiny_dag / "results/toy").rglob("*")
                  if p.is_file() and stat.S_IMODE(p.stat().st_mode) & 0o444 != want]
    assert not unreadable, unreadable[:5]


def test_settle_removes_stale_backups_and_restores_lost_outputs(tmp_path):
    from softtokens.workflow.backups import settle

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


# ---------------------------------------------------------------- a record that cannot be fooled
# (docs/reliability.md, "Tampering"): each case on a copy of the tiny DAG, with a real `snakemake`
EVAL = "results/toy/eval/toy/toyarith-hard-seed0/toyarith/hard_greedy.json"
SUMMARIES = ("results/toy/tables/main.md", "results/toy/tables/main.cells.json", "results/toy/report/reproduction.md")


def _bytes(d: Path, *files: str) -> dict:
    return {f: (d / f).read_bytes() for f in files}


def _audit(d: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "softtokens"), "audit", *args], cwd=d, capture_output=True, text=True)


def flip(path: Path, n: int = 4000) -> None:
    """n bytes inverted in the middle of a file, its size unchanged (what a bad sector leaves)."""
    data = bytearray(path.read_bytes())
    start = len(data) // 2 - n // 2
    data[start:start + n] = bytes(b ^ 0xFF for b in data[start:start + n])
    path.write_bytes(data)


def test_a_checkpoint_with_flipped_bytes_is_refused_wherever_it_is_read(tiny_dag, tmp_path):
    """4,000 bytes flipped inside the selected checkpoint, size unchanged: the evaluation and the
    selection refuse it naming the file, every earlier output stays as it was, the audit fails."""
    d = _copy(tiny_dag, tmp_path)
    weights = d / RUN / "checkpoints/best/model.safetensors"
    selected = f"{RUN}/selected.json"
    before = _bytes(d, EVAL, selected, *SUMMARIES)
    flip(weights)
    proc = snakemake(*_args(d), "--cores", "1", "-f", EVAL)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"{weights.relative_to(d)} has other bytes than were written" in out, out[-3000:]
    proc = snakemake(*_args(d), "--cores", "1", "-f", selected)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "has other bytes than were written" in out, out[-3000:]
    assert _bytes(d, EVAL, selected, *SUMMARIES) == before
    audit = _audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and "DAMAGED" in audit.stdout and "model.safetensors" in audit.stdout


def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=1))


def _refused_rebuild(d: Path, before: dict, *names: str) -> str:
    """A plain `snakemake` after an edit: the table and report jobs refuse, naming the file; the
    summaries are as they were."""
    proc = snakemake(*_args(d), "--cores", "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "refused to read" in out and all(n in out for n in names), out[-4000:]
    assert _bytes(d, *SUMMARIES) == before
    return out


def test_a_hand_edited_number_is_refused_by_the_rebuild_and_the_audit(tiny_dag, tmp_path):
    d = _copy(tiny_dag, tmp_path)
    before = _bytes(d, *SUMMARIES)
    _edit(d / EVAL, lambda doc: doc.update({"pass@1": 0.9, "pass@k": {"1": 0.9}}))
    _refused_rebuild(d, before, EVAL, "pass@1 says 0.9")
    audit = _audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and f"EDITED {EVAL}" in audit.stdout, audit.stdout[-3000:]
    cell = _audit(d, "results/toy/tables/main.md", "--row", "toy toyarith hard", "--column",
                  "toyarith Greedy pass@1")
    assert cell.returncode == 1 and "pass@1 says 0.9" in cell.stdout, cell.stdout[-3000:]


def test_rows_edited_to_match_the_number_are_refused_by_the_document_hash(tiny_dag, tmp_path):
    d = _copy(tiny_dag, tmp_path)
    before = _bytes(d, *SUMMARIES)

    def consistent(doc):   # every problem right, and the summary to match: only the record's hash knows
        for row in doc["problems"]:
            row["correct"] = row["n"]
        doc["pass@1"], doc["pass@k"] = 1.0, {"1": 1.0}
    _edit(d / EVAL, consistent)
    _refused_rebuild(d, before, f"EDITED {EVAL}: the document")


def test_an_edited_record_is_refused(tiny_dag, tmp_path):
    """The embedded record's config edited (dtype, n_samples), then (by a careful forger who also
    recomputes the document's hash) its checkpoint switched to another run's: both are caught."""
    from softtokens.store.provenance import CONTENT_HASH, content_sha256

    d = _copy(tiny_dag, tmp_path)
    before = _bytes(d, *SUMMARIES)
    _edit(d / EVAL, lambda doc: doc["provenance"]["config"].update({"dtype": "bfloat16", "n_samples": 8}))
    _refused_rebuild(d, before, f"EDITED RECORD {EVAL}: its config hashes to")

    other = "results/toy/runs/toy/toyarith/fuzzy/seed0"

    def switched(doc):
        doc["provenance"]["config"].update({"dtype": "float32", "n_samples": 2})
        doc["provenance"]["config_hash"] = __import__("softtokens.store.provenance", fromlist=["x"]).config_hash(
            doc["provenance"]["config"])
        inputs = doc["provenance"]["inputs"]
        inputs["checkpoint"] = {"path": f"{other}/checkpoints/best",
                                "sha256": json.loads((d / other / "checkpoints/best/provenance.json").read_text())[
                                    "output"]["sha256"]}
        doc["provenance"][CONTENT_HASH] = content_sha256(doc)
    _edit(d / EVAL, switched)
    _refused_rebuild(d, before, f"EDITED RECORD {EVAL}: it was made from checkpoint {other}/checkpoints/best, "
                                "but its run selected")
    audit = _audit(d, EVAL)
    assert audit.returncode == 1 and "but its run selected" in audit.stdout


def test_an_edited_selection_of_a_sweep_run_is_refused_by_the_sweep_table(tiny_dag, tmp_path):
    """The search's number is each run's selected.json (its greedy validation accuracy): edited, and its
    document hash recomputed by a careful forger, the sweep table's rebuild still refuses it, naming the file
    and the metrics it contradicts; the table, its summary and the report stay as they were."""
    from softtokens.store.provenance import CONTENT_HASH, content_sha256

    d = _copy(tiny_dag, tmp_path)
    res = "results/toy"
    kept = (f"{res}/tables/sweep_toy.md", f"{res}/tables/sweeps.json", f"{res}/report/reproduction.md")
    before = _bytes(d, *kept)
    selected = f"{res}/runs/toy/toyarith/hard@lr3.5e-05/seed0/selected.json"

    def forged(doc):
        doc["val_greedy_accuracy"] = 0.99
        doc["provenance"][CONTENT_HASH] = content_sha256(doc)
    _edit(d / selected, forged)
    proc = snakemake(*_args(d), "--cores", "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "refused to read" in out and f"EDITED {selected}: val_greedy_accuracy says 0.99" in out, out[-4000:]
    assert _bytes(d, *kept) == before
    audit = _audit(d, f"{res}/tables/sweeps.json")
    assert audit.returncode == 1 and f"EDITED {selected}: val_greedy_accuracy" in audit.stdout, audit.stdout[-3000:]


def test_a_bad_paper_numbers_file_is_refused_naming_its_line(tiny_dag, tmp_path):
    """The config's paper_results names a file with a typo'd model, a duplicate cell and a mean that is no
    number: the report job stops naming each line; the previous report stays."""
    from softtokens.cells.paper import PAPER_RESULTS

    d = _copy(tiny_dag, tmp_path)
    lines = PAPER_RESULTS.read_text().splitlines()
    fields = lines[3].split(",")
    fields[lines[0].split(",").index("mean")] = "seventy"
    bad = [lines[0], lines[1].replace("llama-3b", "llama-3bb", 1), lines[2], lines[2], ",".join(fields), *lines[4:]]
    (d / "paper.csv").write_text("\n".join(bad) + "\n")
    config = yaml.safe_load((d / "tiny.yaml").read_text())
    config["paper_results"] = str(d / "paper.csv")
    (d / "tiny.yaml").write_text(yaml.safe_dump(config))
    before = _bytes(d, "results/toy/report/reproduction.md", "results/toy/report/claims.json")
    proc = snakemake(*_args(d), "--cores", "1", "results/toy/report/reproduction.md")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert f"{d / 'paper.csv'}:2: model 'llama-3bb' is not one of the paper's (did you mean 'llama-3b'?)" in out, out[-3000:]
    assert f"{d / 'paper.csv'}:4: the cell of line 3 again" in out
    assert f"{d / 'paper.csv'}:5: mean 'seventy' is not a number" in out
    assert _bytes(d, "results/toy/report/reproduction.md", "results/toy/report/claims.json") == before


def test_runs_that_failed_to_learn_are_named_everywhere(tiny_dag):
    """The tiny DAG's runs (its sweep's two included) answer no validation question right (nor its base): each
    selection says so, the tables mark the rows †, the verdicts resting on them name them, status lists them."""
    res = tiny_dag / "results/toy"
    for mode in ("hard", "fuzzy"):
        selected = json.loads((res / f"runs/toy/toyarith/{mode}/seed0/selected.json").read_text())
        assert "no trained step answers a validation question right" in selected["failed_to_learn"]
    assert "toyarith hard †" in (res / "tables/main.md").read_text()
    report = (res / "report/reproduction.md").read_text()
    assert "failed to learn" in report and "toy toyarith hard seed 0" in report
    claims = json.loads((res / "report/claims.json").read_text())["ours"]
    assert any("toy toyarith fuzzy seed 0" in c["failed_runs"] for c in claims)
    status = subprocess.run([str(BIN / "softtokens"), "status", "--config", "tiny.yaml"], cwd=tiny_dag,
                            capture_output=True, text=True)
    assert "4 run(s) failed to learn" in status.stdout and "toy/toyarith/hard/seed0: no trained step" in status.stdout


# ---------------------------------------------------------------- issue 63: attacks a rehashed record cannot pass
LOGLIK = "results/toy/eval/toy/toyarith-hard-seed0/toychoice/loglik.json"


def _rehash(path: Path, change) -> None:
    """An edit by a careful forger: the document's own hash redone (it is unkeyed: anyone can)."""
    from softtokens.store.provenance import CONTENT_HASH, content_sha256

    def both(doc):
        change(doc)
        doc["provenance"][CONTENT_HASH] = content_sha256(doc)
    _edit(path, both)


def test_a_sidecar_beside_an_embedded_record_is_refused_naming_both(tiny_dag, tmp_path):
    """pass@1 set to 0.50 (rows untouched, no hash redone), then a sidecar beside the file: its embedded record
    copied, the file's sha256 filled in. It once switched every check of the file off; now the embedded record is
    the file's, and two records are an error naming both."""
    from softtokens.store.files import sha256_path

    d = _copy(tiny_dag, tmp_path)
    before = _bytes(d, *SUMMARIES)
    _edit(d / EVAL, lambda doc: doc.update({"pass@1": 0.5}))
    rec = json.loads((d / EVAL).read_text())["provenance"]
    (d / f"{EVAL}.prov.json").write_text(json.dumps({**rec, "output": {"path": EVAL, "sha256": sha256_path(d / EVAL)}}))
    _refused_rebuild(d, before, f"TWO RECORDS {EVAL}", f"{EVAL}.prov.json", f"EDITED {EVAL}")
    audit = _audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and f"TWO RECORDS {EVAL}" in audit.stdout


def test_a_record_without_its_hash_and_rows_cut_to_match_are_refused(tiny_dag, tmp_path):
    """content_sha256 removed, every wrong row dropped, n_problems and pass@1 set to match: no hash is a failure, and
    the rows are held to the test set (every question once)."""
    from softtokens.eval.metrics import mean_pass_at_k

    d = _copy(tiny_dag, tmp_path)
    before = _bytes(d, *SUMMARIES)

    def cut(doc):
        doc["provenance"].pop("content_sha256")
        doc["problems"] = [r for r in doc["problems"] if r["correct"] == r["n"]] or doc["problems"][:1]
        doc["n_problems"] = len(doc["problems"])
        doc["pass@1"] = mean_pass_at_k([(r["n"], r["correct"]) for r in doc["problems"]], 1)
        doc["pass@k"] = {"1": doc["pass@1"]}
    _edit(d / EVAL, cut)
    out = _refused_rebuild(d, before, f"NO HASH {EVAL}")
    assert f"EDITED {EVAL}: its rows are not its test set" in out
    audit = _audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and f"NO HASH {EVAL}" in audit.stdout and "rows are not its test set" in audit.stdout


def test_a_selection_moved_to_another_step_is_refused_against_the_checkpoint_it_names(tiny_dag, tmp_path):
    """selected.json moved to another step, the metrics' validation rows edited to make that step the best, both
    files' hashes redone: the checkpoint the selection names holds the step its training saved, not the one claimed."""
    from softtokens.store.files import sha256_path
    from softtokens.train.selection import select_best

    d = _copy(tiny_dag, tmp_path)
    before = _bytes(d, *SUMMARIES)
    metrics = d / RUN / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    chosen = json.loads((d / RUN / "selected.json").read_text())["step"]
    other = next(r["step"] for r in rows if r["kind"] == "validation" and r["step"] not in (0, chosen))
    for r in rows:
        if r["kind"] == "validation" and r["step"] == other:
            r["val_greedy_accuracy"] = 1.0
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    side = d / RUN / "metrics.jsonl.prov.json"
    _edit(side, lambda rec: rec["output"].update({"sha256": sha256_path(metrics)}))
    _rehash(d / RUN / "selected.json", lambda doc: doc.update(
        {k: v for k, v in select_best(rows).items() if k in ("step", "val_greedy_accuracy", "val_correct")}))
    proc = snakemake(*_args(d), "--cores", "1")   # the edited metrics remake the selection, which refuses
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"but validation picks step {other}" in out, out[-3000:]
    assert _bytes(d, *SUMMARIES) == before
    audit = _audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and "NOT ITS RUN'S" in audit.stdout


def test_self_consistent_rows_are_held_to_what_they_store(tiny_dag, tmp_path):
    """Out of domain, a question's `correct` flipped with the accuracy to match and the document rehashed: `correct`
    is recomputed from its answer and gold; its NLL edited the same way: recomputed from its stored
    log-likelihoods. Both named by the table's rebuild."""
    d = _copy(tiny_dag, tmp_path)
    before = _bytes(d, *SUMMARIES)

    def flipped(doc):
        row = doc["problems"][0]
        row["correct"] = not row["correct"]
        doc["accuracy"] = sum(bool(r["correct"]) for r in doc["problems"]) / len(doc["problems"])
        doc["problems"][1]["nll_correct"] += 0.5
        doc["nll_correct"] = sum(r["nll_correct"] for r in doc["problems"]) / len(doc["problems"])
    _rehash(d / LOGLIK, flipped)
    out = _refused_rebuild(d, before, f"EDITED {LOGLIK}: question", "nll_correct")
    assert "says correct=" in out and "is not its stored log-likelihood" in out


def test_a_table_or_report_whose_sibling_output_was_edited_is_refused(tiny_dag, tmp_path):
    """The CSV a table job wrote beside its Markdown, and the report's cells.csv, edited: a rebuild says "nothing to
    be done", so the audit must read every output of a job by its hash, not its existence."""
    d = _copy(tiny_dag, tmp_path)
    for f in ("results/toy/tables/main.csv", "results/toy/report/cells.csv"):
        (d / f).write_text((d / f).read_text() + "forged,row\n")
    audit = _audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and "CHANGED results/toy/tables/main.csv since its job wrote it" in audit.stdout
    audit = _audit(d, "results/toy/report/reproduction.md")
    assert audit.returncode == 1 and "CHANGED results/toy/report/cells.csv since its job wrote it" in audit.stdout


def test_a_result_made_under_another_config_is_named_by_the_audit(tiny_dag, tmp_path):
    """The config's rl steps edited after the grid ran: every hash still holds, but the runs (and what rests on them)
    are not what the config now asks for."""
    d = _copy(tiny_dag, tmp_path)
    assert _audit(d, "results/toy/tables/main.md", "--config", "tiny.yaml").returncode == 0
    config = yaml.safe_load((d / "tiny.yaml").read_text())
    config["grids"]["toy"]["rl"]["steps"] = 5
    (d / "tiny.yaml").write_text(yaml.safe_dump(config))
    audit = _audit(d, "results/toy/tables/main.md", "--config", "tiny.yaml")
    assert audit.returncode == 1 and f"MADE UNDER ANOTHER CONFIG {RUN}/metrics.jsonl: its train job" in audit.stdout


def test_audit_rerun_makes_a_cell_again_and_finds_an_edit_every_hash_agrees_with(tiny_dag, tmp_path):
    """Re-execution, what an unkeyed hash cannot give: one cell made again from its checkpoint and test set is equal
    to its file, bit for bit; after a row's `correct` is flipped with pass@1 to match and the document rehashed (every
    hash agrees), the re-execution names the difference, and the report says what re-execution found."""
    d = _copy(tiny_dag, tmp_path)
    cell = ("results/toy/tables/main.md", "--row", "toy toyarith hard", "--column", "toyarith Greedy pass@1")
    ok = _audit(d, *cell, "--rerun")
    assert ok.returncode == 0 and "1 evaluation file(s) re-run: 1 equal, 0 differ" in ok.stdout, ok.stdout + ok.stderr

    def forged(doc):
        row = doc["problems"][0]
        row["correct"] = 1 - row["correct"]
        from softtokens.eval.metrics import mean_pass_at_k
        counts = [(r["n"], r["correct"]) for r in doc["problems"]]
        doc["pass@1"], doc["pass@k"] = mean_pass_at_k(counts, 1), {"1": mean_pass_at_k(counts, 1)}
    _rehash(d / EVAL, forged)
    assert _audit(d, EVAL).returncode == 0   # every hash agrees: only re-execution can tell
    bad = _audit(d, *cell, "--rerun")
    assert bad.returncode == 1 and "DIFFERS" in bad.stdout and "pass@1" in bad.stdout
    reruns = [json.loads(x) for x in (d / "results/toy/audit/reruns.jsonl").read_text().splitlines()]
    assert [r["equal"] for r in reruns] == [True, False]


def test_a_test_set_row_without_its_id_is_named_by_the_audit_not_a_crash(tiny_dag, tmp_path):
    """A question of the prepared test set stripped of its id: the audit cannot hold the evaluation rows against
    that set, and says so, naming the file and line (it once raised KeyError and printed a traceback)."""
    d = _copy(tiny_dag, tmp_path)
    data = d / "results/toy/data/toyarith/test.jsonl"
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    del rows[2]["id"]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    audit = _audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and "Traceback" not in audit.stdout + audit.stderr, audit.stderr[-3000:]
    assert f"{data.relative_to(d)}:3: a row without an id" in audit.stdout, audit.stdout[-3000:]
    assert "cannot be read as questions" in audit.stdout


# ---------------------------------------------------------------- issue 66: keyed on what a result is; honest twins
SAMPLE = "results/toy/eval/toy/toyarith-hard-seed0/toyarith/fuzzy_sample.json"


def test_another_settings_result_copied_over_a_cell_is_refused_and_rerun_makes_what_the_path_asks(tiny_dag, tmp_path):
    """`cp fuzzy_sample.json hard_greedy.json`, nothing rehashed: the table job, the audit and status name the file
    (it is not where its job wrote it; its content is another setting's). A forger who also rewrites its identity and
    its record's path, and rehashes, is held to its own content (a greedy setting draws one sample); the re-run makes
    what the path asks for, whatever the file says, and differs."""
    from softtokens.store.eval_identity import IDENTITY
    from softtokens.store.provenance import OWN_PATH

    d = _copy(tiny_dag, tmp_path)
    before = _bytes(d, *SUMMARIES)
    shutil.copy(d / SAMPLE, d / EVAL)
    out = _refused_rebuild(d, before, f"NOT WHERE IT WAS WRITTEN {EVAL}", f"NOT THIS FILE {EVAL}")
    assert "setting 'fuzzy_sample', its path names 'hard_greedy'" in out
    audit = _audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and f"NOT THIS FILE {EVAL}" in audit.stdout, audit.stdout[-3000:]
    status = subprocess.run([str(BIN / "softtokens"), "status", "--config", "tiny.yaml"], cwd=d, capture_output=True,
                            text=True)
    assert status.returncode == 0 and f"failed: {EVAL} (NOT THIS FILE" in status.stdout, status.stdout[-2000:]

    def disguised(doc):
        doc[IDENTITY]["setting"] = doc["setting"] = doc["provenance"]["config"]["setting"] = "hard_greedy"
        doc["provenance"][OWN_PATH] = EVAL
    _rehash(d / EVAL, disguised)
    audit = _audit(d, EVAL)
    assert audit.returncode == 1 and "a greedy setting (hard_greedy) draws one CoT per question" in audit.stdout
    rerun = _audit(d, EVAL, "--rerun")
    assert rerun.returncode == 1 and "DIFFERS" in rerun.stdout and "n_samples: 2 -> 1" in rerun.stdout, rerun.stdout


def test_a_table_made_from_a_chosen_subset_is_named_by_the_audit(tiny_dag, tmp_path):
    """`softtokens tables` run by hand on every file but one run's: each file it read is whole, so every other check
    passes; the audit holds the table's inputs to what its grid asks for and names the missing file. The honest twin:
    the workflow's own table audits clean (test_tiny_dag_end_to_end)."""
    d = _copy(tiny_dag, tmp_path)
    files = sorted({e for c in json.loads((d / "results/toy/tables/main.cells.json").read_text()) for e in c["evals"]})
    dropped = next(f for f in files if "fuzzy-seed0" in f)
    chosen = [f for f in files if f != dropped]
    proc = subprocess.run([str(BIN / "softtokens"), "tables", "--table", "main", "--settings",
                           json.dumps({"grid": "toy", "n_samples": 2}), "--out-dir", "results/toy/tables", *chosen],
                          cwd=d, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    audit = _audit(d, "results/toy/tables/main.md", "--config", "tiny.yaml")
    assert audit.returncode == 1 and "INCOMPLETE results/toy/tables/main.md: made without 1 of the" in audit.stdout
    assert dropped in audit.stdout, audit.stdout[-3000:]


def test_the_audit_reads_a_tree_from_any_directory_and_after_a_move(tiny_dag, tmp_path):
    """The honest twins of every path a record holds: the audit from another directory (an absolute path), and of a
    tree moved elsewhere, finds every link (records are relative to their own root, found from the file). A file
    moved inside the tree is named; a symlink is named as one."""
    d = _copy(tiny_dag, tmp_path)
    here = _audit(d, "results/toy/tables/main.md")
    assert here.returncode == 0, here.stdout[-3000:]
    elsewhere = subprocess.run([str(BIN / "softtokens"), "audit", str(d / "results/toy/tables/main.md")],
                               cwd=tmp_path, capture_output=True, text=True)
    assert elsewhere.returncode == 0, elsewhere.stdout[-3000:]
    assert elsewhere.stdout.count("[evaluate]") == here.stdout.count("[evaluate]")
    moved = tmp_path / "moved" / "tree"
    moved.parent.mkdir()
    d.rename(moved)
    audit = subprocess.run([str(BIN / "softtokens"), "audit", "results/toy/tables/main.md"], cwd=moved,
                           capture_output=True, text=True)
    assert audit.returncode == 0, audit.stdout[-3000:]
    (moved / EVAL).rename(moved / f"{EVAL}.bak")
    (moved / EVAL).symlink_to(moved / f"{EVAL}.bak")   # its own bytes kept elsewhere: named, and whole
    audit = _audit(moved, EVAL)
    assert audit.returncode == 0 and f"SYMLINK {EVAL}" in audit.stdout, audit.stdout[-3000:]
    (moved / EVAL).unlink()
    (moved / EVAL).symlink_to(moved / SAMPLE)           # another result's bytes: refused
    audit = _audit(moved, EVAL)
    assert audit.returncode == 1 and f"SYMLINK {EVAL}" in audit.stdout and f"NOT THIS FILE {EVAL}" in audit.stdout


def test_malformed_files_are_named_in_one_line_wherever_they_are_read(tiny_dag, tmp_path):
    """A truncated evaluation file (audit, status, the table job), 300 random bytes in a selected.json (the evaluation
    job), an empty file and a JSON of the wrong type: one line naming the file, no traceback, nothing overwritten."""
    import random

    d = _copy(tiny_dag, tmp_path)
    before = _bytes(d, *SUMMARIES)
    text = (d / EVAL).read_text()
    (d / EVAL).write_text(text[: len(text) // 2])
    audit = _audit(d, "results/toy/tables/main.md")
    said = audit.stdout + audit.stderr
    assert audit.returncode == 1 and "Traceback" not in said and f"MALFORMED {EVAL}" in said, said[-3000:]
    status = subprocess.run([str(BIN / "softtokens"), "status", "--config", "tiny.yaml"], cwd=d, capture_output=True,
                            text=True)
    assert "Traceback" not in status.stdout + status.stderr and f"failed: {EVAL} (MALFORMED" in status.stdout
    out = _refused_rebuild(d, before, f"MALFORMED {EVAL}")
    assert "Traceback" not in out
    (d / EVAL).write_text(text)
    selected = d / RUN / "selected.json"
    selected.write_bytes(random.Random(0).randbytes(300))
    proc = snakemake(*_args(d), "--cores", "1", "-f", EVAL)
    logged = proc.stdout + proc.stderr   # the failed job's log, shown on the console (profiles/default)
    assert proc.returncode != 0 and f"{RUN}/selected.json: binary bytes, not JSON text" in logged, logged[-2000:]
    assert "Traceback" not in logged
    for content, what in (("", "empty"), ("[1, 2]", "a JSON list, not the dict")):
        (d / EVAL).write_text(content)
        audit = _audit(d, EVAL)
        assert audit.returncode == 1 and what in audit.stdout and "Traceback" not in audit.stdout + audit.stderr


def test_a_pickled_weights_file_is_refused_before_it_is_opened(tiny_dag, tmp_path):
    """The selected checkpoint's weights replaced by a pickle that runs code on load, the manifest, the checkpoint's
    record and the run's rehashed (a careful forger): the evaluation refuses it, naming the file, before anything
    reads it: the code never runs. The honest twin: the real checkpoint evaluates (test_tiny_dag_end_to_end)."""
    import pickle

    from softtokens.model.checkpoint import TrainerState, manifest_sha256

    class Payload:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "pwned",))

    d = _copy(tiny_dag, tmp_path)
    best = d / RUN / "checkpoints/best"
    (best / "model.safetensors").unlink()
    (best / "pytorch_model.bin").write_bytes(pickle.dumps(Payload(), protocol=4))
    record = (best / "provenance.json").rename(tmp_path / "provenance.json")   # as training writes: manifest first
    TrainerState.read(best).write(best)   # the manifest redone over the new file
    record.rename(best / "provenance.json")
    _edit(best / "provenance.json", lambda rec: rec["output"].update({"sha256": manifest_sha256(best)}))
    proc = snakemake(*_args(d), "--cores", "1", "-f", EVAL)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "pytorch_model.bin is a pickle" in log, log[-3000:]
    assert not (tmp_path / "pwned").exists()
    audit = _audit(d, EVAL)
    assert audit.returncode == 1 and "pytorch_model.bin is a pickle" in audit.stdout


def test_the_rerun_log_is_the_reports_input_and_a_forged_line_does_not_count(tiny_dag, tmp_path):
    """One real re-run, then a rebuild: the report says what it found (the honest twin), and records the log by its
    hash. A line appended by hand claiming another file equal (its own hash not redone) is not counted, and the
    report made before it no longer audits clean (its leaf changed)."""
    d = _copy(tiny_dag, tmp_path)
    page = d / "results/toy/report/reproduction.md"
    assert _audit(d, EVAL, "--rerun").returncode == 0
    proc = snakemake(*_args(d), "--cores", "1")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "1 evaluation file(s) as they are now made again" in page.read_text() and "all equal" in page.read_text()
    assert _audit(d, "results/toy/report/reproduction.md", "--config", "tiny.yaml").returncode == 0
    log = d / "results/toy/audit/reruns.jsonl"
    line = json.loads(log.read_text().splitlines()[0])
    forged = {**line, "file": SAMPLE.removeprefix("results/toy/"), "file_sha256": sha256_file(d / SAMPLE)}
    with open(log, "a") as f:
        f.write(json.dumps(forged) + "\n")
    audit = _audit(d, "results/toy/report/reproduction.md", "--config", "tiny.yaml")
    assert audit.returncode == 1 and "reruns: CHANGED leaf" in audit.stdout, audit.stdout[-3000:]
    proc = snakemake(*_args(d), "--cores", "1")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    text = page.read_text()
    assert "1 line(s) of" in text and "do not hash to what they say" in text and "1 evaluation file(s)" in text


def test_honest_remakes_pass_every_check(tiny_dag, tmp_path):
    """The honest twins of the refusals above, on the real layout: one cell remade by its own job (`-f CELL`), a file
    remade with `-R FILE`, each followed by the rebuild they call for; a plain rerun that finds nothing to do. After
    each, the table jobs read every input, the audit of every table and of the report passes and status calls every
    file done."""
    d = _copy(tiny_dag, tmp_path)
    for remake in (("-f", EVAL), ("-R", LOGLIK)):
        proc = snakemake(*_args(d), "--cores", "2", *remake)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        proc = snakemake(*_args(d), "--cores", "2")
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        for target in ("results/toy/tables/main.md", "results/toy/tables/ood.md", "results/toy/report/reproduction.md"):
            audit = _audit(d, target, "--config", "tiny.yaml")
            assert audit.returncode == 0, (remake, target, audit.stdout[-3000:])
    status = subprocess.run([str(BIN / "softtokens"), "status", "--config", "tiny.yaml"], cwd=d, capture_output=True,
                            text=True)
    assert status.returncode == 0 and "failed:" not in status.stdout and " 0 failed" in status.stdout, status.stdout
