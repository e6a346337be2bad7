"""Variants in the layout (paths.py), variant settings (config.cell_rl, reuse), and the ablation
tables in the paper's shape, on a fixture of per-seed evaluation files with hand-computed values."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from softtokens.cells.results import load_eval_frame
from softtokens.data.sources import loader_kind
from softtokens.report.ablations import (
    NOT_RUN,
    ablation_table,
    agreement,
    paper_rows,
    write_ablations,
)
from softtokens.config import grids as run_config
from softtokens.store import paths
from softtokens.config.grids import ConfigError, cell_rl
from softtokens.store.paths import Run

ROOT = Path(__file__).resolve().parents[1]


def check_config(config: dict) -> None:
    run_config.check_config(config, loader_kind)


def config():
    return yaml.safe_load((ROOT / "config.yaml").read_text())


# ---------------------------------------------------------------- paths
@pytest.mark.parametrize("run", [Run("llama-3b", "gsm8k", "fuzzy", "", 2), Run("toy", "toyarith", "soft", "logits-top50", 0),
                                 Run("m.1", "math_500", "fuzzy", "gamma1.0", 11), Run("toy", "toyarith", "hard", "tau0.01", 1)])
def test_every_path_parses_back_to_its_run(run):
    assert paths.parse_trained(run.trained) == run._replace(model="")
    e = paths.eval_path("results/x", run.model, run.trained, "gsm8k", "soft_sample")
    keys = paths.parse_eval_path(e)
    assert keys == {"model": run.model, "train_dataset": run.dataset, "train_mode": run.mode, "variant": run.variant,
                    "seed": run.seed, "benchmark": "gsm8k", "setting": "soft_sample"}
    assert paths.eval_run(keys) == run
    assert paths.parse_run_path(f"{paths.run_dir('results/x', run)}/metrics.jsonl") == {
        "model": run.model, "train_dataset": run.dataset, "train_mode": run.mode, "variant": run.variant, "seed": run.seed}


def test_default_runs_keep_the_paper_paths_and_bad_names_are_refused():
    run = Run("llama-3b", "gsm8k", "soft", "", 0)
    assert paths.run_dir("results/paper", run) == "results/paper/runs/llama-3b/gsm8k/soft/seed0"
    assert run.trained == "gsm8k-soft-seed0"
    assert Run("llama-3b", "gsm8k", "soft", "hidden", 0).trained == "gsm8k-soft@hidden-seed0"
    assert paths.parse_eval_path("r/eval/qwen-3b/base/math500/hard_greedy.json")["train_mode"] == "none"
    for bad in ("gsm8k-soft", "gsm8k-greedy-seed0", "gsm8k-soft@-seed0", "gsm8k-soft@a/b-seed0"):
        with pytest.raises(ValueError):
            paths.parse_trained(bad)
    with pytest.raises(ValueError):
        paths.arm("soft", "a b")


# ---------------------------------------------------------------- config
def test_a_variant_is_its_default_cell_plus_its_own_keys():
    cfg = config()
    check_config(cfg)
    rl = cell_rl(cfg, "ablations", "llama-3b", "gsm8k", "logits-top5")
    # the paper grid's Llama-3B GSM8K cell (reused), then the variant's keys
    assert rl["cot_max_tokens"] == 128 and rl["activation_checkpointing"] == "auto"  # the memory plan chooses
    assert (rl["noise_placement"], rl["noise_top_k"], rl["soft_temperature"]) == ("logits", 5, 1.0)
    assert rl["noise_factor"] == 0.33 and rl["fuzzy_temperature"] == 0.0001
    assert cell_rl(cfg, "ablations", "llama-3b", "gsm8k", "tau0.01")["fuzzy_temperature"] == 0.01
    assert cell_rl(cfg, "ablations", "llama-3b", "gsm8k") == cell_rl(cfg, "paper", "llama-3b", "gsm8k")
    # the ablations grid inherits the paper grid's results directory, data and resources
    assert cfg["grids"]["ablations"]["results"] == "results/paper"
    assert cfg["grids"]["ablations"]["datasets"] == cfg["grids"]["paper"]["datasets"]
    assert cfg["grids"]["ablations"]["evaluation"]["n_samples"] == 32
    assert cfg["grids"]["toy-ablations"]["toy_base"] == cfg["grids"]["toy"]["toy_base"]
    with pytest.raises(KeyError):
        cell_rl(cfg, "ablations", "llama-3b", "gsm8k", "nosuch")


def test_the_ablation_grids_hold_twelve_variants_of_one_cell():
    cfg = config()
    check_config(cfg)
    for name in ("ablations", "toy-ablations"):
        cells = cfg["grids"][name]["training"]
        arms = {(m, c["variant"]) for c in cells if c.get("variant") for m in c["modes"]}
        assert len(arms) == 12 and {len(c["seeds"]) for c in cells} == {2}
    # the toy tables' default rows have two seeds too: the toy grid trains seed 0 alone (the demo), so the toy
    # ablations list the default arms' cell with both seeds (seed 0 the toy grid's run, reused)
    defaults = [c for c in cfg["grids"]["toy-ablations"]["training"] if not c.get("variant")]
    assert [(sorted(c["modes"]), c["seeds"]) for c in defaults] == [(["fuzzy", "soft"], [0, 1])]
    assert cfg["grids"]["toy"]["training"][0]["seeds"] == [0]
    assert not [c for c in cfg["grids"]["ablations"]["training"] if not c.get("variant")]


@pytest.mark.parametrize("edit,message", [
    (lambda g: g["ablations"].update(reuse="nosuch"), "not one of grids"),
    (lambda g: g["ablations"]["training"][0]["rl"].update(noise_top_k=5), "noise_placement: logits"),
    (lambda g: g["ablations"]["training"].append(copy.deepcopy(g["ablations"]["training"][0])), "appears in two cells"),
    (lambda g: g["ablations"]["ablation_tables"]["noise_factor"]["arms"].append("fuzzy@gamma9"), "no training cell"),
])
def test_bad_ablation_configs_are_refused(edit, message):
    cfg = config()
    edit(cfg["grids"])
    with pytest.raises(ConfigError, match=message):
        check_config(cfg)


# ---------------------------------------------------------------- tables
# pass@1 (%) of each (arm, seed) under hard_greedy; other settings are these minus 10
VALUES = {"base": [50.0], "fuzzy": [60.0, 64.0], "fuzzy@gamma1.0": [70.0, 71.0], "fuzzy@gamma3.0": [40.0, 44.0]}


def fixture(tmp_path):
    files = []
    for arm, vals in VALUES.items():
        for seed, v in enumerate(vals):
            trained = "base" if arm == "base" else Run("llama-3b", "gsm8k", *paths.parse_arm(arm), seed).trained
            for setting in ("hard_greedy", "hard_sample", "fuzzy_greedy", "fuzzy_sample", "soft_greedy", "soft_sample"):
                p = Path(paths.eval_path(str(tmp_path), "llama-3b", trained, "gsm8k", setting))
                p.parent.mkdir(parents=True, exist_ok=True)
                sampled = setting.endswith("_sample")
                p1 = (v - (0 if setting == "hard_greedy" else 10)) / 100
                n = 32 if sampled else 1
                p.write_text(json.dumps({"n_samples": n, "pass@1": p1, "pass@k": {"1": p1, str(n): min(1.0, p1 + 0.2)},
                                         "mean_cot_length": 30.0}))
                files.append(p)
    return files


SPEC = {"title": "Noise factor ablation", "base": True, "describe": ["noise_factor"],
        "rows": [{"arm": "fuzzy@gamma0.1", "mode": "fuzzy", "variant": "gamma0.1", "noise_factor": 0.1},
                 {"arm": "fuzzy", "mode": "fuzzy", "variant": "", "noise_factor": 0.33},
                 {"arm": "fuzzy@gamma1.0", "mode": "fuzzy", "variant": "gamma1.0", "noise_factor": 1.0},
                 {"arm": "fuzzy@gamma3.0", "mode": "fuzzy", "variant": "gamma3.0", "noise_factor": 3.0}]}


def test_ablation_table_rows_values_and_missing_rows(tmp_path):
    df = load_eval_frame(fixture(tmp_path))
    table = ablation_table(df, SPEC)
    assert list(table.row) == ["base", "fuzzy@gamma0.1", "fuzzy", "fuzzy@gamma1.0", "fuzzy@gamma3.0"]
    assert list(table["Noise Factor"]) == ["-", "0.1", "0.33", "1", "3"]
    by_row = table.set_index("row")
    # mean ± sample std over the two seeds, by hand: (60, 64) -> 62.0 ± 2.8; (70, 71) -> 70.5 ± 0.7
    assert by_row.loc["fuzzy", "Hard Greedy pass@1"] == "62.0±2.8"
    assert by_row.loc["fuzzy@gamma1.0", "Hard Greedy pass@1"] == "70.5±0.7"
    assert by_row.loc["fuzzy@gamma1.0", "Fuzzy Sample pass@1"] == "60.5±0.7"
    assert by_row.loc["fuzzy@gamma1.0", "Fuzzy Sample pass@32"] == "80.5±0.7"
    assert by_row.loc["base", "Soft Greedy pass@1"] == "40.0" and by_row.loc["base", "seeds"] == 1
    assert (by_row.loc["fuzzy@gamma0.1"].filter(like="pass@") == NOT_RUN).all()   # no files: said, not dropped
    assert by_row.loc["fuzzy@gamma0.1", "seeds"] == 0
    cell = table.attrs["cells"][("fuzzy@gamma3.0", "Hard Greedy pass@1")]
    assert cell["value"] == "42.0±2.8" and len(cell["evals"]) == 2 and all("gamma3.0" in e for e in cell["evals"])


def test_the_papers_rows_and_the_agreement_rule():
    paper = paper_rows(SPEC, "llama-3b", "gsm8k", "tab:scale")
    # tab:scale: gamma=0.33 hard greedy 76.7±1.8, gamma=1.0 78.1±0.2; the base row from tab:placement
    by_row = paper.set_index("row")
    assert by_row.loc["fuzzy", "Hard Greedy pass@1"] == "76.7±1.8"
    assert by_row.loc["fuzzy@gamma1.0", "Hard Greedy pass@1"] == "78.1±0.2"
    assert by_row.loc["fuzzy@gamma3.0", "Hard Sample pass@1"] == "37.8±4.4"
    assert by_row.loc["base", "Hard Greedy pass@1"] == "71.4"          # tab:main's base row
    assert paper_rows(SPEC, "llama-3b", "gsm8k", "tab:placement").set_index("row").loc[
        "base", "Hard Greedy pass@1"] == "71.0"                             # tab:placement's own
    import pandas as pd
    ours = pd.DataFrame([{"row": "fuzzy", "Hard Greedy pass@1": "72.0±1.0"}, {"row": "fuzzy@gamma1.0",
                         "Hard Greedy pass@1": "70.0±0.2"}])
    agree = agreement(ours, paper[["row", "Hard Greedy pass@1"]]).set_index("row")
    # |72.0 - 76.7| = 4.7 <= 2 sqrt(1.0² + 1.8²) = 4.12? no -> outside; |70.0 - 78.1| = 8.1 > 0.57 -> outside
    assert agree.loc["fuzzy", "Hard Greedy pass@1"] == "-4.7 (outside 2σ)"
    ours.loc[0, "Hard Greedy pass@1"] = "74.0±1.0"   # 2.7 <= 4.12 -> within
    assert agreement(ours, paper[["row", "Hard Greedy pass@1"]]).set_index("row").loc[
        "fuzzy", "Hard Greedy pass@1"] == "-2.7 (within 2σ)"


def test_write_ablations_makes_tables_cells_and_figures(tmp_path):
    evals = fixture(tmp_path)
    metrics = []
    for arm, vals in VALUES.items():
        if arm == "base":
            continue
        for seed in range(len(vals)):
            run = Run("llama-3b", "gsm8k", *paths.parse_arm(arm), seed)
            p = Path(paths.run_dir(str(tmp_path), run)) / "metrics.jsonl"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("\n".join(json.dumps({"kind": "validation", "step": s, "val_greedy_accuracy": 0.5 + 0.01 * s})
                                   for s in (0, 8, 16)) + "\n")
            metrics.append(p)
    settings = {"grid": "test", "model": "llama-3b", "dataset": "gsm8k", "toy": False, "tables": {"noise_factor": SPEC}}
    write_ablations(evals, metrics, tmp_path / "tables", tmp_path / "figures", settings)
    for ext in ("md", "tex", "csv", "cells.json"):
        assert (tmp_path / "tables" / f"ablation_noise_factor.{ext}").exists()
    for ext in ("png", "pdf"):
        assert (tmp_path / "figures" / f"ablation_noise_factor.{ext}").stat().st_size > 1000
    md = (tmp_path / "tables" / "ablation_noise_factor.md").read_text()
    assert "The paper's numbers" in md and "76.7±1.8" in md and NOT_RUN in md


def test_variant_cells_meet_the_papers_ablation_tables_in_the_reproduction_report(tmp_path):
    """Evaluation files of an ablation run become cells with their variant key, and meet the
    paper's tab:scale row for that variant (not its main row)."""
    from softtokens.cells import ours as our_cells
    from softtokens.cells.paper import load_paper_results
    from softtokens.verdict import reproduction

    ours = our_cells.aggregate(our_cells.seed_rows(fixture(tmp_path)))
    cmp = reproduction.compare(load_paper_results(), ours)
    row = cmp[(cmp.table == "tab:scale") & (cmp.variant == "gamma1.0") & (cmp.setting == "hard_greedy")
              & (cmp.metric == "pass@1")].iloc[0]
    assert row.ours_mean == pytest.approx(70.5) and row.ours_n == 2 and row.paper_mean == pytest.approx(78.1)
    main = cmp[(cmp.table == "tab:main") & (cmp.train_mode == "fuzzy") & (cmp.benchmark == "gsm8k")
               & (cmp.model == "llama-3b") & (cmp.setting == "hard_greedy")].iloc[0]
    assert main.ours_mean == pytest.approx(62.0)  # the default runs, not the variants
