"""The CPU decode kernels (native_decode.py, csrc/cpu_decode.c) against the torch operations they
replace, and how they are built, cached and refused."""

import subprocess
import warnings

import pytest
import torch
import torch.nn.functional as F

from softtokens import native_decode

pytestmark = pytest.mark.skipif(native_decode.compiler() is None, reason="no C compiler on this machine")


@pytest.fixture(scope="module")
def kernels():
    k = native_decode.kernels()
    assert k is not None, "the CPU decode kernels did not build or failed their check (see the warning)"
    return k


def _case(seed, n, heads, kv_heads, dim, max_len, shared, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim + 7, generator=g)[:, 7:] * scale  # a slice: rows wider
    cos, sin = torch.randn(2, max_len, dim, generator=g)
    keys, values = torch.randn(2, n, kv_heads, max_len, dim, generator=g)
    sk, sv = torch.randn(2, kv_heads, shared, dim, generator=g) * scale if shared else (None, None)
    return qkv, cos, sin, keys, values, sk, sv


@pytest.mark.parametrize("dim", [16, 32, 48, 64, 128])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 1), (6, 2)])
@pytest.mark.parametrize("shared", [0, 9])
def test_attention_is_torchs(kernels, dim, heads, kv_heads, shared):
    """Rotated queries and key, the key and value written at each slot's length, the softmax over
    columns 0 .. length (the shared prefix's first columns from its one copy): torch's arithmetic
    to float32 rounding, rows from length 0 to the last column, with 1 and 2 threads the same bits."""
    n, max_len = 7, 40
    qkv, cos, sin, keys, values, sk, sv = _case(dim + heads + shared, n, heads, kv_heads, dim, max_len, shared)
    lengths = torch.tensor([0, 1, 5, 9, 17, 38, 39])
    k_ref, v_ref = keys.clone(), values.clone()
    want = native_decode.torch_attention(qkv, heads, kv_heads, cos, sin, k_ref, v_ref, lengths, dim ** -0.5, sk, sv)
    outs = []
    for threads in (1, 2):
        k, v = keys.clone(), values.clone()
        outs.append(kernels.attention(qkv, heads, kv_heads, cos, sin, k, v, lengths, dim ** -0.5, sk, sv, threads))
        assert torch.equal(k, k_ref) and torch.equal(v, v_ref)  # the rotation is HF's, bit for bit
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[0], want, atol=2e-6, rtol=2e-6)


def test_attention_with_peaked_scores(kernels):
    """Scores hundreds apart (most exponentials underflow, a few columns carry a row): float32
    rounds such scores by ~1e-5, so the kernel is held to float64's attention, as close as torch's
    own float32 operations are."""
    qkv, cos, sin, keys, values, sk, sv = _case(1, 5, 4, 2, 32, 30, 4, scale=6.0)
    keys *= 6.0
    lengths = torch.tensor([3, 8, 12, 20, 29])
    args = (cos, sin, keys, values)
    exact = native_decode.torch_attention(qkv.double(), 4, 2, *(t.double() for t in args), lengths, 32 ** -0.5,
                                          sk.double(), sv.double())
    torch32 = native_decode.torch_attention(qkv, 4, 2, *(t.clone() for t in args), lengths, 32 ** -0.5, sk, sv)
    got = kernels.attention(qkv, 4, 2, *args, lengths, 32 ** -0.5, sk, sv)
    assert (torch32 - exact).abs().max() > 1e-6  # scores this large do round visibly
    assert (got.double() - exact).abs().max() <= 2 * (torch32.double() - exact).abs().max()


def test_attention_refuses_what_it_does_not_take(kernels):
    qkv, cos, sin, keys, values, _, _ = _case(2, 3, 4, 2, 32, 20, 0)
    lengths = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match="qkv"):
        kernels.attention(qkv, 4, 1, cos, sin, keys, values, lengths, 1.0)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.attention(qkv, 4, 2, cos, sin, keys.transpose(2, 3).contiguous().transpose(2, 3), values, lengths, 1.0)
    with pytest.raises(ValueError, match="lengths"):
        kernels.attention(qkv, 4, 2, cos, sin, keys, values, lengths.int(), 1.0)
    assert not native_decode.CpuDecodeKernels.takes(64, 128, 24, 4, 4, torch.float32, torch.device("cpu"))
    assert not native_decode.CpuDecodeKernels.takes(64, 128, 32, 4, 4, torch.bfloat16, torch.device("cpu"))
    assert native_decode.CpuDecodeKernels.takes(64, 128, 32, 4, 4, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("dim", [16, 128, 3072])
def test_add_rms_norm_is_hfs(kernels, dim):
    g = torch.Generator().manual_seed(dim)
    h, y = torch.randn(2, 5, dim, generator=g) * 3
    w = torch.randn(dim, generator=g)
    want_h = h + y
    want = F.rms_norm(want_h, (dim,), w, 1e-5)
    got = kernels.add_rms_norm(h, y, w, 1e-5)
    assert torch.equal(h, want_h)  # the residual stream, added to in place
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(kernels.add_rms_norm(h.clone(), None, w, 1e-5), want, atol=1e-6, rtol=1e-6)


def test_silu_mul_is_torchs(kernels):
    gate = torch.linspace(-120, 120, 4096)
    up = torch.linspace(-3, 5, 4096)
    want = F.silu(gate) * up
    got = kernels.silu_mul(gate, up)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert torch.isfinite(got).all()


def test_build_is_cached_by_name_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    cc = native_decode.compiler()
    first = native_decode.build(cc, tmp_path)
    assert first.exists() and [p.name for p in tmp_path.iterdir()] == [first.name]
    calls = []
    real_run = subprocess.run
    monkeypatch.setattr(native_decode.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or real_run(cmd, **kw))
    assert native_decode.build(cc, tmp_path) == first
    assert all("--version" in c for c in calls)  # found by name: not compiled again
    monkeypatch.setattr(native_decode, "_cpu_flags", lambda: "flags : another cpu")
    other = native_decode.build(cc, tmp_path)
    assert other != first and other.exists()  # another CPU's build has another name


def test_without_a_working_build_the_decode_keeps_torch(tmp_path, monkeypatch):
    native_decode.kernels.cache_clear()
    try:
        monkeypatch.setenv("SOFTTOKENS_CACHE", str(tmp_path))
        monkeypatch.setenv("CC", "false")  # a compiler that fails every flag set
        with pytest.warns(UserWarning, match="did not compile"):
            assert native_decode.kernels() is None
        native_decode.kernels.cache_clear()
        monkeypatch.delenv("CC")
        monkeypatch.setattr(native_decode, "_self_check", lambda k: 0.5)  # a library that computes wrong
        with pytest.warns(UserWarning, match="differ"):
            assert native_decode.kernels() is None
        native_decode.kernels.cache_clear()
        monkeypatch.setenv(native_decode.ENV_SWITCH, "0")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert native_decode.kernels() is None
    finally:
        native_decode.kernels.cache_clear()


def test_provenance_names_the_library_a_job_decoded_with(kernels):
    from softtokens import provenance

    native_decode.kernels.cache_clear()  # a fresh process: nothing decoded, nothing recorded (or built)
    assert provenance._device()["decode_kernels"] is None
    assert native_decode.kernels() is not None  # what a decode step asks for
    assert provenance._device()["decode_kernels"] == kernels.name
    assert kernels.name.startswith("cpu_decode-") and (native_decode.cache_dir() / kernels.name).exists()
