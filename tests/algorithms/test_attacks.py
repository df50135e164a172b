"""The poisoning attacks of fedray.algorithms.attacks, each against its formula on a hand-made
round (no runtime, no Ray): what a malicious client trains on (label_flip, backdoor), what it
sends (sign_flip, scaling, noise), and the malicious rows an omniscient attacker writes from
the benign ones (alie, ipm), checked against independent NumPy float64 references."""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest
import torch

from fedray.algorithms.attacks import (
    Alie,
    AlieParams,
    Backdoor,
    BackdoorParams,
    Ipm,
    IpmParams,
    LabelFlip,
    LabelFlipParams,
    Noise,
    NoiseParams,
    Scaling,
    ScalingParams,
    SignFlip,
    SignFlipParams,
    alie_z,
    image_dims,
)
from fedray.algorithms.base import ClientContext, ClientRows, LocalUpdate, ParamError
from fedray.core.seeding import TAG_ATTACK, derive_seed
from fedray.core.tensors import readonly_tensor

F32_EPS = float(np.finfo(np.float32).eps)


def _ctx(x: np.ndarray, y: np.ndarray, seed: int = 1234, cid: int = 3) -> ClientContext:
    """A client's round as a worker hands it to the attack: read-only tensors over the
    store's arrays."""
    return ClientContext(cid, 2, seed, readonly_tensor(x), readonly_tensor(y), 4)


def _update(delta: np.ndarray) -> LocalUpdate:
    return LocalUpdate(delta=torch.from_numpy(delta), num_examples=10, loss_sum=1.0,
                       examples_seen=10, steps=3)


# -- label_flip ---------------------------------------------------------------------------

def test_label_flip_all_to_one_relabels_every_example_and_keeps_the_inputs():
    g = np.random.default_rng(0)
    x, y = g.normal(size=(30, 5)).astype(np.float32), g.integers(0, 4, 30)
    x0, y0 = x.copy(), y.copy()
    attack = LabelFlip(LabelFlipParams(mode="all_to_one", target=2))
    attack.check_data((5,), 4)
    ctx = _ctx(x, y)
    attack.poison_data(None, ctx)
    assert ctx.y.tolist() == [2] * 30 and ctx.y.dtype == torch.int64
    assert torch.equal(ctx.x, torch.from_numpy(x0))
    np.testing.assert_array_equal(y, y0)  # the store's labels are not written to


def test_label_flip_random_changes_every_label_reproducibly_per_seed():
    classes, n = 4, 3000
    y = np.random.default_rng(1).integers(0, classes, n)
    x = np.zeros((n, 2), np.float32)
    attack = LabelFlip(LabelFlipParams(mode="random"))
    attack.check_data((2,), classes)

    def flipped(seed: int) -> np.ndarray:
        ctx = _ctx(x, y, seed=seed)
        attack.poison_data(None, ctx)
        return ctx.y.numpy()

    new = flipped(77)
    assert ((new >= 0) & (new < classes)).all()
    assert (new != y).all()  # every label changed
    np.testing.assert_array_equal(flipped(77), new)  # the client's round seed fixes the draw
    assert (flipped(78) != new).mean() > 0.5  # another seed: another draw (2/3 differ)
    # uniform over the other classes: each (true, new) pair about 1/3 of a true class's
    # labels; n/4 labels a class, so a cell's count has sd sqrt(n/4 * 1/3 * 2/3) ~ 12.9 and
    # 6 sd (77) leaves room for all 12 cells without flakiness
    for c in range(classes):
        got = np.bincount(new[y == c], minlength=classes)
        assert got[c] == 0
        expect = (y == c).sum() / (classes - 1)
        assert np.abs(got[np.arange(classes) != c] - expect).max() < 6 * np.sqrt(
            expect * 2 / 3)


def test_label_flip_refuses_a_target_the_data_lacks():
    attack = LabelFlip(LabelFlipParams(target=3))
    with pytest.raises(ParamError, match=r"target: must be a class of the data \(0\.\.2\)"):
        attack.check_data((5,), 3)
    with pytest.raises(ParamError, match="mode: must be one of: all_to_one, random"):
        LabelFlip(LabelFlipParams(mode="some"))


