"""The driver's sparse index of client state versions, against a dense array, and its
checkpoint formats (sparse now, one int32 per client before). No Ray, no training."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save as save_safetensors

from fedray.errors import FedrayError
from fedray.state.checkpoint import Checkpoint, decode, encode
from fedray.state.client_state import ClientVersions


def test_matches_a_dense_array_through_rounds_and_merges(monkeypatch):
    monkeypatch.setattr(ClientVersions, "MERGE_AT", 16)  # many merges in a short run
    population = 5_000
    g = np.random.default_rng(0)
    index, dense = ClientVersions(population), np.zeros(population, np.int32)
    packs = np.full(population, -1, np.int64)  # where each client's state is (-1: own file)
    for r in range(1, 200):
        stored = g.permutation(g.choice(population, size=int(g.integers(0, 60)),
                                        replace=False))
        into = g.integers(-1, 4, size=len(stored))  # some own files, the rest in 4 packs
        ids, old, old_packs = index.record(stored, r, into)
        assert ids.tolist() == sorted(stored.tolist())  # sorted, whatever the order given
        assert np.array_equal(old, dense[ids])  # the versions they had: 0 for new clients
        assert np.array_equal(old_packs, packs[ids])  # and their packs: -1 for new ones
        dense[stored], packs[stored] = r, into
        probe = g.integers(0, population, size=100)
        assert np.array_equal(index.get(probe), dense[probe])
        versions, where = index.locate(probe)
        assert np.array_equal(versions, dense[probe]) and np.array_equal(where, packs[probe])
        assert len(index) == np.count_nonzero(dense)
    assert np.array_equal(index.dense(), dense)
    ids, vs = index.arrays()
    assert np.array_equal(ids, np.flatnonzero(dense)) and np.array_equal(vs, dense[ids])
    assert np.array_equal(index.packs(), packs[ids])
    held = ids[packs[ids] >= 0]  # each (version, pack) counts the clients it holds
    expect: dict = {}
    for cid in held.tolist():
        expect[(int(dense[cid]), int(packs[cid]))] = expect.get(
            (int(dense[cid]), int(packs[cid])), 0) + 1
    assert index.live_packs() == expect and sum(expect.values()) == len(held) > 0
    assert index == ClientVersions.from_arrays(population, ids, vs, packs[ids])
    assert index != ClientVersions.from_arrays(population, ids, vs)  # packs differ
    assert index[int(ids[0])] == dense[ids[0]]
    assert ClientVersions.from_dense(dense).packs().tolist() == [-1] * len(ids)
    assert index.record([7, 7, 7], 500)[0].tolist() == [7]  # a repeat counts once
    with pytest.raises(ValueError, match=r"in \[0, 5000\)"):
        index.record([population], 501)
    with pytest.raises(ValueError, match="version must be >= 1"):
        index.record([1], 0)


def _bytes(tensors: dict, meta: dict) -> bytes:
    return save_safetensors(tensors, metadata={"fedray_checkpoint": json.dumps(meta)})


def test_checkpoints_store_it_sparse_and_read_the_dense_format():
    index = ClientVersions(100_000_000)
    index.record([5, 99_999_999, 42], 3, [4097, -1, 4096])
    index.record([42], 4, [0])
    ckpt = Checkpoint(round=4, weights=torch.ones(3), server_state={},
                      client_versions=index, metrics_lines=[])
    data = encode(ckpt)
    assert len(data) < 2_000  # 3 clients' entries, not 10^8 of them
    read = decode(data, "here")
    back = read.client_versions
    assert back == index and back.population == 100_000_000 and read.server_state == {}
    assert back.get([5, 42, 99_999_999, 6]).tolist() == [3, 4, 3, 0]
    assert back.locate([5, 42, 99_999_999, 6])[1].tolist() == [4097, 0, -1, -1]
    # a checkpoint from before packs (ids and versions only): every client's own file
    tensors = {"weights": torch.ones(3), "client_state.ids": torch.tensor([5, 42]),
               "client_state.versions": torch.tensor([3, 4], dtype=torch.int32)}
    before = decode(_bytes(tensors, {"round": 4, "metrics": [], "clients": 100}), "before")
    assert before.client_versions.locate([5, 42])[1].tolist() == [-1, -1]
    # a checkpoint of an earlier fedray: one int32 per client under client_state.version
    dense = np.array([0, 2, 0, 7, 1], np.int32)
    old = _bytes({"weights": torch.ones(3), "client_state.version": torch.from_numpy(dense)},
                 {"round": 7, "metrics": []})
    read = decode(old, "old")
    assert read.client_versions.population == 5 and read.server_state == {}
    assert np.array_equal(read.client_versions.dense(), dense)
    # no client state at all: None, as before
    assert decode(encode(Checkpoint(4, torch.ones(3), {}, None, [])), "x").client_versions is None
    ids, vs = torch.tensor([3, 1]), torch.tensor([1, 1], dtype=torch.int32)  # not sorted
    for tensors, meta in (({"client_state.ids": ids, "client_state.versions": vs}, {}),
                          ({"client_state.ids": ids.sort().values}, {"clients": 9}),
                          ({"client_state.ids": ids.sort().values,
                            "client_state.versions": vs}, {"clients": 2})):
        bad = _bytes({"weights": torch.ones(3), **tensors},
                     {"round": 1, "metrics": [], **meta})
        with pytest.raises(FedrayError, match="checkpoint bad is corrupt"):
            decode(bad, "bad")
