"""Per-client state store: versioned layout, atomic writes, cache bound, delete and sweep,
pickling, memory."""

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

from fedray.errors import FedrayError
from fedray.state.client_state import PACK_SEQ, ClientStateStore


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


def test_round_trip_layout_and_version_zero(tmp_path):
    root = tmp_path / "client_state"
    store = ClientStateStore(str(root))
    assert store.get(7, 0) is None and store.clients() == []
    assert (store.hits, store.misses) == (0, 0)  # version 0: no state, no I/O
    assert not root.exists()  # created lazily, on the first write

    written = {7: _state(7), 999: _state(999), 1000: _state(1000), 12345: _state(12345)}
    for cid, state in written.items():
        store.put(cid, 3, state)
    for cid, state in written.items():
        _assert_same(store.get(cid, 3), state)
    assert store.clients() == sorted(written)
    # one file per client and version, sharded 1,000 clients per directory
    assert _files(root) == sorted(["000000/7.r3.safetensors", "000000/999.r3.safetensors",
                                   "000001/1000.r3.safetensors", "000012/12345.r3.safetensors"])
    assert store.file_url(12345, 3).endswith("/client_state/000012/12345.r3.safetensors")


def test_versions_coexist_and_a_missing_one_is_an_error(url):
    store = ClientStateStore(url)
    store.put(5, 2, _state(2))
    store.put(5, 4, _state(4))
    for reader in (store, ClientStateStore(url)):
        _assert_same(reader.get(5, 2), _state(2))
        _assert_same(reader.get(5, 4), _state(4))
        with pytest.raises(FedrayError, match=r"000000/5\.r3\.safetensors is missing"):
            reader.get(5, 3)
    assert store.versions() == {5: [2, 4]}


def test_dtypes_layouts_and_ownership(url):
    store = ClientStateStore(url)
    x = torch.arange(12, dtype=torch.float64).reshape(3, 4).t()  # not contiguous
    state = {"x": x, "h": torch.ones(5, dtype=torch.float16), "b": torch.tensor([True, False])}
    store.put(3, 1, state)
    state["h"].add_(1)  # mutating the caller's tensors after put does not touch the store
    for fresh in (store, ClientStateStore(url)):  # from the cache, then from the file
        got = fresh.get(3, 1)
        assert got["x"].is_contiguous() and torch.equal(got["x"], x)
        assert got["h"].dtype == torch.float16 and torch.equal(got["h"], torch.ones(5).half())
        assert torch.equal(got["b"], torch.tensor([True, False]))
        got["x"].zero_()  # nor does mutating what get returned
        assert torch.equal(fresh.get(3, 1)["x"], x)


def test_bad_arguments(tmp_path):
    store = ClientStateStore(str(tmp_path / "s"))
    with pytest.raises(ValueError, match="client_id"):
        store.get(-1, 1)
    with pytest.raises(ValueError, match="client_id"):
        store.put(-1, 1, _state(0))
    with pytest.raises(ValueError, match="version"):
        store.get(1, -1)
    with pytest.raises(ValueError, match="version"):
        store.put(1, 0, _state(0))  # version 0 means "no state": it cannot be written
    with pytest.raises(TypeError):
        store.put(1, 1, {"a": [1.0, 2.0]})
    with pytest.raises(ValueError, match="cache_mb"):
        ClientStateStore(str(tmp_path / "s"), cache_mb=-1)


def test_relative_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = ClientStateStore("runs/x/client_state")
    assert os.path.isabs(store.url)  # a Ray worker with another cwd means the same place
    store.put(1, 1, _state(1))
    assert (tmp_path / "runs/x/client_state/000000/1.r1.safetensors").is_file()


def test_another_process_reads_what_one_wrote(url):
    """Worker A trains client 5 in round 1, worker B in round 2: B reads A's version."""
    a, b = ClientStateStore(url), ClientStateStore(url)
    a.put(5, 1, _state(1))
    _assert_same(b.get(5, 1), _state(1))
    _assert_same(b.get(5, 1), _state(1))
    assert (b.hits, b.misses) == (1, 1)
    b.put(5, 2, _state(2))
    _assert_same(a.get(5, 2), _state(2))
    _assert_same(a.get(5, 1), _state(1))  # the old version, from A's cache
    assert (a.hits, a.misses) == (1, 1)
    assert a.clients() == b.clients() == [5]


