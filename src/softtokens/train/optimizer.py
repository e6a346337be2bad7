"""AdamW as the runs build it: the fused kernels where the parameters' device has them.

Why: the default (multi-tensor, "foreach") AdamW allocates a full-size float32 temporary of the
parameters in step(): 12.85 GB for a 3.2B model, the update's largest transient on an H100 (docs/gpu.md),
which forced 2-row micro-batches on one 80 GB GPU. The fused kernels (CUDA, and the CPU in recent torch)
compute the same update without it (tests/test_optimizer.py holds the two equal). The implementation
used is what the memory plan counts (sizing.plan.OPTIMIZER_TEMPORARIES) and what a run's log says.
"""

from __future__ import annotations

import torch

FUSED, FOREACH = "fused", "foreach"


def adamw(params, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
          implementation: str | None = None) -> tuple[torch.optim.AdamW, str]:
    """(AdamW over ``params``, the implementation used): ``implementation`` FUSED or FOREACH, or None
    for fused where torch has the kernels for the parameters' device, else foreach."""
    params = [p for p in params if p.requires_grad]
    kw = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if implementation in (None, FUSED):
        try:
            return torch.optim.AdamW(params, fused=True, **kw), FUSED
        except (RuntimeError, ValueError, TypeError) as err:   # a device or dtype without fused kernels
            if implementation == FUSED:
                raise
            print(f"fused AdamW unavailable here ({err}); using the foreach kernels", flush=True)
    return torch.optim.AdamW(params, foreach=True, **kw), FOREACH
