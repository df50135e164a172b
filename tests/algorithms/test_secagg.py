"""Secure aggregation's emulation (fedray/algorithms/secagg.py), no Ray: the threshold on the
driver (merge / close with hand-made partial sums), and the fixed-point sum from clients on
fake workers (client_update into a worker's PartialSum, with unit weights as the ``uniform``
aggregator adds them) through the driver's merge, close and finish_sum."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tolerance import F32_EPS

from fedray.algorithms.base import (
    ClientContext,
    LocalUpdate,
    ParamError,
    PartialSum,
    Payload,
    WorkerEnv,
    extra_sizes,
)
from fedray.algorithms.reduction import PartialMessage
from fedray.algorithms.secagg import SecAggParams, SecureAggregation
from fedray.core.flat_model import FlatModel
from fedray.core.seeding import derive_seed

F64_EPS = float(np.finfo(np.float64).eps)
SIZE = 40


# -- the threshold ----------------------------------------------------------------------------


def partials(counts: list[int], seed: int = 0) -> list[PartialMessage]:
    """Workers' partial sums holding ``counts`` clients each, with an extra sum of another
    part's (grouped like the rest)."""
    rng = np.random.default_rng(seed)
    return [PartialMessage(rng.normal(size=SIZE) * c, float(c), 0.0,
                           {"secagg_clients": np.array([float(c)]),
                            "other": rng.normal(size=3)}) for c in counts]


def driver_sum() -> PartialSum:
    return PartialSum(SIZE, extras={"secagg_clients": 1, "other": 3})


def run_round(stage: SecureAggregation, parts: list[PartialMessage],
              round_idx: int = 1) -> tuple[PartialSum, str | None, list[float]]:
    """The driver's round; the number of clients revealed after each merge."""
    acc, revealed = driver_sum(), []
    for part in parts:
        stage.merge(acc, part)
        revealed.append(float(acc.extras["secagg_clients"][0]))
    return acc, stage.close(acc, round_idx), revealed


def test_groups_reach_the_minimum_and_sum_as_the_flat_merge():
    """[1, 2, 1, 5] with min 3: groups of 3 and 6. The grouped float64 sum is the flat one
    reassociated (4 terms), so they agree to a few float64 ulps of sum |x_i|: 4 * eps64."""
    parts = partials([1, 2, 1, 5])
    stage = SecureAggregation(SecAggParams(min_clients=3))
    acc, reason, revealed = run_round(stage, parts)
    assert reason is None
    assert revealed == [0, 0, 0, 3]  # the first group waits until the second completes
    assert stage.round_metrics() == {"secagg_sums": 2.0, "secagg_min_sum": 3.0,
                                     "secagg_aborted": 0.0}
    flat = driver_sum()
    for part in parts:
        flat.merge(part)
    bound = 4 * F64_EPS * sum(np.abs(p.sum) for p in parts)
    assert np.all(np.abs(acc.total.numpy() - flat.total.numpy()) <= bound)
    assert acc.weight == flat.weight == 9.0 and acc.log_scale == 0.0
    assert torch.allclose(acc.extras["other"], flat.extras["other"], rtol=1e-12, atol=0)
    assert float(acc.extras["secagg_clients"][0]) == 9.0


def test_a_short_remainder_joins_the_held_group():
    stage = SecureAggregation(SecAggParams(min_clients=3))
    acc, reason, revealed = run_round(stage, partials([2, 2, 1, 0]))
    assert reason is None and revealed == [0, 0, 0, 0]
    assert float(acc.extras["secagg_clients"][0]) == 5.0  # one group: 4, then the 1 joined
    assert stage.round_metrics()["secagg_sums"] == 1.0
    assert stage.round_metrics()["secagg_min_sum"] == 5.0


def test_too_few_clients_refuse_the_round_and_reveal_nothing():
    stage = SecureAggregation(SecAggParams(min_clients=3))
    acc, reason, _ = run_round(stage, partials([1, 1]), round_idx=4)
    assert reason == "secure aggregation needs at least 3 clients in a sum; round 4 has 2"
    assert acc.weight == 0.0 and not acc.total.any()
    assert not any(v.any() for v in acc.extras.values())
    assert stage.round_metrics() == {"secagg_sums": 0.0, "secagg_min_sum": 0.0,
                                     "secagg_aborted": 1.0}
    # the next round starts afresh: nothing of the refused round is carried over
    acc, reason, _ = run_round(stage, partials([3], seed=1), round_idx=5)
    assert reason is None and acc.weight == 3.0
    assert np.array_equal(acc.total.numpy(), partials([3], seed=1)[0].sum)


