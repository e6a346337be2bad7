"""A result that leaves this machine (docs/reliability.md, "A crate"): the tiny toy DAG's Provenance Run Crate held
to the profile by the ecosystem's own validator and reader, offline, then zipped, unpacked where no results tree is,
and audited there: intact it passes; an edited number, a table's cell or one file copied over another is refused,
naming the file. On the session's shared DAG (tests/shared_dag.py), never changed: every crate is written under
the test's own directory."""

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from shared_dag import EVAL, SAMPLE
from test_workflow import BIN

from softtokens.store.files import sha256_file


def softtokens(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "softtokens"), *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def zipped(dag, tmp_path_factory) -> Path:
    """The whole toy grid's crate, zipped (as `make demo` would publish it), written outside the DAG."""
    out = tmp_path_factory.mktemp("crate") / "toy-crate"
    proc = softtokens("crate", "results/toy", "--out", str(out), "--zip", cwd=dag)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out.with_suffix(".zip")


def unpacked(zipped: Path, where: Path) -> Path:
    """The crate unpacked in a directory of its own, far from the DAG (no results tree beside it)."""
    where.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(zipped) as z:
        z.extractall(where / "crate")
    return where / "crate"


@pytest.mark.slow
def test_the_grids_crate_passes_the_provenance_run_crate_profile_offline_and_runcrate_reads_it(dag, tmp_path):
    from softtokens.crate.validate import PROFILE, validate

    out = tmp_path / "crate"
    proc = softtokens("crate", "results/toy/tables/main.md", "--out", str(out), cwd=dag)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = validate(out, tmp_path / "validator-cache")
    required = [i for i in verdict["issues"] if i[0] == "REQUIRED"]
    assert verdict["passed"] and not required, (PROFILE, verdict["issues"][:10])
    # every file of the main table's chain is in it with its sha256: the table's evaluation files, its record
    meta = json.loads((out / "ro-crate-metadata.json").read_text())
    by_id = {e["@id"]: e for e in meta["@graph"]}
    cells = json.loads((dag / "results/toy/tables/main.cells.json").read_text())
    evals = sorted({p for cell in cells for p in cell["evals"]})
    assert evals and all(p.startswith("results/toy/eval/") for p in evals)
    for rel in [*evals, "results/toy/tables/main.md", "results/toy/tables/main.cells.json"]:
        assert rel in by_id, rel
        assert by_id[rel]["sha256"] == sha256_file(dag / rel) == sha256_file(out / rel), rel
    actions = [e for e in meta["@graph"] if e.get("@type") == "CreateAction"]
    assert {a["name"].split(":")[0] for a in actions} >= {"prepare_data", "build_toy_base", "train", "select_checkpoint", "evaluate", "tables"}, \
        sorted(a["name"] for a in actions)
    report = subprocess.run([str(BIN / "runcrate"), "report", str(out)], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0 and "instrument: workflow/Snakefile" in report.stdout, report.stderr[-2000:]
    assert sum(line.startswith("action: ") for line in report.stdout.splitlines()) == len(actions)   # the run, each job


@pytest.mark.slow
def test_the_zipped_crate_audits_clean_where_no_results_tree_is(zipped, tmp_path):
    from softtokens.crate.validate import validate

    verdict = validate(zipped, tmp_path / "validator-cache")   # the zip itself (the README's `crate --zip --validate`)
    assert verdict["passed"] and not [i for i in verdict["issues"] if i[0] == "REQUIRED"], verdict["issues"][:10]
    crate = unpacked(zipped, tmp_path / "reviewer")
    assert not (tmp_path / "reviewer" / "results").exists()
    for target in (crate, zipped):   # unpacked, and the zip itself
        proc = softtokens("audit", str(target), cwd=tmp_path / "reviewer")
        assert proc.returncode == 0 and "crate intact" in proc.stdout, proc.stdout[-3000:]
    assert " 0 table cell(s)" not in proc.stdout and "table cell(s) recomputed" in proc.stdout
    # what the crate holds of a trained run whose name a URI must encode (the sweep's "hard@lr...") is found by it
    assert list(crate.glob("results/toy/runs/toy/toyarith/*@lr*/seed0/selected.json"))
    assert not list(crate.rglob("*%40*")) and not list(crate.rglob(".snakemake_timestamp"))


def _edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=1))


@pytest.mark.parametrize("attack, named", [
    ("number", EVAL),                                  # a pass@1 edited inside the crate
    ("cell", "results/toy/tables/main.cells.json"),    # a table's cell edited in its index
    ("copy", SAMPLE),                                  # one setting's file copied over another's
])
def test_an_edited_crate_is_refused_naming_the_file(zipped, tmp_path, attack, named):
    crate = unpacked(zipped, tmp_path / "reviewer")
    if attack == "number":
        _edit_json(crate / EVAL, lambda d: d.update({"pass@1": 0.97, "pass@k": {"1": 0.97}}))
    elif attack == "cell":
        _edit_json(crate / named, lambda cells: cells[0].update(value="99.9 ± 0.1"))
    else:
        shutil.copyfile(crate / EVAL, crate / SAMPLE)
    proc = softtokens("audit", str(crate), cwd=tmp_path / "reviewer")
    problems = [line for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert proc.returncode == 1 and problems, proc.stdout[-3000:]
    assert any(named in line for line in problems), problems   # the file itself named (its hash, its record)
