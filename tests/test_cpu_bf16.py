"""bf16 compute on a CPU without bf16 units (model.cpu_bf16): every product of bf16 tensors computed from its exact
float32 values and rounded to bf16 once, as a bf16 GEMM does, gradients included; nothing else changes."""

import pytest
import torch
import torch.nn.functional as F

from softtokens.model import cpu_bf16
from softtokens.model.cpu_bf16 import Float32Products, bf16_products, upcasts


def test_a_linear_layer_and_its_gradients_are_float32_products_rounded_once():
    torch.manual_seed(0)
    x = torch.randn(5, 64, dtype=torch.bfloat16, requires_grad=True)
    layer = torch.nn.Linear(64, 48).to(torch.bfloat16)
    with Float32Products():
        y = layer(x)
        y.float().square().sum().backward()
    assert y.dtype == torch.bfloat16
    expected = F.linear(x.detach().float(), layer.weight.detach().float(), layer.bias.detach().float()).to(torch.bfloat16)
    assert torch.equal(y, expected)
    g = (2 * y.detach().float()).to(torch.bfloat16)   # d(sum y^2)/dy, as autograd carries it back in bf16
    assert torch.equal(x.grad, (g.float() @ layer.weight.detach().float()).to(torch.bfloat16))
    assert torch.equal(layer.weight.grad, (g.float().T @ x.detach().float()).to(torch.bfloat16))


def test_matmul_forms_are_caught_and_other_dtypes_and_ops_left_alone():
    a = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    b = torch.randn(2, 8, 4, dtype=torch.bfloat16)
    exact = (a.float() @ b.float()).to(torch.bfloat16)
    with Float32Products():
        assert all(torch.equal(r, exact) for r in (a @ b, torch.matmul(a, b), a.matmul(b), torch.bmm(a, b)))
        f = torch.randn(3, 8)
        assert torch.equal(f @ f.T, torch.matmul(f, f.T)) and (f @ f.T).dtype == torch.float32
        s = a.softmax(-1)
        assert s.dtype == torch.bfloat16 and torch.equal(s, a.softmax(-1))


def test_it_applies_to_bf16_on_a_cpu_without_bf16_units_only(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "native_bf16", lambda: False)
    assert upcasts("bfloat16", "cpu") and upcasts(torch.bfloat16, torch.device("cpu"))
    assert isinstance(bf16_products("bfloat16", "cpu"), Float32Products)
    assert not upcasts("float32", "cpu") and not upcasts("bfloat16", "meta")
    monkeypatch.setattr(cpu_bf16, "native_bf16", lambda: True)   # bf16 units: torch's own kernels
    assert not upcasts("bfloat16", "cpu") and not isinstance(bf16_products("bfloat16", "cpu"), Float32Products)


@pytest.mark.parametrize("native", [False, True])
def test_an_evaluation_in_bf16_decodes_inside_the_context_the_host_calls_for(native, monkeypatch, tiny_model):
    """MathEvaluator.run enters it around its decoding: on a host without bf16 units every product of the model's
    bf16 forward is a float32 product; on one with them, none is."""
    import copy

    from softtokens.eval import math_eval

    seen = []

    class Counting(Float32Products):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in cpu_bf16._PRODUCTS:
                seen.append(func)
            return super().__torch_function__(func, types, args, kwargs)

    monkeypatch.setattr(cpu_bf16, "native_bf16", lambda: native)
    monkeypatch.setattr(cpu_bf16, "Float32Products", Counting)
    monkeypatch.setattr(math_eval, "_evaluate", lambda ev, *args: ev.model(torch.tensor([[1, 2, 3]])))
    ev = math_eval.MathEvaluator.__new__(math_eval.MathEvaluator)
    ev.model = copy.deepcopy(tiny_model).to(torch.bfloat16)
    ev.run([], "hard_greedy", 1, 4, 4, 1, 0)
    assert bool(seen) == (not native)
    seen.clear()
    ev.model = ev.model.float()   # float32 compute: never
    ev.run([], "hard_greedy", 1, 4, 4, 1, 0)
    assert not seen


def test_a_checkpointed_block_recomputes_under_the_forwards_products():
    """Activation checkpointing (the paper grid's MATH runs, the replay's chunks) recomputes in the backward pass,
    where the caller's function modes are gone: without recompute_as_forward torch refuses the bf16 recomputation of
    a float32-saved product (CheckpointError, seen on every FSDP test of tests/test_paper_path.py); with it the
    gradients equal the uncheckpointed block's bit for bit. Outside the mode it is a plain checkpoint."""
    from torch.utils.checkpoint import CheckpointError, checkpoint

    from softtokens.model.cpu_bf16 import recompute_as_forward

    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).to(torch.bfloat16)
    x = torch.randn(6, 32, dtype=torch.bfloat16)

    def grads(**how):
        block.zero_grad()
        with Float32Products():
            y = checkpoint(block, x, use_reentrant=False, **how) if how else block(x)
            y.float().square().sum().backward()
        return [p.grad.clone() for p in block.parameters()]

    plain = grads()
    assert all(torch.equal(a, b) for a, b in zip(plain, grads(context_fn=recompute_as_forward)))
    with pytest.raises(CheckpointError):
        grads(determinism_check="default")   # the bare checkpoint: the mismatch this guards against
    block.zero_grad()
    checkpoint(block, x, use_reentrant=False, context_fn=recompute_as_forward).float().sum().backward()
    assert all(p.grad is not None for p in block.parameters())
