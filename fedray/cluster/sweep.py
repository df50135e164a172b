"""``fedray sweep``: many fedray runs over a grid or a random sample of config values, on Ray Tune.

A sweep is a job plus the config keys to vary (``sampling.clients_per_round`` in {10, 50, 100,
500} x ``seed`` in {0, 1, 2}, say). Each trial is one ordinary fedray run -- its own driver and
worker actors, reserved together through the trial's placement group (an empty bundle for the
trial's own process, one bundle per worker), so trials never compete for a worker's CPUs or
GPU share and an autoscaler sees exactly what a waiting trial needs. Trials read the job's
partition store in place. Every round's metrics go to Tune (for ASHA early stopping and Tune's
own logs) and to the trial's run directory ``SWEEP_DIR/trials/<trial id>/`` (metrics.jsonl,
TensorBoard events, checkpoints), named by its swept values (``trial_name``: e.g.
``lr=0.1,seed=0``, which TensorBoard shows as the run's name). After the sweep,
``results.csv`` (one row per trial) and
a report (``report/``: a curve per setting with a band over seeds, fedray.tracking.report)
are written.

fedray, not Tune, decides the trials (``plan_trials``: their names and values, from the sweep
alone) and records each one's status in ``trials.json`` as it starts and ends. A sweep killed
halfway continues with ``fedray sweep --resume SWEEP_DIR``, which reads only fedray's own
files (``sweep.yaml``, ``trials.json``, the trials' run directories: YAML, JSON, safetensors),
never Tune's pickled state (``tune/``: unpickling a file can run any code in it, and a sweep
directory may sit on shared storage): trials that finished or that the scheduler stopped stay
as they are, and each other trial resumes its run directory from its last fedray checkpoint
rather than from round 1.

A job may name the user's own algorithm parts by import path (``examples.qffl:QFedAvg``).
Tune starts each trial in a process of its own, in a directory of its own, maybe on another
node, where the caller's modules are not on the import path: the modules' files travel with
the trial's arguments (``pack_modules``, through Ray's object store, so to any node) and each
trial puts them on its import path before its run imports the job's parts.

Layout of SWEEP_DIR (any fsspec URL Tune and fedray can both write: a local path, s3://, gs://):
``sweep.yaml`` (the sweep with its job inlined, so a resume needs no other file),
``trials.json`` (the planned trials and their status), ``tune/`` (Tune's logs and state,
written, never read), ``trials/<trial name>/`` (fedray run directories), ``results.csv`` and
``report/``.
"""

from __future__ import annotations

import contextlib
import csv
import importlib
import io
import itertools
import json
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import fsspec
import numpy as np
from omegaconf import DictConfig, ListConfig, OmegaConf

from fedray.algorithms.registry import resolve
from fedray.api import prepare, run
from fedray.cluster.submit import (
    MAX_MODULES_MB,
    PART_KEYS,
    algorithm_refs,
    job_refs,
    model_refs,
    user_modules,
)
from fedray.config import check_interpolations, load_config, load_structured, typed
from fedray.errors import ConfigError, FedrayError
from fedray.runtime.pool import pool_size
from fedray.runtime.session import ray_session
from fedray.state.checkpoint import masked_keys
from fedray.state.client_state_disk import over_budget, run_estimate, size_text
from fedray.state.redact import mask
from fedray.state.run_dir import read_metrics
from fedray.state.storage import LOCK_FILE, RunClaim, absolute_url, filesystem
from fedray.state.sweep_dir import (  # noqa: F401 (the layout, re-exported for the CLI)
    ERROR,
    FINISHED,
    INTERRUPTED,
    NOT_STARTED,
    PLAN_FILE,
    REPORT_DIR,
    RESULTS_FILE,
    RUNNING,
    STOPPED,
    SUMMARY_FILE,
    SWEEP_FILE,
    TRIALS_DIR,
    TUNE_DIR,
)
from fedray.tracking.report import build_report

DISTRIBUTIONS = ("uniform", "loguniform", "randint")
MAX_NAME = 120  # characters of a trial's name from its values (a directory name)


@dataclass
class SchedulerConfig:
    name: str | None = None  # null: every trial runs to the end; asha: early stopping
    grace_period: int = 5  # ASHA: rounds every trial runs before it may be stopped
    reduction_factor: float = 4.0  # ASHA: keep the best 1/reduction_factor at each rung


@dataclass
class SweepConfig:
    name: str = "sweep"
    job: Any = None  # the job: a YAML path (relative to the sweep file) or the job's keys
    overrides: list[str] = field(default_factory=list)  # key=value for every trial
    search: str = "grid"  # grid | random
    # grid: repeats of the whole grid; random: trials drawn
    num_samples: int = 1
    seed: int = 0  # random search: the seed values are drawn with
    # config key -> list of values (grid; random: a uniform choice), or, random only,
    # {uniform|loguniform: [low, high]} or {randint: [low, high)}
    parameters: dict[str, Any] = field(default_factory=dict)
    metric: str = "test_accuracy"  # what ASHA and the report compare
    mode: str = "max"  # max | min
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    workers_per_trial: int = 1  # worker actors per trial (each runtime.worker.num_cpus/gpus)
    max_concurrent_trials: int = 0  # 0: as many as the cluster's resources fit
    output: str | None = None  # the sweep directory; null: runs/<name>-<timestamp>


def _job_config(sweep: DictConfig, base_dir: str) -> DictConfig:
    """The sweep's job with its overrides, paths made absolute; validated later per trial."""
    job = sweep.job
    if job is None:
        raise ConfigError("sweep key 'job': the job to sweep, e.g. job=jobs/quickstart.yaml")
    if isinstance(job, str):
        path = job if os.path.isabs(job) else os.path.join(base_dir, job)
        if not os.path.isfile(path) and os.path.isfile(job):
            path = job  # relative to the working directory, as a command-line path would be
        source: Any = path
    elif isinstance(job, DictConfig):
        source = OmegaConf.to_container(job, resolve=True)
    else:  # job=2, job=[a]: neither a file nor keys
        got = OmegaConf.to_container(job) if isinstance(job, ListConfig) else job
        raise ConfigError(f"sweep key 'job': must be a job file's path or the job's keys "
                          f"(job.rounds=...), got {got!r}")
    return load_config(source, list(sweep.overrides))


