"""The mistakes a user makes before any job runs, caught by the project's own checks with the file
and line, or the valid choices: a YAML syntax error, a model id typo, a target outside the grid, and
what an interrupted job left behind said in words."""

import base64
from pathlib import Path

import pytest
import yaml

from softtokens.config.text import ConfigError, check_yaml_syntax

ROOT = Path(__file__).resolve().parents[1]


def test_a_yaml_syntax_error_names_its_file_line_and_column(tmp_path):
    bad = tmp_path / "config.yaml"
    bad.write_text("grid: toy\ngrids:\n  toy:\n    results: [unclosed\n    models: {}\n")
    # where the bracket opens (line 4), beside where the parser noticed it (line 5)
    with pytest.raises(ConfigError, match=rf"{bad}:4:14: not valid YAML.*noticed at line 5"):
        check_yaml_syntax(bad)
    check_yaml_syntax(ROOT / "config.yaml")   # the shipped one parses


def test_the_workflow_stops_on_a_yaml_syntax_error_with_its_line(tmp_path):
    """The real Snakefile over a broken config.yaml (a copy of the repository's workflow files)."""
    from test_workflow import snakemake

    for name in ("Snakefile", "workflow", "profiles"):
        src = ROOT / name
        (tmp_path / name).symlink_to(src, target_is_directory=src.is_dir())
    text = (ROOT / "config.yaml").read_text().replace("grid: toy", "grid: toy\n  oops: [unclosed", 1)
    (tmp_path / "config.yaml").write_text(text)
    proc = snakemake("-n", cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "config.yaml:" in out and "not valid YAML" in out


def test_a_model_id_typo_names_the_line_and_the_closest_shipped_id(tmp_path):
    from softtokens.sizing.architecture import check_model_sources, shipped_models

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    over = tmp_path / "typo.yaml"
    over.write_text("grids:\n  paper:\n    models:\n      llama-3b: {source: meta-llama/Llama-3.2-3B-Instrct}\n")
    config["grids"]["paper"]["models"]["llama-3b"]["source"] = "meta-llama/Llama-3.2-3B-Instrct"
    with pytest.raises(ConfigError) as err:
        check_model_sources(config, "paper", [ROOT / "config.yaml", over])
    text = str(err.value)
    assert f"{over}:4:" in text and "did you mean 'meta-llama/Llama-3.2-3B-Instruct'?" in text
    assert all(m in text for m in shipped_models())
    config["grids"]["paper"]["models"]["llama-3b"]["source"] = "meta-llama/Llama-3.2-3B-Instruct"
    check_model_sources(config, "paper", [ROOT / "config.yaml"])


def test_a_target_outside_the_grid_is_named_with_what_the_grid_has():
    from softtokens.data.sources import loader_kind
    from softtokens.config.grids import check_config
    from softtokens.grid.jobs import GridJobs
    from softtokens.grid.targets import outside_grid

    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    check_config(config, loader_kind)
    jobs = GridJobs(config)
    ok = ["results/toy/eval/toy/toyarith-soft-seed0/toyarith/hard_greedy.json", "results/toy/tables/main.md",
          "results/toy/runs/toy/toyarith/hard/seed0/selected.json", "all"]
    assert outside_grid(jobs, ok) == []
    bad = outside_grid(jobs, ["results/toy/eval/toy/toyarith-soft-seed7/toyarith/hard_greedy.json",
                              "results/toy/runs/toy/toyarith/soft/seed3/selected.json",
                              "results/toy/eval/toy/base/toyarith/hard_greedyy.json",
                              "results/toy/eval/toy/base/gsm8k/hard_greedy.json"])
    assert len(bad) == 4
    assert "seed 7 is not in the grid (seeds there: 0)" in bad[0] and "seed 3" in bad[1]
    assert "setting 'hard_greedyy' is not evaluated here" in bad[2] and "benchmark 'gsm8k' is not in the grid" in bad[3]


def test_the_dry_run_refuses_a_seed_outside_the_grid():
    from test_workflow import snakemake

    proc = snakemake("-n", "results/toy/eval/toy/toyarith-soft-seed7/toyarith/hard_greedy.json")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "outside grid 'toy'" in out and "(seeds there: 0)" in out


def test_an_interrupted_jobs_outputs_are_said_in_words(tmp_path):
    from softtokens.workflow.interrupted import incomplete_outputs, interrupted_note

    assert interrupted_note(tmp_path) is None
    out = "results/toy/runs/toy/toyarith/hard/seed0/metrics.jsonl"
    code = base64.urlsafe_b64encode(out.encode()).decode()
    marker = tmp_path / ".snakemake/incomplete" / ("@" + code[:10]) / code[10:]   # Snakemake's segments
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    assert incomplete_outputs(tmp_path) == [out]
    note = interrupted_note(tmp_path)
    assert out in note and "Forced execution" in note and "resumes" in note
