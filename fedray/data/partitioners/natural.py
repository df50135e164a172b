"""natural: one client per natural id the source records (the writer, the user): its own
federation. ``natural_blocks`` does the same for a lazily generated population, streamed."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from fedray.data.examples import Split
from fedray.data.partition import Partition, Ragged
from fedray.data.partitioners.common import _assigned, _int, _seed, canonical_order
from fedray.errors import FedrayError

if TYPE_CHECKING:  # types only: a Dataset (fedray.data.dataset) partitions itself here
    from fedray.data.client_source import ClientSource
    from fedray.data.dataset import Dataset


def owner_names(dataset: Dataset, name: str = "natural") -> list[str]:
    """The data set's natural ids (``dataset.owners``) as text, checked: present on the
    train split and unique. ``name``: the partitioner that asks, for the error."""
    if dataset.owners is None or dataset.train.owner is None:
        raise FedrayError(f"partitioner {name!r} needs natural client ids (owners), but "
                          f"{dataset.name!r} has none")
    owners = [str(o) for o in dataset.owners]
    if len(set(owners)) != len(owners):
        raise FedrayError(f"partitioner {name!r}: the owners of {dataset.name!r} are not "
                          "unique")
    return owners


def owner_ids(split: Split, k: int, what: str, name: str = "natural") -> np.ndarray:
    """The split's owner of each example ([n] int64), each checked to be one of the k."""
    owner = np.asarray(split.owner, dtype=np.int64)
    if len(owner) and (owner.min() < 0 or owner.max() >= k):
        bad = int(owner[(owner < 0) | (owner >= k)][0])
        raise FedrayError(f"partitioner {name!r}: {what} owner id {bad} is outside the "
                          f"{k} owners of the data set")
    return owner


def _by_owner(split: Split, k: int, what: str) -> Ragged:
    owner = owner_ids(split, k, what)
    order = canonical_order(split)
    return _assigned(order, owner[order], k)


def natural(dataset: Dataset, seed: int, min_examples: int = 0) -> Partition:
    """One client per natural id (the writer, the user, ...): the source's own federation.

    Client k is ``dataset.owners[k]``; its train examples are those with ``train.owner == k``
    and its test examples those with ``test.owner == k`` (the source's own train/test split
    is kept; a client with no examples in a split gets an empty array there). If the data set
    has no test split, or its test split has no owners, ``Partition.test`` is None (the test
    split, if any, stays one central test set).

    Drop rule: clients with fewer than ``min_examples`` train examples are dropped, together
    with their test examples; ``info["dropped_clients"]`` counts them and
    ``info["dropped_train_examples"]`` / ``["dropped_test_examples"]`` count their examples.
    With the default 0 every owner is kept, even one with no examples at all. ``seed`` is
    unused: the split is deterministic.
    """
    _seed(seed)
    m = _int("min_examples", min_examples, 0)
    owners = owner_names(dataset)
    k = len(owners)
    train = _by_owner(dataset.train, k, "train")
    test = None
    if dataset.test is not None and dataset.test.owner is not None:
        test = _by_owner(dataset.test, k, "test")
    counts = train.counts
    keep = counts >= m
    info = {"min_examples": m, "dropped_clients": int((~keep).sum()),
            "dropped_train_examples": int(counts[~keep].sum()),
            "dropped_test_examples": int(test.counts[~keep].sum()) if test is not None else 0}
    if keep.all():
        return Partition(owners, train, test, info=info)
    return Partition([o for o, kept in zip(owners, keep.tolist(), strict=True) if kept],
                     train.select(keep), None if test is None else test.select(keep),
                     info=info)


class ClientBlock(NamedTuple):
    """Consecutive clients of a ``natural_blocks`` stream: their rows one client after the
    other, in canonical order within each client, as ``natural`` lists them."""

    names: list[str]
    train: Split
    train_counts: np.ndarray
    test: Split | None  # None: the source's clients hold no test data
    test_counts: np.ndarray | None
    dropped: tuple[int, int, int]  # clients below min_examples: clients, train, test examples


