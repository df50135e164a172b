"""Errors name the part (issue 40, item 6): a user's part that returns what the runtime
cannot use, or raises, is named in one line as the job names it (``algorithm.aggregator
.../bad_parts.py:ShortFinish``), not blamed on the part after it (the server optimizer's
shape check, the partial sum's add) nor shown as a traceback from another process.

Runs use the inline backend (no Ray); what Ray's processes do differently -- an exception
becomes a one-line PartError instead of staying itself -- is switched on in-process
(``one_line_part_errors``), and the PartError's trip through pickling and
fedray.api._unwrap_remote_error is checked apart. The misbehaving parts are in
tests/runtime/bad_parts.py."""

from __future__ import annotations

import dataclasses
import pathlib
import pickle

import pytest
from conftest import blobs, fixed_linear

import fedray
from fedray.algorithms.reduction import PartialSum
from fedray.algorithms.registry import resolve
from fedray.api import _unwrap_remote_error
from fedray.config import ServerConfig
from fedray.errors import ConfigError, DivergedError, FedrayError, PartError
from fedray.runtime.driver import Driver
from fedray.runtime.inline import InlineWorker
from fedray.runtime.part_errors import PartNames

P = str(pathlib.Path(__file__).with_name("bad_parts.py"))
CLIENTS = blobs(6, seed=4)
SIZE = 18  # fixed_linear: a 5 -> 3 linear layer
SHOULD = f"must be a flat float32 tensor of {SIZE} values on cpu (one per model parameter " \
         "and float buffer)"


def run(tmp_path, name: str, non_finite: str = "stop", **algorithm) -> fedray.RunResult:
    job = {"name": name, "seed": 2, "rounds": 1,
           "algorithm": {"name": "fedavg", **algorithm},
           "client": {"lr": 0.1, "batch_size": 4, "local_steps": 2},
           "sampling": {"clients_per_round": 3}, "guard": {"non_finite": non_finite},
           "runtime": {"backend": "inline", "num_workers": 1,
                       "worker": {"num_cpus": 1, "vectorize": "off"}},
           "output": {"dir": str(tmp_path / name)}}
    return fedray.run(job, model_fn=fixed_linear()[0], client_data=CLIENTS)


RESULTS = {  # a part's result the runtime cannot use -> the one line that names the part
    "finish-short": ({"aggregator": f"{P}:ShortFinish"},
                     f"algorithm.aggregator {P}:ShortFinish: finish() returned a float64 "
                     f"tensor of shape (17,); the round's update must be a flat float tensor "
                     f"of {SIZE} values (one per model parameter and float buffer)"),
    "finish-list": ({"aggregator": f"{P}:ListFinish"},
                    f"algorithm.aggregator {P}:ListFinish: finish() returned a list, not a "
                    f"tensor; the round's update must be a flat float tensor of {SIZE} values "
                    "(one per model parameter and float buffer)"),
    "train-short": ({"client": f"{P}:ShortTrain"},
                    f"algorithm.client {P}:ShortTrain: train() left a client's update as a "
                    f"float32 tensor of shape (17,) on cpu; it {SHOULD}"),
    "train-float64": ({"client": f"{P}:DoubleTrain"},
                      f"algorithm.client {P}:DoubleTrain: train() left a client's update as a "
                      f"float64 tensor of shape ({SIZE},) on cpu; it {SHOULD}"),
    "train-tuple": ({"client": f"{P}:TupleTrain"},
                    f"algorithm.client {P}:TupleTrain: train() returned a tuple, not a "
                    "LocalUpdate (fedray.algorithms.base)"),
    "stage-client-update": ({"stages": [f"{P}:Truncate"]},
                            f"algorithm.stages {P}:Truncate: client_update() left a client's "
                            f"update as a float32 tensor of shape (3,) on cpu; it {SHOULD}"),
    "stage-finish-sum-dtype": ({"stages": [f"{P}:HalfSum"]},
                               f"algorithm.stages {P}:HalfSum: finish_sum() left the round's "
                               f"sum as a float32 tensor of shape ({SIZE},); it must stay a "
                               f"flat float64 tensor of {SIZE} values"),
    "stage-finish-sum-weight": ({"stages": [f"{P}:NaNWeight"]},
                                f"algorithm.stages {P}:NaNWeight: finish_sum() left the "
                                "round's sum with weight nan; it must be a finite number"),
    "server-step": ({"server_opt": f"{P}:ShortStep"},
                    f"algorithm.server_opt {P}:ShortStep: step() returned a float32 tensor "
                    f"of shape (17,); the new global weights must be a flat float tensor of "
                    f"{SIZE} values (one per model parameter and float buffer)"),
}


