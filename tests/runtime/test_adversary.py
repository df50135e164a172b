"""The threat model (fedray.runtime.adversary) and the runtime's attack hooks, on the inline
backend (no Ray): who is malicious (a pure function of (seed, client id), or a list of ids),
the adversary section's one-line config errors, what the workers and the driver do to a
malicious client's data, update and row (the same bit for bit at any worker count and on
resume), and the defense's score in metrics.jsonl (defense_precision, defense_recall) and
a backdoor's test_attack_success."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import blobs, fixed_linear
from example_runs import importable  # noqa: F401 -- a fixture: examples.median importable
from tolerance import f32_atol, merge_ulps

import fedray
from fedray.algorithms.attacks import Backdoor, BackdoorParams, image_dims, trigger_mask
from fedray.api import prepare
from fedray.core.seeding import TAG_ADVERSARY, derive_seed
from fedray.errors import ConfigError, PartError
from fedray.runtime.adversary import Adversary, DefenseRound, flagged_rows, resolve
from fedray.state.checkpoint import read_checkpoint
from fedray.state.run_dir import read_metrics
from fedray.tracking.callbacks import Callback

# 4 x 4 "images" (16 inputs: image_dims((16,)) == (4, 4)), so that the backdoor applies too
DIM, CLASSES = 16, 3
CLIENTS = blobs(12, dim=DIM, classes=CLASSES, seed=4)
TEST = (np.random.default_rng(9).normal(size=(60, DIM)).astype(np.float32),
        np.random.default_rng(10).integers(0, CLASSES, 60))
# individual aggregators (the omniscient attacks' need), fedray.algorithms.robust's: the
# coordinate-wise median, which also says each row's influence (its defense_flagged_ids), and
# FedAvg's weighted mean of the rows
MEDIAN, MEAN = {"name": "median"}, {"name": "fedavg", "aggregator": "mean"}
ADVERSARY_KEYS = ("adversary_clients", "adversary_client_ids", "defense_flagged",
                  "defense_flagged_ids", "defense_precision", "defense_recall",
                  "test_attack_success")


def job(tmp_path, name: str, adversary: dict | None, *, workers: int = 1,
        algorithm: dict | None = None, rounds: int = 4, **extra) -> dict:
    out = {"name": name, "seed": 2, "rounds": rounds,
           "algorithm": algorithm or {"name": "fedavg"},
           "client": {"lr": 0.1, "batch_size": 4, "local_steps": 3},
           "sampling": {"clients_per_round": 6},
           "runtime": {"backend": "inline", "num_workers": workers,
                       "worker": {"num_cpus": 0.5, "vectorize": "off"}},
           "output": {"dir": str(tmp_path / name), "tensorboard": False}, **extra}
    if adversary is not None:
        out["adversary"] = adversary
    return out


def run(tmp_path, name: str, adversary: dict | None, *, clients=None, callbacks=(),
        **kw) -> fedray.RunResult:
    return fedray.run(job(tmp_path, name, adversary, **kw), model_fn=fixed_linear(DIM)[0],
                      client_data=CLIENTS if clients is None else clients, test_data=TEST,
                      callbacks=list(callbacks))


def adversary_lists(metrics: list[dict]) -> list[dict]:
    """Each round's adversary and defense metrics (ids, counts, scores)."""
    return [{k: m[k] for k in ADVERSARY_KEYS if k in m} | {"round": m["round"]}
            for m in metrics]


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    """Every run here is inline: any Ray call fails the test (as tests/runtime/
    test_inline.py's fixture of that name)."""
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("the inline backend called Ray")

    for name in ("init", "put", "get", "wait", "remote", "kill", "get_gpu_ids",
                 "get_runtime_context"):
        monkeypatch.setattr(ray, name, refuse)


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- who is malicious ---------------------------------------------------------------------

