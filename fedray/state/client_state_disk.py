"""How much disk a stateful run's client state takes, known before round 1.

SCAFFOLD keeps a model-sized control variate for every client it has ever sampled, FedPer and
Ditto a personal model: on a population of thousands, a run's client state outgrows its
checkpoints by orders of magnitude, and a sweep multiplies it by its trials. The driver
prints this estimate when a stateful run starts and refuses a run whose expected size is
over ``runtime.client_state_mb``, before anything is written.

Two numbers, both from the config alone (no sampling is replayed):

- ``expected``: one current state per client that will have been sampled, the expected
  number of distinct clients in ``rounds`` draws of ``k`` from ``population`` without
  replacement within a round, ``N (1 - (1 - k/N)^R)`` (exact for fixed-size uniform
  sampling; poisson sampling has the same mean). This much stays on disk at the end.
- ``bound``: what the disk can hold at most on the way. A worker writes its round's states
  into shared packs (fedray.state.client_state), and a pack is deleted only once every
  state in it is superseded, so superseded states wait beside current ones; and the last
  checkpoint's states are kept until the next one. Each live pack holds at least one
  current or checkpointed state, of which there are at most ``2 x expected``, and at most
  ``per_pack`` states, so at most ``min(written, 2 x expected x per_pack)`` states are on
  disk, ``written`` being every state ever written (``R x k``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FLOAT_BYTES = {"float32": 4, "float16": 2}


@dataclass(frozen=True)
class ClientStateDisk:
    """A stateful run's client state on disk, in bytes (module docstring)."""

    clients: float  # expected distinct clients sampled over the run
    per_client: int  # bytes of one client's state
    expected: float  # clients x per_client: what stays at the end
    bound: float  # the most the state store can hold on the way

    def line(self, rounds: int, dtype: str = "float32") -> str:
        """The note a run prints when it starts."""
        return (f"client state on disk: about {_size(self.expected)} ({self.clients:,.0f} "
                f"clients sampled over {rounds} rounds x {_size(self.per_client)} each), at "
                f"most {_size(self.bound)} while shared state packs hold superseded states; "
                "runtime.client_state_mb sets a limit"
                + (", runtime.worker.state_dtype=float16 halves it" if dtype == "float32"
                   else ""))


def _size(n: float) -> str:
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


def estimate(population: int, k: int, rounds: int, values: int, dtype: str = "float32",
             pack_mb: float = 8.0) -> ClientStateDisk:
    """The disk of ``values`` floating values of state per client (``dtype`` as stored),
    ``k`` clients a round of ``population`` for ``rounds`` rounds, packs of ``pack_mb``
    MiB (0: a file per client, deleted as soon as it is superseded and not checkpointed)."""
    per_client = values * FLOAT_BYTES[dtype]
    clients = expected_clients(population, k, rounds)
    written = float(rounds) * min(k, population)
    per_pack = 1 if pack_mb <= 0 or per_client <= 0 else max(
        1, math.ceil(pack_mb * 2**20 / per_client))
    held = min(written, 2 * clients * per_pack) if per_client else 0.0
    return ClientStateDisk(clients=clients, per_client=per_client,
                           expected=clients * per_client, bound=max(held, clients) * per_client)
