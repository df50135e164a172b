"""data.per_round: a client's training data in round r is a pure function of
(seed, r, client_id) -- identical on any worker, in any order, whatever the other clients of
the round -- and changes from round to round."""

import functools

import numpy as np
import pytest
import torch

from fedray.algorithms.registry import resolve
from fedray.config import ServerConfig, load_config, validate
from fedray.core.models import build_model
from fedray.data.transforms.per_round import (
    PerRound,
    apply_per_round,
    class_profile,
    flip_map,
    parse_per_round,
)
from fedray.errors import ConfigError
from fedray.runtime.messages import Broadcast, RoundTask
from fedray.runtime.worker import ClientWorker, LocalTraining, WorkerResources, WorkerSpec
from fedray.tracking.callbacks import Callback

C = 10
SHAPE = (1, 4, 4)


def _pool(n: int = 600, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    return (g.standard_normal((n, *SHAPE)).astype(np.float32), g.integers(0, C, n).astype(np.int64))


IMB = PerRound(ratios=(1.0, 0.1, 0.01), size=120, pool="all")
FLIP = PerRound(ratios=(1.0,), size=120, pool="all", corruption=1 / 3, flip_ratio=1.0)


@pytest.mark.parametrize("spec", [IMB, FLIP], ids=["imbalance", "label_flip"])
def test_same_seed_round_client_gives_identical_data(spec):
    pool = _pool()
    own = _pool(30, seed=5)
    a = apply_per_round(spec, 3, 7, 11, *own, C, pool)
    b = apply_per_round(spec, 3, 7, 11, *own, C, pool)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2] == b[2]


def test_rounds_and_clients_differ():
    pool = _pool()
    own = _pool(30, seed=5)
    base = apply_per_round(IMB, 3, 7, 11, *own, C, pool)[1]
    for r in (8, 9):
        assert not np.array_equal(apply_per_round(IMB, 3, r, 11, *own, C, pool)[1], base)
    assert not np.array_equal(apply_per_round(IMB, 3, 7, 12, *own, C, pool)[1], base)
    assert not np.array_equal(apply_per_round(IMB, 4, 7, 11, *own, C, pool)[1], base)
    # a client's corruption is drawn afresh each round: over 300 rounds one client is
    # corrupted in about a third of them (binomial sd 8 rounds; the bounds are 5 sd wide)
    flipped = [flip_map(0, r, 3, C, 1 / 3, 1.0) is not None for r in range(300)]
    assert 60 <= sum(flipped) <= 140


def test_imbalance_profile_and_pool():
    pool = _pool(4000)
    x, y, info = apply_per_round(
        PerRound(ratios=(0.01,), size=500, pool="all"), 0, 1, 2, *_pool(10, seed=3), C, pool
    )
    assert info["ratio"] == 0.01 and len(y) == 500
    counts = np.sort(np.bincount(y, minlength=C))[::-1]
    np.testing.assert_array_equal(counts, np.sort(class_profile(0.01, np.arange(C), 500))[::-1])
    assert counts[-1] <= 0.01 * counts[0] + 1  # smallest / largest = the drawn ratio
    for xi, yi in zip(x[:20], y[:20], strict=True):  # every example is a pool row, label kept
        row = np.flatnonzero((pool[0] == xi).all(axis=(1, 2, 3)))
        assert len(row) == 1 and pool[1][row[0]] == yi
    # pool: client draws from the client's own examples; size null keeps its count
    own = _pool(50, seed=4)
    _, y2, _ = apply_per_round(PerRound(ratios=(1.0,), pool="client"), 0, 1, 2, *own, C)
    assert len(y2) <= 50 and set(y2.tolist()) <= set(own[1].tolist())


def test_label_flip_flips_a_share_of_classes():
    for r in range(40):
        m = flip_map(1, r, 0, C, 1.0, 0.3)
        if m is None:
            continue
        changed = np.flatnonzero(m != np.arange(C))
        assert len(changed) == 3  # round(0.3 * 10) classes, each to a wrong label
    m = flip_map(1, 0, 0, C, 1.0, 1.0)
    assert (m != np.arange(C)).all() and sorted(m.tolist()) == list(range(C))
    assert flip_map(1, 0, 0, C, 0.0, 1.0) is None


