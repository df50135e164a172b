"""A client part's phases on the worker (fedray.algorithms.base.Phase, ClientWork.local):
where each phase starts, what it sends, what it keeps in the client's state, and what is
refused. Each client's training is checked against the sequential kernel called by hand
with the inputs the phases say (same float operations: bit for bit); the worker is driven
directly (no Ray), one round at a time, and once end to end through fedray.run (inline)."""

from __future__ import annotations

import glob

import numpy as np
import pytest
import torch
from conftest import blobs, fixed_linear
from safetensors.torch import load_file
from tolerance import ULPS_PER_STEP, f32_atol
from torch import nn

import fedray
from fedray.algorithms.base import (
    ClientOptimizer,
    ClientWork,
    ClipNorm,
    LocalTerms,
    Phase,
)
from fedray.algorithms.registry import resolve
from fedray.config import ServerConfig
from fedray.core.flat_model import FlatModel
from fedray.core.seeding import TAG_PHASE, client_seed, derive_seed
from fedray.errors import PartError
from fedray.kernels.sequential import local_sgd
from fedray.runtime.messages import Broadcast, RoundTask
from fedray.runtime.worker import ClientWorker, LocalTraining, WorkerResources, WorkerSpec
from fedray.state.client_state import ClientStateStore
from fedray.state.run_dir import CLIENT_STATE_DIR

DIM, CLASSES, SEED, LR, BATCH, EPOCHS = 5, 3, 7, 0.1, 4, 2


class _Clients:
    population = 6
    num_classes = CLASSES
    input_shape = (DIM,)
    has_client_test = False
    cacheable = False
    SIZES = [10, 3, 0, 7, 14, 6]  # client 2 has no examples; no batch of 1 (batch norm)

    def train_sizes(self) -> np.ndarray:
        return np.asarray(self.SIZES)

    def client(self, cid: int, split: str = "train"):
        g = np.random.default_rng(50 + cid)
        n = self.SIZES[cid]
        return (g.standard_normal((n, DIM)).astype(np.float32),
                g.integers(0, CLASSES, n).astype(np.int64))


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, 4), nn.ReLU(), nn.Linear(4, CLASSES))


def _bn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, CLASSES))


class _Recording(ClientWork):
    """Records each client's sent update (finish sees it after the aggregator took it)."""

    def setup(self, env):
        self.sent: dict[int, torch.Tensor] = {}

    def finish(self, env, ctx, update, acc):
        self.sent[ctx.cid] = update.delta.clone()
        return None


class LocalHead(_Recording):  # FedPer: the last layer stays with the client
    name = "local_head"
    local = ("2.",)


class LocalNorm(_Recording):  # FedBN: the batch-norm layer, buffers included
    name = "local_norm"
    local = ("1.",)


class Personal(_Recording):  # Ditto: the global update, then the personal model
    name = "personal"
    state = ("personal",)

    def phases(self, env, ctx):
        mine = (ctx.state or {}).get("personal")
        return [Phase(), Phase(start="global" if mine is None else mine,
                               terms=LocalTerms(proximal=0.5), send=False, keep="personal")]


class Momentum(_Recording):
    name = "momentum"
    state = ("opt.m",)

    def phases(self, env, ctx):
        return [Phase(optimizer=ClientOptimizer("momentum", momentum=0.9, state="opt"))]


class Adam(_Recording):
    name = "adam"
    state = ("opt.m", "opt.v", "opt.t")

    def phases(self, env, ctx):
        return [Phase(optimizer=ClientOptimizer("adam", state="opt"), lr=0.01)]


class HeadThenBody(_Recording):  # FedRep: the local head's epoch, then the body's
    name = "head_then_body"
    local = ("2.",)

    def phases(self, env, ctx):
        return [Phase(trainable=("2.",), epochs=1, send=False),
                Phase(start="previous", trainable=("0.",))]


def _worker(tmp_path, client, make=_mlp, vectorize=False, name="w") -> ClientWorker:
    parts = resolve({"name": "fedavg"}, ServerConfig())
    training = LocalTraining(lr=LR, batch_size=BATCH, local_epochs=EPOCHS, local_steps=None,
                             eval_batch_size=8)
    spec = WorkerSpec(make_model=make, source=_Clients(), seed=SEED, training=training,
                      resources=WorkerResources(num_cpus=1, cache_mb=0, vectorize=vectorize),
                      client=client, aggregator=parts.aggregator,
                      state_url=str(tmp_path / name))
    w = ClientWorker(spec)
    if vectorize:
        w.group = 3
    return w


