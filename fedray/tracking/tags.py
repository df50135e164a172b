"""What every experiment tracker is given the same way: a round's numbers, under one tag each
in four groups, and the config as flat hyper-parameters.

TensorBoard (fedray.tracking.tensorboard) and Weights & Biases (fedray.tracking.wandb_tracking)
show a panel section per tag prefix, so one flat list of thirty metrics -- memory beside
accuracy -- becomes four sections: ``train/``, ``test/``, ``clients/`` (per-client
evaluation statistics) and ``system/`` (how the run ran). MLflow keeps the plain
metrics.jsonl names (fedray.tracking.mlflow_tracking).
"""

from __future__ import annotations

import json
import math
from typing import Any

from fedray.config import flat_keys
from fedray.state.redact import mask_tree

GROUPS = ("train", "test", "clients", "system")

# the runtime's bookkeeping of a round that has no duration or memory suffix: who took part
# and how much work was done (docs/report.md#tensorboard-tags)
SYSTEM_KEYS = frozenset({"clients", "dropped_out", "late", "examples", "updates",
                         "dropped_updates", "upload_bytes"})


def metric_tag(key: str) -> str:
    """The tag of a metrics.jsonl key: ``<group>/<key>``.

    - ``system/``: durations and rates (``*_s``: wall_s, train_s, updates_per_s, ...), memory
      (``*_mb``), ``worker_*`` and ``driver_*``, and the participation counts of SYSTEM_KEYS;
    - ``test/``: ``test_*`` and ``fed_test_*`` (the global model's evaluation);
    - ``clients/``: ``clients_*`` (statistics over the evaluated clients);
    - ``train/``: everything else -- ``train_loss`` and what an algorithm's parts measure
      (e.g. ``elastic_boosted_share``), which describe the round's update, not the machine.
    Durations come first, so that a timing of an evaluation is still a system metric.
    """
    if (key.endswith(("_s", "_mb")) or key.startswith(("worker_", "driver_"))
            or key in SYSTEM_KEYS):
        return f"system/{key}"
    if key.startswith(("test_", "fed_test_")):
        return f"test/{key}"
    if key.startswith("clients_"):
        return f"clients/{key}"
    return f"train/{key}"


def metric_key(tag: str) -> str:
    """The metrics.jsonl key of a tag (``metric_tag``'s inverse); a tag without a group --
    an event file written before tags were grouped -- is the key itself."""
    group, sep, key = tag.partition("/")
    return key if sep and group in GROUPS else tag


def numeric_metrics(metrics: dict) -> dict[str, float]:
    """A round's metrics that can be plotted: the numbers, less the round itself (the step).
    TensorBoard, MLflow and W&B log the same ones."""
    return {k: float(v) for k, v in metrics.items()
            if k != "round" and isinstance(v, int | float) and not isinstance(v, bool)}


def tagged_metrics(metrics: dict) -> dict[str, float]:
    """``numeric_metrics`` under their tags."""
    return {metric_tag(k): v for k, v in numeric_metrics(metrics).items()}


def flat_config(cfg: Any) -> dict[str, Any]:
    """The config as ``{"dotted.key": value}``, credentials masked; values keep their types
    (a tracker that compares runs sorts numbers as numbers)."""
    from omegaconf import DictConfig, OmegaConf


    tree = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    return flat_keys(mask_tree(tree))


def hparam_value(value: Any) -> bool | float | str:
    """A config value as a hyper-parameter: booleans, finite numbers and strings as they
    are, anything else (null, a list, inf) as its JSON text."""
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return json.dumps(value, default=str)


# what a run is written to and how it is run: never a hyper-parameter worth comparing runs
# on, and output.dir differs between every two runs, so the HPARAMS tab would sort it first
HPARAM_SKIP = ("output.",)


def hparams(cfg: Any) -> dict[str, bool | float | str]:
    """The hyper-parameters of a run: its flat config less ``output.*``."""
    return {k: hparam_value(v) for k, v in flat_config(cfg).items()
            if not k.startswith(HPARAM_SKIP)}


# fedray.cluster.sweep's: a sweep's trials are run directories SWEEP_DIR/trials/<trial>/
TRIALS_DIR = "trials"


def run_name(config: Any, run_dir: str) -> str:
    """The name a tracker shows for a run: the job's ``name``, or for a sweep's trial the
    trial's name (its swept values, e.g. ``lr=0.1,seed=0``), since all the trials of a
    sweep share the job's name."""
    parts = run_dir.rstrip("/").rsplit("/", 2)
    if len(parts) == 3 and parts[1] == TRIALS_DIR and parts[2]:
        return parts[2]
    return str(config.name)
