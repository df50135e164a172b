"""``runtime.backend: inline``: the driver and its workers as plain objects in the calling
process, without Ray.

Why: an algorithm's math can then be stepped through with pdb (a breakpoint in a client
part's ``terms`` stops in the caller's terminal), and a numeric test runs in milliseconds
instead of waiting for actor processes to start. What it is not: there is no parallelism
(the workers' tasks run one after another) and no fault tolerance (a worker's error is the
run's error, raised where it happened). The results are bit-identical to the Ray backend's
with the same ``runtime.num_workers``: each worker gets its own copy of the spec, as a Ray
worker gets its own unpickled one, trains its slot's clients with the same thread count,
and the driver merges the same partial sums in the same slot order.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from fedray.runtime.messages import GroupResult
from fedray.runtime.reduction_tree import reduce_results
from fedray.runtime.worker import ClientWorker, WorkerSpec


def frozen(array: np.ndarray) -> np.ndarray:
    """A read-only copy of ``array``: what a Ray worker reads from the object store, so a
    worker can neither see the driver change it nor change it for the driver."""
    out = np.array(array, copy=True)
    out.setflags(write=False)
    return out


def frozen_tree(obj: Any) -> Any:
    """``frozen`` applied to every array of a tuple, list or dict (the central test set,
    a broadcast's server state)."""
    if isinstance(obj, np.ndarray):
        return frozen(obj)
    if isinstance(obj, tuple | list):
        return type(obj)(frozen_tree(v) for v in obj)
    if isinstance(obj, dict):
        return {k: frozen_tree(v) for k, v in obj.items()}
    return obj


class InlineWorker(ClientWorker):
    """A worker of the calling process: it asks Ray nothing, even where the caller has
    started Ray for something else (a Ray worker's GPUs are the ones Ray assigned it).
    A user part's exception leaves it as itself (with a note naming the part), not as
    a one-line PartError: pdb's post-mortem then lands in the part's code."""

    one_line_part_errors = False

    def assigned_gpus(self) -> list:
        return []

    def info(self) -> dict:
        return {"pid": os.getpid(), "gpu_ids": self.gpu_ids, "device": str(self.device),
                "node_id": None, "threads": torch.get_num_threads(), "backend": "inline"}


class InlinePool:
    """fedray.runtime.pool.WorkerPool's interface over ``count`` ClientWorker objects of this
    process. ``gather`` runs each task when the driver asks for its result, in slot order,
    so the driver still holds one partial sum at a time."""

    def __init__(self, spec: WorkerSpec, count: int, max_retries: int = 0,
                 one_line_part_errors: bool = False):
        self.threads = max(1, int(spec.resources.num_cpus))  # a Ray worker's torch threads
        self.max_retries = max_retries  # nothing is re-run in-process: kept for the summary
        self.failures = 0
        self.round_failures = 0
        self.merge_s = 0.0  # the last gather's group sums made here (WorkerPool.merge_s)
        with self._worker_threads():  # configure() sets this process's thread count
            self.workers = [InlineWorker(copy.deepcopy(spec)) for _ in range(count)]
        if one_line_part_errors:  # runtime.backend auto: a part's error as on Ray
            for w in self.workers:
                w.one_line_part_errors = True

    def __len__(self) -> int:
        return len(self.workers)

    def begin_round(self) -> None:
        self.round_failures = 0

    @contextlib.contextmanager
    def _worker_threads(self) -> Iterator[None]:
        """A worker's torch thread count while it runs, the driver's (one) otherwise: the
        thread count can change how a reduction is split, hence its rounding."""
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def _run(self, method: str, slot: int, args: tuple) -> Any:
        with self._worker_threads():
            return getattr(self.workers[slot], method)(*args)

    def gather(self, method: str, tasks: list[tuple[int, tuple, str]]) -> Iterator[Any]:
        """``worker.method(*args)`` for each ``(slot, args, what)``, in the order given."""
        self.merge_s = 0.0  # a result is in this process as soon as it exists
        for slot, args, _what in tasks:
            yield self._run(method, slot, args)

    def gather_reduced(self, tasks: list[tuple[int, tuple, str]], groups: list[list[int]],
                       on_workers: bool) -> Iterator[GroupResult]:
        """WorkerPool.gather_reduced in this process: each group's tasks, then its sum by the
        group's first worker (``on_workers``, for a group of two or more) or here, one
        result at a time (the same function: the same bits)."""
        self.merge_s = 0.0
        for g in groups:
            if on_workers and len(g) > 1:
                results = [self._run("train", *tasks[i][:2]) for i in g]
                out = self._run("reduce", tasks[g[0]][0], tuple(results))
                del results
            else:
                trained = [0.0]  # seconds of the fold below spent training, not merging

                def results(group: list[int] = g, trained: list[float] = trained) -> Iterator:
                    for i in group:
                        start = time.perf_counter()
                        res = self._run("train", *tasks[i][:2])
                        trained[0] += time.perf_counter() - start
                        yield res
                        del res

                start = time.perf_counter()
                out = reduce_results(results())
                self.merge_s += time.perf_counter() - start - trained[0]
            yield out
            del out

    def info(self) -> list[dict]:
        with self._worker_threads():
            return [w.info() for w in self.workers]
