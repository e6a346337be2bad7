"""Shared fixtures: a toy tokenizer and tiny Llama built in about a second, no download."""

import pytest
import torch

from softtokens.data import toy_splits
from softtokens.modeling import build_toy_model
from softtokens.toybase import build_toy_tokenizer


@pytest.fixture(scope="session")
def toy_rows():
    return toy_splits(300, 16, 16, seed=7)


@pytest.fixture(scope="session")
def toy_tokenizer(toy_rows):
    return build_toy_tokenizer(toy_rows["train"], 200)


def make_tiny_model(tokenizer, dtype=torch.float32, seed=0, hidden=32, layers=2):
    model = build_toy_model(len(tokenizer), hidden, layers, 2, 64, tokenizer.pad_token_id, tokenizer.eos_token_id,
                            tokenizer.bos_token_id, seed)
    return model.to(dtype).eval()


@pytest.fixture(scope="session")
def tiny_model(toy_tokenizer):
    return make_tiny_model(toy_tokenizer)
