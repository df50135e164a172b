"""Checkpoints and ``fedray run --resume``: a run killed at any moment continues bit-identically.

A checkpoint is one file, ``checkpoint.safetensors`` in the run directory, replaced
atomically (written to a temporary name, then renamed, through fsspec) after every
``checkpoint.every``-th round and after the last. It holds everything the rounds after it
depend on:

  weights                  the global model, flat float32
  server_opt.*             the server optimizer's state (momentum, Adam moments, step count)
  aggregator.*             the aggregator's state (SCAFFOLD's server control variate c)
  client_state.ids         the clients that have stored state (sorted, int64), and
  client_state.versions    the version (round) of each one's state that is current at the
                           checkpoint (SCAFFOLD's c_i; fedray.state.client_state.ClientVersions);
  client_state.packs       and the pack that holds it (-1: a file of its own; checkpoints
                           written before packs have none: every client's is its own file);
                           checkpoints of earlier fedray versions hold one int32 per client of
                           the population instead (client_state.version), and still resume

and, in the safetensors header's metadata (JSON text, never code), the round it was taken
after, the metrics lines of rounds 1..round, with client state the population, and the
run's identity: its run id (made when the run starts, also on config.yaml's first line),
the resolved config it ran under (credentials masked) and that config's fingerprint
(``config_sha256``, less the keys in RESUME_SAFE and output.dir). The sampler needs no
state of its own: every round's selection and every client's randomness derive from
(seed, round, client id).

Resuming re-reads the job's config (the run's config.yaml, or a job file given again) and
refuses (``check_resume``) a checkpoint whose run id is not the run directory's, and any
difference from the config the checkpoint records -- a hand-edited config.yaml as much as
an override -- naming the keys, unless each is named with ``--allow-change``. A key in
``RESUME_SAFE`` cannot change the rounds already run; any other changes the rounds after
the checkpoint, and the resume says so.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import fsspec
import numpy as np
from omegaconf import DictConfig, OmegaConf

from fedray.config import FedrayConfig, check_interpolations, flat_keys
from fedray.errors import FedrayError, yaml_problem
from fedray.state.redact import MASK, mask_tree

if TYPE_CHECKING:  # `fedray run --resume` compares configs, and fails there, without torch
    import torch

    from fedray.state.client_state import ClientVersions

CHECKPOINT_FILE = "checkpoint.safetensors"
CONFIG_FILE = "config.yaml"
_META = "fedray_checkpoint"
_DENSE_VERSIONS = "client_state.version"  # one per client: checkpoints before the sparse index
_IDS, _VERSIONS = "client_state.ids", "client_state.versions"
_PACKS = "client_state.packs"

# keys that cannot change what a round computes (left out of the config's fingerprint; a
# resume that changes one, named with --allow-change, still continues bit-identically):
# they decide how long to run, how often to evaluate or checkpoint, and where the work runs
# (runtime.* with the pool size unchanged; a different pool size changes float64 sums by
# ~1e-16, see docs/fault_tolerance.md)
RESUME_SAFE = ("rounds", "eval.every", "eval.batch_size", "checkpoint.",
               "output.save_weights", "output.tensorboard", "output.mlflow", "output.wandb",
               "output.callbacks", "runtime.")


@dataclass
class Checkpoint:
    round: int
    weights: torch.Tensor
    server_state: dict[str, torch.Tensor]  # server_opt.* and aggregator.*
    # the client state index, or None without client state (encode also takes one int per
    # client of the population, 0: none)
    client_versions: ClientVersions | np.ndarray | None
    metrics_lines: list[str]  # metrics.jsonl lines of rounds 1..round
    # which run wrote it (config.yaml's first line names the run directory's: RUN_ID_LINE)
    # and the resolved config it ran under (credentials masked): --resume compares both.
    # None in checkpoints of earlier fedray versions
    run_id: str | None = None
    config: dict | None = None


def encode(ckpt: Checkpoint) -> bytes:
    import torch
    from safetensors.torch import save as save_safetensors

    # imported when used, not at the top: it loads safetensors, torch (start-up time)
    from fedray.state.client_state import ClientVersions

    tensors = {"weights": ckpt.weights.detach().cpu().contiguous(),
               **{k: v.detach().cpu().contiguous() for k, v in ckpt.server_state.items()}}
    meta = {"round": ckpt.round, "metrics": ckpt.metrics_lines}
    if ckpt.run_id is not None:
        meta["run_id"] = ckpt.run_id
    if ckpt.config is not None:
        meta["config"] = ckpt.config
        meta["config_sha256"] = config_fingerprint(ckpt.config)
    index = ckpt.client_versions
    if index is not None:
        if not isinstance(index, ClientVersions):
            index = ClientVersions.from_dense(index)
        ids, versions = index.arrays()
        tensors[_IDS] = torch.from_numpy(np.ascontiguousarray(ids))
        tensors[_VERSIONS] = torch.from_numpy(np.ascontiguousarray(versions))
        tensors[_PACKS] = torch.from_numpy(np.ascontiguousarray(index.packs()))
        meta["clients"] = index.population
    return save_safetensors(tensors, metadata={_META: json.dumps(meta)})


def _header_metadata(data: bytes) -> dict:
    """The ``__metadata__`` of a safetensors file: an 8-byte length, then a JSON header."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]).get("__metadata__") or {}