@pytest.mark.parametrize("case", sorted(RESULTS))
def test_a_result_the_runtime_cannot_use_names_its_part(tmp_path, case):
    """Before: the aggregator's short update failed in the server optimizer ("sgd: weights
    (18,) and mean delta (17,) ..."), train()'s short delta in PartialSum.add, its tuple as
    an AttributeError, a stage's short delta in the aggregator's accumulate; a float64
    delta, a float32 or NaN-weighted sum went through unremarked."""
    algorithm, message = RESULTS[case]
    with pytest.raises(PartError) as info:
        run(tmp_path, case, **algorithm)
    assert str(info.value) == message
    assert not (tmp_path / case).exists()  # failed in round 1: nothing kept


def test_a_non_finite_update_is_the_aggregators(tmp_path):
    """A finite sum that finish() turns into NaN is the aggregator's doing, not a learning
    rate's: the message names it and suggests no learning rate (before: "the global model
    has non-finite weights ...; likely cause: a learning rate too large ...")."""
    with pytest.raises(DivergedError) as info:
        run(tmp_path, "nan", aggregator=f"{P}:NaNFinish")
    assert str(info.value) == (
        "round 1: the global model has non-finite weights (NaN or Inf) after the server "
        f"update: algorithm.aggregator {P}:NaNFinish: finish() returned non-finite values "
        "(NaN or Inf) from a finite sum")
    assert info.value.round == 1
    # guard.non_finite=warn: the same words in the round's record, and the run goes on
    result = run(tmp_path, "nan-warn", non_finite="warn", aggregator=f"{P}:NaNFinish")
    assert result.metrics[0]["diverged"] == str(info.value)
    assert result.summary["diverged_at_round"] == 1


def test_a_non_finite_sum_names_the_parts_that_made_it(tmp_path):
    """Every client update the guard admits is finite and their float64 sum cannot
    overflow: a non-finite sum was made by the aggregator's accumulate() (or weight())."""
    with pytest.raises(DivergedError) as info:
        run(tmp_path, "nansum", aggregator=f"{P}:NaNAccumulate")
    assert str(info.value) == (
        "round 1: the global model has non-finite weights (NaN or Inf) after the server "
        "update: the round's sum of client updates is non-finite (NaN or Inf) before "
        f"algorithm.aggregator {P}:NaNAccumulate's finish(), though every client update the "
        "guard admitted was finite: made so by its accumulate() or weight()")


def test_non_finite_updates_of_a_users_train_name_it(tmp_path):
    """The guard drops them all (they may be a learning rate's doing: its hint stays), and
    the message says whose loop made them. Before: the learning rate alone."""
    with pytest.raises(DivergedError) as info:
        run(tmp_path, "nantrain", client=f"{P}:NaNTrain")
    assert str(info.value) == (
        "round 1: every client update was non-finite (3 of 3 clients, all dropped by the "
        f"guard), trained by algorithm.client {P}:NaNTrain's own train(); likely cause: a "
        "learning rate too large (client.lr 0.1, server.lr 1) or non-finite data")


def test_a_divergence_keeps_its_learning_rate_message(tmp_path):
    """A finite update that the server step overflows is a divergence, as before."""
    with pytest.raises(DivergedError, match=r"round 1: the global model has non-finite "
                       r"weights \(NaN or Inf\) after the server update; likely cause: a "
                       r"learning rate too large \(client.lr 0.1, server.lr 1e\+300\)"):
        job = {"name": "div", "rounds": 1, "server": {"lr": 1e300},
               "client": {"lr": 0.1, "batch_size": 4, "local_steps": 2},
               "sampling": {"clients_per_round": 3},
               "runtime": {"backend": "inline", "num_workers": 1},
               "output": {"dir": str(tmp_path / "div")}}
        fedray.run(job, model_fn=fixed_linear()[0], client_data=CLIENTS)


