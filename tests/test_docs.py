"""Docs and job files stay true to the code."""

import pathlib
import re

import pytest
from omegaconf import OmegaConf

from fedray.api import prepare
from fedray.config import load_config
from fedray.errors import FedrayError

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _keys(node, prefix=""):
    for k, v in node.items():
        if isinstance(v, dict):
            yield from _keys(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def test_config_doc_lists_every_key_and_no_other():
    doc = (ROOT / "docs" / "config.md").read_text()
    documented = set(re.findall(r"^\| `([a-z0-9_.]+)` \|", doc, flags=re.M))
    actual = set(_keys(OmegaConf.to_container(load_config())))
    assert documented == actual


@pytest.mark.parametrize("job", sorted((ROOT / "jobs").glob("**/*.yaml")), ids=lambda p: p.name)
def test_every_job_file_validates(job):
    if load_config(job).data.partition != "synthetic":  # a store built by a recipe first:
        with pytest.raises(FedrayError, match="no partition store"):  # named when missing
            prepare(job, ["data.partition=/nonexistent/store"])
        job = load_config(job, ["data.partition=synthetic", "data.synthetic.num_clients=1000"])
    prepare(job)


def test_readme_commands_exist_in_makefile():
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    for target in re.findall(r"^make (\w+)", readme, flags=re.M):
        assert re.search(rf"^{target}:", makefile, flags=re.M), target
    assert "make test" in (ROOT / ".ci" / "run").read_text()
