import pathlib

import jsonschema
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ray_cluster_yaml_matches_ray_schema():
    from ray.autoscaler._private.util import validate_config

    config = yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())
    config.setdefault("cluster_synced_files", [])  # filled in by `ray up`
    validate_config(config)
    broken = dict(config, head_node_type="gpu_head")
    with pytest.raises((ValueError, jsonschema.ValidationError)):
        validate_config(broken)
