"""Job configuration: structured (typed) omegaconf configs, YAML files and key=value overrides.

Every key a job can set is declared here, with its type and default, so that a typo or a
wrong type is caught by omegaconf and an impossible value by ``validate`` -- all before Ray
starts, with one line naming the key. The key names are a public contract (docs/config.md).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fedray.algorithms.registry import is_import_path
from fedray.errors import ConfigError, key_error, one_line, yaml_problem
from fedray.section import FrozenMap, Section, frozen
from fedray.tracking.callbacks import callback_class

# A synthetic client's size and data are hashed from its id on demand, so no process holds
# anything per client; the bound is the largest population sampling, the clock and the
# client state index are tested at (tests/core/test_sampling.py), far inside int64 ids.
MAX_SYNTHETIC_CLIENTS = 1_000_000_000_000
# parts of a dotted key an override may have (the deepest real key has 5): omegaconf
# recurses once per part, and 200 parts passed Python's recursion limit
MAX_KEY_PARTS = 32
# a job's name, in UTF-8 bytes: runs/<name>-<YYYYmmdd-HHMMSS> stays within the 255 bytes a
# file name may have on common filesystems
MAX_NAME_BYTES = 200


@dataclass
class SyntheticConfig(Section):
    """The built-in FEMNIST-shaped generator (fedray.data.sources.synthetic)."""

    num_clients: int = 1000
    min_examples: int = 30
    max_examples: int = 90
    test_fraction: float = 0.1  # of each writer's examples held out, as LEAF's 90/10 split
    test_writers: int = 200  # writers whose held-out examples form the central test set
    seed: int = 0  # identity of the data set; independent of the training seed


@dataclass
class ImbalanceRoundConfig(Section):
    """data.per_round.imbalance: each round, a client's training examples re-drawn with an
    exponential class imbalance (fedray.data.transforms.per_round). Off while ``ratios`` is
    empty."""

    ratios: list[float] = field(default_factory=list)  # drawn per (round, client); [1.0]:
    # class-balanced draws
    size: int | None = None  # examples per client and round; None: the client's own count
    pool: str = "client"  # client: its own examples; all: every client's (the training set)
    # a fixed composition instead of drawn ratios: one ratio per client of the round, dealt
    # to the round's clients at random (exactly these ratios every round)
    composition: list[float] = field(default_factory=list)


@dataclass
class LabelFlipRoundConfig(Section):
    """data.per_round.label_flip: each round, a client corrupted with probability
    ``corruption``, a ``flip_ratio`` share of its classes relabelled. Off at 0."""

    corruption: float = 0.0
    flip_ratio: float = 1.0
    corrupted: int | None = None  # exactly this many of each round's clients, not a chance


@dataclass
class PerRoundConfig(Section):
    """data.per_round: transforms of a client's training data drawn afresh every round from
    (seed, round, client_id); applied by the worker, imbalance first, then label_flip."""

    imbalance: ImbalanceRoundConfig = field(default_factory=ImbalanceRoundConfig)
    label_flip: LabelFlipRoundConfig = field(default_factory=LabelFlipRoundConfig)


@dataclass
class PerClientConfig(Section):
    """data.per_client: a feature shift fixed per client (its domain), drawn from
    (seed, client_id) alone and applied to its train and test splits
    (fedray.data.transforms.per_client);
    every option is off at its default."""

    rotation: float = 0.0  # max |angle| in degrees: each client's is uniform in [-max, max]
    contrast: list[float] = field(default_factory=lambda: [1.0, 1.0])  # factor's [lo, hi]
    brightness: float = 0.0  # max |offset| added to every value
    noise: float = 0.0  # max std of Gaussian noise, fixed per example
    domains: int = 0  # 0: a shift per client; K: K shared shifts, client c in domain c % K
    clip: list[float] | None = None  # [lo, hi]: shifted values clipped into it ([0, 1]: pixels)


@dataclass
class DataConfig(Section):
    # 'synthetic', a partition store's path or URL, or 'memory' (fedray.run's client_data)
    partition: str = "synthetic"
    verify: bool = True  # check a store's shard checksums before the run starts
    open_shards: int = 16  # per-worker LRU of open (memory-mapped) store shards
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    per_round: PerRoundConfig = field(default_factory=PerRoundConfig)
    per_client: PerClientConfig = field(default_factory=PerClientConfig)


@dataclass
class ModelConfig(Section):
    # a registered model (fedray.core.models.MODELS) or a user's, by import path:
    # module:Class or path/to/file.py:Class (a class or a function returning an nn.Module)
    name: str = "emnist_cnn"
    loss: str = "cross_entropy"  # cross_entropy | mse | bce | sequence_cross_entropy |
    # multi_label_bce
    # keyword arguments of a model named by import path (input_shape and num_classes come
    # from the data where its signature names them and these do not), or of a registered
    # model that takes some (its factory's keyword-only parameters: leaf_sent140_lstm's
    # vocab_size)
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class AlgorithmConfig(Section):
    """The algorithm's parts (fedray.algorithms): each a registered name or an import path
    ``module:Class``. Beside these keys the section is open: ``algorithm.<section>`` holds
    the hyper-parameters of the part whose section it is (``algorithm.fedprox.mu``), checked
    by that part when the job is validated (fedray.algorithms.registry.resolve)."""

    name: str = "fedavg"  # a preset; the parts below override it
    client: str | None = None  # client work (docs/algorithms.md lists the registered ones)
    aggregator: str | None = None  # the round's reduction
    server_opt: str | None = None  # the server optimizer (SERVEROPT)
    # who takes part in a round (docs/selection.md): uniform (the default), power_of_choice,
    # oort, or an import path; dropout, over-selection and the clock then act on its choice
    selector: str | None = None
    # update stages every client's update passes through, in order (docs/privacy.md):
    # dp, secagg, topk, quantize, or import paths; null: the preset's (none for most)
    stages: Any = None  # checked by the registry, which says what a list must hold


@dataclass
class AdversaryConfig(Section):
    """Malicious clients and what they do (fedray.runtime.adversary; docs/robustness.md):
    each client malicious with chance ``fraction``, fixed per (seed, client id), or the ids
    in ``clients``; ``attacks`` in order (registered names or import paths). Beside these
    keys the section is open: ``adversary.<section>`` holds an attack's hyper-parameters
    (``adversary.backdoor.target``). Off while ``attacks`` is empty."""

    fraction: float = 0.0
    clients: list[int] = field(default_factory=list)
    attacks: list[str] = field(default_factory=list)


@dataclass
class ClientConfig(Section):
    lr: float = 0.1
    batch_size: int = 20
    local_epochs: int = 1
    local_steps: int | None = None  # when set, exactly this many local steps (overrides epochs)
    # when set, each client's batch is 1/steps_per_epoch of its data (overrides batch_size)
    steps_per_epoch: int | None = None


@dataclass
class ServerConfig(Section):
    lr: float = 1.0
    momentum: float = 0.9  # server_opt: momentum, nesterov
    # server_opt: momentum, nesterov: m <- momentum m + (1 - dampening) delta (PyTorch's
    # dampening); 0 is the undamped heavy ball, = momentum the EMA of Chen et al.'s Alg. 1
    dampening: float = 0.0
    beta1: float = 0.9  # server_opt: adam, yogi, adagrad (first-moment decay, Reddi et al.)
    beta2: float = 0.99  # server_opt: adam, yogi
    tau: float = 1e-3  # adaptivity of adam, yogi, adagrad (Reddi et al.)


@dataclass
class SamplingConfig(Section):
    clients_per_round: int = 10
    always: list[int] = field(default_factory=list)  # client indices in every round
    dropout: float = 0.0  # chance that a sampled client drops out of the round
    over_selection: float = 0.0  # sample k * (1 + this), keep the k that finish first
    # > 0: buffered asynchronous training (FedBuff) on the simulated clock: this many
    # clients train at every simulated moment, and a round is a server step that applies
    # the first clients_per_round updates to arrive (needs clock.enabled)
    concurrency: int = 0
    # fixed: exactly clients_per_round clients a round; poisson: every client independently
    # with probability clients_per_round / population (what DP-FedAvg's accounting assumes)
    mode: str = "fixed"


@dataclass
class GuardConfig(Section):
    # a client update whose L2 norm exceeds this is dropped from its round (null: no bound);
    # updates with NaN or Inf are always dropped
    max_update_norm: float | None = None
    # a global model that turns non-finite, or a round whose every update was non-finite:
    # stop (one line, the last finite checkpoint kept) or warn (the run goes on, writing
    # nothing non-finite)
    non_finite: str = "stop"


@dataclass
class WorkerConfig(Section):
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    cache_mb: int = 256  # per-worker LRU of client data
    state_cache_mb: float = 64.0  # per-worker LRU of client state (SCAFFOLD's c_i)
    # a worker writes its round's client states into files (packs) of this many MiB each;
    # 0: one file per client (fedray.state.client_state)
    state_pack_mb: float = 8.0
    # how client state's float32 tensors are stored: float32, or float16 (half the disk;
    # read back as float32, so each stored state is rounded to float16 once per write)
    state_dtype: str = "float32"
    # train a worker's clients in groups, one batched step per group (fedray/kernels/vectorized.py):
    # auto (where the model supports it and it pays off), on, off
    vectorize: str = "auto"


@dataclass
class ReduceConfig(Section):
    # the reduction tree (fedray/runtime/reduction_tree.py): null, the driver merges every
    # worker's partial sum; G >= 2, partial sums are added in groups of G consecutive
    # worker slots, then the groups' sums by the driver
    group_size: int | None = None
    # where a group's sum is made: workers (the group's first worker, so the driver
    # receives one partial per group) or driver (the same sums, made by the driver)
    where: str = "workers"


# Ray's smallest object store (ray._private.ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES,
# 75 MiB), checked here without importing Ray; tests/runtime/test_session.py compares it with
# the installed Ray's
RAY_MIN_OBJECT_STORE_MB = 75


@dataclass
class RuntimeConfig(Section):
    address: str | None = None  # Ray address to connect to; None starts a local Ray
    num_workers: int | None = None  # None: as many as the cluster's resources allow
    num_cpus: int | None = None  # CPUs of a locally started Ray (None: all)
    num_gpus: float | None = None  # GPUs of a locally started Ray (None: detected)
    # object store of a locally started Ray, in MiB (None: Ray's default, 30% of memory);
    # at least Ray's minimum, RAY_MIN_OBJECT_STORE_MB
    object_store_mb: int | None = None
    # re-runs of a dead worker's clients allowed per round (process killed, OOM, node lost);
    # when they are spent the round fails, naming the clients and the error
    max_retries: int = 3
    # seconds a worker may take over its share of a round (or of an evaluation), counted
    # from when the round's tasks are sent; past it the worker counts as failed (frozen,
    # hung): it is killed and its clients re-run, as for a dead worker. None: no limit
    worker_timeout_s: float | None = None
    # MiB the driver may hold of a round's individual client updates (k x d float32), for
    # an aggregator that needs every one (Aggregator.individual); a job that could exceed
    # it is refused before round 1
    individual_updates_mb: float = 1024.0
    # MiB of client state a stateful run may keep on disk (SCAFFOLD's control variates, a
    # personal model per client): a run expected to keep more (fedray.state.client_state_disk)
    # is refused before round 1; None: no limit (the estimate is printed either way)
    client_state_mb: float | None = None
    # a locally started Ray's dashboard and job server: off (nothing listens for HTTP), or
    # on, listening on dashboard_host -- loopback unless set to an interface on purpose
    dashboard: bool = False
    dashboard_host: str = "127.0.0.1"
    # auto: the first rounds in the calling process, the rest on Ray when they are
    # projected to take over auto_inline_s there (fedray.runtime.handover); ray: the driver
    # and workers are Ray actors; inline: objects of the calling process, without Ray, one
    # task after another (debugging an algorithm with pdb, fast tests)
    backend: str = "auto"
    # seconds of rounds left, at the pace of those run so far, past which backend auto
    # hands the run from the calling process to Ray
    auto_inline_s: float = 20.0
    # local training's arithmetic (fedray/kernels/precision.py): fp32, or bf16 (each step's
    # forward pass under bfloat16 autocast; weights, gradients, losses and sums stay float32
    # or float64; evaluation stays float32)
    precision: str = "fp32"
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    reduce: ReduceConfig = field(default_factory=ReduceConfig)


@dataclass
class PersonalizeConfig(Section):
    # personalized evaluation: each federated-eval client fine-tunes a copy of the global
    # model on its own train split (local SGD from its own seed) before its test split is
    # evaluated; on when steps or epochs > 0. The global model is never touched.
    steps: int = 0  # local steps (takes precedence over epochs when > 0)
    epochs: int = 0  # or passes over the client's train split
    lr: float | None = None  # None: client.lr
    batch_size: int | None = None  # None: client.batch_size


@dataclass
class EvalConfig(Section):
    every: int = 1  # evaluate after every N-th round and after the last; 0: only after the last
    central: bool = True  # on the data set's central test set
    # also on the held-out data of this many fixed clients: pooled (fed_test_*), per-client
    # statistics (clients_*) and a per-client table per eval round (client_eval/)
    federated_clients: int = 0
    batch_size: int = 500
    personalize: PersonalizeConfig = field(default_factory=PersonalizeConfig)


@dataclass
class ClockDevicesConfig(Section):
    """clock.devices: each client's device (fedray.timing.devices): log-normal profiles
    drawn once per (seed, client id), or the rows of a device trace file."""

    source: str = "lognormal"  # lognormal | trace
    trace: str | None = None  # a device trace file (CSV, Arrow, parquet; docs/time.md)
    compute_s_per_example: float = 0.01  # median seconds per example per local pass
    compute_sigma: float = 0.7
    down_bytes_per_s: float = 2.5e6  # median download bandwidth
    down_sigma: float = 0.8
    up_bytes_per_s: float = 7.5e5  # median upload bandwidth
    up_sigma: float = 0.8


@dataclass
class ClockAvailabilityConfig(Section):
    """clock.availability: when a client is online (fedray.timing.availability)."""

    model: str = "always"  # always | diurnal | trace
    trace: str | None = None  # an availability trace file (model: trace)
    period_s: float = 86400.0  # diurnal: one window per period
    online_s: float = 28800.0  # diurnal: the window's length
    phase_spread_s: float | None = None  # diurnal: phases uniform in [0, this); None: period
    jitter_s: float = 0.0  # diurnal: window start jitter per period


@dataclass
class ClockConfig(Section):
    """clock: simulated time (docs/time.md). Off: no clock work at all."""

    enabled: bool = False
    devices: ClockDevicesConfig = field(default_factory=ClockDevicesConfig)
    availability: ClockAvailabilityConfig = field(default_factory=ClockAvailabilityConfig)
    deadline_s: float | None = None  # round deadline in simulated seconds; None: none
    down_bytes: float | None = None  # bytes down per update; None: 4 per model parameter
    up_bytes: float | None = None  # bytes up per update; None: 4 per model parameter
    max_sample_draws: int | None = None  # online sampler's bound; None: 1000 per client


@dataclass
class CheckpointConfig(Section):
    # write run_dir/checkpoint.safetensors after every N-th round and after the last, so
    # `fedray run --resume RUN_DIR` can continue; 0: only after the last round
    every: int = 10
    # also after a round that ends this many seconds or more after the last checkpoint (or
    # the first round's start): a run cut short redoes at most about this much work, however
    # long its rounds are; 0: rounds only (every)
    every_s: float = 10.0


@dataclass
class OutputConfig(Section):
    dir: str | None = None  # any fsspec URL; None: runs/<name>-<timestamp>
    save_weights: bool = True
    # each round's invited clients as participants/round_<r>.arrow (who arrived, loss,
    # examples, simulated duration); written anyway when the selector learns from them or
    # the client part records per-client values (IFCA's cluster)
    participants: bool = False
    tensorboard: bool = True  # metrics also as TensorBoard events in the run directory
    # log params and per-round metrics to MLflow (needs `pip install mlflow`); the tracking
    # server is MLFLOW_TRACKING_URI's, or ./mlruns
    mlflow: bool = False
    # log the config and per-round metrics to Weights & Biases (needs `pip install wandb`);
    # where to is W&B's environment (WANDB_MODE=offline: no network, WANDB_PROJECT)
    wandb: bool = False
    # fedray.tracking.callbacks.Callback subclasses as module:Class (a dotted module or a .py path),
    # instantiated with no arguments and called in the process that runs the job
    callbacks: list[str] = field(default_factory=list)


@dataclass
class FedrayConfig(Section):
    name: str = "fedray"
    seed: int = 0
    rounds: int = 10
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    adversary: AdversaryConfig = field(default_factory=AdversaryConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    clock: ClockConfig = field(default_factory=ClockConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    # the algorithm's parts and the attacks bring their own sections (algorithm.<section>,
    # adversary.<section>), checked by them
    OPEN_SECTIONS = ("algorithm", "adversary")


ConfigSource = str | os.PathLike | dict | DictConfig | FedrayConfig


def _typed_section(cls: type, tree: Mapping[str, Any], key: str) -> Any:
    """``tree`` (the section at ``key``) as a read-only ``cls``, its sub-sections typed
    too; keys beyond its fields are kept in ``sections`` where the section is open."""
    values = {}
    for f in dataclasses.fields(cls):
        value = tree[f.name] if f.name in tree else getattr(cls(), f.name)
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if isinstance(sub, type) and issubclass(sub, Section):
            values[f.name] = _typed_section(sub, value, f"{key}{f.name}.")
        else:
            values[f.name] = frozen(value)
    out = cls(**values)
    extra = {k: frozen(v) for k, v in tree.items() if k not in values}
    if extra:
        if key.rstrip(".") not in FedrayConfig.OPEN_SECTIONS:
            raise ConfigError(f"unknown config key '{key}{next(iter(extra))}'")
        object.__setattr__(out, "sections", FrozenMap(extra))
    object.__setattr__(out, "_typed", True)
    return out


def typed(cfg: Any) -> FedrayConfig:
    """The resolved job as immutable typed sections: what fedray.run hands the subsystems
    after ``load_config``, ``validate`` and ``with_algorithm`` (a DictConfig or its plain
    dict; config.yaml records the same tree)."""
    tree = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else cfg
    return _typed_section(FedrayConfig, tree, "")


# keys people look for where they are not: where they are (the selector is a part)
ELSEWHERE = {"sampling.selector": "algorithm.selector"}


def _one_line(exc: OmegaConfBaseException, schema: type, what: str) -> str:
    key = getattr(exc, "full_key", None) or getattr(exc, "key", None)
    msg = str(getattr(exc, "msg", None) or exc).splitlines()[0].strip()
    if type(exc).__name__ == "ConfigKeyError" and key:
        parent = ".".join(str(key).split(".")[:-1])
        node = OmegaConf.structured(schema)
        for part in filter(None, parent.split(".")):
            node = node.get(part) if isinstance(node, DictConfig) else None
        allowed = ", ".join(node.keys()) if isinstance(node, DictConfig) else ""
        where = f" under '{parent}'" if parent else ""
        hint = f"; did you mean {ELSEWHERE[str(key)]}?" if str(key) in ELSEWHERE else ""
        return (f"unknown {what} key '{key}'" + (f" (allowed{where}: {allowed})" if allowed
                                                 else "") + hint)
    if key:
        return str(key_error(str(key), msg, what=what))
    return msg


def _resolvers(value: str) -> list[str]:
    """The resolvers (``oc.env`` in ``${oc.env:HOME}``) a string value calls, read from
    omegaconf's own parse tree, so that spacing, nesting (``${a.${oc.env:X}}``) and escapes
    (``\\${oc.env:X}`` is text) count as omegaconf counts them. A value omegaconf cannot
    parse raises its GrammarParseError."""
    from omegaconf.grammar.gen.OmegaConfGrammarParser import OmegaConfGrammarParser
    from omegaconf.grammar_parser import parse

    found: list[str] = []
    stack = [parse(value)]
    while stack:
        node = stack.pop()
        if isinstance(node, OmegaConfGrammarParser.InterpolationResolverContext):
            found.append(node.resolverName().getText())
        stack.extend(getattr(node, "children", None) or [])
    return found


def check_interpolations(tree: Any, what: str = "config", prefix: str = "") -> None:
    """Refuse every omegaconf resolver (``${oc.env:VAR}``, ``${oc.decode:...}``, any
    ``${name:...}``) in a config tree as given -- a job, sweep or recipe file, a dict,
    ``key=value`` overrides, a run's or a sweep's saved YAML -- with one line naming the key.

    A resolver reads what the config does not hold (the environment, above all) and its
    value would be copied into config.yaml, summary.json, TensorBoard's hyper-parameters,
    the run directory's name and the closing line; ``${key}`` references to other keys of
    the same config are allowed, since they copy nothing from outside (docs/config.md,
    Interpolation). Every loader of a config passes its tree through here before omegaconf
    resolves anything."""
    if isinstance(tree, DictConfig | ListConfig):
        tree = OmegaConf.to_container(tree, resolve=False)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        tree = OmegaConf.to_container(OmegaConf.structured(tree), resolve=False)
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(
        tree, list | tuple) else ()
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, dict | list | tuple):
            check_interpolations(v, what, f"{key}.")
        elif isinstance(v, str):
            _check_interpolation(key, v, what)


def _check_interpolation(key: str, value: str, what: str) -> None:
    if "${" not in value:
        return
    try:
        names = _resolvers(value)
    except OmegaConfBaseException as exc:
        raise key_error(key, f"not a valid ${{...}} interpolation ({_grammar_problem(exc)})",
                        value, what=what) from None
    if names:
        raise key_error(key, f"the resolver {names[0]} is not allowed: only ${{key}} "
                        "references to other keys of the config are (docs/config.md, "
                        "Interpolation)", value, what=what)


def _grammar_problem(exc: BaseException) -> str:
    """omegaconf's grammar error without the value it repeats on its following lines."""
    text = str(getattr(exc, "msg", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _user_config(source: Any, schema: type, kind: str) -> DictConfig:
    if isinstance(source, schema):
        return OmegaConf.structured(source)
    if isinstance(source, DictConfig):
        return source
    if isinstance(source, dict):
        return OmegaConf.create(source)
    path = Path(source)
    if path.is_dir():
        raise ConfigError(f"{kind} file {path} is a directory; give a YAML file in it")
    if not path.is_file():
        raise ConfigError(f"{kind} file not found: {path}")
    try:
        loaded = OmegaConf.load(path)
    except Exception as exc:  # yaml.YAMLError and friends: what and where, in one line
        raise ConfigError(f"cannot parse {kind} file {path}: {yaml_problem(exc)}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{kind} file {path} must hold a mapping of keys")
    if not loaded:  # an empty file (or only comments) would silently run every default
        raise ConfigError(f"{kind} file {path} is empty: it sets no keys")
    return loaded


def _check_sections(schema: type, tree: Any, what: str, prefix: str = "") -> None:
    """A value where the schema has a section of keys (``client=5``) named by its key;
    omegaconf's own message names only the section's class."""
    if not isinstance(tree, dict | DictConfig):
        return
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if f.name in tree and typing.get_origin(hints.get(f.name)) is list:
            _check_list(hints[f.name], tree[f.name], f"{prefix}{f.name}", what)
        if f.name not in tree or not dataclasses.is_dataclass(hints.get(f.name)):
            continue
        sub, key = tree[f.name], f"{prefix}{f.name}"
        if not isinstance(sub, dict | DictConfig):
            allowed = ", ".join(x.name for x in dataclasses.fields(hints[f.name]))
            raise key_error(key, f"must be a section of keys ({allowed})", sub, what=what)
        _check_sections(hints[f.name], sub, what, f"{key}.")


def _check_list(hint: Any, value: Any, key: str, what: str) -> None:
    """A list key (``sampling.always``) is set whole, as a list of plain values: omegaconf
    fails with a TypeError on a mapping there (``sampling.always[0]=1`` and
    ``sampling.always.x=1`` are read as one) and lets a list of lists through to the
    checks that assume numbers (``sampling.always=[[1]]``)."""
    item = (typing.get_args(hint) or (Any,))[0]
    example = f"{key}=[{'0.5, 1.0' if item is float else 'a, b' if item is str else '1, 2'}]"
    if isinstance(value, dict | DictConfig):
        raise key_error(key, f"must be a list, set whole ({example}); items are not set one "
                        "by one", _plain(value), what=what)
    if isinstance(value, list | ListConfig) and item in (int, float, str) and any(
            isinstance(v, dict | list | DictConfig | ListConfig) for v in value):
        raise key_error(key, f"must be a list of {item.__name__} values ({example})",
                        _plain(value), what=what)


def _check_shapes(base: Any, tree: Any, what: str, prefix: str = "") -> None:
    """A list given where the config so far holds keys, or keys where it holds a list
    (``job=[a]`` over a sweep file's job, ``parameters=[1]``): omegaconf's merge fails
    there with a TypeError that names no key; the key is named here instead."""
    if not isinstance(base, DictConfig) or not isinstance(tree, dict | DictConfig):
        return
    items = tree.items_ex(resolve=False) if isinstance(tree, DictConfig) else tree.items()
    for k, v in items:  # nothing resolved: ${...} is resolved once, after the merge
        try:
            old = base._get_node(k, throw_on_missing_key=False)
        except OmegaConfBaseException:  # a key the schema lacks: the merge names it
            old = None
        if old is None or old._is_none() or old._is_missing() or old._is_interpolation():
            continue
        key = f"{prefix}{k}"
        if isinstance(old, DictConfig) and isinstance(v, list | ListConfig):
            raise key_error(key, "holds a section of keys, which a list cannot be merged "
                            "into", _plain(v), what=what)
        if isinstance(old, ListConfig) and isinstance(v, dict | DictConfig):
            raise key_error(key, f"holds a list, which keys cannot be merged into (a list is "
                            f"set whole: {key}=[a, b])", _plain(v), what=what)
        _check_shapes(old, v, what, f"{key}.")


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=False) if isinstance(
        value, DictConfig | ListConfig) else value


# keys that only one kind of file has (how many of them make it that kind), and the command
# that reads that kind: a file given to the wrong command (a sweep to `fedray run`) is told
# where it belongs rather than which of its keys is unknown; one misspelt key is not a kind
_KIND_MARKS = {"job": (1, ("rounds", "model", "client", "sampling", "runtime")),
               "sweep": (2, ("job", "parameters")), "recipe": (2, ("source", "partitioner"))}
FILE_COMMANDS = {"job": "fedray run", "sweep": "fedray sweep", "recipe": "fedray partition"}


def file_kind(keys: Any) -> str | None:
    """The kind of file (job, sweep, recipe) that these top-level keys mark, if any: what
    ``fedray jobs`` marks a sweep file by, and how a file given to the wrong command is
    told which one reads it."""
    keys = set(keys)
    for kind, (enough, marks) in _KIND_MARKS.items():
        if len(keys.intersection(marks)) >= enough:
            return kind
    return None


def _wrong_kind(user: DictConfig, schema: type, kind: str, source: Any) -> None:
    known = {f.name for f in dataclasses.fields(schema)}
    extra = [k for k in user.keys() if k not in known]
    other = file_kind(extra)
    if other is not None and other != kind:
        found = ", ".join(repr(k) for k in extra if k in _KIND_MARKS[other][1])
        raise ConfigError(f"{kind} file {source} is a {other} file (it has {found}): "
                          f"{FILE_COMMANDS[other]} {source}")


def load_structured(schema: type, source: Any, overrides: list[str] | tuple = (), *,
                    what: str = "config", kind: str = "job") -> DictConfig:
    """Merge ``schema`` defaults <- source (file, dict or config) <- ``key=value`` overrides.

    omegaconf checks key names and types against the dataclass ``schema``, and every number
    is finite (``check_finite``); every failure becomes one ConfigError line naming the key
    (``what`` names the kind of key in it: config, recipe, sweep).
    """
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override '{item}' is not of the form key=value")
        parts = len(item.split("=", 1)[0].split("."))
        if parts > MAX_KEY_PARTS:  # omegaconf recurses once per part, past Python's limit
            raise ConfigError(f"override '{item[:60]}...': its key has {parts} parts; a "
                              f"{what} key has at most {MAX_KEY_PARTS}")
        # as typed, before omegaconf parses it (which refuses a malformed ${ in its own words)
        _check_interpolation(*item.split("=", 1), what)
    try:
        cfg = OmegaConf.structured(schema)
        for key in getattr(schema, "OPEN_SECTIONS", ()):  # keys the schema cannot list
            OmegaConf.set_struct(cfg[key], False)
        if source is not None:
            user = _user_config(source, schema, kind)
            check_interpolations(user, what)
            if isinstance(source, str | os.PathLike):
                _wrong_kind(user, schema, kind, source)
            _check_sections(schema, user, what)
            _check_shapes(cfg, user, what)
            cfg = OmegaConf.merge(cfg, user)
        if overrides:
            dotlist = _dotlist(overrides)
            check_interpolations(dotlist, what)
            _check_sections(schema, dotlist, what)
            _check_shapes(cfg, dotlist, what)
            cfg = OmegaConf.merge(cfg, dotlist)
        # ${key} references resolved once, here, against the merged config (an override
        # of the key they name included): what is checked is what runs and is recorded
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as exc:
        raise ConfigError(_one_line(exc, schema, what)) from None
    _no_literal_interpolation(OmegaConf.to_container(cfg, resolve=False), what)
    check_finite(cfg, what)
    return cfg


def _dotlist(overrides: list[str] | tuple) -> DictConfig:
    """``key=value`` overrides as a config. omegaconf reads each value as YAML and lets
    PyYAML's error through (``sampling.always=[1, [2``, ``name=[${seed}]``): the override
    that YAML cannot read is named in one line, with where in its value."""
    import yaml

    try:
        return OmegaConf.from_dotlist(list(overrides))
    except yaml.YAMLError:
        for item in overrides:
            try:
                OmegaConf.from_dotlist([item])
            except yaml.YAMLError as exc:
                raise ConfigError(f"override '{item}': its value is not valid YAML: "
                                  f"{yaml_problem(exc)}") from None
        raise
    except (TypeError, ValueError, IndexError, KeyError):
        # omegaconf's own errors when one override sets a key to a value (a list) and a
        # later one sets a key inside it (client.lr=[1, 2] client.lr.x=1); or a value that
        # is not text YAML can read (argv bytes that are not UTF-8)
        for item in overrides:
            try:
                OmegaConf.from_dotlist([item])
            except (TypeError, ValueError, IndexError, KeyError) as exc:
                raise ConfigError(f"override '{item}' cannot be read: "
                                  f"{one_line(exc)}") from None
        for i, item in enumerate(overrides):
            try:
                OmegaConf.from_dotlist(list(overrides[:i + 1]))
            except (TypeError, ValueError, IndexError, KeyError):
                key = item.split("=", 1)[0]
                earlier = [o for o in overrides[:i]
                           if key.startswith(o.split("=", 1)[0].rstrip(".") + ".")]
                raise ConfigError(
                    f"override '{item}' sets a key inside the value that "
                    + (f"'{earlier[-1]}'" if earlier else "an override before it")
                    + " sets; set the key once") from None
        raise


def _no_literal_interpolation(tree: Any, what: str, prefix: str = "") -> None:
    """A resolved value that still reads as an interpolation is refused: an escaped
    ``\\${oc.env:X}`` resolves to the text ``${oc.env:X}``, which omegaconf then reads as
    an interpolation again on the next access (and so would --resume in config.yaml)."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, dict | list):
            _no_literal_interpolation(v, what, f"{key}.")
        elif isinstance(v, str) and "${" in v:
            raise key_error(key, "'${' may appear only in a ${key} reference to another key",
                            v, what=what)


def load_config(source: ConfigSource | None = None,
                overrides: list[str] | tuple = ()) -> DictConfig:
    """A job's config: defaults <- job (file, dict or config) <- ``key=value`` overrides.

    Returns a read-only DictConfig typed as FedrayConfig. Semantic checks that need the data
    (population size) happen in ``validate``.
    """
    cfg = load_structured(FedrayConfig, source, overrides)
    w = cfg.runtime.worker  # YAML 1.1 reads on/off as booleans, which a str key gets as text
    if w.vectorize in ("True", "False"):
        w.vectorize = "on" if w.vectorize == "True" else "off"
    if cfg.output.dir is None:
        cfg.output.dir = f"runs/{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    OmegaConf.set_readonly(cfg, True)
    return cfg


def flat_keys(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config container (plain dicts) as ``{"dotted.key": value}``: how configs are
    compared on resume and logged as MLflow params."""
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(flat_keys(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def _require(ok: bool, key: str, rule: str, value: Any) -> None:
    if not ok:
        raise key_error(key, rule, value)


def check_finite(cfg: Any, what: str = "config", prefix: str = "") -> None:
    """Every float-valued key is a finite number: an infinite learning rate or proximal
    weight passes every ``> 0`` check and then drops each update as non-finite, so a run
    would end "successfully" without training. One walk over the whole tree, for every key
    present and future."""
    items = cfg.items() if isinstance(cfg, dict | DictConfig) else enumerate(cfg)
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, dict | DictConfig | list | ListConfig):
            check_finite(v, what, f"{key}.")
        elif isinstance(v, float) and not math.isfinite(v):
            raise key_error(key, "must be a finite number", v, what=what)


def _validate_clock(cfg: DictConfig) -> None:
    """clock.*: checked whether or not the clock is on, so a typo waits for no run."""
    r = _require
    ck = cfg.clock
    d, a = ck.devices, ck.availability
    r(d.source in ("lognormal", "trace"), "clock.devices.source", "must be lognormal or trace",
      d.source)
    r(d.source != "trace" or bool(d.trace), "clock.devices.trace",
      "must name a device trace file when clock.devices.source is trace", d.trace)
    for key in ("compute_s_per_example", "down_bytes_per_s", "up_bytes_per_s"):
        r(d[key] > 0, f"clock.devices.{key}", "must be > 0", d[key])
    for key in ("compute_sigma", "down_sigma", "up_sigma"):
        r(d[key] >= 0, f"clock.devices.{key}", "must be >= 0", d[key])
    r(a.model in ("always", "diurnal", "trace"), "clock.availability.model",
      "must be always, diurnal or trace", a.model)
    r(a.model != "trace" or bool(a.trace), "clock.availability.trace",
      "must name an availability trace file when clock.availability.model is trace", a.trace)
    r(a.period_s > 0, "clock.availability.period_s", "must be > 0", a.period_s)
    r(0 < a.online_s <= a.period_s, "clock.availability.online_s",
      "must be in (0, clock.availability.period_s]", a.online_s)
    r(a.jitter_s >= 0 and a.online_s + a.jitter_s <= a.period_s, "clock.availability.jitter_s",
      "must be >= 0 with online_s + jitter_s <= period_s", a.jitter_s)
    r(a.phase_spread_s is None or 0 < a.phase_spread_s <= a.period_s,
      "clock.availability.phase_spread_s", "must be in (0, period_s]", a.phase_spread_s)
    r(ck.deadline_s is None or ck.deadline_s > 0, "clock.deadline_s", "must be > 0",
      ck.deadline_s)
    for key in ("down_bytes", "up_bytes"):
        r(ck[key] is None or ck[key] >= 0, f"clock.{key}", "must be >= 0", ck[key])
    r(ck.max_sample_draws is None or ck.max_sample_draws >= 1, "clock.max_sample_draws",
      "must be >= 1", ck.max_sample_draws)
    sm = cfg.sampling
    r(sm.concurrency >= 0, "sampling.concurrency", "must be >= 0", sm.concurrency)
    r(not sm.concurrency or ck.enabled, "sampling.concurrency",
      "needs clock.enabled: buffered asynchronous training runs on the simulated clock",
      sm.concurrency)
    r(not sm.concurrency or not (sm.over_selection or sm.dropout), "sampling.concurrency",
      "cannot be combined with sampling.over_selection or sampling.dropout (clients leave "
      "by going offline on the clock)", sm.concurrency)
    r(not (ck.enabled and len(cfg.sampling.always)), "sampling.always",
      "cannot be combined with clock.enabled: a pinned client may be offline",
      list(cfg.sampling.always))


def _check_fixed_composition(cfg: DictConfig, per_round: Any, population: int) -> None:
    """A fixed composition (``data.per_round.imbalance.composition`` or
    ``label_flip.corrupted``) deals its conditions over the round's invited clients: every
    round must invite the same number, which Poisson sampling and buffered training do not."""
    key = ("data.per_round.imbalance.composition" if per_round.composition
           else "data.per_round.label_flip.corrupted")
    sm = cfg.sampling
    for other, on, value in (("sampling.mode", sm.mode == "poisson", sm.mode),
                             ("sampling.concurrency", sm.concurrency, sm.concurrency)):
        if on:
            raise key_error(other, f"cannot be combined with {key} (a fixed composition "
                            "needs the same number of clients invited every round)", value)
    # imported when used, not at the top: numpy, which a job's first errors need not wait
    # for (start-up time)
    from fedray.core.sampling import over_selected

    k = sm.clients_per_round
    n = over_selected(k, sm.over_selection, population) if 1 <= k <= population else k
    per_round.check_cohort(n, "sampling invites" if n == k else
                           "sampling (with over_selection) invites")


def validate(cfg: DictConfig, population: int, *, custom_model: bool = False) -> None:
    """Reject impossible values with one line naming the key and what is allowed."""
    r = _require
    r(cfg.seed >= 0, "seed", "must be >= 0", cfg.seed)
    r(cfg.rounds >= 1, "rounds", "must be >= 1", cfg.rounds)
    # the name is the run directory's (runs/<name>-<time>) and TensorBoard's: a newline, an
    # escape sequence, a right-to-left override or 300 characters make a directory name
    # that a listing garbles or the filesystem refuses
    r(bool(cfg.name) and "/" not in cfg.name and cfg.name.isprintable()
      and len(cfg.name.encode("utf-8", "surrogateescape")) <= MAX_NAME_BYTES, "name",
      f"must be a non-empty name of printable characters without '/', at most "
      f"{MAX_NAME_BYTES} bytes", cfg.name)
    r(bool(cfg.data.partition), "data.partition",
      "must be 'synthetic' or the path or URL of a partition store", cfg.data.partition)
    r(cfg.data.open_shards >= 1, "data.open_shards", "must be >= 1", cfg.data.open_shards)
    # imported when used, not at the top: numpy, and torch below, which a job's first
    # errors (unknown keys, wrong types) need not wait for (start-up time)
    from fedray.data.transforms.per_client import parse_per_client
    from fedray.data.transforms.per_round import parse_per_round

    # one line naming the key of an impossible value
    per_round = parse_per_round(cfg.data.per_round)
    parse_per_client(cfg.data.per_client, per_round)
    syn = cfg.data.synthetic
    if cfg.data.partition == "synthetic":
        r(1 <= syn.num_clients <= MAX_SYNTHETIC_CLIENTS, "data.synthetic.num_clients",
          f"must be in 1..{MAX_SYNTHETIC_CLIENTS:,}", syn.num_clients)
        r(syn.min_examples >= 1, "data.synthetic.min_examples", "must be >= 1", syn.min_examples)
        r(syn.max_examples >= syn.min_examples, "data.synthetic.max_examples",
          f"must be >= data.synthetic.min_examples ({syn.min_examples})", syn.max_examples)
        r(0.0 <= syn.test_fraction < 1.0, "data.synthetic.test_fraction", "must be in [0, 1)",
          syn.test_fraction)
        r(syn.test_writers >= 0, "data.synthetic.test_writers", "must be >= 0", syn.test_writers)
        r(syn.seed >= 0, "data.synthetic.seed", "must be >= 0", syn.seed)
    sv = cfg.server
    r(0 <= sv.momentum < 1, "server.momentum", "must be in [0, 1)", sv.momentum)
    r(0 <= sv.dampening < 1, "server.dampening", "must be in [0, 1)", sv.dampening)
    r(0 <= sv.beta1 < 1, "server.beta1", "must be in [0, 1)", sv.beta1)
    r(0 <= sv.beta2 < 1, "server.beta2", "must be in [0, 1)", sv.beta2)
    r(sv.tau > 0, "server.tau", "must be > 0", sv.tau)
    c = cfg.client
    r(c.lr >= 0, "client.lr", "must be >= 0 (0 only for a client part that allows it, "
      "e.g. local_update)", c.lr)
    r(c.batch_size >= 1, "client.batch_size", "must be >= 1", c.batch_size)
    r(c.local_epochs >= 1, "client.local_epochs", "must be >= 1", c.local_epochs)
    r(c.local_steps is None or c.local_steps >= 1, "client.local_steps",
      "must be >= 1 or null", c.local_steps)
    r(c.steps_per_epoch is None or c.steps_per_epoch >= 1, "client.steps_per_epoch",
      "must be >= 1 or null", c.steps_per_epoch)
    r(cfg.server.lr > 0, "server.lr", "must be > 0", cfg.server.lr)
    k = cfg.sampling.clients_per_round
    r(k >= 1, "sampling.clients_per_round", "must be >= 1", k)
    r(k <= population, "sampling.clients_per_round",
      f"must be <= the population of {population} clients", k)
    sm = cfg.sampling
    r(0.0 <= sm.dropout < 1.0, "sampling.dropout", "must be in [0, 1)", sm.dropout)
    r(sm.over_selection >= 0.0, "sampling.over_selection", "must be >= 0", sm.over_selection)
    r(sm.mode in ("fixed", "poisson"), "sampling.mode", "must be fixed or poisson", sm.mode)
    if sm.mode == "poisson":  # who takes part is each client's own coin: nothing to pin,
        for key, on in (("sampling.always", len(sm.always)),  # rank or schedule
                        ("sampling.over_selection", sm.over_selection),
                        ("clock.enabled", cfg.clock.enabled)):
            r(not on, key, "cannot be combined with sampling.mode=poisson", on if
              key != "sampling.always" else list(sm.always))
    if per_round is not None and per_round.ranked:
        _check_fixed_composition(cfg, per_round, population)
    bound = cfg.guard.max_update_norm
    r(bound is None or bound > 0, "guard.max_update_norm", "must be > 0 or null", bound)
    r(cfg.guard.non_finite in ("stop", "warn"), "guard.non_finite", "must be stop or warn",
      cfg.guard.non_finite)
    always = list(cfg.sampling.always)
    r(len(set(always)) == len(always), "sampling.always", "must not repeat a client", always)
    r(all(0 <= a < population for a in always), "sampling.always",
      f"must be client indices in 0..{population - 1}", always)
    r(len(always) <= k, "sampling.always",
      f"must not name more clients than sampling.clients_per_round ({k})", always)
    rt = cfg.runtime
    r(rt.num_workers is None or rt.num_workers >= 1, "runtime.num_workers",
      "must be >= 1 or null (as many as resources allow)", rt.num_workers)
    r(rt.num_cpus is None or rt.num_cpus >= 1, "runtime.num_cpus", "must be >= 1 or null",
      rt.num_cpus)
    r(rt.num_gpus is None or rt.num_gpus >= 0, "runtime.num_gpus", "must be >= 0 or null",
      rt.num_gpus)
    r(rt.max_retries >= 0, "runtime.max_retries", "must be >= 0", rt.max_retries)
    r(rt.object_store_mb is None or rt.object_store_mb >= RAY_MIN_OBJECT_STORE_MB,
      "runtime.object_store_mb", f"must be >= {RAY_MIN_OBJECT_STORE_MB} (Ray's smallest "
      "object store, in MiB) or null", rt.object_store_mb)
    r(rt.worker_timeout_s is None or rt.worker_timeout_s > 0, "runtime.worker_timeout_s",
      "must be > 0 or null (no limit)", rt.worker_timeout_s)
    r(rt.backend in ("auto", "ray", "inline"), "runtime.backend", "must be auto, ray or inline",
      rt.backend)
    r(rt.auto_inline_s >= 0, "runtime.auto_inline_s", "must be >= 0", rt.auto_inline_s)
    r(rt.precision in ("fp32", "bf16"), "runtime.precision", "must be fp32 or bf16",
      rt.precision)
    r(rt.individual_updates_mb > 0, "runtime.individual_updates_mb", "must be > 0",
      rt.individual_updates_mb)
    w = rt.worker
    r(w.num_cpus > 0, "runtime.worker.num_cpus", "must be > 0", w.num_cpus)
    r(w.num_gpus >= 0 and (w.num_gpus <= 1 or float(w.num_gpus).is_integer()),
      "runtime.worker.num_gpus", "must be a fraction in [0, 1] or a whole number", w.num_gpus)
    r(w.cache_mb >= 0, "runtime.worker.cache_mb", "must be >= 0", w.cache_mb)
    r(w.state_cache_mb >= 0, "runtime.worker.state_cache_mb", "must be >= 0", w.state_cache_mb)
    r(math.isfinite(w.state_pack_mb) and w.state_pack_mb >= 0, "runtime.worker.state_pack_mb",
      "must be a finite number >= 0", w.state_pack_mb)
    r(w.state_dtype in ("float32", "float16"), "runtime.worker.state_dtype",
      "must be float32 or float16", w.state_dtype)
    r(rt.client_state_mb is None or (math.isfinite(rt.client_state_mb)
                                     and rt.client_state_mb > 0),
      "runtime.client_state_mb", "must be a number > 0 (MiB), or null for no limit",
      rt.client_state_mb)
    r(w.vectorize in ("auto", "on", "off"), "runtime.worker.vectorize",
      "must be auto, on or off", w.vectorize)
    red = rt.reduce
    r(red.group_size is None or red.group_size >= 2, "runtime.reduce.group_size",
      "must be >= 2 or null (every worker's partial sum merged by the driver)", red.group_size)
    r(red.where in ("workers", "driver"), "runtime.reduce.where", "must be workers or driver",
      red.where)
    e = cfg.eval
    r(e.every >= 0, "eval.every", "must be >= 0", e.every)
    r(e.federated_clients >= 0, "eval.federated_clients", "must be >= 0", e.federated_clients)
    r(e.federated_clients <= population, "eval.federated_clients",
      f"must be <= the population of {population} clients", e.federated_clients)
    r(e.batch_size >= 1, "eval.batch_size", "must be >= 1", e.batch_size)
    p = e.personalize
    r(p.steps >= 0, "eval.personalize.steps", "must be >= 0", p.steps)
    r(p.epochs >= 0, "eval.personalize.epochs", "must be >= 0", p.epochs)
    r(p.lr is None or p.lr > 0, "eval.personalize.lr", "must be > 0", p.lr)
    r(p.batch_size is None or p.batch_size >= 1, "eval.personalize.batch_size", "must be >= 1",
      p.batch_size)
    r(not (p.steps or p.epochs) or e.federated_clients > 0, "eval.personalize",
      "needs eval.federated_clients > 0: clients are personalized on their own train split "
      "and evaluated on their own test split", p.steps or p.epochs)
    r(cfg.checkpoint.every >= 0, "checkpoint.every", "must be >= 0", cfg.checkpoint.every)
    r(math.isfinite(cfg.checkpoint.every_s) and cfg.checkpoint.every_s >= 0,
      "checkpoint.every_s", "must be a finite number >= 0 (0: checkpoint by rounds only)",
      cfg.checkpoint.every_s)
    _validate_clock(cfg)
    r(bool(cfg.output.dir), "output.dir", "must be a path or URL", cfg.output.dir)

    for ref in cfg.output.callbacks:  # importable, and a Callback (instantiated at the start)
        callback_class(ref)
    # last: the model and loss registries import torch, which a typo in any other
    # key should not wait for
    # imported when used, not at the top: it loads torch (start-up time)
    from fedray.core.losses import LOSSES
    from fedray.core.models import MODELS, registered_args, user_model

    args = OmegaConf.to_container(cfg.model.args, resolve=True)
    takes = (registered_args(cfg.model.name) if not custom_model and
             cfg.model.name in MODELS else ())
    if custom_model or not is_import_path(cfg.model.name) and not takes:
        r(not args, "model.args", "sets the arguments of a model named by import path "
          f"(module:Class); {cfg.model.name} takes none", args)
    elif takes:
        unknown = sorted(set(args) - set(takes))
        r(not unknown, "model.args", f"{cfg.model.name} takes only {', '.join(takes)}", args)
    if not custom_model and is_import_path(cfg.model.name):
        user_model(cfg.model.name, args)  # importable, a model, and takes model.args
    elif not custom_model:
        r(cfg.model.name in MODELS, "model.name", f"must be one of: {', '.join(MODELS)} (or "
          "an import path module:Class)", cfg.model.name)
    r(cfg.model.loss in LOSSES, "model.loss", f"must be one of: {', '.join(LOSSES)}",
      cfg.model.loss)
    # the algorithm's parts check their own sections when fedray.api.prepare resolves them
    # (with_algorithm), right after this, and the adversary's section with them


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def to_dict(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
