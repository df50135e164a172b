"""examples/models.py's BatchNormCNN, a user's model named by import path
(``model.name: examples/models.py:BatchNormCNN`` or ``examples.models:BatchNormCNN``) with
``model.args``: through `fedray run` and `--resume` (bit for bit), a sweep whose trials cannot
see the caller's files, `fedray submit`, and Ray workers that get a model's and a part's
helper modules only by value; and each refusal in one line, before anything is written."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
import yaml
from example_runs import REPO, cli_run, importable, submit_to_local_head, sweep_elsewhere
from example_runs import tiny_job as example_job

import fedray
from fedray.state.run_dir import load_weights

BY_FILE = "examples/models.py:BatchNormCNN"
BY_MODULE = "examples.models:BatchNormCNN"
TINY = ["data.synthetic.num_clients=20", "data.synthetic.min_examples=10",
        "data.synthetic.max_examples=20", "data.synthetic.test_writers=10",
        "sampling.clients_per_round=4", "runtime.num_workers=2", "runtime.worker.num_cpus=1",
        "runtime.worker.vectorize=off", "eval.every=0", "output.tensorboard=false",
        "runtime.backend=inline"]
__all__ = ["importable"]  # example_runs' fixture, requested by name below


def test_the_cli_runs_and_resumes_it_bit_for_bit(tmp_path, monkeypatch):
    """`fedray run` with the model named by its file, then `--resume` with more rounds: the
    same weights, BatchNorm running statistics included, as a straight run; config.yaml
    records the import path and the arguments, which the resume rebuilds the model from."""
    from fedray.cli import main

    monkeypatch.chdir(REPO)  # where the relative path is, as for the command above
    monkeypatch.setattr(sys, "path", list(sys.path))
    run_dir = tmp_path / "run"
    model = [f"model.name={BY_FILE}", "model.args.channels=3"]
    cli_run(run_dir, ["rounds=2", *TINY, *model])
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert cfg["model"]["name"] == BY_FILE and cfg["model"]["args"] == {"channels": 3}
    two = load_weights(str(run_dir))
    assert two["features.0.weight"].shape == (3, 1, 3, 3)  # model.args reached the class
    assert two["classifier.weight"].shape == (62, 6 * 7 * 7)  # and the data's num_classes
    assert main(["run", "--resume", str(run_dir), "rounds=3", "--allow-change", "rounds",
                 "--quiet"]) == 0
    straight = fedray.run(str(REPO / "jobs" / "quickstart.yaml"),
                          overrides=["rounds=3", f"output.dir={tmp_path / 'straight'}", *TINY,
                                     *model])
    resumed = load_weights(str(run_dir))
    assert resumed.keys() == straight.weights.keys()
    assert "features.1.running_mean" in resumed
    assert all(torch.equal(resumed[k], straight.weights[k]) for k in resumed)
    assert not torch.equal(resumed["features.1.running_mean"], two["features.1.running_mean"])


def test_ray_workers_get_a_model_and_a_part_with_their_helpers_by_value(ray_cluster, tmp_path,
                                                                       monkeypatch):
    """A model in ``mine/net.py`` and an aggregator in ``mine/agg.py``, each importing a
    helper module beside it, named by .py path from a directory that is on no Ray process's
    path: the driver actor and both workers build the model and run the part only because
    the files and their helpers travel by value (a helper pickled by name fails to import
    there: ModuleNotFoundError)."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # import_object adds mine/: undone
    tag = tmp_path.name.replace("-", "_")  # names no process has imported
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / f"layers_{tag}.py").write_text(
        "from torch import nn\n\n\ndef body(width):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(784, width), nn.ReLU())\n")
    (mine / "net.py").write_text(
        f"from torch import nn\n\nimport layers_{tag}\n\n\n"
        "class Net(nn.Sequential):\n"
        "    def __init__(self, num_classes, width=8):\n"
        f"        super().__init__(layers_{tag}.body(width), nn.Linear(width, num_classes))\n")
    (mine / f"weights_{tag}.py").write_text("def weight_of(update):\n    return 1.0\n")
    (mine / "agg.py").write_text(
        f"from fedray.algorithms.base import Aggregator\n\nimport weights_{tag}\n\n\n"
        "class Uniform(Aggregator):\n"
        "    def weight(self, update):\n"
        f"        return weights_{tag}.weight_of(update)\n")
    aggregator = f"{mine / 'agg.py'}:Uniform"
    job = example_job("helpers", {"aggregator": aggregator}, model=f"{mine / 'net.py'}:Net",
                      workers=2)
    job["model"]["args"] = {"width": 6}
    job["runtime"] = {"num_workers": 2, "worker": {"num_cpus": 0.5, "vectorize": "off"}}
    job["output"]["dir"] = str(tmp_path / "run")
    res = fedray.run(job)
    assert res.summary["num_workers"] == 2 and res.summary["rounds"] == 2
    assert res.summary["algorithm"]["aggregator"] == aggregator
    assert res.weights["0.1.weight"].shape == (6, 784)