def test_rerun_rewrites_the_same_version(url):
    """A worker that died after writing is re-run: it reads the old version again and writes
    the same new one."""
    store = ClientStateStore(url)
    store.put(9, 1, _state(1))
    store.put(9, 2, _state(2))
    _assert_same(ClientStateStore(url).get(9, 1), _state(1))
    store.put(9, 2, _state(2))
    assert store.versions() == {9: [1, 2]}
    _assert_same(ClientStateStore(url).get(9, 2), _state(2))


def test_lru_bound_hits_and_misses(url):
    entry = 1000 * 4  # one float32 tensor of 1,000 values
    store = ClientStateStore(url, cache_mb=2.5 * entry / 2**20)  # room for two entries
    for cid in (0, 1, 2):
        store.put(cid, 1, {"w": torch.full((1000,), float(cid))})
    assert store.cache_bytes == 2 * entry  # 0 was evicted
    for cid, hit in ((2, True), (1, True), (0, False), (2, False), (0, True), (1, False)):
        before = store.hits
        assert store.get(cid, 1)["w"][0].item() == cid
        assert store.hits == before + hit, cid
    assert (store.hits, store.misses) == (3, 3)

    rng = random.Random(0)
    gets = 0
    for _ in range(300):
        cid, v = rng.randrange(6), rng.randrange(1, 3)
        if rng.random() < 0.3 or not (cid < 3 and v == 1):
            store.put(cid, v, {"w": torch.full((1000,), float(cid * 10 + v))})
        else:
            gets += 1
            got = store.get(cid, v)
            assert got["w"][0].item() in (cid, cid * 10 + v)
        assert store.cache_bytes <= 2 * entry
    assert store.hits + store.misses == 6 + gets and store.hits > 3

    # an entry larger than the whole budget is written but never cached
    store.put(1, 5, {"w": torch.zeros(3000)})
    assert store.cache_bytes <= 2 * entry
    hits = store.hits
    assert store.get(1, 5)["w"].numel() == 3000 and store.get(1, 5)["w"].numel() == 3000
    assert store.hits == hits


def test_cache_disabled(url):
    store = ClientStateStore(url, cache_mb=0)
    store.put(1, 1, _state(1))
    for _ in range(3):
        _assert_same(store.get(1, 1), _state(1))
    assert store.get(2, 0) is None
    assert (store.hits, store.misses, store.cache_bytes) == (0, 3, 0)


def test_delete_and_versions(url):
    store = ClientStateStore(url)
    for cid, v in ((1, 1), (1, 3), (2, 2), (1500, 4)):
        store.put(cid, v, _state(cid))
    fs, path = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{path}/000000/notes.txt", b"x")  # foreign files are ignored
    fs.pipe_file(f"{path}/000000/1600.r1.safetensors", b"x")  # ... and ones in a wrong shard
    assert store.versions() == {1: [1, 3], 2: [2], 1500: [4]}
    assert store.delete([(1, 1), (2, 2), (2, 7)]) == 2  # a missing version is skipped
    assert store.versions() == {1: [3], 1500: [4]} and store.clients() == [1, 1500]
    with pytest.raises(FedrayError, match="missing"):
        store.get(1, 1)  # gone from the cache too
    _assert_same(store.get(1, 3), _state(1))


def test_sweep_keeps_exactly_the_current_versions(url):
    store = ClientStateStore(url)
    for cid, v in ((1, 1), (1, 3), (1, 6), (2, 2), (3, 5)):
        store.put(cid, v, _state(cid))
    fs, path = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{path}/000000/.1.r7.safetensors.abc.tmp", b"half")  # a killed writer's
    current = {1: 3, 2: 2}  # client 3's only version is after the checkpoint
    assert store.sweep(lambda c: current.get(c, 0)) == 4
    assert store.versions() == {1: [3], 2: [2]}
    assert [p for p in fs.find(path) if p.endswith(".tmp")] == []


