"""Seed 004 Tables 3-5 driver (jobs/paper/scaffold_mnist/run.py): the cells cover what each
seed table compares, and the lr search picks by the table's metric. Pure Python, no Ray."""

from __future__ import annotations

import math

import pytest
from paper_scripts import load_paper_script


@pytest.fixture(scope="module")
def sm():
    return load_paper_script("scaffold_mnist")


def test_cells_cover_the_seed_tables(sm):
    cells = sm.cells({3: 200, 4: 1000, 5: 100})
    t3 = {(c.alg, c.epochs, c.sim) for c in cells if c.table == 3}
    assert t3 == {("fedsgd", 1, s) for s in ("0", "0.1", "1.0")} | {
        (a, e, s)
        for a in ("fedavg", "scaffold", "fedprox")
        for e in (1, 5, 10, 20)
        for s in ("0", "0.1", "1.0")
    }
    assert {(c.clients, c.target) for c in cells if c.table == 3} == {(20, sm.TARGET3)}
    t4 = {(c.alg, c.clients, c.sim, c.epochs) for c in cells if c.table == 4}
    assert t4 == {
        (a, p, s, 5) for a in ("fedavg", "scaffold") for p in (20, 5, 1) for s in ("0", "0.1")
    }
    t5 = [c for c in cells if c.table == 5]
    assert {(c.alg, c.sim) for c in t5} == {
        (a, s) for a in ("fedsgd", "fedavg", "scaffold") for s in ("0", "0.1")
    }
    assert all(c.target is None and "model.name=mlp" in c.overrides(0.1, 0) for c in t5)
    assert len({c.name for c in cells}) == len(cells)  # one run directory per cell


def test_overrides_follow_the_cell(sm):
    c = sm.Cell(4, "scaffold", 5, "0.1", 1, 1000, 0.75)
    o = c.overrides(0.316, 2)
    assert "client.local_epochs=5" in o and "sampling.clients_per_round=1" in o
    assert "data.partition=stores/mnist_sim0.1" in o and "client.lr=0.316" in o
    assert "seed=2" in o and "rounds=1000" in o and "model.name=mlp" not in o
    # SGD takes one full-batch step: no local epochs
    assert not any(
        x.startswith("client.local_epochs")
        for x in sm.Cell(3, "fedsgd", 1, "0", 20, 200, 0.8).overrides(1.0, 0)
    )


def test_selection_prefers_fewest_rounds_then_accuracy_then_smaller_lr(sm):
    target = 0.8
    fast = {1: 0.5, 2: 0.81}
    slow = {1: 0.6, 2: 0.7, 3: 0.95}
    never = {1: 0.79, 2: 0.79}
    keys = {
        -1.0: sm.key(slow, target, 0.1),
        -0.5: sm.key(fast, target, 0.316),
        0.0: sm.key(never, target, 1.0),
    }
    assert sm.choose(keys) == -0.5
    # a tie in rounds: the higher accuracy in that round wins, then the smaller lr
    assert sm.key({2: 0.85}, target, 1.0) > sm.key({2: 0.81}, target, 0.1)
    assert sm.key({2: 0.85}, target, 0.1) > sm.key({2: 0.85}, target, 1.0)
    # no lr reaches the target: the best accuracy decides
    assert sm.key({1: 0.7}, target, 1.0) > sm.key({1: 0.6, 2: 0.65}, target, 0.1)
    # Table 5: the best accuracy
    assert sm.key({1: 0.7, 2: 0.9}, None, 1.0) > sm.key({1: 0.85}, None, 0.1)
    assert sm.reached(slow, target) == 3 and sm.reached(never, target) is None


def test_the_search_extends_past_an_edge_and_stops_inside(sm):
    # keys only need to order: larger is better
    assert sm.next_exponent({-1.0: (1,), -0.5: (2,), 0.0: (3,)}) == 0.5
    assert sm.next_exponent({-1.0: (3,), -0.5: (2,), 0.0: (1,)}) == -1.5
    assert sm.next_exponent({-1.0: (1,), -0.5: (3,), 0.0: (2,)}) is None
    assert sm.next_exponent({1.0: (1,), 1.5: (2,)}) is None  # the upper limit
    assert sm.lr_of(-0.5) == 0.316 and sm.lr_of(-2.5) == 0.00316 and sm.lr_of(0.0) == 1.0


