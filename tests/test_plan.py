"""The memory plan's model numbers: written out for the decoder families the grids use, so that
parsing the workflow (every `snakemake` start, every job a cluster executor starts) imports neither
torch nor transformers (tests/test_imports.py); held equal here to what transformers' own classes
hold."""

import json

import pytest

from softtokens.train.plan import (
    ARCHITECTURES,
    _from_config_json,
    _meta_architecture,
    toy_architecture,
)

SHIPPED = sorted(p.stem for p in ARCHITECTURES.glob("*.json"))


def _config(text: str) -> dict:
    return {k: v for k, v in json.loads(text).items() if not k.startswith("_")}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_architectures_equal_the_model_class_on_the_meta_device(name):
    text = (ARCHITECTURES / f"{name}.json").read_text()
    assert _from_config_json(text, name) == _meta_architecture(_config(text), name)


def test_the_toy_architecture_is_the_toy_model_the_workflow_builds():
    from softtokens.model.toy import build_toy_model

    fields = dict(vocab_size=160, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    model = build_toy_model(160, 32, 2, 2, 64, pad_id=0, eos_id=1, bos_id=2, seed=0)
    arch = toy_architecture(fields)
    assert arch.shapes == tuple(tuple(p.shape) for p in model.parameters())  # tied E once
    assert arch.parameters == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("cfg", [
    # the fields a config.json may leave out take the config class's defaults (untied, no biases)
    {"model_type": "llama", "vocab_size": 96, "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
     "intermediate_size": 80},
    {"model_type": "llama", "vocab_size": 96, "hidden_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 80, "attention_bias": True, "mlp_bias": True,
     "tie_word_embeddings": True},
    {"model_type": "qwen2", "vocab_size": 96, "hidden_size": 48, "num_hidden_layers": 3, "num_attention_heads": 6,
     "num_key_value_heads": 2, "intermediate_size": 80},
], ids=["llama-defaults", "llama-biases-gqa-tied", "qwen2-defaults"])
def test_written_out_shapes_follow_every_flag_of_the_config(cfg):
    assert _from_config_json(json.dumps(cfg), "m") == _meta_architecture(cfg, "m")


def test_another_family_is_read_off_its_model_class():
    cfg = {"model_type": "mistral", "vocab_size": 96, "hidden_size": 48, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 80}
    assert _from_config_json(json.dumps(cfg), "m").parameters == _meta_architecture(cfg, "m").parameters


def _paper_config() -> dict:
    from pathlib import Path

    import yaml

    return yaml.safe_load((Path(__file__).resolve().parents[1] / "config.yaml").read_text())


def test_auto_memory_settings_are_the_fastest_that_fit():
    """llama-3b on MATH (CoT 512) on 2 GPUs of 80 GB: without recomputation a micro-batch of 8 plans
    69 GB, over the 72 GB usable once AUTO_HEADROOM is left; 4 rows plan 54 GB: chosen, not recomputing.
    On 40 GB GPUs nothing fits without recomputation at 4 rows or more: recomputation, the largest that fits."""
    from softtokens.run.config import cell_rl
    from softtokens.train.plan import AUTO_HEADROOM, GB, USABLE_SHARE, grid_plan, resolve_memory

    config = _paper_config()
    rl = cell_rl(config, "paper", "llama-3b", "math")
    assert (rl["micro_batch_size"], rl["activation_checkpointing"]) == ("auto", "auto")
    chosen = resolve_memory(config, "paper", "llama-3b", rl)
    assert (chosen["micro_batch_size"], chosen["activation_checkpointing"]) == (4, False)
    row = next(r for r in grid_plan(config, "paper") if r["job"] == "train llama-3b/math")
    assert row["memory"]["peak"] * AUTO_HEADROOM <= USABLE_SHARE * 80 * GB and "micro-batch 4" in row["setting"]
    config["grids"]["paper"]["memory_plan"]["gpu_memory_gb"] = 40
    small = resolve_memory(config, "paper", "llama-3b", rl)
    assert small["activation_checkpointing"] is True and small["micro_batch_size"] >= 1
    del config["grids"]["paper"]["memory_plan"]  # no GPU memory declared: the schema's defaults
    assert resolve_memory(config, "paper", "llama-3b", rl) | {} == rl | {"micro_batch_size": 8,
                                                                         "activation_checkpointing": False}


def test_a_run_is_given_numbers_never_auto():
    import json as _json

    from softtokens.run.jobs import GridJobs
    from softtokens.train.config import TrainConfig
    from softtokens.train.plan import resolve_memory

    config = {**_paper_config(), "grid": "paper"}
    settings = _json.loads(GridJobs(config, resolve_rl=resolve_memory).train_settings("llama-3b", "math", "soft", 0))
    assert settings["micro_batch_size"] == 4 and settings["activation_checkpointing"] is False
    TrainConfig.from_settings(settings)
    with pytest.raises(ValueError, match="auto is chosen by the memory plan"):
        TrainConfig.from_settings({**settings, "micro_batch_size": "auto"})
