"""``fedray.run``: the one Python entry point, shared by the CLI, sweeps and tests.

    result = fedray.run("jobs/quickstart.yaml", overrides=["rounds=5"])
    result = fedray.run({"rounds": 3}, model_fn=MyNet, client_data={0: (x0, y0), ...},
                        test_data=(x_test, y_test))
    result = fedray.run(resume="runs/a")  # continue a killed run from its checkpoint
    result = fedray.run(job, callbacks=[MyCallback()])  # fedray.tracking.callbacks

It validates the whole config before Ray starts, runs the driver actor to the end, one round
at a time, calling the run's callbacks in this process after each, and returns the final
weights (a state_dict) and the per-round metrics. With ``runtime.backend: inline`` the
driver and its workers are objects of this process instead, and Ray is not used at all
(fedray.runtime.inline); ``auto``, the default, starts that way and hands a long run to a
driver actor on Ray after a round (fedray.runtime.handover).

Most imports are inside the functions that use them: a job's errors (a bad key, a missing
file, a store that fails its checks) are reported before torch, Ray, numpy or pyarrow load
(start-up time: half a second instead of several), and `import fedray` stays as light.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from fedray.algorithms.registry import canonical
from fedray.config import ConfigSource, FedrayConfig, load_config, typed, validate
from fedray.errors import DivergedError, FedrayError, PartError, key_error
from fedray.state.redact import mask
from fedray.state.storage import RunClaim, absolute_url, filesystem, storage_failure
from fedray.tracking.callbacks import (
    Callback,
    Callbacks,
    FunctionCallback,
    RunInfo,
    check,
    from_config,
)

if TYPE_CHECKING:  # torch is imported where a run starts: a bad config fails without it
    import torch
    from torch import nn

    from fedray.runtime.handover import HandOver


@dataclass
class RunResult:
    weights: dict[str, torch.Tensor]  # final global model as a state_dict
    metrics: list[dict]  # one dict per round, as in metrics.jsonl
    summary: dict  # as in summary.json
    run_dir: str  # where config.yaml, metrics.jsonl, summary.json and the weights are
    config: DictConfig  # the resolved configuration


_SAID: set[str] = set()  # deprecation notes this process has printed


def with_algorithm(cfg: DictConfig, notes: list[str] | None = None) -> DictConfig:
    """``cfg`` with its ``algorithm`` section as a run records it (registry.canonical): the
    part keys as given, and one section per part with every hyper-parameter, defaults
    filled; legacy flat keys (``algorithm.prox_mu``) gone, read into the section they name
    where a part uses it (each such read adds a line to ``notes``)."""
    algorithm = canonical(cfg.algorithm, cfg.server, notes, client_lr=cfg.client.lr)
    out = OmegaConf.merge(cfg, {})  # a writable copy
    OmegaConf.set_readonly(out, False)
    for key in [k for k in out.algorithm if k not in algorithm]:
        out.algorithm.pop(key)
    out = OmegaConf.merge(out, {"algorithm": algorithm})
    OmegaConf.set_readonly(out, True)
    return out


def prepare(config: ConfigSource | None, overrides: list[str] | tuple = (),
            client_data: Mapping | None = None, model_fn: Callable | None = None,
            test_data: tuple | None = None) -> DictConfig:
    """Load and validate a job; nothing is started or written."""
    _check_arguments(model_fn, client_data, test_data)
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
    manifest = None  # a partition store's, read below
    train_counts = None  # synthetic writers have at least data.synthetic.min_examples >= 1
    if client_data is not None:
        from fedray.data.client_source import client_splits

        population = len(client_data)
        splits = [client_splits(v, k) for k, v in client_data.items()]
        train_counts = [len(train[1]) for train, _ in splits]
        has_client_test = any(test is not None for _, test in splits)
    elif cfg.data.partition == "synthetic":
        population = cfg.data.synthetic.num_clients
        has_client_test = cfg.data.synthetic.test_fraction > 0
    else:  # a partition store: make the path absolute so every process means the same place
        from fedray.data.store.format import read_manifest
        from fedray.data.store.reader import client_index

        url = absolute_url(cfg.data.partition)
        filesystem(url, "data.partition", durable=True)  # workers read it, not this process
        manifest = read_manifest(url)
        index = client_index(url, manifest)  # mapped, not read: a view of the counts below
        population, has_client_test = manifest["num_clients"], "test" in index.splits
        train_counts = index.counts("train")
        cfg = OmegaConf.merge(cfg, {"data": {"partition": url}})
        OmegaConf.set_readonly(cfg, True)
    validate(cfg, population, custom_model=model_fn is not None)
    if cfg.clock.enabled:
        cfg = _clock_traces(cfg)
    notes: list[str] = []
    cfg = with_algorithm(cfg, notes)
    for note in notes:
        if note not in _SAID:  # fedray run checks the job, then fedray.run does again
            _SAID.add(note)
            _note(note)
    if train_counts is not None:  # clients without examples may be sampled (they count for
        # nothing), but one forced into every round is a mistake
        empty = [a for a in cfg.sampling.always if train_counts[a] == 0]
        if empty:
            raise key_error("sampling.always", f"client {empty[0]} has no training examples, "
                            "so it can never contribute", list(cfg.sampling.always))
    if cfg.output.mlflow:
        from fedray.tracking.mlflow_tracking import require_mlflow

        require_mlflow()
    if cfg.output.wandb:
        from fedray.tracking.wandb_tracking import require_wandb

        require_wandb()
    if cfg.eval.federated_clients and not has_client_test:
        raise key_error("eval.federated_clients", "this data has no per-client test split; set "
                        "it to 0, or give in-memory clients as {'train': (x, y), "
                        "'test': (x, y)}", cfg.eval.federated_clients)
    _check_parts_against_model(cfg, client_data, model_fn, test_data, manifest, population)
    return cfg


def _check_arguments(model_fn: Any, client_data: Any, test_data: Any) -> None:
    """fedray.run's positional arguments by type, before any of them is used: a list of
    overrides passed where model_fn goes (``fedray.run(job, ["rounds=1"])``) would
    otherwise fail deep in the driver's setup as "'list' object is not callable"."""

    def hint(value: Any) -> str:  # strings where data or a model goes: overrides, misplaced
        strings = isinstance(value, str) or (isinstance(value, list | tuple) and value
                                             and all(isinstance(v, str) for v in value))
        return " (overrides go by keyword: fedray.run(job, overrides=[...]))" if strings else ""

    if model_fn is not None and not callable(model_fn):
        raise FedrayError("model_fn must be a callable that returns a torch.nn.Module, not a "
                          f"{type(model_fn).__name__}{hint(model_fn)}")
    if client_data is not None and not isinstance(client_data, Mapping):
        raise FedrayError("client_data must be a mapping of client id -> (x, y) or "
                          "{'train': (x, y), 'test': (x, y)}, not a "
                          f"{type(client_data).__name__}{hint(client_data)}")
    if test_data is not None and not (isinstance(test_data, tuple | list)
                                      and len(test_data) == 2):
        size = f" of {len(test_data)}" if isinstance(test_data, tuple | list) else ""
        raise FedrayError(f"test_data must be a pair (x, y), not a "
                          f"{type(test_data).__name__}{size}{hint(test_data)}")