def test_writes_are_atomic_and_leave_no_temporary_files(tmp_path, monkeypatch):
    root = tmp_path / "cs"
    store = ClientStateStore(str(root))
    for cid in range(0, 3000, 7):
        store.put(cid, 1, _state(cid, n=3))
    files = _files(root)
    assert all(re.fullmatch(r"\d{6}/\d+\.r1\.safetensors", f) for f in files), files
    assert len(files) == len(range(0, 3000, 7))

    # a write that fails before the rename leaves nothing behind (on a local disk the store
    # writes with os calls: ClientStateStore._write)
    def broken_mv(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("fedray.state.client_state.os.replace", broken_mv)
    with pytest.raises(OSError, match="disk full"):
        store.put(14, 2, _state(100, n=3))
    monkeypatch.undo()
    assert _files(root) == files
    with pytest.raises(FedrayError, match="missing"):
        store.get(14, 2)
    _assert_same(ClientStateStore(str(root)).get(14, 1), _state(14, n=3))


def test_a_shard_folder_removed_under_a_writer_is_made_again(tmp_path):
    """The store remembers the shard folders it made (no makedirs per write); one removed
    since (a user's cleanup) is made again rather than failing the round."""
    import shutil

    store = ClientStateStore(str(tmp_path / "cs"))
    store.put(3, 1, _state(3))
    shutil.rmtree(tmp_path / "cs" / "000000")
    store.put(4, 1, _state(4))
    _assert_same(ClientStateStore(str(tmp_path / "cs")).get(4, 1), _state(4))


@pytest.mark.parametrize("damage", [lambda b: b[: len(b) // 2], lambda b: b"garbage",
                                    lambda b: b""], ids=["truncated", "garbage", "empty"])
def test_corrupt_file_raises_fedray_error_naming_it(url, damage):
    store = ClientStateStore(url, cache_mb=0)
    store.put(4321, 2, _state(1))
    fs, _ = fsspec.core.url_to_fs(url)
    path = store.file_url(4321, 2)
    fs.pipe_file(path, damage(fs.cat_file(path)))
    for reader in (store, ClientStateStore(url)):
        with pytest.raises(FedrayError, match=r"000004/4321\.r2\.safetensors.*corrupt"):
            reader.get(4321, 2)


def test_memory_filesystem(mem_url):
    store = ClientStateStore(mem_url, cache_mb=1)
    store.put(12345, 1, _state(5))
    fs, path = fsspec.core.url_to_fs(mem_url)
    assert fs.isfile(f"{path}/000012/12345.r1.safetensors")
    assert [p for p in fs.find(path) if ".tmp" in p] == []
    _assert_same(ClientStateStore(mem_url).get(12345, 1), _state(5))
    assert store.clients() == [12345]


def test_pickle_drops_cache_and_filesystem(url):
    store = ClientStateStore(url, cache_mb=4)
    for cid in range(5):
        store.put(cid, 1, _state(cid, n=1000))
    store.get(1, 1)
    assert store.cache_bytes > 0 and store.hits == 1
    blob = pickle.dumps(store)
    assert len(blob) < 1000  # no tensors, no filesystem handle
    copy = pickle.loads(blob)
    assert copy.url == store.url and copy.cache_mb == 4
    assert (copy.cache_bytes, copy.hits, copy.misses) == (0, 0, 0)
    for cid in range(5):
        _assert_same(copy.get(cid, 1), _state(cid, n=1000))
    assert copy.clients() == list(range(5))


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
            store.put(cid, 1, {"c": torch.full((floats,), float(cid))})
            assert store.cache_bytes <= budget
            if cid % 100 == 0:
                peak = max(peak, _rss())
        rng = random.Random(0)
        for cid in rng.sample(range(clients), 200):
            got = store.get(cid, 1)["c"]
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


def test_put_async_serves_at_once_writes_by_flush_and_raises_a_failed_write(tmp_path,
                                                                            monkeypatch):
    """put_async copies the tensors at once (the caller reuses its buffer), the cache serves
    them before the file exists, flush waits for the files, and a write that failed is
    raised by flush, with no temporary file left and every other write finished."""
    root = tmp_path / "cs"
    store = ClientStateStore(str(root))
    buffer = torch.arange(4.0)
    store.put_async(1, 1, {"c": buffer})
    buffer.fill_(-1.0)  # reused at once, as a client part's buffer is
    _assert_same(store.get(1, 1), {"c": torch.arange(4.0)})
    store.flush()
    _assert_same(ClientStateStore(str(root), cache_mb=0).get(1, 1), {"c": torch.arange(4.0)})

    real = os.replace

    def failing(src, dst):
        if dst.endswith("/2.r1.safetensors"):
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr("fedray.state.client_state.os.replace", failing)
    store.put_async(2, 1, _state(2))
    store.put_async(3, 1, _state(3))
    with pytest.raises(OSError, match="disk full"):
        store.flush()
    monkeypatch.undo()
    assert sorted(_files(root)) == ["000000/1.r1.safetensors", "000000/3.r1.safetensors"]
    with pytest.raises(FedrayError, match="missing"):  # not served from the cache either
        store.get(2, 1)
    store.flush()  # nothing pending any more


def _odd_state(seed: int) -> dict[str, torch.Tensor]:
    """Every dtype a pack holds, a 0-d tensor, an empty one and a non-contiguous one."""
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3, 4, generator=g).T, "b16": torch.randn(5, generator=g).bfloat16(),
            "h": torch.randn(2, generator=g).half(), "mask": torch.tensor([True, False]),
            "t": torch.tensor(seed, dtype=torch.int64), "none": torch.zeros(0, 7),
            "i8": torch.tensor([-3, 4], dtype=torch.int8),
            "d": torch.randn(3, generator=g).double()}


