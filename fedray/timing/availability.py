"""Availability: when a client is online, on the simulated clock (seconds from the run's start).

Three models answer the same three questions for an array of client ids at simulated times
``t`` (a scalar, or an array aligned with the ids):

- ``online(ids, t)``: is the client online at ``t``;
- ``online_until(ids, t)``: when it goes offline next, ``inf`` if never, and ``t`` itself
  when it is offline at ``t`` (it has no online time left from ``t``: an update started
  then cannot finish, which is what the round arithmetic of fedray.timing.clock needs);
- ``next_online(ids, t)``: ``t`` when online, else when it next comes online (``inf`` if
  never).

Online windows are half-open, ``[start, end)``: a client is online at its window's start
and offline at its end. Every answer is a pure function of (seed or trace, client id, t),
vectorised, and computed for the ids asked only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fedray.errors import FedrayError
from fedray.timing.streams import TAG_AVAILABILITY, client_ids, stream_key, uniform


class Availability(Protocol):
    def online(self, ids: Any, t: Any) -> np.ndarray: ...

    def online_until(self, ids: Any, t: Any) -> np.ndarray: ...

    def next_online(self, ids: Any, t: Any) -> np.ndarray: ...


def _times(ids: np.ndarray, t: Any) -> np.ndarray:
    a = np.asarray(t, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise FedrayError("availability: a simulated time must be finite")
    return np.broadcast_to(a, ids.shape).astype(np.float64)


@dataclass(frozen=True)
class AlwaysOnline:
    """Every client online all the time: the clock without availability."""

    def online(self, ids: Any, t: Any) -> np.ndarray:
        c = client_ids(ids)
        _times(c, t)
        return np.ones(c.shape, dtype=bool)

    def online_until(self, ids: Any, t: Any) -> np.ndarray:
        c = client_ids(ids)
        _times(c, t)
        return np.full(c.shape, np.inf)

    def next_online(self, ids: Any, t: Any) -> np.ndarray:
        c = client_ids(ids)
        return _times(c, t)


@dataclass(frozen=True)
class Diurnal:
    """One online window of ``online_s`` seconds per period (a day by default) per client.

    Client ``c``'s window in period ``q`` (any integer) starts at
    ``phase_c + q * period_s + jitter_s * u_{c,q}``, with ``phase_c`` uniform in
    ``[0, phase_spread_s)`` (default: the period) and ``u_{c,q}`` uniform in ``[0, 1)``,
    both drawn from (seed, TAG_AVAILABILITY, c[, q]). ``online_s + jitter_s <= period_s``
    keeps each window inside its own period, so windows never overlap. With
    ``phase_spread_s = period_s`` (clients spread over every time zone) the online share is
    ``online_s / period_s`` at every moment; a smaller spread makes it vary over the day,
    as real FL populations do (Bonawitz et al., 2019)."""

    seed: int
    period_s: float = 86400.0
    online_s: float = 28800.0
    phase_spread_s: float | None = None  # None: period_s
    jitter_s: float = 0.0

    def __post_init__(self) -> None:
        if self.phase_spread_s is None:
            object.__setattr__(self, "phase_spread_s", self.period_s)
        for name in ("period_s", "online_s", "phase_spread_s", "jitter_s"):
            object.__setattr__(self, name, float(getattr(self, name)))
        p, on, spread, j = self.period_s, self.online_s, self.phase_spread_s, self.jitter_s
        if not (math.isfinite(p) and p > 0):
            raise FedrayError(f"diurnal availability: period_s must be > 0, got {p!r}")
        if not (math.isfinite(on) and 0 < on <= p):
            raise FedrayError(f"diurnal availability: online_s must be in (0, period_s = "
                              f"{p!r}], got {on!r}")
        if not (math.isfinite(spread) and 0 <= spread <= p):
            raise FedrayError(f"diurnal availability: phase_spread_s must be in [0, "
                              f"period_s = {p!r}], got {spread!r}")
        if not (math.isfinite(j) and j >= 0 and on + j <= p):
            raise FedrayError(f"diurnal availability: jitter_s must be >= 0 with online_s + "
                              f"jitter_s <= period_s ({p!r}), got {j!r}")

    @property
    def always(self) -> bool:
        return self.online_s == self.period_s  # windows touch: never offline

    def phase(self, c: np.ndarray) -> np.ndarray:
        if self.phase_spread_s == 0:
            return np.zeros(c.shape)
        return self.phase_spread_s * uniform(stream_key(self.seed, TAG_AVAILABILITY), c, 0)

    def window_start(self, c: np.ndarray, q: np.ndarray, phase: np.ndarray) -> np.ndarray:
        """When client ``c``'s window in period ``q`` opens (``phase`` = self.phase(c))."""
        s = phase + q * self.period_s
        if self.jitter_s:
            s = s + self.jitter_s * uniform(stream_key(self.seed, TAG_AVAILABILITY), c, 1, q)
        return s

    def _windows(self, ids: Any, t: Any) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        c = client_ids(ids)
        tt = _times(c, t)
        phase = self.phase(c)
        p = np.floor((tt - phase) / self.period_s).astype(np.int64)
        # the window of period p normally holds t; p - 1 and p + 1 guard against the
        # rounding of the division above, p + 2 opens after t in any case
        starts = [self.window_start(c, p + d, phase) for d in (-1, 0, 1, 2)]
        return c, tt, starts

    def online(self, ids: Any, t: Any) -> np.ndarray:
        c, tt, starts = self._windows(ids, t)
        if self.always:
            return np.ones(c.shape, dtype=bool)
        on = np.zeros(c.shape, dtype=bool)
        for s in starts:
            on |= (s <= tt) & (tt < s + self.online_s)
        return on

    def online_until(self, ids: Any, t: Any) -> np.ndarray:
        c, tt, starts = self._windows(ids, t)
        if self.always:
            return np.full(c.shape, np.inf)
        until = tt.copy()
        for s in starts:
            inside = (s <= tt) & (tt < s + self.online_s)
            until = np.where(inside, s + self.online_s, until)
        return until

    def next_online(self, ids: Any, t: Any) -> np.ndarray:
        c, tt, starts = self._windows(ids, t)
        if self.always:
            return tt
        nxt = np.full(c.shape, np.inf)
        on = np.zeros(c.shape, dtype=bool)
        for s in starts:
            on |= (s <= tt) & (tt < s + self.online_s)
            nxt = np.where(s > tt, np.minimum(nxt, s), nxt)
        return np.where(on, tt, nxt)


