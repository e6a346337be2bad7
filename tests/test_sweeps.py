"""The paper's hyperparameter search (Appendix D) as a grid: the sweep's expansion into runs (Python), the
dry run of the paper's search, the selection and whether it is a finding, and the report's section. The tiny
sweep runs end to end in tests/test_tiny_dag.py."""

import copy
import json
from pathlib import Path

import pytest
import yaml
from test_workflow import PAPER_ENV, job_counts, snakemake

from softtokens.data.sources import loader_kind
from softtokens.config.grids import ConfigError, check_config, read_config
from softtokens.grid.jobs import GridJobs
from softtokens.config.sweeps import variant_name
from softtokens.search.selection import across_modes, select, value_text

ROOT = Path(__file__).resolve().parents[1]


def checked(grid: str, edit=None) -> dict:
    config, files = read_config(ROOT / "config.yaml", grid)
    if edit:
        edit(config)
    check_config(config, loader_kind, files)
    return config


def test_variant_names_read_back_to_their_values():
    for value in (1e-5, 9e-6, 6e-6, 1.4e-4, 3.5e-5):
        name = variant_name("learning_rate", value)
        assert name.startswith("lr") and "e-" in name and float(name[2:]) == value
    assert [variant_name("noise_factor", v) for v in (0.1, 0.33, 10.0)] == ["noise0.1", "noise0.33", "noise10"]
    assert value_text("learning_rate", 6e-6) == "6e-06" and value_text("noise_factor", 0.33) == "0.33"


def test_the_paper_search_expands_into_the_runs_appendix_d_describes():
    """10 learning rates x {hard, fuzzy} x the five (model, train set) cells of Table 1, and 5 noise factors x
    fuzzy x one train set per model; a value equal to the paper's at its steps is the paper grid's own run
    (no variant: shared, never trained twice); the search is selected on validation, never tested."""
    config = checked("sweeps")
    jobs = GridJobs({**config, "grid": "sweeps"})
    lr = [r for r in jobs.sweep.runs if r.param == "learning_rate"]
    noise = [r for r in jobs.sweep.runs if r.param == "noise_factor"]
    assert len(lr) == 10 * 2 * 5 and {r.mode for r in lr} == {"hard", "fuzzy"}
    assert len(noise) == 5 * 3 and {r.mode for r in noise} == {"fuzzy"}
    paper_lr = {m: s["lr"] for m, s in config["grids"]["paper"]["models"].items()}
    for r in lr:
        assert (r.variant == "") == (r.value == paper_lr[r.model]), r
    assert {r.value for r in noise if not r.variant} == {0.33}
    runs = {(r.model, r.dataset, r.mode, r.variant, r.seed) for r in jobs.training_runs()}
    assert len(runs) == 90 + 12 + 10   # new learning rates, new noise factors, the paper's own runs
    assert jobs.eval_targets() == [] and jobs.loglik_targets() == []
    # a variant's settings: the paper cell's (CoT length, memory choices) but its own learning rate
    settings = json.loads(jobs.train_settings("llama-3b", "math", "fuzzy@lr1e-05", 0))
    assert settings["lr"] == 1e-5 and settings["cot_max_tokens"] == 512 and settings["variant"] == "lr1e-05"
    gamma = json.loads(jobs.train_settings("qwen-3b", "math", "fuzzy@noise3", 0))
    assert gamma["noise_factor"] == 3.0 and gamma["lr"] == 8e-6   # the paper's ablation's 3.0 (Table 8), not 3.3
    # the shared run is the paper grid's run, to the byte of its settings (so Snakemake sees one job)
    paper = GridJobs({**checked("paper"), "grid": "paper"})
    assert jobs.train_settings("llama-8b", "gsm8k", "hard", 0) == paper.train_settings("llama-8b", "gsm8k", "hard", 0)
    assert sorted(jobs.sweep.files()) == sorted(
        [f"results/paper/tables/sweep_{m}.{e}" for m in ("llama-3b", "llama-8b", "qwen-3b")
         for e in ("md", "tex", "csv", "html")]
        + [f"results/paper/figures/sweep_{m}.{e}" for m in ("llama-3b", "llama-8b", "qwen-3b") for e in ("png", "pdf")]
        + ["results/paper/tables/sweeps.json"])


