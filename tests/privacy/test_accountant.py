"""fedray.privacy.accountant against dp_accounting used directly: the same events give the
same epsilon bit for bit; the limits (full participation, the exact Gaussian) agree with the
closed forms; epsilon moves the right way with noise and rounds; the noise search and the
per-run Accountant return what epsilon() says."""

from __future__ import annotations

import itertools
import math

import dp_accounting as dpa
import pytest

from fedray.privacy import accountant as A
from fedray.privacy.accountant import Accountant, epsilon, noise_multiplier_for

ADD_REMOVE = dpa.NeighboringRelation.ADD_OR_REMOVE_ONE
REPLACE = dpa.NeighboringRelation.REPLACE_ONE
# (population N, clients a round K, noise multiplier z, rounds, delta)
CASES = [(100_000, 1_000, 1.0, 100, 1e-6), (3_400, 50, 1.3, 37, 1e-5),
         (1_000, 100, 0.8, 5, 1e-3)]
# a PLD costs ~0.3 s to build: fewer cases for it
PLD_CASES = CASES[:2]
# PLDs are discretised every 1e-4 of privacy loss, rounded pessimistically; with
# connect-the-dots the epsilon they give is within a small fraction of one interval of the
# exact value (measured: <= 3e-6 up to 1000 rounds), so one interval bounds the difference
PLD_ERROR = 1e-4


def _mech(n: int, k: int, sampling: str, accountant: str = "rdp") -> dict:
    return {"sampling": sampling, "population": n, "clients_per_round": k,
            "accountant": accountant}


def _rdp(relation, event, rounds: int, delta: float) -> float:
    acc = dpa.rdp.RdpAccountant(neighboring_relation=relation)
    return acc.compose(dpa.SelfComposedDpEvent(event, rounds)).get_epsilon(delta)


def _pld(relation, event, rounds: int, delta: float) -> float:
    acc = dpa.pld.PLDAccountant(relation)  # its default discretisation, 1e-4
    return acc.compose(dpa.SelfComposedDpEvent(event, rounds)).get_epsilon(delta)


# --- the same events as dp_accounting, exactly ---------------------------------------------

@pytest.mark.parametrize("n,k,z,rounds,delta", CASES)
def test_rdp_equals_the_library(n, k, z, rounds, delta):
    """Poisson: sampled Gaussian, add/remove one client. Fixed: sampling without
    replacement, replace one client, the noise over the sum's move of 2C (z / 2). Local: a
    client's own Gaussian of z / 2, every round."""
    gauss = dpa.GaussianDpEvent
    want = {
        "poisson": _rdp(ADD_REMOVE, dpa.PoissonSampledDpEvent(k / n, gauss(z)), rounds, delta),
        "fixed": _rdp(REPLACE, dpa.SampledWithoutReplacementDpEvent(n, k, gauss(z / 2)),
                      rounds, delta),
        "local": _rdp(ADD_REMOVE, gauss(z / 2), rounds, delta),
    }
    for sampling, value in want.items():
        assert epsilon(z, rounds, delta, **_mech(n, k, sampling)) == value, sampling


@pytest.mark.parametrize("n,k,z,rounds,delta", PLD_CASES)
def test_pld_equals_the_library(n, k, z, rounds, delta):
    poisson = dpa.PoissonSampledDpEvent(k / n, dpa.GaussianDpEvent(z))
    assert (epsilon(z, rounds, delta, **_mech(n, k, "poisson", "pld"))
            == _pld(ADD_REMOVE, poisson, rounds, delta))
    # local: the exact curve of the composed Gaussian, which the PLD approximates
    exact = dpa.get_epsilon_gaussian(z / 2 / math.sqrt(rounds), delta)
    assert epsilon(z, rounds, delta, **_mech(n, k, "local", "pld")) == exact


def test_dp_event_is_the_documented_one():
    event = A.dp_event(1.5, 7, sampling="fixed", population=500, clients_per_round=20)
    assert event == dpa.SelfComposedDpEvent(
        dpa.SampledWithoutReplacementDpEvent(500, 20, dpa.GaussianDpEvent(0.75)), 7)
    assert A.neighbouring_relation("fixed") is REPLACE
    assert A.neighbouring_relation("poisson") is A.neighbouring_relation("local") is ADD_REMOVE


# --- limits with closed forms ----------------------------------------------------------------

