"""How much privacy a user-level DP-FedAvg run spends: epsilon after some rounds at a
given delta, and the noise a target epsilon needs.

The mechanism (McMahan et al. 2018, user-level DP-FedAvg): every client's update is
clipped to L2 norm C, and Gaussian noise of standard deviation ``z * C`` is added, z being
the noise multiplier. The accounting itself is Google's ``dp_accounting``; this module only
says which of its events a fedray run is, because that is where the subtle mistakes lie:

``poisson`` (central DP; DP-FedAvg's own sampling) -- every client takes part in a round
    with probability q = K / N, the noise goes on the round's sum of clipped updates and
    the denominator is fixed. Neighbouring datasets add or remove one client, so the sum
    moves by at most C: ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` under
    ADD_OR_REMOVE_ONE, the amplification by sampling that the privacy rests on.
``fixed`` (central DP) -- exactly K of N clients a round. dp_accounting accounts sampling
    without replacement only under REPLACE_ONE (its RDP accountant, after Wang, Balle and
    Kasiviswanathan 2019), where a neighbour swaps one client's data for another's: the sum
    then moves by up to 2C. Its RDP accountant reads a Gaussian's noise multiplier as the
    noise over that whole move (at q = 1 it returns alpha / (2 sigma^2)), so the event is
    ``SampledWithoutReplacementDpEvent(N, K, GaussianDpEvent(z / 2))``; passing z would
    understate the RDP fourfold. Its PLD accountant has no such event.
``local`` -- each client adds the noise to its own clipped update and the server knows who
    reported, so nothing is amplified: a client's report is a Gaussian mechanism whose
    input (any update of norm <= C) can move by 2C, i.e. ``GaussianDpEvent(z / 2)`` at unit
    sensitivity, composed once per round. That is an upper bound: it assumes the client
    reports every round. (Read under ADD_OR_REMOVE_ONE, where both of dp_accounting's
    accountants take a Gaussian event to move by one sensitivity; its PLD accountant under
    REPLACE_ONE would double the move itself.)

Two accountants: ``rdp`` (Renyi DP converted to (epsilon, delta); fast, but an upper bound
that can be several times the true epsilon after few rounds, and tens of percent above it
after many) and ``pld`` (privacy loss distributions;
tight up to a discretisation of 1e-4 in the privacy loss, but it builds and composes a
distribution, so it is slower and its memory grows quickly as z shrinks). For ``local``,
``pld`` uses the exact privacy curve of the composed Gaussian (``get_epsilon_gaussian``,
Balle and Wang 2018) -- what a PLD would approximate, without a distribution whose size
grows with rounds / z^2.
"""

from __future__ import annotations

import logging
import math
import numbers

import dp_accounting
import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

__all__ = ["ACCOUNTANTS", "SAMPLINGS", "Accountant", "default_delta", "dp_event", "epsilon",
           "neighbouring_relation", "noise_multiplier_for"]

def _drop_handled_warnings(record: logging.LogRecord) -> bool:
    """dp_accounting's RDP logs a warning line for each order whose series does not
    converge (q 0.1, z 1 at alpha 1.1 to 1.3, ordinary inputs) and then leaves that order
    out, as it should: the epsilon is still an upper bound. fedray prints only its result
    or one error line, so these lines are dropped; other warnings of the library pass."""
    return "failed to converge" not in str(record.msg)


logging.getLogger("absl").addFilter(_drop_handled_warnings)

ACCOUNTANTS = ("rdp", "pld")
SAMPLINGS = ("poisson", "fixed", "local")

# dp_accounting's PLDAccountant default, passed explicitly: Accountant rebuilds the same
# composition from a cached one-round distribution and must discretise it identically
PLD_DISCRETIZATION = 1e-4
# fedray's choice: below this the PLD of a Poisson-sampled Gaussian needs hundreds of MB to
# GBs (measured: z 0.1, q 0.1, 1000 rounds: 5 GB, 45 s), for epsilons far past any budget
PLD_MIN_NOISE = 0.3
MIN_NOISE = 0.01  # noise_multiplier_for's search floor (rdp, and pld with local noise)
MAX_NOISE = 1000.0  # and its ceiling
# the noise multipliers accounted (besides 0, no noise): dp_accounting's arithmetic is
# exact enough between these; below, its RDP divides by a z^2 that underflows to 0 (z
# 1e-300), above, it logs negative Renyi divergences and returns epsilon 0 (z 1e5) and then
# overflows (z 1e160), where epsilon is ~0 anyway
ACCOUNTED_NOISE = (1e-6, 1e4)
# rounds the PLD of a sampled Gaussian composes at most: its distribution grows with the
# rounds (z 1, q 0.1: 10^9 rounds would allocate 154 GiB); RDP composes any number
PLD_MAX_ROUNDS = 1_000_000
DEFAULT_TOLERANCE = 1e-4  # noise_multiplier_for: relative, 4 significant digits of z


