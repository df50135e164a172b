"""The driver actor: owns the global model and the worker pool, and runs the rounds.

One round (docs/architecture.md has the picture):
  1. sample ``sampling.clients_per_round`` client ids from (seed, round), less those that
     drop out or finish late (``sampling.dropout`` / ``over_selection``, fedray.sampling);
  2. assign them to workers, balanced by example count (fedray.assignment);
  3. put the global weights into the object store once; every worker reads that one copy;
  4. each worker trains its clients one after another and returns one partial weighted sum;
  5. merge the partial sums (in worker order, so reruns are bit-identical), apply the
     server optimizer, write the round's metrics, and yield them to whoever streams them.
The driver never holds more than one worker's partial result at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import ray
import torch
from omegaconf import OmegaConf
from torch import nn

from fedray import __version__
from fedray.aggregator import Aggregation
from fedray.algorithms import resolve
from fedray.assignment import assign_balanced
from fedray.data.source import ClientSource
from fedray.errors import FedrayError
from fedray.evaluation import merge_sums
from fedray.losses import correct_fn
from fedray.pool import create_workers
from fedray.replica import FlatModel
from fedray.run_dir import CLIENT_STATE_DIR, SERVER_STATE_FILE, WEIGHTS_FILE, RunDir
from fedray.runtime import private_mb
from fedray.sampling import federated_eval_clients, select_round
from fedray.seeding import TAG_INIT, derive_seed
from fedray.server_optimizer import build_server_optimizer
from fedray.worker import WorkerSpec


def is_eval_round(r: int, every: int, rounds: int) -> bool:
    return r == rounds or (every > 0 and r % every == 0)


class Driver:
    def __init__(self) -> None:
        # the driver merges and steps; workers do the heavy work
        torch.set_num_threads(1)

    def setup(self, cfg: dict, source: ClientSource, make_model: Callable[[], nn.Module],
              num_workers: int, run_dir: str) -> None:
        """Build the global model and the worker pool, and open the run directory.

        Not in __init__: an exception there kills the actor with an opaque error, while one
        raised here reaches fedray.run as the FedrayError it is."""
        self.cfg = OmegaConf.create(cfg)
        c = self.cfg
        self.source = source
        torch.manual_seed(derive_seed(c.seed, TAG_INIT))
        try:
            self.template = FlatModel(make_model())
        except (ValueError, RuntimeError) as exc:
            raise FedrayError(f"model.name={c.model.name}: cannot build it for inputs of shape "
                              f"{tuple(source.input_shape)}: {exc}") from None
        self.weights = self.template.flat.clone()
        self.parts = resolve(c.algorithm)
        sv = c.server
        self.server_opt = build_server_optimizer(self.parts.server_opt, sv.lr, sv.momentum,
                                                 sv.beta1, sv.beta2, sv.tau)
        self.sizes = source.train_sizes()
        a = c.algorithm
        self.aggregation = Aggregation(self.parts.aggregator, self.weights.numel(),
                                       self.template.num_params,
                                       population=source.population, tau=a.elastic_tau)
        self.run_dir = RunDir(run_dir)
        spec = WorkerSpec(make_model=make_model, source=source, seed=c.seed, lr=c.client.lr,
                          batch_size=c.client.batch_size, local_epochs=c.client.local_epochs,
                          local_steps=c.client.local_steps, eval_batch_size=c.eval.batch_size,
                          num_cpus=c.runtime.worker.num_cpus, cache_mb=c.runtime.worker.cache_mb,
                          client=self.parts.client, aggregator=self.parts.aggregator,
                          loss=c.model.loss,
                          prox_mu=a.prox_mu if self.parts.client == "fedprox" else 0.0,
                          scaffold_option=a.scaffold_option, elastic_mu=a.elastic_mu,
                          elastic_holdout=a.elastic_holdout, alpha=a.alpha,
                          state_url=self.run_dir.url_of(CLIENT_STATE_DIR),
                          state_cache_mb=c.runtime.worker.state_cache_mb,
                          steps_per_epoch=c.client.steps_per_epoch,
                          max_update_norm=c.guard.max_update_norm)
        start = time.perf_counter()
        self.workers = create_workers(spec, num_workers, c.runtime.worker.num_cpus,
                                      c.runtime.worker.num_gpus)
        self.pool_start_s = time.perf_counter() - start
        self.test_ref, self.test_len = None, 0
        if c.eval.central:
            test = source.central_test()
            if test is not None:
                self.test_ref, self.test_len = ray.put(test), len(test[1])
        self.fed_eval_ids = (federated_eval_clients(c.seed, source.population,
                                                    c.eval.federated_clients)
                             if c.eval.federated_clients else None)
        self.run_dir.create(OmegaConf.to_yaml(self.cfg, resolve=True))

    def workers_info(self) -> list[dict]:
        return ray.get([w.info.remote() for w in self.workers])

    def _broadcast(self) -> ray.ObjectRef:
        return ray.put(self.weights.numpy())

    def _broadcast_round(self) -> ray.ObjectRef:
        """The round's one object: the global weights and the aggregator's state (SCAFFOLD's
        c), read zero-copy by every worker on a node."""
        return ray.put({"weights": self.weights.numpy(), **self.aggregation.broadcast()})

    def _train_round(self, r: int) -> dict[str, Any]:
        c = self.cfg
        sm = c.sampling
        sel = select_round(c.seed, r, self.source.population, sm.clients_per_round,
                           always=sm.always, dropout=sm.dropout,
                           over_selection=sm.over_selection, sizes=self.sizes)
        ids = sel.participants
        groups = assign_balanced(ids, self.sizes[ids], len(self.workers))
        payload_ref = self._broadcast_round()
        refs = [w.train.remote(payload_ref, r, g)
                for w, g in zip(self.workers, groups, strict=True) if g]
        acc = self.aggregation.new_sum()
        stats = {"examples": 0, "loss_sum": 0.0, "examples_seen": 0, "dropped": 0,
                 "busy_s": 0.0}
        worker_mem = 0.0
        for ref in refs:  # fixed order: the float64 sum is bit-identical across reruns
            part = ray.get(ref)
            acc.merge(part)
            for k in stats:
                stats[k] += part[k]
            worker_mem = max(worker_mem, part["mem_mb"])
            del part
        if acc.weight > 0:  # a round without examples (or all dropped) leaves the model as is
            self.weights = self.server_opt.step(self.weights, self.aggregation.finish(acc))
        return {"clients": len(ids), "dropped_out": sel.dropped_out, "late": sel.late,
                "examples": int(stats["examples"]),
                "dropped_updates": int(stats["dropped"]),
                "train_loss": stats["loss_sum"] / max(1, stats["examples_seen"]),
                "worker_busy_s": stats["busy_s"], "worker_mem_mb": worker_mem}

    def evaluate(self) -> dict[str, float]:
        """Central and federated evaluation of the current global model, run concurrently."""
        if self.test_ref is None and self.fed_eval_ids is None:
            return {}
        n = len(self.workers)
        weights_ref = self._broadcast()
        pending: dict[str, list[ray.ObjectRef]] = {}
        if self.test_ref is not None:
            bounds = np.linspace(0, self.test_len, n + 1).astype(int)
            pending["test"] = [
                w.evaluate_range.remote(weights_ref, self.test_ref, int(lo), int(hi))
                for w, lo, hi in zip(self.workers, bounds[:-1], bounds[1:], strict=True)
                if hi > lo]
        if self.fed_eval_ids is not None:
            ids = self.fed_eval_ids
            groups = assign_balanced(ids, self.source.test_sizes()[ids], n)
            pending["fed_test"] = [w.evaluate_clients.remote(weights_ref, g)
                                   for w, g in zip(self.workers, groups, strict=True) if g]
        out: dict[str, float] = {}
        for prefix, refs in pending.items():
            s = merge_sums(ray.get(refs))
            out[f"{prefix}_loss"] = s["loss_sum"] / max(1, s["count"])
            if correct_fn(self.cfg.model.loss) is not None:  # regression (mse) has no accuracy
                out[f"{prefix}_accuracy"] = s["correct"] / max(1, s["count"])
        return out

    def run(self) -> Iterator[dict]:
        """Run every round, yielding each round's metrics; the last item is the summary."""
        c = self.cfg
        run_start = time.perf_counter()
        history: list[dict] = []
        for r in range(1, c.rounds + 1):
            t0 = time.perf_counter()
            m: dict[str, Any] = {"round": r}
            m.update(self._train_round(r))
            train_s = time.perf_counter() - t0
            m["train_s"] = train_s
            m["updates_per_s"] = m["clients"] / train_s
            if is_eval_round(r, c.eval.every, c.rounds):
                m.update(self.evaluate())
            m["wall_s"] = time.perf_counter() - t0
            m["elapsed_s"] = time.perf_counter() - run_start
            m["driver_mem_mb"] = private_mb()
            self.run_dir.append_metrics(m)
            history.append({k: m[k] for k in ("updates_per_s", "test_accuracy", "dropped_updates")
                            if k in m})
            yield m
        summary = self._summary(history, m, time.perf_counter() - run_start)
        if c.output.save_weights:
            self.run_dir.save_weights(self.state_dict())
        self.run_dir.save_tensors(SERVER_STATE_FILE, self.server_state())
        self.run_dir.write_json("summary.json", summary)
        yield {"summary": summary}

    def _summary(self, history: list[dict], last: dict, total_s: float) -> dict[str, Any]:
        c = self.cfg
        accs = [h["test_accuracy"] for h in history if "test_accuracy" in h]
        ups = [h["updates_per_s"] for h in history]
        final = {k: v for k, v in last.items() if k.startswith(("test_", "fed_test_"))}
        return {
            "name": c.name, "rounds": c.rounds, "population": self.source.population,
            "algorithm": {"client": self.parts.client, "aggregator": self.parts.aggregator,
                          "server_opt": self.parts.server_opt},
            "clients_per_round": c.sampling.clients_per_round, "num_workers": len(self.workers),
            "workers": self.workers_info(),
            "final": final, "best_test_accuracy": max(accs) if accs else None,
            "dropped_updates": sum(h["dropped_updates"] for h in history),
            "total_s": total_s, "pool_start_s": self.pool_start_s,
            "median_updates_per_s": float(np.median(ups)) if ups else None,
            "driver_mem_mb": private_mb(),
            "weights_file": WEIGHTS_FILE if c.output.save_weights else None,
            "fedray_version": __version__,
        }

    def server_state(self) -> dict[str, torch.Tensor]:
        """The server optimizer's and the aggregator's state (momentum, Adam moments,
        SCAFFOLD's c), as flat tensors named ``server_opt.*`` and ``aggregator.*``."""
        out = {f"aggregator.{k}": v for k, v in self.aggregation.state_dict().items()}
        for k, v in self.server_opt.state_dict().items():
            out[f"server_opt.{k}"] = v if isinstance(v, torch.Tensor) else torch.tensor(v)
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        self.template.load_(self.weights)
        return self.template.state_dict()
