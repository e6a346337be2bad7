"""A record that cannot be fooled (docs/reliability.md, "Tampering"): edits to the tiny toy DAG's results, by hand
and by a careful forger who redoes every unkeyed hash, each refused by the rebuild and the audit naming the file; and
the audit's reach (any directory, a moved tree, re-execution). Each case on a copy of the session's DAG
(tests/shared_dag.py), with a real `snakemake`."""

import json
import shutil
import subprocess

import pytest
import yaml
from shared_dag import (
    EVAL,
    LOGLIK,
    RUN,
    SAMPLE,
    SUMMARIES,
    args_of,
    bytes_of,
    copy_of,
    edit,
    refused_rebuild,
    rehash,
    run_audit,
)
from test_workflow import BIN, snakemake


def test_a_hand_edited_number_is_refused_by_the_rebuild_and_the_audit(dag, tmp_path):
    d = copy_of(dag, tmp_path)
    before = bytes_of(d, *SUMMARIES)
    edit(d / EVAL, lambda doc: doc.update({"pass@1": 0.9, "pass@k": {"1": 0.9}}))
    refused_rebuild(d, before, EVAL, "pass@1 says 0.9")
    audit = run_audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and f"EDITED {EVAL}" in audit.stdout, audit.stdout[-3000:]
    cell = run_audit(d, "results/toy/tables/main.md", "--row", "toy toyarith hard", "--column",
                  "toyarith Greedy pass@1")
    assert cell.returncode == 1 and "pass@1 says 0.9" in cell.stdout, cell.stdout[-3000:]


def test_rows_edited_to_match_the_number_are_refused_by_the_document_hash(dag, tmp_path):
    d = copy_of(dag, tmp_path)
    before = bytes_of(d, *SUMMARIES)

    def consistent(doc):   # every problem right, and the summary to match: only the record's hash knows
        for row in doc["problems"]:
            row["correct"] = row["n"]
        doc["pass@1"], doc["pass@k"] = 1.0, {"1": 1.0}
    edit(d / EVAL, consistent)
    refused_rebuild(d, before, f"EDITED {EVAL}: the document")


def test_an_edited_record_is_refused(dag, tmp_path):
    """The embedded record's config edited (dtype, n_samples), then (by a careful forger who also
    recomputes the document's hash) its checkpoint switched to another run's: both are caught."""
    from softtokens.store.provenance import CONTENT_HASH, content_sha256

    d = copy_of(dag, tmp_path)
    before = bytes_of(d, *SUMMARIES)
    edit(d / EVAL, lambda doc: doc["provenance"]["config"].update({"dtype": "bfloat16", "n_samples": 8}))
    refused_rebuild(d, before, f"EDITED RECORD {EVAL}: its config hashes to")

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
    edit(d / EVAL, switched)
    refused_rebuild(d, before, f"EDITED RECORD {EVAL}: it was made from checkpoint {other}/checkpoints/best, "
                                "but its run selected")
    audit = run_audit(d, EVAL)
    assert audit.returncode == 1 and "but its run selected" in audit.stdout


