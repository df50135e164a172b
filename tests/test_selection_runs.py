"""Client selection and IFCA end to end, through `fedray run` on jobs/quickstart.yaml (logistic
regression on 40 synthetic writers, a few seconds a run): the runs finish and write what
they promise (each round's participants table, IFCA's ``cluster`` in it and in the federated
evaluation's per-client table, the selectors' metrics, their state in the checkpoint); one
Ray worker or three choose the same clients and train the same models; and a run stopped
after 2 rounds and resumed to 4 is the straight run of 4 bit for bit, the selector's and
IFCA's state included (Oort without the clock too: its durations are all unknown). Also:
Oort learns from a round in which nobody finished, and a selector's refusal of
sampling.always comes before the run starts.

Why: a selector learns from what the workers report, and IFCA keeps models outside the
global one; both are state that must travel through the workers' reports, the merge and the
checkpoint without depending on how many workers there are or on where the run stopped.

The smoke runs and the resumes use runtime.backend=inline (no Ray: bit-identical to the Ray
backend at the same worker count, tests/runtime/test_inline.py). The worker-count test runs
on the session's Ray. Its comparisons: who was invited, who arrived, each client's cluster,
examples and simulated durations, the counts and the simulated clock are exact (they are
functions of (seed, round) and the selector's state); the trained weights, and what is
computed from them (losses, accuracies), come from the same float32 arithmetic per client
but a float64 merge of the workers' partial sums grouped otherwise, which may flip a last
bit of a weight in a round (tests/tolerance.py, merge_ulps). The resume is the same
computation throughout and is compared bit for bit.
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest
import torch
from tolerance import f32_atol, merge_ulps

from fedray.cli import main
from fedray.state.run_dir import SERVER_STATE_FILE, load_tensors, load_weights, read_metrics
from fedray.tracking.client_eval import read_table

ROOT = pathlib.Path(__file__).resolve().parents[1]
TINY = ["model.name=logreg", "data.synthetic.num_clients=40", "data.synthetic.min_examples=10",
        "data.synthetic.max_examples=30", "data.synthetic.test_writers=20",
        "sampling.clients_per_round=8", "client.lr=0.02", "eval.every=0",
        "runtime.worker.vectorize=off", "output.tensorboard=false"]
INLINE = ["runtime.backend=inline", "runtime.num_workers=2", "runtime.worker.num_cpus=0.5"]
OORT = ["algorithm.selector=oort", "clock.enabled=true"]
OORT_NO_CLOCK = ["algorithm.selector=oort"]  # no durations: every one unknown, T never set
POWER = ["algorithm.selector=power_of_choice", "clock.enabled=true"]
IFCA = ["algorithm.name=ifca"]
# a round's wall-clock timings and memory: what a rerun may change (the simulated clock's
# sim_*_s and Oort's oort_preferred_s are results, compared like the others)
WALL = {"train_s", "wall_s", "elapsed_s", "worker_busy_s", "merge_s", "updates_per_s",
        "driver_mem_mb", "worker_mem_mb"}


def run(out: pathlib.Path, *overrides: str) -> pathlib.Path:
    assert main(["run", str(ROOT / "jobs" / "quickstart.yaml"), *TINY, *overrides,
                 f"output.dir={out}", "--quiet"]) == 0
    return out


def tables(run_dir: pathlib.Path, folder: str = "participants") -> dict[str, object]:
    return {p.name: read_table(p.read_bytes())
            for p in sorted((run_dir / folder).glob("round_*.arrow"))}


def values(metrics: list[dict]) -> list[dict]:
    """Each round's metrics without its wall-clock timings and memory."""
    out = [{k: v for k, v in m.items() if k not in WALL} for m in metrics]
    # a key left that looks like a timing must be a simulated one (else WALL is stale)
    assert all(k.startswith(("sim_", "oort_")) for m in out for k in m
               if k.endswith(("_s", "_mb"))), out
    return out


# -- the runs write what they promise ----------------------------------------------------------

