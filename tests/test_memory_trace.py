"""The memory plan held to PyTorch's own accounting (gpucheck.trace): paper jobs traced at their real widths
through the project's code under fake tensors, at reduced depth, phase by phase against sizing.plan at the same
depth; a change to the head loss, the sharding or the optimizer that moves memory fails here, not on an H100."""

import json

import pytest
import torch

from softtokens.gpucheck.trace_plan import extrapolated, job_traces, planned_phases
from softtokens.sizing.trace_table import BAND, outside_band, trace_table



@pytest.fixture(scope="module")
def paper():
    from softtokens.config.grids import read_config
    from softtokens.sizing.gpus import resolve_gpus
    from softtokens.sizing.plan import grid_plan

    config, _ = read_config("config.yaml", "paper")
    resolve_gpus(config, "paper")   # `gpus_per_run: auto`, as the workflow and `softtokens plan` resolve it
    models = config["grids"]["paper"]["models"]
    return {r["job"]: {**r, "source": models[r["model"]]["source"]} for r in grid_plan(config, "paper")}


def held_to_plan(row: dict, depths=(2, 3)) -> dict[str, tuple[float, float]]:
    """{phase: (traced, planned)} bytes at the model's own depth, the trace extrapolated from two reduced ones."""
    traced = job_traces(row, depths)
    arch = row["arch"]
    return {phase: (extrapolated({d: k["Total"] for d, k in at.items()}, arch.layers), planned_phases(row, arch)[phase])
            for phase, at in traced.items()}


@pytest.mark.slow
def test_every_phase_of_a_training_job_is_within_five_percent_of_its_trace(paper):
    """llama-8b x GSM8K on its four GPUs (one micro-batch with recomputation, an untied head whose E gradient comes
    at the second chunk), traced at two and three layers and extrapolated to its 32: held, rollout, update, optimizer
    step, validation and a staged save, each within BAND of the plan (every paper job: `softtokens plan --trace`,
    benchmarks/results/memory_trace_paper.json, held below)."""
    ratios = {phase: t / p for phase, (t, p) in held_to_plan(paper["train llama-8b/gsm8k"]).items()}
    assert set(ratios) == {"held", "rollout", "update", "optimizer step", "validation", "staged save"}
    assert all(BAND[0] <= r <= BAND[1] for r in ratios.values()), ratios


def test_the_committed_trace_of_every_paper_job_is_the_plan_s_today(paper):
    """benchmarks/results/memory_trace_paper.json (`softtokens plan --grid paper --trace`): every phase of every
    paper job within BAND, and its planned numbers the plan's now: a formula changed without tracing again fails."""
    from pathlib import Path

    from softtokens.sizing.plan import GB

    record = json.loads((Path(__file__).resolve().parents[1] / "benchmarks/results/memory_trace_paper.json").read_text())
    assert {r["job"] for r in record["phases"]} == set(paper)
    for r in record["phases"]:
        assert BAND[0] <= r["ratio"] <= BAND[1], r
        assert planned_phases(paper[r["job"]], paper[r["job"]]["arch"])[r["phase"]] / GB == \
            pytest.approx(r["planned_gb"], abs=1e-3), r


@pytest.mark.slow
def test_evaluation_and_log_likelihood_are_within_five_percent_of_their_trace(paper):
    """The six-setting evaluation's decode (192 rows of a continuous setting) and the log-likelihood batch (at their
    models' depths, from two and three layers), the latter's head
    widens W to float32 on every device (the plan counted none on a GPU, and a KV cache the trace does not hold)."""
    for job in ("evaluate llama-3b", "evaluate_loglik llama-8b"):
        (phase, (t, p)), = held_to_plan(paper[job]).items()
        assert BAND[0] <= t / p <= BAND[1], (job, phase, t / p)


def test_memory_is_affine_in_depth_so_two_depths_give_the_job_s_own(paper):
    """Every phase at three layers equals the line through one and two (the traced plan extrapolates from two
    reduced depths to the model's own)."""
    row = paper["evaluate_loglik llama-3b"]
    at = job_traces(row, (1, 2, 3))["loglik"]
    assert at[3]["Total"] == pytest.approx(extrapolated({1: at[1]["Total"], 2: at[2]["Total"]}, 3), rel=1e-6)


def test_a_ratio_outside_the_band_is_marked_and_counted():
    records = [{"job": "train m/d", "phase": "update", "planned_gb": 10.0, "traced_gb": 10.4, "ratio": 1.04},
               {"job": "train m/d", "phase": "rollout", "planned_gb": 10.0, "traced_gb": 9.2, "ratio": 0.92}]
    table = trace_table(records)
    assert table.splitlines()[0] == "| job | phase | planned GB | traced GB | traced / planned |"
    assert "| train m/d | update | 10.00 | 10.40 | 1.040 |" in table and "**0.920**" in table
    assert outside_band(records) == records[1:]


def test_the_tracker_counts_a_model_called_again_and_a_frozen_one():
    """torch's MemTracker refuses a module called in a new iteration (a decode step, a micro-batch) and one whose
    parameters need no gradient; PhaseTracker counts both, and each phase reads its own peak."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from softtokens.gpucheck.trace import PhaseTracker

    with FakeTensorMode():
        lin = torch.nn.Linear(1000, 1000).requires_grad_(False)   # 4 MB of weights
        tracker = PhaseTracker()
        tracker.track_external(lin)
        with tracker:
            x = torch.empty(500, 1000)
            tracker.start_phase()
            for _ in range(3):
                y = lin(x)
                del y
            first = tracker.peak()["Total"]
            tracker.start_phase()
            z = lin(torch.empty(5, 1000))
            second = tracker.peak()["Total"]
            del z
    assert first == pytest.approx(4_004_000 + 2 * 2_000_000, rel=0.01)   # weights, x and one output of 500 rows
    assert second < first