# -- backdoor -------------------------------------------------------------------------------

def _corner(height: int, width: int, pattern: str, size: int) -> np.ndarray:
    """The trigger drawn by hand: one pixel in from the bottom-right corner, so its last row
    and column are height - 2 and width - 2."""
    rows, cols = range(height - 1 - size, height - 1), range(width - 1 - size, width - 1)
    mask = np.zeros((height, width), bool)
    if pattern == "square":
        for r in rows:
            for c in cols:
                mask[r, c] = True
    else:  # a plus: the middle row and the middle column of the square
        mid = size // 2
        mask[rows[mid], list(cols)] = True
        mask[list(rows), cols[mid]] = True
    return mask


@pytest.mark.parametrize("shape, pattern", [
    ((784,), "square"), ((1, 28, 28), "plus"), ((3, 32, 32), "square"), ((3, 32, 32), "plus"),
])
def test_backdoor_triggers_round_fraction_n_examples_and_nothing_else(shape, pattern):
    n, fraction, value, target = 42, 0.3, 2.5, 1
    g = np.random.default_rng(5)
    x = g.normal(size=(n, *shape)).astype(np.float32)  # no pixel is 2.5 by chance
    y = g.integers(0, 10, n)
    x0, y0 = x.copy(), y.copy()
    attack = Backdoor(BackdoorParams(target=target, poison_fraction=fraction,
                                     trigger=pattern, size=4, value=value))
    attack.check_data(shape, 10)
    ctx = _ctx(x, y, seed=99)
    attack.poison_data(None, ctx)
    new_x, new_y = ctx.x.numpy(), ctx.y.numpy()
    assert new_x.shape == x.shape and new_y.shape == y.shape
    np.testing.assert_array_equal(x, x0)  # the store's arrays are not written to
    np.testing.assert_array_equal(y, y0)
    changed = np.flatnonzero((new_x != x0).reshape(n, -1).any(1))
    assert len(changed) == round(fraction * n) == 13  # 12.6: rounded, not truncated
    side = 28 if shape[-1] in (28, 784) else 32
    mask = _corner(side, side, pattern, 4)
    channels = 3 if len(shape) == 3 and shape[0] == 3 else 1
    pixel = np.broadcast_to(mask, (channels, side, side)).reshape(-1)  # every channel alike
    flat_new, flat_old = new_x.reshape(n, -1), x0.reshape(n, -1)
    assert (flat_new[changed][:, pixel] == value).all()
    np.testing.assert_array_equal(flat_new[changed][:, ~pixel], flat_old[changed][:, ~pixel])
    assert (new_y[changed] == target).all()
    rest = np.setdiff1d(np.arange(n), changed)
    np.testing.assert_array_equal(new_x[rest], x0[rest])
    np.testing.assert_array_equal(new_y[rest], y0[rest])
    # the examples triggered are the client's round seed's: the same again, others with
    # another seed
    again = _ctx(x, y, seed=99)
    attack.poison_data(None, again)
    assert torch.equal(again.x, ctx.x) and torch.equal(again.y, ctx.y)
    other = _ctx(x, y, seed=100)
    attack.poison_data(None, other)
    assert not torch.equal(other.x, ctx.x)


def test_backdoor_value_unset_is_the_test_sets_extreme_farthest_from_its_mean():
    g = np.random.default_rng(2)
    # MNIST-like: a black background (0) with some white ink (1): the mean is near 0
    mnist = np.where(g.random((20, 1, 28, 28)) < 0.15, 1.0, 0.0).astype(np.float32)
    # FEMNIST-like: a white background (1) with dark ink (0): the mean is near 1
    femnist = 1.0 - mnist
    for test_x, want in ((mnist, 1.0), (femnist, 0.0)):
        attack = Backdoor(BackdoorParams(poison_fraction=1.0))
        attack.check_data((1, 28, 28), 10, test_x)
        x = np.full((3, 1, 28, 28), 0.5, np.float32)
        ctx = _ctx(x, np.array([3, 4, 5]))
        attack.poison_data(None, ctx)
        drawn = ctx.x.numpy().reshape(3, -1)[:, _corner(28, 28, "square", 4).reshape(-1)]
        assert (drawn == want).all(), want
    # no central test set: white (1.0)
    attack = Backdoor(BackdoorParams(poison_fraction=1.0))
    attack.check_data((784,), 10, None)
    ctx = _ctx(np.zeros((2, 784), np.float32), np.array([3, 4]))
    attack.poison_data(None, ctx)
    assert ctx.x.numpy().max() == 1.0 and int((ctx.x.numpy() == 1.0).sum()) == 2 * 16


