"""Algorithms as compositions of parts: client update x aggregator x server optimizer.

A job picks a preset with ``algorithm.name`` and may replace any part with
``algorithm.client``, ``algorithm.aggregator`` or ``algorithm.server_opt`` -- e.g.
``{name: fedprox, server_opt: momentum}`` is FedProx with server momentum. The parts:

client updates (fedray/client_update.py), starting from the global model x:
  local_sgd  K local minibatch SGD steps (or E epochs)                   (McMahan et al.)
  fedsgd     one gradient step on the client's whole data                 (McMahan et al.)
  fedprox    local SGD on f_k(y) + (mu/2)||y - x||^2: each step adds mu (y - x) to the
             gradient (Li et al., FedProx), mu = ``algorithm.prox_mu``
  scaffold   local SGD with y <- y - lr (g(y) - c_i + c) (Karimireddy et al., SCAFFOLD);
             c_i+ by option I (gradient at x) or II (from the delta), ``scaffold_option``
aggregators (fedray/aggregator.py), reduced on the workers as partial sums:
  proportional  mean of deltas weighted by example count |D_k| / sum |D_j|
  uniform       plain mean of deltas
  scaffold      uniform mean of deltas; c <- c + (1/N) sum dc_i (needs client: scaffold)
  elastic       proportional mean scaled per parameter by zeta = 1 + tau - Omega/max Omega;
                the clients measure Omega on a held-out subset (Chen et al., CVPR 2023)
  expalpha      weights softmax((F_k(after) - F_k(before)) / alpha) over the round's
                clients; the clients measure their training risk before and after (seed 003)
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


CLIENT_UPDATES = ("local_sgd", "fedsgd", "fedprox", "scaffold")
AGGREGATORS = ("proportional", "uniform", "scaffold", "elastic", "expalpha")
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
    "scaffold": Parts("scaffold", "scaffold", "sgd"),
    "elastic_fedavgm": Parts("local_sgd", "elastic", "momentum"),  # Chen et al., Alg. 1
    "elastic_fedprox": Parts("fedprox", "elastic", "sgd"),  # Chen et al., Alg. 2
    "expalpha": Parts("local_sgd", "expalpha", "sgd"),
    "expalpha_fedavgm": Parts("local_sgd", "expalpha", "momentum"),
}
ALGORITHMS = PRESETS  # the names ``algorithm.name`` accepts


def resolve(algorithm) -> Parts:
    """The parts of ``algorithm`` (the config section): the preset, with overrides applied."""
    preset = PRESETS[algorithm.name]
    return Parts(algorithm.client or preset.client, algorithm.aggregator or preset.aggregator,
                 algorithm.server_opt or preset.server_opt)
