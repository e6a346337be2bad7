"""Shared fixtures: a toy tokenizer and tiny Llama built in about a second, no download."""

import pytest
import torch

from softtokens.data import PREFILL_AFTER_STOP, PROMPT_PREAMBLE, format_prompt, toy_splits
from softtokens.modeling import build_toy_model, train_toy_tokenizer


@pytest.fixture(scope="session")
def toy_rows():
    return toy_splits(300, 16, 16, seed=7)


@pytest.fixture(scope="session")
def toy_tokenizer(toy_rows):
    corpus = [format_prompt(r["question"]) + r["cot"] + PREFILL_AFTER_STOP + r["answer"] + "}." for r in toy_rows["train"]]
    return train_toy_tokenizer(corpus, 200, whole_phrases=(PROMPT_PREAMBLE,))


def make_tiny_model(tokenizer, dtype=torch.float32, seed=0, hidden=32, layers=2):
    model = build_toy_model(len(tokenizer), hidden, layers, 2, 64, tokenizer.pad_token_id, tokenizer.eos_token_id,
                            tokenizer.bos_token_id, seed)
    return model.to(dtype).eval()


@pytest.fixture(scope="session")
def tiny_model(toy_tokenizer):
    return make_tiny_model(toy_tokenizer)