def _check_parts_against_model(cfg: DictConfig, client_data: Mapping | None,
                               model_fn: Callable | None, test_data: tuple | None,
                               manifest: dict | None, population: int) -> None:
    """The algorithm's parts against the job's model (a head selector that selects
    nothing) and round size (Krum's n > 2f + 2), and the adversary against the parts,
    before Ray starts: the model built only when a part checks it
    (registry.check_against_model). A part whose clients each have their own model, in a
    job that never evaluates clients, gets a note saying so."""
    from fedray.algorithms.base import RoundPlan, evaluates_own_model
    from fedray.algorithms.registry import check_against_model, check_plan, resolve
    from fedray.runtime.adversary import resolve as resolve_adversary
    from fedray.runtime.participation import check_selector

    job = typed(cfg)
    resolved = resolve(job.algorithm, job.server)
    sm = job.sampling
    check_plan(resolved.aggregator, RoundPlan(
        seed=cfg.seed, population=population, clients_per_round=sm.clients_per_round,
        sampling=sm.mode, rounds=cfg.rounds, num_params=0, dropout=sm.dropout,
        always=tuple(sm.always)))
    check_selector(resolved.names["selector"], resolved.selector, sm)
    adversary = resolve_adversary(job.adversary, job.seed, population,
                                  trusted=tuple(resolved.aggregator.trusted))
    if adversary is not None:  # omniscient attacks need the individual path, before Ray
        adversary.check_parts(resolved.aggregator, resolved.names["aggregator"],
                              tuple(resolved.stage_names))
    if evaluates_own_model(resolved.client) and not cfg.eval.federated_clients:
        note = (f"algorithm.client {resolved.names['client']} gives every client a model of "
                "its own, which only federated evaluation measures; with "
                "eval.federated_clients=0 the metrics are the global model's alone (set "
                "eval.federated_clients=K)")
        if note not in _SAID:
            _SAID.add(note)
            _note(note)

    def make_model() -> Any:
        from fedray.core.models import source_model_factory

        source = _build_source(job, client_data, test_data, manifest,
                               in_process=job.runtime.backend == "inline")
        return (model_fn or source_model_factory(job.model, source))()

    check_against_model(resolved, make_model)