IDS = [0, 1, 2, 3, 4, 5]


# (store, client, version) -> the pack that holds it, from each round's result: what the
# driver's ClientVersions keeps, for these tests that drive a worker without a driver
_WHERE: dict[tuple[str, int, int], int] = {}


def _round(w: ClientWorker, weights: torch.Tensor, r: int, versions=None):
    versions = versions or [0] * len(IDS)
    url = w.spec.state_url
    packs = [_WHERE.get((url, c, v), -1) for c, v in zip(IDS, versions, strict=True)]
    res = w.train(Broadcast(weights.numpy()), RoundTask(r, IDS, versions, packs=packs))
    _WHERE.update({(url, c, r): p for c, p in zip(res.stored, res.packs, strict=True)})
    return res


class _Store:
    """The worker's store as the tests read it: the state a round stored, in its pack."""

    def __init__(self, path):
        self.url, self.store = str(path), ClientStateStore(str(path), 0)

    def get(self, cid: int, version: int):
        return self.store.get(cid, version, _WHERE.get((self.url, cid, version), -1))


def _by_hand(w: ClientWorker, weights, cid, r, **kw):
    """The sequential kernel as the phases say, for client cid in round r."""
    x, y = (torch.from_numpy(a) for a in _Clients().client(cid))
    m = FlatModel(w.spec.make_model())
    kw.setdefault("seed", client_seed(SEED, r, cid))
    out = local_sgd(m, weights, x, y, lr=LR, batch_size=BATCH, local_epochs=EPOCHS,
                    local_steps=None, delta_out=torch.empty_like(weights), **kw)
    return out, m


@pytest.mark.parametrize("client, make", [(LocalHead, _mlp), (LocalNorm, _bn)],
                         ids=["head", "batch-norm"])
def test_local_parameters_stay_with_each_client(tmp_path, client, make):
    """Round 1: every client trains from the global model, sends its update with the local
    positions zeroed (so the global model's local layer never moves) and stores what it
    trained there as "local"; round 2 starts from the global model with its own "local"
    (parameters and, for batch norm, running statistics)."""
    part = client()
    w = _worker(tmp_path, part, make)
    at = w.model.positions(part.local)
    # the head's weight and bias; batch norm's weight, bias, running mean and variance
    assert at.numel() == (4 * CLASSES + CLASSES if client is LocalHead else 4 * 4)
    g1 = w.model.flat.clone()
    res = _round(w, g1, 1)
    assert sorted(res.stored) == [0, 1, 3, 4, 5]  # client 2 has no examples: nothing stored
    store = _Store(tmp_path / "w")
    for cid in res.stored:
        ref, m = _by_hand(w, g1, cid, 1)
        expected = ref.delta.clone()
        expected[at] = 0
        assert torch.equal(part.sent[cid], expected)
        assert torch.equal(store.get(cid, 1)["local"], m.flat[at])
        assert set(store.get(cid, 1)) == {"local"}
    assert not res.partial.sum[at].any()  # the global model's local layer stays as it is
    g2 = (g1 + 0.01 * torch.arange(len(g1)) / len(g1)).contiguous()
    part.sent.clear()
    _round(w, g2, 2, [1 if cid in res.stored else 0 for cid in IDS])
    for cid in res.stored:
        start = g2.clone()
        start[at] = store.get(cid, 1)["local"]
        ref, m = _by_hand(w, g2, cid, 2, start=start)
        expected = ref.delta.clone()
        expected[at] = 0
        assert torch.equal(part.sent[cid], expected)
        assert torch.equal(store.get(cid, 2)["local"], m.flat[at])


