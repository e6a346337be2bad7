"""The update pass's fused head (train.head_loss): the RLOO loss with the head's gradients made in the
forward, chunk by chunk, against the plain path (rloo_loss of the per-row log-probs, a checkpointed
head per chunk, autograd's backward): the same values and diagnostics, the same gradients of every
parameter, in every training mode and noise placement, one chunk or several, float32, float64 and bf16
with CUDA's fused GEMM emulated."""

import pytest
import torch
from conftest import make_tiny_model

import softtokens.train.head_loss as head_loss
import softtokens.train.rloo as rloo
from softtokens.data.prompt import format_prompt
from softtokens.engine.cot import CotEngine
from softtokens.engine.settings import INFERENCE_SETTINGS, Placement
from softtokens.train.rloo import rloo_loss, rollout_log_probs

CASES = [("hard_sample", Placement()), ("soft_sample", Placement()), ("fuzzy_sample", Placement()),
         ("soft_sample", Placement("hidden")), ("fuzzy_sample", Placement("logits")),
         ("soft_sample", Placement("logits", 5))]


def _rollout(model, tokenizer, rows, name, placement, sigma=0.05, n=4, cot=10):
    setting = INFERENCE_SETTINGS[name]
    prompts = [format_prompt(r["question"]) for r in rows["test"][:n]]
    return CotEngine(model, tokenizer).generate(prompts, setting, sigma if setting.noise_factor else 0.0,
                                                list(range(n)), cot, 3, answer_temperature=1.0, placement=placement)


def _both_paths(model, rollout, vocab, adv, sigma=0.05, gaussian_scale=1.0):
    """(loss, replay, gradients) of the plain path and of the fused one."""
    out = {}
    for fused in (False, True):
        model.zero_grad()
        if fused:
            replay = rollout_log_probs(model, rollout, sigma, 1.0, vocab, gaussian_scale, 1.0,
                                       row_weights=-adv / len(adv))
            loss = replay.loss
        else:
            replay = rollout_log_probs(model, rollout, sigma, 1.0, vocab, gaussian_scale, 1.0)
            loss = rloo_loss(replay.cot + replay.answer, adv, len(adv))
        loss.backward()
        grads = {n: p.grad.double().clone() for n, p in model.named_parameters() if p.grad is not None}
        out[fused] = (loss.detach().double(), replay, grads)
    return out[False], out[True]


def _assert_same(plain, fused, rtol, atol_share):
    (loss0, rep0, g0), (loss1, rep1, g1) = plain, fused
    torch.testing.assert_close(loss1, loss0, rtol=rtol, atol=rtol * float(loss0.abs()) + 1e-12)
    torch.testing.assert_close(rep1.cot.detach().double(), rep0.cot.detach().double(), rtol=rtol, atol=rtol)
    torch.testing.assert_close(rep1.answer.detach().double(), rep0.answer.detach().double(), rtol=rtol, atol=rtol)
    torch.testing.assert_close(rep1.stats, rep0.stats, rtol=rtol, atol=rtol)
    assert not rep1.cot.requires_grad and rep0.cot.requires_grad
    assert set(g1) == set(g0) and g0
    for name in g0:
        scale = float(g0[name].abs().max()) + 1e-30
        torch.testing.assert_close(g1[name], g0[name], rtol=0, atol=atol_share * scale, msg=name)


@pytest.mark.parametrize("name,placement", CASES, ids=[f"{n}-{p.where}{p.top_k or ''}" for n, p in CASES])
@pytest.mark.parametrize("chunk", [None, 3])
def test_fused_head_loss_equals_the_plain_path(name, placement, chunk, toy_tokenizer, toy_rows, monkeypatch):
    """float32 on the CPU: the loss, per-row log-probs and diagnostics to 1e-5, every parameter's gradient to
    1e-5 of its largest entry; with chunk=3 a rollout of ~16 steps spans six chunks (the plain path then
    recomputes each in its backward, the fused one sums their weight gradients in one matrix)."""
    if chunk:
        monkeypatch.setattr(rloo, "logit_chunk_steps", lambda rows: chunk)
    model = make_tiny_model(toy_tokenizer, seed=5)
    rollout = _rollout(model, toy_tokenizer, toy_rows, name, placement)
    adv = torch.tensor([1.0, -0.5, 0.25, -0.75])
    plain, fused = _both_paths(model, rollout, len(toy_tokenizer), adv)
    _assert_same(plain, fused, rtol=1e-5, atol_share=1e-5)


