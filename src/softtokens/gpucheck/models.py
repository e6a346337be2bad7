"""The random-weight model, tokenizer and prompts a gpu-check runs on: no download, the shipped
``config.json`` of each paper model."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from softtokens.data.prompt import format_prompt
from softtokens.data.toy import toy_splits
from softtokens.gpucheck.shape import SMOKE_ARCHITECTURE, TARGET_ENTROPY
from softtokens.model.head import Float32Head
from softtokens.model.toy import train_toy_tokenizer


# ---------------------------------------------------------------- the model under test
def check_tokenizer(vocab: int | None):
    """The toy BPE without whole-phrase tokens, so the paper's preamble splits into many tokens
    as a real tokenizer splits it (the engine's shared-prefix path runs), padded with added
    tokens to the architecture's vocabulary (the mixture and the head read all 128k rows)."""
    from softtokens.model.toy import _segments

    rows = toy_splits(400, 1, 1, seed=0)["train"]
    tok = train_toy_tokenizer(["".join(_segments(r)) for r in rows], 384)
    if vocab and len(tok) < vocab:
        tok.add_tokens([f"<x{i}>" for i in range(vocab - len(tok))])
    return tok


def architecture_config(source: str) -> dict:
    from softtokens.sizing.plan import architecture_file

    if source == "smoke":
        return dict(SMOKE_ARCHITECTURE)
    fields = json.loads(architecture_file(source).read_text())
    return {k: v for k, v in fields.items() if not k.startswith("_")}


def random_model(fields: dict, tok, dtype: torch.dtype, device: torch.device):
    """A randomly initialised causal LM of the architecture, built on ``device`` directly (a 3B
    model initialised on a CPU takes minutes), whose special tokens are the tokenizer's."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(fields)
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    cfg.vocab_size = max(len(tok), cfg.vocab_size if fields.get("vocab_size") else 0)
    cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id = tok.pad_token_id, tok.eos_token_id, tok.bos_token_id
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.generation_config.eos_token_id = tok.eos_token_id
    return model.eval()


@torch.no_grad()
def peak_logits(model, tok, target: float = TARGET_ENTROPY) -> dict:
    """Scale the final norm's weight so the mean next-token entropy after a few prompts is
    ``target`` nats (module constant TARGET_ENTROPY): logits scale with that weight, so the factor
    is found by bisection on the logits of one forward. Returns the factor and both entropies."""
    from softtokens.model.head import decoder_hidden

    prompts = prompts_of(toy_splits(64, 1, 8, seed=9)["test"], 8)
    enc = tok(prompts, padding=True, return_tensors="pt").to(model.device)
    pos = (enc["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    h = decoder_hidden(model, input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], position_ids=pos)
    z = Float32Head(model, len(tok)).logits(h[:, -1])

    def entropy(c: float) -> float:
        return float(-(torch.softmax(c * z, -1) * torch.log_softmax(c * z, -1)).sum(-1).mean())

    lo, hi = -4.0, 6.0  # log10 of the factor; entropy falls as it grows
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if entropy(10 ** mid) > target else (lo, mid)
    factor = 10 ** ((lo + hi) / 2)
    before = entropy(1.0)
    model.get_decoder().norm.weight.mul_(factor)
    return {"final_norm_scale": round(factor, 4), "entropy_nats_before": round(before, 3),
            "entropy_nats": round(entropy(factor), 3), "target_entropy_nats": target}


def prompts_of(rows: list[dict], n: int, repeat: int = 1) -> list[str]:
    return [format_prompt(r["question"]) for r in rows[:n] for _ in range(repeat)]


def save_base(model, tok, work: Path) -> Path:
    """The random model as a training job's base directory (then the caller releases it: the
    trainer loads its own master and rollout copies, as a training job does)."""
    base = work / "base"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    return base