def test_personal_model_is_a_second_phase(tmp_path):
    """Ditto's shape: phase 0 is plain local SGD (what it sends: bit for bit a one-phase
    client's update), phase 1 trains the personal model from its own seed with a proximal
    pull to the global model and keeps it; the next round's phase 1 starts from it."""
    part = Personal()
    w = _worker(tmp_path, part)
    g1 = w.model.flat.clone()
    res = _round(w, g1, 1)
    store = _Store(tmp_path / "w")
    for cid in res.stored:
        sent, _ = _by_hand(w, g1, cid, 1)
        assert torch.equal(part.sent[cid], sent.delta)
        seed1 = derive_seed(client_seed(SEED, 1, cid), TAG_PHASE, 1)
        _, m = _by_hand(w, g1, cid, 1, seed=seed1, terms=LocalTerms(proximal=0.5))
        assert torch.equal(store.get(cid, 1)["personal"], m.flat)
    mine = store.get(0, 1)["personal"]
    _round(w, g1, 2, [1 if cid in res.stored else 0 for cid in IDS])
    seed1 = derive_seed(client_seed(SEED, 2, 0), TAG_PHASE, 1)
    _, m = _by_hand(w, g1, 0, 2, seed=seed1, terms=LocalTerms(proximal=0.5), start=mine)
    assert torch.equal(store.get(0, 2)["personal"], m.flat)
    assert not torch.equal(store.get(0, 2)["personal"], mine)


def test_momentum_persists_across_a_clients_rounds(tmp_path):
    part = Momentum()
    w = _worker(tmp_path, part)
    g = w.model.flat.clone()
    opt = ClientOptimizer("momentum", momentum=0.9, state="opt")
    res = _round(w, g, 1)
    store = _Store(tmp_path / "w")
    first, _ = _by_hand(w, g, 4, 1, optimizer=opt)
    assert torch.equal(store.get(4, 1)["opt.m"], first.opt_state["m"])
    _round(w, g, 2, [1 if cid in res.stored else 0 for cid in IDS])
    second, _ = _by_hand(w, g, 4, 2, optimizer=opt, opt_state={"m": first.opt_state["m"]})
    fresh, _ = _by_hand(w, g, 4, 2, optimizer=opt)
    assert torch.equal(part.sent[4], second.delta)
    assert not torch.equal(second.delta, fresh.delta)  # the stored momentum mattered
    assert torch.equal(store.get(4, 2)["opt.m"], second.opt_state["m"])


def test_head_then_body_trains_each_part_in_turn(tmp_path):
    """FedRep's shape: phase 0 trains only the head (one epoch, from the client's round
    seed), phase 1 only the body from where phase 0 left off (its own seed); the update
    sent is phase 1's with the head zeroed, and the head trained in phase 0 is kept."""
    part = HeadThenBody()
    w = _worker(tmp_path, part)
    at = w.model.positions(part.local)
    g = w.model.flat.clone()
    _round(w, g, 1)
    store = _Store(tmp_path / "w")
    x, y = (torch.from_numpy(a) for a in _Clients().client(4))
    m = FlatModel(w.spec.make_model())
    seed = client_seed(SEED, 1, 4)
    local_sgd(m, g, x, y, lr=LR, batch_size=BATCH, local_epochs=1, local_steps=None,
              seed=seed, delta_out=torch.empty_like(g), trainable=[False, False, True, True])
    head = m.flat.clone()
    body = local_sgd(m, g, x, y, lr=LR, batch_size=BATCH, local_epochs=EPOCHS,
                     local_steps=None, seed=derive_seed(seed, TAG_PHASE, 1),
                     delta_out=torch.empty_like(g), start=head,
                     trainable=[True, True, False, False])
    expected = body.delta.clone()
    expected[at] = 0
    assert torch.equal(part.sent[4], expected)
    assert torch.equal(store.get(4, 1)["local"], head[at])
    assert torch.equal(m.flat[at], head[at])  # phase 1 left the head as phase 0 trained it


class _Undeclared(ClientWork):
    name = "undeclared"
    state = ("c",)

    def finish(self, env, ctx, update, acc):
        return {"c_typo": update.delta.clone()}


class _KeepUndeclared(ClientWork):
    name = "keep_undeclared"

    def phases(self, env, ctx):
        return [Phase(keep="personal")]


class _OptUndeclared(ClientWork):
    name = "opt_undeclared"
    state = ("opt.m",)

    def phases(self, env, ctx):
        return [Phase(optimizer=ClientOptimizer("adam", state="opt"))]


class _TwoSends(ClientWork):
    name = "two_sends"

    def phases(self, env, ctx):
        return [Phase(), Phase(start="previous")]


