import numpy as np
import torch

from fedray.aggregator import WeightedSum
from fedray.server_optimizer import ServerSGD


def test_partial_sums_equal_one_pass():
    rng = np.random.default_rng(0)
    deltas = [torch.from_numpy(rng.normal(size=10).astype(np.float32)) for _ in range(9)]
    weights = rng.integers(1, 100, size=9).astype(float)
    whole = WeightedSum(10)
    for d, w in zip(deltas, weights, strict=True):
        whole.add(d, w)
    parts = [WeightedSum(10) for _ in range(3)]
    for i, (d, w) in enumerate(zip(deltas, weights, strict=True)):
        parts[i % 3].add(d, w)
    merged = WeightedSum(10)
    for p in parts:
        merged.merge(p.total.numpy(), p.weight)
    expected = sum(w * d.double() for d, w in zip(deltas, weights, strict=True)) / weights.sum()
    torch.testing.assert_close(merged.mean(), expected)
    torch.testing.assert_close(whole.mean(), merged.mean(), rtol=0, atol=1e-15)


def test_server_sgd():
    w = torch.tensor([1.0, 2.0])
    out = ServerSGD(0.5).step(w, torch.tensor([2.0, -4.0], dtype=torch.float64))
    assert out.dtype == torch.float32 and torch.equal(out, torch.tensor([2.0, 0.0]))
