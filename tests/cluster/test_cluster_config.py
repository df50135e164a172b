"""ray_cluster.yaml against Ray's autoscaler schema, and what `ray up` would copy to a node.

Nothing here starts Ray or reaches AWS: the config is checked as Ray's launcher reads it, and
the files a node receives are computed from `file_mounts` and `rsync_exclude` the way the
launcher's rsync selects them (rsync itself need not be installed).
"""

import fnmatch
import os
import pathlib
import re
import shutil
import subprocess

import jsonschema
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
REMOTE_CHECKOUT = "~/fedray"  # where setup_commands pip-installs fedray on every node
# values a user fills in before `ray up`: each must be named in the file's header comment
FILL_IN = ("AMI_ID", "ACCOUNT_ID")


def _config() -> dict:
    return yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())


def _git(root: pathlib.Path, *args: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                         text=True).stdout
    return [line for line in out.splitlines() if line]


def _require_git() -> None:
    """The ship checks compare against git's view of the tree, so they need git and a checkout."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    probe = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--show-toplevel"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or pathlib.Path(probe.stdout.strip()).resolve() != ROOT:
        pytest.skip("not a git checkout of the repository")


class _Excludes:
    """rsync's --exclude for the patterns ray_cluster.yaml uses: a name or glob, no slash
    except a trailing one (directories only). rsync matches such a pattern against the last
    component of every path it visits below the transfer root, and does not descend into an
    excluded directory. Anything richer (anchors, `**`, `+ `/`- ` rules) is refused here, so
    this emulation cannot silently drift from what rsync would do with the file."""

    def __init__(self, patterns: list[str]):
        self.rules = []
        for pattern in patterns:
            body = pattern[:-1] if pattern.endswith("/") else pattern
            assert body and "/" not in body and "**" not in body, pattern
            assert not pattern.startswith(("+ ", "- ", "!")), pattern
            self.rules.append((body, pattern.endswith("/")))

    def excludes(self, name: str, is_dir: bool) -> bool:
        return any(fnmatch.fnmatchcase(name, body) and (is_dir or not dir_only)
                   for body, dir_only in self.rules)


def _repo_mounts(config: dict) -> dict[str, str]:
    """Remote path -> repository-relative local path, for the mounts taken from the checkout
    (the token, ~/.ray/auth_token, comes from the user's home instead)."""
    mounts = {}
    for remote, local in config["file_mounts"].items():
        if local.startswith("~") or os.path.isabs(local):
            continue
        mounts[remote] = os.path.normpath(local)
    return mounts


def shipped(config: dict, root: pathlib.Path) -> set[str]:
    """The repository-relative files `ray up` copies to a node from the checkout at `root`.

    Ray's updater rsyncs each mount with `rsync -avz --exclude PATTERN ... SRC DST`, adding a
    trailing slash to a directory, so the directory's own name is never matched, only the
    names below it; a file mount is matched by its own name."""
    excludes = _Excludes(config.get("rsync_exclude") or [])
    assert not config.get("rsync_filter"), "rsync_filter is not emulated here: extend the test"
    files = set()
    for local in _repo_mounts(config).values():
        source = root / local
        if source.is_file():
            if not excludes.excludes(source.name, is_dir=False):
                files.add(local)
            continue
        assert source.is_dir(), f"{local} is missing: `ray up` would stop at it"
        for base, dirs, names in os.walk(source):
            dirs[:] = [d for d in dirs if not excludes.excludes(d, is_dir=True)]
            for name in names:
                if not excludes.excludes(name, is_dir=False):
                    files.add(pathlib.Path(base, name).relative_to(root).as_posix())
    return files


def _ignored(root: pathlib.Path, paths: list[str]) -> set[str]:
    """Untracked files under `paths` that git ignores, as git itself decides."""
    return set(_git(root, "ls-files", "--others", "--ignored", "--exclude-standard", "--",
                    *paths))


def test_ray_cluster_yaml_matches_ray_schema():
    from ray.autoscaler._private.util import validate_config

    config = _config()
    config.setdefault("cluster_synced_files", [])  # filled in by `ray up`
    validate_config(config)
    broken = dict(config, head_node_type="gpu_head")
    with pytest.raises((ValueError, jsonschema.ValidationError)):
        validate_config(broken)


def test_ray_cluster_yaml_has_the_node_types_fedray_needs():
    config = _config()
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"] == {"CPU": 0}  # workers never land on the head
    assert any("--num-cpus=0" in c and "--dashboard-host=127.0.0.1" in c
               for c in config["head_start_ray_commands"])
    # every node requires the cluster's token: no unauthenticated job server or GCS
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in config[key] if "ray start" in c]
        assert starts and all(c.startswith("RAY_AUTH_MODE=token ") for c in starts)
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    # and the nodes' shells send it, so `ray exec ray_cluster.yaml 'ray status'` gets in
    assert any("export RAY_AUTH_MODE=token" in c and "~/.bashrc" in c
               for c in config["setup_commands"])
    workers = [t for name, t in types.items() if name != config["head_node_type"]]
    assert any(t["resources"].get("GPU", 0) >= 1 for t in workers)
    assert any("GPU" not in t["resources"] and t["resources"]["CPU"] >= 1 for t in workers)
    for t in workers:
        assert t["min_workers"] == 0 and t["max_workers"] >= 1
    assert config["idle_timeout_minutes"] > 0
    assert any(re.search(rf"pip install .*-e {re.escape(REMOTE_CHECKOUT)}(\s|$)", c)
               for c in config["setup_commands"])