class _BadStart(ClientWork):
    name = "bad_start"

    def phases(self, env, ctx):
        return [Phase(start=torch.zeros(3))]


@pytest.mark.parametrize("part, message", [
    (_Undeclared, "finish() writes the state key 'c_typo', which its state ('c',) does not "
                  "declare"),
    (_KeepUndeclared, "phase 0's keep writes the state key 'personal', which its state () "
                      "does not declare"),
    (_OptUndeclared, "phase 0's optimizer writes the state key 'opt.v', which its state "
                     "('opt.m',) does not declare"),
    (_TwoSends, "exactly one phase must send (Phase.send), 2 of its 2 do"),
    (_BadStart, "phase 0's start has 3 values, not the model's 39"),
])
def test_refused_in_one_line_naming_the_part(tmp_path, part, message):
    w = _worker(tmp_path, part())
    with pytest.raises(PartError) as info:
        _round(w, w.model.flat.clone(), 1)
    text = str(info.value)
    who = f"algorithm.client {part.__module__}:{part.__qualname__}: "  # as the job names it
    assert "\n" not in text and text.startswith(who)
    assert message in text


def test_a_local_prefix_that_names_nothing_is_refused_at_setup(tmp_path):
    class Typo(ClientWork):
        name = "typo"
        local = ("head.",)

    with pytest.raises(PartError, match=r"local \('head.',\) names no parameter or buffer "
                                          r"of the model \(its names: 0.weight, 0.bias"):
        _worker(tmp_path, Typo())


class _Noisy(ClientWork):
    """A custom train() that draws from torch's global generator without seeding it."""

    name = "noisy"

    def train(self, env, ctx):
        from fedray.algorithms.base import LocalUpdate

        delta = torch.randn(env.model.size)
        return LocalUpdate(delta, len(ctx.y), 0.0, len(ctx.y), 1)

    def finish(self, env, ctx, update, acc):
        self.sent[ctx.cid] = update.delta.clone()

    def setup(self, env):
        self.sent = {}


def test_a_custom_train_draws_from_the_clients_seed(tmp_path):
    """The worker seeds torch from the client's round seed before a part's own train(), so
    its draws do not depend on which clients the worker trained before it."""
    a, b = _Noisy(), _Noisy()
    wa, wb = _worker(tmp_path, a, name="a"), _worker(tmp_path, b, name="b")
    g = wa.model.flat.clone()
    wa.train(Broadcast(g.numpy()), RoundTask(1, [0, 1, 3]))
    wb.train(Broadcast(g.numpy()), RoundTask(1, [3]))
    assert torch.equal(a.sent[3], b.sent[3])
    torch.manual_seed(client_seed(SEED, 1, 3))
    assert torch.equal(a.sent[3], torch.randn(g.numel()))


@pytest.mark.parametrize("part", [LocalHead, Personal, Momentum, Adam, HeadThenBody],
                         ids=["local-head", "personal", "momentum", "adam", "head-then-body"])