def default_delta(population: int) -> float:
    """1 / N^1.1: fedray's choice of delta for N clients. A delta of 1/N would allow a
    mechanism that publishes one client's data outright; the exponent keeps delta well
    below that for any realistic population, however large."""
    _check_count("population", population, 1)
    return 1.0 / population ** 1.1


def neighbouring_relation(sampling: str) -> dp_accounting.NeighboringRelation:
    """The relation ``dp_event``'s event is accounted under (module docstring)."""
    _check_sampling(sampling)
    return (dp_accounting.NeighboringRelation.REPLACE_ONE if sampling == "fixed" else
            dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)


def dp_event(noise_multiplier: float, rounds: int, *, sampling: str, population: int,
             clients_per_round: int) -> dp_accounting.DpEvent:
    """``rounds`` rounds of the Gaussian mechanism with noise multiplier z under
    ``sampling``, as dp_accounting's event, to be accounted under
    ``neighbouring_relation(sampling)``. ``fixed`` and ``local`` carry z / 2: a
    neighbour moves a fixed-size sum, or a client's own report, by 2C (module docstring)."""
    _check_mechanism(noise_multiplier, rounds, sampling, population, clients_per_round)
    z = float(noise_multiplier)
    if sampling == "poisson":
        one: dp_accounting.DpEvent = dp_accounting.PoissonSampledDpEvent(
            clients_per_round / population, dp_accounting.GaussianDpEvent(z))
    elif sampling == "fixed":
        one = dp_accounting.SampledWithoutReplacementDpEvent(
            population, clients_per_round, dp_accounting.GaussianDpEvent(z / 2))
    else:
        one = dp_accounting.GaussianDpEvent(z / 2)
    return dp_accounting.SelfComposedDpEvent(one, int(rounds))


def epsilon(noise_multiplier: float, rounds: int, delta: float, *, sampling: str,
            population: int, clients_per_round: int, accountant: str = "rdp") -> float:
    """The epsilon, at ``delta``, that ``rounds`` rounds with noise multiplier z spend for
    every client: 0 for no rounds, infinite without noise.

    ``population`` and ``clients_per_round`` (N and K) give the sampling rate; ``local``
    noise ignores them (but checks them, so that a caller's mistake is not hidden)."""
    _check_all(noise_multiplier, rounds, delta, sampling, population, clients_per_round,
               accountant)
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    if accountant == "pld" and sampling == "local":
        return _local_exact(noise_multiplier, rounds, delta)
    acc = _new_accountant(accountant, sampling)
    acc.compose(dp_event(noise_multiplier, rounds, sampling=sampling, population=population,
                         clients_per_round=clients_per_round))
    return float(acc.get_epsilon(delta))


