"""User-level DP (fedray.algorithms.privacy): clipping on every path, the noise's scale, the
fixed denominator, Poisson sampling, adaptive clipping and the accountant in a run.

Runs use runtime.backend=inline (no Ray): the worker objects live in the test's process, so a
probe stage placed after ``dp`` sees every update exactly as the aggregator receives it."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
from conftest import tiny_job

import fedray
from fedray.algorithms.base import PartialSum, RoundPlan, UpdateStage
from fedray.algorithms.privacy import (
    DifferentialPrivacy,
    DPParams,
    clip_,
    update_noise_multiplier,
)
from fedray.algorithms.registry import register
from fedray.core.sampling import poisson_clients, select_round
from fedray.errors import ConfigError
from fedray.privacy.accountant import Accountant, default_delta, epsilon
from fedray.state.run_dir import read_metrics
from fedray.tracking.tensorboard import EVENTS_FILE, read_scalars

NORMS: dict[str, list[float]] = {"before": [], "after": []}


@register
class NormsBefore(UpdateStage):
    """Records each update's norm where it stands in algorithm.stages (test only)."""

    name, where = "test_norms_before", "before"

    def client_update(self, env, ctx, update, acc):
        NORMS[self.where].append(float(torch.linalg.vector_norm(update.delta,
                                                                 dtype=torch.float64)))


@register
class NormsAfter(NormsBefore):
    name, where = "test_norms_after", "after"


def _job(tmp_path, name: str, dp: dict | None = None, stages=("dp",), **over) -> dict:
    defaults = {"rounds": 4, "runtime__num_workers": 2, "runtime__backend": "inline",
                "algorithm": {"name": "dp_fedavg", "stages": list(stages),
                              "dp": dp or {"clip": 0.05, "noise_multiplier": 0.5}}}
    return tiny_job(tmp_path, name=name, output__dir=str(tmp_path / name),
                    **(defaults | over))


def _flat(res) -> torch.Tensor:
    return torch.cat([v.flatten() for v in res.weights.values()])


def test_clip_scales_to_the_bound_and_leaves_small_updates_alone():
    v = torch.tensor([3.0, 4.0])
    assert clip_(v, 1.0) == 5.0 and torch.allclose(v, torch.tensor([0.6, 0.8]))
    assert float(torch.linalg.vector_norm(v, dtype=torch.float64)) <= 1.0
    w = torch.tensor([0.3, 0.4])
    assert clip_(w, 1.0) == pytest.approx(0.5) and torch.equal(w, torch.tensor([0.3, 0.4]))


@pytest.mark.parametrize("vectorize", ["off", "on"])
def test_every_client_update_is_clipped_sequential_and_vectorized(tmp_path, vectorize):
    """The bound holds for every trained client, on the one-after-another path and the
    vmap path alike (both go through the worker's one _finish): the clipped float32 vector's
    norm, measured in float64, is at most C -- not approximately (clip_'s margin)."""
    for v in NORMS.values():
        v.clear()
    clip = 0.05
    fedray.run(_job(tmp_path, f"clip-{vectorize}", {"clip": clip, "noise_multiplier": 0.0},
                    stages=("test_norms_before", "dp", "test_norms_after"),
                    runtime__worker={"num_cpus": 1.0, "vectorize": vectorize}))
    before, after = np.array(NORMS["before"]), np.array(NORMS["after"])
    assert len(after) == 4 * 8 and len(before) == len(after)
    assert (before > clip).any(), "the test must actually clip some updates"
    assert (after <= clip).all()
    assert (after[before > clip] >= clip * (1 - 1e-6)).all()  # clipped to C, not below
    small = before <= clip
    assert np.array_equal(after[small], before[small])  # within the bound: untouched


