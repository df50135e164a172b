"""``fedray.run``: the one Python entry point, shared by the CLI, sweeps and tests.

    result = fedray.run("jobs/quickstart.yaml", overrides=["rounds=5"])
    result = fedray.run({"rounds": 3}, model_fn=MyNet, client_data={0: (x0, y0), ...},
                        test_data=(x_test, y_test))
    result = fedray.run(resume="runs/a")  # continue a killed run from its checkpoint

It validates the whole config before Ray starts, runs the driver actor to the end, and
returns the final weights (a state_dict) and the per-round metrics.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from fedray.config import ConfigSource, load_config, validate
from fedray.errors import FedrayError, key_error
from fedray.storage import RunClaim, absolute_url, filesystem, storage_failure

if TYPE_CHECKING:  # torch is imported where a run starts: a bad config fails without it
    import torch
    from torch import nn


@dataclass
class RunResult:
    weights: dict[str, torch.Tensor]  # final global model as a state_dict
    metrics: list[dict]  # one dict per round, as in metrics.jsonl
    summary: dict  # as in summary.json
    run_dir: str  # where config.yaml, metrics.jsonl, summary.json and the weights are
    config: DictConfig  # the resolved configuration


def prepare(config: ConfigSource | None, overrides: list[str] | tuple = (),
            client_data: Mapping | None = None, model_fn: Callable | None = None,
            test_data: tuple | None = None) -> DictConfig:
    """Load and validate a job; nothing is started or written."""
    if test_data is not None and client_data is None:
        raise FedrayError("test_data needs client_data (the synthetic source has its own test set)")
    cfg = load_config(config, overrides)
    if client_data is not None or model_fn is not None:
        cfg = OmegaConf.merge(cfg, {
            "data": {"partition": "memory" if client_data is not None else cfg.data.partition},
            "model": {"name": "custom" if model_fn is not None else cfg.model.name}})
        OmegaConf.set_readonly(cfg, True)
    if client_data is None and cfg.data.partition == "memory":
        raise key_error("data.partition", "'memory' means the client_data given to fedray.run, "
                        "and none was given", "memory")
    filesystem(absolute_url(cfg.output.dir), "output.dir", durable=True)
    has_client_test = client_data is None
    train_counts = None  # synthetic writers have at least data.synthetic.min_examples >= 1
    if client_data is not None:
        population = len(client_data)
        train_counts = [len(xy[1]) for xy in client_data.values()]
    elif cfg.data.partition == "synthetic":
        population = cfg.data.synthetic.num_clients
        has_client_test = cfg.data.synthetic.test_fraction > 0
    else:  # a partition store: make the path absolute so every process means the same place
        from fedray.store import read_manifest

        url = absolute_url(cfg.data.partition)
        filesystem(url, "data.partition", durable=True)  # workers read it, not this process
        manifest = read_manifest(url)
        population, has_client_test = manifest["num_clients"], "test" in manifest["clients"]
        train_counts = manifest["clients"]["train"]["count"]
        cfg = OmegaConf.merge(cfg, {"data": {"partition": url}})
        OmegaConf.set_readonly(cfg, True)
    validate(cfg, population, custom_model=model_fn is not None)
    if train_counts is not None:  # clients without examples may be sampled (they count for
        # nothing), but one forced into every round is a mistake
        empty = [a for a in cfg.sampling.always if train_counts[a] == 0]
        if empty:
            raise key_error("sampling.always", f"client {empty[0]} has no training examples, "
                            "so it can never contribute", list(cfg.sampling.always))
    if cfg.output.mlflow:
        from fedray.mlflow_tracking import require_mlflow

        require_mlflow()
    if cfg.eval.federated_clients and not has_client_test:
        raise key_error("eval.federated_clients", "this data has no per-client test split; set "
                        "it to 0 (and pass test_data for in-memory client_data)",
                        cfg.eval.federated_clients)
    return cfg


def prepare_resume(run_dir: str, config: ConfigSource | None = None,
                   overrides: list[str] | tuple = (), allow_changes: list[str] | tuple = (),
                   client_data: Mapping | None = None, model_fn: Callable | None = None,
                   test_data: tuple | None = None) -> tuple[DictConfig, str]:
    """The config to resume ``run_dir`` under, and its absolute URL; nothing is written.

    Without ``config`` the run's own config.yaml is used. Either way the result must equal the
    config the run started with, except keys named in ``allow_changes`` (fedray.checkpoint)."""
    from fedray.checkpoint import check_same_config, masked_keys, saved_config

    url = absolute_url(run_dir)
    saved = saved_config(url)
    if config is None:
        masked = masked_keys(saved)
        if masked:
            raise FedrayError(f"--resume {url}: its config.yaml has masked credentials in "
                              f"{', '.join(masked)}; give the job again: fedray run JOB.yaml "
                              f"--resume {url}")
        config = saved
    cfg = prepare(config, overrides, client_data, model_fn, test_data)
    cfg = OmegaConf.merge(cfg, {"output": {"dir": url}})
    OmegaConf.set_readonly(cfg, True)
    check_same_config(url, saved, cfg, allow_changes)
    return cfg, url


def _write_failure(url: str, exc: OSError, kept: bool) -> FedrayError:
    """A write that failed, as one line that says what is safe: nothing, for a run removed
    before its first round; otherwise its last checkpoint, whole whatever the failed write
    was (checkpoints are replaced atomically), and how to continue from it."""
    reason = f"writing the run failed: {exc.strerror or type(exc).__name__}"
    if not kept:
        return key_error("output.dir", f"{reason}; nothing was kept in {url}")
    from fedray.checkpoint import read_checkpoint

    try:
        ckpt = read_checkpoint(url)
        where = (f"its checkpoint after round {ckpt.round} is intact" if ckpt is not None
                 else "it has no checkpoint yet (a resume starts from round 1)")
    except (FedrayError, OSError):
        where = "its checkpoint could not be read back"
    return key_error("output.dir", f"{reason}; {where}; when the storage is fixed, continue "
                     f"with: fedray run --resume {url}")


def _unwrap_remote_error(exc: BaseException) -> BaseException:
    """The user-facing cause behind a Ray task/actor error, if there is one."""
    cause = getattr(exc, "cause", None)
    while cause is not None:
        if isinstance(cause, FedrayError):
            return FedrayError(str(cause.args[0]) if cause.args else str(cause))
        cause = getattr(cause, "cause", None) or cause.__cause__
    return exc


def _placement() -> tuple[Any, dict[str, float]]:
    """Where the driver goes, and the resources its workers may use.

    Inside a placement group that captures child tasks -- a Ray Tune trial of fedray.sweep --
    the driver and its workers live in the group's bundles, and only those count. Otherwise
    the driver stays on this node (it reads the run's local inputs) and the workers may use
    the whole cluster."""
    import ray
    from ray.util import scheduling_strategies as ss

    pg = ray.util.get_current_placement_group()
    if pg is not None:
        resources: dict[str, float] = {}
        for bundle in pg.bundle_specs:
            for k, v in bundle.items():
                resources[k] = resources.get(k, 0.0) + v
        return ss.PlacementGroupSchedulingStrategy(
            pg, placement_group_capture_child_tasks=True), resources
    node = ray.get_runtime_context().get_node_id()
    return ss.NodeAffinitySchedulingStrategy(node, soft=False), ray.cluster_resources()


def run(config: ConfigSource | None = None, model_fn: Callable[[], nn.Module] | None = None,
        client_data: Mapping[Any, tuple[Any, Any]] | None = None,
        test_data: tuple[Any, Any] | None = None, *, overrides: list[str] | tuple = (),
        progress: Callable[[dict], None] | None = None, resume: str | None = None,
        allow_changes: list[str] | tuple = ()) -> RunResult:
    """Run a federated job to the end.

    config: a YAML path, a dict, a DictConfig or a FedrayConfig; ``overrides`` are
    ``key=value`` strings applied on top. model_fn: a zero-argument factory of a
    torch.nn.Module (default: ``model.name``). client_data: ``{client_id: (x, y)}`` arrays
    to train on instead of ``data.partition``; test_data: a central ``(x, y)`` test set.
    progress: called with each round's metrics as they arrive (``output.mlflow`` logs them
    to MLflow too). resume: a run directory to
    continue from its last checkpoint (``config`` then defaults to its config.yaml and must
    not differ from it, except keys listed in ``allow_changes``: docs/fault_tolerance.md).

    The run holds its directory for its whole length (fedray.storage.RunClaim); a new run
    that fails before its first round leaves nothing behind, and one whose writes fail later
    (a full disk) says which checkpoint is intact.
    """
    if resume is not None:
        cfg, url = prepare_resume(resume, config, overrides, allow_changes, client_data,
                                  model_fn, test_data)
    else:
        cfg = prepare(config, overrides, client_data, model_fn, test_data)
        url = absolute_url(cfg.output.dir)
    manifest = None
    if client_data is None and cfg.data.partition != "synthetic":
        from fedray.store import read_manifest, verify_store

        manifest = read_manifest(cfg.data.partition)  # read once, for checks and the source
        if cfg.data.verify:
            verify_store(cfg.data.partition, manifest)  # a corrupt shard fails now, not later
    claim = RunClaim(url)  # no other run writes here while this one does
    claim.acquire(new=resume is None)
    metrics: list[dict] = []
    try:
        result = _run_claimed(cfg, url, model_fn, client_data, test_data, manifest, progress,
                              resume, metrics)
    except BaseException as exc:
        kept = resume is not None or bool(metrics)
        if not kept:  # nothing worth keeping: the same command can run again, and finds
            claim.discard()  # the directory as it was
        storage = storage_failure(exc)
        if storage is not None:
            raise _write_failure(url, storage, kept) from None
        raise
    finally:
        claim.release()
    return result


def _run_claimed(cfg: DictConfig, url: str, model_fn: Callable | None,
                 client_data: Mapping | None, test_data: tuple | None, manifest: dict | None,
                 progress: Callable[[dict], None] | None, resume: str | None,
                 metrics: list[dict]) -> RunResult:
    """The run, once its directory is claimed: Ray, the driver and its workers, every round
    (appended to ``metrics`` as they arrive)."""
    import ray

    from fedray.data.source import build_source
    from fedray.driver import Driver
    from fedray.models import build_model
    from fedray.pool import launch_workers, pool_size
    from fedray.runtime import ray_session

    with ray_session(cfg):
        source = build_source(cfg, client_data, test_data, manifest)
        make_model = model_fn or functools.partial(
            build_model, cfg.model.name, tuple(source.input_shape), source.num_classes)
        strategy, resources = _placement()
        num_workers = pool_size(cfg, resources)
        driver_cls = ray.remote(Driver).options(num_cpus=0, scheduling_strategy=strategy)
        driver = driver_cls.remote()
        w = cfg.runtime.worker  # its workers start beside it; it configures them in setup()
        launched = launch_workers(num_workers, w.num_cpus, w.num_gpus)
        summary: dict = {}
        with contextlib.ExitStack() as stack:
            try:  # from here on, the driver and the launched workers end with the run
                callbacks = [progress] if progress is not None else []
                if cfg.output.mlflow:
                    from fedray.mlflow_tracking import mlflow_run

                    callbacks.append(stack.enter_context(mlflow_run(cfg, url)))
                notes = ray.get(driver.setup.remote(
                    OmegaConf.to_container(cfg, resolve=True), source, make_model, num_workers,
                    url, resume is not None, launched))
                for note in notes:
                    _note(note)
                for ref in driver.run.remote():
                    item = ray.get(ref)
                    if "summary" in item:
                        summary = item["summary"]
                        break
                    metrics.append(item)
                    for callback in callbacks:
                        callback(item)
                weights = ray.get(driver.state_dict.remote())
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as exc:
                raise _unwrap_remote_error(exc) from None
            finally:
                for actor in (driver, *launched):  # replacement workers go with the driver
                    ray.kill(actor)
    return RunResult(weights=weights, metrics=metrics, summary=summary, run_dir=url, config=cfg)


def _note(text: str) -> None:
    """A line the driver has for the user (why clients train one after another, say),
    printed here rather than in the driver's process, where Ray would prefix it with the
    actor's name and pid."""
    print(f"fedray: {text}", file=sys.stderr, flush=True)