def test_a_workers_part_exception_is_one_line_naming_it(tmp_path, monkeypatch):
    """What a Ray worker does (one_line_part_errors): the aggregator's accumulate() raised
    through a helper of its own; the error names the hook fedray called, the round and the
    client, in one line (the KeyError's message had a newline), and keeps the part's
    traceback for --debug. Before: a RayTaskError with the worker's traceback."""
    monkeypatch.setattr(InlineWorker, "one_line_part_errors", True)
    with pytest.raises(PartError) as info:
        run(tmp_path, "raise", aggregator=f"{P}:RaisingAccumulate")
    text = str(info.value)
    assert text.startswith(f"algorithm.aggregator {P}:RaisingAccumulate: accumulate() raised "
                           "KeyError: 'bucket ")
    assert text.endswith(")") and "(round 1, client " in text and "\n" not in text
    assert 'in _fold' in info.value.detail and "raise KeyError" in info.value.detail


def test_a_models_wrong_output_names_model_name(tmp_path):
    """A model named by import path (model.name) whose output does not fit the data: the
    message names model.name with the path as the job wrote it."""
    job = {"name": "model", "rounds": 1, "model": {"name": f"{P}:WrongWidth"},
           "sampling": {"clients_per_round": 3},
           "runtime": {"backend": "inline", "num_workers": 1},
           "output": {"dir": str(tmp_path / "model")}}
    with pytest.raises(FedrayError) as info:
        fedray.run(job, client_data=CLIENTS)
    assert str(info.value) == (f"config key 'model.name': the {P}:WrongWidth model outputs 2 "
                               "logits per example, but client_data has 3 classes (labels "
                               "0..2)")


@pytest.mark.slow
def test_on_ray_a_workers_part_exception_reaches_the_caller_as_one_line(tmp_path,
                                                                         ray_cluster):
    """The same through Ray's processes: the worker's PartError crosses the driver actor
    and fedray.run's unwrapping of RayTaskError as itself, with the part's traceback."""
    job = {"name": "ray", "seed": 2, "rounds": 1,
           "algorithm": {"name": "fedavg", "aggregator": f"{P}:RaisingAccumulate"},
           "client": {"lr": 0.1, "batch_size": 4, "local_steps": 2},
           "sampling": {"clients_per_round": 3},
           "runtime": {"backend": "ray", "num_workers": 1, "worker": {"num_cpus": 0.5}},
           "output": {"dir": str(tmp_path / "ray")}}
    with pytest.raises(PartError) as info:
        fedray.run(job, model_fn=fixed_linear()[0], client_data=CLIENTS)
    text = str(info.value)
    assert text.startswith(f"algorithm.aggregator {P}:RaisingAccumulate: accumulate() raised "
                           "KeyError: 'bucket ") and "\n" not in text
    assert "(round 1, client " in text and "in _fold" in info.value.detail


def test_the_drivers_part_exception_is_one_line_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(Driver, "one_line_part_errors", True)
    with pytest.raises(PartError) as info:
        run(tmp_path, "raise", aggregator=f"{P}:RaisingFinish")
    assert str(info.value) == (f"algorithm.aggregator {P}:RaisingFinish: finish() raised "
                               "ValueError: no median of an empty set (round 1)")


def test_inline_keeps_the_exception_and_notes_the_part(tmp_path):
    """The inline backend is for debugging: the exception stays itself (pdb's post-mortem
    lands in the part), with a note naming the part."""
    with pytest.raises(ValueError, match="no median of an empty set") as info:
        run(tmp_path, "inline", aggregator=f"{P}:RaisingFinish")
    assert info.value.__notes__ == [
        f"fedray: algorithm.aggregator {P}:RaisingFinish: finish() raised this"]
    assert any(entry.path == pathlib.Path(P) for entry in info.traceback)


def test_trained_weights_are_rebuilt_with_the_float_buffers():
    """The delta a client's update carries (and train() is held to) covers the whole model,
    a BatchNorm layer's running statistics included: the weights rebuilt from it are x +
    delta over all of it. Before: x's parameters alone were added to it, a shape error."""
    import torch

    from fedray.algorithms.base import LocalUpdate, WorkerEnv
    from fedray.core.flat_model import FlatModel

    torch.manual_seed(0)
    model = FlatModel(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)))
    assert model.size > model.num_params  # running mean and variance after the parameters
    env = WorkerEnv(model=model, device=torch.device("cpu"), lr=0.1, loss="cross_entropy",
                    eval_batch_size=4, batch_size_for=lambda n: n)
    env.global_weights = torch.randn(model.size)
    delta = torch.randn(model.size)
    out = env.trained_weights(LocalUpdate(delta, 1, 0.0, 1, 1))
    assert torch.equal(out, env.global_weights + delta)