def load_sweep(source: Any, overrides: list[str] | tuple = ()) -> tuple[DictConfig, DictConfig]:
    """The sweep (its job inlined) and the job config; reads no data, starts nothing."""
    # job.KEY=VALUE on the command line: a key of the job. Merged into a sweep whose job is
    # a file's path, it would replace the path with that one key (the job's other keys, its
    # data among them, silently back to their defaults), so there it joins `overrides`
    outer = [o for o in overrides if not str(o).startswith("job.")]
    sweep = load_structured(SweepConfig, source, outer, what="sweep", kind="sweep")
    if len(outer) < len(overrides):
        if isinstance(sweep.job, str):
            sweep.overrides = [*sweep.overrides,
                               *(str(o)[4:] for o in overrides if str(o).startswith("job."))]
        else:
            sweep = load_structured(SweepConfig, source, overrides, what="sweep", kind="sweep")
    base_dir = os.path.dirname(os.path.abspath(source)) if isinstance(source, str | os.PathLike
                                                                      ) else os.getcwd()
    job = _job_config(sweep, base_dir)
    if job.data.partition not in ("synthetic", "memory"):  # trials run elsewhere: Tune
        # starts each in its own working directory, maybe on another node
        job = OmegaConf.merge(job, {"data": {"partition": absolute_url(job.data.partition)}})
    job = OmegaConf.merge(job, _absolute_files(job))  # likewise
    sweep.job = OmegaConf.to_container(job, resolve=True)
    sweep.overrides = []
    r = _require
    r(sweep.search in ("grid", "random"), "search", "must be grid or random", sweep.search)
    r(sweep.num_samples >= 1, "num_samples", "must be >= 1", sweep.num_samples)
    r(sweep.mode in ("max", "min"), "mode", "must be max or min", sweep.mode)
    r(sweep.workers_per_trial >= 1, "workers_per_trial", "must be >= 1", sweep.workers_per_trial)
    r(sweep.max_concurrent_trials >= 0, "max_concurrent_trials", "must be >= 0",
      sweep.max_concurrent_trials)
    sweep.parameters = _absolute_values(_section_choices(_flat_parameters(sweep.parameters),
                                                         job))
    r(bool(sweep.parameters), "parameters", "must name at least one config key to vary, e.g. "
      "seed: [0, 1, 2]", dict(sweep.parameters))
    s = sweep.scheduler
    r(s.name in (None, "asha"), "scheduler.name", "must be null or asha", s.name)
    r(s.grace_period >= 1, "scheduler.grace_period", "must be >= 1", s.grace_period)
    r(s.reduction_factor > 1, "scheduler.reduction_factor", "must be > 1", s.reduction_factor)
    seen: dict[str, str] = {}  # config key -> the parameter that sets it
    for key, spec in sweep.parameters.items():
        where = f"parameters.{key}"
        for k in _keys_set(key, spec):
            r(seen.get(k, key) == key, where, f"sets {k}, which parameters.{seen.get(k)} "
              "sets too; set each config key in one parameter", k)
            seen[k] = key
            r(k not in ("output.dir", "runtime.num_workers"), where,
              "is set by the sweep for each trial" if k == key else
              f"sets {k}, which the sweep sets for each trial", spec if k == key else k)
        if is_choice(spec):
            options = OmegaConf.to_container(spec)
            for option in options:
                for k, values in option.items():
                    r(len(values) >= 1 and not any(isinstance(v, dict) for v in values),
                      f"{where}.{k}", "a choice's option gives each key a value or a "
                      "non-empty list of values (swept within the option)", values)
            settings = [json.dumps(s, sort_keys=True) for s in choice_settings(options)]
            dup = next((s for s in settings if settings.count(s) > 1), None)
            r(dup is None, where, "two options give the same setting", dup)
            continue
        if isinstance(spec, DictConfig):
            r(sweep.search == "random", where, "a distribution needs search: random",
              OmegaConf.to_container(spec))
            r(len(spec) == 1 and next(iter(spec)) in DISTRIBUTIONS, where,
              f"must be a list of values or one of {', '.join(DISTRIBUTIONS)}: [low, high]",
              OmegaConf.to_container(spec))
            kind, bounds = next(iter(spec.items()))
            ok = (isinstance(bounds, list | tuple) or hasattr(bounds, "__len__")) and len(
                bounds) == 2 and bounds[0] < bounds[1] and (kind != "loguniform" or bounds[0] > 0)
            r(ok, where, f"{kind} needs [low, high] with low < high"
              + (" and low > 0" if kind == "loguniform" else ""), list(bounds))
            r(kind != "randint" or all(isinstance(b, int) for b in bounds), where,
              "randint needs whole numbers [low, high) (high excluded)", list(bounds))
        else:
            r(hasattr(spec, "__len__") and not isinstance(spec, str) and len(spec) >= 1, where,
              "must be a non-empty list of values", spec)
    if sweep.output is None:
        sweep.output = f"runs/{sweep.name}-{time.strftime('%Y%m%d-%H%M%S')}"

    OmegaConf.set_readonly(job, True)
    sweep.output = absolute_url(sweep.output)
    OmegaConf.set_readonly(sweep, True)
    return sweep, job


def _absolute_ref(ref: Any) -> Any:
    """An import path whose module is a relative .py path, with the path made absolute;
    anything else as it is."""
    if not isinstance(ref, str) or ":" not in ref:
        return ref
    module, _, attr = ref.rpartition(":")
    if (module.endswith(".py") or os.sep in module) and not os.path.isabs(module):
        return f"{os.path.abspath(module)}:{attr}"
    return ref


def _absolute_files(job: DictConfig) -> dict[str, dict[str, str]]:
    """Parts and the model named by a relative .py path, with the path made absolute: a
    trial's working directory is not the caller's (on a cluster the file must be on shared
    storage; a module named by module name is shipped instead, ``pack_modules``)."""
    out: dict[str, dict[str, str]] = {}
    for key, ref in algorithm_refs(job.algorithm) + model_refs(job):
        section, _, name = key.partition(".")
        if _absolute_ref(ref) != ref:
            out.setdefault(section, {})[name] = (  # algorithm.stages: a list of them
                [_absolute_ref(r) for r in job.algorithm.stages] if name == "stages"
                else _absolute_ref(ref))
    return out


def _ref_keys() -> set[str]:
    """The config keys whose values may be import paths of the user's modules."""
    return {f"algorithm.{k}" for k in PART_KEYS} | {"model.name"}


def _absolute_values(parameters: dict[str, Any]) -> dict[str, Any]:
    """Swept import paths (``model.name: [a.py:Net, b.py:Net]``) with relative .py paths
    made absolute, as ``_absolute_files`` does for the job's own."""
    def absolute(key: str, spec: Any) -> Any:
        if key in _ref_keys() and isinstance(spec, list | ListConfig):
            return [_absolute_ref(v) for v in spec]
        return spec

    return {k: [{ok: absolute(ok, ov) for ok, ov in option.items()} for option in spec]
            if is_choice(spec) else absolute(k, spec) for k, spec in parameters.items()}


