"""The tiny toy DAG, run once to the end with a real `snakemake` (tests/shared_dag.py: built once a session, shared
with test_dag_faults and test_dag_audit, which run beside this module on other workers): what it produced, end to
end, and the honest twins of the refusals those modules test: a cell remade by its own job, a re-run's log read by
the report, each passing every check."""

import json
import os
import stat
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from softtokens.store.files import sha256_file
from shared_dag import EVAL, LOGLIK, SAMPLE, args_of, copy_of, run_audit
from test_workflow import BIN, job_counts, snakemake, tiny_args


def test_tiny_dag_end_to_end(dag, tmp_path):
    args = tiny_args(dag)
    res = dag / "results" / "toy"
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
    audit = subprocess.run([str(BIN / "softtokens"), "audit", "results/toy/tables/main.md"], cwd=dag,
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
            assert f"{held['specifications']:,} of {held['of']:,} distinct support" in row, c["key"]
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
                           "--column", "toyarith Greedy pass@1"], cwd=dag, capture_output=True, text=True)
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
    status = subprocess.run([str(BIN / "softtokens"), "status", "--config", "tiny.yaml"], cwd=dag,
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
    copied = copy_of(dag, tmp_path)
    args, res = tiny_args(copied), copied / "results" / "toy"
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
                            "--column", "toyarith Greedy pass@1"], cwd=copied, capture_output=True, text=True)
    assert audit.returncode == 1 and "VALUE UNCHANGED" in audit.stdout, audit.stdout



def _job_starts(dag) -> list[str]:
    """The rules of the tiny DAG's build in the order its jobs started (Snakemake's log of that run)."""
    logs = sorted((dag / ".snakemake" / "log").glob("*.snakemake.log"))
    assert logs, "the tiny DAG's build left no Snakemake log"
    return [line.split()[1].rstrip(":") for line in logs[0].read_text().splitlines()
            if line.startswith(("localrule ", "rule "))]


def test_training_runs_start_before_evaluations_and_selections_at_once(dag):
    """grid.resources.PRIORITY: with the tiny grid's four training runs (two modes, two more learning rates) and the
    base model's evaluations ready at once on two cores, every run starts before any evaluation (without priorities
    Snakemake started the base model's evaluation beside the first run, and in the demo a selection waited 54 s behind
    a figure); a selection starts before the first evaluation."""
    starts = _job_starts(dag)
    trains = [i for i, r in enumerate(starts) if r == "train"]
    evals = [i for i, r in enumerate(starts) if r in ("evaluate", "evaluate_loglik")]
    assert len(trains) == 4 and len(evals) == 9, starts   # 3 models x (2 settings + the out-of-domain set)
    assert max(trains) < min(evals), starts
    assert starts.index("build_toy_base") < min(trains) and starts.index("select_checkpoint") < min(evals), starts


def test_outputs_are_group_readable(dag):
    """Results respect the umask (a plain open's mode), not mkstemp's 0600: a group on a shared file
    system reads them."""
    mask = os.umask(0)
    os.umask(mask)
    want = 0o444 & ~mask
    unreadable = [p for p in (dag / "results/toy").rglob("*")
                  if p.is_file() and stat.S_IMODE(p.stat().st_mode) & 0o444 != want]
    assert not unreadable, unreadable[:5]


def test_runs_that_failed_to_learn_are_named_everywhere(dag):
    """The tiny DAG's runs (its sweep's two included) answer no validation question right (nor its base): each
    selection says so, the tables mark the rows †, the verdicts resting on them name them, status lists them."""
    res = dag / "results/toy"
    for mode in ("hard", "fuzzy"):
        selected = json.loads((res / f"runs/toy/toyarith/{mode}/seed0/selected.json").read_text())
        assert "no trained step answers a validation question right" in selected["failed_to_learn"]
    assert "toyarith hard †" in (res / "tables/main.md").read_text()
    report = (res / "report/reproduction.md").read_text()
    assert "failed to learn" in report and "toy toyarith hard seed 0" in report
    claims = json.loads((res / "report/claims.json").read_text())["ours"]
    assert any("toy toyarith fuzzy seed 0" in c["failed_runs"] for c in claims)
    status = subprocess.run([str(BIN / "softtokens"), "status", "--config", "tiny.yaml"], cwd=dag,
                            capture_output=True, text=True)
    assert "4 run(s) failed to learn" in status.stdout and "toy/toyarith/hard/seed0: no trained step" in status.stdout


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


@pytest.mark.slow
def test_the_rerun_log_is_the_reports_input_and_a_forged_line_does_not_count(dag, tmp_path):
    """One real re-run, then a rebuild: the report says what it found (the honest twin), and records the log by its
    hash. A line appended by hand claiming another file equal (its own hash not redone) is not counted, and the
    report made before it no longer audits clean (its leaf changed)."""
    d = copy_of(dag, tmp_path)
    page = d / "results/toy/report/reproduction.md"
    assert run_audit(d, EVAL, "--rerun").returncode == 0
    proc = snakemake(*args_of(d), "--cores", "1")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "1 evaluation file(s) as they are now made again" in page.read_text() and "all equal" in page.read_text()
    assert run_audit(d, "results/toy/report/reproduction.md", "--config", "tiny.yaml").returncode == 0
    log = d / "results/toy/audit/reruns.jsonl"
    line = json.loads(log.read_text().splitlines()[0])
    forged = {**line, "file": SAMPLE.removeprefix("results/toy/"), "file_sha256": sha256_file(d / SAMPLE)}
    with open(log, "a") as f:
        f.write(json.dumps(forged) + "\n")
    audit = run_audit(d, "results/toy/report/reproduction.md", "--config", "tiny.yaml")
    assert audit.returncode == 1 and "reruns: CHANGED leaf" in audit.stdout, audit.stdout[-3000:]
    proc = snakemake(*args_of(d), "--cores", "1")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    text = page.read_text()
    assert "1 line(s) of" in text and "do not hash to what they say" in text and "1 evaluation file(s)" in text


@pytest.mark.slow
def test_honest_remakes_pass_every_check(dag, tmp_path):
    """The honest twins of the refusals test_dag_faults and test_dag_audit make, on the real layout: one cell remade by
    its own job (`-f CELL`: that job alone), then a file remade with `-R FILE` (its job and everything downstream of
    either, the rebuild they call for). The table jobs read every input, the audit of every table and of the report
    passes, status calls every file done, and a plain rerun finds nothing to do."""
    d = copy_of(dag, tmp_path)
    for remake in (("-f", EVAL), ("-R", LOGLIK)):
        proc = snakemake(*args_of(d), "--cores", "2", *remake)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    for target in ("results/toy/tables/main.md", "results/toy/tables/ood.md", "results/toy/report/reproduction.md"):
        audit = run_audit(d, target, "--config", "tiny.yaml")
        assert audit.returncode == 0, (target, audit.stdout[-3000:])
    status = subprocess.run([str(BIN / "softtokens"), "status", "--config", "tiny.yaml"], cwd=d, capture_output=True,
                            text=True)
    assert status.returncode == 0 and "failed:" not in status.stdout and " 0 failed" in status.stdout, status.stdout
    assert job_counts(snakemake(*args_of(d), "-n")) == {}
