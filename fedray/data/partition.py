"""The result of partitioning a data set into federated clients.

A partitioner maps a Dataset to a Partition: for every client, the indices of its train
examples (and, where the partitioner gives clients their own test data, of its test
examples). A partition never copies pixels; the store writer gathers them once.

Why ``Ragged``: at a million clients, a list of one small index array per client costs
about 100 bytes of object overhead per client and a Python loop to build and to read; the
clients' indices one after the other in one int64 array, with offsets, cost 8 bytes per
example and 8 per client and are built and cut with whole-array numpy. A Partition keeps
what it is given (a ``Ragged`` or a list of arrays); both are sequences of per-client
arrays, and the store writer reads either a block of clients at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

import numpy as np


class Ragged(Sequence[np.ndarray]):
    """Per-client arrays stored as one array and offsets: client i is
    ``values[offsets[i]:offsets[i + 1]]`` (a view). Indexing with an integer gives that
    array, with a slice (step 1) a Ragged of those clients sharing the same memory."""

    __slots__ = ("offsets", "values")

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or len(offsets) == 0 or offsets[0] < 0 \
                or offsets[-1] > len(values) or (np.diff(offsets) < 0).any():
            raise ValueError("offsets must be non-decreasing positions into values")
        self.values, self.offsets = values, offsets

    @classmethod
    def from_arrays(cls, arrays: Sequence[np.ndarray]) -> Ragged:
        if isinstance(arrays, Ragged):
            return arrays
        counts = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
        values = np.concatenate(arrays) if len(arrays) else np.zeros(0, np.int64)
        return cls(values, np.concatenate([[0], np.cumsum(counts)]))

    @classmethod
    def from_counts(cls, values: np.ndarray, counts: np.ndarray) -> Ragged:
        return cls(values, np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]))

    @property
    def counts(self) -> np.ndarray:
        """Each client's number of elements ([k] int64)."""
        return np.diff(self.offsets)

    def select(self, keep: np.ndarray) -> Ragged:
        """The clients where ``keep`` ([k] bool) is true, in order (a copy)."""
        keep = np.asarray(keep, dtype=bool)
        counts = self.counts
        values = self.span(0, len(self))[np.repeat(keep, counts)]
        return Ragged.from_counts(values, counts[keep])

    def span(self, a: int, b: int) -> np.ndarray:
        """Clients a..b-1's elements, one client after the other (a view)."""
        return self.values[self.offsets[a]:self.offsets[b]]

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, i: slice) -> Ragged: ...

    def __getitem__(self, i: int | slice) -> np.ndarray | Ragged:
        if isinstance(i, slice):
            a, b, step = i.indices(len(self))
            if step != 1:
                raise IndexError("a Ragged slice must have step 1")
            b = max(a, b)
            return Ragged(self.values, self.offsets[a:b + 1])
        k = len(self)
        j = int(i) + k if int(i) < 0 else int(i)
        if not 0 <= j < k:
            raise IndexError(f"client {i} of {k}")
        return self.values[self.offsets[j]:self.offsets[j + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        off = self.offsets.tolist()
        for a, b in zip(off[:-1], off[1:], strict=False):
            yield self.values[a:b]


def counts_of(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Each client's number of elements, without a Python loop for a Ragged."""
    if isinstance(arrays, Ragged):
        return arrays.counts
    return np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))


def span_of(arrays: Sequence[np.ndarray], a: int, b: int) -> np.ndarray:
    """Clients a..b-1's arrays joined (a view for a Ragged)."""
    if isinstance(arrays, Ragged):
        return arrays.span(a, b)
    return np.concatenate(arrays[a:b]) if b > a else np.zeros(0, np.int64)


class NumberedNames(Sequence[str]):
    """The client names "0".."k-1", made as they are read: a million names held as a list
    of str cost about 60 MB; these are unique by construction."""

    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = int(k)

    def __len__(self) -> int:
        return self.k

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [str(j) for j in range(*i.indices(self.k))]
        j = int(i) + self.k if int(i) < 0 else int(i)
        if not 0 <= j < self.k:
            raise IndexError(f"client {i} of {self.k}")
        return str(j)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, NumberedNames):
            return self.k == other.k
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == self.k and all(a == b for a, b in zip(self, other,
                                                                         strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a sequence, compared by value


@dataclass
class Partition:
    client_names: Sequence[str]  # stable, unique client ids ("0".."499", or writer ids)
    train: Sequence[np.ndarray]  # per client: int64 indices into dataset.train (a list of
    #                              arrays or a Ragged)
    test: Sequence[np.ndarray] | None = None  # per client: indices into dataset.test; None
    #                                            keeps dataset.test as one central test set
    train_labels: Sequence[np.ndarray] | None = None  # per client: labels replacing
    #                                               dataset.train.y[train[k]] (label flips)
    info: dict = field(default_factory=dict)  # partitioner facts for the manifest (JSON-safe)

    def __post_init__(self) -> None:
        n = len(self.client_names)
        if not isinstance(self.client_names, NumberedNames) \
                and len(set(self.client_names)) != n:
            raise ValueError("client names must be unique")
        if len(self.train) != n or (self.test is not None and len(self.test) != n):
            raise ValueError("one index array per client and split")
        if self.train_labels is not None and \
                not np.array_equal(counts_of(self.train_labels), counts_of(self.train)):
            raise ValueError("train_labels must match train indices client by client")

    @property
    def num_clients(self) -> int:
        return len(self.client_names)