def _clock_traces(cfg: DictConfig) -> DictConfig:
    """The clock's trace files as absolute URLs (the driver, another process, reads them),
    each read and checked now, so a bad trace fails before anything starts."""
    from fedray.timing.rounds import availability_model, device_model

    used = {"devices": cfg.clock.devices.source == "trace",
            "availability": cfg.clock.availability.model == "trace"}
    urls = {}
    for section in [s for s, on in used.items() if on]:
        url = absolute_url(cfg.clock[section].trace)
        fs, path = filesystem(url, f"clock.{section}.trace")
        if not fs.exists(path):
            raise key_error(f"clock.{section}.trace", f"{url} does not exist",
                            cfg.clock[section].trace)
        urls[section] = {"trace": url}
    if urls:
        cfg = OmegaConf.merge(cfg, {"clock": urls})
        OmegaConf.set_readonly(cfg, True)
    device_model(cfg.clock, cfg.seed)
    availability_model(cfg.clock, cfg.seed)
    return cfg


def prepare_resume(run_dir: str, config: ConfigSource | None = None,
                   overrides: list[str] | tuple = (), allow_changes: list[str] | tuple = (),
                   client_data: Mapping | None = None, model_fn: Callable | None = None,
                   test_data: tuple | None = None) -> tuple[DictConfig, str]:
    """The config to resume ``run_dir`` under, and its absolute URL; nothing is written.

    Without ``config`` the run's own config.yaml is used. Either way the result must equal the
    config the run's checkpoint records (config.yaml's, without one), except keys named in
    ``allow_changes``, and the checkpoint must be this run's (fedray.state.checkpoint.
    check_resume)."""
    from fedray.state.checkpoint import check_resume, masked_keys, saved_config

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
    for note in check_resume(url, _recorded(saved), cfg, allow_changes):
        if note not in _SAID:  # fedray run checks the resume, then fedray.run does again
            _SAID.add(note)
            _note(note)
    return cfg, url


def _recorded(saved: DictConfig) -> DictConfig:
    """A run's config.yaml with its algorithm section as this fedray records one (a run of
    an older fedray has the legacy flat keys), so that only real differences count."""
    from fedray.config import load_config

    try:
        return with_algorithm(load_config(saved))
    except FedrayError:
        return saved  # the comparison names what differs


def _write_failure(url: str, exc: OSError, kept: bool) -> FedrayError:
    """A write that failed, as one line that says what is safe: nothing, for a run removed
    before its first round; otherwise its last checkpoint, whole whatever the failed write
    was (checkpoints are replaced atomically), and how to continue from it."""
    reason = f"writing the run failed: {exc.strerror or type(exc).__name__}"
    if not kept:
        return key_error("output.dir", f"{reason}; nothing was kept in {url}")
    where = _checkpoint_left(url)
    return key_error("output.dir", f"{reason}; {where}; when the storage is fixed, continue "
                     f"with: {resume_command(url)}")


