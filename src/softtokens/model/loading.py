"""Load a causal LM and its tokenizer (hub id or local directory, the same code path), the
embedding scale that sets the soft-token noise, and the toy Llama built from scratch."""

from __future__ import annotations

from pathlib import Path

import torch

from softtokens.model.checkpoint import ContentCheck, TrainerState

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load the tokenizer of {str(name_or_path)!r}: {err}. A hub id needs the network "
                             "or a filled HF cache; set the model's `source:` to a local directory otherwise.") from None
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(name_or_path: str | Path, dtype: str = "float32", device: str | torch.device = "cpu",
               defer_check: bool = False, verified: bool = False):
    """A causal LM from a hub id (e.g. meta-llama/Llama-3.2-3B-Instruct) or a local directory
    written by save_pretrained; the toy base and every checkpoint load through here. A training
    checkpoint (one with a manifest: model.checkpoint) is checked against it while it loads, and
    refused, naming the file, when a byte differs from what its training wrote. ``defer_check``: the
    hashing goes on beside what the caller computes with the model (an evaluation), which must call
    ``confirm_checkpoint(model)`` before it keeps anything (a weights file whose bytes were flipped
    loads; only its hash tells). ``verified``: the caller has just hashed every byte against the manifest
    (train.resume chooses the state it resumes from so): the sizes only, not a second read."""
    from transformers import AutoModelForCausalLM

    check = ContentCheck(name_or_path, content=not verified) if TrainerState.exists(name_or_path) else None
    if check is not None and check.early_problem():   # a missing, resized or non-data file: refused before it is opened
        _refuse_damaged(check)
    try:
        # weights from safetensors only: a base model's pickled weights (pytorch_model.bin) are never unpickled
        model = AutoModelForCausalLM.from_pretrained(str(name_or_path), dtype=DTYPES[dtype], use_safetensors=True)
    except OSError as err:  # a missing or unreadable directory, an id the hub cannot serve (offline)
        _refuse_damaged(check)
        raise ModelLoadError(f"cannot load the model {str(name_or_path)!r}: {err}. A hub id needs the network or "
                             "a filled HF cache (HF_HOME); on a node without internet, set the model's `source:` in "
                             "config.yaml to a local directory written by save_pretrained.") from None
    except Exception as err:  # a damaged weights file (safetensors: "incomplete metadata", ...)
        _refuse_damaged(check)
        raise ModelLoadError(f"cannot load the model {str(name_or_path)!r}: {type(err).__name__}: {err} "
                             "(a truncated or damaged weights file?)") from None
    if defer_check:
        model = model.to(device)
        model.softtokens_content_check = check
        return model
    _refuse_damaged(check)
    return model.to(device)


def confirm_checkpoint(model) -> None:
    """The deferred check of a model loaded with ``defer_check`` (load_model): waits for its hashes and
    raises CheckpointDamaged, naming the file, where a byte differs; nothing computed from it is kept."""
    _refuse_damaged(getattr(model, "softtokens_content_check", None))


class CheckpointDamaged(OSError):
    """A checkpoint whose files are not the bytes its training wrote; the message names the file."""


def _refuse_damaged(check: ContentCheck | None) -> None:
    problem = check.problem() if check is not None else None
    if problem:
        raise CheckpointDamaged(f"checkpoint {check.checkpoint} refused: {problem}. Nothing was computed from it. "
                                "Restore the file, or retrain the run (snakemake --forcerun train <its "
                                "metrics.jsonl>).")


class ModelLoadError(OSError):
    """A base model or checkpoint that cannot be read: the message names it and what to do."""


def hub_revision(model) -> str | None:
    """The hub commit a model was loaded from (None for a local directory), for provenance:
    a hub id alone does not say which weights were used."""
    return getattr(model.config, "_commit_hash", None)


def pick_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
