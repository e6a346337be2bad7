"""AdamW as the runs build it: fused where the device has the kernels, the same update as the
multi-tensor (foreach) kernels it replaces, on plain tensors and on FSDP2's sharded parameters."""

import pytest
import torch

from softtokens.train.optimizer import FOREACH, FUSED, adamw


def _steps(model, opt, n=3):
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        opt.zero_grad()
        (model(torch.randn(4, 16, generator=g)) ** 2).sum().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_fused_adamw_makes_the_foreach_update():
    """Three steps at the paper's lr on float32 weights: the fused and the foreach kernels agree to
    float32 rounding (1e-9 absolute on weights of order 0.1), and both move every entry."""
    results = {}
    for impl in (FUSED, FOREACH):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
        before = [p.detach().clone() for p in model.parameters()]
        opt, used = adamw(model.parameters(), 6e-6, (0.9, 0.999), 1e-8, 0.0, impl)
        assert used == impl
        results[impl] = _steps(model, opt)
        assert all((a != b).all() for a, b in zip(results[impl], before))
    for a, b in zip(results[FUSED], results[FOREACH]):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)


def test_the_default_is_fused_where_the_device_has_it():
    opt, used = adamw(torch.nn.Linear(4, 4).parameters(), 1e-3, (0.9, 0.999), 1e-8, 0.0)
    assert used == FUSED and opt.defaults["fused"]


def test_fused_adamw_on_fsdp2_sharded_parameters(toy_tokenizer):
    """The paper grid's optimizer: float32 DTensor shards of an FSDP2 policy (one process, gloo on the
    CPU). Fused and foreach give the same weights after two steps."""
    from conftest import make_tiny_model

    from softtokens.train.distributed import DataParallel
    from softtokens.train.sharding import shard_policy

    dp = DataParallel()
    try:
        out = {}
        for impl in (FUSED, FOREACH):
            policy = shard_policy(make_tiny_model(toy_tokenizer, seed=3), dp.mesh, "bfloat16", "float32", False)
            opt, used = adamw(policy.parameters(), 6e-6, (0.9, 0.999), 1e-8, 0.0, impl)
            assert used == impl
            for _ in range(2):
                opt.zero_grad()
                for p in policy.parameters():   # a fixed gradient: the optimizer alone is compared
                    p.grad = torch.ones_like(p) * 1e-3
                opt.step()
            out[impl] = [p.full_tensor().clone() for p in policy.parameters()]
    finally:
        dp.close()
    for a, b in zip(out[FUSED], out[FOREACH]):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=0)


def test_an_unsupported_device_falls_back_to_foreach(monkeypatch):
    real = torch.optim.AdamW

    def no_fused(params, **kw):
        if kw.get("fused"):
            raise RuntimeError("fused=True requires all the params to be on a supported device")
        return real(params, **kw)

    monkeypatch.setattr(torch.optim, "AdamW", no_fused)
    _, used = adamw(torch.nn.Linear(4, 4).parameters(), 1e-3, (0.9, 0.999), 1e-8, 0.0)
    assert used == FOREACH
    with pytest.raises(RuntimeError):
        adamw(torch.nn.Linear(4, 4).parameters(), 1e-3, (0.9, 0.999), 1e-8, 0.0, FUSED)