def test_backdoor_test_set_is_the_other_classes_triggered_and_labelled_target():
    g = np.random.default_rng(3)
    x = g.normal(size=(50, 1, 28, 28)).astype(np.float32)
    y = g.integers(0, 5, 50)
    x0 = x.copy()
    attack = Backdoor(BackdoorParams(target=2, value=-3.0, trigger="plus", size=3))
    attack.check_data((1, 28, 28), 5, x)
    tx, ty = attack.poison_test(x, y)
    other = y != 2
    assert 0 < other.sum() < 50 and len(ty) == len(tx) == other.sum()
    assert (ty == 2).all() and ty.dtype == y.dtype
    mask = _corner(28, 28, "plus", 3)
    assert (tx[:, 0][:, mask] == -3.0).all()
    np.testing.assert_array_equal(tx[:, 0][:, ~mask], x0[other][:, 0][:, ~mask])
    np.testing.assert_array_equal(x, x0)


def test_backdoor_rounds_a_small_share_to_no_example_and_refuses_non_images():
    attack = Backdoor(BackdoorParams(poison_fraction=0.1, value=1.0))
    attack.check_data((784,), 10)
    x, y = np.zeros((4, 784), np.float32), np.array([1, 2, 3, 4])
    ctx = _ctx(x, y)
    attack.poison_data(None, ctx)  # round(0.4) = 0: the client trains on its own data
    assert ctx.x.numpy().sum() == 0 and ctx.y.tolist() == [1, 2, 3, 4]
    assert image_dims((5,)) is None and image_dims((16,)) == (4, 4)
    assert image_dims((3, 32, 30)) == (32, 30) and image_dims((28, 28)) == (28, 28)
    with pytest.raises(ParamError, match=r"trigger: draws on images; the inputs have shape "
                                         r"\(5,\)"):
        Backdoor().check_data((5,), 3)
    with pytest.raises(ParamError, match="size: must leave the trigger inside the 4 x 4"):
        Backdoor(BackdoorParams(size=4)).check_data((16,), 3)
    with pytest.raises(ParamError, match=r"target: must be a class of the data \(0\.\.9\)"):
        Backdoor(BackdoorParams(target=10)).check_data((784,), 10)


# -- update attacks -------------------------------------------------------------------------

@pytest.mark.parametrize("attack, factor", [
    (SignFlip(SignFlipParams(scale=2.5)), -2.5),
    (SignFlip(), -1.0),
    (Scaling(ScalingParams(boost=10.0)), 10.0),
])
def test_sign_flip_and_scaling_send_a_multiple_of_the_update(attack, factor):
    delta = np.random.default_rng(4).normal(size=37).astype(np.float32)
    update = _update(delta.copy())
    original = update.delta
    attack.poison_update(None, _ctx(np.zeros((1, 1), np.float32), np.zeros(1)), update)
    # exact: the factor is a float32 number, and the float64 product of two float32
    # numbers is exact, so rounding it once to float32 is what the float32 multiply does
    want = (factor * delta.astype(np.float64)).astype(np.float32)
    np.testing.assert_array_equal(update.delta.numpy(), want)
    assert update.delta.dtype == torch.float32
    np.testing.assert_array_equal(original.numpy(), delta)  # a new tensor, not in place