def test_oort_on_the_clock(tmp_path):
    out = run(tmp_path / "oort", "rounds=3", *OORT, *INLINE)
    metrics = read_metrics(str(out))
    got = tables(out)
    assert list(got) == [f"round_00000{r}.arrow" for r in (1, 2, 3)]
    for m, table in zip(metrics, got.values(), strict=True):
        assert table.column_names == ["client_id", "arrived", "loss", "examples",
                                      "duration_s"]
        cols = {k: np.asarray(v) for k, v in table.to_pydict().items()}
        assert table.num_rows == 8 and (np.diff(cols["client_id"]) > 0).all()
        assert cols["arrived"].sum() == m["updates"] == m["clients"]
        assert np.isfinite(cols["loss"][cols["arrived"]]).all()
        assert np.isfinite(cols["duration_s"]).all() and (cols["duration_s"] > 0).all()
        assert max(cols["duration_s"]) <= m["sim_round_s"] + 1e-9 * m["sim_time_s"]
    # Oort's explored clients: everyone it invited before the round (feedback records each
    # invitee, arrived or not), kept sorted in its checkpointed state
    invited = [set(t["client_id"].to_pylist()) for t in got.values()]
    seen: set[int] = set()
    for m, ids in zip(metrics, invited, strict=True):
        assert m["oort_explored"] == len(seen)
        seen |= ids
    # epsilon 0.9, then times 0.98 a round; k - ceil(epsilon k) exploited once any client
    # is known: 8 - ceil(7.2, 7.056, 6.91...) = 0, 0, 1 (all online: no clock availability)
    assert [m["oort_exploration"] for m in metrics] == [0.9, 0.9 * 0.98, 0.9 * 0.98 * 0.98]
    assert [m["oort_exploited"] for m in metrics] == [0.0, 0.0, 1.0]
    assert "oort_preferred_s" not in metrics[0] and metrics[1]["oort_preferred_s"] > 0
    state = load_tensors(str(out), SERVER_STATE_FILE)
    assert state["selector.ids"].tolist() == sorted(seen)
    assert state["selector.invited"].sum() == 3 * 8


def test_oort_learns_from_a_round_nobody_finished(tmp_path):
    """A deadline no update meets: nobody trains, yet each round's invitees are recorded
    (not arrived, their durations), Oort's knowledge grows and its exploration decays."""
    out = run(tmp_path / "late", "rounds=2", *OORT, "clock.deadline_s=0.001", *INLINE)
    metrics = read_metrics(str(out))
    assert [(m["clients"], m["late"]) for m in metrics] == [(0, 8), (0, 8)]
    assert [m["oort_explored"] for m in metrics] == [0.0, 8.0]
    assert [m["oort_exploration"] for m in metrics] == [0.9, 0.9 * 0.98]
    for table in tables(out).values():
        assert table.num_rows == 8 and not any(table["arrived"].to_pylist())
        assert all(d > 0.001 for d in table["duration_s"].to_pylist())
    state = load_tensors(str(out), SERVER_STATE_FILE)
    assert len(state["selector.ids"]) == 16 and (state["selector.utility"] == 0).all()


def test_power_of_choice_and_uniform_tables(tmp_path):
    """power_of_choice learns nothing from feedback: no table unless output.participants;
    on the clock the round waits for the probe."""
    out = run(tmp_path / "pow", "rounds=2", *POWER, *INLINE)
    metrics = read_metrics(str(out))
    assert not (out / "participants").exists()
    assert all(m["power_of_choice_probed"] == 16 and m["sim_probe_s"] > 0 for m in metrics)
    assert all(math.isfinite(m["power_of_choice_loss"]) for m in metrics)
    out = run(tmp_path / "uniform", "rounds=2", "output.participants=true", *INLINE)
    assert [t.num_rows for t in tables(out).values()] == [8, 8]
    assert not any(k.startswith(("oort", "power")) for k in read_metrics(str(out))[0])


