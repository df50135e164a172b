"""APFL and pFedMe (fedray/algorithms/personal_models.py) through the whole runtime, against
independent NumPy float64 re-implementations of the papers' Algorithm 1 (Deng et al. 2020;
T. Dinh et al., NeurIPS 2020) on deterministic full-batch linear-regression clients
(f_k(w) = 1/2 ||X_k w - y_k||^2 / n_k) with partial participation: 5 clients, 3 a round, so
a client's stored personal model (and APFL's alpha) waits in the store while it sits out.
Every client holds out 5 examples as its own test split, on which federated evaluation
measures its personalized model and the global one.

The runs use the inline backend (the driver and its worker in this process, bit-identical
to Ray's at the same worker count: tests/runtime/test_inline.py); test_one_vs_three_workers
keeps one run per preset on three Ray worker processes sharing one client state store. One
straight run per preset (``straight``) is the reference check, the resumed run's baseline
and the worker-count test's one worker."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from linear_regression import W0, D, linear_model_fn
from personalized_runs import clients_with_tests, eval_table, regression_job, weights_of
from personalized_runs import stored_versions as stored
from tolerance import F32_EPS, ULPS_PER_STEP, f32_atol, merge_ulps

import fedray
from fedray.core.sampling import sample_clients
from fedray.errors import ConfigError
from fedray.state.checkpoint import read_checkpoint
from fedray.state.run_dir import SERVER_STATE_FILE, load_tensors

SEED = 7
ROUNDS, STEPS, PER_ROUND = 4, 3, 3
LR = 0.1  # client.lr

# APFL: a first alpha away from both ends, and a step for alpha that moves it: some clients'
# alphas stay inside (0, 1), the others' reach 0, where the clip holds them
ALPHA0, ALPHA_LR = 0.3, 0.02
# pFedMe: lam, K inner steps at PLR, and the server's beta (server.lr) other than 1
LAM, K, PLR, BETA = 1.5, 3, 0.1, 1.5

PARAMS = {"apfl": {"alpha": ALPHA0, "alpha_lr": ALPHA_LR},
          "pfedme": {"lam": LAM, "inner_steps": K, "personal_lr": PLR}}
SERVER_LR = {"apfl": 1.0, "pfedme": BETA}


CLIENTS = clients_with_tests([6 + 3 * i for i in range(5)], scale_step=0.25)
POPULATION = len(CLIENTS)


def f64(cid: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    x, y = CLIENTS[cid][split]
    return x.astype(np.float64), y.astype(np.float64)


def job(out_dir, preset: str, *, rounds: int = ROUNDS, workers: int = 1,
        backend: str = "inline", **params) -> dict:
    """Full-batch local steps; every client evaluated on its own test split every second
    round."""
    return regression_job(out_dir, preset, {"name": preset, preset: PARAMS[preset] | params},
                          seed=SEED, rounds=rounds, clients=POPULATION, per_round=PER_ROUND,
                          lr=LR, steps=STEPS, workers=workers, backend=backend,
                          eval_every=2, extra={"server": {"lr": SERVER_LR[preset]},
                                               "checkpoint": {"every": 2}})


def run(out_dir, preset: str, **kw):
    return fedray.run(job(out_dir, preset, **kw), model_fn=linear_model_fn(),
                      client_data=CLIENTS)


def rounds_of() -> dict[int, list[int]]:
    return {i: [r for r in range(1, ROUNDS + 1)
                if i in sample_clients(SEED, r, POPULATION, PER_ROUND)] for i in CLIENTS}


# -- the NumPy references -----------------------------------------------------------------

def grad(cid: int, w: np.ndarray) -> np.ndarray:
    x, y = f64(cid)
    return x.T @ (x @ w - y) / len(y)


def held_out_mse(cid: int, w: np.ndarray) -> float:
    """The client's test-split loss at ``w`` (mse: 1/2 mean squared error)."""
    x, y = f64(cid, "test")
    return float(0.5 * np.mean((x @ w - y) ** 2))


