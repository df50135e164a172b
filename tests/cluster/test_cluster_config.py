import pathlib

import jsonschema
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_ray_cluster_yaml_matches_ray_schema():
    from ray.autoscaler._private.util import validate_config

    config = yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())
    config.setdefault("cluster_synced_files", [])  # filled in by `ray up`
    validate_config(config)
    broken = dict(config, head_node_type="gpu_head")
    with pytest.raises((ValueError, jsonschema.ValidationError)):
        validate_config(broken)


def test_ray_cluster_yaml_has_the_node_types_fedray_needs():
    config = yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"] == {"CPU": 0}  # workers never land on the head
    assert any("--num-cpus=0" in c and "--dashboard-host=127.0.0.1" in c
               for c in config["head_start_ray_commands"])
    # every node requires the cluster's token: no unauthenticated job server or GCS
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in config[key] if "ray start" in c]
        assert starts and all(c.startswith("RAY_AUTH_MODE=token ") for c in starts)
    workers = [t for name, t in types.items() if name != config["head_node_type"]]
    assert any(t["resources"].get("GPU", 0) >= 1 for t in workers)
    assert any("GPU" not in t["resources"] and t["resources"]["CPU"] >= 1 for t in workers)
    for t in workers:
        assert t["min_workers"] == 0 and t["max_workers"] >= 1
    assert config["idle_timeout_minutes"] > 0
    assert any("pip install" in c and "/home/ubuntu/fedray" in c
               for c in config["setup_commands"])
    assert config["file_mounts"] == {"/home/ubuntu/fedray": ".",
                                     "/home/ubuntu/.ray/auth_token": "~/.ray/auth_token"}
