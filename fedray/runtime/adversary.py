"""The threat model: which clients are malicious, and where their attacks act.

A job's ``adversary`` section names the malicious clients -- each client with probability
``fraction``, decided once for the run by a hash of (seed, client id), or the explicit ids
of ``clients`` -- and the attacks they carry out, in order (``attacks``: registered names
of fedray.algorithms.attacks or import paths of a user's ``Attack``), each with its
hyper-parameters under ``adversary.<section>``:

    adversary:
      fraction: 0.2
      attacks: [backdoor, scaling]     # Bagdasaryan et al.'s model replacement
      backdoor: {target: 0}
      scaling: {boost: 10}

Being a function of (seed, client id) only, the malicious set is the same on every worker,
in every round, at any worker count and after ``--resume``; the attacks draw from the
client's round seed. The runtime calls the attacks' hooks for malicious clients only: the
worker poisons their data before they train and their updates after (before the guard,
the update stages and the aggregator), the driver rewrites their rows of the round's
individual updates (omniscient attacks). Because the simulator knows who is malicious, it
also measures the defense: per round, the sampled malicious clients and the clients the
defense discarded or down-weighted (``defense_metrics``). docs/robustness.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.algorithms import registry
from fedray.core.seeding import TAG_ADVERSARY, derive_seed
from fedray.errors import ConfigError, key_error
from fedray.section import plain

SECTION = "adversary"
KEYS = ("fraction", "clients", "attacks")


@dataclass(frozen=True)
class Adversary:
    """The run's malicious clients and their attacks (``resolve``)."""

    seed: int
    fraction: float = 0.0
    clients: frozenset[int] = frozenset()
    attacks: tuple[Any, ...] = ()  # fedray.algorithms.base.Attack, in the job's order
    names: tuple[str, ...] = ()  # as the job names them
    # the aggregator's own clients (Aggregator.trusted: FLTrust's root data), never malicious
    trusted: frozenset[int] = frozenset()

    def is_malicious(self, cid: int) -> bool:
        cid = int(cid)
        return cid not in self.trusted and (cid in self.clients or (
            self.fraction > 0 and derive_seed(self.seed, TAG_ADVERSARY, cid)
            < self.fraction * 2.0 ** 63))

    def label(self, attack: Any) -> str:
        """How an error names one of the attacks: as the job does."""
        at = next(i for i, a in enumerate(self.attacks) if a is attack)
        return f"attack {self.names[at]} (adversary.attacks)"

    def mask(self, ids: Any) -> np.ndarray:
        """bool, one per id: which of these clients are malicious."""
        return np.fromiter((self.is_malicious(c) for c in np.asarray(ids).tolist()), bool,
                           count=len(ids))

    def _with(self, hook: str) -> tuple[Any, ...]:
        # imported when used, not at the top: it loads torch (start-up time)
        from fedray.algorithms.base import Attack

        return tuple(a for a in self.attacks
                     if getattr(type(a), hook) is not getattr(Attack, hook))

    @property
    def data_attacks(self) -> tuple[Any, ...]:
        return self._with("poison_data")

    @property
    def update_attacks(self) -> tuple[Any, ...]:
        return self._with("poison_update")

    @property
    def row_attacks(self) -> tuple[Any, ...]:
        return tuple(a for a in self.attacks if a.omniscient)

    def check_data(self, input_shape: tuple[int, ...], num_classes: int,
                   test_x: Any = None) -> None:
        """Each attack against the job's data, before round 1 (one line naming the key)."""
        # imported when used, not at the top: it loads torch (start-up time)
        from fedray.algorithms.base import ParamError

        for attack in self.attacks:
            try:
                attack.check_data(tuple(input_shape), int(num_classes), test_x)
            except ParamError as exc:
                raise key_error(f"{SECTION}.{attack.section or attack.name}.{exc.key}",
                                exc.rule, exc.value) from None

    def check_parts(self, aggregator: Any, aggregator_name: str,
                    stage_names: tuple[str, ...]) -> None:
        """Omniscient attacks need the round's individual updates, and replace them on the
        driver after the update stages ran on the workers: refused otherwise, in one
        line, before round 1."""
        for attack in self.row_attacks:
            if not aggregator.individual:
                raise key_error("algorithm.aggregator", f"{self.label(attack)} "
                                "rewrites the round's individual updates, which aggregator "
                                f"{aggregator_name} does not collect: use one that does "
                                "(mean is FedAvg's; median, trimmed_mean, krum, ...)",
                                aggregator_name)
            if stage_names:
                raise key_error("algorithm.stages", f"{self.label(attack)} "
                                "rewrites updates on the driver, after the update stages "
                                "ran on the workers, so they would not apply to it: use "
                                "it without stages", list(stage_names))

    def test_sets(self, x: Any, y: Any) -> list[tuple[str, Any, Any]]:
        """(attack name, x, y) for each attack that measures its success on the central
        test set (``Attack.poison_test``), non-empty."""
        out = []
        for name, attack in zip(self.names, self.attacks, strict=True):
            made = attack.poison_test(x, y)
            if made is not None and len(made[1]):
                out.append((name, *made))
        return out


