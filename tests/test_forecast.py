"""The cost forecast of `softtokens plan` (report.forecast): its arithmetic on a grid computed by
hand, its default rates against the gpu-check file they come from, and forecast beside actual."""

import copy
import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from softtokens import cli
from softtokens.report import forecast
from softtokens.report.forecast import Throughput
from softtokens.train.plan import grid_architecture

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def tiny() -> dict:
    """The toy grid cut to numbers a hand can follow: one hard run (2 GPUs), two settings, one OOD set."""
    config = copy.deepcopy(yaml.safe_load((ROOT / "config.yaml").read_text()))
    g = config["grids"]["toy"]
    g["models"]["toy"]["train_gpus"] = 2
    g["datasets"]["toyarith"].update(test_size=10, validation_size=8)
    g["datasets"]["toychoice"]["test_size"] = 5
    g["training"] = [{"model": "toy", "dataset": "toyarith", "modes": ["hard"], "seeds": [0]}]
    g["rl"] = {"prompts_per_step": 2, "samples_per_prompt": 4, "steps": 10, "val_every": 5, "val_size": 64,
               "cot_max_tokens": 10, "answer_max_tokens": 4}
    g["evaluation"].update(settings=["hard_greedy", "hard_sample"], n_samples=4, cot_max_tokens=10,
                           answer_max_tokens=4, one_job_per_setting=True, ood_protocol="cloze")
    g["memory_plan"] = {"prompt_tokens": 20}
    g["resources"] = {"train": {"gpu": 2}, "evaluate": {"gpu": 1}, "evaluate_loglik": {"gpu": 1}}
    return config


def rates(config) -> Throughput:
    params = grid_architecture(config["grids"]["toy"], "toy").parameters  # measured on this model: no scaling
    return Throughput(rollout_decode=100.0, eval_decode=50.0, update={"hard": 200.0}, loglik_rows=2.5,
                      parameters=params, source="by hand")


def test_the_forecast_of_a_tiny_grid_is_the_hand_computed_one(tiny):
    jobs = forecast.forecast_jobs(tiny, "toy", rates(tiny)).set_index("job")
    # S = 10 CoT + 16 prefill + 4 answer = 30 decode steps; 8 rollout rows; prompts 20 tokens
    # a step: 8 x 30 / 100 (rollout) + 8 x (20 + 30) / 200 (update) = 4.4 s; 10 steps = 44 s
    # validations at 0, 5, 10: 3 x 8 rows (validation_size) x 30 / 50 = 14.4 s; over 2 GPUs: 29.2 s
    train = jobs.loc["train/toy/toyarith/hard/seed0"]
    assert train.wall_s == pytest.approx(29.2) and train.gpus == 2
    assert train.gpu_hours == pytest.approx(2 * 29.2 / 3600)
    for trained in ("base", "toyarith-hard-seed0"):
        assert jobs.loc[f"evaluate/toy/{trained}/toyarith/hard_greedy"].wall_s == pytest.approx(10 * 30 / 50)
        assert jobs.loc[f"evaluate/toy/{trained}/toyarith/hard_sample"].wall_s == pytest.approx(10 * 4 * 30 / 50)
        assert jobs.loc[f"evaluate_loglik/toy/{trained}/toychoice"].wall_s == pytest.approx(5 / 2.5)
    assert len(jobs) == 1 + 2 * 3
    gpu_seconds = 58.4 + 2 * (6 + 24) + 2 * 2
    assert jobs.gpu_hours.sum() == pytest.approx(gpu_seconds / 3600)
    kinds = forecast.by_kind(jobs.reset_index()).set_index("rule")
    assert kinds.loc["evaluate", "jobs"] == 4 and kinds.loc["evaluate", "gpu_hours"] == pytest.approx(60 / 3600)
    # one node of 2 GPUs: 122.4 GPU-s spread = 61.2 s; 16 GPUs: the critical path, 29.2 s training + 24 s
    assert forecast.wall_clock_hours(jobs.reset_index(), 1, 2) == pytest.approx(61.2 / 3600)
    assert forecast.wall_clock_hours(jobs.reset_index(), 2, 8) == pytest.approx(53.2 / 3600)


def test_the_generative_protocol_decodes_one_cot_per_question(tiny):
    tiny["grids"]["toy"]["evaluation"]["ood_protocol"] = "generative"
    jobs = forecast.forecast_jobs(tiny, "toy", rates(tiny)).set_index("job")
    assert jobs.loc["evaluate_loglik/toy/base/toychoice"].wall_s == pytest.approx(5 * 30 / 50)