def test_central_noise_std_is_z_times_clip_and_the_denominator_is_fixed():
    """Over many seeded rounds the noise added to a zero sum has std z*C: 64 rounds x 500
    coordinates = 32,000 draws, so the sample std's relative standard error is
    1/sqrt(2*32000) = 0.4%; 4 standard errors (1.6%) leave a false failure ~1e-4 likely."""
    z, clip, n, k = 1.3, 0.7, 500, 10
    stage = DifferentialPrivacy(DPParams(clip=clip, noise_multiplier=z))
    stage.init_server(RoundPlan(seed=5, population=1000, clients_per_round=k,
                                sampling="poisson", rounds=64, num_params=n))
    noise = []
    for r in range(1, 65):
        acc = PartialSum(n, extras={"dp_unclipped": 1})
        stage.finish_sum(acc, r)
        assert acc.weight == k  # E, whoever took part (here: nobody)
        noise.append(acc.mean() * k)
    noise = torch.cat(noise).numpy()
    assert abs(noise.std() / (z * clip) - 1) < 4 / math.sqrt(2 * noise.size)
    assert abs(noise.mean()) < 4 * z * clip / math.sqrt(noise.size)
    # seeded from (seed, round): a rerun adds the same noise, bit for bit
    again = DifferentialPrivacy(DPParams(clip=clip, noise_multiplier=z))
    again.init_server(stage.plan)
    acc = PartialSum(n, extras={"dp_unclipped": 1})
    again.finish_sum(acc, 1)
    assert torch.equal(acc.mean() * k, torch.from_numpy(noise[:n]))


def test_poisson_sampling_rate_matches_q():
    """Each client's inclusion frequency over 2,000 rounds is q = k/N: the mean count per
    round within 4 binomial standard errors, and no client far from q."""
    n, k, rounds = 500, 25, 2000
    counts = np.zeros(n)
    sizes = []
    for r in range(rounds):
        ids = poisson_clients(3, r, n, k)
        assert len(np.unique(ids)) == len(ids)
        counts[ids] += 1
        sizes.append(len(ids))
    q = k / n
    assert abs(np.mean(sizes) - k) < 4 * math.sqrt(n * q * (1 - q) / rounds)
    assert np.std(sizes) == pytest.approx(math.sqrt(n * q * (1 - q)), rel=0.1)
    per_client = counts / rounds  # binomial(2000, 0.05) / 2000: sd 0.0049; 5 sd = 0.024
    assert np.abs(per_client - q).max() < 5 * math.sqrt(q * (1 - q) / rounds)
    sel = select_round(3, 7, n, k, mode="poisson")
    assert np.array_equal(sel.participants, poisson_clients(3, 7, n, k))


def test_adaptive_clipping_moves_clip_towards_the_quantile():
    """All clients unclipped (share 1 > target 0.5): C shrinks by exp(-eta (1 - 0.5)), up to
    the count's noise (sigma_b = 0.01 on 10 clients: at most ~0.5% of the step here)."""
    p = DPParams(clip=1.0, noise_multiplier=0.001, target_quantile=0.5, clip_lr=0.2,
                 count_noise_multiplier=0.01)
    stage = DifferentialPrivacy(p)
    stage.init_server(RoundPlan(seed=0, population=100, clients_per_round=10,
                                sampling="fixed", rounds=5, num_params=3))
    acc = PartialSum(3, extras={"dp_unclipped": 1})
    acc.extras["dp_unclipped"][0] = 10
    stage.finish_sum(acc, 1)
    assert float(stage.state["clip"][0]) == pytest.approx(math.exp(-0.1), rel=2e-3)
    # the update's own multiplier composes with the count's into z
    zu = update_noise_multiplier(1.0, 5.0)
    assert (zu ** -2 + (2 * 5.0) ** -2) ** -0.5 == pytest.approx(1.0)


def test_dp_run_reports_epsilon_and_stops_at_the_budget(tmp_path):
    """epsilon after every round is the accountant's for (q, z, rounds, delta); a budget
    ends the run before the round that would exceed it."""
    dp = {"clip": 0.05, "noise_multiplier": 1.0}
    res = fedray.run(_job(tmp_path, "eps", dp, sampling__mode="poisson",
                          output__tensorboard=True))
    lines = read_metrics(res.run_dir)
    delta = default_delta(40)
    want = [epsilon(1.0, r, delta, sampling="poisson", population=40, clients_per_round=8)
            for r in range(1, 5)]
    assert [m["dp_epsilon"] for m in lines] == want
    tb = read_scalars(os.path.join(res.run_dir, EVENTS_FILE), tags=True)["train/dp_epsilon"]
    assert tb == [(r, pytest.approx(e, rel=1e-6)) for r, e in enumerate(want, 1)]  # float32
    summary = json.load(open(f"{res.run_dir}/summary.json"))
    assert summary["stages"]["dp"]["epsilon"] == want[-1]
    assert summary["stages"]["dp"]["delta"] == delta
    budget = (want[1] + want[2]) / 2  # round 3 would exceed it
    res = fedray.run(_job(tmp_path, "budget", {**dp, "epsilon_budget": budget},
                          sampling__mode="poisson"))
    lines = read_metrics(res.run_dir)
    assert [m["round"] for m in lines] == [1, 2]
    assert "epsilon_budget" in lines[-1]["stopped_by"]
    summary = json.load(open(f"{res.run_dir}/summary.json"))
    assert summary["stopped_early_after_round"] == 2 and summary["stopped_by"]