def resolve(section: Any, seed: int, population: int | None = None,
            trusted: tuple[int, ...] = ()) -> Adversary | None:
    """The job's ``adversary`` section as an ``Adversary``, every key checked in one line;
    None when no attack is configured. ``trusted``: the aggregator's own clients
    (``Aggregator.trusted``), left out of the malicious set."""
    tree = plain(section)
    fraction, clients = tree.get("fraction", 0.0), tree.get("clients") or []
    refs = tree.get("attacks") or []
    if not isinstance(refs, list) or not all(isinstance(r, str) and r for r in refs):
        raise key_error(f"{SECTION}.attacks", "must be a list of attack names or import "
                        "paths, e.g. [sign_flip]", refs)
    twice = sorted({r for r in refs if refs.count(r) > 1})
    if twice:
        raise key_error(f"{SECTION}.attacks", f"names {twice[0]} twice", refs)
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) \
            or not 0 <= fraction <= 1:
        raise key_error(f"{SECTION}.fraction", "must be in [0, 1]", fraction)
    if not isinstance(clients, list) or not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in clients):
        raise key_error(f"{SECTION}.clients", "must be a list of client ids >= 0", clients)
    if population is not None and clients and max(clients) >= population:
        raise key_error(f"{SECTION}.clients", f"names client {max(clients)}; the data has "
                        f"clients 0..{population - 1}", clients)
    if fraction and clients:
        raise key_error(f"{SECTION}.clients", "give the malicious clients by fraction or "
                        "by id, not both (set adversary.fraction=0)", clients)
    classes = [registry.lookup("attack", r, f"{SECTION}.attacks") for r in refs]
    used = {c.section for c in classes if c.section}
    extra = [k for k in tree if k not in KEYS]  # sections: the attacks' own, or a typo
    idle = {c.section for c in registry.registered("attack").values() if c.section} \
        if extra else set()
    for key in extra:
        value = tree[key]
        if key not in used and key not in idle:
            allowed = ", ".join([*KEYS, *sorted(used)])
            raise ConfigError(f"unknown config key '{SECTION}.{key}' (allowed under "
                              f"'{SECTION}': {allowed})")
        if not isinstance(value, dict):
            raise key_error(f"{SECTION}.{key}", "must be a section of keys", value)
    attacks = []
    for ref, cls in zip(refs, classes, strict=True):
        key = f"{SECTION}.{cls.section}" if cls.section else f"{SECTION}.attacks"
        params = registry.params_of(cls, tree.get(cls.section) if cls.section else None, key,
                                    f"{SECTION}.attacks {ref}")
        attacks.append(registry.build(cls, params, key, None, f"{SECTION}.attacks {ref}"))
    for key in idle - used:  # a built-in attack's section while it is off: a typo still fails
        if key in tree:
            cls = next(c for c in registry.registered("attack").values() if c.section == key)
            registry.params_of(cls, tree[key], f"{SECTION}.{key}")
    if not attacks:
        if fraction or clients:
            raise key_error(f"{SECTION}.attacks", "names no attack, while adversary."
                            f"{'fraction' if fraction else 'clients'} makes clients "
                            "malicious: name what they do, e.g. [sign_flip]", refs)
        return None
    if not fraction and not clients:
        raise key_error(f"{SECTION}.fraction", f"is 0 and adversary.clients is empty: no "
                        f"client carries out {', '.join(refs)}", fraction)
    overlap = sorted(set(clients) & set(trusted))
    if overlap:
        raise key_error(f"{SECTION}.clients", f"names client {overlap[0]}, which the "
                        "aggregator trusts as the server's own (its root data set)", clients)
    return Adversary(seed=int(seed), fraction=float(fraction),
                     clients=frozenset(int(c) for c in clients), attacks=tuple(attacks),
                     names=tuple(refs),
                     trusted=frozenset(int(c) for c in trusted))


@dataclass(frozen=True)
class DefenseRound:
    """One round of the defense as the simulator sees it: the kept clients that are
    malicious, and those the defense discarded or down-weighted."""

    malicious: list[int]
    flagged: list[int]

    def metrics(self) -> dict[str, Any]:
        """What metrics.jsonl records: the two lists, their counts, and the defense's
        precision (flagged clients that are malicious) and recall (malicious clients it
        flagged), absent where undefined (nothing flagged; no attacker in the round)."""
        bad, hit = set(self.malicious), set(self.flagged)
        caught = len(bad & hit)
        out: dict[str, Any] = {"adversary_clients": len(bad), "defense_flagged": len(hit),
                               "adversary_client_ids": sorted(bad),
                               "defense_flagged_ids": sorted(hit)}
        if hit:
            out["defense_precision"] = caught / len(hit)
        if bad:
            out["defense_recall"] = caught / len(bad)
        return out


def flagged_rows(influence: Any, k: int) -> np.ndarray:
    """Rows an individual aggregator discarded or down-weighted: below half their fair
    share (1/k) of the round's update (``Aggregator.influence``)."""
    share = np.asarray(influence, np.float64).reshape(-1)
    if share.shape != (k,):
        raise ValueError(f"influence has {share.size} values for {k} rows")
    return share < 0.5 / k
