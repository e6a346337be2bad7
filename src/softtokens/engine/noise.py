"""Gaussian noise as a pure function of (row key, CoT step, coordinate): nothing stored.

Why: noise on the logits has one coordinate per vocabulary entry (128k for Llama). Drawn ahead
per row, as the embedding noise is, a rollout batch would hold cot_max × V floats per row
(gigabytes), and the update pass needs the same draws again. A counter-based generator makes
each draw from its coordinates: the decode step computes only the current step's noise, the
update pass recomputes it chunk by chunk, and a row's noise never depends on its batch.

The hash is SplitMix64's finaliser on a 64-bit counter (int64 arithmetic wraps, shifts are
made logical with a mask); two 24-bit uniforms per coordinate go through Box-Muller. Plain
tensor operations, so it runs on any device and inside a captured CUDA graph.
"""

from __future__ import annotations

import math

import torch

_GOLDEN = -7046029254386353131   # 0x9E3779B97F4A7C15 as int64
_MIX1 = -4658895280553007687     # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685     # 0x94D049BB133111EB
_STEP = 0x632BE59BD9B4E019       # odd constants that spread step and coordinate over the counter
_COORD = 0x2545F4914F6CDD1D
_LOW24 = (1 << 24) - 1


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of an int64 tensor (>> is arithmetic on signed integers)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ _shift_right(z, 30)) * _MIX1
    z = (z ^ _shift_right(z, 27)) * _MIX2
    return z ^ _shift_right(z, 31)


def counter_normal(keys: torch.Tensor, steps: torch.Tensor, dim: int) -> torch.Tensor:
    """Standard normal draws, float32, shape (*keys.shape, dim): draw j of row i at step t is a
    function of (keys[i], steps[i], j) only. keys, steps: int64 tensors of one shape."""
    keys, steps = keys.long(), steps.long()
    coord = torch.arange(dim, dtype=torch.long, device=keys.device)
    base = keys * _GOLDEN + steps * _STEP
    z = _mix(base.unsqueeze(-1) + coord * _COORD)
    w = _mix(z + _GOLDEN)
    u1 = (((z & _LOW24).float()) + 0.5) / float(1 << 24)   # (0, 1): log never sees 0
    u2 = ((w & _LOW24).float()) / float(1 << 24)
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