def test_local_noise_is_per_client_and_seeded(tmp_path):
    """mode=local: each client adds z*C noise to its own update; the run is reproducible and
    its accountant is the unamplified one."""
    dp = {"mode": "local", "clip": 0.05, "noise_multiplier": 0.5}
    a = fedray.run(_job(tmp_path, "local-a", dp))
    b = fedray.run(_job(tmp_path, "local-b", dp))
    c = fedray.run(_job(tmp_path, "local-c", dp, runtime__num_workers=1))
    assert torch.equal(_flat(a), _flat(b))
    # one worker: the same noisy updates, summed in float64 in another grouping (~1e-16
    # relative), then cast to float32: equal up to one float32 ulp of weights of size ~1
    assert torch.allclose(_flat(a), _flat(c), rtol=0, atol=1e-6)
    nodp = fedray.run(_job(tmp_path, "local-none", {**dp, "noise_multiplier": 0.0}))
    assert not torch.allclose(_flat(a), _flat(nodp), atol=1e-4)
    m = read_metrics(a.run_dir)[-1]
    assert m["dp_epsilon"] == Accountant(0.5, default_delta(40), sampling="local",
                                         population=40, clients_per_round=8).epsilon(4)


def test_dp_refuses_parts_that_leak_or_weight(tmp_path):
    with pytest.raises(ConfigError, match="algorithm.aggregator.*weight 1"):
        fedray.run(_job(tmp_path, "w", algorithm={"name": "fedavg", "stages": ["dp"]}))
    with pytest.raises(ConfigError, match="algorithm.client.*scaffold"):
        fedray.run(_job(tmp_path, "s", algorithm={"name": "scaffold", "aggregator": "uniform",
                                                  "stages": ["dp"]}))


def test_resume_continues_clip_noise_and_epsilon_bit_for_bit(tmp_path):
    """Adaptive C and the released-round count are server state: a run extended from its
    checkpoint equals one run straight through, and a budget reached before the resume
    still holds after it."""
    dp = {"clip": 0.05, "noise_multiplier": 0.8, "target_quantile": 0.5,
          "count_noise_multiplier": 2.0}
    straight = fedray.run(_job(tmp_path, "straight", dp))
    first = fedray.run(_job(tmp_path, "ext", dp, rounds=2))
    ext = fedray.run(resume=first.run_dir, overrides=["rounds=4"], allow_changes=["rounds"])
    assert torch.equal(_flat(straight), _flat(ext))
    keys = ("dp_clip", "dp_epsilon", "dp_unclipped_share")
    assert ([{k: m[k] for k in keys} for m in read_metrics(straight.run_dir)]
            == [{k: m[k] for k in keys} for m in read_metrics(ext.run_dir)])
    eps = [m["dp_epsilon"] for m in read_metrics(straight.run_dir)]
    spent = fedray.run(_job(tmp_path, "spent", {**dp, "epsilon_budget": eps[1] * 1.0001}))
    assert [m["round"] for m in read_metrics(spent.run_dir)] == [1, 2]
    again = fedray.run(resume=spent.run_dir, overrides=["rounds=4"], allow_changes=["rounds"])
    assert [m["round"] for m in read_metrics(again.run_dir)] == [1, 2]
    assert "epsilon_budget" in again.summary["stopped_by"]


@pytest.mark.cluster
def test_ray_workers_run_stages_as_inline_does(tmp_path, ray_cluster):
    """Stages travel to Ray's worker processes inside the worker spec: the same job gives
    the same model on Ray as inline, bit for bit (same slots, same float64 merge order)."""
    algo = {"name": "dp_fedavg", "stages": ["topk", "dp"], "topk": {"fraction": 0.2},
            "dp": {"clip": 0.05, "noise_multiplier": 0.5}}
    inline = fedray.run(_job(tmp_path, "inl", algorithm=algo, rounds=2))
    on_ray = fedray.run(_job(tmp_path, "ray", algorithm=algo, rounds=2,
                             runtime__backend="ray"))
    assert torch.equal(_flat(inline), _flat(on_ray))