def test_config_keys_are_checked():
    assert parse_per_round(load_config().data.per_round) is None  # off by default
    for key, value, msg in [
        ("imbalance.ratios", "[0.5,0]", r"imbalance\.ratios': every ratio must be in \(0, 1\]"),
        ("imbalance.pool", "everyone", r"imbalance\.pool': must be client or all"),
        ("imbalance.size", "0", r"imbalance\.size': must be >= 1"),
        ("label_flip.corruption", "1.5", r"label_flip\.corruption': must be in \[0, 1\]"),
        ("label_flip.flip_ratio", "0", r"label_flip\.flip_ratio': must be in \(0, 1\]"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            validate(load_config(None, [f"data.per_round.{key}={value}"]), 10)


class _Clients:
    population = 9
    num_classes = C
    input_shape = SHAPE
    has_client_test = False
    cacheable = False

    def train_sizes(self) -> np.ndarray:
        return np.full(self.population, 40)

    def client(self, cid: int, split: str = "train"):
        g = np.random.default_rng(100 + cid)
        return (
            g.standard_normal((40, *SHAPE)).astype(np.float32),
            g.integers(0, C, 40).astype(np.int64),
        )


def _worker(per_round: PerRound, vectorize: bool = False) -> ClientWorker:
    torch.manual_seed(0)
    parts = resolve({"name": "expalpha"}, ServerConfig())
    spec = WorkerSpec(
        make_model=functools.partial(build_model, "mlp", SHAPE, C),
        source=_Clients(),
        seed=7,
        training=LocalTraining(
            lr=0.1, batch_size=8, local_epochs=1, local_steps=3, eval_batch_size=16
        ),
        resources=WorkerResources(num_cpus=1, cache_mb=0, vectorize=vectorize),
        client=parts.client,
        aggregator=parts.aggregator,
        per_round=per_round,
    )
    w = ClientWorker(spec)
    if vectorize:
        w.group = 4
    return w


def test_worker_data_independent_of_worker_and_order():
    """Two workers (as with 1 or 2 workers: a client lands on either), other clients and
    another order: client 5's round-4 data are the same bytes."""
    a, b = _worker(FLIP), _worker(FLIP)
    seen_a = {c.cid: c for c in a._jobs(4, [0, 2, 5, 8], None)}
    seen_b = {c.cid: c for c in b._jobs(4, [5], None)}
    for got in (seen_a[5], seen_b[5]):
        x, y, _ = apply_per_round(FLIP, 7, 4, 5, *_Clients().client(5), C, a._pool)
        assert torch.equal(got.x, torch.from_numpy(x)) and torch.equal(got.y, torch.from_numpy(y))
    assert got.batch_size == 8 and len(got.y) == 120  # size from the pool, not the store's 40
    other = next(iter(a._jobs(5, [5], None)))
    assert not torch.equal(other.y, seen_a[5].y)  # the next round draws client 5 afresh


def test_sequential_and_vectorized_train_on_the_same_round_data():
    """Both kernels see the transformed data: their partial sums agree to float32 rounding
    (3 steps of an MLP with weights of size ~0.3: 1e-5 absolute is ~100 float32 ulps of the
    largest weight, far below the O(1e-2) change the transform makes)."""
    res = {}
    for vec in (False, True):
        w = _worker(FLIP, vectorize=vec)
        weights = w.model.flat.detach().cpu().numpy().copy()
        out = w.train(Broadcast(weights, {}), RoundTask(round=2, client_ids=list(range(9))))
        res[vec] = out
    assert res[False].examples == res[True].examples == 9 * 120
    a, b = (r.partial.sum / r.partial.weight for r in (res[False], res[True]))
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    plain = _worker(None).train(
        Broadcast(weights, {}), RoundTask(round=2, client_ids=list(range(9)))
    )
    assert plain.examples == 9 * 40  # without per_round: the store's clients
    c = plain.partial.sum / plain.partial.weight
    assert np.abs(c - a).max() > 1e-3  # the transform changed what was trained


# -- fixed compositions: exactly these conditions in every round ---------------------------

COMPOSED = PerRound(composition=(1.0,) * 4 + (0.01,) * 3 + (0.1,) * 3, size=120, pool="all")
COUNTED = PerRound(ratios=(1.0,), size=120, pool="all", corrupted=4, flip_ratio=0.1)


def test_a_composition_is_exact_in_every_round_and_dealt_at_random():
    """Ten invitees, {1.0 x 4, 0.01 x 3, 0.1 x 3} (seed 003 line 138): every round holds
    exactly that multiset, whichever ids were invited; the deal (who gets which) changes
    from round to round and depends on the rank alone, never on the id or the worker."""
    pool = _pool()
    deals = []
    for r in range(1, 7):
        ids = np.sort(np.random.default_rng(r).choice(1000, 10, replace=False))
        got = [apply_per_round(COMPOSED, 3, r, int(c), None, None, C, pool, None, (k, 10))[2]
               ["ratio"] for k, c in enumerate(ids)]
        assert sorted(got) == sorted(COMPOSED.composition)
        deals.append(tuple(got))
        # the same rank in the same round gets the same ratio whatever the client's id
        other = apply_per_round(COMPOSED, 3, r, 999_999, None, None, C, pool, None, (0, 10))
        assert other[2]["ratio"] == got[0]
    assert len(set(deals)) > 1
    with pytest.raises(ConfigError, match=r"composition': has 10 ratios, one per client of "
                       r"a round; this round invited 9"):
        apply_per_round(COMPOSED, 3, 1, 0, None, None, C, pool, None, (0, 9))
    with pytest.raises(ValueError, match="needs the client's rank"):
        apply_per_round(COMPOSED, 3, 1, 0, None, None, C, pool)


def test_a_corrupted_count_is_exact_and_keeps_the_clients_own_flip():
    """``corrupted: 4`` of 6 (seed 003 line 177): exactly four flipped in every round; a
    flipped client's label map is the one its own stream gives (the chance's draw is taken
    either way), with round(0.1 * 10) = 1 class relabelled."""
    pool = _pool()
    for r in range(1, 9):
        flipped = []
        for k in range(6):
            _, y, info = apply_per_round(COUNTED, 5, r, 10 + k, None, None, C, pool, None, (k, 6))
            flipped.append(info["flipped"])
            if info["flipped"]:
                m = flip_map(5, r, 10 + k, C, 1.0, 0.1)  # the client's map, were it chosen
                assert (m != np.arange(C)).sum() == 1
                clean, yc, _ = apply_per_round(PerRound(ratios=(1.0,), size=120, pool="all"),
                                               5, r, 10 + k, None, None, C, pool)
                np.testing.assert_array_equal(y, m[yc])
        assert sum(flipped) == 4


def test_fixed_compositions_are_checked_against_the_sampling():
    base = ["data.per_round.imbalance.size=20", "data.per_round.imbalance.pool=all"]
    comp = "data.per_round.imbalance.composition=[1.0,1.0,0.1]"
    for overrides, msg in [
        ([comp, "sampling.clients_per_round=4"],
         r"composition': has 3 ratios, one per client of a round; sampling invites 4"),
        ([comp, "sampling.clients_per_round=3", "sampling.over_selection=0.5"],
         r"composition': .*; sampling \(with over_selection\) invites 5"),
        ([comp, "sampling.clients_per_round=3", "sampling.mode=poisson"],
         r"sampling\.mode': cannot be combined with data\.per_round\.imbalance\.composition"),
        ([comp, "data.per_round.imbalance.ratios=[1.0]", "sampling.clients_per_round=3"],
         r"composition': cannot be combined with data\.per_round\.imbalance\.ratios"),
        (["data.per_round.label_flip.corrupted=5", "sampling.clients_per_round=4"],
         r"corrupted': must be <= the clients of a round: sampling invites 4"),
        (["data.per_round.label_flip.corrupted=2", "data.per_round.label_flip.corruption=0.5"],
         r"corrupted': cannot be combined with data\.per_round\.label_flip\.corruption"),
        (["data.per_round.label_flip.corrupted=-1"], r"corrupted': must be a whole number >= 0"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            validate(load_config(None, [*base, *overrides]), 10)
    validate(load_config(None, [*base, comp, "sampling.clients_per_round=3"]), 10)
    for bad in ("two", 2.5, True, [1]):  # untyped, as a dict reaches parse_per_round
        with pytest.raises(ConfigError, match=r"corrupted': must be a whole number >= 0"):
            parse_per_round({"label_flip": {"corrupted": bad}})


def test_a_run_with_fixed_compositions_records_and_keeps_them(tmp_path):
    """In process (inline), 2 rounds of Exp-alpha: each round's participants table holds
    the composition's ratios exactly, the corrupted count, and Exp-alpha's log weights,
    and the run is the same bit for bit with one worker or three (ranks, not placement)."""
    import pyarrow.ipc as ipc
    from conftest import blobs, fixed_linear

    import fedray

    clients, test = blobs(12, seed=4), blobs(1, seed=9)[0]
    runs = {}
    for workers in (1, 3):
        out = tmp_path / f"w{workers}"
        job = {"name": "composed", "seed": 2, "rounds": 2,
               "algorithm": {"name": "expalpha"},
               "client": {"lr": 0.1, "batch_size": 4, "local_steps": 3},
               "sampling": {"clients_per_round": 5},
               "data": {"per_round": {
                   "imbalance": {"composition": [1.0, 1.0, 0.5, 0.2, 0.2], "size": 12,
                                 "pool": "all"},
                   "label_flip": {"corrupted": 2}}},
               "output": {"dir": str(out), "participants": True},
               "runtime": {"backend": "inline", "num_workers": workers,
                           "worker": {"num_cpus": 0.5}}}
        fedray.run(job, model_fn=fixed_linear()[0], client_data=clients, test_data=test)
        tables = [ipc.open_file(str(out / "participants" / f"round_{r:06d}.arrow")).read_all()
                  for r in (1, 2)]
        for t in tables:
            assert sorted(t["imbalance_ratio"].to_pylist()) == [0.2, 0.2, 0.5, 1.0, 1.0]
            assert sum(t["label_flipped"].to_pylist()) == 2
            assert np.isfinite(t["expalpha_log_weight"].to_numpy()).all()
        runs[workers] = (tables, (out / "model.safetensors").read_bytes())
    for a, b in zip(runs[1][0], runs[3][0], strict=True):  # duration_s is NaN off the clock
        assert a.column_names == b.column_names
        for name in a.column_names:
            np.testing.assert_array_equal(a[name].to_numpy(), b[name].to_numpy(), err_msg=name)
    assert runs[1][1] == runs[3][1]


def test_a_probing_selector_is_refused_with_a_fixed_composition(tmp_path):
    """power_of_choice probes candidates outside the round, which have no place in its
    composition: refused in one line before anything is written."""
    from conftest import blobs, fixed_linear

    import fedray

    out = tmp_path / "run"
    job = {"name": "probe", "rounds": 1, "algorithm": {"name": "fedavg",
                                                       "selector": "power_of_choice"},
           "sampling": {"clients_per_round": 3},
           "data": {"per_round": {"label_flip": {"corrupted": 1}}},
           "output": {"dir": str(out)}, "runtime": {"backend": "inline"}}
    with pytest.raises(ConfigError, match=r"^config key 'algorithm\.selector': "
                       r"power_of_choice probes candidates outside the round"):
        fedray.run(job, model_fn=fixed_linear()[0], client_data=blobs(8, seed=1),
                   test_data=blobs(1, seed=2)[0])
    assert not out.exists()


class _Crash(Callback):
    """Stops a run at the end of round ``at``, after its checkpoint of an earlier round."""

    def __init__(self, at: int):
        self.at = at

    def on_round_end(self, round, metrics, weights):
        if round == self.at:
            raise KeyboardInterrupt


def test_a_fixed_composition_resumes_bit_for_bit(tmp_path):
    """The deal depends on (seed, round) and the round's invitees only: a run stopped after
    round 3 and resumed from its round-2 checkpoint ends with the weights, and round 4's
    participants table, of the run that never stopped."""
    import pyarrow.ipc as ipc
    from conftest import blobs, fixed_linear

    import fedray

    clients, test = blobs(12, seed=4), blobs(1, seed=9)[0]

    def job(name: str) -> dict:
        return {"name": name, "seed": 5, "rounds": 4, "algorithm": {"name": "expalpha"},
                "client": {"lr": 0.1, "batch_size": 4, "local_steps": 3},
                "sampling": {"clients_per_round": 4}, "checkpoint": {"every": 2},
                "data": {"per_round": {
                    "imbalance": {"composition": [1.0, 1.0, 0.5, 0.2], "size": 12,
                                  "pool": "all"},
                    "label_flip": {"corrupted": 1}}},
                "output": {"dir": str(tmp_path / name), "participants": True},
                "runtime": {"backend": "inline", "num_workers": 2,
                            "worker": {"num_cpus": 0.5}}}

    whole = fedray.run(job("whole"), model_fn=fixed_linear()[0], client_data=clients,
                       test_data=test)
    with pytest.raises(KeyboardInterrupt):
        fedray.run(job("cut"), model_fn=fixed_linear()[0], client_data=clients,
                   test_data=test, callbacks=[_Crash(3)])
    resumed = fedray.run(resume=str(tmp_path / "cut"), model_fn=fixed_linear()[0],
                         client_data=clients, test_data=test)
    assert resumed.summary["resumed_from_round"] == 2
    for k in whole.weights:
        assert torch.equal(resumed.weights[k], whole.weights[k]), k
    last = [ipc.open_file(str(tmp_path / n / "participants" / "round_000004.arrow")).read_all()
            for n in ("whole", "cut")]
    for name in ("client_id", "imbalance_ratio", "label_flipped", "expalpha_log_weight"):
        np.testing.assert_array_equal(last[0][name].to_numpy(), last[1][name].to_numpy())
