import torch
from torch import nn

from fedray.replica import FlatModel


def test_parameters_and_float_buffers_are_views_of_flat():
    module = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))
    m = FlatModel(module)
    n_params = sum(p.numel() for p in module.parameters())
    assert m.num_params == n_params
    assert m.size == n_params + 3 + 3  # running_mean, running_var (num_batches_tracked is int)
    m.flat.fill_(0.5)
    assert all(torch.all(p == 0.5) for p in module.parameters())
    assert torch.all(module[1].running_var == 0.5)


def test_gradients_accumulate_into_flat_grad():
    m = FlatModel(nn.Linear(3, 2))
    x = torch.randn(5, 3)
    m.module(x).sum().backward()
    g = m.grad.clone()
    assert g.abs().sum() > 0
    m.module(x).sum().backward()
    torch.testing.assert_close(m.grad, 2 * g)


def test_load_and_state_dict_roundtrip():
    a, b = FlatModel(nn.Linear(3, 2)), FlatModel(nn.Linear(3, 2))
    b.load_(a.flat)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)
    sd = a.state_dict()
    a.flat.zero_()
    assert sd["weight"].abs().sum() > 0  # a copy, not a view