def test_the_malicious_set_is_a_function_of_seed_and_client_id():
    section = {"fraction": 0.3, "attacks": ["sign_flip"]}
    a, b = resolve(section, 7), resolve(dict(section), 7)
    ids = np.arange(2000)
    assert a is not b and np.array_equal(a.mask(ids), b.mask(ids))
    # the rule itself: a client's 63-bit hash of (seed, id) below fraction x 2^63
    want = [derive_seed(7, TAG_ADVERSARY, int(c)) < 0.3 * 2.0 ** 63 for c in ids]
    assert a.mask(ids).tolist() == want == [a.is_malicious(int(c)) for c in ids]
    assert not np.array_equal(resolve(section, 8).mask(ids), a.mask(ids))
    # in any order, for any subset: a client's status does not depend on who else is asked
    shuffled = np.random.default_rng(0).permutation(ids)[:300]
    assert a.mask(shuffled).tolist() == [want[c] for c in shuffled]
    assert a.mask(np.array([], np.int64)).shape == (0,)


@pytest.mark.parametrize("fraction", [0.05, 0.2, 0.5, 0.9])
@pytest.mark.parametrize("seed", [0, 123456789])
def test_the_realized_share_is_the_fraction(fraction, seed):
    n = 20_000
    share = resolve({"fraction": fraction, "attacks": ["sign_flip"]}, seed).mask(
        np.arange(n)).mean()
    sd = math.sqrt(fraction * (1 - fraction) / n)  # binomial: 0.0015 to 0.0035
    assert abs(share - fraction) < 4 * sd


def test_fraction_edges_and_explicit_clients():
    ids = np.arange(5000)
    assert resolve({"fraction": 1.0, "attacks": ["noise"]}, 3).mask(ids).all()
    assert resolve({"fraction": 1, "attacks": ["noise"]}, 3).mask(ids).all()
    assert not Adversary(seed=3, fraction=0.0).mask(ids).any()
    listed = resolve({"clients": [4, 0, 17], "attacks": ["noise"]}, 3, population=20)
    assert np.flatnonzero(listed.mask(ids)).tolist() == [0, 4, 17]
    assert listed.fraction == 0.0 and listed.clients == frozenset({0, 4, 17})
    # no attack configured: no adversary at all
    assert resolve({}, 3) is None and resolve(None, 3) is None
    assert resolve({"fraction": 0.0, "clients": [], "attacks": []}, 3) is None


def test_the_attacks_are_sorted_by_where_they_act():
    adv = resolve({"fraction": 0.2, "attacks": ["backdoor", "scaling", "label_flip", "ipm"],
                   "scaling": {"boost": 3.0}, "backdoor": {"target": 1, "size": 2}}, 1)
    assert adv.names == ("backdoor", "scaling", "label_flip", "ipm")
    assert [a.name for a in adv.data_attacks] == ["backdoor", "label_flip"]
    assert [a.name for a in adv.update_attacks] == ["scaling"]
    assert [a.name for a in adv.row_attacks] == ["ipm"]
    assert adv.attacks[1].params.boost == 3.0 and adv.attacks[0].params.target == 1
    assert adv.attacks[1].describe() == {"boost": 3.0}
    # only the backdoor measures its success on the central test set
    adv.check_data((DIM,), CLASSES, TEST[0])
    made = adv.test_sets(*TEST)
    assert [name for name, _, _ in made] == ["backdoor"]
    assert (made[0][2] == 1).all() and len(made[0][2]) == int((TEST[1] != 1).sum())


# -- the section's one-line errors ---------------------------------------------------------

def _refused(tmp_path, adversary: dict, *, start: bool = False, **extra) -> str:
    """The ConfigError of a job with this adversary section: from fedray.api.prepare (what
    the config and the parts say), or, with ``start``, from fedray.run (the data's checks,
    before round 1)."""
    j = job(tmp_path, "refused", adversary, **extra)
    with pytest.raises(ConfigError) as info:
        if start:
            fedray.run(j, model_fn=fixed_linear(DIM)[0], client_data=CLIENTS, test_data=TEST)
        else:
            prepare(j, client_data=CLIENTS, model_fn=fixed_linear(DIM)[0], test_data=TEST)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "refused").exists()  # refused before anything was written
    return str(info.value)


