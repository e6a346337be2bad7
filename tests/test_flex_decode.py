"""FlexAttention as the decode step's attention (engine.flex_decode), compiled as a GPU runs it (here by
inductor's CPU backend): the attention of one query per row over each row's own length against the
matmul path's, for several row counts and read windows through one dynamic kernel, and a whole fixed-
shape rollout through it against the CPU path's tokens."""

import pytest
import torch
from conftest import make_tiny_model

from softtokens.data.prompt import format_prompt
from softtokens.engine import flex_decode
from softtokens.engine.cot import CotEngine
from softtokens.engine.settings import INFERENCE_SETTINGS


def _reference(q, K, V, lengths, scale):
    """Two matmuls and a float32 softmax over each row's columns 0..length (decode_forward's matmul path)."""
    n, Hk, G, D = q.shape
    scores = (q.float() @ K.float().transpose(-1, -2)) * scale           # (N, Hk, G, W)
    visible = torch.arange(K.shape[2]) <= lengths.unsqueeze(1)          # (N, W)
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    return (torch.softmax(scores, -1) @ V.float()).reshape(n, Hk * G * D)


@torch.no_grad()
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.slow
def test_compiled_flex_decode_equals_the_matmul_attention(dtype, atol):
    """Grouped-query shapes (2 KV heads, 3 queries each), rows of different lengths, windows of 32, 48 and
    80 columns and 3 or 5 rows: one compiled kernel, each row masked at its own length."""
    fn = flex_decode.function(compiled=True)
    gen = torch.Generator().manual_seed(0)
    for n, window in ((3, 32), (5, 48), (5, 80)):
        q = torch.randn(n, 2, 3, 16, generator=gen).to(dtype)
        K = torch.randn(n, 2, window, 16, generator=gen).to(dtype)
        V = torch.randn(n, 2, window, 16, generator=gen).to(dtype)
        lengths = torch.randint(0, window, (n,), generator=gen)
        got = flex_decode.attend(fn, q, K, V, flex_decode.length_mask(lengths), 0.25)
        torch.testing.assert_close(got.float(), _reference(q, K, V, lengths, 0.25), rtol=0, atol=atol)
        lengths.fill_(window - 1)  # the score_mod reads the tensor as it is now, as a captured graph does
        got = flex_decode.attend(fn, q, K, V, flex_decode.length_mask(lengths), 0.25)
        torch.testing.assert_close(got.float(), _reference(q, K, V, lengths, 0.25), rtol=0, atol=atol)


@pytest.mark.parametrize("name", ["fuzzy_greedy", "soft_sample"])
@pytest.mark.slow   # torch.compile from a cold cache (CI's): tens of seconds
def test_rollout_through_compiled_flex_equals_the_cpu_path(name, toy_tokenizer, toy_rows, monkeypatch):
    """A fixed-shape rollout (the CUDA layout) decoding through compiled FlexAttention takes the CPU
    path's tokens and feeds its inputs to float32 rounding."""
    model = make_tiny_model(toy_tokenizer, seed=3)
    setting = INFERENCE_SETTINGS[name]
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:4]]
    args = (prompts, setting, 0.05 if setting.noise_factor else 0.0, [3, 4, 5, 6], 14, 3)
    plain = CotEngine(model, toy_tokenizer).generate(*args)
    real = flex_decode.function
    monkeypatch.setattr(flex_decode, "function", lambda compiled: real(True))
    engine = CotEngine(model, toy_tokenizer, fixed_shapes=True)
    engine.attention = "flex"
    flex = engine.generate(*args)
    assert torch.equal(plain.step_ids, flex.step_ids) and plain.completions == flex.completions
    if plain.noisy_inputs is not None:
        torch.testing.assert_close(flex.noisy_inputs, plain.noisy_inputs, rtol=0, atol=1e-5)


def test_flex_is_declined_where_its_decode_kernel_cannot_apply():
    """Inductor's split-K decode kernel needs a power-of-two GQA group: Llama-3.2-3B's 24 / 8 = 3 is not (the
    general kernel would compute 128 query rows for 1), Llama-3.1-8B's 32 / 8 = 4 is."""
    assert "24/8 = 3 is not a power of two" in flex_decode.declined(24, 8)
    assert flex_decode.declined(32, 8) is None and flex_decode.declined(16, 16) is None