def _ray_failure(url: str, exc: FedrayError, kept: bool) -> FedrayError:
    """Ray failing under a run (its raylet or GCS server dead, the driver actor's process
    killed: fedray.runtime.session.RayFailure) as one line: what died, and what is safe --
    nothing, for a run removed before its first round; otherwise the run directory's last
    checkpoint and the exact command that continues from it."""
    if not kept:
        return FedrayError(f"{exc}; nothing was kept in {url}: run the same command again")
    return FedrayError(f"{exc}; {_checkpoint_left(url)}; continue with: "
                       f"{resume_command(url)}")


def resume_command(url: str) -> str:
    """The command that continues the run at ``url``, as the user would type it: ``fedray
    submit --resume`` when this run is a job ``fedray submit`` sent (its log is read on
    another machine), else ``fedray run --resume``."""
    from fedray.cluster.job_files import SUBMITTED_ENV

    verb = "submit" if os.environ.get(SUBMITTED_ENV) else "run"
    return f"fedray {verb} --resume {url}"


def _checkpoint_left(url: str) -> str:
    """What a failed run leaves to resume from, in words: its last checkpoint's round."""
    from fedray.state.checkpoint import read_checkpoint

    try:
        ckpt = read_checkpoint(url)
    except (FedrayError, OSError):
        return "its checkpoint could not be read back"
    return (f"its checkpoint after round {ckpt.round} is intact" if ckpt is not None
            else "it has no checkpoint yet (a resume starts from round 1)")


def _unwrap_remote_error(exc: BaseException) -> BaseException:
    """The user-facing cause behind a Ray task/actor error, if there is one."""
    cause = getattr(exc, "cause", None)
    while cause is not None:
        if isinstance(cause, DivergedError):  # its own type: a caller may catch it alone
            return DivergedError(str(cause), cause.round, cause.checkpoint)
        if isinstance(cause, PartError):  # with the part's traceback, for --debug
            return PartError(str(cause.args[0]) if cause.args else str(cause), cause.detail)
        if isinstance(cause, FedrayError):
            return FedrayError(str(cause.args[0]) if cause.args else str(cause))
        cause = getattr(cause, "cause", None) or cause.__cause__
    return exc


