"""A decode step's non-GEMM work on CPU as three C functions (csrc/cpu_decode.c), compiled with
the machine's C compiler on first use and cached.

Why: on the CPU a decode step of a small model is ~35 torch operations per layer around five
GEMMs, and two kinds of them cost more than the arithmetic (toy, batch 64, 1 thread, 12 ms a
step before this):
- the attention's batched matmuls (one small GEMM per slot and head, for scores and again for
  outputs, a masked softmax between) read the KV cache at ~65 % of the rate memory streams it
  (9.2 ms against 6.0 ms for ``sum()`` over the same bytes, 4 layers, 149 columns);
- small elementwise operations cost ~10-20 us each in dispatch and cold caches: the nine
  RMSNorms alone (six operations each) were 1.25 ms of the step.
The kernels: the attention of each (slot, key/value head) rotates its queries and key, writes the
key and value into the cache, and reads the slot's own columns once, keys then values, with the
softmax in between in registers (6.2 ms on that sweep); the residual add with the RMSNorm after
it; SiLU(gate) * up. What is computed does not change, only the order of float32 sums (tests hold
each kernel to its torch operations at 1e-6 and the engine to the reference loop).

The build: ``cc -O3 -march=native -ffp-contract=off -fopenmp -shared`` into ``$SOFTTOKENS_CACHE``
(default ``~/.cache/softtokens``), named by a hash of the source, the flags, the compiler's
version and the CPU's flags (a cache shared by different machines never hands one machine's
build to a CPU that lacks its instructions), written to a temporary file and renamed: concurrent
jobs never see half a library and a killed build leaves no lock behind. OpenMP resolves to the
runtime torch already loaded (the same soname), so the attention's threads are torch's. Without
a compiler, or when the build or the self-check on load fails, ``kernels()`` returns None with one
warning and the decode keeps torch's operations. ``SOFTTOKENS_NATIVE_DECODE=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

SOURCE = Path(__file__).parent / "csrc" / "cpu_decode.c"
ENV_SWITCH = "SOFTTOKENS_NATIVE_DECODE"
LANES, MAX_HEAD_DIM, MAX_GROUP = 16, 256, 64
# first that compiles wins: no -march=native on a compiler without it, no OpenMP without its runtime
FLAG_SETS = (
    ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fopenmp"),
    ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno"),
    ("-O3", "-ffp-contract=off", "-fno-math-errno", "-fopenmp"),
    ("-O3", "-ffp-contract=off", "-fno-math-errno"),
)


def cache_dir() -> Path:
    root = os.environ.get("SOFTTOKENS_CACHE")
    return Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "softtokens"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return platform.processor()


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def build(cc: str, directory: Path) -> Path:
    """The compiled library for this machine (built once, then found by name); raises
    RuntimeError with the compiler's messages when no flag set compiles."""
    source = SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    errors = []
    for flags in FLAG_SETS:
        key = hashlib.sha256(b"\0".join(x.encode() for x in (
            version, " ".join(flags), platform.machine(), _cpu_flags())) + source).hexdigest()[:16]
        target = directory / f"cpu_decode-{key}.so"
        if target.exists():
            return target
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".cpu_decode-", suffix=".so", dir=directory)
        os.close(fd)
        try:
            done = subprocess.run([cc, *flags, "-shared", "-fPIC", "-o", tmp, str(SOURCE), "-lm"],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode == 0:
                os.replace(tmp, target)
                return target
            errors.append(f"{' '.join(flags)}: {done.stderr.strip()[-500:]}")
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    raise RuntimeError("the CPU decode kernels did not compile:\n" + "\n".join(errors))


def _check_contiguous(**tensors) -> None:
    for name, t in tensors.items():
        if t is not None and not t.is_contiguous():
            raise ValueError(f"CPU decode kernel: {name} must be contiguous")


class CpuDecodeKernels:
    """The library's three functions on torch tensors (float32, CPU)."""

    def __init__(self, library: ctypes.CDLL, name: str):
        self.name = name  # the library's file: source, flags, compiler and CPU in its hash
        p, i, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
        self._attention = library.softtokens_decode_attention
        self._attention.argtypes = [p, i, p, p, i, p, p, p, p, p, i, p, i, i, i, i, i, f, ctypes.c_int]
        self._attention.restype = ctypes.c_int
        self._norm = library.softtokens_add_rms_norm
        self._norm.argtypes = [p, p, p, p, i, i, f]
        self._norm.restype = None
        self._silu_mul = library.softtokens_silu_mul
        self._silu_mul.argtypes = [p, p, p, i]
        self._silu_mul.restype = None

    @staticmethod
    def takes(hidden: int, intermediate: int, head_dim: int, heads: int, kv_heads: int, dtype, device) -> bool:
        return (device.type == "cpu" and dtype == torch.float32 and hidden % LANES == 0 and intermediate % LANES == 0
                and head_dim % LANES == 0 and head_dim <= MAX_HEAD_DIM and heads % kv_heads == 0
                and heads // kv_heads <= MAX_GROUP)

    def attention(self, qkv, heads: int, kv_heads: int, cos, sin_signed, keys, values, lengths, scale: float,
                  shared_keys=None, shared_values=None, threads: int | None = None) -> torch.Tensor:
        """qkv (N, (H + 2 Hk) D), its rows may be wider (a slice); cos / sin_signed (positions, D),
        HF's tables with the first half of sin negated; keys / values (N, Hk, max_len, D) cache
        buffers; lengths (N,) long. Writes each slot's rotated key and its value at column
        lengths[n], then returns softmax(q k^T * scale) v over columns 0 .. lengths[n]: (N, H D)."""
        n, max_len, dim = qkv.shape[0], keys.shape[2], keys.shape[3]
        if qkv.stride(1) != 1 or qkv.shape[1] != (heads + 2 * kv_heads) * dim:
            raise ValueError(f"CPU decode attention: qkv {tuple(qkv.shape)} for {heads} + 2 x {kv_heads} heads of {dim}")
        if keys.shape != (n, kv_heads, max_len, dim) or values.shape != keys.shape or lengths.shape != (n,) \
                or lengths.dtype != torch.long or cos.shape != sin_signed.shape or cos.shape[1] != dim:
            raise ValueError(f"CPU decode attention: keys {tuple(keys.shape)}, values {tuple(values.shape)}, "
                             f"lengths {tuple(lengths.shape)} {lengths.dtype}, cos {tuple(cos.shape)}")
        _check_contiguous(cos=cos, sin_signed=sin_signed, keys=keys, values=values, lengths=lengths,
                          shared_keys=shared_keys, shared_values=shared_values)
        shared = 0 if shared_keys is None else shared_keys.shape[-2]
        out = torch.empty(n, heads * dim)
        status = self._attention(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin_signed.data_ptr(), cos.shape[0],
                                 keys.data_ptr(), values.data_ptr(), lengths.data_ptr(),
                                 shared_keys.data_ptr() if shared else None,
                                 shared_values.data_ptr() if shared else None, shared, out.data_ptr(),
                                 n, heads, kv_heads, max_len, dim, scale, threads or torch.get_num_threads())
        if status:
            raise RuntimeError(f"CPU decode attention failed ({status}): qkv {tuple(qkv.shape)}, keys {tuple(keys.shape)}")
        return out

    def add_rms_norm(self, h, y, weight, eps: float) -> torch.Tensor:
        """h += y in place (y None: no add), then HF's RMSNorm of h: (N, d) -> (N, d)."""
        _check_contiguous(h=h, y=y, weight=weight)
        out = torch.empty_like(h)
        self._norm(h.data_ptr(), None if y is None else y.data_ptr(), weight.data_ptr(), out.data_ptr(),
                   h.shape[0], h.shape[1], eps)
        return out

    def silu_mul(self, gate, up) -> torch.Tensor:
        _check_contiguous(gate=gate, up=up)
        out = torch.empty_like(gate)
        self._silu_mul(gate.data_ptr(), up.data_ptr(), out.data_ptr(), gate.numel())
        return out


def torch_attention(qkv, heads, kv_heads, cos, sin_signed, keys, values, lengths, scale,
                    shared_keys=None, shared_values=None) -> torch.Tensor:
    """What ``CpuDecodeKernels.attention`` computes, in torch operations (decode_forward's own
    arithmetic): the reference its tests and its self-check hold it to. Writes the cache too."""
    n, max_len, D = qkv.shape[0], keys.shape[2], keys.shape[3]
    half, H, Hk = D // 2, heads, kv_heads
    at = lengths.clamp(0, max_len - 1)
    c, s = cos[lengths.clamp(0, cos.shape[0] - 1)].unsqueeze(1), sin_signed[lengths.clamp(0, cos.shape[0] - 1)].unsqueeze(1)
    qk = qkv[:, : (H + Hk) * D].reshape(n, H + Hk, D)
    qk = qk * c + qk.roll(half, -1) * s
    q, k, v = qk[:, :H], qk[:, H:], qkv[:, (H + Hk) * D:].reshape(n, Hk, D)
    rows = torch.arange(n)
    keys[rows, :, at], values[rows, :, at] = k, v
    K, V = keys, values
    if shared_keys is not None:
        P = shared_keys.shape[-2]
        K, V = keys.clone(), values.clone()
        K[:, :, :P], V[:, :, :P] = shared_keys, shared_values
    visible = torch.arange(max_len) <= at.unsqueeze(1)  # (N, max_len)
    mask = torch.zeros(n, max_len, dtype=qkv.dtype).masked_fill(~visible, torch.finfo(qkv.dtype).min)[:, None, None, :]
    probs = torch.softmax((q.reshape(n, Hk, H // Hk, D) @ K.transpose(-1, -2)) * scale + mask, dim=-1,
                          dtype=torch.promote_types(qkv.dtype, torch.float32))  # float64 for tests' exact values
    return (probs @ V).reshape(n, H * D)


def _self_check(kernels: CpuDecodeKernels) -> float:
    """Largest difference from the torch operations on small random cases (a shared prefix,
    grouped heads, rows of different lengths): a miscompiled library must not decode."""
    g = torch.Generator().manual_seed(0)
    H, Hk, D, N, L = 4, 2, 32, 3, 40
    qkv = torch.randn(N, (H + 2 * Hk) * D, generator=g)
    cos, sin = torch.randn(2, L, D, generator=g)
    keys, values = torch.randn(2, N, Hk, L, D, generator=g)
    sk, sv = torch.randn(2, Hk, 5, D, generator=g)
    lengths = torch.tensor([0, 17, 38])
    k2, v2 = keys.clone(), values.clone()
    got = kernels.attention(qkv, H, Hk, cos, sin, keys, values, lengths, 0.3, sk, sv, threads=1)
    want = torch_attention(qkv, H, Hk, cos, sin, k2, v2, lengths, 0.3, sk, sv)
    h, y, w = torch.randn(3, N, 64, generator=g)
    h2 = h.clone()
    norm = kernels.add_rms_norm(h, y, w[0], 1e-6)
    gate, up = torch.randn(2, N, 48, generator=g) * 4
    errors = [(got - want).abs().max(), (keys - k2).abs().max(), (values - v2).abs().max(),
              (norm - F.rms_norm(h2 + y, (64,), w[0], 1e-6)).abs().max(),
              (kernels.silu_mul(gate, up) - F.silu(gate) * up).abs().max()]
    return float(max(errors))


def in_use() -> str | None:
    """The loaded library's file name once this process decoded with it (provenance), else None;
    never builds."""
    lib = kernels() if kernels.cache_info().currsize else None
    return lib.name if lib is not None else None


@functools.cache
def kernels() -> CpuDecodeKernels | None:
    """The kernels for this machine, or None (switched off, no compiler, a failed build or check)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    cc = compiler()
    if cc is None:
        warnings.warn("no C compiler found (cc, gcc, clang or $CC): the CPU decode keeps torch's operations",
                      stacklevel=2)
        return None
    try:
        path = build(cc, cache_dir())
        lib = CpuDecodeKernels(ctypes.CDLL(str(path)), path.name)
        error = _self_check(lib)
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError, AttributeError) as e:
        warnings.warn(f"the CPU decode keeps torch's operations: {e}", stacklevel=2)
        return None
    if not error < 1e-5:
        warnings.warn(f"the CPU decode kernels differ from torch's operations by {error:.2e}: not used", stacklevel=2)
        return None
    return lib