@pytest.mark.parametrize("adversary, prefix", [
    ({"fraction": 0.3, "attacks": ["sing_flip"]},
     "config key 'adversary.attacks': must be one of: label_flip, backdoor, sign_flip"),
    ({"fraction": 0.3, "attacks": ["sign_flip"], "sign_flip": {"scal": 2.0}},
     "unknown config key 'adversary.sign_flip.scal' (allowed under 'adversary.sign_flip': "
     "scale)"),
    ({"fraction": 0.3, "attacks": ["sign_flip"], "sign_flp": {"scale": 2.0}},
     "unknown config key 'adversary.sign_flp' (allowed under 'adversary': fraction, "
     "clients, attacks, sign_flip)"),
    # a built-in attack's section while the attack is off is still checked
    ({"fraction": 0.3, "attacks": ["sign_flip"], "noise": {"stdd": 1.0}},
     "unknown config key 'adversary.noise.stdd'"),
    ({"fraction": 1.5, "attacks": ["sign_flip"]},
     "config key 'adversary.fraction': must be in [0, 1], got 1.5"),
    ({"fraction": -0.1, "attacks": ["sign_flip"]},
     "config key 'adversary.fraction': must be in [0, 1], got -0.1"),
    ({"fraction": 0.3, "clients": [1], "attacks": ["sign_flip"]},
     "config key 'adversary.clients': give the malicious clients by fraction or by id, "
     "not both"),
    ({"fraction": 0.3},
     "config key 'adversary.attacks': names no attack, while adversary.fraction makes "
     "clients malicious"),
    ({"clients": [2]},
     "config key 'adversary.attacks': names no attack, while adversary.clients makes "
     "clients malicious"),
    ({"attacks": ["sign_flip"]},
     "config key 'adversary.fraction': is 0 and adversary.clients is empty: no client "
     "carries out sign_flip"),
    ({"clients": [3, 12], "attacks": ["sign_flip"]},
     "config key 'adversary.clients': names client 12; the data has clients 0..11"),
    ({"clients": [-1], "attacks": ["sign_flip"]},
     "config key 'adversary.clients': must be a list of client ids >= 0"),
    ({"fraction": 0.3, "attacks": ["ipm", "ipm"]},
     "config key 'adversary.attacks': names ipm twice"),
    ({"fraction": 0.3, "attacks": ["sign_flip"], "sign_flip": {"scale": -1.0}},
     "config key 'adversary.sign_flip.scale': must be > 0, got -1.0"),
], ids=["unknown-attack", "unknown-param", "unknown-section", "idle-section-typo",
        "fraction-above-1", "fraction-below-0", "fraction-and-clients", "fraction-only",
        "clients-only", "attacks-only", "client-out-of-range", "negative-client", "twice",
        "bad-param"])
def test_config_errors_are_one_line(tmp_path, adversary, prefix):
    assert _refused(tmp_path, adversary).startswith(prefix)


def test_omniscient_attacks_need_an_individual_aggregator_without_stages(tmp_path):
    message = _refused(tmp_path, {"fraction": 0.3, "attacks": ["alie"]})  # fedavg's sums
    assert message.startswith("config key 'algorithm.aggregator': attack alie "
                              "(adversary.attacks) rewrites the round's individual updates, "
                              "which aggregator proportional does not collect")
    message = _refused(tmp_path, {"fraction": 0.3, "attacks": ["ipm"]},
                       algorithm=MEDIAN | {"stages": ["norm_bound"]})
    assert message.startswith("config key 'algorithm.stages': attack ipm (adversary.attacks) "
                              "rewrites updates on the driver, after the update stages ran "
                              "on the workers")


def test_an_attack_the_data_cannot_take_is_refused_before_round_1(tmp_path):
    flat5 = {c: (x[:, :5].copy(), y) for c, (x, y) in CLIENTS.items()}  # not images
    j = job(tmp_path, "refused", {"fraction": 0.3, "attacks": ["backdoor"]})
    with pytest.raises(ConfigError) as info:
        fedray.run(j, model_fn=fixed_linear(5)[0], client_data=flat5,
                   test_data=(TEST[0][:, :5].copy(), TEST[1]))
    assert str(info.value).startswith("config key 'adversary.backdoor.trigger': draws on "
                                      "images; the inputs have shape (5,)")
    assert _refused(tmp_path, {"fraction": 0.3, "attacks": ["label_flip"],
                               "label_flip": {"target": 3}}, start=True).startswith(
        "config key 'adversary.label_flip.target': must be a class of the data (0..2), got 3")
    assert _refused(tmp_path, {"fraction": 0.3, "attacks": ["backdoor"],
                               "backdoor": {"target": 5, "size": 2}}, start=True).startswith(
        "config key 'adversary.backdoor.target': must be a class of the data (0..2)")
    assert _refused(tmp_path, {"fraction": 0.3, "attacks": ["backdoor"],
                               "backdoor": {"size": 4}}, start=True).startswith(  # default
        "config key 'adversary.backdoor.size': must leave the trigger inside the 4 x 4 images")


