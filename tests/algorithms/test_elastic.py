"""Elastic aggregation's parts without a runtime (seed 000's appendix): B_k drawn once per
(seed, client) and left out of D_k in every round, the average and momentum sensitivities,
the boosted share, and the damped server momentum of Alg. 1. Pure tensor math: milliseconds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tolerance import f32_atol
from torch import nn

from fedray.algorithms.base import ClientContext, ParamError, WorkerEnv
from fedray.algorithms.elastic import (
    ElasticAggregator,
    ElasticParams,
    boosted_share,
    elastic_scale,
    holdout_seed,
    holdout_split,
    sensitivity,
)
from fedray.algorithms.server_opt import ServerMomentum, build_server_optimizer
from fedray.core.flat_model import FlatModel
from fedray.core.seeding import client_seed
from fedray.errors import FedrayError


def _env(seed: int) -> WorkerEnv:
    model = FlatModel(nn.Linear(3, 2))
    return WorkerEnv(
        model=model,
        device=torch.device("cpu"),
        lr=0.1,
        loss="cross_entropy",
        eval_batch_size=64,
        batch_size_for=lambda n: min(n, 20),
        seed=seed,
    )


def _prepared(
    agg: ElasticAggregator, env: WorkerEnv, cid: int, r: int, x: torch.Tensor
) -> ClientContext:
    ctx = ClientContext(cid, r, client_seed(env.seed, r, cid), x, torch.arange(len(x)), 20)
    agg.prepare(env, ctx)
    return ctx


def test_holdout_is_drawn_once_per_seed_and_client():
    """Seed 000 lines 94-95: B_k is sampled before the rounds and dropped from D_k. The split
    depends on (seed, client id) only: every round (whose client seed differs) holds out the
    same examples and trains on all the others, 10% by default (line 193)."""
    agg, env = ElasticAggregator(), _env(seed=3)
    assert agg.params.holdout == 0.1
    x = torch.arange(50, dtype=torch.float32)[:, None].expand(50, 3).contiguous()
    rounds = [_prepared(agg, env, cid=7, r=r, x=x) for r in (1, 2, 9)]
    held = [set(c.scratch["held_x"][:, 0].tolist()) for c in rounds]
    train = [set(c.x[:, 0].tolist()) for c in rounds]
    assert held[0] == held[1] == held[2] and len(held[0]) == 5
    assert train[0] == train[1] == train[2] == set(range(50)) - held[0]
    assert all(len(c.y) == 45 and c.batch_size == 20 for c in rounds)
    # another client, or another job seed, holds out other examples
    other_client = _prepared(agg, env, cid=8, r=1, x=x)
    other_seed = _prepared(agg, _env(seed=4), cid=7, r=1, x=x)
    assert set(other_client.scratch["held_x"][:, 0].tolist()) != held[0]
    assert set(other_seed.scratch["held_x"][:, 0].tolist()) != held[0]
    # the split itself: disjoint, complete, deterministic
    h, k = holdout_split(50, 0.1, holdout_seed(3, 7))
    assert torch.equal(torch.sort(torch.cat([h, k])).values, torch.arange(50))
    assert torch.equal(h, holdout_split(50, 0.1, holdout_seed(3, 7))[0])


def test_average_and_momentum_sensitivity_by_hand():
    """Eq. 1 (average of |g| over B_k's batches) and Alg. 1 line 105 (EMA from zero), with
    g = d ||w.x||^2 / dw = 2 (w.x) x batch-averaged, on a 1-output linear model."""
    torch.manual_seed(0)
    m = FlatModel(nn.Linear(3, 1, bias=False))
    w = m.flat.clone()
    x = torch.randn(10, 3)
    wv = w.double()
    grads, terms = [], torch.zeros(3, dtype=torch.float64)
    for lo in (0, 4, 8):  # batches of 4, 4 and 2
        xb = x[lo : lo + 4].double()
        grads.append((2 * (xb @ wv)[:, None] * xb).mean(0).abs())
        terms = torch.maximum(terms, (2 * (xb @ wv)[:, None] * xb).abs().mean(0))
    mu = 0.9
    ema = torch.zeros(3, dtype=torch.float64)
    for g in grads:
        ema = mu * ema + (1 - mu) * g
    # float32 against float64: batch means of at most 4 terms of this size, a few ulps each
    atol = f32_atol(terms, ulps=8)
    avg = sensitivity(m, w, x, batch_size=4, mu=mu, out=torch.empty(3), method="average")
    torch.testing.assert_close(avg.double(), sum(grads) / 3, rtol=0, atol=atol)
    mom = sensitivity(m, w, x, batch_size=4, mu=mu, out=torch.empty(3), method="momentum")
    torch.testing.assert_close(mom.double(), ema, rtol=0, atol=atol)
    # one batch: the two differ by the factor 1 - mu only, each rounded once in float32
    one_avg = sensitivity(m, w, x, batch_size=16, mu=mu, out=torch.empty(3), method="average")
    one_mom = sensitivity(m, w, x, batch_size=16, mu=mu, out=torch.empty(3))
    torch.testing.assert_close(one_mom, one_avg * (1 - mu), rtol=2e-7, atol=0)


def test_boosted_share_and_method_check():
    omega = torch.tensor([0.0, 0.2, 0.5, 1.0], dtype=torch.float64)
    zeta = elastic_scale(omega, 0.3)  # 1.3, 1.1, 0.8, 0.3: two of four above 1
    assert boosted_share(zeta) == 0.5
    assert boosted_share(elastic_scale(omega, 0.0)) == 0.0  # tau = 0: zeta <= 1 everywhere
    with pytest.raises(ParamError, match="method: must be one of momentum, average"):
        ElasticAggregator(ElasticParams(method="mean"))
    with pytest.raises(ParamError, match="batch_size: must be >= 1 or null"):
        ElasticAggregator(ElasticParams(batch_size=0))


def test_damped_momentum_is_the_seed_form():
    """Alg. 1 line 130: m <- mu' m + (1 - mu') Delta, then x <- x + lr m (fedray adds the
    step: its Delta is theta_k - theta, line 113). dampening = 0 keeps the undamped heavy
    ball bit for bit."""
    rng = np.random.default_rng(0)
    ds = [torch.from_numpy(rng.normal(size=5)) for _ in range(4)]
    x0 = torch.from_numpy(rng.normal(size=5).astype(np.float32))
    beta, lr = 0.9, 0.7
    damped = ServerMomentum(lr, beta, dampening=beta)
    plain = build_server_optimizer("momentum", lr, momentum=beta)
    x, xp, m, mp, xs = x0, x0, np.zeros(5), np.zeros(5), x0.double().numpy()
    for d in ds:
        x, xp = damped.step(x, d), plain.step(xp, d)
        m = beta * m + (1 - beta) * d.numpy()
        mp = beta * mp + d.numpy()
        xs = (xs + lr * m).astype(np.float32).astype(np.float64)
        # float64 arithmetic (torch may fuse a multiply-add, numpy does not) rounded to
        # float32 each step: the float32 results may differ by the last bit, once per step
        np.testing.assert_allclose(x.double().numpy(), xs, rtol=0, atol=f32_atol(xs, ulps=4))
    # float64 buffers of a few steps: ~1e-16 relative apart at most; the undamped buffer
    # is 1 / (1 - beta) = 10 times the damped one, a wrong form is off by O(1)
    np.testing.assert_allclose(plain.state["m"].numpy(), mp, rtol=1e-12)
    np.testing.assert_allclose(damped.state["m"].numpy() / (1 - beta), mp, rtol=1e-12)
    assert np.abs(damped.state["m"].numpy() - mp).max() > 0.1
    with pytest.raises(FedrayError, match="server.dampening"):
        ServerMomentum(lr, beta, dampening=1.0)
