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