def _flat_parameters(node: DictConfig, prefix: str = "") -> dict[str, Any]:
    """``{client: {lr: [..]}}`` (nested YAML, or ``parameters.client.lr=[..]`` on the command
    line) means ``{"client.lr": [..]}``; a one-key mapping naming a distribution is a value;
    a list of mappings is a choice (``is_choice``), each option flattened alike, its single
    values made one-value lists."""
    out: dict[str, Any] = {}
    for key, spec in node.items():
        if isinstance(spec, DictConfig) and not (len(spec) == 1
                                                 and next(iter(spec)) in DISTRIBUTIONS):
            out.update(_flat_parameters(spec, f"{prefix}{key}."))
        elif is_choice(spec):
            out[f"{prefix}{key}"] = [
                {k: list(v) if isinstance(v, ListConfig) else [v]
                 for k, v in _flat_parameters(option).items()} for option in spec]
        else:
            out[f"{prefix}{key}"] = spec
    return out


def _section_choices(parameters: dict[str, Any], job: DictConfig) -> dict[str, Any]:
    """A choice named after a config section (``algorithm: [{name: fedavg}, {name: fedprox,
    fedprox.mu: 0.1}]``) sets keys inside it; any other choice's name is only its label
    (``method``) and its options name whole keys. A choice named after a single config value
    (``seed``) is refused."""
    out = {}
    for key, spec in parameters.items():
        node = OmegaConf.select(job, key, default=None) if is_choice(spec) else None
        if isinstance(node, DictConfig):
            spec = [{k if k.startswith(f"{key}.") else f"{key}.{k}": v
                     for k, v in option.items()} for option in spec]
        elif node is not None:
            _require(False, f"parameters.{key}", "is a config value, so its values cannot be "
                     "mappings; a choice between settings is named after a config section "
                     "(algorithm) or is a label of your own (method)",
                     OmegaConf.to_container(spec) if isinstance(spec, ListConfig) else spec)
        out[key] = spec
    return out


def is_choice(spec: Any) -> bool:
    """A parameter whose values are whole settings -- a list of mappings of config keys,
    e.g. ``method: [{algorithm.name: fedavg}, {algorithm.name: fedprox, algorithm.fedprox.mu:
    [0.01, 0.1]}]``: one option per trial, each setting its own keys (a key given a list is
    swept within its option). Per-method settings need this: a key such as
    ``algorithm.fedprox.mu`` exists only in a FedProx job, so it cannot be swept across
    FedAvg's trials too."""
    return isinstance(spec, ListConfig | list) and len(spec) > 0 and all(
        isinstance(o, DictConfig | dict) for o in spec)


def _option_settings(option: Any) -> list[dict[str, Any]]:
    """An option's grid: every combination of its keys' values."""
    return [dict(zip(option, combo, strict=True))
            for combo in itertools.product(*(list(v) for v in option.values()))]


def choice_settings(spec: Any) -> list[dict[str, Any]]:
    """A choice's settings, option after option."""
    return [s for option in spec for s in _option_settings(option)]


def _keys_set(key: str, spec: Any) -> list[str]:
    """The config keys parameter ``key`` sets: itself, or a choice's options' keys."""
    return [k for option in spec for k in option] if is_choice(spec) else [key]


def swept_keys(sweep: DictConfig) -> list[str]:
    """The config keys the sweep sets, in the order the file gives them (a choice's keys
    where its options first name them): results.csv's columns and the report's grouping."""
    keys: list[str] = []
    for key, spec in sweep.parameters.items():
        for k in _keys_set(key, spec):
            if k not in keys:
                keys.append(k)
    return keys


def _option_of(spec: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The setting of the choice ``spec`` that the trial's ``params`` hold (load_sweep refuses
    choices whose settings repeat, so there is exactly one)."""
    own = set(_keys_set("", spec))
    keys = {k for k in params if k in own}
    return next(s for s in choice_settings(spec)
                if set(s) == keys and all(params[k] == v for k, v in s.items()))


def _require(ok: bool, key: str, rule: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"sweep key '{key}': {rule}, got {value!r}")


def _candidates(sweep: DictConfig) -> list[dict[str, Any]]:
    """Settings to validate before anything starts: the whole grid, or for random search each
    listed value and the ends and middle of each range (a value the job refuses fails here)."""
    values = {}
    for key, spec in sweep.parameters.items():
        if is_choice(spec):
            values[key] = choice_settings(spec)
        elif isinstance(spec, DictConfig):
            kind, (lo, hi) = next(iter(spec.items()))
            # both ends, and for a continuous range a float inside it (an int key refuses it)
            values[key] = [lo, hi - 1] if kind == "randint" else [lo, hi, (lo + hi) / 2.0]
        else:
            values[key] = list(OmegaConf.to_container(spec) if not isinstance(spec, list)
                               else spec)
    if sweep.search == "grid":
        return [_setting(dict(zip(values, combo, strict=True)))
                for combo in itertools.product(*values.values())]
    return [_setting({k: v}) for k, vs in values.items() for v in vs]


def _setting(chosen: dict[str, Any]) -> dict[str, Any]:
    """Parameter -> value, a choice's value being its setting, as config key -> value."""
    out: dict[str, Any] = {}
    for key, value in chosen.items():
        out.update(value if isinstance(value, dict) else {key: value})
    return out


def trial_config(job: dict, params: dict[str, Any], run_dir: str, workers: int) -> dict:
    """One trial's job: the sweep's job with the trial's values set."""
    cfg = OmegaConf.create(job)
    for key, value in params.items():
        OmegaConf.update(cfg, key, value, merge=False)
    OmegaConf.update(cfg, "output.dir", run_dir, merge=False)
    OmegaConf.update(cfg, "runtime.num_workers", workers, merge=False)
    return OmegaConf.to_container(cfg, resolve=True)