def noise_multiplier_for(target_epsilon: float, rounds: int, delta: float, *, sampling: str,
                         population: int, clients_per_round: int, accountant: str = "rdp",
                         tolerance: float = DEFAULT_TOLERANCE) -> float:
    """The smallest noise multiplier whose epsilon after ``rounds`` is <= ``target_epsilon``,
    to a relative ``tolerance``: bisection on z, which epsilon decreases in. The value
    returned always meets the target; z * (1 - tolerance) may not.

    Raises ValueError when no z in [MIN_NOISE (PLD_MIN_NOISE for pld with poisson
    sampling), MAX_NOISE] is the answer: the target is out of reach, or met by almost no
    noise at all."""
    if not (isinstance(target_epsilon, numbers.Real) and math.isfinite(target_epsilon)
            and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be > 0 and finite, got {target_epsilon!r}")
    if not (isinstance(tolerance, numbers.Real) and 0 < tolerance < 1):
        raise ValueError(f"tolerance must be in (0, 1), got {tolerance!r}")
    _check_all(1.0, rounds, delta, sampling, population, clients_per_round, accountant)
    if rounds == 0:
        return 0.0  # nothing released: no noise is needed

    def meets(z: float) -> bool:
        return epsilon(z, rounds, delta, sampling=sampling, population=population,
                       clients_per_round=clients_per_round, accountant=accountant
                       ) <= target_epsilon

    floor = PLD_MIN_NOISE if (accountant, sampling) == ("pld", "poisson") else MIN_NOISE
    # bracket: meets(hi) and not meets(lo), by doubling or halving from 1
    lo, hi = 1.0, 1.0
    if meets(hi):
        while True:
            lo = hi / 2
            if lo <= floor:
                if meets(floor):
                    raise ValueError(
                        f"epsilon {target_epsilon:g} is met even with noise multiplier "
                        f"{floor:g}, the least this search tries ({accountant}); a target "
                        f"this large protects next to nothing")
                lo = floor
                break
            if not meets(lo):
                break
            hi = lo
    else:
        while True:
            hi = min(lo * 2, MAX_NOISE)
            if meets(hi):
                break
            if hi == MAX_NOISE:
                raise ValueError(
                    f"no noise multiplier up to {MAX_NOISE:g} reaches epsilon "
                    f"{target_epsilon:g} after {rounds} rounds; allow a larger epsilon or "
                    f"delta, fewer rounds or a lower sampling rate")
            lo = hi
    while hi - lo > tolerance * hi:
        mid = (lo + hi) / 2
        if meets(mid):
            hi = mid
        else:
            lo = mid
    return hi


class Accountant:
    """One run's accountant, built once with the run's mechanism and asked for epsilon
    after each round.

    Equal, bit for bit, to ``epsilon()`` with the same arguments, but cheaper where the
    library allows: RDP composes linearly, so the one-round RDP curve is computed once and
    scaled by the number of rounds (what dp_accounting itself does for a self-composed
    event); ``pld`` keeps the one-round privacy loss distribution (most of its cost) and
    recomputes the composition over all rounds on each new call (tenths of a second),
    since a PLD is not linear in rounds. Values are cached per number of rounds."""

    def __init__(self, noise_multiplier: float, delta: float, *, sampling: str,
                 population: int, clients_per_round: int, accountant: str = "rdp") -> None:
        _check_all(noise_multiplier, 0, delta, sampling, population, clients_per_round,
                   accountant)
        self.noise_multiplier = float(noise_multiplier)
        self.delta = float(delta)
        self.sampling = sampling
        self.population = int(population)
        self.clients_per_round = int(clients_per_round)
        self.accountant = accountant
        self._cache: dict[int, float] = {0: 0.0}
        self._orders: np.ndarray | None = None
        self._rdp_one: np.ndarray | None = None
        self._pld_one: pld_lib.PrivacyLossDistribution | None = None

    def epsilon(self, rounds: int) -> float:
        """Epsilon at ``self.delta`` after ``rounds`` rounds."""
        _check_count("rounds", rounds, 0)
        _check_pld_rounds(self.accountant, self.sampling, rounds)
        rounds = int(rounds)
        if rounds not in self._cache:
            self._cache[rounds] = self._compute(rounds)
        return self._cache[rounds]

    def exceeds(self, budget: float, rounds: int) -> bool:
        """Whether ``rounds`` rounds spend more than an epsilon ``budget``: asked before
        round r + 1 with rounds = r + 1, it says whether that round must not run."""
        _check_budget(budget)
        return self.epsilon(rounds) > budget

    def rounds_within(self, budget: float, limit: int) -> int:
        """The most rounds, up to ``limit``, whose epsilon stays within ``budget``
        (bisection: epsilon grows with rounds)."""
        _check_budget(budget)
        _check_count("limit", limit, 0)
        if self.epsilon(limit) <= budget:
            return int(limit)
        lo, hi = 0, int(limit)  # epsilon(lo) <= budget < epsilon(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.epsilon(mid) <= budget else (lo, mid)
        return lo

    def _compute(self, rounds: int) -> float:
        if rounds == 0:
            return 0.0
        z = self.noise_multiplier
        if z == 0:
            return math.inf
        if self.accountant == "pld" and self.sampling == "local":
            return _local_exact(z, rounds, self.delta)
        if self.accountant == "rdp":
            if self._rdp_one is None:
                acc = _new_accountant("rdp", self.sampling)
                acc.compose(dp_event(z, 1, sampling=self.sampling, population=self.population,
                                     clients_per_round=self.clients_per_round))
                self._orders, self._rdp_one = acc.orders, acc.rdp
            # RdpAccountant.get_epsilon after composing the event `rounds` times: its RDP
            # is 0 + rounds * (one round's), and adding 0 changes no float
            eps, _ = rdp_lib.compute_epsilon(self._orders, rounds * self._rdp_one, self.delta)
            return float(eps)
        # pld, poisson: PLDAccountant's steps for PoissonSampledDpEvent composed `rounds`
        # times, with the one-round distribution built once
        if self._pld_one is None:
            self._pld_one = pld_lib.from_gaussian_mechanism(
                standard_deviation=z, value_discretization_interval=PLD_DISCRETIZATION,
                sampling_prob=self.clients_per_round / self.population,
                neighboring_relation=neighbouring_relation(self.sampling))
        pld = pld_lib.identity(value_discretization_interval=PLD_DISCRETIZATION)
        pld = pld.compose(self._pld_one.self_compose(rounds))
        return float(pld.get_epsilon_for_delta(self.delta))


# --- the library's accountants -------------------------------------------------------------

def _new_accountant(accountant: str, sampling: str) -> dp_accounting.PrivacyAccountant:
    relation = neighbouring_relation(sampling)
    if accountant == "rdp":
        return dp_accounting.rdp.RdpAccountant(neighboring_relation=relation)
    return dp_accounting.pld.PLDAccountant(relation,
                                           value_discretization_interval=PLD_DISCRETIZATION)


def _local_exact(noise_multiplier: float, rounds: int, delta: float) -> float:
    """r compositions of a unit-sensitivity Gaussian of standard deviation s have the
    privacy curve of one Gaussian of standard deviation s / sqrt(r); its exact epsilon."""
    sigma = noise_multiplier / 2 / math.sqrt(rounds)
    with np.errstate(divide="ignore"):  # its log1p(-1) = -inf at a tiny sigma is meant
        return float(dp_accounting.get_epsilon_gaussian(sigma, delta))


# --- checks: one-line ValueErrors that name the argument -----------------------------------

def _check_count(name: str, value: object, least: int) -> None:
    if not (isinstance(value, numbers.Integral) and not isinstance(value, bool)
            and value >= least):
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")


def _check_sampling(sampling: str) -> None:
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {sampling!r}")


def _check_budget(budget: float) -> None:
    if not (isinstance(budget, numbers.Real) and budget >= 0):  # NaN fails too
        raise ValueError(f"budget must be a number >= 0, got {budget!r}")


def _check_mechanism(noise_multiplier: float, rounds: int, sampling: str, population: int,
                     clients_per_round: int) -> None:
    z = noise_multiplier
    if not (isinstance(z, numbers.Real) and math.isfinite(z) and z >= 0):
        raise ValueError(f"noise_multiplier must be >= 0 and finite, got {z!r}")
    lo, hi = ACCOUNTED_NOISE
    if z != 0 and not lo <= z <= hi:
        raise ValueError(f"noise_multiplier must be 0 or in [{lo:g}, {hi:g}] (the range "
                         f"dp_accounting computes reliably), got {z!r}")
    _check_count("rounds", rounds, 0)
    _check_sampling(sampling)
    _check_count("population", population, 1)
    _check_count("clients_per_round", clients_per_round, 1)
    if clients_per_round > population:
        raise ValueError(f"clients_per_round must be <= population ({population}), got "
                         f"{clients_per_round}")


def _check_all(noise_multiplier: float, rounds: int, delta: float, sampling: str,
               population: int, clients_per_round: int, accountant: str) -> None:
    _check_mechanism(noise_multiplier, rounds, sampling, population, clients_per_round)
    if not (isinstance(delta, numbers.Real) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {', '.join(ACCOUNTANTS)}, got "
                         f"{accountant!r}")
    if (accountant, sampling) == ("pld", "fixed"):
        raise ValueError("accountant 'pld' cannot account sampling 'fixed': dp_accounting's "
                         "PLD accountant has no sampling without replacement; use accountant "
                         "'rdp', or sampling 'poisson'")
    _check_pld_rounds(accountant, sampling, rounds)
    if (accountant, sampling) == ("pld", "poisson") and 0 < noise_multiplier < PLD_MIN_NOISE:
        raise ValueError(f"noise_multiplier below {PLD_MIN_NOISE:g} is refused by accountant "
                         f"'pld' (its distribution would need GBs of memory); use accountant "
                         f"'rdp', got {noise_multiplier!r}")


def _check_pld_rounds(accountant: str, sampling: str, rounds: int) -> None:
    if (accountant, sampling) == ("pld", "poisson") and rounds > PLD_MAX_ROUNDS:
        raise ValueError(f"accountant 'pld' composes at most {PLD_MAX_ROUNDS:,} rounds (its "
                         f"distribution grows with them); use accountant 'rdp', got {rounds!r}")
