import torch
from torch import nn

from fedray.client_update import local_sgd, num_local_steps
from fedray.replica import FlatModel


def _setup(n=23, seed=0):
    torch.manual_seed(seed)
    m = FlatModel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3)))
    x, y = torch.randn(n, 4), torch.randint(0, 3, (n,))
    return m, m.flat.clone(), x, y


def _run(m, w, x, y, **kw):
    args = dict(lr=0.1, batch_size=5, local_epochs=1, local_steps=None, seed=42,
                delta_out=torch.empty_like(w))
    args.update(kw)
    return local_sgd(m, w, x, y, **args)


def test_step_counts():
    assert num_local_steps(23, 5, 1, None) == 5
    assert num_local_steps(23, 5, 3, None) == 15
    assert num_local_steps(23, 5, 3, 7) == 7
    m, w, x, y = _setup()
    r = _run(m, w, x, y, local_steps=7)
    assert r.steps == 7 and r.examples_seen == 7 * 5 - 2  # one partial batch after 4 full
    r = _run(m, w, x, y, local_epochs=2)
    assert r.steps == 10 and r.examples_seen == 46 and r.num_examples == 23


def test_same_seed_same_delta_any_replica_state():
    m, w, x, y = _setup()
    d1 = _run(m, w, x, y).delta.clone()
    m.flat.normal_()  # a replica left in another client's state
    d2 = _run(m, w, x, y).delta.clone()
    assert torch.equal(d1, d2)
    d3 = _run(m, w, x, y, seed=43).delta
    assert not torch.equal(d1, d3)


def test_matches_plain_sgd_loop():
    torch.manual_seed(0)
    m = FlatModel(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)))
    w, x, y = m.flat.clone(), torch.randn(23, 4), torch.randint(0, 3, (23,))
    ref = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    torch.nn.utils.vector_to_parameters(w.clone(), ref.parameters())
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    perm = torch.randperm(23, generator=torch.Generator().manual_seed(42))
    for i in range(0, 23, 5):
        opt.zero_grad()
        nn.functional.cross_entropy(ref(x[perm[i:i + 5]]), y[perm[i:i + 5]]).backward()
        opt.step()
    r = _run(m, w, x, y)
    expected = torch.nn.utils.parameters_to_vector(ref.parameters()) - w
    torch.testing.assert_close(r.delta, expected, rtol=1e-5, atol=1e-6)


def test_client_without_examples_takes_no_step():
    m, w, x, y = _setup()
    r = _run(m, w, x[:0], y[:0], local_steps=3)
    assert r.steps == 0 and r.num_examples == 0 and torch.equal(r.delta, torch.zeros_like(w))