def test_ifca_tables(tmp_path):
    out = run(tmp_path / "ifca", "rounds=2", *IFCA, "eval.federated_clients=6", *INLINE)
    metrics = read_metrics(str(out))
    for table in tables(out).values():
        assert table.column_names[-1] == "cluster"
        cols = {k: np.asarray(v, dtype=np.float64) for k, v in table.to_pydict().items()}
        arrived = cols["arrived"].astype(bool)
        assert set(cols["cluster"][arrived]) <= {0.0, 1.0}
        assert np.isnan(cols["cluster"][~arrived]).all()
    for m in metrics:
        assert m["ifca_share_0"] + m["ifca_share_1"] == pytest.approx(1.0, abs=1e-15)
    evals = tables(out, "client_eval")
    assert list(evals) == ["round_000002.arrow"]  # eval.every 0: after the last round
    table = evals["round_000002.arrow"]
    assert table.num_rows == 6 and "cluster" in table.column_names
    assert set(table["cluster"].to_pylist()) <= {0.0, 1.0}
    # model 1 is IFCA's state, and a state_dict like model.safetensors in models/
    state = load_tensors(str(out), SERVER_STATE_FILE)
    weights = load_weights(str(out))
    size = sum(v.numel() for v in weights.values())
    assert state["aggregator.models"].shape == (1, size)
    assert sorted(p.name for p in (out / "models").iterdir()) == ["cluster_1.safetensors"]
    other = load_tensors(str(out), "models/cluster_1.safetensors")
    assert sorted(other) == sorted(weights) == ["1.bias", "1.weight"]
    # logreg is one linear layer: its weight, then its bias, in the flat weights
    assert torch.equal(torch.cat([other["1.weight"].reshape(-1), other["1.bias"]]),
                       state["aggregator.models"][0])
    assert not all(torch.equal(other[k], weights[k]) for k in weights)


