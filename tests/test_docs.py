"""Docs and job files stay true to the code."""

import pathlib
import re

import pytest
from omegaconf import OmegaConf

from fedray.api import prepare
from fedray.cluster.sweep import SweepConfig, check_trials, load_sweep
from fedray.config import load_config
from fedray.errors import FedrayError

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _keys(node, prefix=""):
    for k, v in node.items():
        if isinstance(v, dict) and v:  # an empty mapping (sweep parameters) is one key
            yield from _keys(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def test_config_doc_lists_every_key_and_no_other():
    doc = (ROOT / "docs" / "config.md").read_text()
    documented = set(re.findall(r"^\| `([a-z0-9_.]+)` \|", doc, flags=re.M))
    actual = set(_keys(OmegaConf.to_container(load_config())))
    assert documented == actual


SWEEPS = sorted((ROOT / "jobs" / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("job", sorted(set((ROOT / "jobs").glob("**/*.yaml")) - set(SWEEPS)),
                         ids=lambda p: p.name)
def test_every_job_file_validates(job):
    if load_config(job).data.partition != "synthetic":  # a store built by a recipe first:
        with pytest.raises(FedrayError, match="no partition store"):  # named when missing
            prepare(job, ["data.partition=/nonexistent/store"])
        job = load_config(job, ["data.partition=synthetic", "data.synthetic.num_clients=1000"])
    prepare(job)


@pytest.mark.parametrize("sweep", SWEEPS, ids=lambda p: p.name)
def test_every_sweep_file_validates(sweep):
    assert check_trials(*load_sweep(str(sweep))) >= 1


def test_cluster_doc_lists_every_sweep_key_and_no_other():
    doc = (ROOT / "docs" / "cluster.md").read_text()
    doc = doc[doc.index("## 3. Sweeps"):doc.index("## 4. Logging")]
    documented = set(re.findall(r"^\| `([a-z0-9_.]+)` \|", doc, flags=re.M))
    actual = set(_keys(OmegaConf.to_container(OmegaConf.structured(SweepConfig))))
    assert documented == actual


def test_readme_commands_exist_in_makefile():
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in re.findall(r"^make (\w+)", readme, flags=re.M):
        assert re.search(rf"^{target}:", makefile, flags=re.M), target
    assert "make test" in (ROOT / ".ci" / "run").read_text()