def test_part_error_travels_with_its_traceback():
    """Through pickling (Ray's) and fedray.api's unwrapping of a RayTaskError's causes."""
    err = pickle.loads(pickle.dumps(PartError("algorithm.client x:Y: boom", "Traceback ...")))
    assert (type(err), str(err), err.detail) == (PartError, "algorithm.client x:Y: boom",
                                                 "Traceback ...")

    class Remote(Exception):  # what Ray raises: the task's exception as its cause
        cause = err

    out = _unwrap_remote_error(Remote())
    assert type(out) is PartError and out.detail == "Traceback ..."
    assert isinstance(out, FedrayError)


def test_fedrays_own_parts_keep_their_traceback():
    """An exception in a built-in part is fedray's bug: it is not reworded as the user's."""
    agg = resolve({"name": "fedavg"}, ServerConfig()).aggregator
    try:
        agg.finish(PartialSum(3))  # no client: ValueError from PartialSum.mean
    except ValueError as exc:
        assert PartNames.of(None, agg).error(exc) is None
    else:
        raise AssertionError("finish() of an empty sum must raise")


PARAMS = {  # algorithm.sec's mistake -> the one line naming algorithm.sec.<key>
    "number-for-string": ({"mode": 5}, "config key 'algorithm.sec.mode': must be a string "
                          "(quote it), got 5"),
    "bool-for-optional-string": ({"tag": True}, "config key 'algorithm.sec.tag': must be a "
                                 "string (quote it), got True"),
    "not-a-list": ({"ids": 3}, "config key 'algorithm.sec.ids': must be a list, got 3"),
    "nested-unknown": ({"inner": {"dep": 1}}, "unknown config key 'algorithm.sec.inner.dep' "
                       "(allowed under 'algorithm.sec.inner': depth)"),
    "nested-not-a-section": ({"inner": 3}, "config key 'algorithm.sec.inner': must be a "
                             "section of keys (depth), got 3"),
    "nested-type": ({"inner": {"depth": "deep"}}, "config key 'algorithm.sec.inner.depth': "
                    "Value 'deep' of type 'str' could not be converted to Integer"),
    "unknown": ({"mood": 1}, "unknown config key 'algorithm.sec.mood' (allowed under "
                "'algorithm.sec': mode, ids, inner, tag)"),
}


@pytest.mark.parametrize("case", sorted(PARAMS))
def test_a_params_mistake_names_its_key(case):
    """Before: a number for a string was taken as '5', a nested unknown key was listed
    against the outer section, a number for a nested section and a value for a list were
    worded as OmegaConf's merge errors ('algorithm.sec': Merge error: int is not a
    subclass of Inner)."""
    section, message = PARAMS[case]
    with pytest.raises(ConfigError) as info:
        resolve({"name": "fedavg", "aggregator": f"{P}:SectionAgg", "sec": section},
                ServerConfig())
    assert str(info.value) == message


def test_params_that_are_not_a_dataclass_name_the_part():
    with pytest.raises(ConfigError) as info:
        resolve({"name": "fedavg", "aggregator": f"{P}:NotADataclass"}, ServerConfig())
    assert str(info.value) == (f"algorithm.aggregator {P}:NotADataclass: its Params "
                               "(NotADataclass.Params) must be a dataclass, whose fields "
                               "algorithm.sec sets")


def test_a_part_that_fails_to_build_is_named():
    """Before: the TypeError's traceback from the part's check()."""
    with pytest.raises(PartError) as info:
        resolve({"name": "fedavg", "aggregator": f"{P}:BadCheck"}, ServerConfig())
    assert str(info.value) == (f"algorithm.aggregator {P}:BadCheck: building it raised "
                               "TypeError: '>' not supported between instances of 'int' and "
                               "'str'")


def test_a_valid_section_is_read():
    """The checks refuse only mistakes: None for an optional string, a list for a list."""
    parts = resolve({"name": "fedavg", "aggregator": f"{P}:SectionAgg",
                     "sec": {"mode": "b", "ids": [1, 2], "inner": {"depth": 4},
                             "tag": None}}, ServerConfig())
    assert dataclasses.asdict(parts.aggregator.params) == {
        "mode": "b", "ids": [1, 2], "inner": {"depth": 4}, "tag": None}