def mean_update(deltas: list[np.ndarray], ids: list[int], proportional: bool) -> np.ndarray:
    sizes = [len(CLIENTS[k]["train"][1]) if proportional else 1 for k in ids]
    return sum(s * d for s, d in zip(sizes, deltas, strict=True)) / sum(sizes)


def apfl_numpy(rounds: int, variant: str = "apfl", margins: list[float] | None = None
               ) -> tuple[np.ndarray, dict[int, np.ndarray], dict[int, float]]:
    """Deng et al. (2020), Algorithm 1, in float64: a sampled client starts w at w^t, v
    from its stored v (w^t at first) and alpha from its stored one (ALPHA0 at first); each
    local step, with the values before it: g_w = grad f(w), vbar = alpha v + (1 - alpha) w,
    g = grad f(vbar); w -= LR g_w; v -= LR alpha g; alpha <- clip(alpha - ALPHA_LR
    <v - w, g>, 0, 1). The server adds the example-weighted mean of the deltas w - w^t.
    Returns w, every client's v and alpha; ``margins`` receives how far each step's alpha
    before the clip is from 0 and 1. Wrong variants: "fixed" keeps alpha, "noclip" leaves
    it unclipped, "uniform" averages the deltas with equal weights."""
    w, personal, alphas = W0.copy(), {}, {}
    for r in range(1, rounds + 1):
        ids = [int(c) for c in sample_clients(SEED, r, POPULATION, PER_ROUND)]
        deltas = []
        for k in ids:
            wk, v, a = w.copy(), personal.get(k, w).copy(), alphas.get(k, ALPHA0)
            for _ in range(STEPS):
                g_w = grad(k, wk)
                g = grad(k, a * v + (1 - a) * wk)
                new_a = a - ALPHA_LR * (v - wk) @ g
                if margins is not None:
                    margins.append(min(abs(new_a), abs(1 - new_a)))
                if variant == "fixed":
                    new_a = a
                elif variant != "noclip":
                    new_a = float(np.clip(new_a, 0.0, 1.0))
                wk, v, a = wk - LR * g_w, v - LR * a * g, new_a
            personal[k], alphas[k] = v, a
            deltas.append(wk - w)
        w = w + mean_update(deltas, ids, proportional=variant != "uniform")
    return w, personal, alphas


def pfedme_numpy(rounds: int, variant: str = "pfedme"
                 ) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """T. Dinh et al. (NeurIPS 2020), Algorithm 1, in float64: a sampled client sets w and
    theta to w^t; each of its STEPS local steps takes K steps theta -= PLR (grad f(theta) +
    LAM (theta - w)) (theta carried from the previous local step), then w -= LR LAM
    (w - theta). The server: w <- (1 - BETA) w + BETA mean_k w_k, the plain mean over the
    round's clients. Returns w and every client's theta. Wrong variants: "restart" starts
    theta at w every local step, "proportional" weighs the mean by example counts, "beta1"
    takes the plain mean (beta = 1)."""
    w, personal = W0.copy(), {}
    for r in range(1, rounds + 1):
        ids = [int(c) for c in sample_clients(SEED, r, POPULATION, PER_ROUND)]
        deltas = []
        for k in ids:
            wk, theta = w.copy(), w.copy()
            for _ in range(STEPS):
                if variant == "restart":
                    theta = wk.copy()
                for _ in range(K):
                    theta = theta - PLR * (grad(k, theta) + LAM * (theta - wk))
                wk = wk - LR * LAM * (wk - theta)
            personal[k] = theta
            deltas.append(wk - w)
        beta = 1.0 if variant == "beta1" else BETA
        w = w + beta * mean_update(deltas, ids, proportional=variant == "proportional")
    return w, personal


