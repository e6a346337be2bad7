import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from softtokens.config import ConfigError, check_config, resolved_rl

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def config():
    return yaml.safe_load((ROOT / "config.yaml").read_text())


def test_shipped_config_is_valid(config):
    check_config(config)
    rl = resolved_rl(config, "toy")
    assert rl["prompts_per_step"] == config["grids"]["toy"]["rl"]["prompts_per_step"]
    assert config["rl"]["samples_per_prompt"] == 32 and config["rl"]["prompts_per_step"] == 2
    assert (config["rl"]["reward_correct"], config["rl"]["reward_boxed_wrong"], config["rl"]["reward_no_box"]) == (100, 10, 0)
    assert config["rl"]["warmup_steps"] == 20 and config["rl"]["noise_factor"] == 0.33
    assert (config["rl"]["hard_temperature"], config["rl"]["soft_temperature"], config["rl"]["fuzzy_temperature"]) == (1.0, 0.5, 0.0001)


def test_unknown_key_is_named(config):
    bad = copy.deepcopy(config)
    bad["grids"]["toy"]["rl"]["stepz"] = 3
    with pytest.raises(ConfigError, match=r"unknown key 'grids.toy.rl.stepz'"):
        check_config(bad)
    bad = copy.deepcopy(config)
    bad["colour"] = "red"
    with pytest.raises(ConfigError, match=r"unknown key 'colour'"):
        check_config(bad)


def test_negative_steps_is_named(config):
    bad = copy.deepcopy(config)
    bad["grids"]["toy"]["rl"]["steps"] = -5
    with pytest.raises(ConfigError, match=r"'grids.toy.rl.steps': -5 is less than the minimum of 1"):
        check_config(bad)


def test_bad_mode_and_dangling_references(config):
    bad = copy.deepcopy(config)
    bad["grids"]["toy"]["training"][0]["modes"] = ["hard", "warm"]
    with pytest.raises(ConfigError, match=r"grids.toy.training.0.modes.1"):
        check_config(bad)
    bad = copy.deepcopy(config)
    bad["grids"]["toy"]["training"][0]["model"] = "gpt9"
    with pytest.raises(ConfigError, match=r"unknown model 'gpt9'"):
        check_config(bad)
    bad = copy.deepcopy(config)
    bad["grid"] = "nope"
    with pytest.raises(ConfigError, match=r"'grid': 'nope'"):
        check_config(bad)


def test_snakemake_stops_before_any_job_on_a_bad_config(config, tmp_path):
    bad = copy.deepcopy(config)
    bad["grids"]["toy"]["rl"]["steps"] = -1
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump(bad))
    snakemake = Path(sys.executable).with_name("snakemake")
    proc = subprocess.run([str(snakemake), "-n", "--configfile", str(cfg), "-d", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "grids.toy.rl.steps" in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()