def test_packs_hold_a_round_of_clients_and_read_back_each(url):
    """Between begin_packs and flush, put_async stages clients into one pack per task:
    flush names each client's pack, a process without the cache reads every client back
    bit for bit from its byte range, the file is an ordinary safetensors file (tensor
    "{client}/{key}"), and a re-run of the task writes the same bytes."""
    store = ClientStateStore(url)
    store.begin_packs(3, task=2)
    for cid in (7, 1500, 2):
        store.put_async(cid, 3, _odd_state(cid))
    packs = store.flush()
    assert packs == [2 * PACK_SEQ] * 3 and store.packs() == [(3, 2 * PACK_SEQ)]
    fresh = ClientStateStore(url, cache_mb=0)
    for cid in (7, 1500, 2):
        _assert_same(fresh.get(cid, 3, packs[0]), _odd_state(cid))
    assert fresh.versions() == {2: [3], 7: [3], 1500: [3]}
    fs, root = fsspec.core.url_to_fs(url)
    path = f"{root.rstrip('/')}/packs/r3/p{2 * PACK_SEQ}.safetensors"
    data = fs.cat_file(path)
    from safetensors.torch import load

    whole = load(data)
    assert sorted(whole) == sorted(f"{c}/{k}" for c in (7, 1500, 2) for k in _odd_state(c))
    _assert_same({k.partition("/")[2]: t for k, t in whole.items() if k.startswith("7/")},
                 _odd_state(7))
    again = ClientStateStore(url)  # a re-run of the task after its worker died
    again.begin_packs(3, task=2)
    for cid in (7, 1500, 2):
        again.put_async(cid, 3, _odd_state(cid))
    assert again.flush() == packs and fs.cat_file(path) == data
    # put_async outside begin_packs writes a client's own file, as before
    store.put_async(9, 4, _state(9))
    assert store.flush() == [-1]
    _assert_same(fresh.get(9, 4), _state(9))