def check_trials(sweep: DictConfig, job: DictConfig,
                 prepared: dict[str, DictConfig] | None = None) -> int:
    """Validate every setting the sweep can produce; return how many trials it will run.
    ``prepared``, if given, receives each setting's validated config (by ``_key``)."""
    base = OmegaConf.to_container(job, resolve=True)
    candidates = _candidates(sweep)
    for params in candidates:
        try:
            cfg = prepare(trial_config(base, params, "unused", sweep.workers_per_trial))
            if prepared is not None:
                prepared[_key(params)] = cfg
        except ConfigError as exc:  # say which sweep value made the job invalid
            what = ", ".join(f"{k}={v!r}" for k, v in params.items())
            raise ConfigError(f"sweep setting {what}: {exc}") from None
    if sweep.search == "random":
        return sweep.num_samples
    return sweep.num_samples * len(candidates)


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def client_state_disk(sweep: DictConfig, job: DictConfig,
                      plan: list[tuple[str, dict[str, Any]]], modules: bytes | None = None,
                      prepared: dict[str, DictConfig] | None = None) -> str | None:
    """The client state the sweep's stateful trials will keep on disk, all together (each
    trial's estimate as its driver makes it: fedray.state.client_state_disk), in one line;
    None when no trial keeps client state. A trial over its ``runtime.client_state_mb`` is
    refused here, naming its setting, before Ray starts. Each distinct model and algorithm
    is built once, in this process (with the user's modules on the path, as in a trial).
    ``prepared``: configs check_trials validated already, by ``_key``."""
    # imported when used, not at the top: they load torch, pyarrow, ray, safetensors (start-up time)
    from fedray.algorithms.base import RoundPlan
    from fedray.core.flat_model import FlatModel
    from fedray.core.models import source_model_factory
    from fedray.data.client_source import build_source
    from fedray.runtime.driver import most_clients
    from fedray.runtime.worker import keeps_client_state

    base = OmegaConf.to_container(job, resolve=True)
    built: dict[str, tuple] = {}
    total, stateful, largest = 0.0, 0, (0.0, "")
    with _modules_on_path(modules):
        for name, params in plan:
            cfg = (prepared or {}).get(_key(params)) or prepare(
                trial_config(base, params, "unused", sweep.workers_per_trial))
            key = json.dumps([OmegaConf.to_container(cfg[k], resolve=True)
                              for k in ("data", "model", "algorithm", "server")], default=str)
            trial = typed(cfg)
            if key not in built:
                source = build_source(trial.data, in_process=trial.runtime.backend == "inline")
                template = FlatModel(source_model_factory(trial.model, source)())
                parts = resolve(trial.algorithm, trial.server)
                built[key] = (source.population, template, parts.client, parts.stages)
            population, template, client, stages = built[key]
            if not keeps_client_state(client, stages):
                continue
            k = most_clients(RoundPlan(seed=cfg.seed, population=population,
                                       clients_per_round=cfg.sampling.clients_per_round,
                                       sampling=cfg.sampling.mode, rounds=cfg.rounds,
                                       num_params=template.num_params))
            disk = run_estimate(trial.runtime.worker, trial.rounds, population, k, template,
                                client, stages, sweep.workers_per_trial)
            refusal = over_budget(trial.runtime, disk)
            if refusal:
                what = ", ".join(f"{k}={v!r}" for k, v in params.items())
                raise ConfigError(f"sweep setting {what}: {refusal}")
            total += disk.expected
            stateful += 1
            largest = max(largest, (disk.expected, name))
    if not stateful:
        return None
    return (f"client state on disk: about {size_text(total)} for the {stateful} trials that keep "
            f"it (the largest, {largest[1]}, about {size_text(largest[0])}; each trial's log "
            "gives its own and its bound; runtime.client_state_mb limits a trial's)")


def _url(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts])


def _trial(config: dict, *, plan: dict[str, dict], job: dict, sweep_dir: str, workers: int,
           modules: bytes | None = None) -> None:
    """A Tune function trainable: run (or resume) the planned trial ``config["trial"]`` (its
    values: ``plan``), reporting every round. ``modules``: the user's modules the job names
    (``pack_modules``).

    A resumed run first reports the rounds of its checkpoint again, so that Tune's scheduler
    (ASHA) judges it on its whole curve. The last round is reported only once the run has
    returned: ASHA stops a trial at its last round (``max_t``), and a stop there would
    otherwise kill the run while it writes its final checkpoint and summary."""
    from ray import tune


    name = config["trial"]
    run_dir = _url(sweep_dir, TRIALS_DIR, name)  # how _rows finds it again
    fs, path = fsspec.core.url_to_fs(run_dir)
    resume = None
    if fs.exists(f"{path}/config.yaml"):
        resume = run_dir  # an interrupted sweep: continue from the run's checkpoint
        if fs.exists(f"{path}/{LOCK_FILE}"):  # Tune runs a trial once at a time: the lock
            fs.rm(f"{path}/{LOCK_FILE}")  # is its killed run's, maybe from another node
    elif fs.exists(path):
        fs.rm(path, recursive=True)  # killed before the run wrote anything to resume from
    cfg = trial_config(job, plan[name], run_dir, workers)
    first, last = [True], []

    def report(m: dict) -> None:
        if first and resume is not None and m.get("round", 1) > 1:
            for past in read_metrics(run_dir):  # the checkpoint's rounds, rewritten by now
                if past.get("round", 0) < m["round"]:
                    tune.report(dict(past))
        first.clear()
        if m.get("round", 0) >= cfg["rounds"]:
            last.append(dict(m))  # after the run has returned
        else:
            tune.report(dict(m))

    with _modules_on_path(modules):
        run(cfg, resume=resume, progress=report)
    for m in last:
        tune.report(m)


def _module_refs(sweep: DictConfig, job: DictConfig) -> list[tuple[str, str]]:
    """The import paths the job names (fedray.cluster.submit.job_refs), and the algorithm parts
    and models a sweep parameter sets."""
    refs = job_refs(job)
    for key, spec in sweep.parameters.items():
        for k, values in ([kv for option in spec for kv in option.items()] if is_choice(spec)
                          else [(key, spec)]):
            if k in _ref_keys() and not isinstance(values, DictConfig):
                refs += [(k, v) for v in values if isinstance(v, str) and ":" in v]
    return refs


def pack_modules(refs: list[tuple[str, str]]) -> bytes | None:
    """The user's modules behind the import paths (fedray.cluster.submit.user_modules: each module
    name's top-level package or file; .py paths stay where they are), zipped to travel with
    every trial; None when the job names none. Only source files go: __pycache__ and
    hidden directories are left out."""
    modules = [m for m in user_modules(refs) if not m.by_file]
    if not modules:
        return None
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        names: set[str] = set()
        for m in modules:
            if os.path.isfile(m.path):
                files = [(m.path, os.path.basename(m.path))]
            else:
                top = os.path.basename(m.path.rstrip(os.sep))
                files = []
                for root, dirs, found in os.walk(m.path):
                    dirs[:] = sorted(d for d in dirs if d != "__pycache__"
                                     and not d.startswith("."))
                    rel = os.path.relpath(root, m.path)
                    files += [(os.path.join(root, f),
                               os.path.normpath(os.path.join(top, rel, f)))
                              for f in sorted(found) if not f.endswith((".pyc", ".pyo"))]
            for path, name in files:
                if name not in names:  # a namespace package's portions: the first wins
                    names.add(name)
                    zf.write(path, name)

    data = buf.getvalue()
    if len(data) > MAX_MODULES_MB * 2**20:
        raise FedrayError(f"the modules of {', '.join(r for _, r in refs)} take "
                          f"{len(data) / 2**20:.0f} MiB zipped, more than the "
                          f"{MAX_MODULES_MB} MiB shipped with every trial; install them on "
                          "the cluster's nodes instead")
    return data


