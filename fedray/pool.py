"""The worker pool: how many workers fit, and creating them with their resource shares.

A worker reserves ``runtime.worker.num_cpus`` CPUs and ``runtime.worker.num_gpus`` GPUs
(0.25 -> four workers share one GPU; Ray sets CUDA_VISIBLE_DEVICES for them). The default
pool is as many workers as the cluster's resources allow, but never more than the clients of
one round, since a worker without clients only adds broadcast cost.
"""

from __future__ import annotations

import math

from omegaconf import DictConfig

from fedray.errors import FedrayError


def pool_size(cfg: DictConfig, resources: dict[str, float]) -> int:
    w = cfg.runtime.worker
    cpus = float(resources.get("CPU", 0.0))
    gpus = float(resources.get("GPU", 0.0))
    eps = 1e-9
    if w.num_gpus > 0 and gpus + eps < w.num_gpus:
        raise FedrayError(f"runtime.worker.num_gpus={w.num_gpus}: the Ray cluster has "
                          f"{gpus:g} GPUs")
    fit = math.floor(cpus / w.num_cpus + eps)
    if w.num_gpus > 0:
        fit = min(fit, math.floor(gpus / w.num_gpus + eps))
    requested = cfg.runtime.num_workers
    if requested is not None:
        if requested > fit:
            need = f"{requested * w.num_cpus:g} CPUs"
            if w.num_gpus > 0:
                need += f" and {requested * w.num_gpus:g} GPUs"
            raise FedrayError(f"runtime.num_workers={requested} needs {need}; the Ray cluster "
                              f"has {cpus:g} CPUs and {gpus:g} GPUs")
        return requested
    if fit < 1:
        raise FedrayError(f"runtime.worker.num_cpus={w.num_cpus:g}: the Ray cluster has only "
                          f"{cpus:g} CPUs, not enough for one worker")
    return max(1, min(fit, cfg.sampling.clients_per_round))


def create_workers(spec, count: int, num_cpus: float, num_gpus: float,
                   ready_timeout_s: float = 300.0) -> list:
    """Start ``count`` worker actors and wait until every one has built its model."""
    import ray

    from fedray.worker import ClientWorker

    actor = ray.remote(ClientWorker).options(num_cpus=num_cpus, num_gpus=num_gpus,
                                             max_concurrency=1)
    spec_ref = ray.put(spec)
    workers = [actor.remote(spec_ref) for _ in range(count)]
    ready, pending = ray.wait([w.info.remote() for w in workers], num_returns=count,
                              timeout=ready_timeout_s)
    if pending:
        for w in workers:
            ray.kill(w)
        raise FedrayError(f"only {len(ready)} of {count} workers started within "
                          f"{ready_timeout_s:.0f}s: the cluster lacks the resources they reserve")
    ray.get(ready)  # surface a worker's construction error, if any
    return workers
