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
                           checkpoints of earlier fedray versions hold one int32 per client of
                           the population instead (client_state.version), and still resume

and, in the safetensors header's metadata (JSON text, never code), the round it was taken
after, the metrics lines of rounds 1..round and, with client state, the population. The
sampler needs no state of its own: every round's selection and every client's randomness
derive from (seed, round, client id).

Resuming re-reads the job's config (the run's config.yaml, or a job file given again) and
refuses any difference from the config the run started with, naming the keys -- unless the
key is one that cannot change the rounds already run (``RESUME_SAFE``) and was named with
``--allow-change``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import fsspec
import numpy as np
from omegaconf import DictConfig, OmegaConf

from fedray.config import FedrayConfig, flat_keys
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

# keys that may differ on resume with --allow-change: they decide how long to run, how
# often to evaluate or checkpoint, and where the work runs, never what a round computes
# (runtime.* with the pool size unchanged; a different pool size changes float64 sums by
# ~1e-16, see docs/fault_tolerance.md)
RESUME_SAFE = ("rounds", "eval.every", "eval.batch_size", "checkpoint.every",
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


def encode(ckpt: Checkpoint) -> bytes:
    import torch
    from safetensors.torch import save as save_safetensors

    from fedray.state.client_state import ClientVersions

    tensors = {"weights": ckpt.weights.detach().cpu().contiguous(),
               **{k: v.detach().cpu().contiguous() for k, v in ckpt.server_state.items()}}
    meta = {"round": ckpt.round, "metrics": ckpt.metrics_lines}
    index = ckpt.client_versions
    if index is not None:
        if not isinstance(index, ClientVersions):
            index = ClientVersions.from_dense(index)
        ids, versions = index.arrays()
        tensors[_IDS] = torch.from_numpy(np.ascontiguousarray(ids))
        tensors[_VERSIONS] = torch.from_numpy(np.ascontiguousarray(versions))
        meta["clients"] = index.population
    return save_safetensors(tensors, metadata={_META: json.dumps(meta)})


def _header_metadata(data: bytes) -> dict:
    """The ``__metadata__`` of a safetensors file: an 8-byte length, then a JSON header."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]).get("__metadata__") or {}


def decode(data: bytes, where: str) -> Checkpoint:
    from safetensors.torch import load as load_safetensors

    from fedray.state.client_state import ClientVersions

    try:
        tensors = load_safetensors(data)
        meta = json.loads(_header_metadata(data)[_META])
        rnd, lines = int(meta["round"]), list(meta["metrics"])
        weights = tensors.pop("weights")
        dense, ids, versions = (tensors.pop(k, None) for k in (_DENSE_VERSIONS, _IDS, _VERSIONS))
        index = None
        if dense is not None:
            index = ClientVersions.from_dense(dense.numpy())
        elif ids is not None or versions is not None:
            if ids is None or versions is None:
                raise KeyError(_IDS if ids is None else _VERSIONS)
            index = ClientVersions.from_arrays(int(meta["clients"]), ids.numpy(),
                                               versions.numpy())
    except Exception as exc:  # safetensors, struct, JSON, key and index errors alike
        raise FedrayError(f"checkpoint {where} is corrupt: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    return Checkpoint(round=rnd, weights=weights, server_state=tensors,
                      client_versions=index, metrics_lines=lines)


def read_checkpoint(run_dir: str) -> Checkpoint | None:
    """The run's checkpoint, or None if it has none yet (killed before the first one)."""
    fs, path = fsspec.core.url_to_fs(run_dir)
    file = f"{path.rstrip('/')}/{CHECKPOINT_FILE}"
    try:
        data = fs.cat_file(file)
    except FileNotFoundError:
        return None
    return decode(data, fs.unstrip_protocol(file))


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
    from fedray.config import check_interpolations

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
                      allow: list[str] | tuple = ()) -> list[str]:
    """Refuse to resume under a config that differs from the run's; return the allowed
    differing keys. ``output.dir`` is the run directory itself and never compared."""
    # a key the run's config.yaml lacks (a run from an older fedray) had its default
    old = flat_keys(OmegaConf.to_container(OmegaConf.structured(FedrayConfig))) | flat_keys(
        OmegaConf.to_container(saved, resolve=True))
    cur = flat_keys(mask_tree(OmegaConf.to_container(new, resolve=True)))
    keys = sorted(k for k in set(old) | set(cur) if k != "output.dir" and old.get(k) != cur.get(k))
    for k in allow:
        if not _safe(k):
            raise FedrayError(f"--allow-change {k}: only keys that cannot change the rounds "
                              f"already run may change on resume: {', '.join(RESUME_SAFE)}*")
    refused = [k for k in keys if k not in allow]
    if refused:
        what = ", ".join(f"{k} ({old.get(k)!r} -> {cur.get(k)!r})" for k in refused)
        hint = (" (to change a safe key, e.g. rounds, name it with --allow-change KEY)"
                if any(_safe(k) for k in refused) else "")
        raise FedrayError(f"--resume {run_dir}: the config differs from the run's "
                          f"{CONFIG_FILE} in {what}{hint}")
    return keys
