"""MLflow logging of a run (``output.mlflow: true``), for teams that track experiments there.

MLflow is optional (``pip install 'fedray[mlflow]'``): metrics.jsonl and the TensorBoard events
are always written; this adds one MLflow run per fedray run, in the process that called
``fedray.run`` (the one whose MLFLOW_TRACKING_URI and active experiment the user set), with
the config as params (credentials masked) and each round's numeric metrics at step = round.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from omegaconf import DictConfig, OmegaConf

from fedray.config import flat_keys
from fedray.errors import FedrayError
from fedray.redact import mask_tree
from fedray.tensorboard import numeric_metrics


def require_mlflow() -> None:
    """Fail before anything starts when output.mlflow is on and MLflow is missing."""
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise FedrayError("config key 'output.mlflow': MLflow is not installed; pip install "
                          "'fedray[mlflow]' or set output.mlflow=false") from None


def flat_params(cfg: DictConfig) -> dict[str, str]:
    """The config as dotted ``key: value`` strings, credentials masked."""
    tree = mask_tree(OmegaConf.to_container(cfg, resolve=True))
    # MLflow caps a param value's length
    return {k: str(v)[:500] for k, v in flat_keys(tree).items()}


@contextlib.contextmanager
def mlflow_run(cfg: DictConfig, run_dir: str) -> Iterator[Callable[[dict], None]]:
    """An MLflow run for the duration of the block; yields the per-round logging callback.
    MLflow ends the run FAILED when the block raises, FINISHED otherwise."""
    import mlflow

    with mlflow.start_run(run_name=cfg.name):
        mlflow.log_params(flat_params(cfg))
        mlflow.set_tag("fedray.run_dir", run_dir)
        yield lambda m: mlflow.log_metrics(numeric_metrics(m), step=int(m["round"]))
