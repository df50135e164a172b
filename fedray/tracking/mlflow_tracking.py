"""MLflow logging of a run (``output.mlflow: true``), for teams that track experiments there.

MLflow is optional (``pip install 'fedray[mlflow]'``): metrics.jsonl and the TensorBoard events
are always written; this adds one MLflow run per fedray run, in the process that called
``fedray.run`` (the one whose MLFLOW_TRACKING_URI and active experiment the user set), named
after the job (a sweep's trial: after the trial, fedray.tracking.tags.run_name), with the
config as params (credentials masked) and each round's numeric metrics at step = round (by
their metrics.jsonl names): a callback (fedray.tracking.callbacks), as any user's own
tracking could be.
"""

from __future__ import annotations

from omegaconf import DictConfig

from fedray.tracking.callbacks import Callback, RunInfo, require_tracker
from fedray.tracking.tags import flat_config, numeric_metrics, run_name


def require_mlflow() -> None:
    """Fail before anything starts when output.mlflow is on and MLflow is missing."""
    require_tracker("mlflow", "output.mlflow", "MLflow", "mlflow")


def flat_params(cfg: DictConfig) -> dict[str, str]:
    """The config as dotted ``key: value`` strings, credentials masked."""
    # MLflow caps a param value's length
    return {k: str(v)[:500] for k, v in flat_config(cfg).items()}


class MLflowCallback(Callback):
    """``output.mlflow``: one MLflow run for the fedray run (a resumed run gets a new one),
    with the config as params and each round's numeric metrics at step = round. It is
    ended FINISHED with the fedray run, or FAILED when the run raises."""

    def on_run_start(self, run: RunInfo) -> None:
        import mlflow

        self._mlflow = mlflow
        self._active = mlflow.start_run(run_name=run_name(run.config, run.run_dir))
        self._active.__enter__()  # exited in on_run_end / on_run_failed, as a with block
        mlflow.log_params(flat_params(run.config))
        mlflow.set_tag("fedray.state.run_dir", run.run_dir)

    def on_round_end(self, round: int, metrics: dict, weights: dict | None) -> None:
        self._mlflow.log_metrics(numeric_metrics(metrics), step=round)

    def on_run_end(self, summary: dict) -> None:
        self._active.__exit__(None, None, None)

    def on_run_failed(self, error: BaseException) -> None:
        if hasattr(self, "_active"):  # start_run itself may have failed
            self._active.__exit__(type(error), error, error.__traceback__)