def _placement() -> tuple[Any, dict[str, float]]:
    """Where the driver goes, and the resources its workers may use.

    Inside a placement group that captures child tasks -- a Ray Tune trial of
    fedray.cluster.sweep -- the driver and its workers live in the group's bundles, and only
    those count. Otherwise
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
        progress: Callable[[dict], None] | Callback | None = None,
        resume: str | None = None, allow_changes: list[str] | tuple = (),
        callbacks: list[Callback] | tuple = ()) -> RunResult:
    """Run a federated job to the end.

    config: a YAML path, a dict, a DictConfig or a FedrayConfig; ``overrides`` are
    ``key=value`` strings applied on top. model_fn: a zero-argument factory of a
    torch.nn.Module (default: ``model.name``). client_data: ``{client_id: (x, y)}`` arrays
    to train on instead of ``data.partition``, or ``{client_id: {"train": (x, y), "test":
    (x, y)}}`` where clients hold out their own test data (federated evaluation,
    eval.federated_clients); test_data: a central ``(x, y)`` test set.
    progress: called with each round's metrics as they arrive (a function, or a Callback).
    callbacks: fedray.tracking.callbacks.Callback instances, called in this process after those of
    ``output.callbacks``; ``on_round_end`` returning STOP ends the run after its round.
    resume: a run directory to
    continue from its last checkpoint (``config`` then defaults to its config.yaml and must
    not differ from it, except keys listed in ``allow_changes``: docs/fault_tolerance.md).

    The run holds its directory for its whole length (fedray.state.storage.RunClaim); a new run
    that fails before its first round leaves nothing behind, and one whose writes fail later
    (a full disk) says which checkpoint is intact.
    """
    given = check(callbacks)
    if resume is not None:
        cfg, url = prepare_resume(resume, config, overrides, allow_changes, client_data,
                                  model_fn, test_data)
    else:
        cfg = prepare(config, overrides, client_data, model_fn, test_data)
        url = absolute_url(cfg.output.dir)
    hooks = run_callbacks(cfg, progress, given)  # a class that cannot start fails now
    manifest = None
    if client_data is None and cfg.data.partition != "synthetic":
        from fedray.data.store.format import read_manifest
        from fedray.data.store.verify import verify_store

        manifest = read_manifest(cfg.data.partition)  # read once, for checks and the source
        if cfg.data.verify:
            verify_store(cfg.data.partition, manifest)  # a corrupt shard fails now, not later
    claim = RunClaim(url)  # no other run writes here while this one does
    claim.acquire(new=resume is None)
    metrics: list[dict] = []
    try:
        result = _run_claimed(cfg, url, model_fn, client_data, test_data, manifest, hooks,
                              resume, metrics)
    except BaseException as exc:
        kept = resume is not None or bool(metrics)
        if not kept:  # nothing worth keeping: the same command can run again, and finds
            claim.discard()  # the directory as it was
        storage = storage_failure(exc)
        if storage is not None:
            raise _write_failure(url, storage, kept) from None
        from fedray.runtime.session import RayFailure

        if isinstance(exc, RayFailure):
            raise _ray_failure(url, exc, kept) from None
        if isinstance(exc, KeyboardInterrupt) and kept and not str(exc):
            # Ctrl-C, SIGTERM, `fedray stop`: what is kept, and the command that continues
            raise type(exc)(f"{_checkpoint_left(url)}; continue with: "
                            f"{resume_command(url)}") from None
        raise
    finally:
        claim.release()
    return result


def run_callbacks(cfg: DictConfig, progress: Callable[[dict], None] | Callback | None = None,
                  given: list[Callback] | tuple = ()) -> Callbacks:
    """A run's callbacks, in the order they are called: fedray's own writers
    (``output.tensorboard``, ``output.mlflow``, ``output.wandb``) first, so that a round is
    recorded before a user's callback can fail or stop the run; then ``progress``; then
    ``output.callbacks``; then ``fedray.run(callbacks=...)``."""
    items: list[Callback] = []
    if cfg.output.tensorboard:
        from fedray.tracking.tensorboard import TensorBoardCallback

        items.append(TensorBoardCallback())
    if cfg.output.mlflow:
        from fedray.tracking.mlflow_tracking import MLflowCallback

        items.append(MLflowCallback())
    if cfg.output.wandb:
        from fedray.tracking.wandb_tracking import WandbCallback

        items.append(WandbCallback())
    if progress is not None:
        items.append(progress if isinstance(progress, Callback) else FunctionCallback(progress))
    return Callbacks([*items, *from_config(cfg.output.callbacks), *given])


def _drive(call: Callable[..., Any], cfg: DictConfig, url: str, callbacks: Callbacks,
           metrics: list[dict], handover: HandOver | None = None,
           carried: dict | None = None) -> tuple[dict | None, dict | None, dict | None]:
    """The rounds, once the driver is set up: ``call(method, *args)`` runs one of its
    methods (on the actor, or in this process), one round at a time, with the callbacks
    after each. Returns the summary and the final weights; ``metrics`` gets the rounds.

    ``handover`` (runtime.backend auto, in this process): after a round it may decide that
    another driver, on Ray, runs the rest; then the summary and weights are None and the
    third value is what that driver's ``begin`` takes as ``carried`` (the run's callbacks
    have had their start, and get their end from that driver's rounds)."""
    start = call("begin", carried)
    try:
        if carried is None:
            callbacks.run_start(RunInfo(cfg, url, start["resumed_from"],
                                        start["past_metrics"]))
        stopped = None
        if start.get("stopped_by"):  # resumed past a privacy budget: no round may run
            stopped = start["start_round"] - 1
        for r in range(start["start_round"], cfg.rounds + 1 if stopped is None else 0):
            t0 = time.perf_counter()
            m, weights = call("run_round", r, callbacks.needs_weights)
            metrics.append(m)
            if m.get("diverged"):  # guard.non_finite=warn: said once, the run goes on
                _note(f"{m['diverged']}; guard.non_finite=warn: the run goes on, and "
                      "nothing non-finite is written to its directory")
            # a callback, or an update stage (a privacy budget spent: m["stopped_by"])
            if (callbacks.round_end(r, m, weights) or m.get("stopped_by")) and r < cfg.rounds:
                stopped = r  # the last round needs no stopping: the run ends normally
                break
            if handover is not None and handover.due(r, time.perf_counter() - t0):
                passed = call("hand_over", r)
                if passed is not None:
                    return None, None, passed
                handover = None  # no finite checkpoint to resume from: the run stays here
        summary = call("finish", stopped)
        weights = call("state_dict")
    except BaseException as exc:
        callbacks.run_failed(exc)
        raise
    callbacks.run_end(summary)
    return summary, weights, None