def _count(meta: dict, key: str, least: int) -> int:
    value = meta[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"'{key}' must be an integer >= {least}, got {value!r}")
    return value


def _header_values(meta: Any) -> tuple[int, list[str]]:
    """The round and the metrics lines of a checkpoint's header, checked: what a resumed
    run starts from must be a round that can have happened (an integer >= 1, not -5 or
    2.5) with at most that many metrics lines, each a JSON object of a round up to it. A
    header edited by hand, or written by something else, is refused here rather than
    resumed into negative rounds or failing in the driver."""
    if not isinstance(meta, dict):
        raise ValueError(f"its {_META} header must be a JSON object")
    rnd = _count(meta, "round", 1)
    lines = meta["metrics"]
    if not isinstance(lines, list) or len(lines) > rnd:
        raise ValueError(f"'metrics' must be a list of at most {rnd} lines (one per round)")
    for i, line in enumerate(lines):
        record = json.loads(line) if isinstance(line, str) else None
        r = record.get("round", 1) if isinstance(record, dict) else None
        if not isinstance(r, int) or isinstance(r, bool) or not 1 <= r <= rnd:
            raise ValueError(f"metrics line {i + 1} must be a JSON object of a round in "
                             f"1..{rnd}")
    return rnd, lines


def decode(data: bytes, where: str) -> Checkpoint:
    from safetensors.torch import load as load_safetensors

    # imported when used, not at the top: it loads safetensors, torch (start-up time)
    from fedray.state.client_state import ClientVersions

    try:
        tensors = load_safetensors(data)
        meta = json.loads(_header_metadata(data)[_META])
        rnd, lines = _header_values(meta)
        weights = tensors.pop("weights")
        run_id, config = _identity(meta)
        dense, ids, versions, packs = (tensors.pop(k, None) for k in (
            _DENSE_VERSIONS, _IDS, _VERSIONS, _PACKS))
        index = None
        if dense is not None:
            index = ClientVersions.from_dense(dense.numpy())
        elif ids is not None or versions is not None:
            if ids is None or versions is None:
                raise KeyError(_IDS if ids is None else _VERSIONS)
            index = ClientVersions.from_arrays(_count(meta, "clients", 1), ids.numpy(),
                                               versions.numpy(),
                                               None if packs is None else packs.numpy())
        if index is not None and len(index) and int(index.arrays()[1].max()) > rnd:
            raise ValueError(f"a client state version after the checkpoint's round {rnd}")
    except Exception as exc:  # safetensors, struct, JSON, key and index errors alike
        raise FedrayError(f"checkpoint {where} is corrupt: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    return Checkpoint(round=rnd, weights=weights, server_state=tensors,
                      client_versions=index, metrics_lines=lines, run_id=run_id,
                      config=config)


def read_checkpoint(run_dir: str) -> Checkpoint | None:
    """The run's checkpoint, or None if it has none yet (killed before the first one)."""
    fs, path = fsspec.core.url_to_fs(run_dir)
    file = f"{path.rstrip('/')}/{CHECKPOINT_FILE}"
    try:
        data = fs.cat_file(file)
    except FileNotFoundError:
        return None
    return decode(data, fs.unstrip_protocol(file))


# config.yaml's first line: the run's id, made when the run starts and kept by every resume;
# its checkpoints carry the same id, so that one copied from another run is refused
RUN_ID_LINE = "# fedray run {}: its checkpoints carry this id (fedray run --resume checks it)\n"
_RUN_ID = re.compile(r"\A# fedray run ([0-9a-f]{8,64}):")
_HEADER_MAX = 1 << 28  # bytes of a checkpoint's JSON header read to check it: 256 MiB


def new_run_id() -> str:
    """A random run id: 64 bits, as 16 hex digits."""
    return uuid.uuid4().hex[:16]