@pytest.mark.slow  # Ray Tune's start and two trial processes: minutes on a loaded machine
def test_sweep_trials_import_it_where_the_callers_files_are_not(tmp_path):
    """Two trials over ``model.args.channels``, the model named by module: the trials' own
    processes, whose working directory is not the repository, import examples.models only
    because the sweep ships it."""
    job = example_job("bn", {}, model=BY_MODULE)
    job["model"]["args"] = {"channels": 2}
    trials = sweep_elsewhere(tmp_path, job, {"model.args.channels": [2, 3]})
    shapes = []
    for trial in trials:
        summary = json.loads((trial / "summary.json").read_text())
        assert summary["rounds"] == 2
        cfg = yaml.safe_load((trial / "config.yaml").read_text())
        assert cfg["model"]["name"] == BY_MODULE
        shapes.append(tuple(load_weights(str(trial))["features.0.weight"].shape))
    assert sorted(shapes) == [(2, 1, 3, 3), (3, 1, 3, 3)]


@pytest.mark.cluster
@pytest.mark.slow
def test_submit_ships_it_to_the_cluster(tmp_path):
    """The model named by its relative .py path: submit copies it, with the .py files beside
    it, into the job's working directory on the head."""
    job = example_job("bn", {}, model=BY_FILE, workers=1)
    job["model"]["args"] = {"channels": 2}
    out_dir = submit_to_local_head(tmp_path, job)
    cfg = yaml.safe_load((out_dir / "config.yaml").read_text())
    assert cfg["model"] == {"name": BY_FILE, "loss": "cross_entropy", "args": {"channels": 2}}
    assert load_weights(str(out_dir))["features.0.weight"].shape == (2, 1, 3, 3)


@pytest.mark.parametrize("overrides, message", [
    ([f"model.name={BY_FILE[:-len('BatchNormCNN')]}Nope"],
     "config key 'model.name': module examples/models.py has no Nope, "
     "got 'examples/models.py:Nope'"),
    (["model.name=examples/nomodels.py:Net"],
     f"config key 'model.name': no such file: {REPO}/examples/nomodels.py, "
     "got 'examples/nomodels.py:Net'"),
    (["model.name=examples.models:math"],
     "config key 'model.name': must name a torch.nn.Module subclass or a function that "
     "returns one; math is a module object, got 'examples.models:math'"),
    ([f"model.name={BY_MODULE}", "model.args.width=3"],
     "config key 'model.args': examples.models:BatchNormCNN does not take them: got an "
     "unexpected keyword argument 'width', got {'width': 3}"),
    (["model.name=logreg", "model.args.channels=3"],
     "config key 'model.args': sets the arguments of a model named by import path "
     "(module:Class); logreg takes none, got {'channels': 3}"),
    # found only when the class is called (in the driver, before round 1)
    ([f"model.name={BY_FILE}", "model.args.channels=0"],
     f"config key 'model.name': the {BY_FILE} model cannot be built for the inputs of the "
     "synthetic population, of shape (1, 28, 28): BatchNormCNN needs channels >= 1, got 0"),
    ([f"model.name={BY_FILE}", "model.args.channels=two"],
     f"config key 'model.args': {BY_FILE} refused them: '<' not supported between instances "
     "of 'str' and 'int', got {'channels': 'two'}"),
])
def test_each_refusal_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys,
                                                     overrides, message):
    from fedray.cli import main

    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "path", list(sys.path))
    code = main(["run", str(REPO / "jobs" / "quickstart.yaml"), "rounds=1",
                 f"output.dir={tmp_path / 'run'}", "--quiet", *TINY, *overrides])
    err = capsys.readouterr().err
    assert code == 2 and err == f"fedray: error: {message}\n", err
    assert not (tmp_path / "run").exists()