def test_poisson_at_full_participation_is_the_plain_gaussian():
    """q = 1: no amplification; RDP takes the very same path (==), PLD is within its
    discretisation of the exact Gaussian (Balle and Wang's analytic epsilon), above it."""
    z, rounds, delta = 1.2, 20, 1e-5
    mech = _mech(300, 300, "poisson")
    assert epsilon(z, rounds, delta, **mech) == _rdp(ADD_REMOVE, dpa.GaussianDpEvent(z),
                                                     rounds, delta)
    pld = epsilon(z, rounds, delta, **{**mech, "accountant": "pld"})
    exact = dpa.get_epsilon_gaussian(z / math.sqrt(rounds), delta)
    assert -1e-9 <= pld - exact <= PLD_ERROR  # 1e-9: the analytic search's own tolerance


def test_fixed_at_full_participation_is_the_gaussian_of_twice_the_sensitivity():
    """K = N: every client every round, a neighbour replaces one: the sum moves by 2C, the
    Gaussian of z / 2 -- the same RDP as a client's local report (bit for bit: both take
    alpha / (2 sigma^2))."""
    z, rounds, delta = 1.2, 20, 1e-5
    fixed = epsilon(z, rounds, delta, **_mech(300, 300, "fixed"))
    assert fixed == epsilon(z, rounds, delta, **_mech(300, 300, "local"))
    assert fixed > epsilon(z, rounds, delta, **_mech(300, 300, "poisson"))


def test_local_pld_shortcut_is_what_the_pld_accountant_gives():
    """The exact curve stands in for PLDAccountant on the composed Gaussians (whose
    distribution grows with rounds / z^2); where the latter is cheap they agree within its
    discretisation. PLD under REPLACE_ONE moves a Gaussian by twice its sensitivity itself,
    which is why the local event is read under ADD_OR_REMOVE_ONE with z / 2."""
    z, rounds, delta = 4.0, 4, 1e-5  # sigma / sqrt(rounds) = 1: a small, cheap PLD
    ours = epsilon(z, rounds, delta, **_mech(10, 1, "local", "pld"))
    assert abs(_pld(ADD_REMOVE, dpa.GaussianDpEvent(z / 2), rounds, delta) - ours) <= PLD_ERROR
    assert abs(_pld(REPLACE, dpa.GaussianDpEvent(z), rounds, delta) - ours) <= PLD_ERROR
    rdp = epsilon(z, rounds, delta, **_mech(10, 1, "local"))
    assert ours < rdp  # RDP is an upper bound


def test_pld_cannot_account_fixed_sampling():
    event = A.dp_event(1.0, 3, sampling="fixed", population=100, clients_per_round=10)
    assert not dpa.pld.PLDAccountant(REPLACE).supports(event)
    with pytest.raises(ValueError, match="accountant 'rdp'"):
        epsilon(1.0, 3, 1e-5, **_mech(100, 10, "fixed", "pld"))


# --- direction, and the ends -----------------------------------------------------------------

@pytest.mark.parametrize("sampling,accountant", [("poisson", "rdp"), ("fixed", "rdp"),
                                                 ("local", "rdp"), ("poisson", "pld"),
                                                 ("local", "pld")])
def test_more_noise_less_epsilon_more_rounds_more(sampling, accountant):
    mech = _mech(10_000, 100, sampling, accountant)
    # a PLD or a fixed-size RDP costs 0.1-0.3 s a value: fewer of them
    slow = accountant == "pld" or sampling == "fixed"
    noises = (0.8, 1.6) if slow else (0.5, 0.8, 1.0, 2.0, 4.0)
    eps = [epsilon(z, 20, 1e-6, **mech) for z in noises]
    assert all(a > b for a, b in itertools.pairwise(eps)), eps
    acc = Accountant(1.0, 1e-6, **mech)
    eps = [acc.epsilon(r) for r in ((1, 30, 1000) if slow else (1, 10, 100, 1000))]
    assert all(a < b for a, b in itertools.pairwise(eps)), eps
    assert epsilon(1.0, 0, 1e-6, **mech) == 0.0 == acc.epsilon(0)
    assert epsilon(0.0, 5, 1e-6, **mech) == math.inf == Accountant(0.0, 1e-6, **mech).epsilon(5)