def saved_run_id(run_dir: str) -> str | None:
    """The run id on the first line of a run directory's config.yaml; None for a run of an
    earlier fedray, or a config.yaml rewritten without it."""
    fs, path = fsspec.core.url_to_fs(run_dir)
    try:
        with fs.open(f"{path.rstrip('/')}/{CONFIG_FILE}", "rb") as f:
            first = f.read(200).decode(errors="replace")
    except FileNotFoundError:
        return None
    found = _RUN_ID.match(first)
    return found.group(1) if found else None


def recorded_config(cfg: DictConfig | dict) -> dict:
    """The resolved config as a checkpoint records it: plain values, credentials masked
    (as in config.yaml), so that a resume can name each key that differs."""
    tree = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    return mask_tree(tree)


def config_fingerprint(config: dict) -> str:
    """sha256 of what a run computes: the recorded config less ``output.dir`` (the run
    directory itself, which may move) and the RESUME_SAFE keys (how long, how often to
    evaluate or checkpoint, where the work runs), as canonical JSON."""
    flat = {k: v for k, v in flat_keys(config).items() if k != "output.dir" and not _safe(k)}
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=repr).encode()).hexdigest()


def _identity(meta: dict) -> tuple[str | None, dict | None]:
    """A checkpoint header's run id and recorded config, checked (both absent in a
    checkpoint of an earlier fedray): a config that does not hash to its fingerprint was
    edited, or written by something else."""
    run_id, config = meta.get("run_id"), meta.get("config")
    if run_id is not None and not (isinstance(run_id, str) and _RUN_ID.match(
            f"# fedray run {run_id}:")):
        raise ValueError(f"'run_id' must be 8 to 64 hex digits, got {run_id!r}")
    if config is not None:
        if not isinstance(config, dict):
            raise ValueError("'config' must be a JSON object")
        if meta.get("config_sha256") != config_fingerprint(config):
            raise ValueError("its recorded config does not match its fingerprint "
                             "(config_sha256)")
    return run_id, config


@dataclass
class CheckpointHeader:
    """What --resume checks before anything starts: a checkpoint's header alone."""

    round: int
    run_id: str | None
    config: dict | None