# -- the defense's score --------------------------------------------------------------------

def test_defense_round_metrics():
    both = DefenseRound(malicious=[9, 3, 5], flagged=[5, 7, 3, 11]).metrics()
    assert both == {"adversary_clients": 3, "defense_flagged": 4,
                    "adversary_client_ids": [3, 5, 9], "defense_flagged_ids": [3, 5, 7, 11],
                    "defense_precision": 0.5, "defense_recall": 2 / 3}
    nothing_flagged = DefenseRound(malicious=[4], flagged=[]).metrics()
    assert "defense_precision" not in nothing_flagged
    assert nothing_flagged["defense_recall"] == 0.0 and nothing_flagged["defense_flagged"] == 0
    no_attacker = DefenseRound(malicious=[], flagged=[2]).metrics()
    assert "defense_recall" not in no_attacker and no_attacker["defense_precision"] == 0.0
    quiet = DefenseRound(malicious=[], flagged=[]).metrics()
    assert quiet == {"adversary_clients": 0, "defense_flagged": 0,
                     "adversary_client_ids": [], "defense_flagged_ids": []}


def test_flagged_rows_are_those_below_half_their_fair_share():
    k = 4  # fair share 0.25: flagged below 0.125
    influence = torch.tensor([0.5, 0.125, 0.12499, 0.255], dtype=torch.float64)
    assert flagged_rows(influence, k).tolist() == [False, False, True, False]
    assert flagged_rows(np.full(k, 1 / k), k).tolist() == [False] * k  # the plain mean
    assert flagged_rows([0.0, 1.0, 0.0], 3).tolist() == [True, False, True]  # Krum's pick
    assert flagged_rows(np.ones((2, 1)) / 2, 2).tolist() == [False, False]
    with pytest.raises(ValueError, match="influence has 3 values for 4 rows"):
        flagged_rows([0.2, 0.3, 0.5], 4)


# -- the runtime: the same bit for bit at any worker count and on resume -------------------

SIGN_FLIP = ({"fraction": 0.3, "attacks": ["sign_flip"], "sign_flip": {"scale": 100.0}},
             {"guard": {"max_update_norm": 1.0}})  # the guard drops the flipped updates
CASES = {
    "label_flip": ({"fraction": 0.3, "attacks": ["label_flip"],
                    "label_flip": {"mode": "random"}}, {}),
    "backdoor": ({"fraction": 0.3, "attacks": ["backdoor"],
                  "backdoor": {"size": 2, "target": 1}}, {}),
    "sign_flip": SIGN_FLIP,
    "alie": ({"fraction": 0.3, "attacks": ["alie"]}, {}),
    "ipm": ({"fraction": 0.3, "attacks": ["ipm"], "ipm": {"epsilon": 0.5}}, {}),
    "scaling": ({"fraction": 0.3, "attacks": ["scaling"], "scaling": {"boost": 5.0}}, {}),
    "noise": ({"fraction": 0.3, "attacks": ["noise"], "noise": {"std": 0.5}}, {}),
}


@pytest.mark.parametrize("case, algorithm", [
    *((case, MEDIAN) for case in CASES), ("label_flip", MEAN), ("sign_flip", MEAN),
], ids=[*(f"{case}-median" for case in CASES), "label_flip-mean", "sign_flip-mean"])
def test_one_and_three_workers_are_bit_identical(tmp_path, case, algorithm):
    """With an individual aggregator the driver gets every client's float32 row in the
    round's sampled order whatever the worker count and aggregates them once, so the
    runs are bit for bit equal: the malicious set, the data and update attacks (the
    client's round seed), the rows rewritten on the driver and the rows the aggregator
    down-weighted (its influence) included."""
    adversary, extra = CASES[case]
    one = run(tmp_path, "one", adversary, algorithm=algorithm, **extra)
    three = run(tmp_path, "three", adversary, workers=3, algorithm=algorithm, **extra)
    assert len(three.summary["workers"]) == 3
    assert same_weights(one.weights, three.weights)
    assert adversary_lists(one.metrics) == adversary_lists(three.metrics)
    lists = adversary_lists(one.metrics)
    assert sum(m["adversary_clients"] for m in lists) > 0  # the rounds had attackers
    if case == "sign_flip":  # the guard dropped every attacker (and the median its rows)
        assert all(set(m["adversary_client_ids"]) <= set(m["defense_flagged_ids"])
                   for m in lists)
    if case in ("alie", "ipm"):  # the median left some rows out: lists worth comparing
        assert any(m["defense_flagged"] for m in lists)
    clean = run(tmp_path, "clean", None, algorithm=algorithm, **extra)
    assert not same_weights(clean.weights, one.weights)  # the attack did something
    assert not any(k in m for m in clean.metrics for k in ADVERSARY_KEYS)


