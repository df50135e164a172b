"""What the personalization family's tests share (tests/algorithms/test_partial_models.py,
test_personal_models.py, test_meta_learning.py): deterministic full-batch regression clients
with their own test splits, a run of a preset on them with every client evaluated after
every round, each client's stored state as the final checkpoint locates it, the per-client
evaluation table, and a CLI run + resume and a 1-vs-3-Ray-workers run of a preset on tiny
synthetic data."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import torch
from example_runs import REPO, cli_run, tiny_job
from linear_regression import regression_clients
from tolerance import F32_EPS, f32_atol, merge_ulps

import fedray
from fedray.state.checkpoint import read_checkpoint
from fedray.state.client_state import ClientStateStore
from fedray.state.run_dir import load_weights

LR, STEPS, ROUNDS, TEST = 0.1, 3, 3, 5


def clients_with_tests(sizes: list[int], scale_step: float = 0.5
                       ) -> dict[int, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Heterogeneous regression clients (tests/linear_regression.py) of ``sizes`` training
    examples, each holding out TEST more as its own test split."""
    out = {}
    for cid, (x, y) in regression_clients([n + TEST for n in sizes],
                                          scale_step=scale_step).items():
        out[cid] = {"train": (x[:-TEST], y[:-TEST]), "test": (x[-TEST:], y[-TEST:])}
    return out


CLIENTS = clients_with_tests([8, 11, 14])  # full participation, 3 clients


