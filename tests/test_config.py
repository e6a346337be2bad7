import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from softtokens.data.sources import loader_kind
from softtokens.config import grids as run_config
from softtokens.config.grids import PAPER_RL, ConfigError, cell_rl, resolved_rl
from softtokens.grid.resources import job_resources

ROOT = Path(__file__).resolve().parents[1]


def check_config(config: dict) -> None:
    run_config.check_config(config, loader_kind)


@pytest.fixture()
def config():
    return yaml.safe_load((ROOT / "config.yaml").read_text())


def test_shipped_config_is_valid(config):
    check_config(config)
    rl = resolved_rl(config, "toy")
    assert rl["prompts_per_step"] == config["grids"]["toy"]["rl"]["prompts_per_step"]
    assert rl["reward_correct"] == PAPER_RL["reward_correct"] == 100  # not overridden by the toy: the paper's
    paper = resolved_rl(config, "paper")
    assert paper["samples_per_prompt"] == 32 and paper["prompts_per_step"] == 2
    assert (paper["reward_correct"], paper["reward_boxed_wrong"], paper["reward_no_box"]) == (100, 10, 0)
    assert paper["warmup_steps"] == 20 and paper["noise_factor"] == 0.33
    assert (paper["hard_temperature"], paper["soft_temperature"], paper["fuzzy_temperature"]) == (1.0, 0.5, 0.0001)


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
    with pytest.raises(ConfigError, match=r"'grid': unknown grid 'nope' \(grids: toy"):
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


def test_paper_grid_is_the_papers(config):
    paper = config["grids"]["paper"]
    assert {m: (s["source"], s["lr"]) for m, s in paper["models"].items()} == {
        "llama-3b": ("meta-llama/Llama-3.2-3B-Instruct", 6e-6), "llama-8b": ("meta-llama/Llama-3.1-8B-Instruct", 3e-6),
        "qwen-3b": ("Qwen/Qwen2.5-3B-Instruct", 8e-6)}
    cells = {(c["model"], c["dataset"]) for c in paper["training"]}
    assert cells == {("llama-3b", "gsm8k"), ("llama-3b", "math"), ("llama-3b", "deepscaler"), ("llama-8b", "gsm8k"),
                     ("qwen-3b", "math")}
    assert all(c["modes"] == ["hard", "soft", "fuzzy"] and c["seeds"] == [0, 1, 2] for c in paper["training"])
    assert cell_rl(config, "paper", "llama-8b", "gsm8k")["cot_max_tokens"] == 128
    assert cell_rl(config, "paper", "qwen-3b", "math")["cot_max_tokens"] == 512
    assert cell_rl(config, "paper", "llama-3b", "deepscaler")["steps"] == 4000
    ev = paper["evaluation"]
    assert (ev["n_samples"], ev["cot_max_tokens"], ev["answer_max_tokens"]) == (32, 512, 32)
    assert resolved_rl(config, "paper")["answer_max_tokens"] == 32


def test_cross_checks_name_the_key(config):
    bad = copy.deepcopy(config)
    bad["grids"]["paper"]["training"][0]["dataset"] = "math500"
    with pytest.raises(ConfigError, match=r"grids.paper.training.0.dataset': 'math500' has no training split"):
        check_config(bad)
    bad = copy.deepcopy(config)
    bad["grids"]["paper"]["evaluation"]["ood_benchmarks"] = ["gsm8k"]
    with pytest.raises(ConfigError, match=r"ood_benchmarks': 'gsm8k' is not a multiple_choice set"):
        check_config(bad)
    bad = copy.deepcopy(config)
    bad["grids"]["paper"]["training"].append(copy.deepcopy(bad["grids"]["paper"]["training"][0]))
    with pytest.raises(ConfigError, match=r"appears in two cells"):
        check_config(bad)
    bad = copy.deepcopy(config)
    bad["grids"]["paper"]["datasets"]["gsm-8k"] = {"loader": "gsm8k"}
    with pytest.raises(ConfigError, match=r"cannot contain '-'"):
        check_config(bad)
    bad = copy.deepcopy(config)
    bad["grids"]["paper"]["datasets"]["gsm8k"]["loader"] = "gsm9k"
    with pytest.raises(ConfigError, match=r"grids.paper.datasets.gsm8k.loader"):
        check_config(bad)