def test_the_examples_build_for_their_data(importable):
    from examples.models import BatchNormCNN, tiny_mlp

    net = BatchNormCNN(channels=4, num_classes=10).eval()
    assert net(torch.zeros(2, 1, 28, 28)).shape == (2, 10)
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules()) == 2
    mlp = tiny_mlp((1, 28, 28), 10, hidden=5, layers=2)
    assert [p.shape[0] for p in mlp.parameters() if p.dim() == 2] == [5, 5, 10]
    assert np.prod(mlp(torch.zeros(3, 1, 28, 28)).shape) == 30


def test_what_submit_and_sweep_ship_for_a_model_and_a_module_file(tmp_path, monkeypatch):
    """Without a cluster: model.name is among the job's import paths; a module that is a
    file (named by module or by path) takes the .py files beside it and nothing under them;
    a sweep makes the job's and the swept relative .py paths absolute; too large a set of
    neighbours is refused in one line naming the key."""
    import io
    import zipfile

    from fedray.cluster import submit as submit_module
    from fedray.cluster import sweep as sweep_module
    from fedray.cluster.submit import _stage_file, job_refs, user_modules
    from fedray.cluster.sweep import load_sweep, pack_modules
    from fedray.errors import ConfigError

    assert job_refs({"model": {"name": BY_FILE}, "algorithm": {"aggregator": "median"}}) == [
        ("model.name", BY_FILE)]
    assert job_refs({"model": {"name": "logreg"}}) == []
    proj = tmp_path / "proj"
    (proj / "algos" / "sub").mkdir(parents=True)
    for rel in ("mymodels.py", "helpers.py", "notes.txt", "algos/q.py", "algos/util.py",
                "algos/sub/deep.py"):
        (proj / rel).write_text("x = 1\n")
    monkeypatch.chdir(proj)
    by_module = user_modules([("model.name", "mymodels:Net")], cwd=str(proj))
    assert sorted(m.path for m in by_module) == [str(proj / "helpers.py"),
                                                 str(proj / "mymodels.py")]
    packed = pack_modules([("model.name", "mymodels:Net")])
    assert sorted(zipfile.ZipFile(io.BytesIO(packed)).namelist()) == ["helpers.py",
                                                                       "mymodels.py"]
    (by_file,) = user_modules([("model.name", "algos/q.py:Net")], cwd=str(proj))
    staging = tmp_path / "staging"
    _stage_file(by_file, str(staging))
    assert sorted(p.name for p in (staging / "algos").iterdir()) == ["q.py", "util.py"]

    sweep, job = load_sweep({"job": {"model": {"name": "algos/q.py:Net"}},
                             "parameters": {"model.name": ["algos/q.py:Net", "mymodels:Net"]},
                             "output": str(tmp_path / "s")})
    assert job.model.name == f"{proj}/algos/q.py:Net"
    assert list(sweep.parameters["model.name"]) == [f"{proj}/algos/q.py:Net", "mymodels:Net"]
    assert ("model.name", "mymodels:Net") in sweep_module._module_refs(sweep, job)

    monkeypatch.setattr(submit_module, "MAX_MODULES_MB", 0)
    with pytest.raises(ConfigError, match=r"^config key 'model\.name': the 2 \.py files beside "
                                          r"q\.py that travel with it take 0 MiB, more than 0 "
                                          r"MiB: move the module into a directory of its own"):
        user_modules([("model.name", "algos/q.py:Net")], cwd=str(proj))
