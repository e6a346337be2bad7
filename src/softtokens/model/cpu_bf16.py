"""bf16 compute on a CPU that has no bf16 instructions (AVX2, no AVX512-BF16 / AMX): its matrix products in float32.

torch's bf16 kernels on such a CPU are a slow fallback: one forward and backward of SmolLM2-135M on 282 tokens took
80 s on a 2-core AMD EPYC (AVX2), 6.7 s with every linear layer computed from its bf16 inputs in float32 and rounded
back to bf16 (benchmarks/cpu_bf16.py). That is what a bf16 GEMM does on a GPU (and on a CPU with bf16 units): exact
products of bf16 numbers, accumulated in float32, the result rounded to bf16. So the arithmetic the paper's precision
asks for is kept (bf16 weights, activations and gradients between the products) and only the kernel changes; where
the CPU has bf16 units (``torch.ops.mkldnn._is_mkldnn_bf16_supported()``, recorded in every record's device block as
``cpu_bf16_native``) torch's own kernels run and this does nothing. float32 compute is never touched."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

# the products that carry a model's FLOPs: its linear layers (projections, MLP, the head) and attention's matmuls
_PRODUCTS = {F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm}


def native_bf16() -> bool:
    """Whether this CPU computes bf16 products in hardware (torch's oneDNN kernels use them)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def upcasts(dtype: torch.dtype | str, device: torch.device | str) -> bool:
    """Whether bf16 products on ``device`` are computed in float32 here (see the module's docstring)."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return dtype == torch.bfloat16 and torch.device(device).type == "cpu" and not native_bf16()


class Float32Products(TorchFunctionMode):
    """Every product of bf16 CPU tensors computed in float32, its result rounded to bf16 (autograd follows the
    casts: the gradients are the same products, rounded the same way)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _PRODUCTS and _bf16_cpu(args[0]) and _bf16_cpu(args[1]):
            up = [a.float() if isinstance(a, torch.Tensor) else a for a in args]
            kw = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            return func(*up, **kw).to(torch.bfloat16)
        return func(*args, **kwargs)


def _bf16_cpu(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 and x.device.type == "cpu"


def recompute_as_forward():
    """``context_fn`` for torch.utils.checkpoint (use_reentrant=False): the recomputation in the backward pass runs
    under Float32Products where the forward did. The autograd engine runs a checkpoint's recomputation outside the
    caller's function modes, so without it a recomputed product is bf16 where the forward's saved one was float32,
    and torch refuses the mismatch (CheckpointError: "Recomputed values ... have different metadata")."""
    from torch.overrides import _get_current_function_mode_stack

    forward = any(isinstance(m, Float32Products) for m in _get_current_function_mode_stack())
    return contextlib.nullcontext(), (Float32Products() if forward else contextlib.nullcontext())


def bf16_products(dtype: torch.dtype | str, device: torch.device | str):
    """The context a job computes in: Float32Products where ``upcasts``, else nothing."""
    return Float32Products() if upcasts(dtype, device) else contextlib.nullcontext()