def test_partition_and_account_come_from_the_environment(config):
    paper = config["grids"]["paper"]
    assert "slurm_partition" not in job_resources(paper, "train", environ={})
    env = {"SOFTTOKENS_SLURM_PARTITION": "cpuq", "SOFTTOKENS_SLURM_GPU_PARTITION": "gpuq", "SOFTTOKENS_SLURM_ACCOUNT": "a1"}
    train = job_resources(paper, "train", environ=env)
    assert train["gpu"] == 2 and train["nodes"] == 1 and train["slurm_partition"] == "gpuq" and train["slurm_account"] == "a1"
    assert job_resources(paper, "cpu", environ=env)["slurm_partition"] == "cpuq"
    assert job_resources(paper, "evaluate", environ={"SOFTTOKENS_SLURM_PARTITION": "all"})["slurm_partition"] == "all"
    # a grid with no resources block still asks for memory and time (no job takes a whole node),
    # and training for SLURM's warning signal before its time limit
    assert job_resources(config["grids"]["toy"], "train", environ={}) == {
        "mem_mb": 16000, "runtime": 720, "slurm_extra": "--signal=USR1@600"}
    assert job_resources(config["grids"]["toy"], "cpu", environ={}) == {"mem_mb": 4000, "runtime": 60}
    assert "mem_mb" not in train and train["mem_mb_per_cpu"] == 8000  # never both (SLURM refuses)
    assert train["runtime"] == 2880 and train["slurm_extra"] == "--signal=USR1@600"


def test_the_papers_rl_defaults_are_defined_once():
    """The schema's rl fields are TrainConfig's fields less the run's own four, every one has a
    default (the paper's), and a TrainConfig cannot be made without one of them or with a stranger."""
    import dataclasses

    from softtokens.train.config import TrainConfig

    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    schema_rl = run_config.load_schema()["$defs"]["rl_fields"]
    assert set(schema_rl) == fields - {"mode", "seed", "lr", "variant"}
    assert all("default" in f for f in schema_rl.values()), [k for k, f in schema_rl.items() if "default" not in f]
    assert set(PAPER_RL) == set(schema_rl)
    cfg = TrainConfig.paper("soft", 0, 6e-6)
    resolved = {"validation_cot_max_tokens": PAPER_RL["cot_max_tokens"]}   # `training`: the run's own cap
    assert PAPER_RL["validation_cot_max_tokens"] == "training"
    assert all(getattr(cfg, k) == resolved.get(k, v) for k, v in PAPER_RL.items())
    with pytest.raises(ValueError, match="unknown training settings: stepz"):
        TrainConfig.from_settings({**PAPER_RL, "mode": "soft", "seed": 0, "lr": 1e-6, "stepz": 3})
    partial = {k: v for k, v in PAPER_RL.items() if k != "noise_factor"}
    with pytest.raises(ValueError, match="lack noise_factor"):
        TrainConfig.from_settings({**partial, "mode": "soft", "seed": 0, "lr": 1e-6})


def test_modes_settings_and_placements_are_named_once():
    """The schema's enums and the wildcard patterns come from config.names; the engine's settings and
    placements are the same lists."""
    import re

    from softtokens.engine.settings import INFERENCE_SETTINGS, placement_of
    from softtokens.eval.ood import PROTOCOLS
    from softtokens.config import names
    from softtokens.store import paths

    defs = run_config.load_schema()["$defs"]
    assert defs["mode"]["enum"] == list(names.MODES) == ["hard", "soft", "fuzzy"]
    assert defs["setting"]["enum"] == list(names.SETTING_NAMES) == list(INFERENCE_SETTINGS)
    assert defs["rl_fields"]["noise_placement"]["enum"] == list(names.PLACEMENTS)
    assert [placement_of({"noise_placement": p}).where for p in names.PLACEMENTS] == list(names.PLACEMENTS)
    with pytest.raises(ValueError, match="noise_placement 'output'"):
        placement_of({"noise_placement": "output"})
    assert set(PROTOCOLS) == set(names.OOD_PROTOCOLS)
    assert all(re.fullmatch(paths.WILDCARDS["setting"], s) for s in names.SETTING_NAMES)
    assert all(re.fullmatch(paths.WILDCARDS["arm"], m) for m in names.MODES)
    assert not re.fullmatch(paths.WILDCARDS["arm"], "warm")
    assert not re.fullmatch(paths.WILDCARDS["setting"], "warm_greedy")