def test_packs_split_at_pack_mb_and_go_when_deleted_or_swept(tmp_path):
    """A task's clients fill packs of pack_mb each (k-th pack: task * PACK_SEQ + k);
    delete_packs removes packs and an emptied version folder; sweep keeps exactly the packs
    named, and every pack when given none."""
    root = tmp_path / "cs"
    store = ClientStateStore(str(root))
    store.begin_packs(1, task=0, pack_mb=2.5 * 10 * 3 * 4 / 2**20)
    for cid in range(6):
        store.put_async(cid, 1, {"c": torch.full((10, 3), float(cid))})
    packs = store.flush()
    assert packs == [0, 0, 0, 1, 1, 1]  # sealed at the third client's 2.5 x its bytes
    store.begin_packs(2, task=1)
    store.put_async(0, 2, {"c": torch.ones(10, 3)})
    assert store.flush() == [PACK_SEQ]
    fresh = ClientStateStore(str(root), cache_mb=0)
    for cid in range(6):
        _assert_same(fresh.get(cid, 1, packs[cid]), {"c": torch.full((10, 3), float(cid))})
    assert store.packs() == [(1, 0), (1, 1), (2, PACK_SEQ)]
    assert store.sweep(lambda cid: 0) == 0  # no keep_packs: every pack stays
    assert store.sweep(lambda cid: 0, keep_packs=[(1, 1)]) == 2
    assert store.packs() == [(1, 1)] and not (root / "packs" / "r2").exists()
    assert store.delete_packs([(1, 1), (1, 0)]) == 1 and store.packs() == []
    assert not (root / "packs" / "r1").exists()


def test_pack_errors_name_the_pack(tmp_path):
    """A missing pack, a client a pack does not hold and a damaged pack each raise a
    FedrayError naming the pack; a dtype a pack cannot hold is refused when it is put."""
    root = tmp_path / "cs"
    store = ClientStateStore(str(root))
    store.begin_packs(1, task=0)
    store.put_async(4, 1, _state(4))
    store.flush()
    fresh = ClientStateStore(str(root), cache_mb=0)
    with pytest.raises(FedrayError, match=r"packs/r1/p7\.safetensors is missing"):
        fresh.get(4, 1, 7)
    with pytest.raises(FedrayError, match="holds no state of client 5"):
        fresh.get(5, 1, 0)
    path = root / "packs" / "r1" / "p0.safetensors"
    path.write_bytes(path.read_bytes()[:-3])  # cut short
    with pytest.raises(FedrayError, match=r"p0\.safetensors is corrupt"):
        ClientStateStore(str(root), cache_mb=0).get(4, 1, 0)
    path.write_bytes(b"\xff" * 16)
    with pytest.raises(FedrayError, match=r"p0\.safetensors is corrupt"):
        ClientStateStore(str(root), cache_mb=0).get(4, 1, 0)
    with pytest.raises(ValueError, match="pack_mb must be a finite number > 0"):
        store.begin_packs(2, task=0, pack_mb=0)
    store.begin_packs(2, task=0)
    store.put_async(4, 2, {"z": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(TypeError, match="complex64"):
        store.flush()
    with pytest.raises(ValueError, match="version 3 put into packs of version 2"):
        store.begin_packs(2, task=0)
        store.put_async(4, 3, _state(4))
    store.flush()


def test_a_half_store_keeps_float32_state_as_float16_on_disk_and_in_its_cache(tmp_path):
    """runtime.worker.state_dtype=float16: a float32 tensor is written as float16 (half the
    bytes) and read back as float32, rounded once; a read served by the cache gives the
    same values as one from disk, so a run does not depend on what its cache held; other
    dtypes are kept as they are."""
    state = {"c": torch.randn(1000, generator=torch.Generator().manual_seed(0)),
             "n": torch.arange(3)}
    full = ClientStateStore(str(tmp_path / "f"), cache_mb=0)
    half = ClientStateStore(str(tmp_path / "h"), cache_mb=8, half=True)
    full.put(1, 1, state)
    half.put(1, 1, state)
    size = {s: sum(p.stat().st_size for p in (tmp_path / s).rglob("*.safetensors"))
            for s in ("f", "h")}
    assert size["f"] - size["h"] == 1000 * 2  # 2 bytes a value less, header aside
    cached = half.get(1, 1)
    disk = pickle.loads(pickle.dumps(half)).get(1, 1)  # a copy: empty cache, reads the file
    assert half.hits == 1 and cached["c"].dtype == torch.float32
    assert torch.equal(cached["c"], state["c"].half().float())
    _assert_same(cached, disk)
    assert torch.equal(disk["n"], state["n"]) and disk["n"].dtype == torch.int64
    half.begin_packs(2, 0)  # packs too
    half.put_async(1, 2, state)
    pack = half.flush()[0]
    assert torch.equal(pickle.loads(pickle.dumps(half)).get(1, 2, pack)["c"],
                       state["c"].half().float())
