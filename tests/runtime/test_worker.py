"""A worker's partial sum is the same whether it trains its clients one after another or in
vectorized groups (runtime.worker.vectorize), for every client update and aggregator."""

import functools
import math

import numpy as np
import pytest
import torch
from tolerance import ULPS_PER_STEP, f32_atol

from fedray.algorithms.registry import resolve
from fedray.config import ServerConfig
from fedray.core.models import build_model
from fedray.runtime.messages import Broadcast, RoundTask
from fedray.runtime.worker import ClientWorker, LocalTraining, WorkerResources, WorkerSpec

SHAPE, CLASSES = (1, 6, 6), 5


class _Clients:
    """Small clients of uneven sizes (one smaller than a batch, one of a single example)."""

    population = 9
    num_classes = CLASSES
    input_shape = SHAPE
    has_client_test = False
    cacheable = False
    SIZES = [13, 3, 1, 9, 25, 17, 6, 11, 2]

    def train_sizes(self) -> np.ndarray:
        return np.asarray(self.SIZES)

    def client(self, cid: int, split: str = "train"):
        g = np.random.default_rng(100 + cid)
        n = self.SIZES[cid]
        return (g.standard_normal((n, *SHAPE)).astype(np.float32),
                g.integers(0, CLASSES, n).astype(np.int64))


CASES = {  # client part, aggregator, their sections and training keys
    "fedavg": ("local_sgd", "proportional", {}),
    "fedavg-uniform-local-steps": ("local_sgd", "uniform", {"local_steps": 5}),
    "fedprox": ("fedprox", "proportional", {"fedprox": {"mu": 0.1}}),
    "fedsgd": ("fedsgd", "proportional", {}),
    "scaffold-option-1": ("scaffold", "scaffold", {"scaffold": {"option": 1}}),
    "scaffold-option-2": ("scaffold", "scaffold", {"scaffold": {"option": 2}}),
    "elastic": ("local_sgd", "elastic", {}),
    "expalpha": ("local_sgd", "expalpha", {"expalpha": {"alpha": 0.5}}),
    # the update norms nearest the bound are 2% from it: rounding never decides a drop
    "guard": ("local_sgd", "proportional", {"max_update_norm": 1.0}),
    # FedDyn: a proximal pull and a linear term at once, and per-client state
    "feddyn": ("feddyn", "feddyn", {"feddyn": {"alpha": 0.05}}),
    "fednova": ("local_sgd", "fednova", {}),
}
TRAINING_KEYS = ("local_steps", "max_update_norm")


def _worker(tmp_path, name, model, client, aggregator, extra, vectorize):
    torch.manual_seed(0)
    sections = {k: v for k, v in extra.items() if k not in TRAINING_KEYS}
    parts = resolve({"name": "fedavg", "client": client, "aggregator": aggregator, **sections},
                    ServerConfig())
    training = LocalTraining(lr=0.1, batch_size=4, local_epochs=2, eval_batch_size=8,
                             local_steps=extra.get("local_steps"),
                             max_update_norm=extra.get("max_update_norm"))
    spec = WorkerSpec(make_model=functools.partial(build_model, model, SHAPE, CLASSES),
                      source=_Clients(), seed=7, training=training,
                      resources=WorkerResources(num_cpus=1, cache_mb=0, vectorize=vectorize),
                      client=parts.client, aggregator=parts.aggregator,
                      state_url=str(tmp_path / f"{name}-{vectorize}"))
    w = ClientWorker(spec)
    if vectorize:
        w.group = 4  # groups of about 4: the 9 clients train as 5 + 4
        w._prefetch = True  # and clients read ahead on the prefetch thread
    return w


BATCH, EPOCHS, LR, ALPHA = 4, 2, 0.1, 0.5  # _worker's spec
STEPS = [EPOCHS * math.ceil(n / BATCH) for n in _Clients.SIZES]  # local steps per client


def _flat(result) -> dict:
    """A worker's RoundResult as one dict: the partial sum's fields, its one extra sum (or
    None) and the round's statistics."""
    part = result.partial
    extras = list(part.extras.values())
    return {"sum": part.sum, "weight": part.weight, "log_scale": part.log_scale,
            "extra": extras[0] if extras else None,
            **{k: getattr(result, k) for k in ("clients", "examples", "examples_seen",
                                               "dropped", "updates", "stored", "loss_sum")}}


def _sums_atol(weights, part: dict) -> float:
    """A partial sum computed sequentially against vectorized: sum_k w_k delta_k, each delta
    off by ULPS_PER_STEP ulps a local step of the weights' size (the delta is y - x), so
    the sum by ``weight`` = sum_k w_k times that."""
    per_client = f32_atol(weights, weights + part["sum"] / part["weight"],
                          ulps=ULPS_PER_STEP * (max(STEPS) + 1))
    return part["weight"] * per_client


def _risk_scale(worker, weights) -> float:
    """The largest client risk F_k at the round's global model (Exp-alpha's scores)."""
    src = _Clients()
    return max(worker.env.risk(torch.from_numpy(weights),
                               *map(torch.from_numpy, src.client(c)))
               for c in range(src.population))