# The float32 runtime against the float64 reference (tolerance.py): ULPS_PER_STEP ulps of
# the values' size for every float32 step that updates a model, and one for the delta. An
# APFL local step updates two models (w and v: two steps' worth); a pFedMe local step
# takes K inner steps and one outer step (K + 1). Every round adds as much again, for the
# global model and for a personal model carried over the client's rounds alike.
APFL_ULPS = ULPS_PER_STEP * (2 * STEPS + 1) * ROUNDS
PFEDME_ULPS = ULPS_PER_STEP * ((K + 1) * STEPS + 1) * ROUNDS


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """ROUNDS rounds in one go per preset: one worker, clients one after another."""
    runs = {}

    def get(preset: str):
        if preset not in runs:
            runs[preset] = run(tmp_path_factory.mktemp(preset) / "straight", preset)
        return runs[preset]
    return get


def check_eval(run_dir: str, personalized: dict[int, np.ndarray], w: np.ndarray,
               weight_atol: float, distinct: list[int]) -> None:
    """The last round's client_eval table: ``loss`` is each client's personalized model's
    test mse, ``global_loss`` the global model's. A loss 1/2 mean(r^2) whose weights are
    within ``weight_atol`` moves by at most mean(|r| |dr| + dr^2 / 2), |dr| <= sum_j |x_j|
    weight_atol, plus the float32 evaluation's own rounding, a few ulps of the loss (a
    5-term mean of squares of 3-term sums). ``distinct``: the clients whose personalized
    model is not the global one."""
    table = eval_table(run_dir, ROUNDS, CLIENTS)
    for cid in CLIENTS:
        x, y = f64(cid, "test")
        dr = np.abs(x).sum(1) * weight_atol
        for col, model in (("loss", personalized[cid]), ("global_loss", w)):
            r = x @ model - y
            expected = float(0.5 * np.mean(r ** 2))
            atol = float(np.mean(np.abs(r) * dr + dr ** 2 / 2)) + 16 * F32_EPS * expected
            assert abs(table[col][cid] - expected) <= atol, (col, cid, table[col][cid],
                                                             expected)
        if cid in distinct:  # the columns tell the two models apart, far beyond the tolerance
            assert abs(held_out_mse(cid, personalized[cid]) - held_out_mse(cid, w)) > 1e-3, cid


# -- APFL ---------------------------------------------------------------------------------

def test_apfl_matches_the_paper(straight):
    """Final weights, every client's stored v and alpha, and the per-client evaluation of
    alpha v + (1 - alpha) w (w the final global model) against Algorithm 1."""
    res = straight("apfl")
    margins: list[float] = []
    w, personal, alphas = apfl_numpy(ROUNDS, margins=margins)
    got = weights_of(res)
    atol = f32_atol(w, *personal.values(), ulps=APFL_ULPS)
    # the test means something: the model moved; some alphas moved inside (0, 1), others
    # reached 0 and stayed there; keeping alpha fixed, not clipping it or averaging the
    # deltas uniformly moves the model or the personal models far beyond the tolerance
    assert np.abs(got - W0).max() > 0.1
    assert sum(0 < a < 1 and abs(a - ALPHA0) > 1e-2 for a in alphas.values()) >= 2
    assert sum(a == 0 for a in alphas.values()) >= 2
    for wrong in ("fixed", "noclip", "uniform"):
        w_, personal_, _ = apfl_numpy(ROUNDS, wrong)
        assert max(np.abs(w_ - w).max(), *(np.abs(personal_[k] - v).max()
                                           for k, v in personal.items())) > 100 * atol, wrong
    # and no step's alpha is so near 0 or 1 that float32 rounding could change the clip's
    # decision
    assert min(margins) > 100 * atol
    np.testing.assert_allclose(got, w, rtol=0, atol=atol)

    who = rounds_of()
    assert who[0] == [1, 3]  # client 0 sits out round 2 and comes back to its stored v
    state = stored(res.run_dir)
    assert sorted(state) == [i for i in CLIENTS if who[i]]
    for cid, (version, tensors) in state.items():
        assert version == who[cid][-1] and set(tensors) == {"personal", "alpha"}
        assert tensors["alpha"].shape == (1,)
        np.testing.assert_allclose(tensors["personal"].double().numpy(), personal[cid],
                                   rtol=0, atol=atol)
        # alpha's step is ALPHA_LR <v - w, g>: its error is ALPHA_LR |g| (|v - w| of
        # rounding, within 2 atol), |g| at most a few units here -- well within 2 atol
        assert abs(float(tensors["alpha"]) - alphas[cid]) <= 2 * atol, cid
    mixed = {k: alphas[k] * personal[k] + (1 - alphas[k]) * w if k in personal else w
             for k in CLIENTS}
    # the mix of two vectors each within atol, by an alpha within 2 atol times |v - w|
    # (a client whose alpha reached 0 is evaluated with the global model itself)
    check_eval(res.run_dir, mixed, w, 2 * atol * (1 + max(
        np.abs(personal[k] - w).max() for k in personal)),
        distinct=[k for k in personal if alphas[k] > 0])


