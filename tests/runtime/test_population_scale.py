"""A round's driver cost does not depend on the population: 10^8 synthetic clients set up
and train a round without one population-sized array; client state versions are kept
sparse, and resume exactly (also from a checkpoint that stored them one per client).
Inline backend: no Ray."""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
import torch
from conftest import tiny_job
from safetensors.torch import save as save_safetensors

import fedray
from fedray.data.sources.synthetic import glyphs
from fedray.state.checkpoint import CHECKPOINT_FILE, read_checkpoint
from fedray.state.client_state import ClientStateStore
from fedray.state.run_dir import load_weights

HUGE = 100_000_000


@pytest.mark.parametrize("extra", [
    # stateful clients (the versions index), over-selection (sizes of the drawn ids),
    # federated evaluation (its clients' test sizes)
    {"algorithm": {"name": "scaffold"}, "sampling": {"clients_per_round": 10,
                                                     "over_selection": 0.5},
     "eval": {"federated_clients": 5}},
    {"clock": {"enabled": True}},  # the simulated clock: update durations from sizes
], ids=["scaffold-overselection-fedeval", "clock"])
def test_a_hundred_million_clients_need_no_population_sized_array(tmp_path, extra):
    job = tiny_job(tmp_path, rounds=1, runtime={"backend": "inline"})
    job["data"]["synthetic"]["num_clients"] = HUGE
    job["sampling"]["clients_per_round"] = 10
    for key, value in extra.items():
        job[key] = {**job.get(key, {}), **value}
    glyphs(0)  # the generator's glyph tables (about 100 MB while built, for any population)
    tracemalloc.start()
    try:
        res = fedray.run(job)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert res.metrics[0]["clients"] == 10 and res.summary["population"] == HUGE
    # one int32 per client would be 400 MB, one int64 (the sizes) 800 MB; the run itself
    # peaks at about 30 MB (numpy and Python objects: tracemalloc does not see torch's)
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MB"


def _resume_job(tmp_path, name: str, rounds: int, pack_mb: float = 8.0) -> dict:
    # 30 clients, 8 a round: most take part again, so old versions are superseded, some
    # while the last checkpoint still needs them
    job = tiny_job(tmp_path, rounds=rounds, algorithm={"name": "scaffold"},
                   checkpoint={"every": 2}, runtime={"backend": "inline", "num_workers": 2,
                                                     "worker": {"state_pack_mb": pack_mb}})
    job["data"]["synthetic"].update(num_clients=30, min_examples=4, max_examples=8)
    job["output"]["dir"] = str(tmp_path / name)
    return job


def _dense_checkpoint(run_dir) -> None:
    """Rewrite the run's checkpoint as fedray before the sparse index wrote it: one int32
    per client under client_state.version, no population in the metadata."""
    ckpt = read_checkpoint(str(run_dir))
    tensors = {"weights": ckpt.weights, **ckpt.server_state,
               "client_state.version": torch.from_numpy(ckpt.client_versions.dense())}
    meta = {"round": ckpt.round, "metrics": ckpt.metrics_lines}
    (run_dir / CHECKPOINT_FILE).write_bytes(save_safetensors(
        tensors, metadata={"fedray_checkpoint": json.dumps(meta)}))


def _current(run_dir) -> dict:
    """Each client's current state, as the run's checkpoint locates it."""
    store = ClientStateStore(str(run_dir / "client_state"))
    return store.current(read_checkpoint(str(run_dir)).client_versions)


def test_sparse_versions_resume_exactly_and_so_does_a_dense_checkpoint(tmp_path):
    """A run resumed from its checkpoint, and one of fedray before the sparse index and
    before packs (one file per client: state_pack_mb 0; its checkpoint rewritten dense),
    resumed with packs, end as the uninterrupted run does: the same weights, versions and
    client states. The store keeps exactly the packs that hold a current state."""
    whole = fedray.run(_resume_job(tmp_path, "whole", 5))
    fedray.run(_resume_job(tmp_path, "part", 3))  # checkpoints after rounds 2 and 3
    fedray.run(_resume_job(tmp_path, "dense", 3, pack_mb=0))  # files, as before packs
    assert ClientStateStore(str(tmp_path / "dense" / "client_state")).packs() == []
    _dense_checkpoint(tmp_path / "dense")
    expect = load_weights(str(tmp_path / "whole"))
    index = read_checkpoint(str(tmp_path / "whole")).client_versions
    store = ClientStateStore(str(tmp_path / "whole" / "client_state"))
    assert 8 < len(index) <= 30 and all(index[c] in vs for c, vs in store.versions().items())
    assert store.packs() == sorted(index.live_packs())
    states = _current(tmp_path / "whole")
    for name in ("part", "dense"):
        more = fedray.run(resume=str(tmp_path / name), overrides=["rounds=5"],
                          allow_changes=["rounds"])
        assert more.summary["resumed_from_round"] == 3
        got = load_weights(str(tmp_path / name))
        assert all(torch.equal(expect[k], got[k]) for k in expect), name
        back = read_checkpoint(str(tmp_path / name)).client_versions
        assert all(np.array_equal(a, b) for a, b in zip(back.arrays(), index.arrays(),
                                                        strict=True)), name
        mine = _current(tmp_path / name)
        assert mine.keys() == states.keys() and all(
            mine[c][0] == states[c][0] and mine[c][1].keys() == states[c][1].keys()
            and all(torch.equal(mine[c][1][k], states[c][1][k]) for k in states[c][1])
            for c in states), name
        left = ClientStateStore(str(tmp_path / name / "client_state"))
        assert left.packs() == sorted(back.live_packs()), name
        if name == "part":  # all in packs, as the uninterrupted run's
            assert back == index and left.versions() == store.versions()
        assert np.array_equal(whole.metrics[-1]["train_loss"], more.metrics[-1]["train_loss"])
