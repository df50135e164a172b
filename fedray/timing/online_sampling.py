"""Sampling among the clients online at a simulated moment, without listing the population.

Uniform sampling of k clients among the online ones is done by rejection: candidates are
drawn uniformly from the whole population, in a fixed order given by a counter-based stream
of (seed, TAG_ONLINE_SAMPLE, draw), and the first k distinct online ones are taken. Each
candidate is online with probability ``share`` (the online fraction), so about
``k / share`` candidates are looked at (a few more when k is a large part of the online
clients, for repeats): the cost follows k and the share, never the population, which
FedScale's sampler (fedscale/cloud/client_manager.py, ``getFeasibleClients``) scans
client by client. The result depends only on the stream, not on how many candidates are
checked at a time, so it is a pure function of (seed, draw, population, k, availability, t).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.core.sampling import isin_sorted, sorted_distinct
from fedray.errors import FedrayError
from fedray.timing.availability import Availability
from fedray.timing.streams import TAG_ONLINE_SAMPLE, client_ids, hash64, stream_key

DRAWS_PER_CLIENT = 1000  # default bound: k * 1000 candidates, i.e. an online share < 0.1%


@dataclass(frozen=True)
class OnlineSample:
    ids: np.ndarray  # k distinct client ids, sorted, all online at t
    draws: int  # candidates drawn up to the k-th accepted one (about k / online share)


def sample_online(seed: int, draw: int, population: int, k: int, availability: Availability,
                  t: float, *, exclude: Any = (), max_draws: int | None = None,
                  partial: bool = False) -> OnlineSample:
    """``k`` distinct clients online at simulated time ``t``, uniformly among those online
    and not in ``exclude`` (e.g. clients already training, for an asynchronous loop).

    ``draw`` names the stream: the round index in a synchronous run, any counter that
    never repeats in an asynchronous one. Fails with one line after ``max_draws``
    candidates (default ``k * DRAWS_PER_CLIENT``) when too few clients are online; with
    ``partial``, returns the fewer it found instead (a selector exploring the clients it
    has not seen yet takes what there is)."""
    if not 1 <= k <= population:
        raise FedrayError(f"online sampling: k must be in [1, population = {population}], "
                          f"got {k}")
    limit = k * DRAWS_PER_CLIENT if max_draws is None else int(max_draws)
    if limit < k:
        raise FedrayError(f"online sampling: max_draws must be >= k = {k}, got {limit}")
    key = stream_key(seed, TAG_ONLINE_SAMPLE, draw)
    banned = sorted_distinct(client_ids(exclude))  # looked up by bisection below
    chosen = np.empty(0, dtype=np.int64)
    done = used = 0
    chunk = 2 * k
    while len(chosen) < k and done < limit:
        n = min(chunk, limit - done)
        counters = np.arange(done, done + n, dtype=np.int64)
        cand = (hash64(key, counters) % np.uint64(population)).astype(np.int64)
        done += n
        ok = availability.online(cand, t)
        if len(banned):  # O(n log |exclude|): a selector excludes the clients it has seen
            ok &= ~isin_sorted(banned, cand)
        cand, pos = cand[ok], counters[ok]
        # first occurrences in stream order, and not already chosen
        _, first = np.unique(cand, return_index=True)
        first = np.sort(first)
        cand, pos = cand[first], pos[first]
        new = ~np.isin(cand, chosen)
        cand, pos = cand[new][:k - len(chosen)], pos[new][:k - len(chosen)]
        chosen = np.concatenate([chosen, cand])
        if len(chosen) == k:
            used = int(pos[-1]) + 1
        chunk *= 2
    if len(chosen) < k and not partial:
        raise FedrayError(f"online sampling: found {len(chosen)} of k = {k} clients online "
                          f"at t = {t:g} s after {done} draws (online share about "
                          f"{len(chosen) / done:.2%} or less); lower k or widen the "
                          f"availability windows")
    return OnlineSample(ids=np.sort(chosen), draws=used)