@pytest.mark.parametrize("tile", [None, 37], ids=["one-tile", "tiles-of-37-rows"])
@pytest.mark.parametrize("name", ["soft_sample", "fuzzy_sample", "hard_sample"])
def test_fused_head_loss_in_float64_to_rounding(name, tile, toy_tokenizer, toy_rows, monkeypatch):
    """float64 (the gradient checks' dtype): equal to 1e-10, several chunks, a 1/d Gaussian scale; with
    ``tile`` the weight gradients are summed 37 vocabulary rows at a time (7 tiles of the toy's 259, the
    last a short one), as the paper's 128,256 rows are in 8,192-row tiles (train.config.HEAD_TILE_ROWS)."""
    if tile:
        monkeypatch.setattr(head_loss, "HEAD_TILE_ROWS", tile)
    monkeypatch.setattr(rloo, "logit_chunk_steps", lambda rows: 4)
    model = make_tiny_model(toy_tokenizer, dtype=torch.float64, seed=3)
    rollout = _rollout(model, toy_tokenizer, toy_rows, name, Placement(), sigma=0.1)
    adv = torch.tensor([0.5, -1.0, 1.5, -1.0], dtype=torch.float64)
    plain, fused = _both_paths(model, rollout, len(toy_tokenizer), adv, sigma=0.1, gaussian_scale=1 / 32)
    _assert_same(plain, fused, rtol=1e-10, atol_share=1e-10)


@pytest.mark.parametrize("tile", [None, 37], ids=["one-tile", "tiles-of-37-rows"])
@pytest.mark.parametrize("name", ["soft_sample", "fuzzy_sample", "hard_sample"])
def test_fused_head_loss_with_bf16_gemms(name, tile, toy_tokenizer, toy_rows, monkeypatch):
    """bf16 weights with CUDA's bf16 -> float32 GEMM emulated (the paper's path): the fused loss against the
    plain path through WideMatmul. Values to 1e-4; gradients to 2 % of each tensor's largest entry, the
    plain path's own distance from float32 copies (tests/test_gpu_check.py): the plain path rounds each
    chunk's weight gradient to bf16 before summing, the fused one sums in float32 and rounds once. ``tile``:
    the weight gradients summed several vocabulary tiles at a time, as at the paper's vocabulary."""
    from test_gpu_check import _cuda_mm

    if tile:
        monkeypatch.setattr(head_loss, "HEAD_TILE_ROWS", tile)
    monkeypatch.setattr(rloo, "logit_chunk_steps", lambda rows: 4)
    model = make_tiny_model(toy_tokenizer, dtype=torch.bfloat16, seed=4)
    rollout = _rollout(model, toy_tokenizer, toy_rows, name, Placement())
    _cuda_mm(monkeypatch)
    from softtokens.model.head import ReplayHead

    assert ReplayHead(model, len(toy_tokenizer)).fused
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    plain, fused = _both_paths(model, rollout, len(toy_tokenizer), adv)
    _assert_same(plain, fused, rtol=1e-4, atol_share=2e-2)
    for _, _, grads in (plain, fused):
        assert all(torch.isfinite(g).all() for g in grads.values())


def test_fused_head_loss_scales_with_the_incoming_gradient(toy_tokenizer, toy_rows):
    """The gradient made in the forward is multiplied by the one the backward receives: 3 x loss gives
    3 x the gradients (a loss scaler or a sum of losses stays right)."""
    model = make_tiny_model(toy_tokenizer, seed=5)
    rollout = _rollout(model, toy_tokenizer, toy_rows, "soft_sample", Placement())
    w = -torch.tensor([1.0, -0.5, 0.25, -0.75]) / 4
    grads = []
    for factor in (1.0, 3.0):
        model.zero_grad()
        (factor * rollout_log_probs(model, rollout, 0.05, 1.0, len(toy_tokenizer), row_weights=w).loss).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    for name in grads[0]:
        scale = float(grads[0][name].abs().max())
        torch.testing.assert_close(grads[1][name], 3 * grads[0][name], rtol=0, atol=1e-5 * scale)  # float32 sums in another order


@pytest.mark.parametrize("name", ["soft_sample", "hard_sample"])
def test_fused_head_loss_with_an_untied_head(name, toy_tokenizer, toy_rows, monkeypatch):
    """W and E apart (Llama-3.1-8B): the head's gradient goes to W, the mixture's to E, each summed in its
    own matrix; equal to the plain path's, over several chunks."""
    monkeypatch.setattr(rloo, "logit_chunk_steps", lambda rows: 4)
    model = make_tiny_model(toy_tokenizer, seed=7)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() * 1.5)
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    rollout = _rollout(model, toy_tokenizer, toy_rows, name, Placement())
    adv = torch.tensor([1.0, -0.5, 0.25, -0.75])
    plain, fused = _both_paths(model, rollout, len(toy_tokenizer), adv)
    assert "lm_head.weight" in fused[2] and "model.embed_tokens.weight" in fused[2]
    _assert_same(plain, fused, rtol=1e-5, atol_share=1e-5)


