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

With ``--spec FILE`` instead of ``--workload`` it runs a protocol of benchmarks/protocols.py:
the JSON names the model (a fedray model name, its input shape and classes), the clients'
.npz (only the clients the rounds train, with their ids), lr, batch size, local epochs,
population, seed and, for every round, the client ids fedray's run trains that round. Flower
still samples which of its nodes run a round, but each sampled node trains the data of the
next id of that list (sent in its fit config), so both sides train the same clients with
the same work per round, which the examples per round recorded here let the caller check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import throughput as tp  # noqa: E402

_SETTINGS = "FEDRAY_FLOWER_SIDE"  # JSON settings for the client actors (they inherit env)
_CACHE: dict = {}


def _settings() -> dict:
    return json.loads(os.environ[_SETTINGS])


def _client_arrays(path: str, cid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``cid`` of the .npz (x and y of every client, concatenated, and the offsets;
    with ``ids``, the clients held, in order, when it holds only some), loaded once per
    actor process, then sliced as tensors without a copy."""
    if path not in _CACHE:
        with np.load(path) as z:
            ids = z["ids"] if "ids" in z.files else None
            _CACHE[path] = (torch.from_numpy(z["x"]), torch.from_numpy(z["y"]), z["offsets"],
                            ids)
    x, y, offsets, ids = _CACHE[path]
    row = cid
    if ids is not None:
        row = int(np.searchsorted(ids, cid))
        if row >= len(ids) or ids[row] != cid:
            raise KeyError(f"{path} does not hold client {cid}")
    lo, hi = int(offsets[row]), int(offsets[row + 1])
    return x[lo:hi], y[lo:hi]


def write_clients(path: str, clients: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
    """Some clients as ``_client_arrays`` reads them: their ids (sorted), x and y
    concatenated in that order, and the offsets where each starts (an uncompressed .npz)."""
    ids = sorted(clients)
    sizes = [len(clients[c][1]) for c in ids]
    np.savez(path, ids=np.asarray(ids, dtype=np.int64),
             x=np.concatenate([clients[c][0] for c in ids]),
             y=np.concatenate([clients[c][1] for c in ids]),
             offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))


def _model(cfg: dict) -> torch.nn.Module:
    """The settings' model, built once per actor process (its weights are overwritten by
    every fit)."""
    key = ("model", cfg["model"], tuple(cfg.get("input_shape", ())))
    if key not in _CACHE:
        if "input_shape" in cfg:
            from fedray.core.models import build_model

            _CACHE[key] = build_model(cfg["model"], tuple(cfg["input_shape"]),
                                      int(cfg["num_classes"]))
        else:
            _CACHE[key] = tp.model_factory(cfg["model"])()
    return _CACHE[key]


def train_local(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float,
                batch: int, epochs: int, seed: int) -> None:
    """A protocol client's local training as anyone would write it (throughput.train_client
    with the protocol's batch size and epochs): torch.optim.SGD, each epoch over a seeded
    permutation, in batches of ``batch``, cross-entropy."""
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=g)
        for i in range(0, len(y), batch):
            idx = perm[i:i + batch]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()


def client_fn(context):
    from flwr.client import NumPyClient

    cfg = _settings()
    node_cid = int(context.node_config["partition-id"])

    class BenchClient(NumPyClient):
        def fit(self, parameters, config):
            start = time.perf_counter()
            model = _model(cfg)
            with torch.no_grad():
                for t, a in zip(model.state_dict().values(), parameters, strict=True):
                    t.copy_(torch.from_numpy(a))
            cid = int(config.get("cid", node_cid))  # a protocol's: fedray's id this round
            x, y = _client_arrays(cfg["data"], cid)
            seed = tp.client_seed(int(cfg.get("seed", tp.SEED)), int(config["round"]), cid)
            if "batch_size" in cfg:
                train_local(model, x, y, cfg["lr"], int(cfg["batch_size"]),
                            int(cfg["local_epochs"]), seed)
            else:
                tp.train_client(model, x, y, cfg["lr"], seed)
            out = [t.detach().numpy().copy() for t in model.state_dict().values()]
            return out, len(y), {"fit_s": time.perf_counter() - start}

    return BenchClient().to_client()


def simulate(settings: dict, initial: list[np.ndarray], k: int, population: int, rounds: int,
             num_cpus: int, client_cpus: float,
             assign: list[list[int]] | None = None) -> dict:
    """Flower's simulation of ``rounds`` FedAvg rounds of ``k`` of ``population`` nodes,
    the clients trained as ``settings`` say; ``assign[r - 1]``: the client ids round r's
    sampled nodes train, in order (otherwise each node trains its own partition).
    Returns per-round seconds, updates, examples and seconds spent inside fit()."""
    from flwr.client import ClientApp
    from flwr.common import FitIns, ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    os.environ[_SETTINGS] = json.dumps(settings)
    times: dict[int, float] = {}
    updates: dict[int, int] = {}
    examples: dict[int, int] = {}
    busy: dict[int, float] = {}  # seconds the clients spent inside fit(), summed

    class TimedFedAvg(FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            times[server_round] = time.perf_counter()
            pairs = super().configure_fit(server_round, parameters, client_manager)
            if assign is None:
                return pairs
            ids = assign[server_round - 1]
            if len(pairs) != len(ids):
                raise RuntimeError(f"Flower sampled {len(pairs)} nodes in round "
                                   f"{server_round}, not {len(ids)}")
            return [(proxy, FitIns(ins.parameters, {**ins.config, "cid": int(cid)}))
                    for (proxy, ins), cid in zip(pairs, ids, strict=True)]

        def aggregate_fit(self, server_round, results, failures):
            out = super().aggregate_fit(server_round, results, failures)
            times[server_round] = time.perf_counter() - times[server_round]
            updates[server_round] = len(results)
            examples[server_round] = sum(int(r.num_examples) for _, r in results)
            busy[server_round] = sum(float(r.metrics["fit_s"]) for _, r in results)
            return out

    strategy = TimedFedAvg(fraction_fit=k / population, min_fit_clients=k,
                           fraction_evaluate=0.0, min_evaluate_clients=0,
                           min_available_clients=population,
                           on_fit_config_fn=lambda r: {"round": r},
                           initial_parameters=ndarrays_to_parameters(initial))

    def server_fn(context):
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

    run_simulation(server_app=ServerApp(server_fn=server_fn),
                   client_app=ClientApp(client_fn=client_fn), num_supernodes=population,
                   backend_config={"client_resources": {"num_cpus": client_cpus,
                                                        "num_gpus": 0.0},
                                   "init_args": {"num_cpus": num_cpus,
                                                 "logging_level": "ERROR"}})
    import flwr

    order = sorted(times)
    return {"flower_version": flwr.__version__,
            "round_s": [times[r] for r in order],
            "updates": [updates.get(r, 0) for r in order],
            "examples": [examples.get(r, 0) for r in order],
            "fit_s": [busy.get(r, 0.0) for r in order]}


def run(workload: str, data: str, rounds: int, num_cpus: int, client_cpus: float) -> dict:
    """A throughput.py workload: the raw loop's clients, model, lr and initial weights."""
    w = tp.WORKLOADS[workload]
    torch.manual_seed(tp.derive_seed(tp.SEED, tp.TAG_INIT))  # the raw loop's initial weights
    initial = [t.detach().numpy().copy()
               for t in tp.model_factory(w["model"])().state_dict().values()]
    settings = {"model": w["model"], "lr": w["lr"], "data": data}
    out = simulate(settings, initial, w["clients_per_round"], tp.POPULATION, rounds, num_cpus,
                   client_cpus)
    return {"workload": workload, **out}