def test_a_selector_refuses_pinned_clients_before_the_run(tmp_path, capsys):
    assert main(["run", str(ROOT / "jobs" / "quickstart.yaml"), *TINY,
                 "algorithm.selector=oort", "sampling.always=[1]",
                 f"output.dir={tmp_path / 'no'}", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedray: error: config key 'sampling.always': cannot be combined "
                          "with algorithm.selector oort"), err
    assert err.count("\n") == 1 and not (tmp_path / "no").exists()


# -- one Ray worker or three ---------------------------------------------------------------------

def _same_tables(a: dict, b: dict) -> None:
    """Who was invited and what the clock and the data say of them: exact. Their training
    loss comes from the weights (see the module docstring)."""
    assert list(a) == list(b) and a
    for name in a:
        x, y = a[name].to_pydict(), b[name].to_pydict()
        assert x.keys() == y.keys()
        for col in x:
            if col == "loss":
                np.testing.assert_allclose(y[col], x[col], rtol=1e-5, atol=0)
            else:
                np.testing.assert_array_equal(x[col], y[col])


@pytest.mark.parametrize("algorithm", [OORT, POWER, IFCA], ids=["oort", "power_of_choice",
                                                                 "ifca"])
def test_one_vs_three_ray_workers(ray_cluster, tmp_path, algorithm):
    rounds = 3
    # one worker inline (the Ray backend's bits at one worker, tests/runtime/test_inline.py:
    # one Ray start fewer), three on Ray, whose actors answer the probe and the reports
    runs = {n: run(tmp_path / f"w{n}", f"rounds={rounds}", *algorithm,
                   f"runtime.backend={backend}", f"runtime.num_workers={n}",
                   "runtime.worker.num_cpus=0.5", "output.participants=true")
            for n, backend in ((1, "inline"), (3, "ray"))}
    one, three = runs[1], runs[3]
    assert [json.loads((d / "summary.json").read_text())["num_workers"]
            for d in (one, three)] == [1, 3]
    _same_tables(tables(one), tables(three))
    m1, m3 = values(read_metrics(str(one))), values(read_metrics(str(three)))
    assert [m.keys() for m in m1] == [m.keys() for m in m3]
    for a, b in zip(m1, m3, strict=True):
        for k in a:
            if k.endswith(("_loss", "_accuracy")):  # of the weights: train, test, probe
                # a loss of weights a merge apart (module docstring): 1e-5 is ~80 float32
                # ulps, far above merge_ulps' few and far below a real difference (another
                # client, another cluster: 1e-3 and more); an accuracy moves only if a
                # test example sits within those ulps of a tie, so it is in effect exact
                assert math.isclose(a[k], b[k], rel_tol=1e-5, abs_tol=0.0), k
            else:
                assert a[k] == b[k], k
    w1, w3 = load_weights(str(one)), load_weights(str(three))
    for k in w1:
        np.testing.assert_allclose(w3[k].double().numpy(), w1[k].double().numpy(), rtol=0,
                                   atol=f32_atol(w1[k], ulps=merge_ulps(rounds)))
    s1, s3 = (load_tensors(str(d), SERVER_STATE_FILE) for d in (one, three))
    assert s1.keys() == s3.keys()
    for k in s1:
        if k == "aggregator.models":  # IFCA's other model: weights, as above
            np.testing.assert_allclose(s3[k].double().numpy(), s1[k].double().numpy(), rtol=0,
                                       atol=f32_atol(s1[k], ulps=merge_ulps(rounds)))
        elif k == "selector.utility":  # examples x a training loss
            np.testing.assert_allclose(s3[k].numpy(), s1[k].numpy(), rtol=1e-5, atol=0)
        elif k == "selector.exploited":
            np.testing.assert_allclose(s3[k].numpy(), s1[k].numpy(), rtol=1e-5, atol=0)
        else:  # who was seen, when, how long they took
            assert torch.equal(s1[k], s3[k]), k
    if algorithm == IFCA:
        c1, c3 = (load_tensors(str(d), "models/cluster_1.safetensors") for d in (one, three))
        for k in c1:
            np.testing.assert_allclose(c3[k].double().numpy(), c1[k].double().numpy(), rtol=0,
                                       atol=f32_atol(c1[k], ulps=merge_ulps(rounds)))


# -- a resumed run is the straight run -------------------------------------------------------

@pytest.mark.parametrize("algorithm", [OORT, OORT_NO_CLOCK, IFCA],
                         ids=["oort", "oort-no-clock", "ifca"])
def test_resume_is_bit_identical(tmp_path, algorithm):
    # eval.every 1: the half run evaluates its last round, as the straight run then must
    straight = run(tmp_path / "straight", "rounds=4", "eval.every=1", *algorithm, *INLINE,
                   "output.participants=true")
    half = run(tmp_path / "half", "rounds=2", "eval.every=1", *algorithm, *INLINE,
               "output.participants=true")
    assert main(["run", "--resume", str(half), "rounds=4", "--allow-change", "rounds",
                 "--quiet"]) == 0
    assert values(read_metrics(str(half))) == values(read_metrics(str(straight)))
    assert [m["round"] for m in read_metrics(str(half))] == [1, 2, 3, 4]
    assert (half / "model.safetensors").read_bytes() == \
        (straight / "model.safetensors").read_bytes()
    a, b = (load_tensors(str(d), SERVER_STATE_FILE) for d in (half, straight))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    own = [k for k in a if k.startswith(("selector.", "aggregator."))]
    assert own  # the part that must survive the resume is there
    if algorithm == OORT_NO_CLOCK:  # unknown durations and the unset T, saved as -1
        assert (a["selector.duration_s"] == -1).all() and a["selector.preferred_s"] == -1
    # each round's participants table, byte for byte (NaN durations without a clock, or
    # cluster values of clients that did not arrive, would make Table.equals say no)
    files = [sorted((d / "participants").iterdir()) for d in (half, straight)]
    assert [f.name for f in files[0]] == [f.name for f in files[1]] and len(files[0]) == 4
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(*files, strict=True))
    if algorithm == IFCA:  # and IFCA's other model as saved beside model.safetensors
        assert (half / "models" / "cluster_1.safetensors").read_bytes() == \
            (straight / "models" / "cluster_1.safetensors").read_bytes()
