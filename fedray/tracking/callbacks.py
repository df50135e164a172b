"""Callbacks: code of the user's that runs as a run goes, in the process that called
``fedray.run`` (where a debugger, a notebook's plots and the user's tracking client are).

    class WeightNorm(Callback):
        needs_weights = True                        # ask for the model each round

        def on_round_end(self, round, metrics, weights):
            print(round, sum(float(w.norm() ** 2) for w in weights.values()) ** 0.5)

        def on_evaluation(self, round, metrics):
            if metrics.get("test_accuracy", 0) > 0.9:
                self.good_enough = round

    fedray.run(job, callbacks=[WeightNorm()])        # or output.callbacks: ["mod:WeightNorm"]

Hooks, in the order they run (each one for every callback, in the order given):
``on_run_start`` once the driver is set up (a resumed run knows its checkpoint by then),
then for every round ``on_evaluation`` (rounds with test metrics only) and ``on_round_end``,
and ``on_run_end`` after summary.json is written -- or ``on_run_failed`` when the run raises
after ``on_run_start`` (so that a callback can close what it opened). ``on_round_end``
returning ``STOP`` (or True) ends the run after that round: the driver writes the round's
checkpoint, the weights and the summary (``stopped_early_after_round``), and the run ends
normally; ``fedray run --resume`` continues it.

fedray's own round outputs are callbacks too: the progress line (fedray.tracking.progress), the
TensorBoard events (fedray.tracking.tensorboard) and MLflow (fedray.tracking.mlflow_tracking).

This module imports no torch: a job's ``output.callbacks`` is checked before a run starts.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from fedray.errors import FedrayError, key_error, one_line

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig

CONFIG_KEY = "output.callbacks"


class _Stop:
    """The value ``on_round_end`` returns to end the run after its round."""

    def __repr__(self) -> str:
        return "fedray.tracking.callbacks.STOP"


STOP = _Stop()


@dataclass(frozen=True)
class RunInfo:
    """What ``on_run_start`` is told about the run."""

    config: DictConfig  # the resolved, read-only config
    run_dir: str  # the run directory's absolute path or URL
    resumed_from: int | None  # the checkpoint's round a resumed run continues after, else None
    # the rounds run before this process's first one (a resumed run's, as in metrics.jsonl);
    # empty for a new run
    past_metrics: list[dict] = field(default_factory=list)


class Callback:
    """Base class of callbacks: every hook does nothing unless overridden.

    ``needs_weights = True`` on a subclass: ``on_round_end`` gets the new global model as a
    state_dict of CPU tensors, a copy the run no longer touches (one per round, shared by
    the callbacks that ask). Otherwise it gets None, because shipping the model from the
    driver to this process every round costs a copy of it, made only when some callback
    asks."""

    needs_weights: ClassVar[bool] = False

    def on_run_start(self, run: RunInfo) -> None:
        """Once, before the first round of this process (the run directory exists)."""

    def on_round_end(self, round: int, metrics: dict,
                     weights: dict[str, torch.Tensor] | None) -> Any:
        """After each round, with its metrics (the record appended to metrics.jsonl).
        Return ``STOP`` (or True) to end the run after this round."""

    def on_evaluation(self, round: int, metrics: dict) -> None:
        """After a round whose global model was evaluated (before ``on_round_end``), with
        the evaluation's metrics only: ``test_*`` and ``fed_test_*``."""

    def on_run_end(self, summary: dict) -> None:
        """Once, after the run's summary.json, weights and last checkpoint are written."""

    def on_run_failed(self, error: BaseException) -> None:
        """Instead of ``on_run_end``, when the run raises after ``on_run_start`` (an error,
        Ctrl-C): close what ``on_run_start`` opened. The run's own error is re-raised
        after every callback has been told."""