def test_a_stage_section_stays_in_a_job_while_the_stage_is_off():
    """algorithm.stages=[] turns DP off without editing the job (a sweep over stages needs
    that): the section is ignored with a note, but a typo in it still fails."""
    from fedray.algorithms.registry import resolve
    from fedray.config import load_config

    server, notes = load_config().server, []
    off = resolve({"name": "dp_fedavg", "stages": [], "dp": {"clip": 2.0}}, server, notes=notes)
    assert off.stages == () and notes == ["algorithm.dp is ignored: stage dp is not in "
                                          "algorithm.stages"]
    with pytest.raises(ConfigError, match="algorithm.dp.clp"):
        resolve({"name": "dp_fedavg", "stages": [], "dp": {"clp": 2.0}}, server)


def test_dp_refuses_weighting_or_stateful_parts_when_the_job_is_resolved():
    """The refusals of test_dp_refuses_parts_that_leak_or_weight, at resolve time (no run):
    DP's sensitivity needs every update added as it is (weight 1), and nothing else added
    per client (an extra sum or client state would leak past the clipping)."""
    from fedray.algorithms.registry import resolve
    from fedray.config import load_config

    server = load_config().server
    assert resolve({"name": "dp_fedavg"}, server).stage_names == ("dp",)
    with pytest.raises(ConfigError, match="algorithm.aggregator.*weight 1"):
        resolve({"name": "fedavg", "stages": ["dp"]}, server)
    with pytest.raises(ConfigError, match="algorithm.client.*scaffold"):
        resolve({"name": "scaffold", "aggregator": "uniform", "stages": ["dp"]}, server)


@pytest.mark.parametrize(("z", "rule"), [
    (-1e-9, "must be >= 0"), (-1.0, "must be >= 0"),
    (0.99e-6, "must be 0 or in [1e-06, 10000]"), (1e5, "must be 0 or in [1e-06, 10000]"),
])
def test_dp_noise_multiplier_messages_are_the_documented_ones(z, rule):
    """docs/errors.md's dp-negative-noise and dp-noise-range rows: each check its own rule."""
    from fedray.algorithms.base import ParamError

    with pytest.raises(ParamError) as err:
        DifferentialPrivacy(DPParams(noise_multiplier=z))
    assert (err.value.key, err.value.rule, err.value.value) == ("noise_multiplier", rule, z)


# -- the stage by itself (no run): every rule, default and boundary, as tools/mutation.py
# showed the run-level tests above could not see them ---------------------------------------

def _plan(**over) -> RoundPlan:
    return RoundPlan(**({"seed": 5, "population": 1000, "clients_per_round": 10,
                         "sampling": "fixed", "rounds": 8, "num_params": 4} | over))


def _client(stage: DifferentialPrivacy, delta: torch.Tensor, clip: float, seed: int = 11):
    """One client's update through the stage on a worker: the update after it, and how many
    unclipped updates it counted."""
    from fedray.algorithms.base import ClientContext, LocalUpdate, WorkerEnv

    env = WorkerEnv(model=None, device=torch.device("cpu"), lr=0.1, loss="cross_entropy",
                    eval_batch_size=1, batch_size_for=lambda n: n,
                    broadcast={"dp_clip": torch.tensor([clip])})
    ctx = ClientContext(cid=3, round=1, seed=seed, x=torch.zeros(1), y=torch.zeros(1),
                        batch_size=1)
    update = LocalUpdate(delta=delta, num_examples=1, loss_sum=0.0, examples_seen=1, steps=1)
    acc = PartialSum(len(delta), extras={"dp_unclipped": 1})
    stage.client_update(env, ctx, update, acc)
    return update.delta, float(acc.extras["dp_unclipped"][0])


def test_dp_defaults_are_the_documented_ones():
    p = DPParams()
    assert (p.mode, p.clip, p.noise_multiplier, p.target_quantile, p.clip_lr,
            p.count_noise_multiplier, p.delta, p.epsilon_budget, p.accountant) == (
        "central", 1.0, 1.0, None, 0.2, None, None, None, "rdp")
    stage = DifferentialPrivacy()
    stage.init_server(_plan(population=2000))
    assert stage.delta == default_delta(2000) == 1 / 2000 ** 1.1
    assert float(stage.state["clip"][0]) == 1.0 and stage.rounds == 0