def run_spec(spec: dict, num_cpus: int, client_cpus: float) -> dict:
    """A protocol of benchmarks/protocols.py (see the module docstring)."""
    from fedray.core.models import build_model

    shape, classes = tuple(spec["input_shape"]), int(spec["num_classes"])
    torch.manual_seed(tp.derive_seed(int(spec["seed"]), tp.TAG_INIT))
    initial = [t.detach().numpy().copy()
               for t in build_model(spec["model"], shape, classes).state_dict().values()]
    settings = {key: spec[key] for key in ("model", "input_shape", "num_classes", "lr",
                                           "batch_size", "local_epochs", "seed", "data")}
    ids = spec["ids"]
    out = simulate(settings, initial, len(ids[0]), int(spec["population"]), len(ids),
                   num_cpus, client_cpus, assign=ids)
    return {"protocol": spec.get("name"), **out}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--workload", choices=list(tp.WORKLOADS))
    what.add_argument("--spec", metavar="FILE", help="a protocol's JSON (protocols.py)")
    p.add_argument("--data", help="the clients' .npz written by throughput.py (--workload)")
    p.add_argument("--rounds", type=int, help="rounds (--workload; a spec has its own)")
    p.add_argument("--num-cpus", type=int, default=2, help="CPUs of Flower's Ray (default 2)")
    p.add_argument("--client-cpus", type=float, default=1.0,
                   help="CPUs per client actor (default 1: one actor per core)")
    p.add_argument("--json", required=True, metavar="FILE", help="where to write the times")
    args = p.parse_args(argv)
    if args.workload:
        if args.data is None or args.rounds is None:
            p.error("--workload needs --data and --rounds")
        rounds = args.rounds
        result = run(args.workload, args.data, rounds, args.num_cpus, args.client_cpus)
    else:
        with open(args.spec) as f:
            spec = json.load(f)
        rounds = len(spec["ids"])
        result = run_spec(spec, args.num_cpus, args.client_cpus)
    if len(result["round_s"]) != rounds:
        print(f"flower_side: {len(result['round_s'])} of {rounds} rounds ran",
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
