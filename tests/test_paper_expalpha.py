"""Seed 003's controlled experiments (jobs/paper/expalpha_mnist/fig2.py, tables89.py): their
configurations are valid jobs with exactly the make-up they name, Tables 8-9 keep the seed's
t x E budget, and Fig. 2's weights are read back from the participants tables as the
softmax of each round's log weights."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
from paper_scripts import ROOT, load_paper_script

from fedray.config import load_config, validate
from fedray.data.transforms.per_round import parse_per_round
from fedray.tracking.client_eval import table_bytes


@pytest.fixture(scope="module")
def fig2():
    return load_paper_script("expalpha_mnist", "fig2.py")


@pytest.fixture(scope="module")
def tables89(fig2):
    return load_paper_script("expalpha_mnist", "tables89.py")


def test_every_configuration_is_a_valid_job_with_its_make_up(fig2):
    """The seed's {1.0 x 4, 0.01 x 3, 0.1 x 3} (line 138) and 4 of 6 corrupted (line 177)
    become exact compositions of the section-6 jobs, which validate against a 100-client
    pool (the store's population only numbers the clients)."""
    seen = {}
    for cfg in fig2.CONFIGS:
        for _, suffix in fig2.METHODS.items():
            job = ROOT / "jobs/paper/expalpha_mnist" / f"{cfg.setting}_{suffix}.yaml"
            c = load_config(str(job), list(cfg.overrides))
            validate(c, 100)
            pr = parse_per_round(c.data.per_round)
            # nothing drawn per client any more: ratio 1.0 (class-balanced) for the flips
            assert pr.ranked and pr.corruption == 0
            assert pr.ratios == (() if cfg.setting == "imbalance" else (1.0,))
            seen[cfg.name] = (pr, c.sampling.clients_per_round)
    pr, k = seen["imb_seed"]
    assert k == 10 and sorted(pr.composition) == [0.01] * 3 + [0.1] * 3 + [1.0] * 4
    pr, k = seen["flip_4_one"]
    assert k == 6 and pr.corrupted == 4 and pr.flip_ratio == 0.1 and pr.composition == ()
    assert {n for n in seen} == {c.name for c in fig2.CONFIGS}


def _run(root, name: str, log_weights: list[list[float]], kinds: list[list[float]],
         acc: float) -> None:
    run = root / name
    (run / "participants").mkdir(parents=True)
    for r, (lw, kd) in enumerate(zip(log_weights, kinds, strict=True), 1):
        t = pa.table({"client_id": np.arange(len(lw)), "arrived": np.ones(len(lw), bool),
                      "expalpha_log_weight": np.array(lw), "imbalance_ratio": np.array(kd)})
        (run / "participants" / f"round_{r:06d}.arrow").write_bytes(table_bytes(t))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "test_accuracy": 0.1}) + "\n"
                                       + json.dumps({"round": 2, "test_accuracy": acc}) + "\n")


def test_weights_are_each_rounds_softmax_averaged_per_kind(fig2, tmp_path):
    """Round 1: log weights (0, 0, log 2) -> weights 1/4, 1/4, 1/2; round 2: equal, 1/3
    each. Kind 1.0 holds the third client in both: (1/2 + 1/3) / 2; kind 0.1 the first two:
    (1/4 + 1/3) / 2."""
    _run(tmp_path, "run", [[0.0, 0.0, math.log(2)], [5.0, 5.0, 5.0]],
         [[0.1, 0.1, 1.0], [0.1, 0.1, 1.0]], 0.5)
    weights, cv = fig2.kind_weights(tmp_path / "run", "imbalance_ratio")
    assert weights == pytest.approx({0.1: (1 / 4 + 1 / 3) / 2, 1.0: (1 / 2 + 1 / 3) / 2},
                                    rel=1e-12)
    w1 = np.array([0.25, 0.25, 0.5])
    assert cv == pytest.approx((w1.std() / w1.mean() + 0.0) / 2, rel=1e-12)
    assert fig2.final_accuracy(tmp_path / "run") == 0.5


def test_tables_8_9_cells_keep_the_budget_and_share_one_row(tables89, tmp_path):
    """t x E fixed as in the seed's four settings (t = 400, 200, 100, 50 for E = 20 .. 160,
    line 364), shortened 4x: 100, 50, 25, 13 rounds. Table 9's ratio-0.1 row is Table 8's
    E = 160 row, run once; every run is a valid job of four balanced clients and six at the
    cell's ratio."""
    assert [tables89.rounds_for(e) for e in tables89.STEPS] == [100, 50, 25, 13]
    cells = tables89.cells()
    assert len(cells) == len(set(cells)) == 8 and (160, 0.1) in cells
    runs = list(tables89.runs(str(tmp_path), (0, 1, 2), None, None))
    assert len(runs) == 8 * 5 * 3 and len({out for _, _, out, _ in runs}) == len(runs)
    job, over, out, _ = next(r for r in runs if "E160_r0.3/alpha25-s2" in r[2])
    c = load_config(job, over)
    validate(c, 100)
    pr = parse_per_round(c.data.per_round)
    assert sorted(pr.composition) == [0.3] * 6 + [1.0] * 4 and pr.ratios == ()
    assert (c.client.local_steps, c.rounds, c.seed) == (160, 13, 2)
    assert c.algorithm.expalpha.alpha == 25.0
    # a tie is reported as a tie, never broken towards the grid's first alpha
    assert tables89.best({0.2: 0.8945, 1.0: 0.8945, 5.0: 0.894}) == [0.2, 1.0]
    only = list(tables89.runs(str(tmp_path), (0,), ["E20_r0.1"], 3))
    assert len(only) == 5 and all("rounds=3" in o for _, o, _, _ in only)
