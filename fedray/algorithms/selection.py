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
from fedray.core.sampling import isin_sorted

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


# Oort's per-client arrays (sorted by id) and their fill for a client seen for the first time
_CLIENT_ARRAYS = {"utility": (np.float64, 0.0), "last_round": (np.int64, 0),
                  "duration_s": (np.float64, math.nan), "invited": (np.int64, 0)}


@register
class Oort(Selector):
    """Oort's guided participant selection (Lai et al., OSDI 2021), parameter by parameter
    in docs/algorithms.md. Its statistical utility of client i is |B_i| times the loss i
    trained with; Oort's is |B_i| sqrt(mean of squared per-example losses), and fedray's
    kernels keep the mean batch loss of each local step, not per-example losses, so the
    mean loss (a lower bound of that root mean square) stands in for it.

    Its knowledge is numpy arrays over the clients it has invited, sorted by id (``state``:
    ``ids``, ``utility``, ``last_round``, ``duration_s``, ``invited``), plus the
    exploration share, the preferred duration T and the utility each round exploited: a
    round costs O(clients seen) -- bisections, one partition, inserts -- and never a sort
    or a hash of them."""

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
        self.state = {"ids": np.zeros(0, np.int64),
                      **{k: np.zeros(0, dt) for k, (dt, _) in _CLIENT_ARRAYS.items()},
                      "epsilon": np.array([self.params.exploration]),
                      "preferred_s": np.array([math.inf]),
                      "exploited": np.zeros(0)}
        self._metrics: dict[str, float] = {}
        self._exploit_ids = np.zeros(0, dtype=np.int64)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state as the checkpoint saves it: finite, as the driver requires of server
        state (a NaN or Inf there means a diverged run), so an unknown duration (NaN) and
        an unset T (inf) are saved as -1 (durations and T are never negative)."""
        out = {k: torch.from_numpy(v.copy()) for k, v in self.state.items()}
        for key in ("duration_s", "preferred_s"):
            out[key][~torch.isfinite(out[key])] = -1.0
        return out

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.state) - set(state)
        if missing:
            raise ValueError(f"selector {self.name}: state lacks {sorted(missing)}")
        self.state = {k: state[k].numpy().copy() for k in self.state}
        self.state["duration_s"][self.state["duration_s"] < 0] = math.nan
        self.state["preferred_s"][self.state["preferred_s"] < 0] = math.inf

    def _scores(self, round_idx: int) -> np.ndarray:
        """Each explored client's utility for round ``round_idx``: statistical utility,
        plus the staleness bonus, times the system penalty when slower than T."""
        s, p = self.state, self.params
        last = np.maximum(s["last_round"], 1).astype(np.float64)
        util = s["utility"] + np.sqrt(p.staleness * math.log(max(round_idx, 1)) / last)
        t_pref = float(s["preferred_s"][0])
        if math.isfinite(t_pref):
            dur = s["duration_s"]
            slow = np.isfinite(dur) & (dur > t_pref)
            util[slow] *= (t_pref / dur[slow]) ** p.alpha
        return util

    def _online_scores(self, ctx: SelectionContext) -> np.ndarray:
        """``_scores``, with -inf for the clients offline at the round's start."""
        score = self._scores(ctx.round)
        if ctx.online is not None:  # an offline client cannot be invited
            score = np.where(ctx.online(self.state["ids"]), score, -np.inf)
        return score

    def select(self, ctx: SelectionContext) -> np.ndarray:
        s, p = self.state, self.params
        ids = s["ids"]
        k = ctx.k
        self._set_preferred()
        eps = float(s["epsilon"][0])
        exploit = np.zeros(0, dtype=np.int64)
        n_exploit = min(k - math.ceil(eps * k - 1e-9), len(ids)) if len(ids) else 0
        score = None
        if n_exploit > 0:
            score = self._online_scores(ctx)
            n_exploit = min(n_exploit, int(np.isfinite(score).sum()))
        if n_exploit > 0:
            # the n-th best score, by a partition (O(clients seen)), and the clients above
            # cutoff times it (at least the n best, whatever the sign), in id order: drawn
            # in proportion to their utility
            nth = np.partition(score, len(score) - n_exploit)[len(score) - n_exploit]
            eligible = np.flatnonzero(score >= min(p.cutoff * nth, nth))
            w = np.maximum(score[eligible], 0.0) + 1e-12
            pick = ctx.rng.choice(len(eligible), size=n_exploit, replace=False, p=w / w.sum())
            exploit = ids[np.sort(eligible[pick])]
        self._exploit_ids = exploit
        explore = np.zeros(0, dtype=np.int64)
        n = min(k - len(exploit), ctx.population - len(ids))
        if n > 0:  # never-seen clients, uniformly among the eligible
            explore = ctx.sample(n, exclude=ids)
        chosen = np.union1d(exploit, explore)
        if len(chosen) < k:  # too few unseen ones left: the next best seen ones fill in
            score = self._online_scores(ctx) if score is None else score
            rest = np.flatnonzero(~isin_sorted(chosen, ids) & np.isfinite(score))
            best = rest[np.lexsort((ids[rest], -score[rest]))[: k - len(chosen)]]
            chosen = np.union1d(chosen, ids[best])
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
        known = s["duration_s"][np.isfinite(s["duration_s"])]
        if len(known):
            s["preferred_s"][0] = float(np.percentile(known, self.params.preferred_percentile))

    def feedback(self, fb: ClientFeedback) -> None:
        s, p = self.state, self.params
        ids = s["ids"]
        new = fb.ids[~isin_sorted(ids, fb.ids)]
        if len(new):  # the explored set grows by the round's never-seen invitees (inserts)
            where = np.searchsorted(ids, new)
            s["ids"] = ids = np.insert(ids, where, new)
            for key, (_, fill) in _CLIENT_ARRAYS.items():
                s[key] = np.insert(s[key], where, fill)
        pos = np.searchsorted(ids, fb.ids)
        s["last_round"][pos] = fb.round
        s["invited"][pos] += 1
        known = np.isfinite(fb.duration_s)
        s["duration_s"][pos[known]] = fb.duration_s[known]
        ok = fb.arrived & np.isfinite(fb.loss)
        util = fb.examples[ok].astype(np.float64) * fb.loss[ok]
        s["utility"][pos[ok]] = util
        # the pacer: the utility exploited this round, and T relaxed when it stalls
        mine = isin_sorted(self._exploit_ids, fb.ids[ok])
        s["exploited"] = np.append(s["exploited"], float(util[mine].sum()))
        w, hist = p.pacer_window, s["exploited"]
        if len(hist) >= 2 * w and len(hist) % w == 0 and \
                math.isfinite(float(s["preferred_s"][0])) and \
                float(hist[-w:].sum()) <= float(hist[-2 * w:-w].sum()):
            s["preferred_s"][0] += p.pacer_step_s
        s["epsilon"][0] = max(float(s["epsilon"][0]) * p.exploration_decay,
                              p.exploration_min)

    def round_metrics(self) -> dict[str, float]:
        return dict(self._metrics)
