"""fedray.core.tensors.add_scaled_: the chunked float64 fold gives torch's own mixed-dtype
add, bit for bit (pure math, no Ray)."""

import pytest
import torch

from fedray.core import tensors
from fedray.core.tensors import add_scaled_


@pytest.mark.parametrize("n", [1, 1000, tensors.FOLD_CHUNK, 3 * tensors.FOLD_CHUNK + 17])
@pytest.mark.parametrize("alpha", [1.0, 37.0, 0.3, 1e-7, -2.5])
def test_fold_equals_torchs_mixed_add_bit_for_bit(n, alpha):
    # float32 -> float64 is exact and both sides then compute the same float64
    # acc + alpha * value, so equality is exact, not within a tolerance
    g = torch.Generator().manual_seed(n)
    acc = torch.randn(n, dtype=torch.float64, generator=g) * 10
    value = torch.randn(n, generator=g) * torch.logspace(-20, 20, n).float()
    value[:: max(1, n // 5)] = float("inf") if n > 1 else value[0]
    expected = acc.clone().add_(value, alpha=alpha)
    got = add_scaled_(acc.clone(), value, alpha)
    assert torch.equal(got, expected)


def test_fold_in_place_on_a_prefix_and_like_dtypes():
    acc = torch.zeros(10, dtype=torch.float64)
    add_scaled_(acc[:4], torch.ones(4), 2.0)  # a prefix view: in place in acc
    assert acc.tolist() == [2.0] * 4 + [0.0] * 6
    same = torch.ones(3, dtype=torch.float64)
    assert add_scaled_(same, torch.ones(3, dtype=torch.float64), 0.5).tolist() == [1.5] * 3


def test_fold_refuses_a_size_mismatch():
    with pytest.raises(ValueError, match="3 values for a sum of 4"):
        add_scaled_(torch.zeros(4, dtype=torch.float64), torch.ones(3))
