"""The client-state disk estimate a stateful run prints and checks against
runtime.client_state_mb (fedray.state.client_state_disk)."""

import itertools
import math
import os

import numpy as np
import pytest
from conftest import tiny_job

import fedray
from fedray.core.sampling import sample_clients
from fedray.errors import ConfigError
from fedray.state.checkpoint import read_checkpoint
from fedray.state.client_state import ClientStateStore
from fedray.state.client_state_disk import estimate, expected_clients


def test_expected_clients_is_the_mean_of_distinct_clients_sampled():
    # every way 2 rounds can each draw 2 of 4 clients: 36 equally likely pairs of rounds
    draws = list(itertools.combinations(range(4), 2))
    mean = np.mean([len(set(a) | set(b)) for a in draws for b in draws])
    assert expected_clients(4, 2, 2) == pytest.approx(mean, rel=1e-12)  # 3.0; float64 sums
    # fedray's own sampler: the mean over 200 seeds of 30 rounds of 5 of 105 writers is
    # within 4 standard errors of the formula (the count's spread over seeds, measured)
    counts = [len(set(np.concatenate([sample_clients(s, r, 105, 5) for r in range(1, 31)])))
              for s in range(200)]
    se = np.std(counts) / math.sqrt(len(counts))
    assert abs(np.mean(counts) - expected_clients(105, 5, 30)) < 4 * se
    # a billion clients, 100 a round, 10 rounds: R k - C(R, 2) k^2 / N to second order (the
    # third is ~1e-10 of 1000); computed as 1 - (1 - 1e-7)^10 in float64 it would keep only
    # 7 of its 16 digits
    assert expected_clients(10**9, 100, 10) == pytest.approx(1000 - 45 * 100**2 / 1e9,
                                                             rel=1e-12)
    assert expected_clients(10, 20, 3) == 10 and expected_clients(10, 0, 3) == 0


def test_superseded_states_in_packs_are_counted_and_bounded():
    d = 1000  # 4,000 bytes a client in float32
    one = estimate(100, 10, 50, d, pack_mb=0)  # a file per client: the current states
    assert one.per_client == 4000
    assert one.expected == pytest.approx(one.clients * 4000, rel=1e-12)  # the same sum
    assert one.bound == pytest.approx(2 * one.expected, rel=1e-12)  # + checkpointed ones
    packed = estimate(100, 10, 50, d, pack_mb=1)  # 263 states a pack: one a round, kept
    # while any of its 10 states is current: sum over rounds of 10 (1 - (1 - s_t)^10)
    s = 0.9 ** (50 - np.arange(1, 51))
    assert packed.expected == pytest.approx(4000 * np.sum(10 * (1 - (1 - s) ** 10)), rel=1e-12)
    assert packed.bound == 50 * 10 * 4000  # every state written
    two = estimate(100, 10, 50, d, pack_mb=1, workers=2)  # two packs of 5 a round: fewer kept
    assert one.expected < two.expected < packed.expected
    short = estimate(100, 10, 1, d)  # a single round: nothing superseded
    assert short.bound == short.expected == 10 * 4000
    assert estimate(100, 10, 50, d, "float16").expected == packed.expected / 2


def test_a_run_prints_its_estimate_and_its_store_stays_within_the_bound(tmp_path, capsys):
    """SCAFFOLD inline on 40 writers, 8 a round over 2 workers, 6 rounds: the note's numbers
    are the estimate's, the current states take exactly clients x per-client bytes of tensor
    data, and the whole store on disk (superseded states in packs included) is within the
    bound; float16 storage halves the state (its effect on accuracy: performance.md)."""
    for dtype in ("float32", "float16"):
        job = tiny_job(tmp_path, rounds=6, algorithm={"name": "scaffold"},
                       runtime={"backend": "inline", "num_workers": 2,
                                "worker": {"state_dtype": dtype}},
                       output={"dir": str(tmp_path / dtype)})
        result = fedray.run(job)
        d = sum(v.numel() for v in result.weights.values())
        disk = estimate(40, 8, 6, d, dtype, 8.0, workers=2)  # 4 states a pack
        err = capsys.readouterr().err
        assert f"fedray: {disk.line(6, dtype)}" in err.splitlines(), err
        versions = read_checkpoint(str(tmp_path / dtype)).client_versions
        store = ClientStateStore(str(tmp_path / dtype / "client_state"), cache_mb=0)
        current = store.current(versions)
        assert sum(t.numel() * (4 if dtype == "float32" else 2) for _, s in current.values()
                   for t in s.values()) == len(current) * disk.per_client
        on_disk = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in
                      os.walk(tmp_path / dtype / "client_state") for f in fs)
        headers = 200 * 6 * 8  # a safetensors header per state written, generously
        assert on_disk <= disk.bound + headers


def test_a_run_over_its_client_state_budget_is_refused_before_round_1(tmp_path):
    job = tiny_job(tmp_path, algorithm={"name": "scaffold"}, runtime={
        "backend": "inline", "client_state_mb": 0.001})
    with pytest.raises(ConfigError, match=r"config key 'runtime.client_state_mb': the run's "
                       r"client state is expected to take .* MB on disk \(.* clients sampled, "):
        fedray.run(job)
    assert not (tmp_path / "run").exists()


def test_a_run_with_float16_state_resumes_bit_for_bit(tmp_path):
    """SCAFFOLD with runtime.worker.state_dtype=float16, cut after round 4 (checkpoint every
    2) and resumed: the weights and every client's stored state equal the uninterrupted
    run's, since the stored float16 values are what both read back."""
    import torch
    from timing.clocked_runs import CrashAfter

    def job(name: str) -> dict:
        return tiny_job(tmp_path, rounds=6, algorithm={"name": "scaffold"},
                        checkpoint={"every": 2, "every_s": 0},
                        runtime={"backend": "inline", "num_workers": 2,
                                 "worker": {"state_dtype": "float16"}},
                        output={"dir": str(tmp_path / name)})

    whole = fedray.run(job("whole"))
    with pytest.raises(KeyboardInterrupt):
        fedray.run(job("cut"), callbacks=[CrashAfter(3)])
    resumed = fedray.run(resume=str(tmp_path / "cut"))
    assert resumed.summary["resumed_from_round"] == 2
    assert all(torch.equal(whole.weights[k], resumed.weights[k]) for k in whole.weights)
    states = []
    for name in ("whole", "cut"):
        store = ClientStateStore(str(tmp_path / name / "client_state"), cache_mb=0, half=True)
        states.append(store.current(read_checkpoint(str(tmp_path / name)).client_versions))
    assert states[0].keys() == states[1].keys()
    for cid, (_, s) in states[0].items():
        assert all(torch.equal(t, states[1][cid][1][k]) for k, t in s.items())