def test_apfl_without_adaptation_keeps_alpha(tmp_path):
    """adaptive: false: every stored alpha is the first one, bit for bit, and the run is
    Algorithm 1 with a fixed alpha."""
    res = run(tmp_path / "fixed", "apfl", adaptive=False, rounds=2)
    w, personal, _ = apfl_numpy(2, "fixed")
    atol = f32_atol(w, *personal.values(), ulps=ULPS_PER_STEP * (2 * STEPS + 1) * 2)
    np.testing.assert_allclose(weights_of(res), w, rtol=0, atol=atol)
    for cid, (_, tensors) in stored(res.run_dir).items():
        assert float(tensors["alpha"]) == np.float32(ALPHA0)
        np.testing.assert_allclose(tensors["personal"].double().numpy(), personal[cid],
                                   rtol=0, atol=atol)


# -- pFedMe -------------------------------------------------------------------------------

def test_pfedme_matches_the_paper(straight):
    """Final weights (server.lr as beta), every client's stored theta, and the per-client
    evaluation of theta against Algorithm 1."""
    res = straight("pfedme")
    w, personal = pfedme_numpy(ROUNDS)
    got = weights_of(res)
    atol = f32_atol(w, *personal.values(), ulps=PFEDME_ULPS)
    assert np.abs(got - W0).max() > 0.1
    # restarting theta every local step, weighing by example counts and leaving beta out
    # each move the model far beyond the tolerance
    for wrong in ("restart", "proportional", "beta1"):
        assert np.abs(pfedme_numpy(ROUNDS, wrong)[0] - w).max() > 100 * atol, wrong
    np.testing.assert_allclose(got, w, rtol=0, atol=atol)

    who = rounds_of()
    state = stored(res.run_dir)
    assert sorted(state) == [i for i in CLIENTS if who[i]]
    for cid, (version, tensors) in state.items():
        assert version == who[cid][-1] and set(tensors) == {"personal"}
        np.testing.assert_allclose(tensors["personal"].double().numpy(), personal[cid],
                                   rtol=0, atol=atol)
    check_eval(res.run_dir, {k: personal.get(k, w) for k in CLIENTS}, w, atol,
               distinct=list(personal))


# -- both ---------------------------------------------------------------------------------

