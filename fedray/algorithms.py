"""Algorithms as compositions of parts: client update x aggregator x server optimizer.

A job picks a preset with ``algorithm.name`` and may replace any part with
``algorithm.client``, ``algorithm.aggregator`` or ``algorithm.server_opt`` -- e.g.
``{name: fedprox, server_opt: momentum}`` is FedProx with server momentum. The parts:

client updates (fedray/client_update.py), starting from the global model x:
  local_sgd  K local minibatch SGD steps (or E epochs)                   (McMahan et al.)
  fedsgd     one gradient step on the client's whole data                 (McMahan et al.)
  fedprox    local SGD on f_k(y) + (mu/2)||y - x||^2: each step adds mu (y - x) to the
             gradient (Li et al., FedProx), mu = ``algorithm.prox_mu``
aggregators (fedray/aggregator.py), reduced on the workers as partial sums:
  proportional  mean of deltas weighted by example count |D_k| / sum |D_j|
  uniform       plain mean of deltas
server optimizers (fedray/server_optimizer.py), on the aggregated delta (Reddi et al.'s
SERVEROPT): sgd, momentum (FedAvgM), nesterov, adam, yogi, adagrad.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Parts:
    client: str
    aggregator: str
    server_opt: str


CLIENT_UPDATES = ("local_sgd", "fedsgd", "fedprox")
AGGREGATORS = ("proportional", "uniform")
SERVER_OPTS = ("sgd", "momentum", "nesterov", "adam", "yogi", "adagrad")

PRESETS: dict[str, Parts] = {
    "fedavg": Parts("local_sgd", "proportional", "sgd"),
    "fedsgd": Parts("fedsgd", "proportional", "sgd"),
    "fedprox": Parts("fedprox", "proportional", "sgd"),
    "fedavgm": Parts("local_sgd", "proportional", "momentum"),
    "fednesterov": Parts("local_sgd", "proportional", "nesterov"),
    "fedadam": Parts("local_sgd", "proportional", "adam"),
    "fedyogi": Parts("local_sgd", "proportional", "yogi"),
    "fedadagrad": Parts("local_sgd", "proportional", "adagrad"),
}
ALGORITHMS = PRESETS  # the names ``algorithm.name`` accepts


def resolve(algorithm) -> Parts:
    """The parts of ``algorithm`` (the config section): the preset, with overrides applied."""
    preset = PRESETS[algorithm.name]
    return Parts(algorithm.client or preset.client, algorithm.aggregator or preset.aggregator,
                 algorithm.server_opt or preset.server_opt)
