from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.algorithms.registry import registered
from fedray.algorithms.server_opt import (
    ServerAdagrad,
    ServerAdam,
    ServerMomentum,
    ServerOptimizer,
    ServerSGD,
    ServerYogi,
    build_server_optimizer,
)
from fedray.errors import FedrayError

NAMES = ["sgd", "momentum", "nesterov", "adam", "yogi", "adagrad"]
X0 = np.array([0.5, -1.0, 2.0, 0.25], dtype=np.float32)
# Step 1: large deltas except a zero; step 2 mixes delta^2 below v_1 (entry 0: Yogi's sign is
# +1, so v shrinks by (1-b2)*delta^2 instead of decaying by b2) and above it (entries 1, 3).
D1 = np.array([0.1, -0.2, 0.05, 0.0])
D2 = np.array([0.001, 0.3, -0.05, 0.02])
LR, B1, B2, TAU = 0.1, 0.9, 0.99, 1e-3


def t64(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def t32(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(a, dtype=np.float32))


def deltas(n: int, size: int = 6, seed: int = 0) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    return [t64(rng.normal(size=size)) for _ in range(n)]


def run(opt: ServerOptimizer, x: torch.Tensor, ds: list[torch.Tensor]) -> list[torch.Tensor]:
    out = []
    for d in ds:
        x = opt.step(x, d)
        out.append(x)
    return out


def test_registry():
    table = registered("server_opt")
    assert set(table) == set(NAMES)
    assert all(issubclass(c, ServerOptimizer) for c in table.values())
    assert {c.name for c in table.values()} == set(NAMES)
    for name in NAMES:
        assert build_server_optimizer(name, 0.5).name == name


def test_momentum_zero_is_sgd_exactly():
    x = t32(np.random.default_rng(1).normal(size=6))
    ds = deltas(5)
    sgd = run(ServerSGD(0.7), x, ds)
    for nesterov in (False, True):
        mom = run(ServerMomentum(0.7, 0.0, nesterov=nesterov), x, ds)
        assert all(torch.equal(a, b) for a, b in zip(sgd, mom, strict=True))


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("beta", [0.5, 0.9])
def test_momentum_matches_numpy(beta: float, nesterov: bool):
    lr = 0.3
    ds = deltas(3, seed=2)
    x0 = np.random.default_rng(3).normal(size=6).astype(np.float32)
    x, m = x0, np.zeros(6)
    ref = []
    for d in ds:
        d = d.numpy()
        m = beta * m + d
        upd = lr * (d + beta * m) if nesterov else lr * m
        x = (x.astype(np.float64) + upd).astype(np.float32)
        ref.append(x)
    opt = ServerMomentum(lr, beta, nesterov=nesterov)
    out = run(opt, t32(x0), ds)
    for a, b in zip(out, ref, strict=True):
        torch.testing.assert_close(a, t32(b), rtol=2.5e-7, atol=1e-12)
    torch.testing.assert_close(opt.state_dict()["m"], t64(m), rtol=1e-12, atol=0)


def adaptive_reference(kind: str) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Two steps of Reddi et al. Alg. 2 by hand: float32 weights after each, final m and v."""
    b1 = 0.0 if kind == "adagrad" else B1
    m, v, x = np.zeros(4), np.full(4, TAU**2), X0
    xs = []
    for d in (D1, D2):
        m = b1 * m + (1 - b1) * d
        if kind == "adam":
            v = B2 * v + (1 - B2) * d**2
        elif kind == "yogi":
            v = v - (1 - B2) * d**2 * np.sign(v - d**2)
        else:
            v = v + d**2
        x = (x.astype(np.float64) + LR * m / (np.sqrt(v) + TAU)).astype(np.float32)
        xs.append(x)
    return xs, m, v


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
def test_adaptive_two_steps_match_numpy(kind: str):
    opt = {"adam": ServerAdam(LR, B1, B2, TAU), "yogi": ServerYogi(LR, B1, B2, TAU),
           "adagrad": ServerAdagrad(LR, tau=TAU)}[kind]
    xs, m, v = adaptive_reference(kind)
    x = t32(X0)
    for d, ref in zip((D1, D2), xs, strict=True):
        x = opt.step(x, t64(d))
        assert x.dtype == torch.float32
        torch.testing.assert_close(x, t32(ref), rtol=2.5e-7, atol=1e-12)
    state = opt.state_dict()
    assert state["step"] == 2
    torch.testing.assert_close(state["m"], t64(m), rtol=1e-12, atol=0)
    torch.testing.assert_close(state["v"], t64(v), rtol=1e-12, atol=0)


def test_yogi_case_differs_from_adam():
    """The fixture really exercises Yogi's sign: both signs occur and v departs from Adam's."""
    v1 = TAU**2 + (1 - B2) * D1**2 * (D1 != 0)
    assert set(np.sign(v1 - D2**2)) == {-1.0, 1.0}
    _, _, v_yogi = adaptive_reference("yogi")
    _, _, v_adam = adaptive_reference("adam")
    assert np.all(np.abs(v_yogi - v_adam) > 1e-9)
    opt = ServerYogi(LR, B1, B2, TAU)
    opt.step(t32(X0), t64(D1))
    assert opt.state_dict()["v"][3].item() == TAU**2  # v_0 = tau^2, unchanged by a zero delta


def test_adagrad_beta1_default_and_factory():
    assert ServerAdagrad(0.1).beta1 == 0.0
    built = build_server_optimizer("adagrad", 0.1, beta1=0.9, beta2=0.5, momentum=0.1)
    assert isinstance(built, ServerAdagrad) and built.beta1 == 0.9 and built.tau == 1e-3
    d = t64(D1)
    out = ServerAdagrad(LR, tau=TAU).step(t32(X0), d)
    ref = (X0.astype(np.float64) + LR * D1 / (np.sqrt(TAU**2 + D1**2) + TAU)).astype(np.float32)
    torch.testing.assert_close(out, t32(ref), rtol=2.5e-7, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_resume_is_bit_identical(name: str):
    ds = deltas(4, seed=5)
    x = t32(np.random.default_rng(6).normal(size=6))
    a = build_server_optimizer(name, 0.2)
    x2 = run(a, x, ds[:2])[-1]
    state = a.state_dict()
    assert all(isinstance(v, torch.Tensor | int | float) for v in state.values())
    b = build_server_optimizer(name, 0.2)
    b.load_state_dict(state)
    for v in state.values():  # the loaded copy is independent of the dict it came from
        if isinstance(v, torch.Tensor):
            v.fill_(float("nan"))
    out_a, out_b = run(a, x2, ds[2:]), run(b, x2, ds[2:])
    assert all(torch.equal(p, q) for p, q in zip(out_a, out_b, strict=True))
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and sa["step"] == sb["step"] == 4
    assert all(torch.equal(sa[k], sb[k]) for k in sa if k != "step")


def test_state_before_first_step_and_mismatches():
    opt = build_server_optimizer("adam", 0.1)
    assert opt.state_dict() == {"step": 0}
    opt.load_state_dict({"step": 0})  # a resumed run that had not stepped yet
    opt.step(t32(np.zeros(4)), t64(D1))
    with pytest.raises(FedrayError, match="4 parameters but the model has 5"):
        opt.step(t32(np.zeros(5)), t64(np.ones(5)))
    with pytest.raises(FedrayError, match=r"^config key 'algorithm.server_opt': the saved "
                       r"optimizer state has keys .*, got 'momentum'$"):
        build_server_optimizer("momentum", 0.1).load_state_dict(opt.state_dict())


@pytest.mark.parametrize("name", NAMES)
def test_float32_out_and_inputs_untouched(name: str):
    opt = build_server_optimizer(name, 0.5)
    w, d = t32(X0), t64(D1)
    w0, d0 = w.clone(), d.clone()
    for _ in range(2):
        out = opt.step(w, d)
        assert out.dtype == torch.float32 and out.shape == w.shape
        assert torch.equal(w, w0) and torch.equal(d, d0)
        assert not torch.equal(out, w)


def test_unknown_name():
    with pytest.raises(FedrayError, match="algorithm.server_opt") as err:
        build_server_optimizer("adamw", 0.1)
    assert all(n in str(err.value) for n in NAMES)


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"lr": 0.0}, "server.lr"),
    ({"lr": -1.0}, "server.lr"),
    ({"lr": float("nan")}, "server.lr"),
    ({"momentum": 1.0}, "server.momentum"),
    ({"momentum": -0.1}, "server.momentum"),
    ({"beta1": 1.0}, "server.beta1"),
    ({"beta2": -0.5}, "server.beta2"),
    ({"tau": 0.0}, "server.tau"),
    ({"tau": -1e-3}, "server.tau"),
])
def test_factory_errors_name_the_key(kwargs: dict, key: str):
    uses = {"lr": NAMES, "momentum": ["momentum", "nesterov"], "beta1": ["adam", "yogi", "adagrad"],
            "beta2": ["adam", "yogi"], "tau": ["adam", "yogi", "adagrad"]}
    (param,) = kwargs
    for name in uses[param]:
        args = {"lr": 0.1, **kwargs}
        with pytest.raises(FedrayError, match=key.replace(".", r"\.")):
            build_server_optimizer(name, **args)


def test_factory_ignores_unused_values():
    assert isinstance(build_server_optimizer("sgd", 1.0, momentum=2.0, tau=-1.0), ServerSGD)
    nest = build_server_optimizer("nesterov", 1.0, momentum=0.5, beta1=7.0)
    assert isinstance(nest, ServerMomentum) and nest.nesterov and nest.momentum == 0.5


def test_defaults_are_the_documented_ones():
    """docs/config.md's server.* defaults: the config schema's, the factory's and each
    optimizer's own keyword defaults are one set of numbers."""
    import dataclasses
    import re
    from pathlib import Path

    from fedray.config import ServerConfig

    doc = Path(__file__).resolve().parents[2].joinpath("docs", "config.md").read_text()
    documented = {k: float(v) for k, v in
                  re.findall(r"^\| `server\.(\w+)` \| `([-0-9.e]+)` \|", doc, re.M)}
    schema = {f.name: f.default for f in dataclasses.fields(ServerConfig)}
    assert documented == schema == {"lr": 1.0, "momentum": 0.9, "dampening": 0.0,
                                    "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
    mom = build_server_optimizer("momentum", 1.0)
    assert (mom.momentum, mom.dampening, mom.nesterov) == (0.9, 0.0, False)
    nest = build_server_optimizer("nesterov", 1.0)
    assert (nest.momentum, nest.dampening, nest.nesterov) == (0.9, 0.0, True)
    for name in ("adam", "yogi"):
        opt = build_server_optimizer(name, 1.0)
        assert (opt.beta1, opt.beta2, opt.tau) == (0.9, 0.99, 1e-3)
        own = type(opt)(1.0)  # the class's own keyword defaults agree
        assert (own.beta1, own.beta2, own.tau) == (0.9, 0.99, 1e-3)
    ada = build_server_optimizer("adagrad", 1.0)
    assert (ada.beta1, ada.tau) == (0.9, 1e-3)  # the factory passes server.beta1
    assert (ServerAdagrad(1.0).beta1, ServerAdagrad(1.0).tau) == (0.0, 1e-3)
    plain = ServerMomentum(1.0, 0.5)
    assert (plain.nesterov, plain.dampening, plain.name) == (False, 0.0, "momentum")


def test_hyper_parameters_are_numbers_in_range():
    for bad in (True, "0.5", None):
        with pytest.raises(FedrayError, match="server.momentum"):
            ServerMomentum(1.0, bad)
        with pytest.raises(FedrayError, match="server.lr"):
            ServerSGD(bad)
    for bad in (float("inf"), 0.0):
        with pytest.raises(FedrayError, match="server.tau"):
            ServerAdam(1.0, tau=bad)
    with pytest.raises(FedrayError, match="server.dampening"):
        ServerMomentum(1.0, 0.5, dampening=1.0)
    assert ServerMomentum(1.0, 0.0, dampening=0.0).momentum == 0.0  # 0 is in [0, 1)
    assert ServerSGD(3).lr == 3.0 and isinstance(ServerSGD(3).lr, float)


def test_damped_momentum_by_hand():
    """m <- beta m + (1 - dampening) delta; x <- x + lr m (dampening = beta: an EMA)."""
    opt = ServerMomentum(0.5, 0.5, dampening=0.25)
    x = torch.zeros(2)
    d = torch.tensor([4.0, -8.0], dtype=torch.float64)
    x = opt.step(x, d)  # m = 0.75 d = [3, -6]; x = 0.5 m
    assert x.tolist() == [1.5, -3.0]
    x = opt.step(x, d)  # m = 0.5 [3, -6] + 0.75 d = [4.5, -9]; x += 0.5 m
    assert x.tolist() == [3.75, -7.5]
    nest = ServerMomentum(0.5, 0.5, nesterov=True, dampening=0.25)
    y = nest.step(torch.zeros(2), d)  # m = [3, -6]; x = 0.5 (d + 0.5 m) = [2.75, -5.5]
    assert y.tolist() == [2.75, -5.5] and nest.name == "nesterov"


def test_load_state_dict_checks_what_it_restores():
    opt = ServerAdam(0.1)
    opt.step(torch.zeros(3), torch.ones(3, dtype=torch.float64))
    saved = opt.state_dict()
    assert saved["step"] == 1 and set(saved) == {"step", "m", "v"}
    fresh = ServerAdam(0.1)
    fresh.load_state_dict(saved)
    assert fresh.steps == 1 and all(torch.equal(fresh.state[k], saved[k]) for k in ("m", "v"))
    saved["m"].add_(1.0)  # a copy: changing the dict afterwards changes nothing
    assert not torch.equal(fresh.state["m"], saved["m"])
    fresh.load_state_dict({"step": 0})  # before the first step: no buffers yet
    assert fresh.state == {} and fresh.steps == 0
    for bad in ({"step": 1, "m": [0.0], "v": torch.zeros(3)},
                {"step": 1, "m": torch.zeros(3)},
                {"m": torch.zeros(3), "v": torch.zeros(3)},
                {"step": 1, "m": torch.zeros(3), "v": torch.zeros(2)}):
        with pytest.raises(FedrayError, match="algorithm.server_opt"):
            ServerAdam(0.1).load_state_dict(bad)
    with pytest.raises(FedrayError, match="state is for 3 parameters but the model has 2"):
        fresh.load_state_dict(opt.state_dict())
        fresh.step(torch.zeros(2), torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="flat vectors of one size"):
        ServerSGD(1.0).step(torch.zeros(2), torch.ones(3, dtype=torch.float64))
    assert "lr=0.1" in repr(opt) and "steps" not in repr(opt)


def test_factory_checks_lr_whatever_the_optimizer_checks(monkeypatch):
    """build_server_optimizer refuses a bad server.lr itself, also for an optimizer (a
    user's) whose from_config never looks at it."""
    from fedray.algorithms import registry

    class LrFree(ServerOptimizer):
        name = "lr_free"

        @classmethod
        def from_config(cls, server, params=None) -> LrFree:
            return cls()

        def _update(self, delta: torch.Tensor) -> torch.Tensor:
            return delta

    registry.load_builtins()
    monkeypatch.setitem(registry._REGISTRY["server_opt"], "lr_free", LrFree)
    assert isinstance(build_server_optimizer("lr_free", 0.5), LrFree)
    for lr in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(FedrayError, match=r"server\.lr"):
            build_server_optimizer("lr_free", lr)


def test_momentum_from_a_server_section_without_dampening_is_undamped():
    """A server section without the key (a job written before dampening existed) gets
    PyTorch's default, 0: the heavy ball."""
    from types import SimpleNamespace

    from fedray.algorithms.server_opt import ServerNesterov

    for cls in (ServerMomentum, ServerNesterov):
        opt = cls.from_config(SimpleNamespace(lr=0.5, momentum=0.9))
        assert (opt.lr, opt.momentum, opt.dampening) == (0.5, 0.9, 0.0)
        assert opt.nesterov == (cls is ServerNesterov)


def test_yogi_leaves_v_alone_where_delta_squared_equals_it():
    """sign(v - delta^2) = 0: v_t = v_{t-1} exactly (tau = 0.5, |delta| = 0.5: v_0 = delta^2,
    all dyadic, so every value below is exact)."""
    opt = ServerYogi(1.0, beta1=0.5, beta2=0.75, tau=0.5)
    w = torch.zeros(3)
    out = opt.step(w, torch.tensor([0.5, -0.5, 1.0], dtype=torch.float64))
    # v = 0.25 - 0.25 * [0.25, 0.25, 1] * sign([0, 0, -0.75]) = [0.25, 0.25, 0.5]
    assert opt.state["v"].tolist() == [0.25, 0.25, 0.5]
    m = [0.25, -0.25, 0.5]  # (1 - beta1) * delta
    assert out.tolist() == pytest.approx([m[0] / 1.0, m[1] / 1.0, m[2] / (0.5**0.5 + 0.5)],
                                         rel=1e-7)