def _stack(parts: list[tuple[np.ndarray, np.ndarray]], empty: tuple[np.ndarray, np.ndarray]
           ) -> Split:
    if not parts:
        return Split(*empty)
    return Split(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _block(source: ClientSource, lo: int, hi: int, min_examples: int,
           transform: Callable[[np.ndarray], np.ndarray] | None) -> ClientBlock:
    """Clients lo..hi-1 of ``source``, read (generated) one by one."""
    with_test = bool(source.has_client_test)
    names: list[str] = []
    train: list[tuple[np.ndarray, np.ndarray]] = []
    test: list[tuple[np.ndarray, np.ndarray]] = []
    dropped = [0, 0, 0]
    like: tuple[np.ndarray, np.ndarray] | None = None  # the shapes of an empty block
    for cid in range(lo, hi):
        x, y = source.client(cid, "train")
        if like is None:
            like = (transform(x[:0]) if transform is not None else x[:0], y[:0])
        tx, ty = source.client(cid, "test") if with_test else (x[:0], y[:0])
        if len(y) < min_examples:
            dropped = [dropped[0] + 1, dropped[1] + len(y), dropped[2] + len(ty)]
            continue
        names.append(str(cid))
        for xs, ys, out in ((x, y, train), (tx, ty, test)):
            xs = transform(xs) if transform is not None else xs
            order = canonical_order(Split(xs, ys))
            out.append((xs[order], ys[order]))
    assert like is not None
    empty = like
    counts = np.asarray([len(p[1]) for p in train], dtype=np.int64)
    return ClientBlock(names, _stack(train, empty), counts,
                       _stack(test, empty) if with_test else None,
                       np.asarray([len(p[1]) for p in test], dtype=np.int64) if with_test
                       else None, (dropped[0], dropped[1], dropped[2]))


def _one_thread() -> int | None:
    """Generate on one thread: a client of a few examples is far too small to share, and
    torch's threads waiting on each other made it ten times slower on a busy machine; the
    pool of processes is the parallelism. Returns the previous number of threads."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    return before


def _pooled_block(source: ClientSource, lo: int, hi: int, min_examples: int,
                  transform: Callable[[np.ndarray], np.ndarray] | None) -> ClientBlock:
    """``_block`` in a generator process, on one thread (set here: torch is imported when
    the source arrives, after the process has started)."""
    _one_thread()
    return _block(source, lo, hi, min_examples, transform)


def _executor(processes: int) -> Executor:
    """Spawned, not forked: a fork of a process whose torch threads have run can hang."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(processes, mp_context=mp.get_context("spawn"))


def natural_blocks(source: ClientSource, min_examples: int = 0, *,
                   transform: Callable[[np.ndarray], np.ndarray] | None = None,
                   block_clients: int = 2048, processes: int = 1) -> Iterator[ClientBlock]:
    """``natural`` over a lazy client source (a generated population): one client per
    source client, its test data its own, streamed in blocks of ``block_clients`` clients.

    The same clients, rows and order as ``natural`` on the whole population gathered into
    one Dataset (owners = the client ids), with ``transform`` (e.g. to uint8 pixels) applied
    to every input array first -- without ever holding more than a few blocks. Clients are
    read by ``processes`` spawned processes when > 1 (each block by one process; blocks
    come back in order, so the result does not depend on the number of processes)."""
    m = _int("min_examples", min_examples, 0)
    spans = [(lo, min(lo + block_clients, source.population))
             for lo in range(0, source.population, block_clients)]
    if processes <= 1:
        before = _one_thread()
        try:
            for lo, hi in spans:
                yield _block(source, lo, hi, m, transform)
        finally:
            if before is not None:
                sys.modules["torch"].set_num_threads(before)
        return
    from collections import deque

    pool = _executor(processes)
    try:
        pending: deque[Future] = deque()
        for lo, hi in spans:
            pending.append(pool.submit(_pooled_block, source, lo, hi, m, transform))
            if len(pending) >= 2 * processes:  # bounded: a few blocks in flight
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
