"""A worker's partial sum is the same whether it trains its clients one after another or in
vectorized groups (runtime.worker.vectorize), for every client update and aggregator."""

import functools

import numpy as np
import pytest
import torch

from fedray.models import build_model
from fedray.worker import ClientWorker, WorkerSpec

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


CASES = {  # client update, aggregator, extra spec
    "fedavg": ("local_sgd", "proportional", {}),
    "fedavg-uniform-local-steps": ("local_sgd", "uniform", {"local_steps": 5}),
    "fedprox": ("fedprox", "proportional", {"prox_mu": 0.1}),
    "fedsgd": ("fedsgd", "proportional", {}),
    "scaffold-option-1": ("scaffold", "scaffold", {"scaffold_option": 1}),
    "scaffold-option-2": ("scaffold", "scaffold", {"scaffold_option": 2}),
    "elastic": ("local_sgd", "elastic", {}),
    "expalpha": ("local_sgd", "expalpha", {"alpha": 0.5}),
    "guard": ("local_sgd", "proportional", {"max_update_norm": 1.0}),
}


def _worker(tmp_path, name, model, client, aggregator, extra, vectorize):
    torch.manual_seed(0)
    kw = {"local_steps": None, **extra}
    spec = WorkerSpec(make_model=functools.partial(build_model, model, SHAPE, CLASSES),
                      source=_Clients(), seed=7, lr=0.1, batch_size=4, local_epochs=2,
                      eval_batch_size=8, num_cpus=1, cache_mb=0, client=client,
                      aggregator=aggregator, state_url=str(tmp_path / f"{name}-{vectorize}"),
                      vectorize=vectorize, **kw)
    w = ClientWorker(spec)
    if vectorize:
        w.group = 4  # groups of about 4: the 9 clients train as 5 + 4
        w._prefetch = True  # and clients read ahead on the prefetch thread
    return w


def _rounds(worker, weights):
    """Two rounds; the second reads the state the first stored."""
    c = np.full(worker.model.num_params, 1e-3, np.float32)
    ids = [0, 1, 2, 3, 4, 5, 6, 7, 8]
    first = worker.train({"weights": weights, "c": c}, 1, ids, [0] * len(ids))
    versions = [1 if cid in first["stored"] else 0 for cid in ids]
    second = worker.train({"weights": 0.9 * weights, "c": -c}, 2, ids[::-1], versions[::-1])
    return first, second


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("model", ["mlp", "logreg", "logreg-sums"])
def test_vectorized_worker_equals_sequential(tmp_path, monkeypatch, case, model):
    """``logreg-sums``: the groups keep the first layer as sums over the examples
    (fedray.vectorized.FirstLayerSums) whatever it costs, so that every aggregator meets
    that way of stepping too."""
    steps: list[str] = []  # the vectorized groups' GroupResult.path, with logreg-sums
    forced = model == "logreg-sums"
    if forced:
        import fedray.vectorized
        import fedray.worker

        def sums(*args, **kwargs):
            group = fedray.vectorized.vmap_local_sgd(*args, defer_first=True, **kwargs)
            steps.append(group.path)
            return group

        monkeypatch.setattr(fedray.worker, "vmap_local_sgd", sums)
        model = "logreg"
    client, aggregator, extra = CASES[case]
    seq = _worker(tmp_path, case, model, client, aggregator, extra, False)
    vec = _worker(tmp_path, case, model, client, aggregator, extra, True)
    assert seq.group == 0 and vec.group == 4
    weights = seq.model.flat.numpy().copy()
    for a, b in zip(_rounds(seq, weights), _rounds(vec, weights), strict=True):
        assert np.abs(a["sum"]).max() > 1e-3  # the clients did move
        np.testing.assert_allclose(b["sum"], a["sum"], atol=1e-5, rtol=0)
        assert b["weight"] == pytest.approx(a["weight"], rel=1e-6)
        assert b["log_scale"] == pytest.approx(a["log_scale"], rel=1e-5, abs=1e-6)
        if a["extra"] is None:
            assert b["extra"] is None
        else:
            assert np.abs(a["extra"]).max() > 0
            np.testing.assert_allclose(b["extra"], a["extra"], atol=1e-5, rtol=0)
        for key in ("clients", "examples", "examples_seen", "dropped", "updates", "stored"):
            assert b[key] == a[key], key
        assert b["loss_sum"] == pytest.approx(a["loss_sum"], rel=1e-5)
    if forced:
        assert steps and set(steps) == {"sums"}
    if case == "guard":
        assert 0 < a["dropped"] < a["clients"]
    if aggregator == "scaffold":
        assert a["stored"]  # round 2 trained from the c_i round 1 stored


def test_a_cnn_trains_vectorized_when_asked(tmp_path):
    client, aggregator, extra = CASES["scaffold-option-2"]
    seq = _worker(tmp_path, "cnn", "leaf_cnn", client, aggregator, extra, False)
    vec = _worker(tmp_path, "cnn", "leaf_cnn", client, aggregator, extra, True)
    weights = seq.model.flat.numpy().copy()
    a, b = _rounds(seq, weights)[1], _rounds(vec, weights)[1]
    np.testing.assert_allclose(b["sum"], a["sum"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(b["extra"], a["extra"], atol=1e-5, rtol=0)