def f64(split: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return split[0].astype(np.float64), split[1].astype(np.float64)


def regression_job(out_dir: pathlib.Path | str, name: str, algorithm: dict, *, seed: int,
                   rounds: int, clients: int, per_round: int, lr: float, steps: int,
                   batch_size: int = 64, workers: int = 1, backend: str = "inline",
                   vectorize: str = "off", eval_every: int = 1,
                   extra: dict | None = None) -> dict:
    """A job on regression clients with their own test splits (mse), every client
    evaluated every ``eval_every`` rounds. batch_size 64 > every client's size: each local
    step is a full-batch step (a permutation of all of the client's examples), so a NumPy
    reference needs no batch order. ``extra``: more sections (server, checkpoint, client
    keys), merged one level deep."""
    job = {"name": name, "seed": seed, "rounds": rounds, "model": {"loss": "mse"},
           "algorithm": algorithm,
           "client": {"lr": lr, "batch_size": batch_size, "local_steps": steps},
           "sampling": {"clients_per_round": per_round},
           "runtime": {"backend": backend, "num_workers": workers,
                       "worker": {"num_cpus": 0.5, "vectorize": vectorize}},
           "eval": {"central": False, "federated_clients": clients, "every": eval_every},
           "output": {"dir": str(out_dir)}}
    for section, values in (extra or {}).items():
        job[section] = job.get(section, {}) | values
    return job


def weights_of(res) -> np.ndarray:
    """A one-layer model's weights (its ``weight``), flat, float64."""
    return res.weights["weight"].double().numpy().reshape(-1)


def run_linear(tmp_path: pathlib.Path, name: str, algorithm: dict, model_fn, vectorize: str,
               workers: int = 1, rounds: int = ROUNDS, **client: object
               ) -> tuple[dict[str, np.ndarray], pathlib.Path]:
    """Full participation, STEPS full-batch steps, the in-process backend; every client
    evaluated (its own test split) after every round."""
    job = regression_job(tmp_path / name, name, algorithm, seed=1, rounds=rounds,
                         clients=len(CLIENTS), per_round=len(CLIENTS), lr=LR, steps=STEPS,
                         workers=workers, vectorize=vectorize, extra={"client": client})
    res = fedray.run(job, model_fn=model_fn, client_data=CLIENTS)
    run_dir = pathlib.Path(res.run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["vectorized"] is (vectorize == "on")
    return {k: v.double().numpy() for k, v in res.weights.items()}, run_dir


def stored_versions(run_dir: pathlib.Path | str) -> dict[int, tuple[int, dict]]:
    """Every client's current state, as the run's final checkpoint locates it in the
    client state store: (version, tensors); and every client with state in the store is in
    the checkpoint's index."""
    store = ClientStateStore(f"{run_dir}/client_state")
    current = store.current(read_checkpoint(str(run_dir)).client_versions)
    assert sorted(current) == sorted(store.versions())
    return dict(current.items())


def stored(run_dir: pathlib.Path | str) -> dict[int, dict[str, torch.Tensor]]:
    """Every client's current state's tensors (``stored_versions`` without the versions)."""
    return {cid: state for cid, (_, state) in stored_versions(run_dir).items()}


def eval_table(run_dir: pathlib.Path | str, r: int, clients: dict
               ) -> dict[str, dict[int, float]]:
    """Round ``r``'s per-client table (client_eval/round_NNNNNN.arrow): column -> {client id:
    value}, every one of ``clients`` evaluated, each with its own test split."""
    from fedray.tracking.client_eval import read_table, table_name

    table = read_table((pathlib.Path(run_dir) / table_name(r)).read_bytes()).to_pydict()
    assert sorted(table["client_id"]) == sorted(clients)
    return {col: dict(zip(table["client_id"], table[col], strict=True)) for col in table}


def eval_losses(run_dir: pathlib.Path, r: int, column: str = "loss") -> dict[int, float]:
    """Round ``r``'s per-client mean test loss: the client's own model's (``loss``) or the
    global model's (``global_loss``)."""
    return eval_table(run_dir, r, CLIENTS)[column]


def loss_atol(residual: np.ndarray, x: np.ndarray, weight_atol: float, loss: float,
              factor: float = 4) -> float:
    """How far a client's float32 test loss may be from the float64 one when the weights it
    uses are within ``weight_atol`` of the reference's: the loss 1/2 mean(r^2) moves by at
    most mean(|r| |dr|) + mean(dr^2)/2 for a residual change |dr| <= factor (sum_j |x_j| +
    1) weight_atol (a product of two weights in a two-layer model: twice that, and the
    cross term, taken as a factor 4), plus the float32 evaluation's own rounding, a few ulps
    of the loss (a 5-term mean of products of 3-term sums)."""
    dr = factor * (np.abs(x).sum(1) + 1) * weight_atol
    return float(np.mean(np.abs(residual) * dr + dr ** 2 / 2)) + 16 * F32_EPS * loss


def check_eval(run_dir: pathlib.Path, own_predict, global_predict, atol: float) -> None:
    """The last round's table: each client's ``loss`` is its own model's test mse,
    ``global_loss`` the global model's, and the two differ (the test means something)."""
    own, glob = eval_losses(run_dir, ROUNDS), eval_losses(run_dir, ROUNDS, "global_loss")
    for cid in CLIENTS:
        x, y = f64(CLIENTS[cid]["test"])
        for got, predict in ((own[cid], own_predict), (glob[cid], global_predict)):
            r = predict(cid, x) - y
            expected = 0.5 * np.mean(r ** 2)
            assert abs(got - expected) <= loss_atol(r, x, atol, expected), (cid, got,
                                                                            expected)
        assert abs(own[cid] - glob[cid]) > 1e-3, cid


# -- a preset through the CLI with a resume, and on 1 against 3 Ray workers ---------------

TINY = ["data.synthetic.num_clients=40", "data.synthetic.min_examples=10",
        "data.synthetic.max_examples=30", "data.synthetic.test_writers=20",
        # 16 of 40 a round: over 4 rounds most clients come back with a stored state
        "sampling.clients_per_round=16", "runtime.num_workers=2", "runtime.worker.num_cpus=1",
        "runtime.worker.vectorize=off", "eval.every=0", "output.tensorboard=false",
        "runtime.backend=inline"]


def cli_resumes_bit_for_bit(tmp_path: pathlib.Path, overrides: list[str]) -> None:
    """`fedray run jobs/quickstart.yaml` with ``overrides`` for 2 rounds, then `--resume`
    to 4: the same weights, server state and stored state of every client as a straight
    run of 4."""
    from fedray.cli import main
    from fedray.state.run_dir import SERVER_STATE_FILE, load_tensors

    run_dir = tmp_path / "run"
    cli_run(run_dir, ["rounds=2", *TINY, *overrides])
    main(["run", "--resume", str(run_dir), "rounds=4", "--allow-change", "rounds", "--quiet"])
    straight = fedray.run(str(REPO / "jobs" / "quickstart.yaml"),
                          overrides=["rounds=4", f"output.dir={tmp_path / 'straight'}", *TINY,
                                     *overrides])
    resumed = load_weights(str(run_dir))
    assert resumed.keys() == straight.weights.keys()
    assert all(torch.equal(resumed[k], straight.weights[k]) for k in resumed)
    a, b = (load_tensors(str(d), SERVER_STATE_FILE) for d in (run_dir, straight.run_dir))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    got, want = stored(run_dir), stored(pathlib.Path(straight.run_dir))
    assert got.keys() == want.keys() and len(got) > 16  # more than one round's clients
    for cid in want:
        assert got[cid].keys() == want[cid].keys(), cid
        assert all(torch.equal(got[cid][k], want[cid][k]) for k in want[cid]), cid


def one_vs_three_ray_workers(tmp_path: pathlib.Path, name: str, algorithm: dict,
                             model: str = "logreg") -> None:
    """Three Ray worker processes reading and writing one client state store: each client's
    float32 arithmetic is the same as on one worker; only the driver's float64 merge of the
    partial sums is grouped otherwise (tolerance.merge_ulps: a last bit of the new global
    weights may flip in a round, and the later rounds, the states included, carry it)."""
    rounds = 3
    runs = {}
    for workers in (1, 3):
        job = tiny_job(name, algorithm, model=model, workers=workers)
        job["rounds"], job["sampling"]["clients_per_round"] = rounds, 16
        job["runtime"] = {"num_workers": workers, "worker": {"num_cpus": 0.5,
                                                             "vectorize": "off"}}
        job["output"]["dir"] = str(tmp_path / f"w{workers}")
        res = fedray.run(job)
        assert res.summary["num_workers"] == workers
        runs[workers] = ({k: v.double().numpy() for k, v in res.weights.items()},
                         stored(pathlib.Path(res.run_dir)))
    (one, one_state), (three, three_state) = runs[1], runs[3]
    for k in one:
        np.testing.assert_allclose(three[k], one[k], rtol=0,
                                   atol=f32_atol(one[k], ulps=merge_ulps(rounds)))
    assert one_state.keys() == three_state.keys() and len(one_state) > 16
    for cid, state in one_state.items():
        assert state.keys() == three_state[cid].keys()
        for key, value in state.items():
            a, b = value.double().numpy(), three_state[cid][key].double().numpy()
            np.testing.assert_allclose(b, a, rtol=0,
                                       atol=f32_atol(a, ulps=merge_ulps(rounds)))
