"""data.per_client: a client's feature shift is a pure function of (seed, client_id) and its
stored data -- the same in every round, on any worker, at any worker count -- applied to its
training data and to its own test split (never to the central test set)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from tolerance import f32_atol, merge_ulps

import fedray
from fedray.algorithms.registry import resolve
from fedray.config import ServerConfig, load_config, validate
from fedray.core.evaluation import evaluate
from fedray.core.models import build_model
from fedray.data.transforms.per_client import (
    PerClient,
    Shift,
    check_data,
    draw_shift,
    noise_draws,
    parse_per_client,
    rotate,
    shift_inputs,
)
from fedray.data.transforms.per_round import PerRound, apply_per_round
from fedray.errors import ConfigError
from fedray.runtime.worker import ClientWorker, LocalTraining, WorkerResources, WorkerSpec

SHAPE = (1, 8, 8)
C = 4
ALL = PerClient(rotation=30.0, contrast=(0.5, 1.5), brightness=0.2, noise=0.3)


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, *SHAPE), dtype=np.float32)


# -- the shift itself ---------------------------------------------------------------------

def test_off_is_no_section_and_changes_nothing():
    """Every option at its default is no shift at all (the worker then reads the store as
    before); a client whose draws are the identity gets its own array back, bit for bit."""
    assert parse_per_client(load_config(None).data.per_client) is None
    assert parse_per_client(None) is None
    assert parse_per_client({"domains": 3, "clip": [0.0, 1.0]}) is None  # nothing to shift
    x = _images(5)
    off = PerClient(contrast=(1.0, 1.0))
    assert draw_shift(off, 0, 3) == Shift()
    assert shift_inputs(off, 0, 3, "train", x) is x


def test_a_pure_function_of_seed_and_client():
    x = _images(20)
    a = shift_inputs(ALL, 7, 3, "train", x)
    b = shift_inputs(ALL, 7, 3, "train", x.copy())
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.float32 and a.shape == x.shape
    assert not np.array_equal(a, x)
    np.testing.assert_array_equal(x, _images(20))  # the input is not changed
    # another seed draws another shift; another split the same one with other noise
    assert draw_shift(ALL, 8, 3) != draw_shift(ALL, 7, 3)
    assert not np.array_equal(shift_inputs(ALL, 7, 3, "test", x), a)
    assert draw_shift(ALL, 7, 3) == draw_shift(ALL, 7, 3)


def test_clients_draw_different_shifts_in_range():
    shifts = [draw_shift(ALL, 0, cid) for cid in range(50)]
    assert len({s.angle for s in shifts}) == 50
    assert all(-30 <= s.angle <= 30 and 0.5 <= s.contrast <= 1.5 and abs(s.brightness) <= 0.2
               and 0 <= s.noise_std <= 0.3 for s in shifts)
    # uniform draws cover their ranges (50 draws: each half holds some)
    assert min(s.angle for s in shifts) < -10 and max(s.angle for s in shifts) > 10
    # each option's own stream: switching another on leaves a client's angle as it was
    assert draw_shift(PerClient(rotation=30.0), 0, 4).angle == shifts[4].angle


def test_domains_share_a_shift_but_not_the_noise():
    spec = PerClient(rotation=45.0, noise=0.2, domains=3)
    s = {cid: draw_shift(spec, 0, cid) for cid in range(9)}
    assert s[0] == s[3] == s[6] and s[1] == s[4] and s[2] == s[8]
    assert len({s[d].angle for d in range(3)}) == 3
    x = _images(6)
    a, b = (shift_inputs(spec, 0, cid, "train", x) for cid in (0, 3))
    assert not np.array_equal(a, b)  # one domain's std, each client's own noise
    np.testing.assert_array_equal(rotate(x, s[0].angle), rotate(x, s[3].angle))


@pytest.mark.parametrize("k", [1, 2, 3, -1])
def test_rotation_by_quarter_turns_is_rot90(k):
    x = np.random.default_rng(1).random((3, 2, 6, 6), dtype=np.float32)
    np.testing.assert_array_equal(rotate(x, 90 * k), np.rot90(x, k, axes=(2, 3)))


def test_rotation_of_a_rectangle_and_by_small_angles():
    x = np.random.default_rng(2).random((2, 3, 5, 7), dtype=np.float32)
    np.testing.assert_array_equal(rotate(x, 180), x[:, :, ::-1, ::-1])
    np.testing.assert_array_equal(rotate(x, 0), x)
    # a bilinear turn keeps values within the image's range and moves them
    out = rotate(x, 17.0)
    assert out.min() >= x.min() and out.max() <= x.max() and not np.array_equal(out, x)
    # a point on the horizontal axis moves counter-clockwise (up the image) for +90
    img = np.zeros((1, 1, 5, 5), np.float32)
    img[0, 0, 2, 4] = 1.0  # right of centre
    assert rotate(img, 90)[0, 0, 0, 2] == 1.0  # above centre


def test_contrast_scales_about_each_examples_mean():
    x = _images(8)
    spec = PerClient(contrast=(0.3, 0.3))
    out = shift_inputs(spec, 0, 1, "train", x)
    mean = x.reshape(8, -1).mean(1)
    np.testing.assert_allclose(out.reshape(8, -1).mean(1), mean, rtol=0, atol=1e-6)
    np.testing.assert_allclose(out - mean[:, None, None, None],
                               0.3 * (x - mean[:, None, None, None]), rtol=0, atol=1e-6)


def test_brightness_is_one_offset_per_client():
    x = _images(8)
    spec = PerClient(brightness=0.5)
    d = shift_inputs(spec, 0, 2, "train", x) - x
    b = draw_shift(spec, 0, 2).brightness
    np.testing.assert_allclose(d, np.full_like(d, b), rtol=0, atol=1e-6)


def test_noise_has_the_clients_std_and_is_fixed_per_example():
    spec = PerClient(noise=0.4)
    x = np.zeros((400, *SHAPE), np.float32)
    for cid in (0, 1, 2):
        noise = shift_inputs(spec, 5, cid, "train", x)
        std = draw_shift(spec, 5, cid).noise_std
        # 25,600 draws: the sample std is within 3% of the true one (15 standard errors)
        assert abs(noise.std() - std) < 0.03 * std and abs(noise.mean()) < 0.03 * std
        # example i's noise does not depend on how many examples there are
        few = shift_inputs(spec, 5, cid, "train", x[:7])
        np.testing.assert_array_equal(few, noise[:7])
    assert not np.array_equal(noise_draws(5, 2, "train", (3, 4)), noise_draws(5, 2, "test", (3, 4)))


def test_clip_keeps_values_in_range():
    x = _images(50)
    spec = PerClient(brightness=0.5, noise=0.5, clip=(0.0, 1.0))
    out = shift_inputs(spec, 0, 1, "train", x)
    assert out.min() == 0.0 and out.max() == 1.0
    unclipped = shift_inputs(PerClient(brightness=0.5, noise=0.5), 0, 1, "train", x)
    assert unclipped.min() < 0.0 or unclipped.max() > 1.0


def test_non_images_and_token_ids():
    check_data(PerClient(noise=0.1, contrast=(0.5, 2.0)), (8,))  # any float features
    with pytest.raises(ConfigError, match=r"^config key 'data\.per_client\.rotation': rotates "
                                          r"\(channels, height, width\) images; the inputs "
                                          r"of the data have shape \(8,\), got 10\.0$"):
        check_data(PerClient(rotation=10.0), (8,))
    with pytest.raises(ConfigError, match=r"^config key 'data\.per_client\.noise': shifts "
                                          r"inputs, but the data has a sequence of labels"):
        check_data(PerClient(noise=0.1), (80,), (80,))


@pytest.mark.parametrize("override, message", [
    ("rotation=-5", r"rotation': must be in \[0, 180\] degrees, got -5\.0"),
    ("rotation=200", r"rotation': must be in \[0, 180\] degrees, got 200\.0"),
    ("contrast=[1.5,0.5]", r"contrast': must be \[lo, hi\] with 0 <= lo <= hi, got \[1\.5, 0\.5\]"),
    ("contrast=[-1,1]", r"contrast': must be \[lo, hi\] with 0 <= lo <= hi"),
    ("contrast=[1,2,3]", r"contrast': must be \[lo, hi\]"),
    ("brightness=-0.1", r"brightness': must be >= 0, got -0\.1"),
    ("noise=-1", r"noise': must be >= 0, got -1\.0"),
    ("domains=-1", r"domains': must be an integer >= 0 \(0: every client its own shift\), "
                   r"got -1"),
    ("clip=[1,0]", r"clip': must be null or \[lo, hi\] with lo < hi, got \[1\.0, 0\.0\]"),
])
def test_bad_values_are_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=rf"^config key 'data\.per_client\.{message}"):
        validate(load_config(None, [f"data.per_client.{override}"]), 10)


def test_the_pool_of_all_clients_is_refused():
    with pytest.raises(ConfigError, match=r"^config key 'data\.per_client\.noise': cannot be "
                                          r"combined with data\.per_round\.imbalance\.pool: "
                                          r"all"):
        validate(load_config(None, ["data.per_client.noise=0.1",
                                    "data.per_round.imbalance.ratios=[1.0]",
                                    "data.per_round.imbalance.pool=all"]), 10)
    validate(load_config(None, ["data.per_client.noise=0.1",
                                "data.per_round.imbalance.ratios=[1.0]"]), 10)


# -- on a worker ----------------------------------------------------------------------------

class _Clients:
    population = 6
    num_classes = C
    input_shape = SHAPE
    has_client_test = True
    cacheable = False

    def train_sizes(self) -> np.ndarray:
        return np.full(self.population, 24)

    def test_sizes(self) -> np.ndarray:
        return np.full(self.population, 10)

    def client(self, cid: int, split: str = "train"):
        n = 24 if split == "train" else 10
        g = np.random.default_rng(1000 * (split == "test") + cid)
        return g.random((n, *SHAPE), dtype=np.float32), g.integers(0, C, n).astype(np.int64)


def _worker(per_client: PerClient | None, per_round: PerRound | None = None) -> ClientWorker:
    torch.manual_seed(0)
    parts = resolve({"name": "fedavg"}, ServerConfig())
    return ClientWorker(WorkerSpec(
        make_model=functools.partial(build_model, "mlp", SHAPE, C), source=_Clients(), seed=7,
        training=LocalTraining(lr=0.1, batch_size=8, local_epochs=1, local_steps=2,
                               eval_batch_size=16),
        resources=WorkerResources(num_cpus=1, cache_mb=0), client=parts.client,
        aggregator=parts.aggregator, per_round=per_round, per_client=per_client))


def test_worker_shifts_train_and_test_the_same_way_in_every_round():
    w, other = _worker(ALL), _worker(ALL)
    src = _Clients()
    for split in ("train", "test"):
        x, y = w.client_split(4, split)
        want = shift_inputs(ALL, 7, 4, split, src.client(4, split)[0])
        assert torch.equal(x, torch.from_numpy(want))
        assert torch.equal(y, torch.from_numpy(src.client(4, split)[1]))
    first = {c.cid: c.x for c in w._jobs(1, [0, 2, 4], None)}
    later = {c.cid: c.x for c in other._jobs(9, [4], None)}  # another worker, round, company
    assert torch.equal(first[4], later[4])
    assert torch.equal(first[4], w.client_split(4)[0])
    plain = _worker(None)
    assert torch.equal(plain.client_split(4, "test")[0], torch.from_numpy(src.client(4, "test")[0]))


def test_per_round_draws_among_the_shifted_examples():
    """data.per_client first (the stored examples), then data.per_round."""
    pr = PerRound(ratios=(1.0, 0.1), size=12, corruption=0.5)
    w = _worker(ALL, pr)
    x, y = w.client_data(3, 2)
    stored = _Clients().client(2)
    nx, ny, _ = apply_per_round(pr, 7, 3, 2, shift_inputs(ALL, 7, 2, "train", stored[0]),
                                stored[1], C)
    assert torch.equal(x, torch.from_numpy(nx)) and torch.equal(y, torch.from_numpy(ny))


# -- through a run ----------------------------------------------------------------------------

def _clients(num: int = 6) -> dict[int, dict]:
    """Image clients of four classes (a bright quadrant per class, plus noise), each with a
    test split of its own."""
    g = np.random.default_rng(3)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = g.integers(0, C, n)
        x = g.random((n, *SHAPE), dtype=np.float32) * 0.3
        for i, c in enumerate(y):
            r, q = divmod(int(c), 2)
            x[i, 0, 4 * r:4 * r + 4, 4 * q:4 * q + 4] += 0.7
        return x, y

    return {c: {"train": split(16 + 2 * c), "test": split(10)} for c in range(num)}


CLIENT_DATA = _clients()
SHIFT = {"rotation": 40.0, "contrast": [0.5, 1.5], "noise": 0.2, "clip": [0.0, 1.0]}


def _run(tmp_path, name: str, workers: int, per_client: dict | None) -> fedray.RunResult:
    job = {"name": name, "seed": 3, "rounds": 3,
           "client": {"lr": 0.05, "batch_size": 8, "local_epochs": 1},
           "sampling": {"clients_per_round": 4},
           "data": {"per_client": per_client or {}},
           "eval": {"every": 3, "central": False, "federated_clients": 6},
           "runtime": {"backend": "inline", "num_workers": workers,
                       "worker": {"num_cpus": 0.5}},
           "output": {"dir": str(tmp_path / name)}}
    return fedray.run(job, model_fn=functools.partial(build_model, "emnist_cnn_bn", SHAPE, C),
                      client_data=CLIENT_DATA)


def _flat(res: fedray.RunResult) -> np.ndarray:
    return np.concatenate([v.double().numpy().reshape(-1) for k, v in res.weights.items()
                           if v.is_floating_point()])


def test_a_shifted_run_is_the_same_at_any_worker_count_and_scores_shifted_test_data(tmp_path):
    one = _run(tmp_path, "one", 1, SHIFT)
    two = _run(tmp_path, "two", 2, SHIFT)
    plain = _run(tmp_path, "plain", 1, None)
    a, b, p = _flat(one), _flat(two), _flat(plain)
    # the clients' float32 training is the same; only the float64 merge is grouped otherwise
    np.testing.assert_allclose(b, a, rtol=0, atol=f32_atol(a, ulps=merge_ulps(3)))
    assert np.abs(p - a).max() > 1e3 * f32_atol(a, ulps=merge_ulps(3))
    # the logged federated accuracy is the final model's on the clients' *shifted* test data
    model = build_model("emnist_cnn_bn", SHAPE, C)
    model.load_state_dict(one.weights)
    spec = parse_per_client(SHIFT)
    sums = {}
    for shifted in (True, False):
        parts = []
        for cid, data in CLIENT_DATA.items():
            x, y = data["test"]
            xs = shift_inputs(spec, 3, cid, "test", x) if shifted else x
            parts.append(evaluate(model, torch.from_numpy(xs), torch.from_numpy(y), 64, "cpu",
                                  "cross_entropy"))
        sums[shifted] = functools.reduce(lambda u, v: u + v, parts)
    final = one.metrics[-1]
    assert final["fed_test_accuracy"] == sums[True].accuracy
    assert final["fed_test_loss"] == pytest.approx(sums[True].mean_loss, rel=1e-6)
    # the unshifted test data would score otherwise
    assert final["fed_test_loss"] != pytest.approx(sums[False].mean_loss, rel=1e-3)
