"""size: client sizes that grow linearly, quadratically or exponentially with the client's
index (flwr-datasets' size partitioners); examples dealt at random."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedray.core.seeding import rng
from fedray.data.partition import Partition
from fedray.data.partitioners.common import (
    SIZE_LAWS,
    TAG_SIZE,
    _assigned,
    _bad,
    _choice,
    _int,
    _names,
    _num_clients,
    _positive,
    _seed,
    canonical_order,
)

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset


def check_size_params(params: dict) -> None:
    """What ``size`` refuses of its parameters together, before any data is read."""
    if params.get("rate") is not None and params.get("law", "linear") != "exponential":
        raise _bad("rate", f"is only used with law: exponential (law is "
                   f"{params.get('law', 'linear')!r})", params["rate"])


def size_units(k: int, law: str, rate: float = 1.0) -> np.ndarray:
    """f(i) for the clients i = 1..k: i, i^2, or e^(rate * i) computed as
    e^(rate * (i - k)) (the same shares; e^i itself overflows float64 past i = 709)."""
    i = np.arange(1, k + 1, dtype=np.float64)
    if law == "linear":
        return i
    if law == "square":
        return i * i
    return np.exp(rate * (i - k))


def client_sizes(n: int, k: int, law: str, rate: float = 1.0, min_examples: int = 0
                 ) -> np.ndarray:
    """Each client's number of examples: ``min_examples`` each, plus the share
    f(i) / sum_j f(j) of the other n - k * min_examples, rounded down; what rounding leaves
    goes to the last (largest) client. flwr-datasets' SizePartitioner with
    ``min_examples`` 0."""
    units = size_units(k, law, rate)
    rest = n - k * min_examples
    sizes = (units / units.sum() * rest).astype(np.int64)  # floor: all shares are >= 0
    sizes[-1] += rest - int(sizes.sum())
    return sizes + min_examples


def size(dataset: Dataset, seed: int, num_clients: int, law: str = "linear",
         rate: float | None = None, min_examples: int = 0) -> Partition:
    """Client sizes set by a law of the client's index; the examples dealt at random.

    The definitions of flwr-datasets' LinearPartitioner, SquarePartitioner and
    ExponentialPartitioner (adap/flower, datasets/flwr_datasets/partitioner/
    linear_partitioner.py, square_partitioner.py, exponential_partitioner.py, on
    size_partitioner.py's SizePartitioner): client i = 1..K (fedray's client "i-1") gets
    f(i) units, f(i) = i (``law: linear``), i^2 (``square``) or e^i (``exponential``);
    its size is floor(f(i) / sum_j f(j) * n) and the examples rounding leaves go to the
    last, largest client; a client of 0 examples is an error, as there. Unlike flwr, which
    gives client i the next block of the data set in its stored order, the examples are
    dealt at random: a permutation of the train examples (canonical order) drawn from
    ``rng(seed, TAG_SIZE)`` is cut into the sizes in client order.

    Two extensions, both off by default: ``rate`` (exponential only, default 1) makes f(i)
    = e^(rate * i), so that more than a few dozen clients can all have examples (with e^i
    the largest client holds 1 - 1/e of the data and client K - 30 about e^-30 of it);
    ``min_examples`` gives every client that many first and divides the other
    n - K * min_examples by the law (with a linear law and n < K^2 / 2, client 1's share is
    below one example). ``info["min_size"]`` / ``["max_size"]`` record the extremes. The
    test split stays central.
    """
    seed = _seed(seed)
    n = len(dataset.train)
    k = _num_clients(num_clients, n)
    law = _choice("law", law, SIZE_LAWS)
    check_size_params({"law": law, "rate": rate})
    r = 1.0 if rate is None else _positive("rate", rate)
    m = _int("min_examples", min_examples, 0)
    if m * k > n:
        raise _bad("min_examples", f"cannot give every client {m} examples: {k} clients x {m} "
                   f"> {n} train examples", m)
    sizes = client_sizes(n, k, law, r, m)
    if sizes.min() < 1:
        short = int(np.argmax(sizes >= 1))
        raise _bad("num_clients", f"under law {law} leaves clients 0..{short - 1} without an "
                   f"example of the {n}: every client needs >= 1 (fewer clients, a smaller "
                   f"rate, or partitioner.min_examples)", k)
    order = canonical_order(dataset.train)
    perm = rng(seed, TAG_SIZE).permutation(n)
    client = np.empty(n, dtype=np.int64)
    client[perm] = np.repeat(np.arange(k), sizes)
    return Partition(_names(k), _assigned(order, client, k),
                     info={"law": law, "min_size": int(sizes.min()),
                           "max_size": int(sizes.max())})
