"""A model's architecture numbers, from its hub config.json (shipped under ``architectures/``: no
download) or a local model directory: what the memory plan and the forecast compute with.

Why written out: the decoder families the grids use (Llama, Qwen2) have their parameter shapes
written out from config.json, so that planning a grid (every `snakemake` start parses the workflow,
which checks the plan) needs neither torch nor transformers; tests/test_plan.py holds them equal to
transformers' classes built on the meta device, from which any other family's are read.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from softtokens.model.packaged import PACKAGED, packaged
from softtokens.config.names import TOY_SOURCE, packaged_name

ARCHITECTURES = Path(__file__).resolve().parents[1] / "architectures"


@dataclass(frozen=True)
class Architecture:
    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    shapes: tuple[tuple[int, ...], ...]      # every parameter tensor (tied ones once)
    layer_params: int                        # parameters of one decoder layer
    root_params: int                         # embeddings, final norm, output head

    @property
    def parameters(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


def architecture_file(source: str) -> Path:
    return ARCHITECTURES / f"{source.replace('/', '__')}.json"


def load_architecture(source: str) -> Architecture:
    """A shipped hub model's numbers (a packaged model's: those of the hub model it is), or the config.json of a
    local model directory."""
    name = packaged_name(source)
    if name is not None:
        source = packaged(name).hub_id
    shipped = architecture_file(source)
    path = shipped if shipped.is_file() else Path(source) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no architecture numbers for {source!r}: ship {shipped.name} under "
                                f"src/softtokens/architectures/ (its hub config.json) or point to a local model")
    return _from_config_json(path.read_text(), source)


def toy_architecture(toy_base: dict) -> Architecture:
    """The toy base the workflow builds (model.toy.build_toy_model) from its grid settings."""
    d = toy_base
    cfg = {"model_type": "llama", "vocab_size": d["vocab_size"], "hidden_size": d["hidden_size"],
           "num_hidden_layers": d["num_layers"], "num_attention_heads": d["num_heads"],
           "num_key_value_heads": d["num_heads"], "intermediate_size": d["intermediate_size"],
           "tie_word_embeddings": True}
    return _from_config_json(json.dumps(cfg), "toy")


# The decoder families the grids use, their parameter lists written out in the model classes' own
# order (tests/test_plan.py holds them equal to transformers' classes built on the meta device).
# Planning a grid then needs neither torch nor transformers: every `snakemake` start parses the
# workflow, which checks the plan, and so does every job a cluster executor starts.
# Fields a config.json may leave out take their config class's defaults:
DECODER_DEFAULTS = {"llama": {"attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False},
                    "qwen2": {"tie_word_embeddings": False}}


def _decoder_shapes(cfg: dict, heads: int, kv: int, hd: int) -> tuple[list, list, list]:
    """(root before the layers, one layer, root after them) parameter shapes of a llama / qwen2
    decoder from its config fields (``heads``, ``kv`` heads and head dim ``hd`` resolved)."""
    d, v, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    if cfg["model_type"] == "llama":   # q, k, v, o and the MLP's three projections: config flags
        qkv_bias = o_bias = bool(cfg["attention_bias"])
        mlp_bias = bool(cfg["mlp_bias"])
    else:                              # qwen2: q, k, v with biases, o and the MLP without
        qkv_bias, o_bias, mlp_bias = True, False, False

    def linear(out: int, into: int, bias: bool) -> list:
        return [(out, into), (out,)] if bias else [(out, into)]

    layer = (linear(heads * hd, d, qkv_bias) + linear(kv * hd, d, qkv_bias) + linear(kv * hd, d, qkv_bias)
             + linear(d, heads * hd, o_bias)
             + linear(inter, d, mlp_bias) + linear(inter, d, mlp_bias) + linear(d, inter, mlp_bias)
             + [(d,), (d,)])                                                   # the two RMSNorms
    tail = [(d,)] + ([] if cfg["tie_word_embeddings"] else [(v, d)])          # final norm, untied head
    return [(v, d)], layer, tail


@lru_cache(maxsize=None)
def _from_config_json(text: str, name: str) -> Architecture:
    """A model's numbers from its config.json: written out for the decoder families of
    DECODER_DEFAULTS, otherwise read off the model class built on the meta device (no memory)."""
    fields = {k: v for k, v in json.loads(text).items() if not k.startswith("_")}
    kind = fields.get("model_type")
    if kind not in DECODER_DEFAULTS:
        return _meta_architecture(fields, name)
    cfg = {**DECODER_DEFAULTS[kind], **fields}
    heads = cfg["num_attention_heads"]
    kv, hd = cfg.get("num_key_value_heads") or heads, cfg.get("head_dim") or cfg["hidden_size"] // heads
    head, layer, tail = _decoder_shapes(cfg, heads, kv, hd)
    return Architecture(name=name, vocab=cfg["vocab_size"], hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"],
                        heads=heads, kv_heads=kv, head_dim=hd,
                        intermediate=cfg["intermediate_size"], tied=bool(cfg["tie_word_embeddings"]),
                        shapes=tuple(head + layer * cfg["num_hidden_layers"] + tail),
                        layer_params=sum(math.prod(s) for s in layer),
                        root_params=sum(math.prod(s) for s in head + tail))


def _meta_architecture(fields: dict, name: str) -> Architecture:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(fields)
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    named = list(model.named_parameters())  # tied weights once
    layer = sum(p.numel() for n, p in named if ".layers.0." in n)
    root = sum(p.numel() for n, p in named if ".layers." not in n)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return Architecture(name=name, vocab=cfg.vocab_size, hidden=cfg.hidden_size, layers=cfg.num_hidden_layers,
                        heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads, head_dim=head_dim,
                        intermediate=cfg.intermediate_size, tied=bool(cfg.tie_word_embeddings),
                        shapes=tuple(tuple(p.shape) for _, p in named), layer_params=layer, root_params=root)


def shipped_models() -> list[str]:
    """The hub ids whose architecture numbers ship with the package."""
    return sorted(p.stem.replace("__", "/") for p in ARCHITECTURES.glob("*.json"))


def check_model_sources(config: dict, grid_name: str, config_files=()) -> None:
    """Stop before any job where a model of the grid is neither the toy, a local model directory nor a
    hub id whose numbers ship with the package, naming the key's file and line, the shipped ids and the
    closest of them."""
    import difflib

    from softtokens.config.text import ConfigError, key_lines

    lines = key_lines(config_files)
    shipped = shipped_models()
    bad = []
    for model, spec in config["grids"][grid_name]["models"].items():
        source = spec.get("source")
        at = lines.get(("grids", grid_name, "models", model, "source"), "config.yaml")
        name = packaged_name(source)
        if name is not None:
            if name not in PACKAGED:
                close = difflib.get_close_matches(name, list(PACKAGED), n=1, cutoff=0.5)
                bad.append(f"{at}: grids.{grid_name}.models.{model}.source {source!r}: no packaged model {name!r}"
                           + (f"; did you mean 'pip:{close[0]}'?" if close else "")
                           + f" (packaged: {', '.join('pip:' + n for n in PACKAGED)})")
            continue
        if source == TOY_SOURCE or architecture_file(source).is_file() or (Path(source) / "config.json").is_file():
            continue
        close = difflib.get_close_matches(source, shipped, n=1, cutoff=0.6)
        bad.append(f"{at}: grids.{grid_name}.models.{model}.source {source!r} is not a shipped model or a local "
                   f"directory with a config.json" + (f"; did you mean {close[0]!r}?" if close else "")
                   + f" (shipped: {', '.join(shipped)})")
    if bad:
        raise ConfigError("\n".join(bad))