@pytest.mark.parametrize("add", [False, True])
def test_noise_is_the_attack_streams_gaussian(add):
    std, seed, d = 0.7, 4321, 5000
    delta = np.random.default_rng(6).normal(size=d).astype(np.float32)
    update = _update(delta.copy())
    Noise(NoiseParams(std=std, add=add)).poison_update(
        None, _ctx(np.zeros((1, 1), np.float32), np.zeros(1), seed=seed), update)
    gen = torch.Generator().manual_seed(derive_seed(seed, TAG_ATTACK, 1))
    noise = torch.randn(d, generator=gen, dtype=torch.float32) * std
    want = torch.from_numpy(delta) + noise if add else noise
    assert torch.equal(update.delta, want)
    drawn = (update.delta.numpy() - (delta if add else 0)).astype(np.float64)
    # N(0, std^2) per coordinate: the sample sd of 5000 draws is within 5% of std (its
    # relative sd is 1/sqrt(2d) = 1%)
    assert abs(drawn.std() / std - 1) < 0.05 and abs(drawn.mean()) < 5 * std / np.sqrt(d)
    other = _update(delta.copy())
    Noise(NoiseParams(std=std, add=add)).poison_update(
        None, _ctx(np.zeros((1, 1), np.float32), np.zeros(1), seed=seed + 1), other)
    assert not torch.equal(other.delta, update.delta)


# -- omniscient attacks ---------------------------------------------------------------------

def _round(k: int = 10, d: int = 23, seed: int = 7) -> tuple[np.ndarray, ClientRows]:
    """A round's individual updates, of varied scale per coordinate, and who they are."""
    g = np.random.default_rng(seed)
    rows = (g.normal(size=(k, d)) * g.uniform(0.01, 5, d) + g.normal(size=d)).astype(
        np.float32)
    clients = ClientRows(torch.arange(k) * 3, torch.full((k,), 10, dtype=torch.int64),
                         torch.zeros(k, dtype=torch.float64))
    return rows, clients


def _rewrite(attack, rows: np.ndarray, clients: ClientRows, bad: np.ndarray) -> np.ndarray:
    updates = torch.from_numpy(rows.copy())
    attack.poison_rows(updates, torch.from_numpy(bad), clients, 5, 2)
    assert updates.dtype == torch.float32
    return updates.numpy()