@pytest.mark.parametrize("change,name", [
    ({"noise_multiplier": -1.0}, "noise_multiplier"), ({"noise_multiplier": math.nan},
                                                       "noise_multiplier"),
    ({"rounds": -1}, "rounds"), ({"rounds": 2.5}, "rounds"), ({"delta": 0.0}, "delta"),
    ({"delta": 1.0}, "delta"), ({"population": 0}, "population"),
    ({"clients_per_round": 0}, "clients_per_round"),
    ({"clients_per_round": 101}, "clients_per_round"), ({"sampling": "uniform"}, "sampling"),
    ({"accountant": "moments"}, "accountant"),
    ({"accountant": "pld", "noise_multiplier": 0.1}, "noise_multiplier"),
])
def test_bad_arguments_are_named(change, name):
    args = {"noise_multiplier": 1.0, "rounds": 10, "delta": 1e-5, **_mech(100, 10, "poisson"),
            **change}
    with pytest.raises(ValueError) as err:
        epsilon(**args)
    msg = str(err.value)
    assert msg.startswith(name) and "\n" not in msg, msg
    rest = {k: v for k, v in args.items() if k != "rounds"}
    with pytest.raises(ValueError, match=f"^{name}"):  # at construction, or rounds at use
        Accountant(**rest).epsilon(args["rounds"])


def test_default_delta():
    assert A.default_delta(100_000) == 1 / 100_000 ** 1.1
    assert A.default_delta(100_000) < 1 / 100_000


# --- the noise search ------------------------------------------------------------------------

# (poisson with pld: the same search over another epsilon(), at ~0.3 s a step: left out)
@pytest.mark.parametrize("sampling,accountant", [("poisson", "rdp"), ("local", "rdp"),
                                                 ("local", "pld")])
def test_noise_for_an_epsilon_round_trips(sampling, accountant):
    """The z found meets the target, and z * (1 - tolerance) does not (the search's
    guarantee, exact given epsilon's monotonicity). Epsilon then sits just under the target:
    it falls roughly like 1 / z (a Gaussian's), so a relative step of tolerance in z moves
    it by about tolerance relative; 10x that as margin for the curve's bend."""
    target, rounds, delta = 2.0, 200, 1e-6
    mech = _mech(20_000, 200, sampling, accountant)
    tolerance = A.DEFAULT_TOLERANCE
    z = noise_multiplier_for(target, rounds, delta, **mech)
    eps = epsilon(z, rounds, delta, **mech)
    assert eps <= target
    assert epsilon(z * (1 - tolerance), rounds, delta, **mech) > target
    assert target - eps <= 10 * tolerance * target


def test_noise_search_limits():
    mech = _mech(100_000, 1_000, "poisson")
    assert noise_multiplier_for(1.0, 0, 1e-6, **mech) == 0.0  # nothing released
    with pytest.raises(ValueError, match="no noise multiplier up to"):
        noise_multiplier_for(1e-6, 1000, 1e-6, **mech)
    with pytest.raises(ValueError, match="met even with noise multiplier"):
        noise_multiplier_for(1e6, 1, 1e-6, **_mech(10, 1, "local"))
    with pytest.raises(ValueError, match="^target_epsilon"):
        noise_multiplier_for(0.0, 10, 1e-6, **mech)


# --- one run's accountant --------------------------------------------------------------------

@pytest.mark.parametrize("sampling,accountant", [("poisson", "rdp"), ("fixed", "rdp"),
                                                 ("local", "rdp"), ("poisson", "pld"),
                                                 ("local", "pld")])
def test_accountant_equals_epsilon_bit_for_bit(sampling, accountant):
    """Its shortcuts (RDP scaled by rounds, the cached one-round PLD) are the library's
    own computation; asked in any order, and again, it gives the same values."""
    mech = _mech(5_000, 50, sampling, accountant)
    acc = Accountant(1.1, 1e-5, **mech)
    # a PLD value, or one round of fixed-size RDP, costs 0.2-0.3 s
    rounds = (100, 1, 7, 100) if sampling == "local" or (sampling, accountant) == (
        "poisson", "rdp") else (100, 1, 100)
    want = {r: epsilon(1.1, r, 1e-5, **mech) for r in set(rounds)}
    assert [acc.epsilon(r) for r in rounds] == [want[r] for r in rounds]


def test_accountant_budget():
    acc = Accountant(1.0, 1e-6, **_mech(10_000, 100, "poisson"))
    budget = acc.epsilon(50)
    assert not acc.exceeds(budget, 50) and acc.exceeds(budget, 51)
    assert acc.rounds_within(budget, 1000) == 50
    assert acc.rounds_within(budget, 30) == 30
    assert acc.rounds_within(math.inf, 10) == 10 and acc.rounds_within(0.0, 10) == 0
    with pytest.raises(ValueError, match="^budget"):
        acc.exceeds(-1.0, 3)
