"""`softtokens status` (audit.status) on a results directory written by hand: one run done, one
running, one failed, one pending; evaluations in each state."""

import copy
import json
import os
import time
from pathlib import Path

import yaml

from softtokens import cli
from softtokens.audit.status import STALE_AFTER_S, grid_status, status_text
from softtokens.store import paths
from softtokens.store.files import write_json
from softtokens.store.provenance import Provenance

ROOT = Path(__file__).resolve().parents[1]


def write_rows(path: Path, rows: list[dict], age_s: float = 0.0) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = time.time() - age_s
    os.utime(path, (t, t))


def eval_doc(path: Path, **numbers) -> dict:
    """An evaluation document of a base model as its job writes it: its identity the file its path names."""
    from softtokens.store.eval_identity import eval_identity, expected_identity

    want = expected_identity(path)
    ident = eval_identity(want["model"], "base", want["benchmark"], want["setting"], {"temperature": 0.0}, "-", [])
    return Provenance("evaluate", {}).embedded({"setting": want["setting"], "n_samples": 1, **numbers,
                                                "identity": ident}, path)


def steps(n: int, seconds: float = 10.0) -> list[dict]:
    rows = [{"kind": "validation", "step": 0, "val_greedy_accuracy": 0.25}]
    for s in range(1, n + 1):
        rows.append({"kind": "train", "step": s, "reward": 10.0 * s, "seconds_rollout": seconds / 2,
                     "seconds_reward": 0.0, "seconds_update": seconds / 2})
        if s % 4 == 0:
            rows.append({"kind": "validation", "step": s, "val_greedy_accuracy": 0.25 + s / 100})
    return rows


def test_status_of_a_grid_with_a_run_in_every_state(tmp_path, capsys):
    config = copy.deepcopy(yaml.safe_load((ROOT / "config.yaml").read_text()))
    grid = config["grids"]["toy"]
    grid["results"] = str(tmp_path / "results")
    grid["training"] = [{"model": "toy", "dataset": "toyarith", "modes": ["hard"], "seeds": [0, 1, 2, 3]}]
    grid.pop("sweep", None)   # the runs above only (the toy's learning-rate sweep would add two)
    grid["evaluation"]["one_job_per_setting"] = True
    grid["resources"] = {"train": {"gpu": 2}, "evaluate": {"gpu": 1}}
    results, total = grid["results"], grid["rl"]["steps"]
    run = {s: Path(results) / "runs/toy/toyarith/hard" / f"seed{s}" for s in range(4)}
    write_rows(run[0] / paths.METRICS, steps(total))                       # done, as its job wrote it
    Provenance("train", {}).write_sidecar(run[0] / paths.METRICS)
    write_rows(run[0] / paths.ATTEMPTS, [{"attempt": 1, "host": "elsewhere"}, {"attempt": 2, "host": "elsewhere"}])
    write_rows(run[1] / paths.RESUME / paths.METRICS, steps(5))             # running: written a minute ago,
    with open(run[1] / paths.RESUME / paths.METRICS, "a") as f:            # its step 6 half-way written
        f.write('{"kind": "train", "step": 6, "rew')
    write_rows(run[1] / paths.ATTEMPTS, [{"attempt": 1, "host": "node7"}], age_s=600)
    os.utime(run[1] / paths.RESUME / paths.METRICS, (time.time() - 60,) * 2)
    write_rows(run[2] / paths.RESUME / paths.METRICS, steps(9), age_s=2 * STALE_AFTER_S)  # failed: silent
    write_rows(run[2] / paths.ATTEMPTS, [{"attempt": 1, "host": "node7"}], age_s=2 * STALE_AFTER_S)
    base = Path(results) / "eval/toy/base/toyarith"
    base.mkdir(parents=True)
    write_json(base / "hard_greedy.json", eval_doc(base / "hard_greedy.json"))
    logs = Path(results) / "logs/evaluate/toy/base/toyarith"
    write_rows(logs / "hard_sample.log", [{}], age_s=10)                     # running
    write_rows(logs / "soft_greedy.log", [{}], age_s=2 * STALE_AFTER_S)      # failed
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))

    status = grid_status(config, "toy")
    by_seed = {r.run: r for r in status["runs"]}
    done, running, failed, pending = (by_seed[f"toy/toyarith/hard/seed{s}"] for s in range(4))
    assert (done.state, running.state, failed.state, pending.state) == ("done", "running", "failed", "pending")
    assert (running.step, running.steps, running.reward, running.val, running.best) == (5, total, 50.0, 0.29, 0.29)
    assert running.eta_s == (total - 5) * 10.0 and failed.eta_s is None
    assert running.gpu_hours == 5 * 10.0 * 2 / 3600  # its logged steps on its 2 GPUs
    assert done.attempts == 2 and pending.step == 0
    evals = {Path(e["file"]).stem: e["state"] for e in status["evals"] if "/base/" in e["file"]}
    assert (evals["hard_greedy"], evals["hard_sample"], evals["soft_greedy"], evals["soft_sample"]) == \
        ("done", "running", "failed", "pending")

    cli.main(["status", "--config", str(path), "--grid", "toy"])
    out = capsys.readouterr().out
    assert out.strip() == status_text(grid_status(config, "toy")).strip()
    assert "training runs 4: 1 done, 1 running, 1 failed, 1 pending; attempts 4 (1 restarts)" in out
    assert f"failed: {base / 'soft_greedy.json'}" in out
    line = next(x for x in out.splitlines() if x.startswith("toy/toyarith/hard/seed1"))
    assert line.split()[1:6] == ["running", f"5/{total}", "50.0", "29.0", "29.0"]  # reward 0-100, validation in %