def test_fedavg_worker_counts_agree_and_name_the_same_clients(tmp_path):
    """FedAvg's float64 partial sums merge in another grouping at another worker count:
    the lists are the same exactly, the weights to tolerance.merge_ulps (a last float32
    bit of a weight may flip in a round)."""
    adversary, extra = SIGN_FLIP
    runs = [run(tmp_path, f"w{n}", adversary, workers=n, **extra) for n in (1, 3)]
    assert adversary_lists(runs[0].metrics) == adversary_lists(runs[1].metrics)
    for k, v in runs[0].weights.items():
        np.testing.assert_allclose(runs[1].weights[k].double().numpy(), v.double().numpy(),
                                   rtol=0, atol=f32_atol(v, ulps=merge_ulps(4)))


class _Crash(Callback):
    """A process killed after round ``at``'s metrics were written."""

    def __init__(self, at: int):
        self.at = at

    def on_round_end(self, round, metrics, weights):
        if round == self.at:
            raise KeyboardInterrupt


@pytest.mark.parametrize("case", list(CASES))
def test_resume_is_bit_identical_with_the_same_adversary(tmp_path, case):
    """Every attack: the malicious set and the attacks' draws come from (seed, round,
    client id), so a run cut after round 3 and resumed from round 2's checkpoint is the
    straight run's, bit for bit."""
    adversary, extra = CASES[case]
    kw = {"rounds": 5, "checkpoint": {"every": 2}, **extra}
    if case in ("alie", "ipm"):  # omniscient: an individual aggregator
        kw["algorithm"] = MEDIAN
    whole = run(tmp_path, "whole", adversary, **kw)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, "cut", adversary, callbacks=[_Crash(3)], **kw)
    run_dir = str(tmp_path / "cut")
    assert read_checkpoint(run_dir).round == 2 and len(read_metrics(run_dir)) == 3
    resumed = fedray.run(resume=run_dir, model_fn=fixed_linear(DIM)[0], client_data=CLIENTS,
                         test_data=TEST)
    assert [m["round"] for m in resumed.metrics] == [3, 4, 5]
    assert same_weights(resumed.weights, whole.weights)
    assert adversary_lists(read_metrics(run_dir)) == adversary_lists(whole.metrics)
    assert sum(m["adversary_clients"] for m in whole.metrics) > 0


# -- the hooks do what the attack says, where it says ---------------------------------------

def test_a_data_attack_is_what_the_malicious_clients_train_on(tmp_path):
    """label_flip all_to_one on listed clients: the run is, bit for bit, a clean run on data
    whose listed clients' labels are all the target; a backdoor triggering every example
    (poison_fraction 1) likewise a clean run on their stamped, relabelled images."""
    bad = [1, 4, 7]
    flipped = run(tmp_path, "flip", {"clients": bad, "attacks": ["label_flip"],
                                     "label_flip": {"target": 2}})
    relabelled = {c: (x, np.full_like(y, 2) if c in bad else y) for c, (x, y) in CLIENTS.items()}
    assert same_weights(flipped.weights, run(tmp_path, "relabelled", None,
                                             clients=relabelled).weights)
    lists = adversary_lists(flipped.metrics)
    assert all(set(m["adversary_client_ids"]) <= set(bad) for m in lists)
    assert set().union(*(m["adversary_client_ids"] for m in lists))  # some were sampled

    backdoored = run(tmp_path, "backdoor", {"clients": bad, "attacks": ["backdoor"],
                                            "backdoor": {"poison_fraction": 1.0, "size": 2,
                                                         "value": 3.0, "target": 0}})
    mask = np.zeros((4, 4), bool)
    mask[1:3, 1:3] = True  # a 2 x 2 square one pixel in from the bottom-right corner
    assert (trigger_mask(4, 4, 2, "square") == mask).all() and image_dims((DIM,)) == (4, 4)

    def stamped(x):
        out = x.copy()
        out[:, mask.reshape(-1)] = 3.0
        return out

    triggered = {c: (stamped(x), np.zeros_like(y)) if c in bad else (x, y)
                 for c, (x, y) in CLIENTS.items()}
    assert same_weights(backdoored.weights, run(tmp_path, "triggered", None,
                                                clients=triggered).weights)


