"""The typed config: ``fedray.config.typed`` and what it is made of (fedray/section.py).
Pure data: no Ray, no torch."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
from omegaconf import OmegaConf

from fedray.api import with_algorithm
from fedray.config import (
    ClockConfig,
    FedrayConfig,
    SamplingConfig,
    load_config,
    to_dict,
    typed,
)
from fedray.errors import ConfigError
from fedray.section import FrozenMap, frozen, section_tree, thawed

JOB = ["algorithm.name=fedprox", "algorithm.fedprox.mu=0.05", "sampling.always=[3, 1]",
       "model.args={hidden: [64, 32], act: relu}", "adversary.attacks=[sign_flip]",
       "adversary.fraction=0.1", "clock.enabled=true"]


@pytest.fixture(scope="module")
def cfg():
    return with_algorithm(load_config(None, JOB))


def test_every_section_is_its_schema_dataclass_and_read_only(cfg):
    job = typed(cfg)
    assert isinstance(job, FedrayConfig)
    assert isinstance(job.sampling, SamplingConfig) and isinstance(job.clock, ClockConfig)
    assert job.sampling.always == (3, 1)  # a list becomes a tuple
    assert job.model.args == {"hidden": (64, 32), "act": "relu"}
    assert isinstance(job.model.args, FrozenMap)
    for section, key, value in ((job, "rounds", 1), (job.sampling, "dropout", 0.5),
                                (job.clock.devices, "source", "trace")):
        with pytest.raises(dataclasses.FrozenInstanceError, match="read-only"):
            setattr(section, key, value)
    with pytest.raises(TypeError):
        job.model.args["act"] = "tanh"  # a FrozenMap has no item assignment
    with pytest.raises(AttributeError):
        job.model.args._items = {}


def test_open_sections_keep_their_part_and_attack_keys(cfg):
    job = typed(cfg)
    assert job.algorithm.sections["fedprox"]["mu"] == 0.05
    assert "fedprox" not in [f.name for f in dataclasses.fields(job.algorithm)]
    assert job.sampling.sections == {}  # a closed section has none


def test_the_tree_of_a_typed_config_is_the_config_it_was_made_from(cfg):
    # section_tree gives back exactly what config.yaml records: the same keys in the same
    # order, lists as lists (what the registry and the run record read)
    tree = section_tree(typed(cfg))
    assert tree == to_dict(cfg)
    assert list(tree) == list(to_dict(cfg))
    assert list(tree["algorithm"]) == list(to_dict(cfg)["algorithm"])
    assert thawed(frozen({"a": [1, {"b": [2]}]})) == {"a": [1, {"b": [2]}]}


def test_a_typed_config_travels_by_pickle_and_copy_and_stays_read_only(cfg):
    # Ray ships the driver its job by pickle
    job = typed(cfg)
    for other in (pickle.loads(pickle.dumps(job)), copy.deepcopy(job)):
        assert other == job
        assert other.algorithm.sections == job.algorithm.sections
        with pytest.raises(dataclasses.FrozenInstanceError):
            other.sampling.clients_per_round = 1


def test_a_key_outside_the_open_sections_is_refused():
    tree = to_dict(load_config(None))
    tree["sampling"]["typo"] = 1
    with pytest.raises(ConfigError, match=r"unknown config key 'sampling\.typo'"):
        typed(tree)


def test_loading_is_unchanged_by_the_schema_being_sections():
    # the schema's dataclasses stay mutable while omegaconf merges into them
    cfg = load_config(None, ["sampling.clients_per_round=7"])
    assert OmegaConf.is_readonly(cfg) and cfg.sampling.clients_per_round == 7
    assert SamplingConfig().clients_per_round == 10
    fresh = SamplingConfig()
    fresh.dropout = 0.2  # an untyped instance is a plain dataclass
    assert fresh.dropout == 0.2
