"""The simulated clock: how long one client update takes, and how a synchronous round ends.

An update is three phases in sequence on the client's device (fedray.timing.devices):

    download_s = down_bytes / down_bytes_per_s         (the global model)
    compute_s  = examples_processed * compute_s_per_example
    upload_s   = up_bytes / up_bytes_per_s             (the update)
    total_s    = download_s + compute_s + upload_s

``examples_processed`` counts the examples the local passes touch, exactly as fedray's
batch schedule (fedray.kernels.sequential.batch_schedule) cuts them: ``local_epochs``
passes touch ``local_epochs * n`` examples; ``local_steps`` steps of ``batch_size`` cycle
through fresh permutations, each epoch being ``ceil(n / b)`` batches whose last is short, so
``s`` steps touch ``(s // m) * n + (s % m) * b`` examples with ``m = ceil(n / b)``.

The round arithmetic (``synchronous_round``) is the server's view of one round on this
clock; docs/time.md states its rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.errors import FedrayError
from fedray.timing.devices import DeviceProfiles
from fedray.timing.streams import client_ids


def examples_processed(examples: Any, *, batch_size: int, local_epochs: int = 1,
                       local_steps: int | None = None, independent: bool = False
                       ) -> np.ndarray:
    """Training examples one update touches, per client (``examples``: each client's train
    examples). ``independent``: every step draws its own batch (LOCALUPDATE's Alg. 2), so a
    step touches ``min(b, n)`` examples. A client with no examples touches none."""
    n = np.asarray(examples, dtype=np.int64)
    if n.size and int(n.min()) < 0:
        raise FedrayError(f"examples must be >= 0, got {int(n.min())}")
    if batch_size < 1 or local_epochs < 1 or (local_steps is not None and local_steps < 1):
        raise FedrayError(f"batch_size, local_epochs and local_steps must be >= 1, got "
                          f"{batch_size}, {local_epochs}, {local_steps}")
    if local_steps is None:
        return local_epochs * n
    if independent:
        return local_steps * np.minimum(n, batch_size)
    per_epoch = np.maximum(-(-n // batch_size), 1)  # ceil(n / b); n = 0 -> guarded below
    touched = (local_steps // per_epoch) * n + (local_steps % per_epoch) * batch_size
    return np.where(n > 0, touched, 0)


@dataclass(frozen=True)
class UpdateTimes:
    """Simulated seconds of each phase of each client's update, aligned with its ids."""

    download_s: np.ndarray
    compute_s: np.ndarray
    upload_s: np.ndarray

    @property
    def total_s(self) -> np.ndarray:
        return self.download_s + self.compute_s + self.upload_s


def update_times(profiles: DeviceProfiles, processed: Any, *, down_bytes: float,
                 up_bytes: float) -> UpdateTimes:
    """The simulated duration of one update per client: ``processed`` examples
    (``examples_processed``) on its device, ``down_bytes`` of model down and ``up_bytes``
    of update up (e.g. 4 bytes per float32 parameter, or fewer when compressed)."""
    for name, v in (("down_bytes", down_bytes), ("up_bytes", up_bytes)):
        if not (math.isfinite(v) and v >= 0):
            raise FedrayError(f"{name} must be >= 0 and finite, got {v!r}")
    ex = np.asarray(processed, dtype=np.float64)
    return UpdateTimes(download_s=down_bytes / profiles.down_bytes_per_s,
                       compute_s=ex * profiles.compute_s_per_example,
                       upload_s=up_bytes / profiles.up_bytes_per_s)


@dataclass(frozen=True)
class RoundOutcome:
    """How one synchronous round went on the clock. ``kept``, ``dropped`` and ``late``
    partition the sampled ids (each sorted); only ``kept`` clients are trained."""

    start_s: float  # when the round started (the model went out)
    end_s: float  # when the server closed it
    kept: np.ndarray  # finished in time, among the first k: trained and aggregated
    kept_finish_s: np.ndarray  # when each kept client's update arrived, aligned with kept
    dropped: np.ndarray  # went offline mid-update before the round closed
    late: np.ndarray  # still running when the round closed (deadline or k reached)

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def synchronous_round(start_s: float, ids: Any, durations_s: Any, online_until_s: Any,
                      k: int, *, deadline_s: float | None = None) -> RoundOutcome:
    """The outcome of a round that starts at ``start_s`` with the sampled ``ids`` (over-
    selected or not), each update lasting ``durations_s`` and each client online until
    ``online_until_s`` (fedray.timing.availability).

    Rules: a client whose update would finish after it goes offline (``start + duration >
    online_until``) drops out when it goes offline. The others arrive at ``start +
    duration``; those arriving after ``start + deadline_s`` are late. Of the arrivals in
    time, the first ``k`` (ties broken by client id) are kept. The server closes the round
    at the earliest of: the k-th kept arrival; the deadline; the moment no sampled client
    is still running (every one arrived or dropped). A client still running then -- one
    beyond the first k, one past the deadline, or one that would drop later -- is late;
    a real server would discard its work, so none of it is trained."""
    c = client_ids(ids)
    dur = np.asarray(durations_s, dtype=np.float64)
    until = np.asarray(online_until_s, dtype=np.float64)
    if c.ndim != 1 or dur.shape != c.shape or until.shape != c.shape:
        raise FedrayError("synchronous_round: ids, durations_s and online_until_s must be "
                          "1-d arrays of one length")
    if len(np.unique(c)) != len(c):
        raise FedrayError("synchronous_round: sampled ids must be distinct")
    if not (np.all(np.isfinite(dur)) and np.all(dur >= 0)):
        raise FedrayError("synchronous_round: durations must be >= 0 and finite")
    if k < 1:
        raise FedrayError(f"synchronous_round: k must be >= 1, got {k}")
    if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
        raise FedrayError(f"synchronous_round: deadline_s must be > 0, got {deadline_s!r}")
    start = float(start_s)
    finish = start + dur
    drops = finish > until
    drop_at = np.maximum(np.minimum(until, finish), start)  # offline at the start: at once
    cutoff = math.inf if deadline_s is None else start + deadline_s
    in_time = ~drops & (finish <= cutoff)
    order = np.lexsort((c, finish))  # by arrival, ties by id: independent of input order
    arrivals = order[in_time[order]]
    kept_idx = arrivals[:k]
    if len(kept_idx) == k:
        end = float(finish[kept_idx[-1]])
    else:  # fewer than k: wait for everyone still running, but no longer than the deadline
        last_event = np.where(drops, drop_at, finish)
        end = min(cutoff, float(last_event.max())) if len(c) else start
    kept_mask = np.zeros(len(c), dtype=bool)
    kept_mask[kept_idx] = True
    dropped_mask = drops & (drop_at <= end)
    late_mask = ~kept_mask & ~dropped_mask
    kept_sorted = np.argsort(c[kept_mask], kind="stable")
    return RoundOutcome(start_s=start, end_s=end, kept=c[kept_mask][kept_sorted],
                        kept_finish_s=finish[kept_mask][kept_sorted],
                        dropped=np.sort(c[dropped_mask]), late=np.sort(c[late_mask]))