@pytest.mark.usefixtures("importable")
@pytest.mark.parametrize("name", ["fedavg", "expalpha"])
def test_an_update_attack_is_what_the_malicious_clients_send(tmp_path, name):
    """sign_flip on every client is examples.median's SignFlip stage on every client (the
    same float32 product, -scale x delta), bit for bit; each round names all six. Exp-alpha
    weighs each update by the loss of x + delta, the trained weights the replica no longer
    holds once the attack replaced the delta: it must see the sent update, as after a
    stage."""
    attacked = run(tmp_path, "attack", {"fraction": 1.0, "attacks": ["sign_flip"],
                                        "sign_flip": {"scale": 4.0}},
                   algorithm={"name": name})
    staged = run(tmp_path, "stage", None, algorithm={
        "name": name, "stages": ["examples.median:SignFlip"],
        "signflip": {"fraction": 1.0, "scale": 4.0}})
    assert same_weights(attacked.weights, staged.weights)
    assert all(m["adversary_clients"] == 6 for m in attacked.metrics)


@pytest.mark.parametrize("defense", ["guard", "norm_bound"])
def test_a_norm_defense_catches_the_attackers_and_scores_it(tmp_path, defense):
    """sign_flip x 100 against a bound of 1 that every honest update passes: the guard
    (guard.max_update_norm) drops exactly the attackers, the norm_bound stage clips exactly
    them (update.flagged); either way precision and recall are 1 in every round."""
    adversary, extra = SIGN_FLIP
    if defense == "norm_bound":
        extra = {"algorithm": {"name": "fedavg", "stages": ["norm_bound"],
                               "norm_bound": {"max_norm": 1.0}}}
    res = run(tmp_path, "defended", adversary, rounds=5, **extra)
    lists = adversary_lists(res.metrics)
    assert sum(m["adversary_clients"] for m in lists) >= 3
    for m, whole in zip(lists, res.metrics, strict=True):
        assert m["defense_flagged_ids"] == m["adversary_client_ids"], m
        dropped = m["adversary_clients"] if defense == "guard" else 0
        assert whole["dropped_updates"] == dropped
        if m["adversary_clients"]:
            assert m["defense_precision"] == m["defense_recall"] == 1.0
        else:
            assert "defense_recall" not in m and "defense_precision" not in m
    # the honest updates pass the bound: without an adversary nothing is dropped, and the
    # metrics are not written at all
    clean = run(tmp_path, "clean", None, rounds=5, **SIGN_FLIP[1])
    assert all(m["dropped_updates"] == 0 for m in clean.metrics)
    assert not any(k in m for m in clean.metrics for k in ADVERSARY_KEYS)


def test_a_backdoors_success_is_measured_at_each_evaluation(tmp_path):
    adversary = {"fraction": 0.3, "attacks": ["backdoor"],
                 "backdoor": {"size": 2, "target": 1, "poison_fraction": 0.8}}
    res = run(tmp_path, "backdoor", adversary, rounds=5, eval={"every": 2})
    evaluated = [m["round"] for m in res.metrics if "test_accuracy" in m]
    assert evaluated == [2, 4, 5]
    assert [m["round"] for m in read_metrics(res.run_dir) if "test_attack_success" in m] == \
        evaluated
    assert all(0 <= m["test_attack_success"] <= 1 for m in res.metrics
               if "test_attack_success" in m)
    # the last one: the final model's accuracy on the test set's other classes, triggered
    # (value unset: the test inputs' extreme farthest from their mean), labelled 1
    attack = Backdoor(BackdoorParams(size=2, target=1, poison_fraction=0.8))
    attack.check_data((DIM,), CLASSES, TEST[0])
    x, y = attack.poison_test(*TEST)
    model = fixed_linear(DIM)[0]()
    model.load_state_dict(res.weights)
    with torch.no_grad():
        hits = (model(torch.from_numpy(x)).argmax(1).numpy() == y).mean()
    assert res.metrics[-1]["test_attack_success"] == pytest.approx(hits, abs=1e-12)