def test_status_shows_the_toy_base_being_built(tmp_path):
    """The demo's longest job: its progress file (written every 25 supervised steps) is on the status
    screen with the step, loss and ETA; stale, it reads as failed; the model directory, as done."""
    from softtokens.audit.status import toy_base_status

    config = copy.deepcopy(yaml.safe_load((ROOT / "config.yaml").read_text()))
    config["grids"]["toy"]["results"] = str(tmp_path / "results")
    model = paths.model_dir(str(tmp_path / "results"), "toy")
    progress = Path(paths.model_progress(model))
    progress.parent.mkdir(parents=True)
    progress.write_text(json.dumps({"step": 299, "steps": 600, "loss": 0.812, "seconds": 100.0,
                                    "updated": time.time()}))
    text = status_text(grid_status(config, "toy"))
    assert f"toy base {model}: running, supervised step 300/600, loss 0.812, ETA 2m" in text
    assert toy_base_status(model, time.time() + STALE_AFTER_S + 1)["state"] == "failed"
    Path(model).mkdir()
    assert toy_base_status(model, time.time())["state"] == "done"


def test_a_run_or_evaluation_whose_files_are_not_its_jobs_is_not_done(tmp_path):
    """status reads what the audit reads: a finished run's metrics cut short (or edited) after its job wrote them,
    or an evaluation file edited, is not "done"; the line says why."""
    config = copy.deepcopy(yaml.safe_load((ROOT / "config.yaml").read_text()))
    grid = config["grids"]["toy"]
    grid["results"] = str(tmp_path / "results")
    grid["training"] = [{"model": "toy", "dataset": "toyarith", "modes": ["hard"], "seeds": [0, 1]}]
    grid.pop("sweep", None)
    results, total = grid["results"], grid["rl"]["steps"]
    for seed in (0, 1):
        metrics = Path(results) / f"runs/toy/toyarith/hard/seed{seed}" / paths.METRICS
        write_rows(metrics, steps(total))
        Provenance("train", {}).write_sidecar(metrics)
    cut = Path(results) / "runs/toy/toyarith/hard/seed1" / paths.METRICS
    cut.write_text("".join(cut.read_text().splitlines(keepends=True)[:8]))   # cut short after its job wrote it
    base = Path(results) / "eval/toy/base/toyarith"
    base.mkdir(parents=True)
    doc = eval_doc(base / "hard_greedy.json", **{"pass@1": 0.25})
    write_json(base / "hard_greedy.json", {**doc, "pass@1": 0.5})             # a number edited
    status = grid_status(config, "toy")
    by_seed = {r.run: r for r in status["runs"]}
    assert by_seed["toy/toyarith/hard/seed0"].state == "done"
    bad = by_seed["toy/toyarith/hard/seed1"]
    assert bad.state == "failed" and f"CHANGED {cut}" in bad.problem
    assert next(e["state"] for e in status["evals"] if e["file"].endswith("base/toyarith/hard_greedy.json")) == "failed"
    assert f"failed: toy/toyarith/hard/seed1 (CHANGED {cut}" in status_text(status)
