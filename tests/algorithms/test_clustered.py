"""IFCA (fedray.algorithms.clustered) without the runtime or Ray: a client's choice of cluster
(the model of lowest loss on its data, ties to the lower index) on a real WorkerEnv and
FlatModel, what it trains from and records (its phase's start, the ``cluster`` column, the
model it is evaluated with), the aggregator's sums by hand (each model moves to the
example-weighted average of its own clients' trained models, model 0 through the update
``finish`` returns, zeros when it got nobody; the same split over two partial sums), its
``ifca_share_*`` metrics, and the refusals: a server optimizer other than plain SGD at lr 1
(it would move model 0 otherwise than the models IFCA averages itself), one cluster, an
unknown averaging.

Why: IFCA's models live in two places (model 0 is the runtime's global model, the others
the aggregator's state), so an off-by-one in a cluster index, a delta taken from the wrong
model, or a server optimizer that moves model 0 differently would train wrong models
without any error.

Every comparison is exact. The aggregator test's weights and updates are small dyadic
numbers (multiples of 1/8), so every float32 difference and float64 weighted sum in it is
exact whatever the order, and its expected models are the exact averages.
"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from fedray.algorithms.base import ClientContext, LocalUpdate, Phase, WorkerEnv, extra_sizes
from fedray.algorithms.clustered import (
    MODELS,
    IFCAAggregator,
    IFCAClient,
    IFCAParams,
    choose_cluster,
    cluster_models,
)
from fedray.algorithms.reduction import PartialSum
from fedray.algorithms.registry import resolve
from fedray.config import ServerConfig
from fedray.core.flat_model import FlatModel
from fedray.errors import ConfigError

# three examples of two features, two classes
X = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
Y = torch.tensor([0, 1, 0])
# flat nn.Linear(2, 2) weights (weight row-major, then bias): zero (loss ln 2 on every
# example), one that fits X (lower), its negation (higher)
ZERO = torch.zeros(6)
FIT = torch.tensor([2.0, 0.0, 0.0, 2.0, 0.0, 0.0])
ANTI = -FIT


def env_of(model: nn.Module, global_weights: torch.Tensor | None = None,
           others: torch.Tensor | None = None, split=None) -> WorkerEnv:
    env = WorkerEnv(model=FlatModel(model), device=torch.device("cpu"), lr=0.1,
                    loss="cross_entropy", eval_batch_size=2, batch_size_for=lambda n: 4,
                    client_split=split)
    env.global_weights = global_weights
    if others is not None:
        env.broadcast = {MODELS: others}
    return env


# -- the client's choice ----------------------------------------------------------------

def test_choose_cluster_takes_the_lowest_loss_ties_to_the_lower_index():
    env = env_of(nn.Linear(2, 2))
    losses = [env.risk(m, X, Y) for m in (ZERO, FIT, ANTI)]
    assert losses[1] < losses[0] < losses[2]  # the models are what their names say
    assert choose_cluster(env, [ZERO, ANTI, FIT, FIT.clone()], X, Y) == 2  # 3 ties: lower
    assert choose_cluster(env, [FIT, ZERO, FIT.clone()], X, Y) == 0
    assert choose_cluster(env, [ANTI, ZERO], X, Y) == 1
    assert choose_cluster(env, [ZERO, ZERO.clone(), ZERO.clone()], X, Y) == 0
    # the choice is measured on the data given: labels flipped, the fitted model is worst
    assert choose_cluster(env, [ZERO, FIT, ANTI], X, 1 - Y) == 2


def test_the_client_trains_and_records_its_cluster():
    client = IFCAClient(IFCAParams(clusters=3))
    assert client.columns == ("cluster",) and client.full_batch is False
    # models: 0 the global one (ZERO), then the broadcast ANTI and FIT
    env = env_of(nn.Linear(2, 2), ZERO, torch.stack([ANTI, FIT]))
    assert [m.tolist() for m in cluster_models(env)] == [ZERO.tolist(), ANTI.tolist(),
                                                          FIT.tolist()]
    ctx = ClientContext(5, 1, 123, X, Y, 4)
    (phase,) = client.phases(env, ctx)
    assert ctx.columns == {"cluster": 2} and ctx.scratch["cluster"] == 2
    assert torch.equal(phase.start, FIT) and phase.steps is None and phase.send
    # the global model the best: it starts from the broadcast one ("global")
    env0 = env_of(nn.Linear(2, 2), FIT, torch.stack([ANTI, ZERO]))
    ctx0 = ClientContext(6, 1, 124, X, Y, 4)
    assert client.phases(env0, ctx0) == [Phase(start="global", steps=None)]
    assert ctx0.columns == {"cluster": 0}
    # a client without examples measures nothing: cluster 0
    empty = ClientContext(7, 1, 125, X[:0], Y[:0], 4)
    assert client.phases(env, empty)[0].start == "global" and empty.columns == {"cluster": 0}


def test_gradient_averaging_is_one_full_batch_step():
    client = IFCAClient(IFCAParams(averaging="gradient"))
    assert client.full_batch is True
    env = env_of(nn.Linear(2, 2), ZERO, torch.stack([FIT]))
    (phase,) = client.phases(env, ClientContext(1, 1, 5, X, Y, 4))
    assert phase.steps == 1 and torch.equal(phase.start, FIT)


def test_evaluation_uses_the_chosen_model_and_records_it():
    data = {3: (X, Y), 4: (X, 1 - Y)}
    asked = []

    def split(cid, which):
        asked.append((cid, which))
        return data[cid]

    client = IFCAClient(IFCAParams(clusters=3))
    env = env_of(nn.Linear(2, 2), ZERO, torch.stack([FIT, ANTI]), split)
    w = client.eval_weights(env, 3, None)
    assert torch.equal(w, FIT) and client.eval_columns(env, 3) == {"cluster": 1.0}
    assert client.eval_columns(env, 4) == {}  # not the client just evaluated
    w[0] = 99.0  # a copy: the broadcast model is not written through it
    assert env.broadcast[MODELS][0, 0] == 2.0
    assert torch.equal(client.eval_weights(env, 4, None), ANTI)
    assert client.eval_columns(env, 4) == {"cluster": 2}
    assert asked == [(3, "train"), (4, "train")]  # chosen on the train split


# -- the aggregator -----------------------------------------------------------------------

# model j's starting weights (4 values: nn.Linear(1, 2)) and three clients: (cluster,
# examples, trained weights)
START = [torch.tensor([0.5, -1.0, 2.0, 0.25]), torch.tensor([1.0, 0.0, -0.5, 3.0]),
         torch.tensor([-2.0, 0.125, 1.0, 1.5])]
CLIENTS = [(0, 2, torch.tensor([1.0, 0.5, -2.0, 3.0])),
           (2, 3, torch.tensor([0.25, 1.0, 1.5, -0.5])),
           (2, 1, torch.tensor([-1.0, 2.0, 0.5, 0.75]))]


def aggregator(clusters: int = 3) -> tuple[IFCAAggregator, list[int]]:
    agg = IFCAAggregator(IFCAParams(clusters=clusters))
    agg.init_server(4, 10)
    drawn = []

    def model_init(j: int) -> torch.Tensor:
        drawn.append(j)
        return START[j].clone()

    agg.init_weights(START[0].clone(), model_init)
    return agg, drawn


def accumulate(agg: IFCAAggregator, clients, acc: PartialSum | None = None) -> PartialSum:
    """The clients through accumulate, as a worker adds them: each delta is the trained
    weights minus the global model (model 0), whichever model the client started from."""
    env = env_of(nn.Linear(1, 2), START[0], agg.broadcast()[MODELS])
    agg.setup(env)
    if acc is None:
        acc = PartialSum(4, extras=extra_sizes((agg,), 4))
    for i, (j, n, trained) in enumerate(clients):
        ctx = ClientContext(i, 1, i, X, Y, 4, scratch={"cluster": j})
        agg.accumulate(env, ctx, LocalUpdate(trained - START[0], n, 0.0, n, 1), acc)
    return acc


def test_each_model_moves_to_its_clients_weighted_average():
    agg, drawn = aggregator()
    assert drawn == [1, 2]  # models 1..K-1 drawn from the run's streams 1..K-1
    assert agg.state["models"].shape == (2, 4) and agg.state["models"].dtype == torch.float32
    assert agg.extras == {"ifca_sum": 12, "ifca_weight": 3}
    acc = accumulate(agg, CLIENTS)
    # the main sum holds every client (the driver's acc.weight > 0 gate), the extras per model
    assert acc.weight == 6.0
    assert acc.extras["ifca_weight"].tolist() == [2.0, 0.0, 4.0]
    update = agg.finish(acc)
    (_, _, y_a), (_, _, y_b), (_, _, y_c) = CLIENTS
    # model 0: the global model's update, its one client's move
    assert update.dtype == torch.float64
    assert update.tolist() == (y_a - START[0]).double().tolist()
    # model 1: nobody chose it, it stays; model 2: (3 y_b + 1 y_c) / 4
    assert agg.state["models"][0].tolist() == START[1].tolist()
    assert agg.state["models"][1].tolist() == ((3 * y_b + y_c) / 4).tolist()
    assert agg.state["models"].dtype == torch.float32
    assert agg.round_metrics() == {"ifca_share_0": 2 / 6, "ifca_share_1": 0.0,
                                   "ifca_share_2": 4 / 6}


def test_split_over_workers_and_an_empty_model_zero():
    """Two workers' partial sums merged give the same models; a round where nobody chose
    model 0 leaves the global model where it is (a zero update)."""
    one, _ = aggregator()
    one_update = one.finish(accumulate(one, CLIENTS))
    two, _ = aggregator()
    merged = PartialSum(4, extras=extra_sizes((two,), 4))
    for part in (CLIENTS[:2], CLIENTS[2:]):
        merged.merge(accumulate(two, part).to_message())
    assert torch.equal(two.finish(merged), one_update)
    assert torch.equal(two.state["models"], one.state["models"])

    agg, _ = aggregator(2)
    only_one = [(1, 3, CLIENTS[1][2])]
    update = agg.finish(accumulate(agg, only_one))
    assert update.tolist() == [0.0] * 4 and update.dtype == torch.float64
    assert agg.state["models"][0].tolist() == CLIENTS[1][2].tolist()
    assert agg.round_metrics() == {"ifca_share_0": 0.0, "ifca_share_1": 1.0}


def test_the_models_are_checkpointed_state():
    agg, _ = aggregator()
    agg.finish(accumulate(agg, CLIENTS))
    saved = agg.state_dict()
    assert list(saved) == ["models"]
    fresh, _ = aggregator()
    fresh.load_state_dict(saved)
    assert torch.equal(fresh.state["models"], agg.state["models"])
    assert torch.equal(fresh.broadcast()[MODELS], agg.state["models"])


# -- refusals -------------------------------------------------------------------------------

def server(**over):
    return OmegaConf.merge(OmegaConf.structured(ServerConfig), over)


def test_ifca_resolves_as_a_preset():
    got = resolve({"name": "ifca", "ifca": {"clusters": 3}}, server())
    assert isinstance(got.client, IFCAClient) and isinstance(got.aggregator, IFCAAggregator)
    assert got.names["server_opt"] == "sgd" and got.aggregator.plain_server
    assert got.client.params == got.aggregator.params == IFCAParams(clusters=3)
    assert got.sections["ifca"] == {"clusters": 3, "averaging": "model"}


@pytest.mark.parametrize("algorithm, server_over, key, got", [
    ({"server_opt": "momentum"}, {}, "algorithm.server_opt", "'momentum'"),
    ({"server_opt": "adam"}, {}, "algorithm.server_opt", "'adam'"),
    ({}, {"lr": 0.5}, "server.lr", "0.5"),
])
def test_ifca_needs_plain_sgd_at_lr_1(algorithm, server_over, key, got):
    with pytest.raises(ConfigError) as info:
        resolve({"name": "ifca", **algorithm}, server(**server_over))
    msg = str(info.value)
    assert msg.startswith(f"config key '{key}': aggregator ifca averages its other models "
                          "itself"), msg
    assert msg.endswith(f"use algorithm.server_opt sgd with server.lr 1, got {got}")
    assert "\n" not in msg


@pytest.mark.parametrize("section, key, rule", [
    ({"clusters": 1}, "clusters", "must be >= 2 (one cluster is FedAvg), got 1"),
    ({"averaging": "x"}, "averaging", "must be model or gradient, got 'x'"),
])
def test_ifca_parameter_errors(section, key, rule):
    with pytest.raises(ConfigError) as info:
        resolve({"name": "ifca", "ifca": section}, server())
    assert str(info.value) == f"config key 'algorithm.ifca.{key}': {rule}"


def test_the_aggregator_refuses_a_client_part_that_records_no_cluster():
    """IFCA's aggregator reads each client's cluster from its client part; with local SGD
    every client would silently count for model 0 (FedAvg): refused, naming the key."""
    with pytest.raises(ConfigError, match="algorithm.client': aggregator ifca needs a client "
                                          "part that records each client's cluster"):
        resolve({"name": "fedavg", "aggregator": "ifca"}, server())