@pytest.mark.parametrize("preset", ["apfl", "pfedme"])
def test_resume_is_bit_identical(straight, tmp_path, preset):
    """ROUNDS / 2 rounds, then resumed to ROUNDS, equal the straight run bit for bit: the
    weights, the saved server state and every client's stored state (and its version)."""
    half = tmp_path / "half"
    first = run(half, preset, rounds=ROUNDS // 2)
    assert read_checkpoint(first.run_dir).round == ROUNDS // 2
    more = fedray.run(resume=str(half), overrides=[f"rounds={ROUNDS}"],
                      allow_changes=["rounds"], model_fn=linear_model_fn(),
                      client_data=CLIENTS)
    assert more.summary["resumed_from_round"] == ROUNDS // 2
    base = straight(preset)
    assert base.weights.keys() == more.weights.keys()
    assert all(torch.equal(base.weights[k], more.weights[k]) for k in base.weights)
    a = load_tensors(base.run_dir, SERVER_STATE_FILE)
    b = load_tensors(more.run_dir, SERVER_STATE_FILE)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = stored(base.run_dir), stored(more.run_dir)
    assert sa.keys() == sb.keys() and len(sa) == POPULATION
    for cid, (version, tensors) in sa.items():
        assert sb[cid][0] == version and tensors.keys() == sb[cid][1].keys()
        assert all(torch.equal(tensors[k], sb[cid][1][k]) for k in tensors), cid


@pytest.mark.parametrize("preset", ["apfl", "pfedme"])
def test_one_vs_three_workers(ray_cluster, straight, tmp_path, preset):
    """Both sequential: every client's float32 arithmetic (its stored state included) is
    the same on one worker and on three; only the driver's float64 merge of the workers'
    partial sums is grouped otherwise (tolerance.merge_ulps: a last bit of the new global
    weights may flip in a round, and the later rounds, the states included, carry it)."""
    base = straight(preset)
    three = run(tmp_path / "w3", preset, workers=3, backend="ray")
    assert three.summary["num_workers"] == 3
    one = weights_of(base)
    np.testing.assert_allclose(weights_of(three), one, rtol=0,
                               atol=f32_atol(one, ulps=merge_ulps(ROUNDS)))
    s1, s3 = stored(base.run_dir), stored(three.run_dir)
    assert s1.keys() == s3.keys()
    for cid, (version, tensors) in s1.items():
        assert s3[cid][0] == version
        for key, value in tensors.items():
            a, b = value.double().numpy(), s3[cid][1][key].double().numpy()
            np.testing.assert_allclose(b, a, rtol=0, atol=f32_atol(a, one,
                                                                   ulps=merge_ulps(ROUNDS)))


@pytest.mark.parametrize("preset, key, value, rule", [
    ("apfl", "alpha", 1.5, r"must be a number in \[0, 1\], got 1\.5"),
    ("apfl", "adaptive", "maybe", r"Value 'maybe' is not a valid bool \(type str\)"),
    ("apfl", "alpha_lr", 0.0, r"must be a finite number > 0 \(or unset: client\.lr\), "
                              r"got 0\.0"),
    ("pfedme", "lam", 0.0, r"must be a finite number > 0, got 0\.0"),
    ("pfedme", "inner_steps", 0, r"must be an integer >= 1, got 0"),
    ("pfedme", "personal_lr", -0.1, r"must be a finite number > 0, got -0\.1")])
def test_bad_values_are_refused_in_one_line(tmp_path, preset, key, value, rule):
    from fedray.api import prepare

    with pytest.raises(ConfigError, match=rf"^config key 'algorithm\.{preset}\.{key}': "
                                          rf"{rule}$"):
        prepare(job(tmp_path / "run", preset, **{key: value}), client_data=CLIENTS,
                model_fn=linear_model_fn())


def test_a_batchnorm_model_trains_and_evaluates(tmp_path):
    """Float buffers (BatchNorm's running statistics) go where the module docstring says:
    APFL stores v's (the forward passes at vbar), pFedMe's update carries theta's; both
    runs stay finite and their stored buffers moved from the initial ones."""
    def bn_model():
        from torch import nn
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(D, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 1))

    for preset in ("apfl", "pfedme"):
        res = fedray.run(job(tmp_path / preset, preset, rounds=2), model_fn=bn_model,
                         client_data=CLIENTS)
        assert all(torch.isfinite(v).all() for v in res.weights.values())
        assert not torch.equal(res.weights["1.running_mean"], torch.zeros(4))
        for _, tensors in stored(res.run_dir).values():
            personal = tensors["personal"]
            assert torch.isfinite(personal).all()
            assert not torch.equal(personal[-8:-4], torch.zeros(4))  # running_mean moved
        assert "fed_test_global_loss" in res.metrics[-1]
