"""pass@k and CoT entropy: the numbers the paper's tables and entropy figures are made of.
torch is imported where a tensor is summed, not here: the report jobs read pass@k without it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021): 1 - C(n-c, k) / C(n, k), as a fraction.

    n samples of which c are correct; the chance that k drawn without replacement contain one."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    # product form avoids huge binomials: C(n-c,k)/C(n,k) = prod_{i=n-c+1}^{n} (1 - k/i)
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(counts: list[tuple[int, int]], k: int) -> float:
    """Mean over problems of pass@k, each problem given as (n, c)."""
    return sum(pass_at_k(n, c, k) for n, c in counts) / len(counts)


def entropy_sums(entropy: torch.Tensor, valid: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per CoT position, the sum of entropies over valid (non-pad CoT) rows and their count, so
    batches can be accumulated. entropy, valid: (N, T); the result is cut or padded to width."""
    import torch

    valid = valid.to(torch.float32)
    total, count = torch.zeros(width), torch.zeros(width)
    w = min(width, entropy.shape[1])
    total[:w] = (entropy[:, :w].float().cpu() * valid[:, :w].cpu()).sum(0)
    count[:w] = valid[:, :w].cpu().sum(0)
    return total, count


def entropy_profile(total: torch.Tensor, count: torch.Tensor) -> list[float | None]:
    """Mean entropy at each CoT position over all generations, non-pad positions only
    (paper, Appendix entropy analysis). None where no generation reached that position."""
    return [float(t / c) if c > 0 else None for t, c in zip(total.tolist(), count.tolist())]