@pytest.mark.parametrize(("bad", "key"), [
    ({"mode": "global"}, "mode"), ({"clip": 0.0}, "clip"), ({"clip": -1.0}, "clip"),
    ({"clip": math.inf}, "clip"), ({"clip": math.nan}, "clip"),
    ({"noise_multiplier": -1e-9}, "noise_multiplier"),
    # outside what the accountant can account (fedray.privacy.accountant.ACCOUNTED_NOISE)
    ({"noise_multiplier": 0.99e-6}, "noise_multiplier"),
    ({"noise_multiplier": 1.01e4}, "noise_multiplier"),
    ({"target_quantile": 0.0}, "target_quantile"), ({"target_quantile": 1.0}, "target_quantile"),
    ({"target_quantile": 0.5, "mode": "local"}, "target_quantile"),
    ({"clip_lr": 0.0}, "clip_lr"), ({"count_noise_multiplier": 0.0}, "count_noise_multiplier"),
    ({"delta": 0.0}, "delta"), ({"delta": 1.0}, "delta"),
    ({"epsilon_budget": 0.0}, "epsilon_budget"), ({"accountant": "moments"}, "accountant"),
])
def test_dp_check_refuses_each_bad_value(bad, key):
    from fedray.algorithms.base import ParamError

    with pytest.raises(ParamError, match=key):
        DifferentialPrivacy(DPParams(**bad))


def test_dp_check_accepts_the_values_next_to_each_boundary():
    for ok in ({"mode": "local"}, {"clip": 1e-12}, {"noise_multiplier": 0.0},
               {"noise_multiplier": 1e-6}, {"noise_multiplier": 1e4},
               {"target_quantile": 1e-9}, {"target_quantile": 1 - 1e-9}, {"clip_lr": 1e-9},
               {"count_noise_multiplier": 1e-9}, {"delta": 1e-12}, {"delta": 1 - 1e-9},
               {"epsilon_budget": 1e-9}, {"accountant": "pld"}):
        assert DifferentialPrivacy(DPParams(**ok)).params == DPParams(**ok)


def test_clip_bound_is_exact_and_tight_for_any_vector():
    """clip_ leaves a vector of norm exactly C alone and clips every longer one to a norm in
    [C (1 - 2^-22), C] -- never above C in float64, whatever float32 rounding does."""
    exact = torch.tensor([1.0, 0.0, 0.0])
    assert clip_(exact, 1.0) == 1.0 and torch.equal(exact, torch.tensor([1.0, 0.0, 0.0]))
    g = torch.Generator().manual_seed(0)
    for i in range(300):
        v = torch.randn(257, generator=g) * (1 + i)
        c = 0.37 + i / 300
        before = float(torch.linalg.vector_norm(v, dtype=torch.float64))
        assert clip_(v, c) == before
        after = float(torch.linalg.vector_norm(v, dtype=torch.float64))
        assert c * (1 - 2.0 ** -22) <= after <= c, (i, after / c - 1)
    # the worst case the margin is for: torch rounds the scale to float32 (up by almost
    # 2^-24 relative here) and then the product (up again): with a margin of only 2^-24
    # these land above C (found by a search for a scale just over a rounding midpoint)
    for x, c in ((3.8459484577178955, 1.92325137567297), (2.6144299507141113, 1.3081999905528727),
                 (2.209338903427124, 1.1048174677536184), (1.8412262201309204, 0.9213039588777179)):
        v = torch.tensor([x])
        clip_(v, c)
        assert abs(float(v[0])) <= c, (x, c, float(v[0]))