def test_a_yaml11_exponent_is_the_number_it_spells(config, tmp_path):
    """`lr: 3e-4` (the value config.yaml's comments mention) is text to YAML 1.1, Snakemake's loader:
    it is taken as 0.0003; a word where a number belongs still stops the run, saying how to write one."""
    text = (ROOT / "config.yaml").read_text().replace("lr: 7.0e-5", "lr: 3e-4", 1)
    assert "lr: 3e-4" in text
    loaded = yaml.safe_load(text)
    assert loaded["grids"]["toy"]["models"]["toy"]["lr"] == "3e-4"   # what PyYAML gives
    check_config(loaded)
    assert loaded["grids"]["toy"]["models"]["toy"]["lr"] == pytest.approx(3e-4)
    bad = copy.deepcopy(config)
    bad["grids"]["toy"]["models"]["toy"]["lr"] = "fast"
    with pytest.raises(ConfigError, match=r"'grids.toy.models.toy.lr': 'fast' is not of type 'number' \(write numbers"):
        check_config(bad)


def test_an_unknown_key_is_reported_once_with_its_line_and_a_close_key(tmp_path):
    """The toy grid's datasets are inherited by two `reuse:` grids: a typo in them is one problem,
    reported where it is written, with the key meant."""
    text = (ROOT / "config.yaml").read_text().replace("        train_size: 4000", "        train_sise: 4000", 1)
    path = tmp_path / "config.yaml"
    path.write_text(text)
    line = next(i for i, x in enumerate(text.splitlines(), 1) if "train_sise" in x)
    with pytest.raises(ConfigError) as err:
        run_config.load_config(path, loader_kind)
    problems = str(err.value).splitlines()[1:]
    assert problems == [f"  unknown key 'grids.toy.datasets.toyarith.train_sise' ({path}:{line}); "
                        "did you mean 'train_size'?"]


def test_a_generated_dataset_refuses_a_source_it_would_not_read(config):
    bad = copy.deepcopy(config)
    bad["grids"]["toy"]["datasets"]["toyarith"]["path"] = "/nonexistent/toy.jsonl"
    with pytest.raises(ConfigError, match=r"'grids.toy.datasets.toyarith.path': loader 'toy' generates its rows"):
        check_config(bad)


def test_a_missing_local_copy_is_refused_before_any_job(config, tmp_path):
    from softtokens.data.sources import check_local_sources

    config["grids"]["paper"]["results"] = str(tmp_path / "results")
    config["grids"]["paper"]["datasets"]["arc"]["path"] = str(tmp_path / "arc" / "{split}.parquet")
    check_config(config)
    with pytest.raises(ConfigError, match=r"'grids.paper.datasets.arc.path': .*arc/test.parquet does not exist"):
        check_local_sources(config, "paper")
    (tmp_path / "arc").mkdir()
    (tmp_path / "arc" / "test.parquet").write_text("")
    check_local_sources(config, "paper")  # there: accepted (its rows are read by prepare_benchmark)
    (tmp_path / "arc" / "test.parquet").unlink()
    prepared = tmp_path / "results" / "data" / "arc" / "test.jsonl"
    prepared.parent.mkdir(parents=True)
    prepared.write_text("{}\n")
    check_local_sources(config, "paper")  # prepared already: the copy is not read again
