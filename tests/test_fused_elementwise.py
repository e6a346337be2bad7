"""The decode step's elementwise work compiled into fused kernels (engine/fused.py) against the eager
operations: each function on the model's shapes in float32 and bf16, the whole engine's rollouts
with fusion on and off, and the fall-back when compilation fails or disagrees. Compiled here with
inductor's CPU backend; on a GPU the same functions compile to Triton kernels (gpu-check compares them
there)."""

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_model

from softtokens.data.prompt import format_prompt
from softtokens.engine import fused
from softtokens.engine.cot import CotEngine
from softtokens.engine.settings import INFERENCE_SETTINGS


@pytest.fixture(scope="module")
def models(toy_tokenizer):
    model = make_tiny_model(toy_tokenizer, seed=3)
    return {"float32": model, "bfloat16": copy.deepcopy(model).to(torch.bfloat16)}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.slow   # torch.compile from a cold cache (CI's): tens of seconds
def test_compiled_functions_equal_eager(models, dtype):
    """bf16: bit for bit (every intermediate rounded where eager rounds it). float32: the norm's
    summation order may differ in the last bit; everything else is bit for bit."""
    model = models[dtype]
    compiled = fused.compiled()
    assert fused.disagreement(compiled, model) is None
    with torch.no_grad():
        for name, args in fused._samples(model, rows=5).items():
            got, want = getattr(compiled, name)(*args), getattr(fused.EAGER, name)(*args)
            for g, w in zip(*((got, want) if isinstance(got, tuple) else ((got,), (want,)))):
                assert g.dtype == w.dtype and g.shape == w.shape
                if dtype == "bfloat16" or "norm" not in name:
                    assert torch.equal(g, w), name
                else:
                    torch.testing.assert_close(g, w, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("name", ["hard_sample", "soft_sample", "fuzzy_greedy"])
@pytest.mark.slow   # torch.compile from a cold cache (CI's): the module's first compile pays tens of seconds
def test_engine_with_fused_elementwise_equals_eager(models, toy_tokenizer, toy_rows, name):
    """Float32 rollouts with the compiled functions: the same tokens, phases and answers as the eager
    ones, and the recorded soft inputs to float32 rounding."""
    model, setting = models["float32"], INFERENCE_SETTINGS[name]
    prompts = [format_prompt(r["question"]) for r in toy_rows["test"][:6]]
    sigma = 0.05 if setting.noise_factor > 0 else 0.0
    args = (prompts, setting, sigma, [3, 1, 4, 1, 5, 9], 24, 5)
    on = CotEngine(model, toy_tokenizer, fuse_elementwise=True)
    off = CotEngine(model, toy_tokenizer, fuse_elementwise=False)
    assert on.fusion_status == "fused (torch.compile)" and off.fusion_status == "off"
    a, b = on.generate(*args, answer_temperature=1.0), off.generate(*args, answer_temperature=1.0)
    assert torch.equal(a.step_ids, b.step_ids) and torch.equal(a.step_phase, b.step_phase)
    assert a.completions == b.completions
    if a.noisy_inputs is not None:
        torch.testing.assert_close(a.noisy_inputs, b.noisy_inputs, rtol=1e-5, atol=1e-5)


def test_engine_fuses_only_where_the_step_is_captured(models, toy_tokenizer):
    """The default: fused where the step is captured in CUDA graphs, never on a CPU."""
    engine = CotEngine(models["bfloat16"], toy_tokenizer)
    assert engine.elementwise is fused.EAGER and engine.fusion_status == "off"


def test_fusion_falls_back_to_eager_when_it_cannot_compile(models, monkeypatch):
    def no_compiler():
        raise RuntimeError("no working C++ compiler found")

    monkeypatch.setattr(fused, "compiled", no_compiler)
    with pytest.warns(UserWarning, match="fusion off: did not compile"):
        chosen, status = fused.choose(models["bfloat16"], True)
    assert chosen is fused.EAGER
    assert status == "off: did not compile (RuntimeError: no working C++ compiler found)"


def test_fusion_falls_back_to_eager_when_it_disagrees(models, monkeypatch):
    """A kernel a few bf16 ulps off (here the gated product, 2 % too large) is refused by name."""
    wrong = fused.EAGER._replace(silu_mul=lambda gate, up: F.silu(gate) * up * 1.02)
    monkeypatch.setattr(fused, "compiled", lambda: wrong)
    with pytest.warns(UserWarning, match="silu_mul"):
        chosen, status = fused.choose(models["bfloat16"], True)
    assert chosen is fused.EAGER and status.startswith("off: silu_mul: ")


@pytest.mark.slow   # torch.compile from a cold cache (CI's): the module's first compile pays tens of seconds
def test_gpu_check_compares_fused_and_eager_decoding(models, toy_tokenizer, toy_rows, tmp_path):
    """gpu-check's fusion measurement, run on the CPU: both engines timed on a training step's soft
    rows, and their tokens compared (bf16 here: bit-equal functions, so every token agrees)."""
    from softtokens.gpucheck import engine_check
    from softtokens.gpucheck.models import prompts_of
    from softtokens.gpucheck.shape import SMOKE_SIZES, CheckShape, Report

    shape = CheckShape("smoke", dict(SMOKE_SIZES), 1e-6, eval_batch=6, eval_cot=8, eval_answer=4, loglik_batch=4,
                       train_steps=2, modes=("soft",), repeats=1)
    prompts = prompts_of(toy_rows["test"], 2, 4)
    engine = CotEngine(models["bfloat16"], toy_tokenizer, fuse_elementwise=True)
    report = Report(tmp_path, {})
    out = engine_check._fusion_gain(report, engine, prompts, list(range(len(prompts))), 0.05, shape,
                                    torch.device("cpu"))
    assert out["rows"] == 8 and set(out["ms_per_step"]) == {"fused", "eager"}
    assert min(out["ms_per_step"].values()) > 0
    assert out["fused_over_eager"] == pytest.approx(out["ms_per_step"]["fused"] / out["ms_per_step"]["eager"], abs=2e-3)
    assert out["token_agreement"] == 1.0
    check = next(c for c in report.checks if c["check"].startswith("fused elementwise decode step"))
    assert check["passed"] is (out["ms_per_step"]["fused"] <= out["ms_per_step"]["eager"])
