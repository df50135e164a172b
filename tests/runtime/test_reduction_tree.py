"""runtime.reduce: partial sums added in groups of worker slots before the driver merges them.

The tree defines the round's float64 arithmetic (each group folded from zero in slot order,
then the groups in order), so wherever a group's sum is made -- its first worker, the
driver, the driver after a fault -- the result is the same bits. The math is checked without
Ray; the inline backend checks a whole run; one Ray run on a fake two-node cluster checks
the workers' sums, node-major slots and a worker killed mid-round."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_job

import fedray
from fedray.algorithms.reduction import PartialMessage, PartialSum, fold_partials
from fedray.api import prepare
from fedray.errors import FedrayError
from fedray.runtime.messages import RoundResult
from fedray.runtime.reduction_tree import node_major, reduce_results, slot_groups
from fedray.runtime.worker import ClientWorker
from fedray.state.run_dir import SERVER_STATE_FILE, load_tensors

N = 40_000  # longer than torch's grain (32768): an add is split among its threads


def _partials(seed: int = 0) -> list[PartialMessage]:
    """Worker partial sums as a softmax aggregator (Exp-alpha) leaves them: log-scales far
    apart (exp(700) overflows float64 unless aligned), one worker with no weight, an extra
    sum."""
    g = np.random.default_rng(seed)
    out = []
    for log_scale in (0.0, 700.0, -30.0, 699.5, 2.0, 701.25, -math.inf, 650.0):
        weight = 0.0 if log_scale == -math.inf else float(g.uniform(0.5, 3.0))
        out.append(PartialMessage(g.normal(size=N) * weight, weight, log_scale,
                                  {"extra": g.normal(size=7)}))
    return out


def _reference(parts: list[PartialMessage]) -> np.ndarray:
    """sum_k e^(s_k) S_k / sum_k e^(s_k) w_k in extended precision (np.longdouble)."""
    top = max(p.log_scale for p in parts)
    num = np.zeros(N, np.longdouble)
    den = np.longdouble(0)
    for p in parts:
        if p.weight > 0:
            f = np.exp(np.longdouble(p.log_scale - top))
            num += f * p.sum.astype(np.longdouble)
            den += f * np.longdouble(p.weight)
    return num / den


def _merged(groups: list[PartialMessage]) -> PartialSum:
    acc = PartialSum(N, extras={"extra": 7})
    for g in groups:
        acc.merge(g)
    return acc


def _result(part: PartialMessage, i: int) -> RoundResult:
    return RoundResult(partial=part, clients=2, examples=10 + i, loss_sum=0.1 * i,
                       examples_seen=20 + i, dropped=0, updates=2, stored=[i], busy_s=0.5,
                       mem_mb=100.0 + i)


def test_group_sums_are_one_arithmetic_wherever_they_are_made():
    parts = _partials()
    groups = slot_groups(list(range(len(parts))), 3)
    assert groups == [[0, 1, 2], [3, 4, 5], [6, 7]]
    results = [_result(p, i) for i, p in enumerate(parts)]
    # a worker's reduce (ClientWorker.reduce), and the driver's fold, one result at a time
    on_workers = [ClientWorker().reduce(*(results[i] for i in g)) for g in groups]
    on_driver = [reduce_results(results[i] for i in g) for g in groups]
    before = torch.get_num_threads()
    # a worker's threads (no add on this build rounds differently split; the fold pins one)
    torch.set_num_threads(2)
    try:
        threaded = [fold_partials(parts[i] for i in g) for g in groups]
    finally:
        torch.set_num_threads(before)
    for g, a, b, c in zip(groups, on_workers, on_driver, threaded, strict=True):
        # the definition: from zero, in slot order (PartialSum.merge, as the driver merges)
        explicit = _merged([parts[i] for i in g]).to_message()
        for x in (b.partial, c, explicit):
            assert np.array_equal(a.partial.sum, x.sum)
            assert (a.partial.weight, a.partial.log_scale) == (x.weight, x.log_scale)
            assert np.array_equal(a.partial.extras["extra"], x.extras["extra"])
    # the members' statistics come back as they were, without their partial sums
    assert [[r.examples for r in g.results] for g in on_workers] == [[10, 11, 12],
                                                                     [13, 14, 15], [16, 17]]
    assert all(r.partial is None for g in on_workers for r in g.results)
    assert on_workers[0].partial.log_scale == 700.0  # aligned to the group's largest scale
    # the tree's round sum: the exact softmax-weighted mean, to float64 rounding
    tree = _merged([g.partial for g in on_workers])
    flat = _merged(parts)
    want = _reference(parts)
    assert tree.log_scale == flat.log_scale == 701.25
    # float64 rounding of terms of order 1 is absolute, ~1e-16 each: a mean that cancels
    # to near zero is off by that much, not by 1e-16 of itself
    np.testing.assert_allclose(tree.mean().numpy(), want.astype(np.float64), atol=1e-14)
    np.testing.assert_allclose(flat.mean().numpy(), want.astype(np.float64), atol=1e-14)
    assert not np.array_equal(tree.mean().numpy(), flat.mean().numpy())  # another rounding
    # extras are summed as they are, zero-weight workers' left out (PartialSum.merge)
    np.testing.assert_allclose(tree.extras["extra"].numpy(),
                               sum(p.extras["extra"] for p in parts if p.weight > 0),
                               atol=1e-14)
    with pytest.raises(ValueError, match="no partial sums"):
        fold_partials([])


def test_groups_follow_slots_and_slots_follow_nodes():
    assert slot_groups([0, 1, 2, 3, 4], 2) == [[0, 1], [2, 3], [4]]
    assert slot_groups([0, 2, 3, 5], 2) == [[0], [1, 2], [3]]  # slots without clients
    # buffered training: one task per (slot, model version); each version's own groups
    assert slot_groups([0, 1, 2, 0, 1, 2], 2) == [[0, 1], [2], [3, 4], [5]]
    with pytest.raises(ValueError):
        slot_groups([0, 1], 1)
    assert node_major(["b", "a", "b", None, "a", "c"]) == [0, 2, 1, 4, 3, 5]
    assert node_major(["a", "a"]) == [0, 1]


def _inline(tmp_path: Path, name: str, algorithm: str, reduce: dict | None = None):
    job = tiny_job(tmp_path, name=name, rounds=3, algorithm__name=algorithm,
                   runtime__backend="inline", runtime__num_workers=5,
                   runtime__reduce=reduce or {}, output__dir=str(tmp_path / name))
    return fedray.run(job)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _metrics(run) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.endswith(("_s", "_mb"))} for m in run.metrics]


@pytest.mark.parametrize("algorithm", ["scaffold", "expalpha"])
def test_inline_tree_on_workers_equals_on_driver(tmp_path, monkeypatch, algorithm):
    """SCAFFOLD: extra sums, stored client state and server state; Exp-alpha: softmax
    weights (log-scales). 5 workers in groups of 2: [0, 1], [2, 3], [4]."""
    sizes: list[int] = []
    reduce = ClientWorker.reduce

    def spy(self, *results):
        sizes.append(len(results))
        return reduce(self, *results)

    monkeypatch.setattr(ClientWorker, "reduce", spy)
    flat = _inline(tmp_path, "flat", algorithm)
    assert sizes == []
    driver = _inline(tmp_path, "driver", algorithm, {"group_size": 2, "where": "driver"})
    assert sizes == []
    workers = _inline(tmp_path, "workers", algorithm, {"group_size": 2, "where": "workers"})
    assert sizes == [2, 2] * 3  # groups of one are folded by the driver
    for k in flat.weights:
        assert torch.equal(driver.weights[k], workers.weights[k]), k
        # the tree's float64 rounding differs from the flat merge's, by ~1e-16 relative:
        # far below float32 resolution (6e-8) on weights of order 1
        torch.testing.assert_close(driver.weights[k], flat.weights[k], rtol=1e-6, atol=1e-7)
    a, b = (load_tensors(r.run_dir, SERVER_STATE_FILE) for r in (driver, workers))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # statistics come back per worker and are added as without a tree: bit for bit
    assert _metrics(flat) == _metrics(driver) == _metrics(workers)
    assert all(m["merge_s"] >= 0 for m in driver.metrics + workers.metrics)
    if algorithm == "scaffold":  # every client's every stored state version, byte for byte
        files = [_files(Path(r.run_dir) / "client_state") for r in (flat, driver, workers)]
        assert files[0] and files[0] == files[1] == files[2]


QUICKSTART = Path(__file__).resolve().parents[2] / "jobs" / "quickstart.yaml"


def test_reduce_config_is_checked(tmp_path):
    with pytest.raises(FedrayError, match=r"'runtime.reduce.group_size': must be >= 2 or "
                       r"null .*got 1"):
        prepare(str(QUICKSTART), ["runtime.reduce.group_size=1"])
    with pytest.raises(FedrayError, match=r"'runtime.reduce.where': must be workers or "
                       r"driver, got 'nowhere'"):
        prepare(str(QUICKSTART), ["runtime.reduce.where=nowhere"])
    job = tmp_path / "job.yaml"  # as YAML (a key 'on' would be YAML 1.1's boolean True)
    job.write_text("runtime:\n  reduce:\n    group_size: 4\n    where: driver\n")
    cfg = prepare(str(job))
    assert (cfg.runtime.reduce.group_size, cfg.runtime.reduce.where) == (4, "driver")
    with pytest.raises(FedrayError, match=r"'runtime.reduce.group_size': the update stage "
                       "secagg must see each worker's partial sum"):
        fedray.run(tiny_job(tmp_path, algorithm__name="fedavg", algorithm__stages=["secagg"],
                            runtime__backend="inline", runtime__reduce__group_size=2))
    assert not (tmp_path / "run").exists()


# -- one Ray run, on a fake cluster of two nodes, in a process of its own ------------------

ROOT = Path(__file__).resolve().parents[2]


def _on_two_nodes(out: str) -> None:
    """Run in a child process (its own Ray; the session's may be running in the parent):
    2 nodes x 2 workers of half a CPU, groups of 2, sums on the workers, one worker killed
    mid-round; compared with the inline backend's sums on the driver, unfaulted."""
    import ray
    from ray.cluster_utils import Cluster
    from test_fault import suicidal_model_fn

    node = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False,
            "object_store_memory": 100 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args=node)
    try:
        cluster.add_node(**node)
        ray.init(address=cluster.address, logging_level="ERROR")
        tmp = Path(out).parent
        over = {"rounds": 2, "runtime__num_workers": 4, "runtime__worker__num_cpus": 0.5,
                "runtime__reduce__group_size": 2}
        sentinel = tmp / "killed"
        tree = fedray.run(tiny_job(tmp, **over, output__dir=str(tmp / "tree")),
                          model_fn=suicidal_model_fn(str(sentinel), at_call=4))
        clean = fedray.run(tiny_job(tmp, **over, runtime__backend="inline",
                                    runtime__reduce__where="driver",
                                    output__dir=str(tmp / "clean")),
                           model_fn=suicidal_model_fn(None))
        Path(out).write_text(json.dumps({
            "killed": sentinel.exists(),
            "equal": all(torch.equal(v, clean.weights[k]) for k, v in tree.weights.items()),
            "metrics": [_metrics(r) for r in (tree, clean)],
            "nodes": [w["node_id"] for w in tree.summary["workers"]],
            "failures": tree.summary["worker_failures"]}))
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_ray_two_nodes_sums_on_workers_equal_the_drivers_and_survive_a_kill(tmp_path):
    from clusters import LOOPBACK_ENV

    temp = tempfile.mkdtemp(prefix="fr", dir="/tmp")  # short: Ray's socket paths
    env = {**os.environ, **LOOPBACK_ENV, "RAY_TMPDIR": temp,  # nothing in /tmp/ray
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "out.json"
    try:
        proc = subprocess.run([sys.executable, __file__, str(out)], env=env, timeout=300,
                              capture_output=True, text=True)
    finally:
        import shutil

        shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["killed"] and r["failures"] == 1  # a worker died mid-round and was re-run
    assert r["equal"]
    tree, clean = r["metrics"]
    for m in tree:
        m.pop("worker_failures")
    assert tree == [{k: v for k, v in m.items() if k != "worker_failures"} for m in clean]
    nodes = r["nodes"]  # node-major: each node's workers in consecutive slots, 2 and 2
    assert len(set(nodes)) == 2 and nodes[0] == nodes[1] and nodes[2] == nodes[3]


if __name__ == "__main__":
    _on_two_nodes(sys.argv[1])