def test_the_expansion_is_idempotent_and_shorter_steps_share_nothing():
    config = checked("sweeps")
    before = copy.deepcopy(config["grids"]["sweeps"]["training"])
    check_config(config, loader_kind)   # a second check: no cell added twice
    assert config["grids"]["sweeps"]["training"] == before

    def short(c):
        c["grids"]["sweeps"]["sweep"]["steps"] = 1000
    jobs = GridJobs({**checked("sweeps", short), "grid": "sweeps"})
    assert all(r.variant for r in jobs.sweep.runs)   # at 1,000 steps no run is the paper grid's own
    assert json.loads(jobs.train_settings("llama-3b", "gsm8k", "hard@lr6e-06", 0))["steps"] == 1000


def test_a_sweep_naming_an_unknown_model_is_named_with_the_closest():
    def typo(c):
        c["grids"]["sweeps"]["sweep"]["pairs"][0] = ["llama-3bb", "gsm8k"]
    with pytest.raises(ConfigError, match=r"grids.sweeps.sweep.pairs.0.*llama-3bb.*llama-3b"):
        checked("sweeps", typo)


@pytest.mark.slow
def test_the_paper_search_plans_as_a_dry_run():
    proc = snakemake("-n", "--config", "grid=sweeps", env=PAPER_ENV)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    counts = job_counts(proc)
    # llama-3b x gsm8k's noise factors 0.1, 1.0 and 3.0 are the ablations grid's gamma runs (grid.identity): trained
    # once under those names (the first grid in config.yaml that names them), their selections shared
    assert counts["train"] == 112 and counts["select_checkpoint"] == 112 + 3 and counts["sweep_tables"] == 1
    assert "evaluate" not in counts and "reproduction_report" not in counts


def test_a_clear_winner_is_a_finding_and_values_within_noise_are_not():
    clear = select("llama-3b", "gsm8k", "learning_rate", "hard",
                   {6e-6: [0.70, 0.71, 0.69], 3e-6: [0.55, 0.56, 0.54], 1e-5: [0.40, 0.42, 0.41]}, 500, 6e-6, "paper")
    assert clear.finding and clear.selected == 6e-6 and clear.statement() == "selected 6e-06 (paper: 6e-06)"
    close = select("llama-3b", "gsm8k", "learning_rate", "fuzzy", {6e-6: [0.70], 8e-6: [0.71], 1e-6: [0.30]}, 500,
                   6e-6, "paper")
    assert not close.finding and close.selected == 8e-6 and set(close.tied) == {6e-6, 8e-6}
    assert close.statement() == ("selected 8e-06 (paper: 6e-06, within noise of it); 6e-06 within noise of it: "
                                 "the selection is not a finding")
    assert "one seed" in close.noise   # the validation set's error alone, said so
    far = select("qwen-3b", "math", "learning_rate", "hard", {8e-6: [0.2, 0.21], 2e-6: [0.6, 0.61]}, 500, 8e-6,
                 "paper")
    assert far.statement() == "selected 2e-06 (paper: 8e-06, outside the noise of it)"
    agree = across_modes([clear, close])
    assert agree[0]["same"] is False and agree[0]["overlap_within_noise"] == [6e-6]
    assert "not the same, but within noise" in agree[0]["statement"]


def test_differences_are_paired_on_the_validation_questions_and_ties_read_family_wise():
    """Two values scored on the same 500 questions, B right on A's 260 and on 10 more: unpaired, a 2-point
    difference is within noise (binomial errors of 2.2 points each); paired, the questions both get right or wrong
    cancel and it is a finding. Ties are read at a z Bonferroni-corrected over the K - 1 comparisons with the
    winner, and the winner's optimism (were all K equal) is stated."""
    from softtokens.search.selection import expected_max, family_z

    a = "1" * 260 + "0" * 240
    b = "1" * 270 + "0" * 230
    runs = {1e-6: [0.52], 2e-6: [0.54]}
    unpaired = select("m", "d", "learning_rate", "hard", runs, 500, None, "configured")
    paired = select("m", "d", "learning_rate", "hard", runs, 500, None, "configured", outcomes={1e-6: [a], 2e-6: [b]})
    assert not unpaired.finding and "unpaired" in unpaired.noise
    assert paired.finding and paired.selected == 2e-6 and "paired on the same 500 validation questions" in paired.noise
    assert family_z(2) == pytest.approx(1.96, abs=0.01) and family_z(10) == pytest.approx(2.77, abs=0.01)
    assert expected_max(10) == pytest.approx(1.5388, abs=1e-3) and expected_max(1) == 0.0
    ten = select("m", "d", "learning_rate", "hard", {v * 1e-6: [0.5 + 0.001 * v] for v in range(1, 11)}, 500, None,
                 "configured")
    assert ten.z == pytest.approx(2.77, abs=0.01)
    assert ten.optimism == pytest.approx(expected_max(10) * ten.values[-1]["se"])