def test_local_dp_adds_z_c_noise_to_each_clipped_update_from_its_round_seed():
    from fedray.algorithms.privacy import gaussian
    from fedray.core.seeding import TAG_DP_LOCAL, derive_seed

    z, clip, n = 0.75, 0.25, 40_000  # z < 1: noise is added for any z > 0
    stage = DifferentialPrivacy(DPParams(mode="local", clip=clip, noise_multiplier=z))
    noisy, unclipped = _client(stage, torch.zeros(n), clip, seed=11)
    assert unclipped == 1.0  # a zero update is within C
    assert abs(float(noisy.std()) / (z * clip) - 1) < 4 / math.sqrt(2 * n)
    assert torch.equal(noisy, gaussian(n, z * clip, derive_seed(11, TAG_DP_LOCAL)))
    other, _ = _client(stage, torch.zeros(n), clip, seed=12)  # another client or round
    assert not torch.equal(noisy, other)
    # a long update is clipped first, then noised, and not counted as unclipped
    long = torch.full((n,), 1.0)
    out, unclipped = _client(stage, long.clone(), clip, seed=11)
    assert unclipped == 0.0
    expect = long * (clip / math.sqrt(n) * (1 - 2.0 ** -23)) + gaussian(
        n, z * clip, derive_seed(11, TAG_DP_LOCAL))
    assert torch.allclose(out, expect, atol=1e-6)
    # z = 0, or central mode: the worker adds nothing
    for p in (DPParams(mode="local", clip=clip, noise_multiplier=0.0),
              DPParams(mode="central", clip=clip, noise_multiplier=z)):
        plain, unclipped = _client(DifferentialPrivacy(p), torch.full((4,), 0.1), clip)
        assert torch.equal(plain, torch.full((4,), 0.1)) and unclipped == 1.0
    # an update of norm exactly C is within the bound: untouched, and counted as unclipped
    at, unclipped = _client(DifferentialPrivacy(DPParams(clip=0.5, noise_multiplier=0.0)),
                            torch.tensor([0.5, 0.0, 0.0]), 0.5)
    assert unclipped == 1.0 and torch.equal(at, torch.tensor([0.5, 0.0, 0.0]))


def test_local_mode_adds_no_noise_on_the_server():
    stage = DifferentialPrivacy(DPParams(mode="local", clip=0.5, noise_multiplier=2.0))
    stage.init_server(_plan())
    acc = PartialSum(4, extras={"dp_unclipped": 1})
    acc.add(torch.ones(4, dtype=torch.float64), 1.0)
    stage.finish_sum(acc, 1)
    assert torch.equal(acc.total, torch.ones(4, dtype=torch.float64)) and acc.weight == 10


def test_dp_denominator_and_count_noise_with_dropout():
    """E = k (1 - dropout): with 10 a round and dropout 0.2 the sum is divided by 8 whoever
    survived, and the count's default sigma_b is E / 20 = 0.4."""
    stage = DifferentialPrivacy(DPParams(clip=1.0, noise_multiplier=0.0))
    stage.init_server(_plan(dropout=0.2))
    assert stage.expected == pytest.approx(8.0) and stage.count_sigma == pytest.approx(0.4)
    acc = PartialSum(4, extras={"dp_unclipped": 1})
    for _ in range(3):
        acc.add(torch.ones(4, dtype=torch.float64), 1.0)
    acc.extras["dp_unclipped"][0] = 3
    stage.finish_sum(acc, 1)
    assert acc.weight == pytest.approx(8.0) and acc.log_scale == 0.0
    assert torch.allclose(acc.mean(), torch.full((4,), 3 / 8, dtype=torch.float64))
    assert stage.round_metrics()["dp_unclipped_share"] == pytest.approx(3 / 8)
    assert stage.round_metrics()["dp_clip"] == 1.0
    assert stage.summary()["expected_clients"] == pytest.approx(8.0)
    assert stage.rounds == 1
    # the accountant: central DP is amplified by the round's sampling, local DP is not
    for mode, sampling in (("central", "fixed"), ("local", "local")):
        st = DifferentialPrivacy(DPParams(mode=mode, noise_multiplier=1.0))
        st.init_server(_plan())
        assert st.accountant.sampling == sampling, mode
    one = DifferentialPrivacy(DPParams(clip=1.0, noise_multiplier=0.0))
    one.init_server(_plan(clients_per_round=1, dropout=0.5))  # E = 0.5: a share above 1
    acc = PartialSum(4, extras={"dp_unclipped": 1})
    acc.add(torch.ones(4, dtype=torch.float64), 1.0)
    acc.extras["dp_unclipped"][0] = 1
    one.finish_sum(acc, 1)
    assert one.round_metrics()["dp_unclipped_share"] == 2.0
    adaptive = DifferentialPrivacy(DPParams(noise_multiplier=0.5, target_quantile=0.5))
    adaptive.init_server(_plan(dropout=0.2))
    assert adaptive.count_sigma == pytest.approx(0.4)  # the default: E / 20
    assert adaptive.update_z == pytest.approx(update_noise_multiplier(0.5, 0.4))
    assert adaptive.summary()["update_noise_multiplier"] == adaptive.update_z


