"""continuous: clients ordered along a real-valued property of the examples (the label or
one input feature), blended with noise by a strictness (flwr-datasets' ContinuousPartitioner)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from fedray.core.seeding import rng
from fedray.data.partition import Partition
from fedray.data.partitioners.common import (
    TAG_CONTINUOUS,
    _assigned,
    _bad,
    _fraction,
    _int,
    _names,
    _num_clients,
    _seed,
    canonical_order,
)

if TYPE_CHECKING:  # a Dataset (fedray.data.dataset) uses this module: its type only
    from fedray.data.dataset import Dataset

MIN_STD = 1e-6  # a property this flat cannot order clients (flwr's threshold)


def continuous(dataset: Dataset, seed: int, num_clients: int, strictness: float,
               feature: int | None = None) -> Partition:
    """Clients ordered along a continuous property: client 0 holds the lowest values,
    client K-1 the highest, as sharply as ``strictness`` says.

    The definition of flwr-datasets' ContinuousPartitioner (adap/flower,
    datasets/flwr_datasets/partitioner/continuous_partitioner.py): the property v (one value
    per train example) is standardized, z = (v - mean(v)) / std(v) (population std), and
    blended with standard normal noise e, b = s * z + (1 - s) * e with s = ``strictness``
    in [0, 1]; the examples sorted by b are cut into K = ``num_clients`` consecutive
    near-equal parts (np.array_split: the first n mod K parts one larger), client k getting
    part k. s = 0 is an i.i.d. split, s = 1 follows the property exactly (ties in canonical
    order). A property with std < 1e-6 is refused when s > 0, as there.

    The property: ``feature: null`` (the default) is the label, read as a number (so
    clients get bands of neighbouring classes: meaningful when the label is ordinal, such as
    an age or a rating); ``feature: j`` is the j-th value of each example's input,
    flattened (a tabular column, or a pixel), as stored (uint8 pixels as 0..255: scaling
    does not change z). In fedray e is drawn from ``rng(seed, TAG_CONTINUOUS)``, one value
    per example in canonical order, so the split depends on the data's contents and not on
    their order; flwr's ``shuffle`` has no counterpart (a client's examples are listed in
    canonical order). The test split stays central.
    """
    seed = _seed(seed)
    n = len(dataset.train)
    k = _num_clients(num_clients, n)
    s = _fraction("strictness", strictness)
    order = canonical_order(dataset.train)
    if feature is None:
        v = np.asarray(dataset.train.y)[order].astype(np.float64)
        what = "the labels"
    else:
        j = _int("feature", feature, 0)
        width = int(np.prod(dataset.train.x.shape[1:]))
        if j >= width:
            raise _bad("feature", f"must be < {width}, the values per example of "
                       f"{dataset.name!r}", j)
        v = dataset.train.x.reshape(n, -1)[order, j].astype(np.float64)
        what = f"input value {j}"
    std = float(v.std())
    if s > 0 and not std >= MIN_STD:
        raise _bad("strictness", f"is {s:g} but {what} of {dataset.name!r} are (nearly) "
                   f"constant (std {std:.3g}): nothing to order clients by; choose another "
                   f"partitioner.feature, or strictness 0 for an i.i.d. split", s)
    z = (v - v.mean()) / std if std > 0 else np.zeros(n)
    noise = rng(seed, TAG_CONTINUOUS).standard_normal(n)
    b = s * z + (1.0 - s) * noise
    ranked = np.argsort(b, kind="stable")
    client = np.empty(n, dtype=np.int64)
    client[ranked] = np.repeat(np.arange(k), np.full(k, n // k) + (np.arange(k) < n % k))
    return Partition(_names(k), _assigned(order, client, k),
                     info={"property": "label" if feature is None else f"feature {feature}",
                           "strictness": s})
