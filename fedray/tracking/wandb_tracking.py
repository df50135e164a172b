"""Weights & Biases logging of a run (``output.wandb: true``), for teams that track
experiments there.

W&B is optional (``pip install 'fedray[wandb]'``): metrics.jsonl and the TensorBoard events
are always written; this adds one W&B run per fedray run, in the process that called
``fedray.run`` (the one whose WANDB_* environment and login the user set), with the config as
the W&B config (credentials masked), each round's numeric metrics at step = round under the
TensorBoard tags (``train/``, ``test/``, ``clients/``, ``system/``: fedray.tracking.tags), and
summary.json's numbers as the run's summary: a callback (fedray.tracking.callbacks), as any
user's own tracking could be.

W&B's own environment decides where the run goes: ``WANDB_MODE=offline`` logs without a
network (``wandb sync`` uploads it later), ``WANDB_PROJECT`` (default ``fedray``) and
``WANDB_ENTITY`` where it is filed. Its files go to ``RUN_DIR/wandb/`` for a run directory on
the local disk (W&B writes only there; else W&B's default, ``WANDB_DIR`` or ``./wandb``).
"""

from __future__ import annotations

import os
from typing import Any

from omegaconf import OmegaConf

from fedray.errors import FedrayError, one_line
from fedray.state.redact import mask_tree
from fedray.state.storage import filesystem, is_local
from fedray.tracking.callbacks import Callback, RunInfo, require_tracker
from fedray.tracking.tags import run_name, tagged_metrics

DEFAULT_PROJECT = "fedray"


def require_wandb() -> None:
    """Fail before anything starts when output.wandb is on and W&B is missing."""
    require_tracker("wandb", "output.wandb", "Weights & Biases", "wandb")


def summary_values(summary: dict) -> dict[str, float]:
    """The numbers of summary.json (total_s, best_test_accuracy, ...) and its final metrics
    under their tags: what the W&B runs table shows per run."""
    out: dict[str, float] = {k: v for k, v in summary.items()
                             if isinstance(v, int | float) and not isinstance(v, bool)}
    out.update(tagged_metrics(summary.get("final") or {}))
    return out


class WandbCallback(Callback):
    """``output.wandb``: one W&B run for the fedray run. A resumed run gets a new W&B run
    holding every round (the checkpoint's rounds are logged again first), as its
    TensorBoard events do. It is finished with the fedray run, with exit code 1 when the
    run raises."""

    def on_run_start(self, run: RunInfo) -> None:
        import wandb

        fs, path = filesystem(run.run_dir, "output.dir")
        directory = path if is_local(fs) else None  # W&B adds its own "wandb/" to it
        config = mask_tree(OmegaConf.to_container(run.config, resolve=True))
        try:
            self._run = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT,
                name=run_name(run.config, run.run_dir), dir=directory, config=config,
                notes=f"fedray run directory: {run.run_dir}",
                # W&B would otherwise replace this process's stdout and stderr for the run
                settings=wandb.Settings(console="off"))
        except Exception as exc:
            raise FedrayError(f"config key 'output.wandb': W&B could not start a run: "
                              f"{one_line(exc)} (log in with `wandb login`, or set "
                              "WANDB_MODE=offline to log without a network)") from None
        for metrics in run.past_metrics:
            self._log(metrics)

    def _log(self, metrics: dict) -> None:
        self._run.log(tagged_metrics(metrics), step=int(metrics["round"]))

    def on_round_end(self, round: int, metrics: dict, weights: Any) -> None:
        self._log(metrics)

    def on_run_end(self, summary: dict) -> None:
        self._run.summary.update(summary_values(summary))
        self._run.finish()

    def on_run_failed(self, error: BaseException) -> None:
        if hasattr(self, "_run"):  # wandb.init itself may have failed
            self._run.finish(exit_code=1)