def read_checkpoint_header(run_dir: str) -> CheckpointHeader | None:
    """A run's checkpoint header (round, run id, recorded config), read without its
    tensors, or None if the run has no checkpoint yet: the resume check runs in the
    ``fedray`` process before torch is imported, and a large model's weights are not read
    twice."""
    fs, path = fsspec.core.url_to_fs(run_dir)
    file = f"{path.rstrip('/')}/{CHECKPOINT_FILE}"
    where = fs.unstrip_protocol(file)
    try:
        with fs.open(file, "rb") as f:
            head = f.read(8)
            (n,) = struct.unpack("<Q", head) if len(head) == 8 else (-1,)
            if not 0 < n <= _HEADER_MAX:
                raise ValueError(f"a header of {n} bytes")
            header = json.loads(f.read(n))
        meta = json.loads((header.get("__metadata__") or {})[_META])
        if not isinstance(meta, dict):
            raise ValueError(f"its {_META} header must be a JSON object")
        rnd = meta["round"]
        if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 1:
            raise ValueError(f"'round' must be an integer >= 1, got {rnd!r}")
        run_id, config = _identity(meta)
    except FileNotFoundError:
        return None
    except Exception as exc:  # struct, JSON, key and value errors alike
        raise FedrayError(f"checkpoint {where} is corrupt: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    return CheckpointHeader(round=rnd, run_id=run_id, config=config)


def saved_config(run_dir: str) -> DictConfig:
    """The config a run started with (its config.yaml, credentials masked)."""
    fs, path = fsspec.core.url_to_fs(run_dir)
    try:
        text = fs.cat_file(f"{path.rstrip('/')}/{CONFIG_FILE}").decode()
    except FileNotFoundError:
        raise FedrayError(f"--resume {run_dir}: not a fedray run directory (no "
                          f"{CONFIG_FILE})") from None
    except UnicodeDecodeError:
        raise FedrayError(f"--resume {run_dir}: its {CONFIG_FILE} is not text") from None
    try:
        cfg = OmegaConf.create(text)
    except Exception as exc:  # yaml's and omegaconf's own errors: where, in one line
        raise FedrayError(f"--resume {run_dir}: its {CONFIG_FILE} is not valid YAML: "
                          f"{yaml_problem(exc)}") from None
    if not isinstance(cfg, DictConfig):
        raise FedrayError(f"--resume {run_dir}: its {CONFIG_FILE} is not a mapping of keys")

    try:  # before anything resolves it: a crafted ${oc.env:...} would read the environment
        check_interpolations(cfg)
    except FedrayError as exc:
        raise FedrayError(f"--resume {run_dir}: its {CONFIG_FILE}: {exc}") from None
    return cfg


def _safe(key: str) -> bool:
    return any(key == s or (s.endswith(".") and key.startswith(s)) for s in RESUME_SAFE)


def masked_keys(cfg: DictConfig) -> list[str]:
    """Keys whose saved value was masked: config.yaml alone cannot restore them."""
    return [k for k, v in flat_keys(OmegaConf.to_container(cfg, resolve=True)).items()
            if isinstance(v, str) and MASK in v]


def check_same_config(run_dir: str, saved: DictConfig, new: DictConfig,
                      allow: list[str] | tuple = (), *, against: str = CONFIG_FILE,
                      carried: dict | None = None) -> list[str]:
    """Refuse to resume under a config that differs from ``saved``, the run's (its
    checkpoint's recorded config; ``against`` names it), naming each key that differs;
    return the differing keys, each of which ``allow`` names. ``output.dir`` is the run
    directory itself and never compared. ``carried``: config.yaml's flat values, where
    they may differ from the checkpoint's: a RESUME_SAFE key whose value config.yaml
    already holds (a resume that extended ``rounds`` and was stopped before its next
    checkpoint) passes without being named again."""
    # a key the run's config lacks (a run from an older fedray) had its default
    old = flat_keys(OmegaConf.to_container(OmegaConf.structured(FedrayConfig))) | flat_keys(
        OmegaConf.to_container(saved, resolve=True))
    cur = flat_keys(mask_tree(OmegaConf.to_container(new, resolve=True)))
    for k in allow:  # a misspelt key would otherwise allow nothing, silently
        if k not in old and k not in cur:
            raise FedrayError(f"--allow-change {k}: not a config key")
    keys = sorted(k for k in set(old) | set(cur) if k != "output.dir" and old.get(k) != cur.get(k))
    refused = [k for k in keys if k not in allow and not (
        carried is not None and _safe(k) and k in carried and carried[k] == cur.get(k))]
    if refused:
        what = ", ".join(f"{k} ({old.get(k)!r} -> {cur.get(k)!r})" for k in refused)
        raise FedrayError(f"--resume {run_dir}: the config differs from the run's "
                          f"{against} in {what} (to continue under the new value, name "
                          f"each key with --allow-change KEY)")
    return keys


def check_resume(run_dir: str, saved: DictConfig, new: DictConfig,
                 allow: list[str] | tuple = ()) -> list[str]:
    """Whether ``new`` may continue the run in ``run_dir``, before anything starts;
    returns the notes to print. ``saved`` is the run's config.yaml (as recorded).

    The checkpoint is the authority: it must be this run's (its run id the one on
    config.yaml's first line: one copied from another run directory is refused), and
    ``new`` is compared with the config it records, so that a hand-edited config.yaml is
    caught as well as an override. A key may differ only when named with --allow-change;
    one outside RESUME_SAFE then changes what the rounds after the checkpoint compute,
    which a note says. A checkpoint of an earlier fedray (no run id, no recorded config)
    is compared with config.yaml, as then; a run without a checkpoint starts again from
    round 1 and is compared with config.yaml."""
    head = read_checkpoint_header(run_dir)
    dir_id = saved_run_id(run_dir)
    notes = []
    if head is not None and head.run_id is not None and dir_id is not None \
            and head.run_id != dir_id:
        raise FedrayError(f"--resume {run_dir}: its {CHECKPOINT_FILE} was written by "
                          f"another run (run id {head.run_id}; this directory's "
                          f"{CONFIG_FILE} is run {dir_id}'s): a checkpoint copied from "
                          "another run directory is not continued here; resume that run's "
                          "own directory, or start a new run")
    if head is not None and head.config is not None:
        carried = flat_keys(OmegaConf.to_container(saved, resolve=True))
        keys = check_same_config(run_dir, OmegaConf.create(head.config), new, allow,
                                 against=f"checkpoint (after round {head.round})",
                                 carried=carried)
        base = flat_keys(head.config)
    else:
        if head is not None:
            notes.append(f"--resume {run_dir}: its checkpoint, from an earlier fedray, "
                         f"records no config: the config is compared with {CONFIG_FILE} "
                         "only")
        keys = check_same_config(run_dir, saved, new, allow)
        base = flat_keys(OmegaConf.to_container(saved, resolve=True))
    cur = flat_keys(mask_tree(OmegaConf.to_container(new, resolve=True)))
    after = head.round if head is not None else 0
    for k in keys:
        if not _safe(k) and k in allow and after:
            notes.append(f"--resume {run_dir}: {k} changes ({base.get(k)!r} -> "
                         f"{cur.get(k)!r}) after round {after}: the rounds after it are not "
                         "those of an uninterrupted run")
    return notes
