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
    ("runtime.precision=fp16", "runtime.precision"),
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


# -- interpolation (docs/config.md, Interpolation) ------------------------------------------

SECRET = "s3cr3t-f3dray-t3st"
REFUSED = "the resolver oc.env is not allowed: only ${key} references to other keys"


def test_key_references_resolve_once_against_the_merged_config(tmp_path):
    from omegaconf import OmegaConf

    job = tmp_path / "job.yaml"
    job.write_text("name: base\nclient: {batch_size: 16}\n"
                   "eval: {batch_size: '${client.batch_size}'}\n"
                   "output: {dir: 'runs/${name}-s${seed}'}\n")
    cfg = load_config(job, ["client.batch_size=33", "seed=4"])  # an override flows through
    assert cfg.eval.batch_size == 33 and cfg.output.dir == "runs/base-s4"
    raw = OmegaConf.to_container(cfg, resolve=False)  # resolved in place: nothing left to
    assert raw["eval"]["batch_size"] == 33  # resolve when config.yaml is written or read
    assert load_config(None, ["name=${.seed}"]).name == "0"  # relative references too


@pytest.mark.parametrize("value", [
    "${oc.env:FEDRAY_TEST_SECRET}", "x-${oc.env:FEDRAY_TEST_SECRET}-y",
    "${ oc.env :FEDRAY_TEST_SECRET}", "${oc.env:FEDRAY_TEST_SECRET,default}",
    "${seed.${oc.env:FEDRAY_TEST_SECRET}}",
])
def test_every_spelling_of_a_resolver_is_refused(value, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDRAY_TEST_SECRET", SECRET)
    job = tmp_path / "job.yaml"
    job.write_text(f"rounds: 2\nname: \"{value}\"\n")
    for source, overrides in ((job, []), (None, [f"name={value}"]), ({"name": value}, [])):
        with pytest.raises(ConfigError) as info:
            load_config(source, overrides)
        assert str(info.value).startswith("config key 'name': the resolver oc.")
        assert SECRET not in str(info.value)


@pytest.mark.parametrize("value, resolver", [
    ("${oc.decode:'1'}", "oc.decode"), ("${oc.select:seed,1}", "oc.select"),
    ("${oc.create:[1]}", "oc.create"), ("${anything:x}", "anything"),
])
def test_every_resolver_is_refused(value, resolver):
    with pytest.raises(ConfigError, match=re.escape(f"config key 'name': the resolver "
                                                    f"{resolver} is not allowed")):
        load_config(None, [f"name={value}"])


def test_sweeps_recipes_and_saved_configs_refuse_resolvers(tmp_path, monkeypatch):
    """Every loader of a config goes through the same check: sweep files (their parameters,
    overrides and inline job), recipes, a run's config.yaml on --resume and a sweep's
    sweep.yaml on --resume; none reads the environment."""
    from fedray.api import prepare_resume
    from fedray.cluster.sweep import SWEEP_FILE, load_sweep, run_sweep
    from fedray.config import to_yaml
    from fedray.data.recipe import load_recipe

    monkeypatch.setenv("FEDRAY_TEST_SECRET", SECRET)
    env = "${oc.env:FEDRAY_TEST_SECRET}"
    quick = "jobs/quickstart.yaml"
    sweeps = {"parameters.name.0": f"job: {quick}\nparameters:\n  name: ['{env}']\n",
              "overrides.0": f"job: {quick}\noverrides: ['name={env}']\nparameters:\n"
                             "  seed: [0]\n",
              "job.name": f"job:\n  name: '{env}'\nparameters:\n  seed: [0]\n"}
    for key, text in sweeps.items():
        (tmp_path / "s.yaml").write_text(text)
        with pytest.raises(ConfigError, match=re.escape(f"sweep key '{key}': {REFUSED}")):
            load_sweep(str(tmp_path / "s.yaml"))
    with pytest.raises(ConfigError, match=re.escape(f"recipe key 'out': {REFUSED}")):
        load_recipe("partitions/synthetic_dirichlet.yaml", [f"out={env}"])
    run = tmp_path / "run"  # a crafted run directory: its config.yaml reads the environment
    run.mkdir()
    text = to_yaml(load_config(quick, [f"output.dir={run}"])).replace("name: quickstart",
                                                                      f"name: '{env}'")
    (run / "config.yaml").write_text(text)
    for job in (None, quick):  # with the job given again, the config.yaml is still read
        with pytest.raises(FedrayError, match=re.escape(f"its config.yaml: config key 'name': "
                                                        f"{REFUSED}")) as info:
            prepare_resume(str(run), job)
        assert SECRET not in str(info.value)
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / SWEEP_FILE).write_text(f"name: '{env}'\njob: {{}}\nparameters: {{}}\n")
    with pytest.raises(FedrayError, match=re.escape(f"its {SWEEP_FILE}: sweep key 'name': "
                                                    f"{REFUSED}")):
        run_sweep(None, resume=str(sweep_dir))