def test_a_models_train_sets_combine_into_its_one_value():
    """The paper reports one learning rate per model: per model, its train sets' means averaged (each weighted
    equally), the difference's error from theirs."""
    from softtokens.search.selection import COMBINED, Search, combine

    gsm = Search({6e-6: [0.70, 0.72], 8e-6: [0.60, 0.61]}, {}, 500)
    math_ = Search({6e-6: [0.30, 0.31], 8e-6: [0.36, 0.37]}, {}, 500)
    s = combine({"gsm8k": gsm, "math": math_}, "llama-3b", "learning_rate", "hard", 6e-6, "paper", [])
    assert s.dataset == COMBINED and s.selected == 6e-6 and s.values[0]["mean"] == pytest.approx((0.71 + 0.305) / 2)


def test_the_report_says_not_yet_run_until_the_search_has_results():
    from softtokens.report.sweeps import sweep_blocks

    blocks = sweep_blocks(None, toy=False)
    assert blocks[0] == ("h2", "The hyperparameter search (Appendix D)") and "Not yet run" in blocks[1][1]
    s = select("toy", "toyarith", "learning_rate", "hard", {7e-5: [0.5], 3.5e-5: [0.1], 1.4e-4: [0.0]}, 128, 7e-5,
               "configured")
    summary = {"selections": [s.record()], "across_modes": [], "z": 1.96, "runs": 3, "statistic": "x", "paper": "y"}
    blocks = sweep_blocks(summary, toy=True)
    assert "Not yet run" not in str(blocks)
    assert blocks[2][1].iloc[0]["selection"] == "selected 7e-05 (configured: 7e-05)"


@pytest.mark.slow
def test_plan_offers_a_cheaper_reading_with_its_cost_and_what_it_gives_up(capsys):
    from softtokens import cli

    cli.main(["plan", "--config", str(ROOT / "config.yaml"), "--grid", "sweeps"])
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("the hyperparameter search:"))
    assert "112 runs of the sweep, 10 of them the reused grid's own" in line
    cheap = next(x for x in out.splitlines() if x.startswith("a cheaper reading:"))
    assert "one seed, 1,000 steps" in cheap and "it gives up:" in cheap and "favour values that learn fast" in cheap


def test_the_toy_sweeps_grid_sweeps_three_learning_rates_and_the_demo_none():
    """The search in small is `make demo-sweeps` (grid toy-sweeps, reusing the toy grid's results); `make demo`'s toy
    grid trains and tests, and searches nothing."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    check_config(config, loader_kind)
    assert GridJobs({**config, "grid": "toy"}).sweep.runs == []
    jobs = GridJobs({**config, "grid": "toy-sweeps"})
    assert sorted(r.value for r in jobs.sweep.runs) == [3.5e-5, 7e-5, 1.4e-4]
    assert sorted(r.variant for r in jobs.sweep.runs) == ["", "lr1.4e-04", "lr3.5e-05"]
    assert not any("@lr" in t for t in jobs.eval_targets())   # the search is not tested
    assert "results/toy/tables/sweeps.json" in jobs.all_targets()


def test_a_default_cell_with_its_own_learning_rate_is_the_run_its_value_shares():
    """The grid's own value is its default cell's lr where the cell sets one (config.grids.cell_lr), not the
    model's: that value's run is the default run, the model's becomes a variant like any other."""
    from softtokens.config.sweeps import sweep_runs

    from softtokens.config.sweeps import _default_cell

    config = checked("toy-sweeps")
    grid = config["grids"]["toy-sweeps"]
    cell = _default_cell(config["grids"], grid, "toy", "toyarith")   # the toy grid's, which it reuses
    cell["lr"] = 3.5e-5   # one of the sweep's values; the model's own is 7e-5
    runs = {r.value: r.variant for r in sweep_runs(grid, config["grids"], grid["rl"])}
    assert runs[3.5e-5] == "" and runs[7e-5] == variant_name("learning_rate", 7e-5)
