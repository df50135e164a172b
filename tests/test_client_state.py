"""Per-client state store: layout, atomic writes, cache bound and validity, pickling, memory."""

from __future__ import annotations

import gc
import os
import pickle
import random
import re
import shutil
import uuid
from pathlib import Path

import fsspec
import pytest
import torch

from fedray.client_state import ClientStateStore
from fedray.errors import FedrayError


@pytest.fixture
def mem_url():
    url = f"memory://client-state-{uuid.uuid4().hex}"
    yield url
    fs, path = fsspec.core.url_to_fs(url)
    if fs.exists(path):
        fs.rm(path, recursive=True)


@pytest.fixture(params=["local", "memory"])
def url(request, tmp_path, mem_url):
    return str(tmp_path / "client_state") if request.param == "local" else mem_url


def _state(seed: int, n: int = 10) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"conv.weight": torch.randn(n, 3, generator=g),
            "fc.bias": torch.randn(n, generator=g, dtype=torch.float64),
            "steps": torch.tensor([seed], dtype=torch.int64)}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].device.type == "cpu" and a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_round_trip_layout_and_unseen_clients(tmp_path):
    root = tmp_path / "client_state"
    store = ClientStateStore(str(root))
    assert store.get(7) is None and not store.has(7) and store.clients() == []
    assert not root.exists()  # created lazily, on the first write

    written = {7: _state(7), 999: _state(999), 1000: _state(1000), 12345: _state(12345)}
    for cid, state in written.items():
        store.put(cid, state)
    for cid, state in written.items():
        _assert_same(store.get(cid), state)
        assert store.has(cid)
    assert store.get(8) is None and not store.has(8)
    assert store.clients() == sorted(written)
    # files exist exactly for the clients that were put, sharded 1,000 per directory
    assert _files(root) == sorted(["000000/7.safetensors", "000000/999.safetensors",
                                   "000001/1000.safetensors", "000012/12345.safetensors"])
    assert store.file_url(12345).endswith("/client_state/000012/12345.safetensors")


def test_dtypes_layouts_and_ownership(url):
    store = ClientStateStore(url)
    x = torch.arange(12, dtype=torch.float64).reshape(3, 4).t()  # not contiguous
    state = {"x": x, "h": torch.ones(5, dtype=torch.float16), "b": torch.tensor([True, False])}
    store.put(3, state)
    state["h"].add_(1)  # mutating the caller's tensors after put does not touch the store
    for fresh in (store, ClientStateStore(url)):  # from the cache, then from the file
        got = fresh.get(3)
        assert got["x"].is_contiguous() and torch.equal(got["x"], x)
        assert got["h"].dtype == torch.float16 and torch.equal(got["h"], torch.ones(5).half())
        assert torch.equal(got["b"], torch.tensor([True, False]))
        got["x"].zero_()  # nor does mutating what get returned
        assert torch.equal(fresh.get(3)["x"], x)


def test_negative_client_id_and_bad_arguments(tmp_path):
    store = ClientStateStore(str(tmp_path / "s"))
    for call in (store.get, store.has, lambda c: store.put(c, _state(0))):
        with pytest.raises(ValueError, match="client_id"):
            call(-1)
    with pytest.raises(TypeError):
        store.put(1, {"a": [1.0, 2.0]})
    with pytest.raises(ValueError, match="cache_mb"):
        ClientStateStore(str(tmp_path / "s"), cache_mb=-1)


def test_relative_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = ClientStateStore("runs/x/client_state")
    assert os.path.isabs(store.url)  # a Ray worker with another cwd means the same place
    store.put(1, _state(1))
    assert (tmp_path / "runs/x/client_state/000000/1.safetensors").is_file()


def test_second_store_sees_other_workers_writes(url):
    """Worker A trains client 5 in round r, worker B in round r+1, A again in r+2: B's cached
    copy from r+1 must not be served after A's rewrite (same size, same instant)."""
    a, b = ClientStateStore(url), ClientStateStore(url)
    v1, v2 = _state(1), _state(2)
    a.put(5, v1)
    _assert_same(b.get(5), v1)
    _assert_same(b.get(5), v1)
    assert (b.hits, b.misses) == (1, 1)
    a.put(5, v2)  # no sleep: the stamp must change even within one mtime tick
    _assert_same(b.get(5), v2)
    assert (b.hits, b.misses) == (1, 2)
    _assert_same(b.get(5), v2)
    assert (b.hits, b.misses) == (2, 2)
    b.put(5, v1)  # and the other way round
    _assert_same(a.get(5), v1)
    assert a.clients() == b.clients() == [5]