def _reference_stats(rows: np.ndarray, bad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NumPy float64: the benign rows' mean and population sd (every row's if none is)."""
    benign = rows[~bad] if (~bad).any() else rows
    benign = benign.astype(np.float64)
    return benign.mean(0), np.sqrt(((benign - benign.mean(0)) ** 2).mean(0))


def _close_to_float64(got: np.ndarray, want: np.ndarray, scale: np.ndarray) -> None:
    """float32 rows against a float64 reference: the attack computes mu and sigma in float64
    (another summation order than NumPy's: ~1e-16 relative of |mu| + z sigma) and rounds
    its result to float32 once (half an ulp of it, <= eps/2 of |mu| + z sigma). One float32
    ulp of that scale per coordinate covers both; a wrong formula (a sample sd, another z,
    a malicious row among the benign ones) is off by 1e-2 of it or more."""
    np.testing.assert_array_less(np.abs(got.astype(np.float64) - want), F32_EPS * scale + 1e-300)


def test_alie_z_is_the_papers_bound():
    # n = 10, m = 2: s = floor(10/2 + 1) - 2 = 4 supporters, z = Phi^-1((10 - 4)/10)
    assert alie_z(10, 2) == pytest.approx(0.2533471031357997, abs=1e-12)
    assert alie_z(10, 2) == pytest.approx(0.2533471, abs=1e-7)
    assert alie_z(10, 0) == 0.0  # s = 6 > n/2: (n - s)/n = 0.4, clamped to the median
    assert alie_z(10, 8) == pytest.approx(NormalDist().inv_cdf(1 - 1e-6))  # s < 0: capped
    assert alie_z(50, 12) == pytest.approx(NormalDist().inv_cdf((50 - 14) / 50))


@pytest.mark.parametrize("z", [None, 1.5, 0.0])
def test_alie_rows_are_mu_minus_z_sigma_of_the_benign_rows(z):
    rows, clients = _round()
    bad = np.zeros(10, bool)
    bad[[1, 4, 8]] = True
    got = _rewrite(Alie(AlieParams(z=z)), rows, clients, bad)
    mu, sigma = _reference_stats(rows, bad)
    # unset: n = 10, m = 3, s = floor(10/2 + 1) - 3 = 3 supporters, z = Phi^-1(7/10)
    zz = NormalDist().inv_cdf(0.7) if z is None else z
    want = mu - zz * sigma
    for i in np.flatnonzero(bad):
        _close_to_float64(got[i], want, np.abs(mu) + zz * sigma)
    np.testing.assert_array_equal(got[~bad], rows[~bad])  # benign rows untouched


def test_alie_with_two_of_ten_uses_the_hand_z():
    rows, clients = _round()
    bad = np.zeros(10, bool)
    bad[[0, 9]] = True
    got = _rewrite(Alie(), rows, clients, bad)
    mu, sigma = _reference_stats(rows, bad)
    z = 0.2533471031357997  # n = 10, m = 2 (test_alie_z_is_the_papers_bound)
    _close_to_float64(got[0], mu - z * sigma, np.abs(mu) + z * sigma)
    np.testing.assert_array_equal(got[0], got[9])
    np.testing.assert_array_equal(got[1:9], rows[1:9])


def test_alie_and_ipm_in_an_all_malicious_round_use_every_row():
    rows, clients = _round(k=6)
    bad = np.ones(6, bool)
    mu = rows.astype(np.float64).mean(0)
    sigma = rows.astype(np.float64).std(0)
    z = NormalDist().inv_cdf(1 - 1e-6)  # m = n: s < 0, the share capped below 1
    got = _rewrite(Alie(), rows, clients, bad)
    for i in range(6):
        _close_to_float64(got[i], mu - z * sigma, np.abs(mu) + z * sigma)
    got = _rewrite(Ipm(IpmParams(epsilon=0.5)), rows, clients, bad)
    for i in range(6):
        _close_to_float64(got[i], -0.5 * mu, 0.5 * np.abs(mu))


@pytest.mark.parametrize("epsilon", [0.1, 3.0])
def test_ipm_rows_are_minus_epsilon_times_the_benign_mean(epsilon):
    rows, clients = _round(k=8)
    bad = np.array([False, True, False, False, True, False, False, False])
    got = _rewrite(Ipm(IpmParams(epsilon=epsilon)), rows, clients, bad)
    mu, _ = _reference_stats(rows, bad)
    for i in np.flatnonzero(bad):
        _close_to_float64(got[i], -epsilon * mu, epsilon * np.abs(mu))
    np.testing.assert_array_equal(got[~bad], rows[~bad])


@pytest.mark.parametrize("attack", [Alie(), Ipm()], ids=["alie", "ipm"])
def test_a_round_without_attackers_is_left_alone(attack):
    rows, clients = _round(k=5)
    got = _rewrite(attack, rows, clients, np.zeros(5, bool))
    np.testing.assert_array_equal(got, rows)


@pytest.mark.parametrize("make, message", [
    (lambda: SignFlip(SignFlipParams(scale=0)), "scale: must be > 0"),
    (lambda: Scaling(ScalingParams(boost=float("inf"))), "boost: must be > 0"),
    (lambda: Noise(NoiseParams(std=-1.0)), "std: must be > 0"),
    (lambda: Alie(AlieParams(z=-0.5)), "z: must be >= 0"),
    (lambda: Ipm(IpmParams(epsilon=0)), "epsilon: must be > 0"),
    (lambda: Backdoor(BackdoorParams(poison_fraction=0)), r"poison_fraction: must be in \(0, 1\]"),
    (lambda: Backdoor(BackdoorParams(trigger="x")), "trigger: must be one of: square, plus"),
    (lambda: LabelFlip(LabelFlipParams(target=-1)), "target: must be a class index >= 0"),
])
def test_hyper_parameters_are_checked(make, message):
    with pytest.raises(ParamError, match=message):
        make()
