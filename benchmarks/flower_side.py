"""Flower's simulation engine on a benchmarks/throughput.py workload: the Flower column of
``throughput.py --flower-python``. Never a fedray dependency: it runs under the Python of a
separate environment with ``flwr[simulation]`` and torch, and throughput.py reads its JSON.

    python -m venv /tmp/flower && /tmp/flower/bin/pip install 'flwr[simulation]' torch
    python benchmarks/throughput.py --workload logreg-100 --flower-python /tmp/flower/bin/python

What it runs is Flower as its documentation shows it: a ``ClientApp`` whose NumPyClient
trains one client per message, a ``ServerApp`` with the FedAvg strategy sampling
``clients_per_round`` of the 1,000 clients each round, on Ray with one CPU per client
actor (two actors on 2 cores, as fedray's two workers). Clients train exactly as the raw
loop's do (``throughput.train_client``: same model, initial weights, lr, batch and per-client
seeds), on the same clients, read from the ``.npz`` that throughput.py writes. Flower samples
its own client ids, so the ids (not their sizes' distribution) differ from the other sides.
A round is timed from FedAvg's configure_fit to the end of its aggregate_fit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import throughput as tp  # noqa: E402

_SETTINGS = "FEDRAY_FLOWER_SIDE"  # JSON settings for the client actors (they inherit env)
_CACHE: dict = {}


def _settings() -> dict:
    return json.loads(os.environ[_SETTINGS])


def _client_arrays(path: str, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``cid`` of the .npz (x and y of every client, concatenated, and the offsets),
    loaded once per actor process, then sliced as tensors without a copy."""
    if path not in _CACHE:
        with np.load(path) as z:
            _CACHE[path] = (torch.from_numpy(z["x"]), torch.from_numpy(z["y"]), z["offsets"])
    x, y, offsets = _CACHE[path]
    lo, hi = int(offsets[cid]), int(offsets[cid + 1])
    return x[lo:hi], y[lo:hi]


def _model(name: str) -> torch.nn.Module:
    if ("model", name) not in _CACHE:
        _CACHE["model", name] = tp.model_factory(name)()
    return _CACHE["model", name]


def client_fn(context):
    from flwr.client import NumPyClient

    cfg = _settings()
    cid = int(context.node_config["partition-id"])

    class BenchClient(NumPyClient):
        def fit(self, parameters, config):
            start = time.perf_counter()
            model = _model(cfg["model"])
            with torch.no_grad():
                for t, a in zip(model.state_dict().values(), parameters, strict=True):
                    t.copy_(torch.from_numpy(a))
            x, y = _client_arrays(cfg["data"], cid)
            seed = tp.client_seed(tp.SEED, int(config["round"]), cid)
            tp.train_client(model, x, y, cfg["lr"], seed)
            out = [t.detach().numpy().copy() for t in model.state_dict().values()]
            return out, len(y), {"fit_s": time.perf_counter() - start}

    return BenchClient().to_client()


def run(workload: str, data: str, rounds: int, num_cpus: int, client_cpus: float) -> dict:
    from flwr.client import ClientApp
    from flwr.common import ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    w = tp.WORKLOADS[workload]
    k = w["clients_per_round"]
    os.environ[_SETTINGS] = json.dumps({"model": w["model"], "lr": w["lr"], "data": data})
    torch.manual_seed(tp.derive_seed(tp.SEED, tp.TAG_INIT))  # the raw loop's initial weights
    initial = [t.detach().numpy().copy()
               for t in tp.model_factory(w["model"])().state_dict().values()]
    times: dict[int, float] = {}
    updates: dict[int, int] = {}
    busy: dict[int, float] = {}  # seconds the clients spent inside fit(), summed

    class TimedFedAvg(FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            times[server_round] = time.perf_counter()
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            out = super().aggregate_fit(server_round, results, failures)
            times[server_round] = time.perf_counter() - times[server_round]
            updates[server_round] = len(results)
            busy[server_round] = sum(float(r.metrics["fit_s"]) for _, r in results)
            return out

    strategy = TimedFedAvg(fraction_fit=k / tp.POPULATION, min_fit_clients=k,
                           fraction_evaluate=0.0, min_evaluate_clients=0,
                           min_available_clients=tp.POPULATION,
                           on_fit_config_fn=lambda r: {"round": r},
                           initial_parameters=ndarrays_to_parameters(initial))

    def server_fn(context):
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

    run_simulation(server_app=ServerApp(server_fn=server_fn),
                   client_app=ClientApp(client_fn=client_fn), num_supernodes=tp.POPULATION,
                   backend_config={"client_resources": {"num_cpus": client_cpus,
                                                        "num_gpus": 0.0},
                                   "init_args": {"num_cpus": num_cpus,
                                                 "logging_level": "ERROR"}})
    import flwr

    return {"workload": workload, "flower_version": flwr.__version__,
            "round_s": [times[r] for r in sorted(times)],
            "updates": [updates[r] for r in sorted(updates)],
            "fit_s": [busy[r] for r in sorted(busy)]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", required=True, choices=list(tp.WORKLOADS))
    p.add_argument("--data", required=True, help="the clients' .npz written by throughput.py")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--num-cpus", type=int, default=2, help="CPUs of Flower's Ray (default 2)")
    p.add_argument("--client-cpus", type=float, default=1.0,
                   help="CPUs per client actor (default 1: one actor per core)")
    p.add_argument("--json", required=True, metavar="FILE", help="where to write the times")
    args = p.parse_args(argv)
    result = run(args.workload, args.data, args.rounds, args.num_cpus, args.client_cpus)
    if len(result["round_s"]) != args.rounds:
        print(f"flower_side: {len(result['round_s'])} of {args.rounds} rounds ran",
              file=sys.stderr)
        return 1
    with open(args.json, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    # through the module, not __main__: the client actors then import client_fn (and keep
    # _CACHE, the clients loaded once per process) instead of unpickling a fresh copy of it
    import flower_side

    sys.exit(flower_side.main())
