"""Device profiles: how fast a client computes and how fast its network is.

A profile is three numbers per client, fixed for the whole run: the seconds one training
example costs in one local pass, and the download and upload bandwidths in bytes per second.
They come from a seeded log-normal distribution (``LogNormalDevices``) or from a trace
(``DeviceTrace``, read by fedray.timing.traces). Either is asked only for the ids it needs,
so a population of millions is never materialised.

Why log-normal: device speeds and bandwidths are spread over orders of magnitude with a
long slow tail (Papaya, Huba et al. 2022; FedScale's own ``get_completion_time_lognormal``),
and a log-normal is the one-parameter-per-spread model of that. The median is the natural
knob: half the devices are faster than it, whatever the sigma.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fedray.errors import FedrayError
from fedray.timing.streams import TAG_DEVICE, client_ids, standard_normal, stream_key


@dataclass(frozen=True)
class DeviceProfiles:
    """The profiles of some clients, aligned with the ids they were asked for."""

    compute_s_per_example: np.ndarray  # seconds per training example per local pass
    down_bytes_per_s: np.ndarray  # download bandwidth (the model, server -> client)
    up_bytes_per_s: np.ndarray  # upload bandwidth (the update, client -> server)


class DeviceModel(Protocol):
    def profiles(self, ids: Any) -> DeviceProfiles:
        """The profiles of ``ids`` (any integer array >= 0), aligned with it."""
        ...


def _positive(name: str, value: float, *, zero: bool = False) -> None:
    ok = math.isfinite(value) and (value >= 0 if zero else value > 0)
    if not ok:
        raise FedrayError(f"device model: {name} must be {'>= 0' if zero else '> 0'} and "
                          f"finite, got {value!r}")


@dataclass(frozen=True)
class LogNormalDevices:
    """Each client's profile drawn once from log-normals: value = median * exp(sigma * z),
    with z a standard normal of its own per (seed, client id, quantity). The three
    quantities are independent. sigma = 0 gives every client the median exactly.

    Defaults (a proposal, not a measurement): 10 ms per example (a small CNN on a phone),
    2.5 MB/s down and 0.75 MB/s up (about 20 and 6 Mbit/s, mobile networks' order of
    magnitude), sigmas that put the 5th to 95th percentiles about 10x (compute) and 14x
    (network) apart."""

    seed: int
    compute_s_per_example: float = 0.01
    compute_sigma: float = 0.7
    down_bytes_per_s: float = 2.5e6
    down_sigma: float = 0.8
    up_bytes_per_s: float = 7.5e5
    up_sigma: float = 0.8

    def __post_init__(self) -> None:
        for name in ("compute_s_per_example", "compute_sigma", "down_bytes_per_s",
                     "down_sigma", "up_bytes_per_s", "up_sigma"):
            object.__setattr__(self, name, float(getattr(self, name)))
        for name in ("compute_s_per_example", "down_bytes_per_s", "up_bytes_per_s"):
            _positive(name, getattr(self, name))
        for name in ("compute_sigma", "down_sigma", "up_sigma"):
            _positive(name, getattr(self, name), zero=True)

    def profiles(self, ids: Any) -> DeviceProfiles:
        c = client_ids(ids)
        key = stream_key(self.seed, TAG_DEVICE)

        def draw(median: float, sigma: float, quantity: int) -> np.ndarray:
            if sigma == 0:
                return np.full(c.shape, float(median))
            return median * np.exp(sigma * standard_normal(key, c, quantity))

        return DeviceProfiles(draw(self.compute_s_per_example, self.compute_sigma, 0),
                              draw(self.down_bytes_per_s, self.down_sigma, 1),
                              draw(self.up_bytes_per_s, self.up_sigma, 2))


@dataclass(frozen=True)
class DeviceTrace:
    """Measured profiles, one row per device; client ``c`` takes row ``c % rows``.

    Why modulo: a trace has fewer rows than a simulated population, and FedScale assigns
    its traces the same way: its client ``c`` (numbered from 1) gets the device profile
    under key ``c % len(profiles)`` (fedscale/cloud/aggregation/aggregator.py,
    ``client_register_handler``) and the availability entry at position ``c % len(trace)``
    (fedscale/cloud/client_manager.py, ``register_client``). fedray.timing.fedscale lays
    its rows out so that this modulo reproduces FedScale's assignment."""

    compute_s_per_example: np.ndarray
    down_bytes_per_s: np.ndarray
    up_bytes_per_s: np.ndarray

    def __post_init__(self) -> None:
        rows = len(self.compute_s_per_example)
        if rows == 0:
            raise FedrayError("device trace: no rows")
        for name in ("compute_s_per_example", "down_bytes_per_s", "up_bytes_per_s"):
            a = np.asarray(getattr(self, name), dtype=np.float64)
            if a.shape != (rows,):
                raise FedrayError(f"device trace: {name} has shape {a.shape}, expected "
                                  f"({rows},)")
            bad = np.flatnonzero(~(np.isfinite(a) & (a > 0)))
            if bad.size:
                raise FedrayError(f"device trace: {name}, row {int(bad[0])}: must be > 0 "
                                  f"and finite, got {float(a[bad[0]])!r}")
            object.__setattr__(self, name, a)

    @property
    def rows(self) -> int:
        return len(self.compute_s_per_example)

    def profiles(self, ids: Any) -> DeviceProfiles:
        r = client_ids(ids) % self.rows
        return DeviceProfiles(self.compute_s_per_example[r], self.down_bytes_per_s[r],
                              self.up_bytes_per_s[r])
