"""Federated evaluation with each client's own state (issue 40, deliverable 3): a client part
with ``local`` parameters or an ``eval_weights`` is evaluated, and fine-tuned by
eval.personalize, from the client's model -- built by the workers' ``evaluate_clients``
from the global weights and the client's stored state, of the version the driver's index
holds as of the evaluated round -- for every evaluated client, not only the round's.

Every expected number is recomputed outside the runtime (the same ``evaluate`` on the same
weights and rows: equal bit for bit). Runs use runtime.backend=inline (no Ray)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import fixed_linear

import fedray
from fedray.algorithms.base import (
    Aggregator,
    ClientContext,
    ClientWork,
    LocalUpdate,
    PartialSum,
    WorkerEnv,
)
from fedray.core.evaluation import evaluate
from fedray.core.flat_model import FlatModel
from fedray.core.seeding import personalize_seed
from fedray.data.client_source import MemorySource
from fedray.errors import FedrayError
from fedray.kernels.sequential import local_sgd
from fedray.runtime.worker import (
    ClientWorker,
    LocalTraining,
    Personalize,
    WorkerResources,
    WorkerSpec,
)
from fedray.state.checkpoint import read_checkpoint
from fedray.state.client_state import ClientStateStore
from fedray.state.run_dir import load_weights
from fedray.tracking.client_eval import read_table, table_name


def _clients(num_clients: int = 10, dim: int = 5, classes: int = 3, seed: int = 11):
    """Clients with their own train and test splits, every one evaluated."""
    g = np.random.default_rng(seed)
    centers = g.normal(scale=2.0, size=(classes, dim))

    def draw(n):
        y = g.integers(0, classes, size=n)
        return (centers[y] + g.normal(size=(n, dim))).astype(np.float32), y

    return {c: {"train": draw(int(g.integers(6, 15))), "test": draw(int(g.integers(4, 9)))}
            for c in range(num_clients)}


CLIENTS = _clients()
EVAL_BATCH = 500  # the job default: one batch per client


class Personal(ClientWork):
    """A personal model per client: its trained weights, kept as its state and evaluated."""

    name = "personal_test"
    state = ("personal",)

    def finish(self, env: WorkerEnv, ctx: ClientContext, update: LocalUpdate,
               acc: PartialSum) -> dict[str, torch.Tensor]:
        return {"personal": env.global_weights + update.delta}

    def eval_weights(self, env: WorkerEnv, cid: int, state: dict | None) -> torch.Tensor | None:
        return None if state is None else state["personal"]


class LocalBias(ClientWork):
    """The bias stays with each client (the training side stores it under "local")."""

    name = "local_bias_test"
    local = ("bias",)
    state = ("local",)


class Stateless(ClientWork):
    """eval_weights without any state: called with None for every client."""

    name = "stateless_test"

    def eval_weights(self, env, cid, state):
        assert state is None
        return torch.zeros(env.model.size) if cid % 2 == 0 else None


class WrongLength(ClientWork):
    name = "wrong_length_test"
    state = ("x",)

    def eval_weights(self, env, cid, state):
        return torch.zeros(4)


def _run(tmp_path, name: str, client: str, rounds: int = 3, **eval_keys) -> fedray.RunResult:
    job = {"name": name, "seed": 4, "rounds": rounds,
           "algorithm": ({"name": "fedavg", "client": client} if ":" in client
                         else {"name": client}),
           "client": {"lr": 0.1, "batch_size": 4, "local_steps": 3},
           "sampling": {"clients_per_round": 3},
           "eval": {"every": 1, "federated_clients": 10, **eval_keys},
           "runtime": {"backend": "inline", "num_workers": 2,
                       "worker": {"num_cpus": 1, "vectorize": "off"}},
           "output": {"dir": str(tmp_path / name), "tensorboard": False}}
    return fedray.run(job, model_fn=fixed_linear()[0], client_data=CLIENTS)


def _table(result: fedray.RunResult, r: int) -> dict[int, dict]:
    with open(f"{result.run_dir}/{table_name(r)}", "rb") as f:
        return {row["client_id"]: row for row in read_table(f.read()).to_pylist()}


def _global(result: fedray.RunResult) -> FlatModel:
    module = fixed_linear()[0]()
    module.load_state_dict(load_weights(result.run_dir))
    return FlatModel(module)


def _split(cid: int, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(torch.as_tensor(a) for a in CLIENTS[cid][split])


def _evaluated(model: FlatModel, weights: torch.Tensor, cid: int) -> tuple[float, int]:
    model.load_(weights)
    s = evaluate(model.module, *_split(cid, "test"), EVAL_BATCH, torch.device("cpu"))
    return s.loss_sum, s.correct


def _current_states(result: fedray.RunResult) -> dict[int, tuple[int, dict]]:
    """Each client with state -> (its current version, its state), as the run's final
    checkpoint locates it."""
    store = ClientStateStore(f"{result.run_dir}/client_state")
    return store.current(read_checkpoint(result.run_dir).client_versions)


def _check_last_table(result: fedray.RunResult, rounds: int, own_weights) -> None:
    """The last round's row of every client equals a direct evaluation of the client's own
    weights (``own_weights(global, state)``) where it has state, of the global model where
    it never trained; the cases the test is about all occur."""
    model = _global(result)
    glob = model.flat.clone()
    states = _current_states(result)
    rows = _table(result, rounds)
    assert sorted(rows) == list(range(10))
    never = [c for c in rows if c not in states]
    absent = [c for c, (v, _) in states.items() if v < rounds]  # state, not in the last round
    assert never and absent and any(v == rounds for v, _ in states.values())
    for cid, row in rows.items():
        w = own_weights(glob, states[cid][1]) if cid in states else glob
        assert (row["loss_sum"], row["correct"]) == _evaluated(model, w, cid), cid
    # and those with state were not evaluated with the global model (the test can fail)
    moved = [c for c in states if (rows[c]["loss_sum"], rows[c]["correct"])
             != _evaluated(model, glob, c)]
    assert sorted(moved) == sorted(states)


def test_personal_models_are_evaluated_for_every_client(tmp_path):
    res = _run(tmp_path, "personal", f"{__file__}:Personal")
    _check_last_table(res, 3, lambda glob, state: state["personal"])
    # the statistics are the table's, as without state
    m = res.metrics[-1]
    rows = _table(res, 3).values()
    assert m["fed_test_accuracy"] == sum(r["correct"] for r in rows) / sum(
        r["count"] for r in rows)


def test_local_parameters_are_put_into_the_global_model(tmp_path):
    res = _run(tmp_path, "local", f"{__file__}:LocalBias")
    model = _global(res)
    at = model.positions(("bias",))

    def own(glob, state):
        w = glob.clone()
        w[at] = state["local"]
        return w

    _check_last_table(res, 3, own)


def test_personalize_fine_tunes_the_clients_own_model(tmp_path):
    res = _run(tmp_path, "pers", f"{__file__}:Personal", rounds=2,
               personalize={"steps": 4, "lr": 0.2})
    model = _global(res)
    glob = model.flat.clone()
    states = _current_states(res)
    rows = _table(res, 2)
    for cid in (min(states), min(c for c in rows if c not in states)):
        start = states[cid][1]["personal"] if cid in states else glob
        x, y = _split(cid, "train")
        local_sgd(model, start, x, y, lr=0.2, batch_size=4, local_epochs=1, local_steps=4,
                  seed=personalize_seed(4, 2, cid), delta_out=torch.empty_like(glob))
        want = evaluate(model.module, *_split(cid, "test"), EVAL_BATCH, torch.device("cpu"))
        assert (rows[cid]["personalized_loss_sum"], rows[cid]["personalized_correct"]) == \
            (want.loss_sum, want.correct), cid


def test_eval_weights_of_a_part_without_state(tmp_path):
    res = _run(tmp_path, "stateless", f"{__file__}:Stateless", rounds=1)
    model = _global(res)
    glob = model.flat.clone()
    for cid, row in _table(res, 1).items():
        w = torch.zeros_like(glob) if cid % 2 == 0 else glob
        assert (row["loss_sum"], row["correct"]) == _evaluated(model, w, cid), cid
    assert _evaluated(model, glob, 0) != _evaluated(model, torch.zeros_like(glob), 0)


def test_a_part_without_the_hooks_reads_no_state_to_evaluate(tmp_path, monkeypatch):
    """SCAFFOLD keeps state but evaluates with the global model: the path of before, no
    state read (the driver sends no versions)."""
    def refuse(self, cid, version):
        raise AssertionError("state read for evaluation")

    monkeypatch.setattr(ClientWorker, "_client_weights", refuse)
    res = _run(tmp_path, "scaffold", "scaffold", rounds=2)
    model = _global(res)
    for cid, row in _table(res, 2).items():
        assert (row["loss_sum"], row["correct"]) == _evaluated(model, model.flat.clone(), cid)


# -- the worker alone, with a hand-written store ----------------------------------------------

def _worker(tmp_path, part: ClientWork) -> ClientWorker:
    training = LocalTraining(lr=0.1, batch_size=4, local_epochs=1, local_steps=None,
                             eval_batch_size=EVAL_BATCH)
    return ClientWorker(WorkerSpec(
        make_model=fixed_linear()[0], source=MemorySource(CLIENTS, in_process=True), seed=4,
        training=training, resources=WorkerResources(num_cpus=1, cache_mb=0),
        client=part, aggregator=Aggregator(), state_url=str(tmp_path / "state")))


def test_worker_reads_the_version_it_is_given(tmp_path):
    w = _worker(tmp_path, LocalBias())
    store = ClientStateStore(str(tmp_path / "state"))
    store.put(1, 2, {"local": torch.tensor([0.5, -1.0, 2.0])})
    store.put(1, 3, {"local": torch.tensor([9.0, 9.0, -9.0])})  # a later version: not read
    glob = torch.linspace(-1, 1, 18)
    rows = w.evaluate_clients(glob.numpy(), [0, 1], 2, None, [0, 2])
    model = FlatModel(fixed_linear()[0]())
    own = glob.clone()
    own[15:] = torch.tensor([0.5, -1.0, 2.0])  # nn.Linear(5, 3): weight, then bias
    assert [(r.sums.loss_sum, r.sums.correct) for r in rows] == \
        [_evaluated(model, glob, 0), _evaluated(model, own, 1)]
    assert _evaluated(model, own, 1) != _evaluated(model, glob, 1)
    # eval.personalize starts from the client's own weights
    pers = Personalize(lr=0.2, batch_size=None, epochs=1, steps=0)
    row = w.evaluate_clients(glob.numpy(), [1], 2, pers, [2])[0]
    x, y = _split(1, "train")
    local_sgd(model, own, x, y, lr=0.2, batch_size=4, local_epochs=1, local_steps=None,
              seed=personalize_seed(4, 2, 1), delta_out=torch.empty_like(own))
    want = evaluate(model.module, *_split(1, "test"), EVAL_BATCH, torch.device("cpu"))
    assert (row.personalized.loss_sum, row.personalized.correct) == (want.loss_sum,
                                                                     want.correct)


def test_wrong_eval_weights_name_the_part(tmp_path):
    w = _worker(tmp_path, WrongLength())
    with pytest.raises(FedrayError, match=r"^algorithm.client \S*:WrongLength: eval_weights"
                       r"\(client 3\) returned 4 values; it must be None or the model's 18 "):
        w.evaluate_clients(torch.zeros(18).numpy(), [3], 1, None, [0])