@pytest.mark.parametrize("overrides, message", [
    (["eval.batch_size=${client.batchsize}"],
     "config key 'eval.batch_size': Interpolation key 'client.batchsize' not found"),
    (["name=${name}"], "config key 'name': Recursive interpolation detected"),
    (["seed=${rounds}", "rounds=${seed}"], "config key 'seed': Recursive interpolation detected"),
    (["rounds=${name}"], "config key 'rounds': While dereferencing interpolation '${name}': "
                         "Value 'fedray' of type 'str' could not be converted to Integer"),
    (["name=${oc.env:HOME"], "config key 'name': not a valid ${...} interpolation (missing "
                             "BRACE_CLOSE at '<EOF>'), got '${oc.env:HOME'"),
    (["name=${}"], "config key 'name': not a valid ${...} interpolation"),
    # an escaped \${...} is text, which omegaconf would read as an interpolation again when
    # the value is next read (and --resume when it reads config.yaml)
    (["name=\\${oc.env:HOME}"], "config key 'name': '${' may appear only in a ${key} "
                                "reference to another key, got '${oc.env:HOME}'"),
])
def test_an_interpolation_error_is_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config("jobs/quickstart.yaml" if "fedray" not in message else None, overrides)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


@pytest.mark.slow
def test_a_resolver_never_reaches_the_run_directory_or_the_output(tmp_path):
    """Through the real command: the environment's secret is neither printed nor written;
    the refused run leaves no directory. A run with ${key} references records their values
    (no '${' in any file of the run directory)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, FEDRAY_TEST_SECRET=SECRET, RAY_USAGE_STATS_ENABLED="0")
    common = ["rounds=1", "model.name=logreg", "data.synthetic.num_clients=20",
              "sampling.clients_per_round=2", "eval.every=0", "runtime.backend=inline",
              "output.tensorboard=true"]

    def fedray(*args):
        return subprocess.run([sys.executable, "-m", "fedray.cli", "run", *args, "--quiet"],
                              capture_output=True, text=True, env=env, timeout=300)

    refused = fedray("jobs/quickstart.yaml", *common, "name=${oc.env:FEDRAY_TEST_SECRET}",
                     f"output.dir={tmp_path}/refused")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.count("\n") == 1 and REFUSED in refused.stderr
    assert SECRET not in refused.stdout + refused.stderr
    assert not (tmp_path / "refused").exists()
    ok = fedray("jobs/quickstart.yaml", *common, "name=ref-s${seed}",
                "eval.batch_size=${client.batch_size}", f"output.dir={tmp_path}/runs/${{name}}")
    assert ok.returncode == 0, ok.stderr[-2000:]
    run = tmp_path / "runs" / "ref-s0"
    files = [p for p in run.rglob("*") if p.is_file()]
    assert {"config.yaml", "summary.json", "metrics.jsonl"} <= {p.name for p in files}
    for p in files:
        data = p.read_bytes()
        assert SECRET.encode() not in data, p
        assert p.suffix == ".safetensors" or b"${" not in data, p  # weights are any bytes
    assert "eval:\n  every: 0\n  central: true\n  federated_clients: 0\n  batch_size: 20" in (
        run / "config.yaml").read_text()
    assert str(run) in ok.stdout and SECRET not in ok.stdout + ok.stderr


_PIECES = ["${", "}", "oc.env", "oc.decode", ":", ",", ".", "\\", "name", "seed", "client.",
           "batch_size", "FEDRAY_TEST_SECRET", "'", '"', "[", "]", "{", " ", "$", "a", "=",
           "${oc.env:FEDRAY_TEST_SECRET}", "${name}", "${seed}", "${.seed}", "\\${"]


@pytest.mark.slow
def test_any_interpolation_text_is_a_value_or_one_line(tmp_path_factory, monkeypatch):
    """The ``${...}`` class of hostile input (tests/test_hostile_inputs.py leaves it here):
    text built from interpolation's pieces, as an override of a job, a recipe and a sweep
    and as a value in a job file, is loaded or refused in one ConfigError line; the
    environment's secret never shows, in a message or a loaded config."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from fedray.cluster.sweep import load_sweep
    from fedray.config import to_yaml
    from fedray.data.recipe import load_recipe

    monkeypatch.setenv("FEDRAY_TEST_SECRET", SECRET)
    job = tmp_path_factory.mktemp("interp") / "job.yaml"
    # scalar keys: a value that YAML reads as a mapping, merged into a list key, is the
    # override-shape class of tests/test_hostile_inputs.py, with or without ${
    keys = st.sampled_from(["name", "seed", "client.batch_size", "eval.batch_size",
                            "output.dir", "client.lr"])
    text = st.lists(st.sampled_from(_PIECES), min_size=1, max_size=8).map("".join).filter(
        lambda v: "${" in v)

    def outcome(load) -> None:
        try:
            loaded = load()
        except ConfigError as exc:
            assert "\n" not in str(exc) and SECRET not in str(exc), str(exc)
            return
        shown = to_yaml(loaded) if hasattr(loaded, "keys") else str(loaded)
        assert SECRET not in shown and "${" not in shown

    @settings(max_examples=120, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(keys, text)
    def check(key, value):
        override = f"{key}={value}"
        outcome(lambda: load_config("jobs/quickstart.yaml", [override]))
        outcome(lambda: load_recipe("partitions/synthetic_dirichlet.yaml", [f"out={value}"]))
        outcome(lambda: load_sweep("jobs/sweeps/participation.yaml", [f"name={value}"])[0])
        job.write_text(f"rounds: 2\n{key.split('.')[0]}: {value!r}\n")
        outcome(lambda: load_config(job))

    check()
