"""The typed messages between the driver and its workers: one broadcast and one task per
worker out, one result per worker back (architecture rule 2).

Plain dataclasses of numpy arrays and numbers: Ray ships the arrays out of band, so a
worker maps the broadcast's weights from the object store without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedray.algorithms.reduction import PartialMessage


@dataclass
class Broadcast:
    """A round's one object: the global weights and the aggregator's broadcast state."""

    weights: np.ndarray
    server: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class RoundTask:
    """One worker's share of a round (the broadcast travels beside it, as its own object:
    Ray resolves an object reference only as a task's direct argument)."""

    round: int
    client_ids: list[int]
    versions: list[int] | None = None  # each client's current state version (stateful parts)
    # buffered asynchronous training: how many server steps old the broadcast's model is
    # (every client of a task started from the same version)
    staleness: int = 0
    packs: list[int] | None = None  # the pack of each client's current state (-1: none)
    task: int = 0  # the task's number in its round: what its packs of client state are named by
    # a fixed composition (data.per_round): each client's rank among the round's ``invited``
    # clients sorted by id, the place its condition is dealt by
    ranks: list[int] | None = None
    invited: int = 0


@dataclass
class ClientUpdates:
    """A worker's kept clients' updates, for an aggregator that needs every one
    (``Aggregator.individual``): row i is client ``ids[i]``'s update after the update
    stages, in the worker's client order. numpy, so Ray ships the rows out of band and the
    driver reads them from the object store without a copy."""

    updates: np.ndarray  # float32 [n, d]
    ids: np.ndarray  # int64 [n]
    num_examples: np.ndarray  # int64 [n]
    losses: np.ndarray  # float64 [n]: loss_sum / examples_seen over its local steps


@dataclass
class RoundResult:
    """A worker's round: its partial sum and what the round's metrics are built from."""

    partial: PartialMessage | None  # None: folded into its group's sum (GroupResult)
    clients: int
    examples: int
    loss_sum: float
    examples_seen: int
    dropped: int
    updates: int
    stored: list[int]  # clients whose state was stored as version ``round``
    busy_s: float
    mem_mb: float
    nonfinite: int = 0  # of ``dropped``, those dropped for NaN or Inf (the driver checks it)
    rows: ClientUpdates | None = None  # Aggregator.individual: each kept client's update
    packs: list[int] = field(default_factory=list)  # the pack of each of ``stored``
    # clients the guard dropped or a stage flagged (clipped), with an adversary: the run's
    # defense metrics (fedray.runtime.adversary.DefenseRound)
    flagged: list[int] = field(default_factory=list)
    # the aggregated clients, one entry each: "id", "loss", "examples" and the client
    # part's columns (WorkerSpec.client_rows); None when the run does not report them
    arrived: dict[str, np.ndarray] | None = None

    STATS = ("examples", "loss_sum", "examples_seen", "dropped", "updates", "nonfinite",
             "busy_s")


@dataclass
class GroupResult:
    """A group of consecutive slots' round (runtime.reduce): their partial sums folded into
    one, and each member's result without its partial, in slot order, so that the driver
    adds the round's statistics exactly as it adds them from single workers."""

    partial: PartialMessage
    results: list[RoundResult]