def test_every_node_has_the_ami_and_an_instance_profile_to_fill_in():
    """The values a user must fill in are real keys on every node type, named in the file's
    header and in docs/cluster.md; filled in or not, the file keeps passing."""
    text = (ROOT / "ray_cluster.yaml").read_text()
    header = text.split("\ncluster_name:")[0]
    docs = (ROOT / "docs" / "cluster.md").read_text()
    types = _config()["available_node_types"]
    # one AMI for all node types, and an IamInstanceProfile on each (the head runs the
    # drivers, which write runs and sweeps to the bucket; the workers read stores)
    amis = {t["node_config"]["ImageId"] for t in types.values()}
    assert len(amis) == 1 and re.fullmatch(r"AMI_ID|ami-[0-9a-f]+", amis.pop())
    for name, t in types.items():
        arn = t["node_config"]["IamInstanceProfile"]["Arn"]
        assert re.fullmatch(r"arn:aws:iam::(ACCOUNT_ID|\d{12}):instance-profile/[\w+=,.@/-]+",
                            arn), name
    for value in (*FILL_IN, "provider.region", "BUCKET"):
        assert value in header and f"`{value}`" in docs, value


def test_nodes_install_the_ray_this_environment_runs():
    """Ray requires a cluster's nodes and the machine that drives them to run the same Ray:
    a Ray upgrade here that leaves ray_cluster.yaml behind fails this test."""
    import ray

    pins = re.findall(r"ray\[[a-z,]+\]==([0-9][\w.]*)", " ".join(_config()["setup_commands"]))
    assert pins == [ray.__version__], (
        f"ray_cluster.yaml installs Ray {pins} on the nodes, this environment runs "
        f"{ray.__version__}: update the pin in setup_commands")


def test_nodes_get_what_pip_install_needs_and_nothing_git_ignores():
    _require_git()
    config = _config()
    mounts = _repo_mounts(config)
    # the node's ~/fedray mirrors the repository's layout, so `pip install -e ~/fedray` sees
    # the same tree a local `pip install -e .` does
    for remote, local in mounts.items():
        assert remote == f"{REMOTE_CHECKOUT}/{local}", (remote, local)
    tracked = set(_git(ROOT, "ls-files"))
    for local in mounts.values():  # present on a fresh clone, not only on this machine
        assert local in tracked or any(f.startswith(local + "/") for f in tracked), local
    files = shipped(config, ROOT)
    readme = re.search(r'^readme\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    needed = {"fedray/__init__.py", "fedray/cli.py", "pyproject.toml", "setup.py",
              readme.group(1), "jobs/quickstart.yaml", "partitions/femnist.yaml"}
    assert needed <= files, needed - files
    assert not files & _ignored(ROOT, sorted(mounts.values()))
    assert not [f for f in files if f.split("/")[0] in {".venv", "runs", "stores", ".git"}]


def test_ignored_files_never_ship_even_where_a_clone_has_none(tmp_path):
    """A fresh clone holds no ignored files, so the check above could pass for want of any.
    Here a copy of the mounted paths gets caches, runs, stores and one file for every
    .gitignore pattern inside every mounted directory; git must call each ignored, and none
    may ship."""
    _require_git()
    config = _config()
    mounts = _repo_mounts(config)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    shutil.copy(ROOT / ".gitignore", tmp_path / ".gitignore")
    directories = [local for local in mounts.values() if (ROOT / local).is_dir()]
    for local in mounts.values():
        path = tmp_path / local
        if local in directories:
            (path / "kept.py").parent.mkdir(parents=True, exist_ok=True)
            (path / "kept.py").write_text("")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
    planted = [".venv/lib/python3.11/site-packages/torch/__init__.py",
               "runs/a/metrics.jsonl", "stores/s/shard.arrow", "fedray.egg-info/PKG-INFO",
               "fedray/__pycache__/cli.cpython-311.pyc",
               "fedray/core/__pycache__/tensors.cpython-311.pyc",
               "jobs/runs/r/metrics.jsonl", "partitions/stores/s/shard.arrow"]
    patterns = [p.strip() for p in (ROOT / ".gitignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    for pattern in patterns:
        name = pattern.rstrip("/").lstrip("/").replace("*", "x")
        for local in directories:
            planted.append(f"{local}/{name}/inside" if pattern.endswith("/")
                           else f"{local}/sub/{name}")
    for rel in planted:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    ignored = _ignored(tmp_path, ["."])
    assert set(planted) <= ignored, set(planted) - ignored  # each planted file is ignored
    files = shipped(config, tmp_path)
    assert not files & ignored, sorted(files & ignored)
    assert {f"{local}/kept.py" for local in directories} <= files  # the walk did look inside
    assert {local for local in mounts.values() if local not in directories} <= files
