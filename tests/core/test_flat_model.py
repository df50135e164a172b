import torch
from torch import nn

from fedray.core.flat_model import FlatModel


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


def test_own_grads_keeps_fresh_gradients_and_gives_the_flat_views_back():
    m = FlatModel(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)))
    x = torch.randn(5, 3)
    m.module(x).sum().backward()
    expected = m.grad.clone()
    m.grad.fill_(7.0)
    with m.own_grads() as params:
        for p in params:
            p.grad = None
        m.module(x).sum().backward()
        fresh = torch.cat([p.grad.reshape(-1) for p in params])
        assert all(p.grad.data_ptr() != g.data_ptr() for p, g in
                   zip(params, m.split(m.grad), strict=True))
    torch.testing.assert_close(fresh, expected)
    assert torch.all(m.grad == 7.0)  # the flat gradient was not touched
    m.grad.zero_()
    m.module(x).sum().backward()  # and accumulates into the flat views again
    torch.testing.assert_close(m.grad, expected)


def test_split_gives_parameter_shaped_views():
    m = FlatModel(nn.Linear(3, 2))
    parts = m.split(m.flat)
    assert [t.shape for t in parts] == [torch.Size([2, 3]), torch.Size([2])]
    parts[1].fill_(9.0)
    assert torch.all(m.module.bias == 9.0)