def _run_claimed(cfg: DictConfig, url: str, model_fn: Callable | None,
                 client_data: Mapping | None, test_data: tuple | None, manifest: dict | None,
                 callbacks: Callbacks, resume: str | None, metrics: list[dict]) -> RunResult:
    """The run, once its directory is claimed: Ray, the driver and its workers, every round
    (appended to ``metrics`` as they arrive). ``runtime.backend: auto`` starts in this
    process and hands the run to Ray if it is long (fedray.runtime.handover)."""
    from fedray.core.models import source_model_factory

    job = typed(cfg)  # the sections each part of the run is handed
    backend = job.runtime.backend
    carried = None
    if backend == "auto":
        from fedray.runtime.handover import ray_from_the_start

        backend = "ray" if ray_from_the_start(job.runtime) else "auto"
    if backend in ("inline", "auto"):
        source = _build_source(job, client_data, test_data, manifest, in_process=True)
        make_model = model_fn or source_model_factory(job.model, source)
        summary, weights, carried = _run_inline(cfg, url, source, make_model, callbacks,
                                                resume, metrics, auto=backend == "auto")
        if carried is None:
            return RunResult(weights=weights, metrics=metrics, summary=summary, run_dir=url,
                             config=cfg)
    try:
        summary, weights = _run_ray(cfg, url, model_fn, client_data, test_data, manifest,
                                    callbacks, resume, metrics, carried)
    except BaseException as exc:
        # after a hand-over the callbacks have seen the run start even if Ray then fails to;
        # run_failed tells started callbacks once, so one _drive told already hears nothing
        callbacks.run_failed(exc)
        raise
    return RunResult(weights=weights, metrics=metrics, summary=summary, run_dir=url, config=cfg)


def _run_ray(cfg: DictConfig, url: str, model_fn: Callable | None, client_data: Mapping | None,
             test_data: tuple | None, manifest: dict | None, callbacks: Callbacks,
             resume: str | None, metrics: list[dict], carried: dict | None = None
             ) -> tuple[dict, dict]:
    """The driver actor and its workers on Ray; ``carried``: the run's first rounds ran in
    this process (runtime.backend auto), and the driver resumes from their checkpoint with
    the same count of workers where the cluster fits it."""
    import ray

    from fedray.algorithms.registry import resolve
    from fedray.core.models import source_model_factory
    from fedray.runtime import session
    from fedray.runtime.driver import Driver
    from fedray.runtime.pool import launch_workers, pool_size
    from fedray.runtime.session import ray_session

    job = typed(cfg)
    with ray_session(job.runtime):
        source = _build_source(job, client_data, test_data, manifest)
        make_model = model_fn or source_model_factory(job.model, source)
        strategy, resources = _placement()
        cpr = job.sampling.clients_per_round
        num_workers = pool_size(job.runtime, cpr, resources)
        if carried is not None and carried["num_workers"] != num_workers:
            try:
                num_workers = pool_size(job.runtime, cpr, resources, carried["num_workers"])
            except FedrayError:
                _note(f"runtime.backend=auto: Ray has room for {num_workers} workers, not the "
                      f"{carried['num_workers']} the first rounds ran with; float64 sums may "
                      "differ in their last bits from a run on one backend")
        driver_cls = ray.remote(Driver).options(num_cpus=0, scheduling_strategy=strategy)
        driver = driver_cls.remote()
        w = job.runtime.worker  # its workers start beside it; it configures them in setup()
        launched = launch_workers(num_workers, w.num_cpus, w.num_gpus)

        def call(method: str, *args: Any) -> Any:
            try:  # session.get: a private Ray that dies meanwhile ends the wait at once
                return session.get(getattr(driver, method).remote(*args))
            except ray.exceptions.RayError as exc:
                cause = _unwrap_remote_error(exc)
                if isinstance(cause, FedrayError) or isinstance(
                        exc, ray.exceptions.RayTaskError):
                    raise cause from None
                # the driver's process is gone: killed, OOM-killed, its node lost
                raise session.actor_lost(exc, "the driver actor") from None

        try:  # from here on, the driver and the launched workers end with the run
            notes = call("setup", OmegaConf.to_container(cfg, resolve=True), source,
                         make_model, num_workers, url,
                         resume is not None or carried is not None, launched,
                         resolve(job.algorithm, job.server))
            said = carried["notes"] if carried is not None else ()
            for note in notes:
                if note not in said:  # the first rounds' driver said it already
                    _note(note)
            if carried is not None:
                carried = {k: v for k, v in carried.items() if k not in ("notes",
                                                                          "num_workers")}
            summary, weights, _ = _drive(call, cfg, url, callbacks, metrics, carried=carried)
        finally:  # replacement workers go with the driver
            session.kill_actors((driver, *launched))
    return summary, weights


