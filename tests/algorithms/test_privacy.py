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
