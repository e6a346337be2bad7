import itertools
import math

import pytest
import torch

from softtokens.engine.sampling import entropy_from_logits
from softtokens.eval.metrics import (
    entropy_profile,
    entropy_sums,
    mean_pass_at_k,
    pass_at_k,
)


def brute_force_pass_at_k(n, c, k):
    """Fraction of the size-k subsets of n samples (c correct) that contain a correct one."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n,c,k", [(5, 0, 1), (5, 1, 1), (5, 2, 3), (8, 3, 4), (8, 8, 2), (10, 1, 10), (7, 6, 1)])
def test_pass_at_k_matches_enumeration(n, c, k):
    assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_closed_form_and_edges():
    assert pass_at_k(32, 8, 1) == pytest.approx(8 / 32)
    assert pass_at_k(32, 1, 32) == 1.0
    assert pass_at_k(32, 0, 32) == 0.0
    assert pass_at_k(32, 4, 2) == pytest.approx(1 - math.comb(28, 2) / math.comb(32, 2))
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_mean_pass_at_k():
    assert mean_pass_at_k([(4, 0), (4, 4)], 1) == pytest.approx(0.5)


def test_entropy_uniform_and_profile_ignores_pad():
    logits = torch.zeros(2, 3, 8)
    ent = entropy_from_logits(logits)
    assert torch.allclose(ent, torch.full((2, 3), math.log(8)))
    ent = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    valid = torch.tensor([[1, 1, 0], [1, 0, 0]])
    total, count = entropy_sums(ent, valid, width=4)
    assert entropy_profile(total, count) == [2.0, 2.0, None, None]
    # accumulating two batches gives the mean over all rows
    t2, c2 = entropy_sums(torch.tensor([[5.0, 4.0, 0.0]]), torch.tensor([[1, 1, 1]]), width=4)
    assert entropy_profile(total + t2, count + c2) == [3.0, 3.0, 0.0, None]