def test_rates_scale_with_the_parameter_count():
    half = forecast.DEFAULT.scaled_to(2 * forecast.DEFAULT.parameters)
    assert half.eval_decode == pytest.approx(forecast.DEFAULT.eval_decode / 2)
    assert half.update["soft"] == pytest.approx(forecast.DEFAULT.update["soft"] / 2)


def test_the_default_rates_are_the_committed_gpu_check_s():
    measured = forecast.throughput_from_gpu_check(json.loads((ROOT / "benchmarks/results/gpu_check_h100.json")
                                                             .read_text()))
    d = forecast.DEFAULT
    assert measured.parameters == d.parameters
    for a, b in [(measured.rollout_decode, d.rollout_decode), (measured.eval_decode, d.eval_decode),
                 (measured.loglik_rows, d.loglik_rows), *((measured.update[m], d.update[m]) for m in d.update)]:
        assert a == pytest.approx(b, rel=1e-3)


def test_forecast_beside_actual_per_job_kind(tiny):
    jobs = forecast.forecast_jobs(tiny, "toy", rates(tiny))
    actual = jobs[jobs.rule != "evaluate_loglik"].assign(wall_s=lambda d: 2 * d.wall_s,
                                                         gpu_hours=lambda d: 2 * d.gpu_hours)
    table = forecast.vs_actual(jobs, actual).set_index("kind")
    assert list(table.index) == ["train", "evaluate"]  # only jobs that ran are compared
    assert table.loc["train", "actual/forecast"] == pytest.approx(2.0)
    assert table.loc["evaluate", "wall_h_actual"] == pytest.approx(2 * 60 / 3600)


def test_plan_prints_grid_totals_per_job_kind_and_per_table(tiny, tmp_path, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tiny))
    report = tmp_path / "gpu_check.json"
    report.write_text((ROOT / "benchmarks/results/gpu_check_h100.json").read_text())
    cli.main(["plan", "--config", str(path), "--grid", "toy", "--throughput", str(report), "--nodes", "2"])
    out = capsys.readouterr().out
    assert f"throughput: {report}" in out
    for kind in ("| train | 1 |", "| evaluate | 4 |", "| evaluate_loglik | 2 |", "| **grid** | 7 |"):
        assert kind in out
    assert "| main (tab:main) |" in out and "wall-clock on 2 node(s) x 8 GPUs" in out


def test_plan_and_the_ledger_count_the_same_cells_per_table(tmp_path):
    """A table's cells as `softtokens plan` counts them (from the grid) and as the reproduction
    report's ledger counts them (from the evaluation files): the toy main table is 4 rows (base and
    three trainings) x (greedy pass@1, sample pass@1, sample pass@4) = 12 in both."""
    from softtokens.report import ledger, reproduction
    from softtokens.report.page import our_tables
    from softtokens.report.paper import CELL_KEYS
    from softtokens.run.jobs import GridJobs

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["grids"]["toy"]["results"] = str(tmp_path / "results")
    jobs = GridJobs({**config, "grid": "toy"})
    n = jobs.eval["n_samples"]
    for path in jobs.eval_targets():
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        sampled = p.stem.endswith("sample")   # the fixture's own files, not a rule of the code under test
        k = n if sampled else 1
        p.write_text(json.dumps({"n_samples": k, "pass@1": 0.5, "pass@k": {str(i): 0.5 for i in range(1, k + 1)},
                                 "mean_cot_length": 1.0, "n_problems": 4}))
    for path in jobs.loglik_targets():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"accuracy": 0.5, "nll_correct": 1.0, "n_problems": 4}))
    seeds = reproduction.seed_rows(jobs.eval_targets() + jobs.loglik_targets())
    tables = our_tables(sorted(set(seeds.benchmark) - {"toychoice"}))
    no_jobs = pd.DataFrame(columns=ledger.LEDGER_COLUMNS)   # cells are counted whatever the jobs cost
    measured = ledger.table_costs(ledger.cell_costs(seeds, no_jobs, CELL_KEYS), no_jobs, tables)
    planned = forecast.table_forecast(config, "toy", forecast.forecast_jobs(config, "toy"), tables)
    assert dict(zip(planned.table, planned.cells)) == dict(zip(measured.table, measured.cells))
    assert dict(zip(planned.table, planned.cells))["main (tab:main)"] == 12