def _run_inline(cfg: DictConfig, url: str, source: Any, make_model: Callable,
                callbacks: Callbacks, resume: str | None, metrics: list[dict],
                auto: bool = False) -> tuple[dict | None, dict | None, dict | None]:
    """``runtime.backend: inline``: the Driver class and ``runtime.num_workers`` (default
    1) workers as objects of this process (fedray.runtime.inline), no Ray call on the way. The
    driver and the workers set torch's thread count and global seed, as they do in their
    own processes; this process gets both back when the run ends.

    ``auto``: runtime.backend auto's first rounds, with the workers a Ray run would have
    (``runtime.num_workers``, or as many as this machine's CPUs fit), a part's error in one
    line as on Ray, and the hand-over rule (fedray.runtime.handover); returns what the
    Ray driver carries on with when the rule hands the run over (summary and weights
    then None)."""
    import torch

    from fedray.algorithms.registry import resolve
    from fedray.runtime.driver import Driver

    job = typed(cfg)
    handover = None
    if auto:
        from fedray.runtime.handover import HandOver, local_resources
        from fedray.runtime.pool import pool_size

        num_workers = pool_size(job.runtime, job.sampling.clients_per_round,
                                local_resources(job.runtime))
        handover = HandOver(cfg.rounds, job.runtime.auto_inline_s, _note)
    else:
        num_workers = job.runtime.num_workers or 1
        if job.runtime.worker.num_gpus > 0:
            _note("runtime.backend=inline: the workers train on this process's CPU; "
                  "runtime.worker.num_gpus is not used")
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=[]):
            driver = Driver()
            notes = driver.setup(OmegaConf.to_container(cfg, resolve=True), source, make_model,
                                 num_workers, url, resume is not None, None,
                                 resolve(job.algorithm, job.server), in_process=True)
            for note in notes:
                _note(note)
            summary, weights, carried = _drive(
                lambda method, *args: getattr(driver, method)(*args), cfg, url, callbacks,
                metrics, handover)
            if carried is not None:
                carried |= {"notes": list(notes), "num_workers": num_workers}
            return summary, weights, carried
    finally:
        torch.set_num_threads(threads)


def _build_source(job: FedrayConfig, client_data: Mapping | None, test_data: tuple | None,
                  manifest: dict | None, in_process: bool = False) -> Any:
    """The run's client source, from its ``data`` section (or ``client_data``);
    ``in_process``: for workers that are objects of this process."""
    from fedray.data.client_source import build_source

    return build_source(job.data, client_data, test_data, manifest, in_process=in_process)


def _note(text: str) -> None:
    """A line the driver has for the user (why clients train one after another, say),
    printed here rather than in the driver's process, where Ray would prefix it with the
    actor's name and pid."""
    print(f"fedray: {mask(text)}", file=sys.stderr, flush=True)