@pytest.mark.parametrize("name", ["soft_sample", "hard_sample"])
def test_fused_head_loss_under_fsdp_in_bf16(name, toy_tokenizer, toy_rows, monkeypatch):
    """The paper grid's update: the policy sharded by FSDP2 (float32 master, bf16 compute, train.sharding) and
    the custom function inside its root's forward. The float32 gradient shards FSDP accumulates from the fused
    loss equal those from the checkpointed path to 2 % of each tensor's largest entry (bf16 compute: the two
    paths round the head's weight gradient in different places), and the loss to 1e-4."""
    from softtokens.train.distributed import DataParallel
    from softtokens.train.sharding import shard_policy

    monkeypatch.setattr(rloo, "logit_chunk_steps", lambda rows: 4)
    rollout = _rollout(make_tiny_model(toy_tokenizer, dtype=torch.bfloat16, seed=8), toy_tokenizer, toy_rows, name,
                       Placement())
    adv = torch.tensor([1.0, -0.5, 0.25, -0.75])
    dp = DataParallel()
    try:
        policy = shard_policy(make_tiny_model(toy_tokenizer, seed=8), dp.mesh, "bfloat16", "float32", False)
        out = {}
        for fused in (False, True):
            policy.zero_grad()
            if fused:
                replay = policy(rollout, 0.05, 1.0, len(toy_tokenizer), 1.0, 1.0, -adv / len(adv))
                loss = replay.loss
            else:
                replay = policy(rollout, 0.05, 1.0, len(toy_tokenizer), 1.0, 1.0)
                loss = rloo_loss(replay.cot + replay.answer, adv, len(adv))
            loss.backward()
            out[fused] = (float(loss), {n: p.grad.full_tensor().clone() for n, p in policy.named_parameters()
                                        if p.grad is not None})
    finally:
        dp.close()
    (loss0, g0), (loss1, g1) = out[False], out[True]
    assert loss1 == pytest.approx(loss0, rel=1e-4, abs=1e-6)
    assert set(g1) == set(g0) and any("embed_tokens" in n for n in g0)
    for n in g0:
        assert g0[n].dtype == torch.float32
        scale = float(g0[n].abs().max()) + 1e-30
        torch.testing.assert_close(g1[n], g0[n], rtol=0, atol=2e-2 * scale, msg=n)


def test_the_fused_heads_peak_is_not_above_the_checkpointed_one(monkeypatch):
    """The fused head once made its weight gradient's product whole, beside the running sum: a (2V x d) +
    (V x d) float32 transient (at V 32,768 x d 768 its CPU peak was 1.56 GB against the checkpointed path's
    1.01 soft). Made a tile of vocabulary rows at a time and each chunk freed before the next, its peak is no
    higher, measured here on a scaled case (V / d and V / tile as at the paper's shapes: 42 and ~16) in
    float32 on the CPU (the plan's head term is held to its trace: tests/test_memory_trace.py)."""
    import importlib.util
    from pathlib import Path

    import softtokens.train.head_loss as head_loss
    from softtokens.model.toy import build_toy_model

    spec = importlib.util.spec_from_file_location("head_loss_speed",
                                                  Path(__file__).resolve().parents[1] / "benchmarks/head_loss_speed.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    vocab, hidden = 5376, 128                      # V / d = 42, as Llama-3.2-3B's 128,256 / 3,072
    monkeypatch.setattr(head_loss, "HEAD_TILE_ROWS", vocab // 16)   # the paper's V / 8,192 ~ 16 tiles
    monkeypatch.setattr(rloo, "logit_chunk_steps", lambda rows: 32)
    model = build_toy_model(vocab, hidden, 1, 1, 2 * hidden, 0, 1, 2, seed=0)
    dev = torch.device("cpu")
    for name in ("hard_sample", "soft_sample"):
        rollout = bench.synthetic_rollout(INFERENCE_SETTINGS[name], 4, 8, 128, vocab, hidden, dev)
        peaks = {fused: bench.cpu_peak_bytes(lambda: bench.run(model, rollout, fused, dev)) for fused in (False, True)}
        assert peaks[True] <= peaks[False], (name, peaks)