def test_stop_at_target_cap_and_divergence(sm):
    s = sm.StopAt(0.8, cap=5)
    s.on_evaluation(1, {"test_accuracy": 0.5, "test_loss": 1.0})
    assert s.on_round_end(1, {}, None) is None
    assert s.on_round_end(5, {}, None) is sm.STOP  # the cap: cannot beat the best lr any more
    s = sm.StopAt(0.8)
    s.on_evaluation(3, {"test_accuracy": 0.8, "test_loss": 0.5})
    assert s.on_round_end(3, {}, None) is sm.STOP
    s = sm.StopAt(None)
    s.on_evaluation(3, {"test_accuracy": 0.99, "test_loss": 0.1})
    assert s.on_round_end(3, {}, None) is None  # Table 5 runs the whole horizon
    s.on_evaluation(4, {"test_accuracy": 0.1, "test_loss": math.nan})
    assert s.on_round_end(4, {}, None) is sm.STOP


def test_femnist_cells_keep_the_seed_targets_and_read_the_femnist_stores(sm):
    rounds = {3: 300, 4: 300, 5: 100}
    cells = sm.cells(rounds, "femnist")
    # the same cells as MNIST's, on other stores, with the seed's own targets (lines 328, 352)
    assert [(c.table, c.alg, c.epochs, c.sim, c.clients) for c in cells] == [
        (c.table, c.alg, c.epochs, c.sim, c.clients) for c in sm.cells(rounds)]
    assert {c.target for c in cells if c.table == 3} == {0.5}
    assert {c.target for c in cells if c.table == 4} == {0.45}
    assert all(f"data.partition=stores/femnist_sim{c.sim}" in c.overrides(0.1, 0)
               for c in cells)
    # MNIST's targets and run directories are what they were
    assert (sm.TARGET3, sm.TARGET4) == (0.80, 0.75)
    assert sm.Cell(3, "fedavg", 5, "0", 20, 200, 0.8).name == "t3/sim0/p20/fedavg-e5"


def test_femnist_tunes_once_per_algorithm_and_similarity(sm):
    rounds = {3: 300, 4: 300, 5: 100}
    by = {(c.table, c.alg, c.epochs, c.sim, c.clients): c for c in sm.cells(rounds, "femnist")}
    e5 = by[(3, "scaffold", 5, "0.1", 20)]
    # every E of Table 3, and Table 4's cells, take the lr of Table 3's E = 5 cell
    for key in [(3, "scaffold", 1, "0.1", 20), (3, "scaffold", 20, "0.1", 20),
                (4, "scaffold", 5, "0.1", 1), (4, "scaffold", 5, "0.1", 20)]:
        assert sm.tuned_on(by[key], rounds) == e5
    assert sm.tuned_on(e5, rounds) == e5
    sgd = by[(3, "fedsgd", 1, "0", 20)]
    assert sm.tuned_on(sgd, rounds) == sgd
    # Table 5 (another model) and every MNIST cell are tuned on themselves
    t5 = by[(5, "fedavg", 5, "0", 20)]
    assert sm.tuned_on(t5, rounds) == t5
    mnist = sm.Cell(4, "fedavg", 5, "0", 5, 1000, 0.75)
    assert sm.tuned_on(mnist, rounds) == mnist


def test_femnist_searches_below_mnist_lower_limit(sm):
    # an lr chosen at 10^-3 is extended to 10^-3.5 on FEMNIST, and the search stops there on
    # MNIST (its results regenerate as they were)
    tried = {-3.0: (3,), -2.5: (2,), -2.0: (1,)}
    assert sm.next_exponent(tried, sm.DATA["femnist"].limits) == -3.5
    assert sm.next_exponent(tried) is None and sm.DATA["mnist"].limits == sm.LIMITS == (-3.0, 1.5)
