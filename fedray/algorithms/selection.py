"""Client selection: who takes part in a round (``algorithm.selector``; docs/selection.md).

A ``Selector`` (fedray.algorithms.base) picks the round's invitees from what the server has
learned of clients; the runtime then runs them like any sample (dropout, over-selection,
the clock's deadline) and reports back each invitee's loss, examples, simulated duration
and whether its update arrived (``ClientFeedback``).

``uniform``          every eligible client equally likely: fedray's sampler as it always was.
``power_of_choice``  Cho et al. 2020 (pow-d): draw ``candidates * k`` clients uniformly,
                     probe the global model's loss on each one's data, invite the k with
                     the highest loss. The probe is a forward pass on the workers, and on
                     the simulated clock the round waits for the slowest candidate's answer.
``oort``             Lai et al., OSDI 2021: exploit the clients of highest utility --
                     statistical (the loss they trained with, times their examples) plus a
                     staleness bonus, penalized when slower than the preferred round
                     duration -- and explore a share of never-seen clients that decays
                     round by round; a pacer relaxes the preferred duration when the
                     utility collected stops growing.

Each keeps its knowledge sparse, over the clients it has seen (sorted id arrays in its
``state``, checkpointed), so a round costs O(k) for ``uniform`` and ``power_of_choice``
and O(clients seen) for ``oort``, never O(population).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fedray.algorithms.base import (
    ClientFeedback,
    RoundPlan,
    SelectionContext,
    Selector,
    require,
)
from fedray.algorithms.registry import register

__all__ = ["Oort", "OortParams", "PowerOfChoice", "PowerOfChoiceParams", "UniformSelector"]


@register
class UniformSelector(Selector):
    """Every eligible client equally likely, independently of the past: the draw fedray
    has always made (``SelectionContext.sample`` without exclusions), bit for bit."""

    name = "uniform"
    wants_feedback = False

    def select(self, ctx: SelectionContext) -> np.ndarray:
        return ctx.sample(ctx.k)


@dataclass
class PowerOfChoiceParams:
    # d = ceil(candidates * k) clients drawn uniformly and probed; the k of highest loss
    # are invited (1: no choice, uniform sampling with a wasted probe)
    candidates: float = 2.0
    # a loss evaluation's compute per example, as a share of a training example's (forward
    # only: about a third of forward plus backward); what the probe costs on the clock
    probe_cost: float = 0.33


@register
class PowerOfChoice(Selector):
    name = "power_of_choice"
    section = "power_of_choice"
    Params = PowerOfChoiceParams
    wants_feedback = False

    def check(self, params: PowerOfChoiceParams) -> None:
        require(math.isfinite(params.candidates) and params.candidates >= 1, "candidates",
                "must be >= 1 (d = candidates * k clients are probed)", params.candidates)
        require(math.isfinite(params.probe_cost) and params.probe_cost >= 0, "probe_cost",
                "must be >= 0", params.probe_cost)

    def select(self, ctx: SelectionContext) -> np.ndarray:
        d = min(ctx.population, math.ceil(self.params.candidates * ctx.k - 1e-9))
        pool = ctx.sample(d)
        if len(pool) <= ctx.k:
            self._last = (len(pool), float("nan"))
            return pool
        loss = ctx.probe(pool, self.params.probe_cost)
        order = np.lexsort((pool, -loss))  # highest loss first, ties by id
        chosen = np.sort(pool[order[:ctx.k]])
        self._last = (len(pool), float(np.mean(loss[order[:ctx.k]])))
        return chosen

    def round_metrics(self) -> dict[str, float]:
        probed, loss = getattr(self, "_last", (0, float("nan")))
        out = {"power_of_choice_probed": probed}
        if loss == loss:
            out["power_of_choice_loss"] = loss
        return out


@dataclass
class OortParams:
    # the share of a round's invitees drawn from never-seen clients at round 1, multiplied
    # by exploration_decay after every round, never below exploration_min
    exploration: float = 0.9
    exploration_decay: float = 0.98
    exploration_min: float = 0.3
    # exploitation draws among the explored clients whose utility is at least this share
    # of the utility of the last client a plain top-k would take, in proportion to utility
    cutoff: float = 0.95
    # staleness bonus sqrt(staleness * ln(round) / last_round): clients not seen for long
    # regain priority
    staleness: float = 0.1
    # a client slower than the preferred duration T has its utility times (T / t)^alpha
    alpha: float = 2.0
    # T starts at this percentile of the explored clients' durations (clock.enabled) ...
    preferred_percentile: float = 30.0
    # ... and the pacer adds pacer_step_s to it when the utility the last pacer_window
    # rounds exploited is no higher than the window before's
    pacer_window: int = 20
    pacer_step_s: float = 10.0


_EMPTY_I = torch.zeros(0, dtype=torch.int64)
_EMPTY_F = torch.zeros(0, dtype=torch.float64)


@register
class Oort(Selector):
    """Oort's guided participant selection (Lai et al., OSDI 2021), parameter by parameter
    in docs/selection.md. Its statistical utility of client i is |B_i| times the loss i
    trained with; Oort's is |B_i| sqrt(mean of squared per-example losses), and fedray's
    kernels keep the mean batch loss of each local step, not per-example losses, so the
    mean loss (a lower bound of that root mean square) stands in for it."""

    name = "oort"
    section = "oort"
    Params = OortParams

    def check(self, p: OortParams) -> None:
        for key in ("exploration", "exploration_min", "cutoff"):
            v = getattr(p, key)
            require(math.isfinite(v) and 0 <= v <= 1, key, "must be in [0, 1]", v)
        require(math.isfinite(p.exploration_decay) and 0 < p.exploration_decay <= 1,
                "exploration_decay", "must be in (0, 1]", p.exploration_decay)
        require(p.exploration_min <= p.exploration, "exploration_min",
                f"must be <= exploration ({p.exploration:g})", p.exploration_min)
        for key in ("staleness", "alpha", "pacer_step_s"):
            v = getattr(p, key)
            require(math.isfinite(v) and v >= 0, key, "must be >= 0", v)
        require(math.isfinite(p.preferred_percentile) and 0 <= p.preferred_percentile <= 100,
                "preferred_percentile", "must be in [0, 100]", p.preferred_percentile)
        require(p.pacer_window >= 1, "pacer_window", "must be >= 1", p.pacer_window)

    def init_server(self, plan: RoundPlan) -> None:
        # per explored client (sorted by id): utility, the last round it was invited, its
        # last simulated duration (NaN: unknown), how often it was invited; and the
        # exploration share, the preferred duration T (inf: not set) and the utility each
        # round exploited, for the pacer
        self.state = {"ids": _EMPTY_I.clone(), "utility": _EMPTY_F.clone(),
                      "last_round": _EMPTY_I.clone(), "duration_s": _EMPTY_F.clone(),
                      "invited": _EMPTY_I.clone(),
                      "epsilon": torch.tensor([self.params.exploration], dtype=torch.float64),
                      "preferred_s": torch.tensor([math.inf], dtype=torch.float64),
                      "exploited": _EMPTY_F.clone()}
        self._metrics: dict[str, float] = {}
        self._exploit_ids = np.zeros(0, dtype=np.int64)

    def _scores(self, round_idx: int) -> np.ndarray:
        """Each explored client's utility for round ``round_idx``: statistical utility,
        plus the staleness bonus, times the system penalty when slower than T."""
        s, p = self.state, self.params
        util = s["utility"].numpy().copy()
        last = np.maximum(s["last_round"].numpy(), 1).astype(np.float64)
        util += np.sqrt(p.staleness * math.log(max(round_idx, 1)) / last)
        t_pref = float(s["preferred_s"][0])
        dur = s["duration_s"].numpy()
        if math.isfinite(t_pref):
            slow = np.isfinite(dur) & (dur > t_pref)
            util[slow] *= (t_pref / dur[slow]) ** p.alpha
        return util

    def select(self, ctx: SelectionContext) -> np.ndarray:
        s, p = self.state, self.params
        ids = s["ids"].numpy()
        k = ctx.k
        self._set_preferred()
        eps = float(s["epsilon"][0])
        exploit = np.zeros(0, dtype=np.int64)
        n_exploit = min(k - math.ceil(eps * k - 1e-9), len(ids)) if len(ids) else 0
        if n_exploit > 0:
            score = self._scores(ctx.round)
            online = ctx.online(ids) if ctx.online is not None else np.ones(len(ids), bool)
            pool = np.flatnonzero(online)
            n_exploit = min(n_exploit, len(pool))
        if n_exploit > 0:
            order = pool[np.lexsort((ids[pool], -score[pool]))]
            bar = p.cutoff * score[order[n_exploit - 1]]
            eligible = order[score[order] >= bar]
            w = np.maximum(score[eligible], 0.0) + 1e-12
            pick = ctx.rng.choice(len(eligible), size=n_exploit, replace=False, p=w / w.sum())
            exploit = np.sort(ids[eligible[pick]])
        self._exploit_ids = exploit
        want = k - len(exploit)
        explore = np.zeros(0, dtype=np.int64)
        if want > 0:  # never-seen clients, uniformly among the eligible
            unseen = ctx.population - len(ids)
            n = min(want, unseen)
            if n > 0:
                explore = ctx.sample(n, exclude=ids)
        chosen = np.union1d(exploit, explore)
        if len(chosen) < k:  # every client seen: the next best explored ones fill the round
            rest = np.setdiff1d(ids, chosen)
            if len(rest):
                score = self._scores(ctx.round)
                pos = np.searchsorted(ids, rest)
                best = rest[np.lexsort((rest, -score[pos]))[: k - len(chosen)]]
                chosen = np.union1d(chosen, best)
        self._metrics = {"oort_explored": float(len(ids)), "oort_exploration": eps,
                         "oort_exploited": float(len(exploit))}
        if math.isfinite(float(s["preferred_s"][0])):
            self._metrics["oort_preferred_s"] = float(s["preferred_s"][0])
        return chosen.astype(np.int64)

    def _set_preferred(self) -> None:
        """T, once durations are known: the preferred_percentile of the explored ones."""
        s = self.state
        if math.isfinite(float(s["preferred_s"][0])):
            return
        dur = s["duration_s"].numpy()
        known = dur[np.isfinite(dur)]
        if len(known):
            s["preferred_s"][0] = float(np.percentile(known, self.params.preferred_percentile))

    def feedback(self, fb: ClientFeedback) -> None:
        s, p = self.state, self.params
        ids = s["ids"].numpy()
        new = np.setdiff1d(fb.ids, ids)
        if len(new):  # the explored set grows by the round's never-seen invitees
            merged = np.union1d(ids, new)
            at = np.searchsorted(merged, ids)

            def grow(t: torch.Tensor, fill: float) -> torch.Tensor:
                out = torch.full((len(merged),), fill, dtype=t.dtype)
                out[torch.from_numpy(at)] = t
                return out

            s["utility"] = grow(s["utility"], 0.0)
            s["last_round"] = grow(s["last_round"], 0)
            s["duration_s"] = grow(s["duration_s"], math.nan)
            s["invited"] = grow(s["invited"], 0)
            s["ids"] = torch.from_numpy(merged.astype(np.int64))
            ids = merged
        pos = torch.from_numpy(np.searchsorted(ids, fb.ids))
        s["last_round"][pos] = fb.round
        s["invited"][pos] += 1
        known = np.isfinite(fb.duration_s)
        if known.any():
            s["duration_s"][pos[torch.from_numpy(known)]] = torch.from_numpy(
                fb.duration_s[known])
        ok = fb.arrived & np.isfinite(fb.loss)
        util = fb.examples[ok].astype(np.float64) * fb.loss[ok]
        s["utility"][pos[torch.from_numpy(ok)]] = torch.from_numpy(util)
        # the pacer: the utility exploited this round, and T relaxed when it stalls
        mine = np.isin(fb.ids[ok], self._exploit_ids)
        s["exploited"] = torch.cat([s["exploited"],
                                    torch.tensor([float(util[mine].sum())], dtype=torch.float64)])
        w = p.pacer_window
        hist = s["exploited"]
        if len(hist) >= 2 * w and len(hist) % w == 0 and \
                math.isfinite(float(s["preferred_s"][0])) and \
                float(hist[-w:].sum()) <= float(hist[-2 * w:-w].sum()):
            s["preferred_s"][0] += p.pacer_step_s
        s["epsilon"][0] = max(float(s["epsilon"][0]) * p.exploration_decay,
                              p.exploration_min)

    def round_metrics(self) -> dict[str, float]:
        return dict(self._metrics)