def _rounds(worker, weights):
    """Two rounds; the second reads the state the first stored."""
    c = np.full(worker.model.num_params, 1e-3, np.float32)
    ids = [0, 1, 2, 3, 4, 5, 6, 7, 8]
    first = _flat(worker.train(Broadcast(weights, {"c": c}), RoundTask(1, ids, [0] * len(ids))))
    versions = [1 if cid in first["stored"] else 0 for cid in ids]
    second = _flat(worker.train(Broadcast(0.9 * weights, {"c": -c}),
                                RoundTask(2, ids[::-1], versions[::-1])))
    return first, second


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("model", ["mlp", "logreg", "logreg-sums"])
def test_vectorized_worker_equals_sequential(tmp_path, monkeypatch, case, model):
    """``logreg-sums``: the groups keep the first layer as sums over the examples
    (fedray.kernels.vectorized.FirstLayerSums) whatever it costs, so that every aggregator meets
    that way of stepping too."""
    steps: list[str] = []  # the vectorized groups' GroupResult.path, with logreg-sums
    forced = model == "logreg-sums"
    if forced:
        import fedray.kernels.vectorized
        import fedray.runtime.worker

        def sums(*args, **kwargs):
            group = fedray.kernels.vectorized.vmap_local_sgd(*args, defer_first=True, **kwargs)
            steps.append(group.path)
            return group

        monkeypatch.setattr(fedray.runtime.worker, "vmap_local_sgd", sums)
        model = "logreg"
    client, aggregator, extra = CASES[case]
    seq = _worker(tmp_path, case, model, client, aggregator, extra, False)
    vec = _worker(tmp_path, case, model, client, aggregator, extra, True)
    assert seq.group == 0 and vec.group == 4
    weights = seq.model.flat.numpy().copy()
    rounds = zip(_rounds(seq, weights), _rounds(vec, weights), strict=True)
    for (a, b), w in zip(rounds, (weights, 0.9 * weights), strict=True):  # each round's x
        assert np.abs(a["sum"]).max() > 1e-3  # the clients did move
        np.testing.assert_allclose(b["sum"], a["sum"], atol=_sums_atol(w, a), rtol=0)
        if aggregator == "expalpha":
            # log rho_k = (F_k(y_k) - F_k(x)) / alpha: F_k(y_k), a float32 mean loss at a y_k
            # the two ways round differently, may round differently too, by a few ulps of
            # the risks' size, 1 / alpha times. Each risk is at most the largest at x (the
            # training lowered every one: log_scale < 0)
            assert a["log_scale"] < 0
            atol = f32_atol(_risk_scale(seq, w), ulps=2 * ULPS_PER_STEP) / ALPHA
            assert b["log_scale"] == pytest.approx(a["log_scale"], rel=0, abs=atol)
            assert b["weight"] == pytest.approx(a["weight"], rel=2 * atol)  # sum_k rho_k
        else:  # sums of example counts or ones, exactly
            assert (b["weight"], b["log_scale"]) == (a["weight"], a["log_scale"])
        if a["extra"] is None:
            assert b["extra"] is None
        elif aggregator == "fednova":
            # sum_k |D_k| ||a_k||_1: step counts, the same either way
            np.testing.assert_array_equal(b["extra"], a["extra"])
        elif aggregator == "scaffold" and extra["scaffold"]["option"] == 2:
            # c_i+ = c_i - c + (x - y_i) / (K_i lr): the deltas' rounding, / (K_i lr) each
            assert np.abs(a["extra"]).max() > 0
            per_delta = _sums_atol(w, a) / a["weight"]
            atol = per_delta * sum(1 / (k * LR) for k in STEPS)
            np.testing.assert_allclose(b["extra"], a["extra"], atol=atol, rtol=0)
        else:  # Elastic's sensitivities, SCAFFOLD I's gradients: measured at x, the same way
            assert np.abs(a["extra"]).max() > 0
            np.testing.assert_array_equal(b["extra"], a["extra"])
        for key in ("clients", "examples", "examples_seen", "dropped", "updates", "stored"):
            assert b[key] == a[key], key
        # float32 batch losses summed over the steps: relative, 84 ulps
        assert b["loss_sum"] == pytest.approx(a["loss_sum"], rel=1e-5)
    if forced:
        assert steps and set(steps) == {"sums"}
    if case == "guard":
        assert 0 < a["dropped"] < a["clients"]
    if aggregator in ("scaffold", "feddyn"):
        assert a["stored"]  # round 2 trained from the c_i (g_i) round 1 stored


def test_a_cnn_trains_vectorized_when_asked(tmp_path):
    client, aggregator, extra = CASES["scaffold-option-2"]
    seq = _worker(tmp_path, "cnn", "leaf_cnn", client, aggregator, extra, False)
    vec = _worker(tmp_path, "cnn", "leaf_cnn", client, aggregator, extra, True)
    weights = seq.model.flat.numpy().copy()
    a, b = _rounds(seq, weights)[1], _rounds(vec, weights)[1]
    atol = _sums_atol(0.9 * weights, a)  # round 2's x; SCAFFOLD II's c_i+: / (K_i lr) each
    np.testing.assert_allclose(b["sum"], a["sum"], atol=atol, rtol=0)
    np.testing.assert_allclose(b["extra"], a["extra"], rtol=0,
                               atol=atol / a["weight"] * sum(1 / (k * LR) for k in STEPS))


def test_clients_are_read_ahead_on_one_thread_for_the_workers_life(tmp_path, monkeypatch):
    """A prefetch thread started anew each round let a Ray worker's memory grow round after
    round (a malloc arena per new thread; docs/performance.md, "Worker memory"): every
    round's clients are read on the same thread, never the training one."""
    import threading

    client, aggregator, extra = CASES["fedavg"]
    w = _worker(tmp_path, "reader", "logreg", client, aggregator, extra, False)
    w._prefetch = True
    readers: list[tuple[int, int]] = []  # (thread, client) of every read
    read = w._round_data  # what client_data and a client's preparation read through

    def spy(round_idx, cid):
        readers.append((threading.get_native_id(), cid))
        return read(round_idx, cid)

    monkeypatch.setattr(w, "_round_data", spy)
    _rounds(w, w.model.flat.numpy().copy())
    assert len(readers) == 18 and len({t for t, _ in readers}) == 1
    assert readers[0][0] != threading.get_native_id()