@contextlib.contextmanager
def _modules_on_path(modules: bytes | None):
    """The trial's process imports the user's modules from a directory of its own: their
    files unzipped there, the directory first on sys.path while the run lasts (the run's
    driver and workers get the parts pickled by value, fedray.algorithms.registry)."""
    if not modules:
        yield
        return
    root = tempfile.mkdtemp(prefix="fedray-modules-")
    try:
        with zipfile.ZipFile(io.BytesIO(modules)) as zf:
            zf.extractall(root)
        sys.path.insert(0, root)
        importlib.invalidate_caches()
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(root)
        shutil.rmtree(root, ignore_errors=True)


def _placement(job: DictConfig, workers: int):
    from ray import tune

    w = job.runtime.worker
    bundle = {"CPU": float(w.num_cpus)} | ({"GPU": float(w.num_gpus)} if w.num_gpus else {})
    # an empty first bundle: the trial's own process (it only waits on its driver) takes none
    return tune.PlacementGroupFactory([{}] + [dict(bundle) for _ in range(workers)])


def _check_fits(job: DictConfig, workers: int, resources: dict[str, float]) -> None:
    """On a fixed-size Ray (no autoscaler), a trial that can never be placed would wait
    forever; say so instead (the pool's own fit check, for a pool of workers_per_trial)."""
    try:
        trial = typed(OmegaConf.merge(job, {"runtime": {"num_workers": workers}}))
        pool_size(trial.runtime, trial.sampling.clients_per_round, resources)
    except FedrayError as exc:
        raise FedrayError(f"workers_per_trial={workers}: {exc}") from None


def _progress_callback(sweep: DictConfig, total: int, log: Callable[[str], None],
                       record: TrialRecord, ended: int = 0):
    """One line per trial start and end, instead of Tune's tables; and each trial's status
    in ``record`` (trials.json) as it starts and ends: FINISHED when its run wrote its summary
    (it ran every round), STOPPED when Tune's scheduler ended it before, INTERRUPTED when
    Tune ended it because the sweep was interrupted (Ctrl-C), ``error: ...`` when it failed
    -- its process died, or the run raised. ``total``: the sweep's trials, ``ended``: those
    that had ended before this session (a resume counts on from them).

    A trial that Tune ends after a Ctrl-C reaches ``on_trial_complete`` exactly like one its
    scheduler stopped. Tune's own Ctrl-C handler, installed before the callbacks' ``setup``,
    is wrapped there so that the callback knows which of the two it is."""
    import signal
    import threading

    from ray.tune import Callback

    metric = sweep.metric

    class Progress(Callback):
        def __init__(self) -> None:
            self.ended = ended
            self.last: dict[str, dict] = {}
            self.interrupted = False

        def setup(self, **info):
            if threading.current_thread() is not threading.main_thread():
                return  # no handler of Tune's: a Ctrl-C reaches the caller's thread only
            tune_handler = signal.getsignal(signal.SIGINT)
            if not callable(tune_handler):
                return

            def interrupted(signum, frame):
                self.interrupted = True
                tune_handler(signum, frame)  # Tune stops its loop and puts back the caller's

            signal.signal(signal.SIGINT, interrupted)

        def _what(self, trial) -> str:
            return f"trial {trial}"  # its name (plan_trials)

        def on_trial_start(self, iteration, trials, trial, **info):
            record.set(trial.config["trial"], status=RUNNING, started=time.time(), ended=None)
            log(f"{self._what(trial)} started")

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if result.get(metric) is not None:
                self.last[trial.trial_id] = result

        def _end(self, trial, how: str, status: str) -> None:
            record.set(trial.config["trial"], status=status, ended=time.time())
            self.ended += 1
            last = self.last.get(trial.trial_id, {})
            value = (f", {metric} {last[metric]:.4f} at round {last.get('round')}"
                     if metric in last else "")
            log(f"{self._what(trial)} {how}{value} [{self.ended}/{total} ended]")

        def on_trial_complete(self, iteration, trials, trial, **info):
            run_dir = _url(sweep.output, TRIALS_DIR, trial.config["trial"])
            fs, path = fsspec.core.url_to_fs(run_dir)
            if fs.exists(f"{path}/{SUMMARY_FILE}"):
                self._end(trial, "ended", FINISHED)
            elif self.interrupted:
                self._end(trial, "interrupted", INTERRUPTED)
            else:
                self._end(trial, "stopped early by the scheduler", STOPPED)

        def on_trial_error(self, iteration, trials, trial, **info):
            if self.interrupted:  # its process got the terminal's Ctrl-C as well
                self._end(trial, "interrupted", INTERRUPTED)
                return
            text = trial.get_error() or "the trial failed"  # Tune's error.txt, plain text
            lines = [line for line in str(text).strip().splitlines() if line.strip()]
            self._end(trial, "FAILED (see results.csv)",
                      ERROR + mask(lines[-1] if lines else "the trial failed")[:200])

    return Progress()


def _value_text(value: Any) -> str:
    """A swept value in a trial's name: floats to 6 significant digits (0.1, 1e-05); a
    credential in it masked (a swept ``s3://KEY:SECRET@...``), since the name is a directory
    name, a log line and a row of results.csv."""
    if isinstance(value, float):
        return f"{value:.6g}"
    return mask(str(value))


def short_keys(keys: list[str]) -> dict[str, str]:
    """Each swept key's name in trial names: its last part (``client.lr`` -> ``lr``), or the
    whole key where two swept keys end alike (``client.lr`` and ``server.lr``)."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: s if last.count(s) == 1 else k for k, s in zip(keys, last, strict=True)}


def _name_parts(parameters: dict[str, Any], params: dict[str, Any]) -> list[tuple[str, Any]]:
    """(label, value) pairs that name a trial: a swept key and its value; for a choice, the
    choice's name with its option's first value (``method=fedprox``), then the option's
    other keys (``mu=0.1``)."""
    parts: list[tuple[str, Any]] = []
    for key, spec in parameters.items():
        if is_choice(spec):
            setting = _option_of(spec, params)
            first, *rest = setting
            parts += [(key, setting[first])] + [(k, setting[k]) for k in rest]
        else:
            parts.append((key, params.get(key)))
    return parts


def trial_name(parameters: dict[str, Any] | list[str], params: dict[str, Any]) -> str:
    """A trial's name from its swept values, e.g. ``lr=0.1,seed=0`` or, with a choice,
    ``method=fedprox,mu=0.1,seed=0``: safe as a directory name anywhere (characters other
    than letters, digits and ``_ . , = + -`` become ``_``; Tune and fsspec URLs take it as it
    is), at most MAX_NAME characters. ``parameters``: the sweep's (or just its keys)."""
    if not isinstance(parameters, dict):
        parameters = dict.fromkeys(parameters)
    parts = _name_parts(parameters, params)
    short = short_keys(list(dict.fromkeys(label for label, _ in parts)))
    text = ",".join(f"{short[label]}={_value_text(v)}" for label, v in parts)
    return re.sub(r"[^A-Za-z0-9_.,=+-]", "_", text)[:MAX_NAME]