def test_adaptive_clipping_step_is_exactly_the_rule():
    """C <- C exp(-eta (b - gamma)), b = (unclipped + N(0, sigma_b^2)) / E, the count's noise
    from (seed, round)'s stream, child 1; the update's noise uses z_update, not z."""
    from fedray.algorithms.privacy import gaussian
    from fedray.core.seeding import TAG_DP_NOISE, derive_seed

    p = DPParams(clip=0.8, noise_multiplier=0.6, target_quantile=0.3, clip_lr=0.7,
                 count_noise_multiplier=2.0)
    stage = DifferentialPrivacy(p)
    stage.init_server(_plan(num_params=30_000))
    zu = update_noise_multiplier(0.6, 2.0)
    assert stage.update_z == pytest.approx(zu) and zu > 0.6
    acc = PartialSum(30_000, extras={"dp_unclipped": 1})
    acc.extras["dp_unclipped"][0] = 4
    stage.finish_sum(acc, 3)
    seed = derive_seed(5, TAG_DP_NOISE, 3)
    b = (4 + float(gaussian(1, 2.0, derive_seed(seed, 1), dtype=torch.float64)[0])) / 10
    assert float(stage.state["clip"][0]) == pytest.approx(0.8 * math.exp(-0.7 * (b - 0.3)))
    assert stage.round_metrics()["dp_unclipped_share"] == pytest.approx(b)
    assert stage.round_metrics()["dp_clip"] == 0.8  # the C this round's updates were clipped to
    assert torch.equal(acc.total, gaussian(30_000, zu * 0.8, seed, dtype=torch.float64))
    # the count's noise takes its share of z: 2 sigma_b must exceed z (equal is refused)
    from fedray.errors import ConfigError

    for sigma_b in (0.3, 0.29):
        bad = DifferentialPrivacy(DPParams(noise_multiplier=0.6, target_quantile=0.5,
                                           count_noise_multiplier=sigma_b))
        with pytest.raises(ConfigError, match="count_noise_multiplier"):
            bad.init_server(_plan())
    fine = DifferentialPrivacy(DPParams(noise_multiplier=0.6, target_quantile=0.5,
                                        count_noise_multiplier=0.31))
    fine.init_server(_plan())
    assert fine.update_z == pytest.approx(update_noise_multiplier(0.6, 0.31))
    # z = 0: no noise anywhere, so no share for the count to take
    free = DifferentialPrivacy(DPParams(noise_multiplier=0.0, target_quantile=0.5,
                                        count_noise_multiplier=0.01))
    free.init_server(_plan())
    assert free.update_z == 0.0


def test_softmax_weights_are_refused_and_the_budget_boundary():
    stage = DifferentialPrivacy(DPParams(noise_multiplier=1.0))
    stage.init_server(_plan())
    acc = PartialSum(4, extras={"dp_unclipped": 1})
    acc.add(torch.ones(4, dtype=torch.float64), 1.0, log_scale=0.5)
    with pytest.raises(ValueError, match="softmax"):
        stage.finish_sum(acc, 1)
    assert stage.stop_reason(1) is None  # no budget: never stops
    eps1 = stage.accountant.epsilon(1)
    at = DifferentialPrivacy(DPParams(noise_multiplier=1.0, epsilon_budget=eps1))
    at.init_server(_plan())
    assert at.stop_reason(1) is None  # spending exactly the budget is allowed
    over = DifferentialPrivacy(DPParams(noise_multiplier=1.0, epsilon_budget=eps1 * 0.999))
    over.init_server(_plan())
    assert "round 1 would spend epsilon" in over.stop_reason(1)
    fine = PartialSum(4, extras={"dp_unclipped": 1})
    at.finish_sum(fine, 1)
    assert at.rounds == 1 and at.round_metrics()["dp_epsilon"] == eps1
    assert at.stop_reason(2) is not None and at.summary()["epsilon"] == eps1
    s = at.summary()
    assert (s["rounds"], s["accountant"], s["mode"], s["sampling"], s["noise_multiplier"],
            s["clip"], s["delta"]) == (1, "rdp", "central", "fixed", 1.0, 1.0, at.delta)
    assert at.broadcast()["dp_clip"].dtype == torch.float32