DEFENSES = '''
import torch

from fedray.algorithms.base import Aggregator, UpdateStage


class FlagThrees(UpdateStage):
    """Flags (as a clipping stage would) the updates of clients 0, 3, 6, ..."""

    name = "flag_threes"

    def client_update(self, env, ctx, update, acc):
        update.flagged = ctx.cid % 3 == 0


class DropOnes(Aggregator):
    """The mean of the rows of clients other than 1, 4, 7, ...: their influence is 0."""

    name = "drop_ones"
    individual = True
    bad_shape = False

    def aggregate(self, updates, clients, acc):
        keep = (clients.ids % 3 != 1).to(torch.float64)
        if not bool(keep.any()):
            keep = torch.ones_like(keep)
        self.influence = keep / keep.sum()
        if self.bad_shape:
            self.influence = self.influence[1:]
        return (updates.double() * self.influence[:, None]).sum(0) if not self.bad_shape \
            else updates.double().mean(0)


class BadInfluence(DropOnes):
    bad_shape = True
'''


def test_a_stages_flag_and_an_aggregators_influence_count_as_the_defenses(tmp_path):
    """Every client malicious (scaling by 1: the honest update), so each round's adversary
    list is its sampled clients: the defense flagged those the stage flagged (ids 0 mod 3)
    and those the aggregator gave no influence (ids 1 mod 3), and nothing else."""
    path = tmp_path / "my_defenses.py"
    path.write_text(DEFENSES)
    res = run(tmp_path, "defended", {"fraction": 1.0, "attacks": ["scaling"],
                                     "scaling": {"boost": 1.0}}, rounds=3,
              algorithm={"name": "fedavg", "aggregator": f"{path}:DropOnes",
                         "stages": [f"{path}:FlagThrees"]})
    for m in adversary_lists(res.metrics):
        sampled = m["adversary_client_ids"]
        assert len(sampled) == 6
        want = [c for c in sampled if c % 3 in (0, 1)]
        assert m["defense_flagged_ids"] == want and m["defense_flagged"] == len(want)
        assert m["defense_precision"] == 1.0 and m["defense_recall"] == len(want) / 6
    with pytest.raises(PartError, match=r"aggregate\(\) set influence wrongly: influence has "
                                        r"5 values for 6 rows"):
        run(tmp_path, "bad", {"fraction": 1.0, "attacks": ["scaling"]}, rounds=1,
            algorithm={"name": "fedavg", "aggregator": f"{path}:BadInfluence"})


# -- a user's attack by import path: what the runtime refuses ------------------------------

ATTACKS = '''
from fedray.algorithms.base import Attack


class DropOne(Attack):
    def poison_data(self, env, ctx):
        ctx.x, ctx.y = ctx.x[1:], ctx.y[1:]


class NanRows(Attack):
    omniscient = True

    def poison_rows(self, updates, malicious, clients, seed, round_idx):
        updates[malicious] = float("nan")
'''


def test_a_users_attack_that_breaks_the_rules_is_named(tmp_path):
    path = tmp_path / "my_attacks.py"
    path.write_text(ATTACKS)
    with pytest.raises(PartError, match=rf"attack {path}:DropOne \(adversary.attacks\): "
                                        r"poison_data\(\) changed the client's \d+ examples"):
        run(tmp_path, "drop", {"fraction": 0.5, "attacks": [f"{path}:DropOne"]})
    with pytest.raises(PartError, match=rf"attack {path}:NanRows \(adversary.attacks\): "
                                        r"poison_rows\(\) left a non-finite value"):
        run(tmp_path, "nan", {"fraction": 0.5, "attacks": [f"{path}:NanRows"]},
            algorithm=MEDIAN)
