"""A tiny toy grid through a real SLURM (one node, Debian's slurm-wlm, accounting off) with the
repository's slurm profile, as a cluster user runs it, including a training job cancelled
mid-run (scancel) whose retry resumes from its saved state.

SLURM must be installed (`.ci/run` installs slurm-wlm and munge from Debian's packages) and the
test must run as root (the daemons); otherwise it is skipped with the reason printed, never faked."""

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

# the second tier (`make test-slow`, which CI runs after `make test`): minutes of work on a 2-core host
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HERE = Path(__file__).resolve().parent / "slurm"
STEPS = 40


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [b for b in ("slurmctld", "slurmd", "munged", "sbatch", "squeue") if not shutil.which(b)]
    if missing:
        reason = f"SLURM not installed here (no {', '.join(missing)}); .ci/run installs slurm-wlm and munge"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    if os.geteuid() != 0:
        print("SKIPPED: starting the SLURM daemons needs root")
        pytest.skip("starting the SLURM daemons needs root")
    state = tmp_path_factory.mktemp("slurmstate")
    start = subprocess.run([str(HERE / "start_slurm.sh"), str(state)], capture_output=True, text=True, timeout=180)
    if start.returncode != 0:
        reason = f"SLURM did not start on this machine: {(start.stdout + start.stderr)[-1500:]}"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    yield state
    subprocess.run([str(HERE / "stop_slurm.sh"), str(state)], timeout=60)
    # nothing left pointing SLURM's commands at the stopped controller (each later `snakemake` would
    # wait 9 s at import for its slurm plugin's `scontrol show config`)
    before = state / "slurm.conf.before"
    conf = Path("/etc/slurm/slurm.conf")
    assert (conf.read_bytes() == before.read_bytes()) if before.exists() else not conf.exists()


def tiny_grid() -> dict:
    from test_workflow import TINY

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    grid = copy.deepcopy(config["grids"]["toy"])
    grid.update(copy.deepcopy(TINY))
    grid["training"] = [{"model": "toy", "dataset": "toyarith", "modes": ["fuzzy"], "seeds": [0]}]
    grid["evaluation"].update(settings=["hard_greedy"], ood_benchmarks=[])
    grid["datasets"].pop("toychoice")
    grid.pop("sweep", None)  # one training job: the one the test cancels
    # long enough to be cancelled mid-run on a fast machine (a toy step takes ~0.2 s); the resume
    # state saved after every step
    grid["rl"].update(steps=STEPS, val_every=STEPS // 2, resume_save_steps=1)
    small = {"mem_mb": 1500, "runtime": 30}
    grid["resources"] = {"train": dict(small), "evaluate": dict(small), "evaluate_loglik": dict(small),
                         "cpu": dict(small)}
    config["grids"] = {"tiny": grid}
    config["grid"] = "tiny"
    return config


def _train_steps(resume: Path) -> int:
    f = resume / "metrics.jsonl"
    return sum('"kind": "train"' in line for line in f.read_text().splitlines()) if f.exists() else 0


def _train_job_ids() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i|%k|%j"], capture_output=True, text=True).stdout
    return [line.split("|")[0] for line in out.splitlines() if "train" in line]


def test_a_tiny_grid_through_slurm_survives_a_cancelled_training_job(slurm, tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(tiny_grid()))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    cmd = [str(BIN / "snakemake"), "--profile", str(ROOT / "profiles" / "slurm"), "-d", str(tmp_path), "-s",
           str(ROOT / "Snakefile"), "--configfile", str(cfg), "--slurm-status-command", "squeue",
           "--slurm-init-seconds-before-status-checks", "1", "--seconds-between-status-checks", "2",
           "--latency-wait", "10", "--config", "grid=tiny"]
    started = time.time()
    log = open(tmp_path / "snakemake.log", "w")
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, env=env)
    resume = tmp_path / "results/toy/runs/toy/toyarith/fuzzy/seed0/_resume"
    cancelled, cancelled_at = None, None
    deadline = time.time() + 900
    while proc.poll() is None and time.time() < deadline:
        if cancelled is None and _train_steps(resume) >= 3:
            jobs = _train_job_ids()
            if jobs:
                cancelled, cancelled_at = jobs[0], _train_steps(resume)
                subprocess.run(["scancel", cancelled], check=True)
        time.sleep(0.5)
    if proc.poll() is None:
        proc.kill()
    log.close()
    text = (tmp_path / "snakemake.log").read_text()
    print(f"SLURM run: {time.time() - started:.0f} s")
    assert proc.returncode == 0, text[-5000:]
    assert cancelled is not None, "no training job was seen running under SLURM"
    assert cancelled_at < STEPS - 2, f"cancelled at step {cancelled_at} of {STEPS}: too late to test a resume"
    res = tmp_path / "results/toy"
    assert (res / "tables/main.md").exists() and (res / "report/reproduction.md").exists()
    train_log = (res / "logs/train/toy/toyarith/fuzzy/seed0.log").read_text()
    assert "=== attempt 1" in train_log and "=== attempt 2" in train_log, train_log[-3000:]  # appended, not overwritten
    assert "SIGTERM received: resume state saved at step" in train_log
    prov = json.loads((res / "runs/toy/toyarith/fuzzy/seed0/metrics.jsonl.prov.json").read_text())
    attempts = prov["attempts"]
    assert len(attempts) >= 2 and attempts[0]["slurm_job_id"] == cancelled
    assert attempts[-1]["resumed_from_step"] >= 3 and attempts[-1]["slurm_job_id"] != cancelled
    steps = [json.loads(line)["step"] for line in (res / "runs/toy/toyarith/fuzzy/seed0/metrics.jsonl").read_text()
             .splitlines() if '"kind": "train"' in line]
    assert steps == list(range(1, STEPS + 1))  # every step once: nothing lost, nothing repeated