def test_min_one_reveals_every_partial_as_the_flat_merge_bit_for_bit():
    """min_clients 1: every partial is a group, folded into the sum in the same order as
    the flat merge (each into an empty group first, which adds it to zeros: exact)."""
    parts = partials([1, 3, 2])
    stage = SecureAggregation(SecAggParams(min_clients=1))
    acc, reason, _ = run_round(stage, parts)
    flat = driver_sum()
    for part in parts:
        flat.merge(part)
    assert reason is None and torch.equal(acc.total, flat.total)
    assert stage.round_metrics()["secagg_sums"] == 3.0


# -- the fixed-point sum ----------------------------------------------------------------------


def make_env() -> WorkerEnv:
    """A model with float buffers (batch norm's), which secagg sums as they are."""
    model = FlatModel(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4)))
    assert model.size > model.num_params
    return WorkerEnv(model=model, device=torch.device("cpu"), lr=0.1, loss="cross_entropy",
                     eval_batch_size=64, batch_size_for=lambda n: n)


def secure_round(params: SecAggParams, deltas: list[torch.Tensor], workers: list[list[int]],
                 round_idx: int = 1):
    """Clients on workers (each its own stage instance, as each worker unpickles one), the
    driver's merge, close and finish_sum. Returns the driver's sum, close's reason, the
    driver's stage and each client's update after the stage."""
    env = make_env()
    sizes = extra_sizes((SecureAggregation(params),), env.num_params)
    driver, acc = SecureAggregation(params), PartialSum(env.model.size, extras=sizes)
    sent = {}
    for clients in workers:
        stage, worker_acc = SecureAggregation(params), PartialSum(env.model.size, extras=sizes)
        for cid in clients:
            ctx = ClientContext(cid, round_idx, derive_seed(3, round_idx, cid),
                                torch.zeros(1, 8), torch.zeros(1), 1)
            update = LocalUpdate(deltas[cid].clone(), 10, 0.0, 10, 1)
            assert stage.client_update(env, ctx, update, worker_acc) is None
            worker_acc.add(update.delta, 1.0)  # the uniform aggregator
            sent[cid] = update.delta
        driver.merge(acc, worker_acc.to_message())
    reason = driver.close(acc, round_idx)
    if reason is None:
        driver.finish_sum(acc, round_idx)
    return acc, reason, driver, sent


def test_fixed_point_sum_within_n_steps_of_the_exact_sum():
    """Inside the range, each client's encoding moves a coordinate by less than one step,
    so the decoded sum of n clients is within n steps of the exact sum (the decoding itself
    is float64: ~1e-16 of the range, far below a step of 2 / 4095)."""
    params = SecAggParams(min_clients=2, bits=24, precision_bits=12, range=1.0)
    env, n = make_env(), 5
    g = torch.Generator().manual_seed(0)
    deltas = [(torch.rand(env.model.size, generator=g) * 1.8 - 0.9) for _ in range(n)]
    acc, reason, driver, sent = secure_round(params, deltas, [[0, 1, 2], [3, 4]])
    assert reason is None
    p, step = env.num_params, 2.0 / (2**12 - 1)
    exact = sum(d.double() for d in deltas)
    err = (acc.total[:p] - exact[:p]).abs()
    assert float(err.max()) < n * step
    assert float(err.max()) > 0.5 * step  # rounded: not the exact sum passed through
    # what each client sent decodes to its share of the sum: float32 values of size <= 1,
    # rounded once each (half an ulp of 1)
    clients = sum(sent[c][:p].double() for c in range(n))
    assert float((acc.total[:p] - clients).abs().max()) <= n * F32_EPS
    # float buffers (batch norm's) are summed as they are, in float64
    assert torch.allclose(acc.total[p:], exact[p:], rtol=0, atol=n * F64_EPS)
    assert acc.weight == float(n) and acc.log_scale == 0.0
    m = driver.round_metrics()
    want = float(torch.linalg.vector_norm(acc.total[:p] - exact[:p])
                 / torch.linalg.vector_norm(exact[:p]))
    assert m["secagg_wrapped"] == 0.0 and m["secagg_error"] == pytest.approx(want, rel=1e-9)
    assert m["secagg_sums"] == 2.0 and m["secagg_min_sum"] == 2.0  # the workers' 3 and 2


def test_fixed_point_clips_to_the_range():
    params = SecAggParams(min_clients=1, bits=20, precision_bits=10, range=0.5)
    env = make_env()
    delta = torch.linspace(-2, 2, env.model.size)
    acc, _, _, sent = secure_round(params, [delta], [[0]])
    p, step = env.num_params, 1.0 / (2**10 - 1)
    clipped = delta[:p].clamp(-0.5, 0.5).double()
    assert float((acc.total[:p] - clipped).abs().max()) < step
    assert float(sent[0][:p].abs().max()) <= 0.5