class FunctionCallback(Callback):
    """A plain function of a round's metrics (``fedray.run(progress=...)``) as a callback."""

    def __init__(self, fn: Callable[[dict], Any]):
        self.fn = fn

    def on_round_end(self, round: int, metrics: dict,
                     weights: dict[str, torch.Tensor] | None) -> None:
        self.fn(metrics)


def callback_class(ref: str, key: str = CONFIG_KEY) -> type[Callback]:
    """The Callback subclass an import path ``module:Class`` names (a dotted module, or a
    ``.py`` file's path); one line naming ``key`` when it cannot be used."""
    # imported when used (start-up time): omegaconf, not needed by the progress line
    from fedray.algorithms.registry import import_object

    cls = import_object(ref, key)
    if not (isinstance(cls, type) and issubclass(cls, Callback)):
        raise key_error(key, "must name a subclass of fedray.tracking.callbacks.Callback", ref)
    return cls


def from_config(refs: Iterable[str], key: str = CONFIG_KEY) -> list[Callback]:
    """``output.callbacks``: each class instantiated with no arguments."""
    out = []
    for ref in refs:
        cls = callback_class(ref, key)
        try:
            out.append(cls())
        except Exception as exc:
            raise key_error(key, f"{cls.__name__}() failed: {type(exc).__name__}: "
                            f"{one_line(exc)}", ref) from None
    return out


def check(callbacks: Iterable[Any]) -> list[Callback]:
    """``fedray.run(callbacks=...)``: instances, refused by position otherwise."""
    out = list(callbacks)
    for i, cb in enumerate(out):
        if not isinstance(cb, Callback):
            what = "a class" if isinstance(cb, type) else type(cb).__name__
            raise FedrayError(f"callbacks[{i}] is {what}, not an instance of "
                              "fedray.tracking.callbacks.Callback (a function of the metrics "
                              "goes in progress=)")
    return out


class Callbacks:
    """The run's callbacks, called in order; the caller's side of the hooks."""

    def __init__(self, callbacks: Iterable[Callback]):
        self.items = list(callbacks)
        self.started: list[Callback] = []

    @property
    def needs_weights(self) -> bool:
        return any(cb.needs_weights for cb in self.items)

    def run_start(self, run: RunInfo) -> None:
        for cb in self.items:
            self.started.append(cb)  # before: one that fails half-way is told of it too
            cb.on_run_start(run)

    def round_end(self, r: int, metrics: dict, weights: dict | None) -> bool:
        """Every callback's hooks for round ``r``; True when one of them asked to stop."""
        evaluation = {k: v for k, v in metrics.items() if k.startswith(("test_", "fed_test_"))}
        if evaluation:
            for cb in self.items:
                cb.on_evaluation(r, dict(evaluation))
        stop = False
        for cb in self.items:
            # each its own copy: a callback that edits its dict changes no other's
            answer = cb.on_round_end(r, dict(metrics), weights if cb.needs_weights else None)
            stop = stop or answer is STOP or answer is True
        return stop

    def run_end(self, summary: dict) -> None:
        for cb in self.items:
            cb.on_run_end(summary)

    def run_failed(self, error: BaseException) -> None:
        """Tell the started callbacks, once: a second call for the same run (a caller
        further out that sees the error again) tells nobody. A callback failing here is
        reported on stderr and the others are still told (the run's own error is what the
        caller sees)."""
        started, self.started = self.started, []
        for cb in started:
            try:
                cb.on_run_failed(error)
            except Exception as exc:
                print(f"fedray: {type(cb).__name__}.on_run_failed failed: "
                      f"{type(exc).__name__}: {one_line(exc)}", file=sys.stderr, flush=True)


def require_tracker(module: str, key: str, product: str, extra: str) -> None:
    """Fail before anything starts when a tracker's config key is on and its package
    (an optional extra) is missing."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise FedrayError(f"config key '{key}': {product} is not installed; pip install "
                          f"'fedray[{extra}]' or set {key}=false") from None