def test_lru_bound_hits_and_misses(url):
    entry = 1000 * 4  # one float32 tensor of 1,000 values
    store = ClientStateStore(url, cache_mb=2.5 * entry / 2**20)  # room for two entries
    for cid in (0, 1, 2):
        store.put(cid, {"w": torch.full((1000,), float(cid))})
    assert store.cache_bytes == 2 * entry  # 0 was evicted
    for cid, hit in ((2, True), (1, True), (0, False), (2, False), (0, True), (1, False)):
        before = store.hits
        assert store.get(cid)["w"][0].item() == cid
        assert store.hits == before + hit, cid
    assert (store.hits, store.misses) == (3, 3)

    rng = random.Random(0)
    gets = 0
    for _ in range(300):
        cid = rng.randrange(6)
        if rng.random() < 0.3:
            store.put(cid, {"w": torch.full((1000,), float(cid))})
        else:
            gets += 1
            got = store.get(cid)
            assert got is None or got["w"][0].item() == cid
        assert store.cache_bytes <= 2 * entry
    assert store.hits + store.misses == 6 + gets and 3 < store.hits < 3 + gets

    # an entry larger than the whole budget is written but never cached, and it replaces
    # any cached older value of that client
    store.put(1, {"w": torch.zeros(1000)})
    store.put(1, {"w": torch.zeros(3000)})
    assert store.cache_bytes <= 2 * entry
    hits = store.hits
    assert store.get(1)["w"].numel() == 3000 and store.get(1)["w"].numel() == 3000
    assert store.hits == hits


def test_cache_disabled(url):
    store = ClientStateStore(url, cache_mb=0)
    store.put(1, _state(1))
    for _ in range(3):
        _assert_same(store.get(1), _state(1))
    assert store.get(2) is None
    assert (store.hits, store.misses, store.cache_bytes) == (0, 4, 0)


def test_writes_are_atomic_and_leave_no_temporary_files(tmp_path, monkeypatch):
    root = tmp_path / "cs"
    store = ClientStateStore(str(root))
    for cid in range(0, 3000, 7):
        store.put(cid, _state(cid, n=3))
    store.put(14, _state(99, n=3))
    files = _files(root)
    assert all(re.fullmatch(r"\d{6}/\d+\.safetensors", f) for f in files), files
    assert len(files) == len(range(0, 3000, 7))

    # a write that fails before the rename leaves the previous state intact and no debris
    def broken_mv(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(store._fs, "mv", broken_mv)
    with pytest.raises(OSError, match="disk full"):
        store.put(14, _state(100, n=3))
    monkeypatch.undo()
    assert _files(root) == files
    _assert_same(ClientStateStore(str(root)).get(14), _state(99, n=3))
    _assert_same(store.get(14), _state(99, n=3))


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b"garbage",
                                    lambda b: b""], ids=["truncated", "garbage", "empty"])
def test_corrupt_file_raises_fedray_error_naming_it(url, damage):
    store = ClientStateStore(url)
    store.put(4321, _state(1))
    store.get(4321)  # cached: the damaged file must still be noticed
    fs, _ = fsspec.core.url_to_fs(url)
    path = store.file_url(4321)
    fs.pipe_file(path, damage(fs.cat_file(path)))
    for reader in (store, ClientStateStore(url)):
        with pytest.raises(FedrayError, match=r"000004/4321\.safetensors.*corrupt"):
            reader.get(4321)


def test_memory_filesystem(mem_url):
    store = ClientStateStore(mem_url, cache_mb=1)
    store.put(12345, _state(5))
    fs, path = fsspec.core.url_to_fs(mem_url)
    assert fs.isfile(f"{path}/000012/12345.safetensors")
    assert [p for p in fs.find(path) if ".tmp" in p] == []
    _assert_same(ClientStateStore(mem_url).get(12345), _state(5))
    assert store.clients() == [12345]


def test_pickle_drops_cache_and_filesystem(url):
    store = ClientStateStore(url, cache_mb=4)
    for cid in range(5):
        store.put(cid, _state(cid, n=1000))
    store.get(1)
    assert store.cache_bytes > 0 and store.hits == 1
    blob = pickle.dumps(store)
    assert len(blob) < 1000  # no tensors, no filesystem handle
    copy = pickle.loads(blob)
    assert copy.url == store.url and copy.cache_mb == 4
    assert (copy.cache_bytes, copy.hits, copy.misses) == (0, 0, 0)
    for cid in range(5):
        _assert_same(copy.get(cid), _state(cid, n=1000))
    assert copy.get(5) is None and copy.clients() == list(range(5))


def _rss() -> int:
    try:
        import psutil
    except ImportError:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:
            pytest.skip("neither psutil nor /proc/self/statm to measure memory")
    return psutil.Process().memory_info().rss


def test_memory_does_not_grow_with_the_population(tmp_path):
    clients, floats = 2000, 50_000  # 200 KB each, 400 MB in all
    root = tmp_path / "big"
    store = ClientStateStore(str(root), cache_mb=8)
    budget = 8 * 2**20
    gc.collect()
    base = peak = _rss()
    try:
        for cid in range(clients):
            store.put(cid, {"c": torch.full((floats,), float(cid))})
            assert store.cache_bytes <= budget
            if cid % 100 == 0:
                peak = max(peak, _rss())
        rng = random.Random(0)
        for cid in rng.sample(range(clients), 200):
            got = store.get(cid)["c"]
            assert got.shape == (floats,) and got[0].item() == got[-1].item() == cid
            assert store.cache_bytes <= budget
        gc.collect()
        peak = max(peak, _rss())
        written = clients * floats * 4
        assert written >= 400e6
        assert peak - base < 100e6, f"RSS grew {(peak - base) / 1e6:.0f} MB"
        assert len(store.clients()) == clients
    finally:
        shutil.rmtree(root, ignore_errors=True)