@dataclass(frozen=True)
class TraceAvailability:
    """Online intervals per trace row; client ``c`` takes row ``c % rows`` (as FedScale
    does, see fedray.timing.devices.DeviceTrace).

    Row ``r``'s intervals are ``[starts[i], ends[i])`` for ``offsets[r] <= i <
    offsets[r + 1]``, sorted, disjoint and not touching (touching ones are one interval).
    ``periods[r]`` is NaN for absolute times, or the period after which row ``r``'s
    intervals repeat (then ``0 <= start < end <= period``; an interval ending at the period
    and one starting at 0 join into one across the wrap). A row with no interval is a
    client never online. fedray.timing.traces builds one from a file, with one-line errors
    naming the file's row; this constructor only refuses what would give wrong answers."""

    offsets: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    periods: np.ndarray

    def __post_init__(self) -> None:
        off = np.asarray(self.offsets, dtype=np.int64)
        s = np.asarray(self.starts, dtype=np.float64)
        e = np.asarray(self.ends, dtype=np.float64)
        per = np.asarray(self.periods, dtype=np.float64)
        rows = len(off) - 1
        if rows < 1 or off[0] != 0 or off[-1] != len(s) or np.any(np.diff(off) < 0):
            raise FedrayError("availability trace: offsets must rise from 0 to the number "
                              "of intervals, with at least one row")
        if s.shape != e.shape or per.shape != (rows,):
            raise FedrayError("availability trace: starts, ends and periods do not align")
        if not (np.all(np.isfinite(s)) and np.all(np.isfinite(e)) and np.all(s < e)):
            raise FedrayError("availability trace: every interval needs finite start < end")
        row_of = np.repeat(np.arange(rows), np.diff(off))
        same_row = row_of[1:] == row_of[:-1]
        if np.any(same_row & (s[1:] <= e[:-1])):
            raise FedrayError("availability trace: a row's intervals must be sorted, "
                              "disjoint and not touching")
        periodic = ~np.isnan(per)
        if np.any(periodic & ~(per > 0)) or np.any(~np.isfinite(per[periodic])):
            raise FedrayError("availability trace: a period must be > 0 and finite")
        p = per[row_of]
        if np.any(~np.isnan(p) & ((s < 0) | (e > p))):
            raise FedrayError("availability trace: a periodic row's intervals must lie in "
                              "[0, period]")
        for name, a in (("offsets", off), ("starts", s), ("ends", e), ("periods", per)):
            object.__setattr__(self, name, a)

    @property
    def rows(self) -> int:
        return len(self.offsets) - 1

    def _locate(self, ids: Any, t: Any) -> tuple[np.ndarray, ...]:
        """Per query: row, its interval range [lo, hi), its period (NaN: none), the start of
        the current period (0 when not periodic), the time within the period, and the
        index of the last interval starting at or before it (lo - 1: none)."""
        c = client_ids(ids)
        tt = _times(c, t)
        r = c % self.rows
        lo, hi = self.offsets[r], self.offsets[r + 1]
        per = self.periods[r]
        periodic = ~np.isnan(per)
        safe = np.where(periodic, per, 1.0)
        base = np.where(periodic, np.floor(tt / safe) * safe, 0.0)
        tau = tt - base
        wrap = periodic & (tau >= safe)  # rounding can leave tau == period
        base, tau = np.where(wrap, base + safe, base), np.where(wrap, tau - safe, tau)
        # vectorised bisect_right of tau in starts[lo:hi]
        left, right = lo.copy(), hi.copy()
        n = len(self.starts)
        while True:
            active = left < right
            if not active.any():
                break
            mid = (left + right) // 2
            le = self.starts[np.minimum(mid, n - 1)] <= tau if n else np.zeros_like(active)
            left = np.where(active & le, mid + 1, left)
            right = np.where(active & ~le, mid, right)
        return tt, lo, hi, per, periodic, base, tau, left - 1

    def _inside(self, i: np.ndarray, lo: np.ndarray, tau: np.ndarray) -> np.ndarray:
        if not len(self.ends):
            return np.zeros(i.shape, dtype=bool)
        return (i >= lo) & (tau < self.ends[np.clip(i, 0, len(self.ends) - 1)])

    def online(self, ids: Any, t: Any) -> np.ndarray:
        _, lo, _, _, _, _, tau, i = self._locate(ids, t)
        return self._inside(i, lo, tau)

    def online_until(self, ids: Any, t: Any) -> np.ndarray:
        tt, lo, hi, per, periodic, base, tau, i = self._locate(ids, t)
        inside = self._inside(i, lo, tau)
        if not inside.any():
            return tt
        last = len(self.ends) - 1
        end = self.ends[np.clip(i, 0, last)]
        first_start = self.starts[np.clip(lo, 0, last)]
        first_end = self.ends[np.clip(lo, 0, last)]
        # a periodic row whose interval runs to the period and whose first one starts at 0
        # stays online across the wrap; one interval [0, period) is online for ever
        wraps = periodic & (end == per) & (first_start == 0)
        full = wraps & (hi - lo == 1)
        until = base + np.where(wraps, per + first_end, end)
        until = np.where(full, np.inf, until)
        return np.where(inside, until, tt)

    def next_online(self, ids: Any, t: Any) -> np.ndarray:
        tt, lo, hi, per, periodic, base, tau, i = self._locate(ids, t)
        inside = self._inside(i, lo, tau)
        if not len(self.starts):
            return np.full(tt.shape, np.inf)
        last = len(self.starts) - 1
        j = i + 1
        later = self.starts[np.clip(j, 0, last)]
        first = self.starts[np.clip(lo, 0, last)]
        nxt = np.where(j < hi, base + later,
                       np.where(periodic & (hi > lo), base + per + first, np.inf))
        return np.where(inside, tt, nxt)
