import re

import pytest

from fedray.api import prepare
from fedray.config import load_config, validate
from fedray.errors import ConfigError, FedrayError


def test_defaults_load_and_validate():
    cfg = load_config()
    validate(cfg, population=cfg.data.synthetic.num_clients)
    assert cfg.client.batch_size == 20 and cfg.output.dir.startswith("runs/fedray-")


def test_typo_key_names_key_and_allowed():
    with pytest.raises(ConfigError, match=r"unknown config key 'client.lrr'.*lr, batch_size"):
        load_config(None, ["client.lrr=0.1"])


def test_typo_key_in_yaml(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("sampling:\n  clients_per_rnd: 5\n")
    with pytest.raises(ConfigError, match="sampling.clients_per_rnd"):
        load_config(job)


def test_wrong_type():
    with pytest.raises(ConfigError, match=r"'client.batch_size'.*'abc'"):
        load_config({"client": {"batch_size": "abc"}})
    with pytest.raises(ConfigError, match="client.local_steps"):
        load_config(None, ["client.local_steps=2.5"])


def test_vectorize_reads_on_and_off_as_yaml_writes_them(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("runtime:\n  worker:\n    vectorize: off\n")  # YAML 1.1: a boolean
    assert load_config(job).runtime.worker.vectorize == "off"
    assert load_config(None, ["runtime.worker.vectorize=on"]).runtime.worker.vectorize == "on"
    assert load_config().runtime.worker.vectorize == "auto"


def test_clients_per_round_above_population():
    cfg = load_config(None, ["sampling.clients_per_round=11", "data.synthetic.num_clients=10"])
    with pytest.raises(ConfigError, match=r"sampling.clients_per_round.*population of 10"):
        prepare(cfg)


@pytest.mark.parametrize("override, key", [
    ("client.lr=-1", "client.lr"),
    ("server.lr=0", "server.lr"),
    ("rounds=0", "rounds"),
    ("client.batch_size=0", "client.batch_size"),
    ("model.name=resnet1000", "model.name"),
    ("algorithm.name=fedfoo", "algorithm.name"),
    ("runtime.worker.num_gpus=1.5", "runtime.worker.num_gpus"),
    ("runtime.worker.num_cpus=0", "runtime.worker.num_cpus"),
    ("data.synthetic.max_examples=3", "data.synthetic.max_examples"),
    ("data.partition=/nonexistent/store", "data.partition"),
    ("data.partition=nosuchproto://bucket/x", "data.partition"),
    ("eval.federated_clients=100000", "eval.federated_clients"),
    ("guard.max_update_norm=0", "guard.max_update_norm"),
    ("runtime.worker.vectorize=sometimes", "runtime.worker.vectorize"),
])
def test_impossible_values(override, key):
    with pytest.raises(FedrayError, match=re.escape(key)):
        prepare(None, [override])


def test_bad_override_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["rounds"])
    with pytest.raises(ConfigError, match="job file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1,\n")
    with pytest.raises(ConfigError, match="cannot parse job file"):
        load_config(bad)


def test_overrides_win_over_file(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("rounds: 7\nclient:\n  lr: 0.3\n")
    cfg = load_config(job, ["rounds=9"])
    assert cfg.rounds == 9 and cfg.client.lr == 0.3


def test_config_is_read_only():
    cfg = load_config()
    from omegaconf.errors import ReadonlyConfigError

    with pytest.raises(ReadonlyConfigError):
        cfg.rounds = 3


def test_a_file_of_another_kind_is_sent_to_its_command(tmp_path):
    from fedray.cluster.sweep import load_sweep
    from fedray.data.recipe import load_recipe

    sweep, job, recipe = (tmp_path / f"{n}.yaml" for n in ("sweep", "job", "recipe"))
    sweep.write_text("job: job.yaml\nparameters: {rounds: [1, 2]}\n")
    job.write_text("rounds: 2\nclient: {lr: 0.1}\n")
    recipe.write_text("source: {name: mnist}\npartitioner: {name: iid}\n")
    with pytest.raises(ConfigError, match=f"^job file {sweep} is a sweep file \\(it has 'job', "
                       f"'parameters'\\): fedray sweep {sweep}$"):
        load_config(str(sweep))
    with pytest.raises(ConfigError, match=f"is a job file .*: fedray run {job}$"):
        load_sweep(str(job))
    with pytest.raises(ConfigError, match=f"is a recipe file .*: fedray partition {recipe}$"):
        load_config(str(recipe))
    with pytest.raises(ConfigError, match=f"^recipe file {job} is a job file"):
        load_recipe(str(job))
    job.write_text("rounds: 2\nsource: 1\n")  # one misspelt key does not make a recipe
    with pytest.raises(ConfigError, match="^unknown config key 'source'"):
        load_config(str(job))