def trial_labels(sweep: DictConfig, params: dict[str, Any]) -> dict[str, Any]:
    """A trial's choices by name, each as its option's first value (``method: fedprox``):
    results.csv's columns for the choices."""
    return {key: next(iter(_option_of(spec, params).values()))
            for key, spec in sweep.parameters.items() if is_choice(spec)}


class TrialNamer:
    """Tune's trial name and directory name: the swept values (``trial_name``), and where
    those may repeat -- random search, ``num_samples`` > 1, or values that read alike
    once made safe or cut -- followed by the trial's number (``lr=0.1,seed=0,trial=3``),
    so that every trial's name is unique (``plan_trials`` gives each planned trial an id
    ending in its number)."""

    def __init__(self, parameters: dict[str, Any], unique: bool):
        self.parameters = parameters
        self.unique = unique

    def __call__(self, trial) -> str:
        name = trial_name(self.parameters, trial.config)
        if self.unique:
            return name
        m = re.search(r"_(\d+)$", trial.trial_id)  # Tune numbers the trials it generates
        return f"{name},trial={int(m.group(1)) if m else trial.trial_id}"


def namer(sweep: DictConfig) -> TrialNamer:
    """The sweep's TrialNamer: names alone where the grid's settings, each run once, all
    read differently."""
    parameters = dict(sweep.parameters)
    unique = False
    if sweep.search == "grid" and sweep.num_samples == 1:
        names = [trial_name(parameters, params) for params in _candidates(sweep)]
        unique = len(set(names)) == len(names)
    return TrialNamer(parameters, unique)


def _planned_name(trial) -> str:
    """Tune's name and directory name of a trial: fedray's planned name (``plan_trials``)."""
    return trial.config["trial"]


def plan_trials(sweep: DictConfig) -> list[tuple[str, dict[str, Any]]]:
    """Every trial of the sweep, in order, as (name, values): the grid's settings
    ``num_samples`` times, or ``num_samples`` draws of random search from numpy's generator
    seeded with the sweep's ``seed``. fedray decides this from the sweep alone, not Tune, so a
    resume recomputes the same trials from ``sweep.yaml`` without any of Tune's state."""
    settings: list[dict[str, Any]] = []
    if sweep.search == "grid":
        settings = [dict(p) for _ in range(sweep.num_samples) for p in _candidates(sweep)]
    else:
        rng = np.random.default_rng(sweep.seed)
        for _ in range(sweep.num_samples):
            params: dict[str, Any] = {}
            for key, spec in sweep.parameters.items():
                if isinstance(spec, DictConfig):
                    kind, (lo, hi) = next(iter(spec.items()))
                    if kind == "randint":
                        params[key] = int(rng.integers(lo, hi))
                    elif kind == "uniform":
                        params[key] = float(rng.uniform(lo, hi))
                    else:  # loguniform
                        params[key] = float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
                elif is_choice(spec):
                    option = OmegaConf.to_container(spec[int(rng.integers(len(spec)))])
                    params.update({k: vs[int(rng.integers(len(vs)))]
                                   for k, vs in option.items()})
                else:
                    values = OmegaConf.to_container(spec)
                    params[key] = values[int(rng.integers(len(values)))]
            settings.append(params)
    names = namer(sweep)
    return [(names(SimpleNamespace(config=p, trial_id=f"plan_{i:05d}")), p)
            for i, p in enumerate(settings)]


class TrialRecord:
    """``trials.json``: every planned trial with its values, status (FINISHED, STOPPED,
    ``error: ...``, INTERRUPTED, RUNNING, NOT_STARTED) and start/end times (Unix seconds), kept
    by the sweep's process as trials start and end. With the run directories it is all that
    ``--resume`` reads of a sweep's progress: JSON, which holds data and never code. Written
    to a temporary name and renamed, so a killed sweep leaves the previous version whole."""

    def __init__(self, sweep_dir: str, plan: list[tuple[str, dict[str, Any]]],
                 saved: tuple[dict[str, dict], float] | None = None):
        self.url = _url(sweep_dir, PLAN_FILE)
        self.sweep_dir = sweep_dir
        # seconds the sweep's earlier sessions ran (a resumed sweep's total counts them)
        self.wall_s = saved[1] if saved else 0.0
        self.entries = {name: {"trial": name, "params": params, "status": NOT_STARTED,
                               "started": None, "ended": None}
                        for name, params in plan}
        for name, entry in (saved[0] if saved else {}).items():
            self.entries[name].update({k: entry.get(k) for k in ("status", "started", "ended")})

    @staticmethod
    def read(sweep_dir: str, plan: list[tuple[str, dict[str, Any]]]
             ) -> tuple[dict[str, dict], float] | None:
        """The saved entries by trial name, checked against ``plan`` (the trials that
        sweep.yaml gives now), and the seconds the sweep has run so far; None when the sweep
        has no trials.json."""
        url = _url(sweep_dir, PLAN_FILE)
        fs, path = fsspec.core.url_to_fs(url)
        if not fs.exists(path):
            return None
        try:
            doc = json.loads(fs.cat_file(path).decode())
            entries = {e["trial"]: e for e in doc["trials"]}
            saved = [[e["trial"], e["params"]] for e in doc["trials"]]
            ok = all(isinstance(e.get("status"), str) for e in doc["trials"])
            wall_s = float(doc.get("wall_s", 0.0))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FedrayError(f"--resume {mask(sweep_dir)}: {PLAN_FILE} is not fedray's record "
                              f"of the sweep's trials ({type(exc).__name__}: {exc})") from None
        if not ok:
            raise FedrayError(f"--resume {mask(sweep_dir)}: {PLAN_FILE} is not fedray's record "
                              "of the sweep's trials (a trial without a status)")
        if saved != json.loads(json.dumps([[n, p] for n, p in plan])):
            raise FedrayError(f"--resume {mask(sweep_dir)}: its {SWEEP_FILE} no longer gives the "
                              f"trials listed in {PLAN_FILE} (was it edited?); a sweep resumes "
                              "as it started")
        return entries, wall_s

    def add_time(self, seconds: float) -> float:
        """Count this session's ``seconds`` (trials.json keeps the total); returns the
        sweep's whole time, its earlier sessions included."""
        self.wall_s += seconds
        self.write()
        return self.wall_s

    def set(self, name: str, **fields: Any) -> None:
        self.entries[name].update(fields)
        self.write()

    def write(self) -> None:
        fs, path = fsspec.core.url_to_fs(self.url)
        tmp = f"{path}.tmp-{os.getpid()}"
        with fs.open(tmp, "w") as f:
            f.write(json.dumps({"trials": list(self.entries.values()),
                                "wall_s": round(self.wall_s, 3)}, indent=1) + "\n")
        fs.mv(tmp, path)