@pytest.mark.slow
def test_an_edited_selection_of_a_sweep_run_is_refused_by_the_sweep_table(dag, tmp_path):
    """The search's number is each run's selected.json (its greedy validation accuracy): edited, and its
    document hash recomputed by a careful forger, the sweep table's rebuild still refuses it, naming the file
    and the metrics it contradicts; the table, its summary and the report stay as they were."""
    from softtokens.store.provenance import CONTENT_HASH, content_sha256

    d = copy_of(dag, tmp_path)
    res = "results/toy"
    kept = (f"{res}/tables/sweep_toy.md", f"{res}/tables/sweeps.json", f"{res}/report/reproduction.md")
    before = bytes_of(d, *kept)
    selected = f"{res}/runs/toy/toyarith/hard@lr3.5e-05/seed0/selected.json"

    def forged(doc):
        doc["val_greedy_accuracy"] = 0.99
        doc["provenance"][CONTENT_HASH] = content_sha256(doc)
    edit(d / selected, forged)
    proc = snakemake(*args_of(d), "--cores", "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "refused to read" in out and f"EDITED {selected}: val_greedy_accuracy says 0.99" in out, out[-4000:]
    assert bytes_of(d, *kept) == before
    audit = run_audit(d, f"{res}/tables/sweeps.json")
    assert audit.returncode == 1 and f"EDITED {selected}: val_greedy_accuracy" in audit.stdout, audit.stdout[-3000:]


def test_a_bad_paper_numbers_file_is_refused_naming_its_line(dag, tmp_path):
    """The config's paper_results names a file with a typo'd model, a duplicate cell and a mean that is no
    number: the report job stops naming each line; the previous report stays."""
    from softtokens.cells.paper import PAPER_RESULTS

    d = copy_of(dag, tmp_path)
    lines = PAPER_RESULTS.read_text().splitlines()
    fields = lines[3].split(",")
    fields[lines[0].split(",").index("mean")] = "seventy"
    bad = [lines[0], lines[1].replace("llama-3b", "llama-3bb", 1), lines[2], lines[2], ",".join(fields), *lines[4:]]
    (d / "paper.csv").write_text("\n".join(bad) + "\n")
    config = yaml.safe_load((d / "tiny.yaml").read_text())
    config["paper_results"] = str(d / "paper.csv")
    (d / "tiny.yaml").write_text(yaml.safe_dump(config))
    before = bytes_of(d, "results/toy/report/reproduction.md", "results/toy/report/claims.json")
    proc = snakemake(*args_of(d), "--cores", "1", "results/toy/report/reproduction.md")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert f"{d / 'paper.csv'}:2: model 'llama-3bb' is not one of the paper's (did you mean 'llama-3b'?)" in out, out[-3000:]
    assert f"{d / 'paper.csv'}:4: the cell of line 3 again" in out
    assert f"{d / 'paper.csv'}:5: mean 'seventy' is not a number" in out
    assert bytes_of(d, "results/toy/report/reproduction.md", "results/toy/report/claims.json") == before


def test_a_sidecar_beside_an_embedded_record_is_refused_naming_both(dag, tmp_path):
    """pass@1 set to 0.50 (rows untouched, no hash redone), then a sidecar beside the file: its embedded record
    copied, the file's sha256 filled in. It once switched every check of the file off; now the embedded record is
    the file's, and two records are an error naming both."""
    from softtokens.store.files import sha256_path

    d = copy_of(dag, tmp_path)
    before = bytes_of(d, *SUMMARIES)
    edit(d / EVAL, lambda doc: doc.update({"pass@1": 0.5}))
    rec = json.loads((d / EVAL).read_text())["provenance"]
    (d / f"{EVAL}.prov.json").write_text(json.dumps({**rec, "output": {"path": EVAL, "sha256": sha256_path(d / EVAL)}}))
    refused_rebuild(d, before, f"TWO RECORDS {EVAL}", f"{EVAL}.prov.json", f"EDITED {EVAL}")
    audit = run_audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and f"TWO RECORDS {EVAL}" in audit.stdout


@pytest.mark.slow
def test_a_record_without_its_hash_and_rows_cut_to_match_are_refused(dag, tmp_path):
    """content_sha256 removed, every wrong row dropped, n_problems and pass@1 set to match: no hash is a failure, and
    the rows are held to the test set (every question once)."""
    from softtokens.eval.metrics import mean_pass_at_k

    d = copy_of(dag, tmp_path)
    before = bytes_of(d, *SUMMARIES)

    def cut(doc):
        doc["provenance"].pop("content_sha256")
        doc["problems"] = [r for r in doc["problems"] if r["correct"] == r["n"]] or doc["problems"][:1]
        doc["n_problems"] = len(doc["problems"])
        doc["pass@1"] = mean_pass_at_k([(r["n"], r["correct"]) for r in doc["problems"]], 1)
        doc["pass@k"] = {"1": doc["pass@1"]}
    edit(d / EVAL, cut)
    out = refused_rebuild(d, before, f"NO HASH {EVAL}")
    assert f"EDITED {EVAL}: its rows are not its test set" in out
    audit = run_audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and f"NO HASH {EVAL}" in audit.stdout and "rows are not its test set" in audit.stdout


def test_a_selection_moved_to_another_step_is_refused_against_the_checkpoint_it_names(dag, tmp_path):
    """selected.json moved to another step, the metrics' validation rows edited to make that step the best, both
    files' hashes redone: the checkpoint the selection names holds the step its training saved, not the one claimed."""
    from softtokens.store.files import sha256_path
    from softtokens.train.selection import select_best

    d = copy_of(dag, tmp_path)
    before = bytes_of(d, *SUMMARIES)
    metrics = d / RUN / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    chosen = json.loads((d / RUN / "selected.json").read_text())["step"]
    other = next(r["step"] for r in rows if r["kind"] == "validation" and r["step"] not in (0, chosen))
    for r in rows:
        if r["kind"] == "validation" and r["step"] == other:
            r["val_greedy_accuracy"] = 1.0
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    side = d / RUN / "metrics.jsonl.prov.json"
    edit(side, lambda rec: rec["output"].update({"sha256": sha256_path(metrics)}))
    rehash(d / RUN / "selected.json", lambda doc: doc.update(
        {k: v for k, v in select_best(rows).items() if k in ("step", "val_greedy_accuracy", "val_correct")}))
    proc = snakemake(*args_of(d), "--cores", "1")   # the edited metrics remake the selection, which refuses
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and f"but validation picks step {other}" in out, out[-3000:]
    assert bytes_of(d, *SUMMARIES) == before
    audit = run_audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and "NOT ITS RUN'S" in audit.stdout


def test_self_consistent_rows_are_held_to_what_they_store(dag, tmp_path):
    """Out of domain, a question's `correct` flipped with the accuracy to match and the document rehashed: `correct`
    is recomputed from its answer and gold; its NLL edited the same way: recomputed from its stored
    log-likelihoods. Both named by the table's rebuild."""
    d = copy_of(dag, tmp_path)
    before = bytes_of(d, *SUMMARIES)

    def flipped(doc):
        row = doc["problems"][0]
        row["correct"] = not row["correct"]
        doc["accuracy"] = sum(bool(r["correct"]) for r in doc["problems"]) / len(doc["problems"])
        doc["problems"][1]["nll_correct"] += 0.5
        doc["nll_correct"] = sum(r["nll_correct"] for r in doc["problems"]) / len(doc["problems"])
    rehash(d / LOGLIK, flipped)
    out = refused_rebuild(d, before, f"EDITED {LOGLIK}: question", "nll_correct")
    assert "says correct=" in out and "is not its stored log-likelihood" in out


def test_a_table_or_report_whose_sibling_output_was_edited_is_refused(dag, tmp_path):
    """The CSV a table job wrote beside its Markdown, and the report's cells.csv, edited: a rebuild says "nothing to
    be done", so the audit must read every output of a job by its hash, not its existence."""
    d = copy_of(dag, tmp_path)
    for f in ("results/toy/tables/main.csv", "results/toy/report/cells.csv"):
        (d / f).write_text((d / f).read_text() + "forged,row\n")
    audit = run_audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and "CHANGED results/toy/tables/main.csv since its job wrote it" in audit.stdout
    audit = run_audit(d, "results/toy/report/reproduction.md")
    assert audit.returncode == 1 and "CHANGED results/toy/report/cells.csv since its job wrote it" in audit.stdout


def test_a_result_made_under_another_config_is_named_by_the_audit(dag, tmp_path):
    """The config's rl steps edited after the grid ran: every hash still holds, but the runs (and what rests on them)
    are not what the config now asks for."""
    d = copy_of(dag, tmp_path)
    assert run_audit(d, "results/toy/tables/main.md", "--config", "tiny.yaml").returncode == 0
    config = yaml.safe_load((d / "tiny.yaml").read_text())
    config["grids"]["toy"]["rl"]["steps"] = 5
    (d / "tiny.yaml").write_text(yaml.safe_dump(config))
    audit = run_audit(d, "results/toy/tables/main.md", "--config", "tiny.yaml")
    assert audit.returncode == 1 and f"MADE UNDER ANOTHER CONFIG {RUN}/metrics.jsonl: its train job" in audit.stdout


@pytest.mark.slow
def test_audit_rerun_makes_a_cell_again_and_finds_an_edit_every_hash_agrees_with(dag, tmp_path):
    """Re-execution, what an unkeyed hash cannot give: one cell made again from its checkpoint and test set is equal
    to its file, bit for bit; after a row's `correct` is flipped with pass@1 to match and the document rehashed (every
    hash agrees), the re-execution names the difference, and the report says what re-execution found."""
    d = copy_of(dag, tmp_path)
    cell = ("results/toy/tables/main.md", "--row", "toy toyarith hard", "--column", "toyarith Greedy pass@1")
    ok = run_audit(d, *cell, "--rerun")
    assert ok.returncode == 0 and "1 evaluation file(s) re-run: 1 equal, 0 differ" in ok.stdout, ok.stdout + ok.stderr

    def forged(doc):
        row = doc["problems"][0]
        row["correct"] = 1 - row["correct"]
        from softtokens.eval.metrics import mean_pass_at_k
        counts = [(r["n"], r["correct"]) for r in doc["problems"]]
        doc["pass@1"], doc["pass@k"] = mean_pass_at_k(counts, 1), {"1": mean_pass_at_k(counts, 1)}
    rehash(d / EVAL, forged)
    assert run_audit(d, EVAL).returncode == 0   # every hash agrees: only re-execution can tell
    bad = run_audit(d, *cell, "--rerun")
    assert bad.returncode == 1 and "DIFFERS" in bad.stdout and "pass@1" in bad.stdout
    reruns = [json.loads(x) for x in (d / "results/toy/audit/reruns.jsonl").read_text().splitlines()]
    assert [r["equal"] for r in reruns] == [True, False]


def test_a_test_set_row_without_its_id_is_named_by_the_audit_not_a_crash(dag, tmp_path):
    """A question of the prepared test set stripped of its id: the audit cannot hold the evaluation rows against
    that set, and says so, naming the file and line (it once raised KeyError and printed a traceback)."""
    d = copy_of(dag, tmp_path)
    data = d / "results/toy/data/toyarith/test.jsonl"
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    del rows[2]["id"]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    audit = run_audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and "Traceback" not in audit.stdout + audit.stderr, audit.stderr[-3000:]
    assert f"{data.relative_to(d)}:3: a row without an id" in audit.stdout, audit.stdout[-3000:]
    assert "cannot be read as questions" in audit.stdout


@pytest.mark.slow
def test_another_settings_result_copied_over_a_cell_is_refused_and_rerun_makes_what_the_path_asks(dag, tmp_path):
    """`cp fuzzy_sample.json hard_greedy.json`, nothing rehashed: the table job, the audit and status name the file
    (it is not where its job wrote it; its content is another setting's). A forger who also rewrites its identity and
    its record's path, and rehashes, is held to its own content (a greedy setting draws one sample); the re-run makes
    what the path asks for, whatever the file says, and differs."""
    from softtokens.store.eval_identity import IDENTITY
    from softtokens.store.provenance import OWN_PATH

    d = copy_of(dag, tmp_path)
    before = bytes_of(d, *SUMMARIES)
    shutil.copy(d / SAMPLE, d / EVAL)
    out = refused_rebuild(d, before, f"NOT WHERE IT WAS WRITTEN {EVAL}", f"NOT THIS FILE {EVAL}")
    assert "setting 'fuzzy_sample', its path names 'hard_greedy'" in out
    audit = run_audit(d, "results/toy/tables/main.md")
    assert audit.returncode == 1 and f"NOT THIS FILE {EVAL}" in audit.stdout, audit.stdout[-3000:]
    status = subprocess.run([str(BIN / "softtokens"), "status", "--config", "tiny.yaml"], cwd=d, capture_output=True,
                            text=True)
    assert status.returncode == 0 and f"failed: {EVAL} (NOT THIS FILE" in status.stdout, status.stdout[-2000:]

    def disguised(doc):
        doc[IDENTITY]["setting"] = doc["setting"] = doc["provenance"]["config"]["setting"] = "hard_greedy"
        doc["provenance"][OWN_PATH] = EVAL
    rehash(d / EVAL, disguised)
    audit = run_audit(d, EVAL)
    assert audit.returncode == 1 and "a greedy setting (hard_greedy) draws one CoT per question" in audit.stdout
    rerun = run_audit(d, EVAL, "--rerun")
    assert rerun.returncode == 1 and "DIFFERS" in rerun.stdout and "n_samples: 2 -> 1" in rerun.stdout, rerun.stdout


def test_a_table_made_from_a_chosen_subset_is_named_by_the_audit(dag, tmp_path):
    """`softtokens tables` run by hand on every file but one run's: each file it read is whole, so every other check
    passes; the audit holds the table's inputs to what its grid asks for and names the missing file. The honest twin:
    the workflow's own table audits clean (test_tiny_dag_end_to_end)."""
    d = copy_of(dag, tmp_path)
    files = sorted({e for c in json.loads((d / "results/toy/tables/main.cells.json").read_text()) for e in c["evals"]})
    dropped = next(f for f in files if "fuzzy-seed0" in f)
    chosen = [f for f in files if f != dropped]
    proc = subprocess.run([str(BIN / "softtokens"), "tables", "--table", "main", "--settings",
                           json.dumps({"grid": "toy", "n_samples": 2}), "--out-dir", "results/toy/tables", *chosen],
                          cwd=d, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    audit = run_audit(d, "results/toy/tables/main.md", "--config", "tiny.yaml")
    assert audit.returncode == 1 and "INCOMPLETE results/toy/tables/main.md: made without 1 of the" in audit.stdout
    assert dropped in audit.stdout, audit.stdout[-3000:]


@pytest.mark.slow
def test_the_audit_reads_a_tree_from_any_directory_and_after_a_move(dag, tmp_path):
    """The honest twins of every path a record holds: the audit from another directory (an absolute path), and of a
    tree moved elsewhere, finds every link (records are relative to their own root, found from the file). A file
    moved inside the tree is named; a symlink is named as one."""
    d = copy_of(dag, tmp_path)
    here = run_audit(d, "results/toy/tables/main.md")
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
    audit = run_audit(moved, EVAL)
    assert audit.returncode == 0 and f"SYMLINK {EVAL}" in audit.stdout, audit.stdout[-3000:]
    (moved / EVAL).unlink()
    (moved / EVAL).symlink_to(moved / SAMPLE)           # another result's bytes: refused
    audit = run_audit(moved, EVAL)
    assert audit.returncode == 1 and f"SYMLINK {EVAL}" in audit.stdout and f"NOT THIS FILE {EVAL}" in audit.stdout


