"""A run is what it computes (grid.identity): two names of one run are trained once, the second name's selection
points at the first's and is held to computing the same, and everything downstream (evaluation, the audit) reads
the run through either name."""

import json
from pathlib import Path

import pytest
from test_evaluate_cli import SETTINGS as EVAL_SETTINGS

from softtokens.audit.chain import audit
from softtokens.cli import main
from softtokens.data.sources import loader_kind
from softtokens.config.grids import PAPER_RL, load_config
from softtokens.config.grids import computing_settings
from softtokens.grid.identity import run_identity
from softtokens.grid.jobs import GridJobs
from softtokens.store.paths import run_dir

ROOT = Path(__file__).resolve().parents[1]
TRAIN = dict(PAPER_RL, mode="hard", seed=0, lr=1e-3, prompts_per_step=2, samples_per_prompt=2, steps=1, warmup_steps=1,
             cot_max_tokens=6, answer_max_tokens=4, val_every=1, val_size=4, micro_batch_size=4,
             compute_dtype="float32", validation_cot_max_tokens=6)


def test_no_two_training_jobs_of_the_paper_ablations_and_sweeps_grids_compute_the_same():
    """Across the three grids that share results/paper, each identity is trained under one name only (the sweeps
    grid's noise factors 0.1, 1.0 and 3.0 on llama-3b x gsm8k are the ablations grid's gamma runs; its learning
    rates equal to a model's own are the paper grid's runs)."""
    config = load_config(ROOT / "config.yaml", loader_kind)
    trained: dict[str, set[str]] = {}
    for grid in ("paper", "ablations", "sweeps"):
        jobs = GridJobs({**config, "grid": grid})
        for run in jobs.names.trained_runs():
            trained.setdefault(run_identity(jobs.grid, run, jobs.run_settings(run)), set()).add(
                run_dir(jobs.results, run))
    assert all(len(dirs) == 1 for dirs in trained.values()), [d for d in trained.values() if len(d) > 1]
    sweeps = GridJobs({**config, "grid": "sweeps"})
    assert {r.arm: c.arm for r, (c, g) in sweeps.shared.items()} == {
        "fuzzy@noise0.1": "fuzzy@gamma0.1", "fuzzy@noise1": "fuzzy@gamma1.0", "fuzzy@noise3": "fuzzy@gamma3.0"}
    assert {g for _, g in sweeps.shared.values()} == {"ablations"}
    # the name is not part of what a run computes; a setting that changes the maths is, memory-only ones are not
    base = computing_settings({**TRAIN, "variant": "a"})
    assert base == computing_settings({**TRAIN, "variant": "b", "micro_batch_size": 1, "val_batch_size": 8})
    assert base != computing_settings({**TRAIN, "noise_factor": 0.1})


@pytest.fixture(scope="module")
def trained(base, tmp_path_factory):
    """One tiny hard run, trained and selected through the CLI (its records as a workflow job writes them)."""
    d = tmp_path_factory.mktemp("identity") / "results/runs/toy/toyarith/hard/seed0"
    assert main(["train", "--settings", json.dumps(TRAIN), "--base", str(base / "model"), "--train",
                 str(base / "train.jsonl"), "--validation", str(base / "validation.jsonl"), "--state-dir",
                 str(d / "_resume"), "--checkpoints", str(d / "checkpoints"), "--metrics", str(d / "metrics.jsonl")]) == 0
    assert main(["select", "--metrics", str(d / "metrics.jsonl"), "--checkpoints", str(d / "checkpoints"), "--out",
                 str(d / "selected.json")]) == 0
    return d


def test_a_second_name_shares_the_run_and_is_evaluated_and_audited_through_it(trained, toy_rows, monkeypatch):
    monkeypatch.chdir(trained.parents[5])
    rel = Path(*trained.parts[-6:])
    alias = rel.parent.parent / "hard@same" / "seed0"
    assert main(["select", "--share", str(rel / "selected.json"), "--settings",
                 json.dumps({**TRAIN, "variant": "same", "micro_batch_size": 2}), "--out",
                 str(alias / "selected.json")]) == 0
    doc = json.loads((alias / "selected.json").read_text())
    assert doc["shared_with"] == rel.as_posix() and doc["checkpoint"] == json.loads(
        (rel / "selected.json").read_text())["checkpoint"]
    assert not (alias / "metrics.jsonl").exists()   # trained once: its files are the run's
    data = Path("test.jsonl")
    data.write_text("".join(json.dumps(r) + "\n" for r in toy_rows["test"][:3]))
    outs = {}
    for name, sel in (("own", rel), ("alias", alias)):
        outs[name] = Path(f"eval-{name}.json")
        assert main(["evaluate", "--settings", json.dumps(EVAL_SETTINGS), "--selected", str(sel / "selected.json"),
                     "--data", str(data), "--setting", "hard_greedy", "--out", str(outs[name])]) == 0
    a, b = (json.loads(outs[n].read_text()) for n in ("own", "alias"))
    assert a["problems"] == b["problems"] and a["pass@1"] == b["pass@1"]   # the same checkpoint
    lines, problems = audit(alias / "selected.json")
    assert problems == 0, "\n".join(lines)


def test_a_second_name_that_computes_something_else_is_refused(trained, monkeypatch):
    monkeypatch.chdir(trained.parents[5])
    rel = Path(*trained.parts[-6:])
    other = rel.parent.parent / "hard@gamma3" / "seed0"
    with pytest.raises(SystemExit, match="does not compute what it asks for .*settings noise_factor differ"):
        main(["select", "--share", str(rel / "selected.json"), "--settings",
              json.dumps({**TRAIN, "variant": "gamma3", "noise_factor": 3.0}), "--out", str(other / "selected.json")])
    assert not (other / "selected.json").exists()
    # a share edited to point at a run of other settings after it was written: the audit says so
    alias = rel.parent.parent / "hard@same2" / "seed0"
    assert main(["select", "--share", str(rel / "selected.json"), "--settings",
                 json.dumps({**TRAIN, "variant": "same2"}), "--out", str(alias / "selected.json")]) == 0
    rec = json.loads((rel / "metrics.jsonl.prov.json").read_text())
    rec["config"]["lr"] = 1.0   # the shared run's own record, as if it had been trained otherwise
    (rel / "metrics.jsonl.prov.json").write_text(json.dumps(rec))
    lines, problems = audit(alias / "selected.json")
    assert problems >= 1 and any("NOT THE SAME RUN" in line and "lr" in line for line in lines), "\n".join(lines)