def _run_tune(sweep: DictConfig, job: DictConfig, plan: dict[str, dict], names: list[str],
              progress, modules: bytes | None) -> None:
    """Run the planned trials ``names`` on Tune, ``sweep.max_concurrent_trials`` at a time;
    ``modules``: the user's modules every trial puts on its path (``pack_modules``).

    ``tune.run`` with a fresh state every time, never a restore: Tune's restore unpickles its
    files in the sweep directory (Tuner.restore), and so does its ResultGrid (each failed
    trial's pickled error), so fedray reads neither; the trials' outcomes come from the
    ``progress`` callback and the run directories. The search is a grid over the trials'
    names, each trial's values looked up in ``plan``; the generator is given
    ``max_concurrent``, because Tune ignores ``max_concurrent_trials`` (with only a log
    warning) when its search algorithm is a generator rather than a Searcher."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import BasicVariantGenerator

    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"  # evaluation rounds carry the
    # metric; the other rounds are reported too, and ASHA skips them
    # Tune's newer console output prints its config table and a TensorBoard hint into Ray's
    # temporary directory even at verbose=0; the progress callback says what happens, and
    # `fedray sweep` names the TensorBoard directory that holds the trials (SWEEP_DIR/trials)
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    trainable = tune.with_resources(
        tune.with_parameters(_trial, plan=plan, job=OmegaConf.to_container(job, resolve=True),
                             sweep_dir=sweep.output, workers=sweep.workers_per_trial,
                             modules=modules),
        _placement(job, sweep.workers_per_trial))
    scheduler = None
    if sweep.scheduler.name == "asha":
        scheduler = ASHAScheduler(time_attr="round", metric=sweep.metric, mode=sweep.mode,
                                  max_t=job.rounds, grace_period=sweep.scheduler.grace_period,
                                  reduction_factor=sweep.scheduler.reduction_factor)
    tune.run(trainable, name=TUNE_DIR, storage_path=sweep.output,
             config={"trial": tune.grid_search(list(names))},
             search_alg=BasicVariantGenerator(max_concurrent=sweep.max_concurrent_trials),
             scheduler=scheduler, trial_name_creator=_planned_name,
             trial_dirname_creator=_planned_name, callbacks=[progress], verbose=0,
             max_failures=0, raise_on_failed_trial=False, resume=False)


@dataclass
class SweepResult:
    rows: list[dict[str, Any]]  # one per trial, as in results.csv (trial: its name)
    sweep_dir: str
    wall_s: float  # the sweep's whole time, its sessions before a resume included
    report_table: str | None  # the report's Markdown table (None: no trial has the metric)
    session_s: float = 0.0  # this session's time (wall_s when the sweep was not resumed)

    @property
    def failed(self) -> list[str]:
        """Trials that ended with an error (``fedray sweep --resume`` re-runs them)."""
        return [row["trial"] for row in self.rows if row["status"].startswith("error")]


def _rows(sweep: DictConfig, record: TrialRecord) -> list[dict[str, Any]]:
    """One row per planned trial: its values, status (trials.json's), rounds run, final and
    best metric, time and run directory."""
    keys = swept_keys(sweep)
    rows = []
    for name, entry in record.entries.items():
        run_dir = _url(sweep.output, TRIALS_DIR, name)
        try:
            metrics = read_metrics(run_dir)
        except FileNotFoundError:
            metrics = []
        values = [m[sweep.metric] for m in metrics if m.get(sweep.metric) is not None]
        best = (max if sweep.mode == "max" else min)(values) if values else None
        rows.append({"trial": name, **trial_labels(sweep, entry["params"]),
                     **{k: entry["params"].get(k) for k in keys},
                     "status": entry["status"],
                     "rounds": metrics[-1]["round"] if metrics else 0,
                     f"final_{sweep.metric}": values[-1] if values else None,
                     f"best_{sweep.metric}": best,
                     "elapsed_s": round(metrics[-1]["elapsed_s"], 1) if metrics else None,
                     "run_dir": run_dir})

    def order(row: dict) -> tuple:  # by the swept values, numbers as numbers (10 < 100), a
        # key a trial does not set (a choice's other options) first
        return tuple((0, 0, "") if v is None else (1, v, "") if isinstance(v, int | float)
                     and not isinstance(v, bool) else (2, 0, str(v))
                     for v in (row[k] for k in keys)) + (row["trial"],)

    return sorted(rows, key=order)


def _csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["trial"])
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The results as an aligned text table (run_dir left out: it is in results.csv)."""
    if not rows:
        return "(no trials)"
    cols = [c for c in rows[0] if c != "run_dir"]

    def cell(v: Any) -> str:
        return f"{v:.4f}" if isinstance(v, float) else "-" if v is None else str(v)

    table = [cols] + [[cell(row[c]) for c in cols] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(cols))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
                     for line in table)


def _report(sweep: DictConfig, rows: list[dict[str, Any]]) -> str | None:
    """The comparison: a curve per setting of the non-seed keys, a band over seeds -- over
    the trials that ran every round (FINISHED) only: a trial stopped early, failed or
    interrupted would pull a setting's mean toward wherever it was cut, so it is left out,
    and report.md names it and why."""
    out = _url(sweep.output, REPORT_DIR)
    fs, path = fsspec.core.url_to_fs(out)
    if fs.exists(path):
        fs.rm(path, recursive=True)  # a resumed sweep's report covers every trial again
    done = [row["run_dir"] for row in rows
            if row["status"] == FINISHED and row[f"final_{sweep.metric}"] is not None]
    if not done:
        return None
    left_out = [row for row in rows if row["status"] != FINISHED]
    notes = []
    if left_out:
        notes = [f"left out of the means: {len(left_out)} of {len(rows)} trials did not run "
                 "every round (results.csv has their rows):", ""]
        notes += [f"- `{row['trial']}`: {row['status']} after round {row['rounds']}"
                  for row in left_out]
    group_by = [k for k in swept_keys(sweep) if k != "seed"] or None
    return build_report(done, out, metric=sweep.metric, group_by=group_by,
                        title=f"{sweep.name}: {sweep.metric}", notes=notes).table