def test_phases_vectorized_match_sequential(tmp_path, part, monkeypatch):
    """Each phase as one batched call for the group (vmap_local_sgd) gives each client the
    sequential result up to float32 rounding (the batched kernels sum in another order:
    ULPS_PER_STEP a step, tolerance.py), and stores the same state keys; two rounds, so
    the second starts from stored state."""
    calls = _count_batched(monkeypatch)
    seq, vec = part(), part()
    ws, wv = (_worker(tmp_path, seq, name="s"), _worker(tmp_path, vec, vectorize=True,
                                                         name="v"))
    g = ws.model.flat.clone()
    steps = EPOCHS * max(-(-n // BATCH) for n in _Clients.SIZES)
    versions = None
    for r in (1, 2):
        rs, rv = _round(ws, g, r, versions), _round(wv, g, r, versions)
        assert sorted(rs.stored) == sorted(rv.stored)
        for cid in rs.stored:
            atol = f32_atol(g, g + seq.sent[cid], ulps=ULPS_PER_STEP * (2 * steps + 1))
            torch.testing.assert_close(vec.sent[cid], seq.sent[cid], rtol=0, atol=atol)
            a = _Store(tmp_path / "s").get(cid, r)
            b = _Store(tmp_path / "v").get(cid, r)
            assert a.keys() == b.keys()
            for k in a:
                torch.testing.assert_close(b[k], a[k], rtol=0, atol=f32_atol(
                    a[k], g, ulps=ULPS_PER_STEP * (2 * steps + 1)))
        versions = [1 if c in rs.stored else 0 for c in IDS]
    # two rounds of two groups (3 + 3 clients), one batched call per phase: none trained
    # one after another
    assert calls == [3] * (2 * 2 * (2 if part in (Personal, HeadThenBody) else 1))


def _count_batched(monkeypatch) -> list[int]:
    """The group sizes of the worker's batched calls, as they happen."""
    import fedray.runtime.worker as worker

    calls: list[int] = []
    real = worker.vmap_local_sgd

    def counted(model, weights, data, **kw):
        calls.append(len(data))
        return real(model, weights, data, **kw)

    monkeypatch.setattr(worker, "vmap_local_sgd", counted)
    return calls


def test_clipped_phase_runs_vectorized_per_example(tmp_path, monkeypatch):
    """A per-example clip (DP-SGD's) in the batched kernel gives the sequential kernel's
    update up to float32 rounding."""
    calls = _count_batched(monkeypatch)
    class Clipped(_Recording):
        name = "clipped"

        def phases(self, env, ctx):
            return [Phase(transform=ClipNorm(0.1, per_example=True))]

    seq, vec = Clipped(), Clipped()
    ws, wv = (_worker(tmp_path, seq, name="s"), _worker(tmp_path, vec, vectorize=True,
                                                         name="v"))
    g = ws.model.flat.clone()
    _round(ws, g, 1), _round(wv, g, 1)
    steps = EPOCHS * max(-(-n // BATCH) for n in _Clients.SIZES)
    for cid, d in seq.sent.items():
        atol = f32_atol(g, g + d, ulps=ULPS_PER_STEP * (steps + 1))
        torch.testing.assert_close(vec.sent[cid], d, rtol=0, atol=atol)
    assert calls == [3, 3]


LOCAL_BIAS = ("class LocalBias(ClientWork):\n"
              "    name = 'local_bias'\n"
              "    local = ('bias',)\n")


def test_local_parameters_end_to_end(tmp_path):
    """Through fedray.run (inline backend): the global bias never moves from its init, and
    every client that trained has its own "local" bias in the run's client state."""
    part = tmp_path / "local_bias.py"
    part.write_text("from fedray.algorithms.base import ClientWork\n\n\n" + LOCAL_BIAS)
    job = {"name": "lb", "seed": 2, "rounds": 3,
           "algorithm": {"name": "fedavg", "client": f"{part}:LocalBias"},
           "client": {"lr": 0.1, "batch_size": 4, "local_steps": 3},
           "sampling": {"clients_per_round": 6},
           "runtime": {"backend": "inline", "num_workers": 2, "worker": {"num_cpus": 0.5}},
           "output": {"dir": str(tmp_path / "lb")}}
    model_fn, w0, b0 = fixed_linear()
    out = fedray.run(job, model_fn=model_fn, client_data=blobs(12, seed=4),
                     test_data=blobs(1, seed=9)[0])
    assert np.array_equal(out.weights["bias"].numpy(), b0.astype(np.float32))
    assert not np.array_equal(out.weights["weight"].numpy(), w0.astype(np.float32))
    files = glob.glob(str(tmp_path / "lb" / CLIENT_STATE_DIR / "**" / "*.safetensors"),
                      recursive=True)
    # packs: tensor "<client>/<key>", each an ordinary safetensors file
    states = [(name, t) for f in files for name, t in load_file(f).items()]
    assert states and all(name.split("/")[1] == "local" and t.shape == (3,)
                          for name, t in states)



@pytest.mark.parametrize("kwargs", [{"kind": "rmsprop"}, {"momentum": 1.0},
                                    {"kind": "adam", "betas": (0.9, 1.0)},
                                    {"kind": "adam", "eps": 0.0}])
def test_a_client_optimizer_is_checked_where_it_is_made(kwargs):
    """One check, in ClientOptimizer itself, serves the sequential and vectorized kernels."""
    with pytest.raises(ValueError, match="ClientOptimizer"):
        ClientOptimizer(**kwargs)
