"""The worker pool: how many workers fit, and creating them with their resource shares.

A worker reserves ``runtime.worker.num_cpus`` CPUs and ``runtime.worker.num_gpus`` GPUs
(0.25 -> four workers share one GPU; Ray sets CUDA_VISIBLE_DEVICES for them). The default
pool is as many workers as the cluster's resources allow, but never more than the clients of
one round, since a worker without clients only adds broadcast cost.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fedray.config import RuntimeConfig
from fedray.errors import FedrayError, key_error

if TYPE_CHECKING:  # torch, which pool_size's callers (a sweep's checks) need not import
    from fedray.runtime.messages import GroupResult


def pool_size(runtime: RuntimeConfig, clients_per_round: int, resources: dict[str, float],
              num_workers: int | None = None) -> int:
    """How many workers the job runs: ``runtime.num_workers`` (or ``num_workers``, which
    takes its place: the count a run's first rounds had before a hand-over), or as many as
    the cluster's ``resources`` fit (``runtime.worker``'s share each), at most one per
    client of a round."""
    w = runtime.worker
    cpus = float(resources.get("CPU", 0.0))
    gpus = float(resources.get("GPU", 0.0))
    eps = 1e-9
    if w.num_gpus > 0 and gpus + eps < w.num_gpus:
        raise key_error("runtime.worker.num_gpus", f"the Ray cluster has {gpus:g} GPUs",
                        w.num_gpus)
    fit = math.floor(cpus / w.num_cpus + eps)
    if w.num_gpus > 0:
        fit = min(fit, math.floor(gpus / w.num_gpus + eps))
    requested = runtime.num_workers if num_workers is None else num_workers
    if requested is not None:
        if requested > fit:
            need = f"{requested * w.num_cpus:g} CPUs"
            if w.num_gpus > 0:
                need += f" and {requested * w.num_gpus:g} GPUs"
            raise key_error("runtime.num_workers", f"{requested} workers need {need}; the Ray "
                            f"cluster has {cpus:g} CPUs and {gpus:g} GPUs", requested)
        return requested
    if fit < 1:
        raise key_error("runtime.worker.num_cpus", f"the Ray cluster has only {cpus:g} CPUs, "
                        "not enough for one worker", w.num_cpus)
    return max(1, min(fit, clients_per_round))


def _failure_types() -> tuple[type[BaseException], ...]:
    """Ray errors that mean "the process running the task is gone", not "the task failed":
    a killed or OOM-killed worker, a lost node. Re-running elsewhere can succeed; a
    FedrayError raised by the task itself (a corrupt file, say) would only fail again."""
    from ray import exceptions as rx

    return (rx.RayActorError, rx.WorkerCrashedError, rx.NodeDiedError, rx.OutOfMemoryError,
            rx.ObjectLostError)


class WorkerTimeout(Exception):
    """A worker that did not finish its share of a round within ``runtime.worker_timeout_s``
    of it being sent: frozen (SIGSTOP, a hung device or file system) or far slower than it
    should be. Handled like a dead worker: killed, and its clients re-run elsewhere."""


def launch_workers(count: int, num_cpus: float, num_gpus: float) -> list:
    """Start ``count`` worker actors without waiting for them and without a spec.

    Their processes boot and import torch at once; ``create_workers`` later
    gives them the spec. fedray.run launches them next to the driver, which would otherwise
    import torch first and start its workers only then, which made short runs measurably
    slower (docs/performance.md, "Run start-up")."""
    import ray

    # imported when used, not at the top: it loads safetensors, torch (start-up time)
    from fedray.runtime.worker import ClientWorker

    actor = ray.remote(ClientWorker).options(num_cpus=num_cpus, num_gpus=num_gpus,
                                             max_concurrency=1)
    return [actor.remote() for _ in range(count)]


def create_workers(spec, count: int, num_cpus: float, num_gpus: float,
                   ready_timeout_s: float = 300.0, launched: list | None = None) -> list:
    """``count`` workers that have built their model for ``spec``: the ``launched`` ones
    (from ``launch_workers``), or new ones."""
    import ray

    workers = launched if launched is not None else launch_workers(count, num_cpus, num_gpus)
    spec_ref = spec if isinstance(spec, ray.ObjectRef) else ray.put(spec)
    ready, pending = ray.wait([w.configure.remote(spec_ref) for w in workers],
                              num_returns=len(workers), timeout=ready_timeout_s)
    if pending:
        for w in workers:
            ray.kill(w)
        raise FedrayError(f"only {len(ready)} of {len(workers)} workers started within "
                          f"{ready_timeout_s:.0f}s: the cluster lacks the resources they reserve")
    ray.get(ready)  # surface a worker's construction error, if any
    return workers


class WorkerPool:
    """The run's worker actors, one per slot, and the one way tasks are sent to them.

    A round is split into one task per slot (its clients), gathered in slot order. When the
    process behind a slot dies mid-task, the slot gets a fresh worker (or, if none can start
    within ``replace_timeout_s``, a surviving worker takes the slot over) and the task is
    re-run there. A task's result depends only on its inputs -- every client's randomness
    comes from (seed, round, client), its stored state is versioned -- so the re-run returns
    the same partial sum, merged at the same place: the round is bit-identical to an
    unfaulted one. ``max_retries`` re-runs are allowed per round (``begin_round`` resets the
    count); then the round fails, naming the task's clients and the error.

    ``timeout_s`` (runtime.worker_timeout_s): a worker whose tasks of one ``gather`` are not
    all done within this many seconds of being sent is treated as dead (WorkerTimeout): it
    is killed, and its tasks re-run the same way. A frozen process raises no error, so
    without it the round would wait for it forever.

    ``node_major`` (runtime.reduce): the workers take their slots ordered by node, so that
    a group of consecutive slots tends to share a node (fedray.runtime.reduction_tree).
    """

    timeout_s: float | None = None  # runtime.worker_timeout_s

    def __init__(self, spec, count: int, num_cpus: float, num_gpus: float, max_retries: int,
                 replace_timeout_s: float = 60.0, launched: list | None = None,
                 node_major: bool = False, timeout_s: float | None = None):
        import ray

        self._spec_ref = ray.put(spec)
        self._resources = (num_cpus, num_gpus)
        self.max_retries = max_retries
        self.timeout_s = timeout_s
        self.replace_timeout_s = replace_timeout_s
        self.workers = create_workers(self._spec_ref, count, num_cpus, num_gpus,
                                      launched=launched)
        if node_major:
            self.order_by_node()
        self.failures = 0  # tasks lost to dead workers, this run
        self.round_failures = 0  # ... this round
        # driver seconds of the last gather spent on results that were ready: receiving
        # them (ray.get after ray.wait) and folding groups on the driver (runtime.reduce)
        self.merge_s = 0.0
        self._task_s = 0.0  # ... and in _result altogether (waiting, re-runs included)

    def order_by_node(self) -> None:
        """Reorder the slots node-major (nodes in the order of their first worker)."""
        # imported when used, not at the top: it loads torch (start-up time)
        from fedray.runtime.reduction_tree import node_major

        order = node_major([i.get("node_id") for i in self.info()])
        self.workers = [self.workers[i] for i in order]

    def __len__(self) -> int:
        return len(self.workers)

    def begin_round(self) -> None:
        self.round_failures = 0

    def _replace(self, slot: int) -> None:
        try:
            self.workers[slot] = create_workers(self._spec_ref, 1, *self._resources,
                                                ready_timeout_s=self.replace_timeout_s)[0]
        except (FedrayError, *_failure_types()):  # no room for a new one (a node is gone),
            # or it died too: a survivor takes the slot (a dead one fails, and is replaced)
            self.workers[slot] = self.workers[(slot + 1) % len(self.workers)]

    def _ready(self, ref: Any, sent: float) -> bool:
        """Wait until ``ref`` is ready, wherever it is; False if it is not by ``sent`` (when
        its task was sent, time.monotonic) plus ``timeout_s``."""
        import ray

        left = None if self.timeout_s is None else max(
            0.0, sent + self.timeout_s - time.monotonic())
        ready, _ = ray.wait([ref], fetch_local=False, timeout=left)
        return bool(ready)

    def _timeout(self) -> WorkerTimeout:
        return WorkerTimeout(f"no result within runtime.worker_timeout_s={self.timeout_s:g}s")

    def _result(self, method: str, slot: int, args: tuple, what: str, ref: Any,
                sent: float | None = None) -> Any:
        """The result of ``ref`` (``worker.method(*args)`` on ``slot``, sent at ``sent``),
        re-running the task while its worker dies or times out and the round's re-runs
        last."""
        import ray

        failure = _failure_types()
        start = time.perf_counter()
        sent = time.monotonic() if sent is None else sent
        while True:
            if not self._ready(ref, sent):
                self._failed(self._timeout(), slot, what)
            else:
                ready = time.perf_counter()
                try:
                    result = ray.get(ref)
                    self.merge_s += time.perf_counter() - ready
                    break
                except failure as exc:
                    self._failed(exc, slot, what)
            ref = getattr(self.workers[slot], method).remote(*args)
            sent = time.monotonic()
        self._task_s += time.perf_counter() - start
        return result

    def _failed(self, exc: BaseException, slot: int, what: str) -> None:
        """Count a task lost to a dead (or timed-out: killed now) worker and give its slot a
        live one; raise when the round's re-runs are spent."""
        self.failures += 1
        self.round_failures += 1
        timed_out = isinstance(exc, WorkerTimeout)
        if timed_out:  # frozen: it never ends by itself, and holds its CPUs and GPU share
            import ray

            with contextlib.suppress(Exception):
                ray.kill(self.workers[slot])
        if self.round_failures > self.max_retries:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            happened = f"gave {reason}" if timed_out else \
                f"died ({type(exc).__name__}: {reason})"
            raise FedrayError(
                f"{what}: worker {slot} {happened} and "
                f"runtime.max_retries={self.max_retries} re-runs this round are "
                "spent") from None
        self._replace(slot)

    def gather(self, method: str, tasks: list[tuple[int, tuple, str]]) -> Iterator[Any]:
        """Run ``worker.method(*args)`` for each ``(slot, args, what)`` and yield the results
        in the order given, re-running a task whose worker died; ``what`` names the task's
        work (its clients) in the error raised when the round's re-runs are spent."""
        self.merge_s = self._task_s = 0.0
        refs = [getattr(self.workers[slot], method).remote(*args) for slot, args, _ in tasks]
        sent = time.monotonic()
        for i, (slot, args, what) in enumerate(tasks):
            ref, refs[i] = refs[i], None
            yield self._result(method, slot, args, what, ref, sent)

    def gather_reduced(self, tasks: list[tuple[int, tuple, str]], groups: list[list[int]],
                       on_workers: bool) -> Iterator[GroupResult]:
        """Run ``worker.train(*args)`` for each task and yield, for each group of tasks
        (lists of indices into ``tasks``: fedray.runtime.reduction_tree.slot_groups), its
        results as one GroupResult, in group order.

        ``on_workers``: a group of two or more tasks is summed by its first task's worker,
        which receives the others' results as its task's arguments. Where that fails
        because a worker died -- one of the group's, the summing one -- the group's results
        are fetched one by one through the re-run path (only a dead worker's task is run
        again) and summed here: the same function, the same bits. Otherwise (and for a
        group of one) the group is summed here, each result fetched as it is added."""
        import ray

        # imported when used, not at the top: it loads torch (start-up time)
        from fedray.runtime.reduction_tree import reduce_results

        self.merge_s = self._task_s = 0.0
        failure = _failure_types()
        refs: list[Any] = [self.workers[slot].train.remote(*args) for slot, args, _ in tasks]
        reduced = [self.workers[tasks[g[0]][0]].reduce.remote(*(refs[i] for i in g))
                   if on_workers and len(g) > 1 else None for g in groups]
        sent = time.monotonic()
        for k, g in enumerate(groups):
            ref, reduced[k] = reduced[k], None
            out, lost = None, None
            if ref is not None:
                if not self._ready(ref, sent):  # a member, or the summing worker, is stuck
                    lost = self._timeout()
                else:
                    ready = time.perf_counter()
                    try:
                        out = ray.get(ref)
                        self.merge_s += time.perf_counter() - ready
                    except failure as exc:
                        lost = exc
                del ref
            if out is None:
                failures = self.round_failures
                start, waited = time.perf_counter(), self._task_s
                out = reduce_results(self._result("train", *tasks[i], refs[i], sent)
                                     for i in g)
                self.merge_s += (time.perf_counter() - start) - (self._task_s - waited)
                if lost is not None and self.round_failures == failures:
                    # every member's result was there: the summing worker itself died
                    slot, _, what = tasks[g[0]]
                    self._failed(lost, slot, f"{what} (summing its group)")
            for i in g:
                refs[i] = None
            yield out
            del out  # the driver has merged it: not held while the next is fetched

    def info(self) -> list[dict]:
        """Each slot's worker (process, device, node); a worker whose process is gone is
        reported as such instead of failing the caller: the run summary asks after the
        last round, and a worker lost then (a preempted node) has no work left to redo."""
        import ray

        failure = _failure_types()
        refs = [w.info.remote() for w in self.workers]
        ray.wait(refs, num_returns=len(refs), fetch_local=False, timeout=self.timeout_s)
        out = []
        for ref in refs:
            try:  # one frozen after the last round (runtime.worker_timeout_s): not waited for
                out.append(ray.get(ref, timeout=0 if self.timeout_s is not None else None))
            except (*failure, ray.exceptions.GetTimeoutError) as exc:
                out.append({"dead": True, "error": type(exc).__name__})
        return out
