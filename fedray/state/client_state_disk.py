"""How much disk a stateful run's client state takes, known before round 1.

SCAFFOLD keeps a model-sized control variate for every client it has ever sampled, FedPer and
Ditto a personal model: on a population of thousands, a run's client state outgrows its
checkpoints by orders of magnitude, and a sweep multiplies it by its trials. The driver
prints this estimate when a stateful run starts and refuses a run whose expected size is
over ``runtime.client_state_mb``, before anything is written.

Two numbers, both from the config alone (no sampling is replayed), for uniform sampling of
``k`` of ``N`` clients a round (q = k/N) over ``R`` rounds:

- ``expected``: what the store holds at the end. A worker writes its round's states into
  shared packs (fedray.state.client_state); a pack is deleted only once every state in it is
  superseded, so superseded states stay beside current ones. A state written in round t is
  current at the end with probability s_t = (1 - q)^(R - t) (its client not sampled again),
  and a pack of m states survives with probability 1 - (1 - s_t)^m; the round's k states
  are split evenly over the run's workers, each worker's into packs of ``per_pack``
  states. Summed over rounds and packs, this matched the SCAFFOLD trials of the
  participation-by-method study within 2% (docs/performance.md, "Client state on disk").
  Its floor is one state per client sampled, ``N (1 - (1 - q)^R)`` distinct clients.
- ``bound``: the most the store can hold on the way: besides the packs above, the last
  checkpoint's states are kept until the next one. Each live pack holds at least one
  current or checkpointed state, of which there are at most twice the distinct clients, and
  at most ``per_pack`` states, so at most ``min(written, 2 x clients x per_pack)`` states
  are on disk, ``written`` being every state ever written (``R x k``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.config import RuntimeConfig, WorkerConfig

FLOAT_BYTES = {"float32": 4, "float16": 2}


@dataclass(frozen=True)
class ClientStateDisk:
    """A stateful run's client state on disk, in bytes (module docstring)."""

    clients: float  # expected distinct clients sampled over the run
    per_client: int  # bytes of one client's state
    expected: float  # what the store holds at the end, superseded states in packs included
    bound: float  # the most the state store can hold on the way

    def line(self, rounds: int, dtype: str = "float32") -> str:
        """The note a run prints when it starts."""
        return (f"client state on disk: about {size_text(self.expected)} at the end "
                f"({self.clients:,.0f} clients sampled over {rounds} rounds, "
                f"{size_text(self.per_client)} each, and superseded states that share a pack "
                f"with a current one), at most {size_text(self.bound)} on the way; "
                "runtime.client_state_mb sets a limit"
                + (", runtime.worker.state_dtype=float16 halves it" if dtype == "float32"
                   else ""))


def size_text(n: float) -> str:
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def expected_clients(population: int, k: int, rounds: int) -> float:
    """Expected distinct clients in ``rounds`` uniform draws of ``k`` of ``population``."""
    if population <= 0 or k <= 0 or rounds <= 0:
        return 0.0
    q = min(1.0, k / population)
    # 1 - (1 - q)^R without cancellation for tiny q (10^9 clients, 100 a round)
    return population * -math.expm1(rounds * math.log1p(-q)) if q < 1 else float(population)


def run_estimate(worker: WorkerConfig, rounds: int, population: int, k: int, template: Any,
                 client: Any, stages: tuple, workers: int = 1) -> ClientStateDisk:
    """A run's estimate from its config and built parts (the driver's, or a sweep's for each
    trial before it starts): each state tensor a part declares (``ClientWork.state``, an
    update stage's ``client_state``) counted as model-sized, as SCAFFOLD's control variate
    and an error-feedback residual are, and ``local`` parameters as many values as they
    have. ``k``: the most clients a round trains, ``workers`` share them; ``worker``: the
    job's ``runtime.worker`` section (how states are stored)."""
    d = template.num_params
    local = int(template.positions(client.local).numel()) if client.local else 0
    keys = len(client.state) + sum(len(s.client_state) for s in stages)
    return estimate(population, k, rounds, keys * d + local, worker.state_dtype,
                    worker.state_pack_mb, workers)


def over_budget(runtime: RuntimeConfig, disk: ClientStateDisk) -> str | None:
    """The refusal of a run expected to keep more than ``runtime.client_state_mb``."""
    budget = runtime.client_state_mb
    if budget is None or disk.expected <= budget * 2**20:
        return None
    return (f"config key 'runtime.client_state_mb': the run's client state is expected to "
            f"take {disk.expected / 2**20:,.1f} MB on disk ({disk.clients:,.0f} clients "
            f"sampled, {disk.per_client:,} bytes each, and superseded states in their packs) "
            f"> {budget:g} MB; raise it, "
            + ("store it as float16 (runtime.worker.state_dtype=float16), "
               if runtime.worker.state_dtype == "float32" else "")
            + "or run fewer rounds or clients per round")


def _held(population: int, k: int, rounds: int, per_pack: int, workers: int) -> float:
    """Expected states on disk at the end (module docstring)."""
    q = min(1.0, k / population)
    t = np.arange(1, rounds + 1, dtype=np.float64)
    current = np.exp((rounds - t) * math.log1p(-q)) if q < 1 else (t == rounds) * 1.0
    with np.errstate(divide="ignore"):  # log(0) = -inf where a state is surely current
        superseded = np.log1p(-current)  # log of the chance a state was superseded
    held = np.zeros_like(t)
    base, extra = divmod(k, max(1, workers))  # a worker's clients in a round
    for n, tasks in ((base + 1, extra), (base, max(1, workers) - extra)):
        full, rest = divmod(n, per_pack)
        for m, packs in ((per_pack, full * tasks), (rest, tasks)):
            if m and packs:  # a pack of m states survives unless all m were superseded
                held += packs * m * -np.expm1(m * superseded)
    return float(held.sum())


def estimate(population: int, k: int, rounds: int, values: int, dtype: str = "float32",
             pack_mb: float = 8.0, workers: int = 1) -> ClientStateDisk:
    """The disk of ``values`` floating values of state per client (``dtype`` as stored),
    ``k`` clients a round of ``population`` for ``rounds`` rounds on ``workers`` workers,
    packs of ``pack_mb`` MiB (0: a file per client, deleted once superseded and not
    checkpointed)."""
    per_client = values * FLOAT_BYTES[dtype]
    k = min(k, population)
    clients = expected_clients(population, k, rounds)
    written = float(rounds) * k
    per_pack = 1 if pack_mb <= 0 or per_client <= 0 else max(
        1, math.ceil(pack_mb * 2**20 / per_client))
    held = max(clients, _held(population, k, rounds, per_pack, workers)) if k else 0.0
    bound = max(held, min(written, 2 * clients * per_pack)) if per_client else 0.0
    return ClientStateDisk(clients=clients, per_client=per_client,
                           expected=held * per_client, bound=bound * per_client)