def test_the_encoding_is_the_clients_stream():
    params = SecAggParams(min_clients=1, bits=30, precision_bits=16)
    env = make_env()
    delta = torch.rand(env.model.size, generator=torch.Generator().manual_seed(1)) - 0.5
    a = secure_round(params, [delta], [[0]])[3][0]
    b = secure_round(params, [delta], [[0]])[3][0]
    c = secure_round(params, [delta], [[0]], round_idx=2)[3][0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_the_encoding_is_unbiased():
    """400 clients with the same update: the decoded sum / 400 is the update. Each client's
    rounding is one of the two levels around it, variance <= step**2 / 4, so the mean's
    standard error is <= step / 40; 6 of them (0.15 step) bound every coordinate, while
    rounding to the nearest level is up to half a step off (3 bits: a step of 2 / 7)."""
    params = SecAggParams(min_clients=1, bits=20, precision_bits=3)
    env, n = make_env(), 400
    delta = torch.rand(env.model.size, generator=torch.Generator().manual_seed(4)) * 2 - 1
    acc = secure_round(params, [delta] * n, [list(range(n))])[0]
    p, step = env.num_params, 2.0 / 7
    assert float((acc.total[:p] / n - delta[:p].double()).abs().max()) < 6 * step / 40
    nearest = torch.round((delta[:p].double() + 1) / step) * step - 1
    assert float((nearest - delta[:p]).abs().max()) > 0.4 * step  # the bound tells them apart


def test_wrap_around_is_detected_and_counted():
    """4 clients of 4-bit values summed modulo 2**5: a coordinate near +range in every
    client sums to ~60 >= 32 and wraps; one near -range sums to ~0 and does not. The count
    is checked against the clients' own integers, read back from what each sent."""
    params = SecAggParams(min_clients=2, bits=5, precision_bits=4, range=1.0)
    env, n = make_env(), 4
    g = torch.Generator().manual_seed(2)
    sign = torch.where(torch.arange(env.model.size) % 3 == 0, 1.0, -1.0)
    deltas = [sign * (0.8 + 0.2 * torch.rand(env.model.size, generator=g)) for _ in range(n)]
    acc, reason, driver, sent = secure_round(params, deltas, [[0, 1], [2, 3]])
    assert reason is None
    p, step = env.num_params, 2.0 / 15
    ints = sum(torch.round((sent[c][:p].double() + 1.0) / step) for c in range(n))
    expected = int((ints >= 32).sum())
    assert 0 < expected < p
    m = driver.round_metrics()
    assert m["secagg_wrapped"] == float(expected)
    assert m["secagg_error"] > 0.5  # the wrapped coordinates decode 32 steps (~4.3) off
    wrapped = ints >= 32
    assert torch.allclose(acc.total[:p][wrapped], (ints[wrapped] - 32) * step - n,
                          rtol=0, atol=1e-12)


def test_too_many_clients_for_float64_integers_raise():
    params = SecAggParams(min_clients=1, bits=52, precision_bits=51)
    env = make_env()
    deltas = [torch.zeros(env.model.size)] * 5
    secure_round(params, deltas[:4], [[0, 1, 2, 3]])  # 4 (2**51 - 1) < 2**53: exact
    with pytest.raises(ValueError, match="float64"):
        secure_round(params, deltas, [[0, 1, 2, 3, 4]])


# -- params, instance attributes, payload -----------------------------------------------------


def test_params_are_checked():
    for kw, key in (({"min_clients": 0}, "min_clients"), ({"bits": 1}, "bits"),
                    ({"bits": 53}, "bits"), ({"bits": 16, "precision_bits": 16},
                                             "precision_bits"),
                    ({"precision_bits": 0}, "precision_bits"), ({"range": 0.0}, "range"),
                    ({"range": float("inf")}, "range")):
        with pytest.raises(ParamError) as info:
            SecureAggregation(SecAggParams(**kw))
        assert info.value.key == key


def test_instance_attributes_follow_the_params():
    plain = SecureAggregation(SecAggParams(min_clients=4))
    assert plain.extras == {"secagg_clients": 1}
    assert plain.min_clients_per_partial == 4 and not plain.needs_unit_weights
    fixed = SecureAggregation(SecAggParams(bits=20))
    assert fixed.extras == {"secagg_clients": 1, "secagg_sum": "params",
                            "secagg_exact": "params"}
    assert fixed.needs_unit_weights
    assert extra_sizes((fixed,), 7) == {"secagg_clients": 1, "secagg_sum": 7,
                                        "secagg_exact": 7}
    assert SecureAggregation.extras == {}  # the class attribute is untouched


def test_payload():
    dense = Payload(values=1000)
    assert SecureAggregation(SecAggParams()).payload(dense) == dense
    fixed = SecureAggregation(SecAggParams(bits=20)).payload(dense)
    assert fixed == Payload(values=1000, value_bits=20) and fixed.bytes == 2500