def run_sweep(source: Any = None, overrides: list[str] | tuple = (), *,
              resume: str | None = None, log: Callable[[str], None] | None = None
              ) -> SweepResult:
    """Run a sweep (``source``: a SWEEP.yaml path or its keys) or resume one (``resume``: its
    directory) to the end, and write results.csv and the report. Failed trials do not raise:
    they are rows with an ``error: ...`` status (``SweepResult.failed``).

    The sweep holds its directory from before Ray starts to the end (the lock ``fedray run``
    puts on its output.dir, fedray.state.storage.RunClaim): a second sweep, or resume, to
    the same ``output`` is refused in one line naming the one that holds it. A new sweep
    that fails before writing anything leaves no directory behind."""
    claims: list[RunClaim] = []
    try:
        return _run_sweep(source, overrides, resume, log, claims)
    finally:
        for claim in claims:
            claim.vacate()


def _run_sweep(source: Any, overrides: list[str] | tuple, resume: str | None,
               log: Callable[[str], None] | None, claims: list[RunClaim]) -> SweepResult:
    log = log or (lambda s: print(mask(s), file=sys.stderr, flush=True))
    if resume is not None:
        url = absolute_url(resume)
        fs, path = filesystem(url, "--resume", durable=True, what=None)
        if not fs.exists(f"{path}/{SWEEP_FILE}"):
            raise FedrayError(f"--resume {url}: not a fedray sweep directory (no {SWEEP_FILE})")
        saved = OmegaConf.create(fs.cat_file(f"{path}/{SWEEP_FILE}").decode())

        try:  # before anything resolves it: a crafted ${oc.env:...} would read the environment
            check_interpolations(saved, "sweep")
        except FedrayError as exc:
            raise FedrayError(f"--resume {url}: its {SWEEP_FILE}: {exc}") from None

        masked = masked_keys(saved)
        if masked:  # sweep.yaml never holds secrets, so it cannot restore them
            raise FedrayError(f"--resume {url}: its {SWEEP_FILE} has masked credentials in "
                              f"{', '.join(masked)}; pass credentials through the environment "
                              "(e.g. AWS_ACCESS_KEY_ID for s3://), not in URLs or config keys")
        if overrides:
            raise FedrayError("--resume takes no key=value overrides: a sweep resumes as it "
                              "started")
        sweep, job = load_sweep(OmegaConf.merge(saved, {"output": url}))
    else:
        if source is None:
            raise FedrayError("fedray sweep needs SWEEP.yaml (or --resume SWEEP_DIR)")
        sweep, job = load_sweep(source, overrides)
        fs, path = filesystem(sweep.output, "output", durable=True, what="sweep")
    claims.append(RunClaim(sweep.output, "output", what="sweep", command="fedray sweep",
                           occupied=FedrayError(
                               f"sweep output {sweep.output} already holds files; choose a new "
                               f"output or continue it with --resume {sweep.output}")))
    claims[-1].acquire(new=resume is None)  # before Ray starts: no other sweep writes here
    prepared: dict[str, DictConfig] = {}
    trials = check_trials(sweep, job, prepared)
    plan = plan_trials(sweep)
    modules = pack_modules(_module_refs(sweep, job))  # zipped once: the estimate's, the trials'
    state_line = client_state_disk(sweep, job, plan, modules, prepared)
    record = TrialRecord(sweep.output, plan,
                         TrialRecord.read(sweep.output, plan) if resume is not None else None)
    todo = _to_run(sweep, record)
    again = f"fedray sweep --resume {mask(sweep.output)}"
    start = time.perf_counter()
    with ray_session(typed(job).runtime):
        import ray

        if not job.runtime.address and not os.environ.get("RAY_ADDRESS"):
            _check_fits(job, sweep.workers_per_trial, ray.cluster_resources())
        if resume is None:
            fs.makedirs(path, exist_ok=True)
            with fs.open(f"{path}/{SWEEP_FILE}", "w") as f:
                f.write(mask(OmegaConf.to_yaml(sweep)))
        record.write()
        log(f"sweep {sweep.name}: {trials} trials of {job.rounds} rounds, "
            f"{sweep.workers_per_trial} worker(s) each"
            + (f", {len(todo)} left to run" if resume is not None else "")
            + f"; Tune's logs in {mask(_url(sweep.output, TUNE_DIR))}")
        if state_line:
            log(state_line)
        stop: KeyboardInterrupt | None = None
        try:
            if todo:
                progress = _progress_callback(sweep, len(plan), log, record,
                                              ended=len(plan) - len(todo))
                with _tune_signals():
                    _run_tune(sweep, job, dict(plan), todo, progress, modules)
        except KeyboardInterrupt as exc:  # a second Ctrl-C, SIGTERM, or a Ctrl-C before
            stop = exc  # Tune's loop took it over (Ray starting, Tune importing)
    cut = _mark_interrupted(record)  # Tune ends early only when interrupted (Ctrl-C)
    rows = _rows(sweep, record)
    with fs.open(f"{path}/{RESULTS_FILE}", "w") as f:
        f.write(mask(_csv(rows)))
    table = None
    if stop is None:
        try:
            table = _report(sweep, rows)
        except FedrayError as exc:
            if not cut:
                raise
            log(f"report/ not written: {exc}")  # the way to continue matters more

    session_s = time.perf_counter() - start
    wall_s = record.add_time(session_s)
    if cut or stop is not None:
        raise type(stop or KeyboardInterrupt())(
            f"{len(cut)} of {len(plan)} trials did not end (results.csv lists them, report/ "
            f"leaves them out); continue with: {again}")
    return SweepResult(rows=rows, sweep_dir=sweep.output, wall_s=wall_s, report_table=table,
                       session_s=session_s)


def _to_run(sweep: DictConfig, record: TrialRecord) -> list[str]:
    """The planned trials a (resumed) sweep still runs: all but those whose run wrote its
    summary (FINISHED) and those the scheduler stopped (STOPPED, in trials.json)."""
    todo = []
    for name, entry in record.entries.items():
        fs, path = fsspec.core.url_to_fs(_url(sweep.output, TRIALS_DIR, name))
        if fs.exists(f"{path}/{SUMMARY_FILE}"):
            entry["status"] = FINISHED
        elif entry["status"] != STOPPED:
            todo.append(name)
    return todo


def _mark_interrupted(record: TrialRecord) -> list[str]:
    """Trials that started and did not end become INTERRUPTED (in trials.json too); returns
    every trial that did not end, those never started included."""
    cut = [n for n, e in record.entries.items() if e["status"] in (RUNNING, INTERRUPTED)]
    for name in cut:
        record.entries[name]["status"] = INTERRUPTED
    record.write()
    return cut + [n for n, e in record.entries.items() if e["status"] == NOT_STARTED]


@contextlib.contextmanager
def _tune_signals():
    """Tune replaces the Ctrl-C handler with its own (a first Ctrl-C ends its loop in order,
    trials stopped, and returns) and leaves it there; the caller's handler (the CLI's) is
    put back afterwards, so that a later Ctrl-C is not swallowed."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
