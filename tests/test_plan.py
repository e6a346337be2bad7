"""The memory plan's model numbers: written out for the decoder families the grids use, so that
parsing the workflow (every `snakemake` start, every job a cluster executor starts) imports neither
torch nor transformers (tests/test_imports.py); held equal here to what transformers' own classes
hold."""

import json

import pytest

from softtokens.sizing.plan import (
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
    69.2 GB (the fused head's float32 weight gradient, 1.6 GB, included), over the 68.6 GB usable once
    AUTO_HEADROOM is left; 4 rows plan 54.3 GB: chosen, not recomputing.
    On 40 GB GPUs nothing fits without recomputation at 4 rows or more: recomputation, the largest that fits."""
    from softtokens.run.config import cell_rl
    from softtokens.sizing.plan import AUTO_HEADROOM, GB, USABLE_SHARE, grid_plan, resolve_memory

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
    from softtokens.sizing.plan import resolve_memory
    from softtokens.train.config import TrainConfig

    config = {**_paper_config(), "grid": "paper"}
    settings = _json.loads(GridJobs(config, resolve_rl=resolve_memory).train_settings("llama-3b", "math", "soft", 0))
    assert settings["micro_batch_size"] == 4 and settings["activation_checkpointing"] is False
    TrainConfig.from_settings(settings)
    with pytest.raises(ValueError, match="auto is chosen by the memory plan"):
        TrainConfig.from_settings({**settings, "micro_batch_size": "auto"})


# the gpu-check shape of the measured runs: Llama-3.2-3B on one GPU, 2 prompts x 32 rollouts, CoT 512, an
# answer of 32, prompts of 154 tokens (from their KV cache), recomputation on (../shared/gpu/README.md)
MEASURED = dict(processes=1, rows=64, prompt_tokens=154, cot_tokens=512, answer_tokens=32, checkpointing=True)


@pytest.mark.parametrize("continuous, measured_gb", [(False, 58.04), (True, 58.57)])
def test_the_update_peak_with_fused_adamw_is_the_measured_one(continuous, measured_gb):
    """Fused AdamW, micro-batch 16, the first step (H200, update_mb16_fused_adamw_h200_2026-11-26): AdamW
    allocates its state in that step, beside the float32 master weights, the rollout copy and the
    gradients: 12.85 + 6.43 + 12.85 + 25.7 GB (+ 0.44 of soft inputs) = 57.8-58.3 planned. Fused AdamW
    allocates no full-size temporary; the head's float32 copies are never made (bf16 GEMMs with float32
    results). Within 10 % (it is within 1 %)."""
    from softtokens.sizing.plan import GB, TrainJob, load_architecture, train_memory

    arch = load_architecture("meta-llama/Llama-3.2-3B-Instruct")
    job = TrainJob(micro_batch=16, continuous=continuous, optimizer="fused", **MEASURED)
    m = train_memory(arch, job, first_step=True)
    assert m["update"] == m["optimizer step"] and m["optimizer temporaries"] == 0
    assert m["update"] / GB == pytest.approx(measured_gb, rel=0.10)
    assert m["update"] / GB == pytest.approx(measured_gb, rel=0.01)


def test_the_update_peak_with_foreach_adamw_is_the_measured_one():
    """Foreach AdamW, micro-batch 2, the second step (H100, gpu_check_h100_2026-11-26: 72.25 GB at
    micro-batches 2 and 8 alike): its step allocates a float32 temporary of the parameters' size, 12.85 GB
    beside held state and gradients, whatever the micro-batch. The plan without it said 64.66."""
    from softtokens.sizing.plan import GB, TrainJob, load_architecture, train_memory

    arch = load_architecture("meta-llama/Llama-3.2-3B-Instruct")
    for mb in (2, 8):
        m = train_memory(arch, TrainJob(micro_batch=mb, continuous=True, optimizer="foreach", **MEASURED))
        assert m["update"] == m["optimizer step"]
        assert m["update"] / GB == pytest.approx(72.25, rel=0.10)
        assert m["optimizer temporaries"] / GB == pytest.approx(12.85, rel=0.01)


def test_auto_picks_a_large_micro_batch_for_the_paper_cell_on_one_80gb_gpu():
    """The mini grid: the paper's Llama-3B x GSM8K cell on one GPU of 80 GB. With the optimizer step
    counted as it runs (fused AdamW), `auto` picks 8 rows or more (the plan that missed the foreach
    temporary and padded for it picked 2, and the RL step got slower)."""
    from pathlib import Path

    from softtokens.data.sources import loader_kind
    from softtokens.run.config import cell_rl, load_config
    from softtokens.sizing.plan import resolve_memory

    config = load_config(Path(__file__).resolve().parents[1] / "config.yaml", loader_kind)
    chosen = resolve_memory(config, "mini", "llama-3b", cell_rl(config, "mini", "llama-3b", "gsm8k"))
    assert chosen["micro_batch_size"] >= 8
