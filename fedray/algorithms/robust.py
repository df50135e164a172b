"""Byzantine-robust aggregation: the coordinate-wise median and trimmed mean, Krum, Multi-Krum,
Bulyan, centered clipping and FLTrust, and a norm bound on every client's update.

Why: FedAvg's mean gives every client an unbounded say. One client that sends an update of
norm s moves the mean by s/k, so a single attacker that knows the round (an omniscient one)
can put the global model anywhere; a small fraction of sign-flipping or scaled clients turns
training around. The aggregators here bound what a minority can do, each under its own
threat model, at the price of statistical efficiency (and, for most, of memory: they need
every client's update at once, ``Aggregator.individual``, within
``runtime.individual_updates_mb``).

``mean``           FedAvg's (weighted) mean over the individual rows: no defense. It is the
                   baseline an omniscient attack is measured against, as such an attack
                   reads the honest rows, which only the individual path keeps.
``median``         the coordinate-wise median (Yin, Chen, Ramchandran, Bartlett,
                   "Byzantine-Robust Distributed Learning: Towards Optimal Statistical
                   Rates", ICML 2018). Threat model: fewer than half of the k rows are
                   Byzantine, arbitrary and omniscient; the honest ones are i.i.d. Each
                   coordinate is then an honest value or lies between two.
``trimmed_mean``   the coordinate-wise beta-trimmed mean (same paper): per coordinate the
                   floor(beta k) largest and smallest values are dropped and the rest
                   averaged. Threat model: a Byzantine fraction at most beta < 1/2.
``krum``,          Krum and Multi-Krum (Blanchard, El Mhamdi, Guerraoui, Stainer, "Machine
``multi_krum``     Learning with Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS
                   2017): each row is scored by the summed squared distances to its n - f - 2
                   nearest other rows; Krum keeps the best row, Multi-Krum averages the m best.
                   Threat model: at most f of the n rows Byzantine, n > 2f + 2, honest
                   updates with bounded variance.
``bulyan``         Bulyan (El Mhamdi, Guerraoui, Rouault, "The Hidden Vulnerability of
                   Distributed Learning in Byzantium", ICML 2018): Krum applied again and
                   again selects theta = n - 2f rows, then per coordinate the beta = theta - 2f
                   values closest to their median are averaged. Threat model: at most f of
                   n >= 4f + 3 rows Byzantine, including attackers that stay close in L2
                   norm while moving single coordinates far (what Krum alone lets through).
``centered_clip``  centered clipping (Karimireddy, He, Jaggi, "Learning from History for
                   Byzantine Robust Optimization", ICML 2021): v <- v + (1/n) sum_i
                   (x_i - v) min(1, tau / ||x_i - v||), from the previous round's aggregate.
                   Threat model: a minority of Byzantine clients (the paper bounds the
                   fraction its analysis admits), each of whose pull on v is bounded by tau
                   whatever its norm, attacks spread over rounds included (the paper's
                   time-coupled attacks). The paper pairs it with client momentum, which
                   fedray's clients (model deltas) do not add here.
``fltrust``        FLTrust (Cao, Fang, Liu, Gong, NDSS 2021): trust bootstrapped from the
                   server's own update on a root data set (here: clients held out as the
                   server's, ``root_clients``): ReLU(cos) to it, rescaled to its norm.
                   Threat model: any number of attackers, as long as the root data's
                   direction is honest.
``norm_bound``     an update stage, not an aggregator: every update is clipped on its
                   worker to L2 norm ``max_norm`` (Sun, Kairouz, Suresh, McMahan, "Can You
                   Really Backdoor Federated Learning?", arXiv 2019). Threat model: backdoor
                   and model-replacement attackers, whose updates must be large to survive
                   the averaging; it does nothing against small-norm attacks. It works on
                   the partial-sum path with every aggregator (no individual updates), and
                   with the individual ones.

Every default hyper-parameter here (f = 1, beta = 0.1, tau = 1, one clipping iteration,
max_norm = 1) is fedray's choice, not a value this module attributes to the papers.

What ``influence`` is (``Aggregator.influence``: each row's share of the round's update,
summing to 1; a row below half of 1/k counts as discarded in the run's defense precision and
recall): none for ``mean``, which is no defense and discards no one (its example weights are
FedAvg's, not a judgement of a client); for the coordinate-wise aggregators the
share a row has of each coordinate's value (1/(number of values averaged) when its value is
one of them, else 0) averaged over the coordinates; for Krum 1 on the chosen row, for
Multi-Krum 1/m on each chosen row; for centered clipping the rows' clip factors
min(1, tau / ||x_i - v||) of the last iteration, normalized.

Ties: which row "is" the median (or is trimmed, or is among the closest to the median) when
values are equal is the row a stable sort puts there, so ties go to the lower row index; the
rows are in the round's sampled order, the same at any worker count. Krum's scores tie to
the lower row index too.

Numbers: the rows are float32, which float64 holds exactly. A median is one of them, or the
float64 mean of two; the averages sum their values in float64 in row order (the trimmed mean
with beta = 0, Bulyan with f = 0 and Multi-Krum with f = 0, m = n are then the plain mean
float for float); Krum's squared distances are float64 sums of squared float64 differences,
computed directly, not from a Gram matrix: ||x||^2 + ||y||^2 - 2<x, y> cancels to an error of
about d 2^-53 ||x||^2, which for rows far from the origin and close to each other is more
than their distance, and could choose a different row. Direct distances cost O(k^2 d), as
Krum does anyway, and give equal rows exactly equal scores, so ties resolve by row index.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedray.algorithms.base import (
    Aggregator,
    ClientContext,
    ClientRows,
    LocalUpdate,
    PartialSum,
    Payload,
    RoundPlan,
    UpdateStage,
    WorkerEnv,
    finite_number,
    require,
)
from fedray.algorithms.privacy import clip_
from fedray.algorithms.registry import register, register_preset

__all__ = ["Bulyan", "BulyanParams", "CenteredClip", "CenteredClipParams", "Krum",
           "KrumParams", "Mean", "MeanParams", "Median", "MedianParams", "MultiKrum",
           "MultiKrumParams", "NormBound", "NormBoundParams", "TrimmedMean",
           "TrimmedMeanParams", "bulyan_f", "krum_f", "krum_scores", "squared_distances",
           "stable_window", "trim_count"]


def _integer(value: Any) -> bool:
    """An int, not a bool (YAML's ``true`` would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


# -- the round's guarantees and their degradation -------------------------------------------


def trim_count(beta: float, k: int) -> int:
    """The values the trimmed mean drops at each end of a coordinate's k values:
    floor(beta k), or, if that leaves none (2b >= k, which beta < 1/2 never does), the most
    that leave one, (k - 1) // 2."""
    b = math.floor(beta * k)
    return b if 2 * b < k else (k - 1) // 2


def krum_f(f: int, n: int) -> int:
    """The f Krum (and Multi-Krum) uses with n rows: f while n > 2f + 2 (its guarantee),
    else the largest f the n rows allow, max(0, floor((n - 3) / 2))."""
    return f if n > 2 * f + 2 else max(0, (n - 3) // 2)


def bulyan_f(f: int, n: int) -> int:
    """The f Bulyan uses with n rows: f while n >= 4f + 3, else max(0, floor((n - 3) / 4))."""
    return f if n >= 4 * f + 3 else max(0, (n - 3) // 4)


# -- column-chunked, threaded coordinate-wise work ------------------------------------------


class _Individual(Aggregator):
    """What the robust aggregators share: they need every client's update (``individual``),
    work on slices of columns at once on a few threads, and report scalars per round."""

    individual = True
    # a slice of columns holds about this many values (k per column), so the scratch
    # arrays (a transposed copy, its sort, masks) stay a small addition to the k x d rows
    chunk_values = 1 << 19
    # the slices run on this many threads: numpy sorts, compares and adds without the GIL,
    # and the driver runs this while every worker waits for the next round
    threads = min(4, os.cpu_count() or 1)

    def __init__(self, params: Any = None):
        super().__init__(params)
        self._metrics: dict[str, float] = {}

    def round_metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def _by_columns(self, d: int, k: int, fn: Callable[[int, int], Any]) -> list[Any]:
        """``fn(start, stop)`` for each slice of the d columns, on the threads; the results
        in column order (so whatever is summed from them is summed in one order)."""
        step = max(1, self.chunk_values // max(1, k))
        starts = range(0, d, step)
        if len(starts) <= 1 or self.threads <= 1:
            return [fn(s, min(s + step, d)) for s in starts]
        with ThreadPoolExecutor(min(self.threads, len(starts))) as pool:
            return list(pool.map(lambda s: fn(s, min(s + step, d)), starts))


def _rows_of(updates: torch.Tensor) -> np.ndarray:
    """The (k, d) float32 rows as a NumPy array (a view: no copy on the CPU)."""
    return updates.detach().cpu().numpy()


def stable_window(values: np.ndarray, ordered: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Which entries of each row of ``values`` (c, k) a stable sort of the row puts at
    positions lo..hi (``ordered``: each row sorted): a boolean (c, k) mask. Equal values
    keep their order, so ties go to the lower column index. Computed from the sorted values
    by comparing and counting, not by an argsort: NumPy's stable argsort of float rows is
    several times slower than its sort."""
    c, k = values.shape
    mask = np.ones((c, k), dtype=bool)
    if lo > 0:
        v = ordered[:, lo:lo + 1]
        mask &= values >= v
        # where the value at lo also sits at lo - 1, its first copies (in column order)
        # are below the window; likewise above it at hi + 1
        _fix_ties(mask, values, v, ordered[:, lo - 1] == v[:, 0], lambda pos: pos >= lo)
    if hi < k - 1:
        v = ordered[:, hi:hi + 1]
        mask &= values <= v
        _fix_ties(mask, values, v, ordered[:, hi + 1] == v[:, 0], lambda pos: pos <= hi)
    return mask


def _fix_ties(mask: np.ndarray, values: np.ndarray, v: np.ndarray, tied: np.ndarray,
              inside: Callable[[np.ndarray], np.ndarray]) -> None:
    """In the rows ``tied`` (a tie crosses the window's edge value ``v``): the entries equal
    to ``v`` are in the window only where ``inside(stable position)``."""
    rows = np.flatnonzero(tied)
    if not len(rows):
        return
    vals, edge = values[rows], v[rows]
    eq = vals == edge
    # an entry's stable position: the entries below it, plus the equal ones before it
    pos = (vals < edge).sum(axis=1, keepdims=True) + np.cumsum(eq, axis=1) - 1
    mask[rows] &= ~eq | inside(pos)


def _masked_mean(block: np.ndarray, keep: np.ndarray, count: int) -> np.ndarray:
    """The float64 mean over the rows of ``block`` (k, c) where ``keep`` (k, c) holds,
    ``count`` per column, summed in row order."""
    out = np.zeros(block.shape[1], np.float64)
    zero = np.zeros((), block.dtype)
    for i in range(block.shape[0]):
        out += np.where(keep[i], block[i], zero)
    out /= count
    return out


def _mean_rows(agg: _Individual, rows: np.ndarray, which: np.ndarray,
               weights: np.ndarray | None = None) -> np.ndarray:
    """sum_i w_i x_i / sum_i w_i over the rows ``which`` (ascending), in float64, summed in
    that order (w = 1 without ``weights``)."""
    k, d = rows.shape
    out = np.empty(d, np.float64)
    total = float(len(which)) if weights is None else float(weights.sum())

    def mean_of(start: int, stop: int) -> None:
        acc = np.zeros(stop - start, np.float64)
        for j, i in enumerate(which):
            if weights is None:
                acc += rows[i, start:stop]
            else:
                acc += weights[j] * rows[i, start:stop].astype(np.float64)
        out[start:stop] = acc / total

    agg._by_columns(d, len(which), mean_of)
    return out


# -- the aggregators ------------------------------------------------------------------------


@dataclass
class MeanParams:
    weighted: bool = True  # weigh each row by its client's example count (else 1)


@register
class Mean(_Individual):
    """FedAvg's mean over the individual rows (``proportional``, or ``uniform`` without
    ``weighted``): no defense, the baseline of the robust aggregators under attacks that
    need the individual path."""

    name = "mean"
    section = "mean"
    Params = MeanParams

    def check(self, params: MeanParams) -> None:
        require(isinstance(params.weighted, bool), "weighted", "must be true or false",
                params.weighted)

    def aggregate(self, updates: torch.Tensor, clients: ClientRows,
                  acc: PartialSum) -> torch.Tensor:
        rows = _rows_of(updates)
        k = rows.shape[0]
        w = (clients.num_examples.detach().cpu().numpy().astype(np.float64)
             if self.params.weighted else np.ones(k))
        if not w.sum() > 0:  # no examples counted: every row alike
            w = np.ones(k)
        out = _mean_rows(self, rows, np.arange(k), w if self.params.weighted else None)
        # no defense, so no influence: its weights are FedAvg's, not a judgement of a client
        # (a small client's share below 1/2k would otherwise count as discarded)
        self.influence = None
        return torch.from_numpy(out)


@dataclass
class MedianParams:
    """The coordinate-wise median has no hyper-parameter (its section takes no key)."""


@register
class Median(_Individual):
    """The coordinate-wise median of the round's rows (unweighted); for an even count, the
    mean of the two middle values."""

    name = "median"
    section = "median"
    Params = MedianParams

    def aggregate(self, updates: torch.Tensor, clients: ClientRows,
                  acc: PartialSum) -> torch.Tensor:
        rows = _rows_of(updates)
        k, d = rows.shape
        lo, hi = (k - 1) // 2, k // 2  # the middle value(s): equal for odd k
        out = np.empty(d, np.float64)

        def median_of(start: int, stop: int) -> np.ndarray:
            # each coordinate's k values side by side, sorted: NumPy's vectorized sort of
            # short rows beats np.partition down the columns (examples/median.py)
            part = np.ascontiguousarray(rows[:, start:stop].T)
            ordered = np.sort(part, axis=1)
            out[start:stop] = (ordered[:, lo].astype(np.float64) + ordered[:, hi]) / 2
            return np.count_nonzero(stable_window(part, ordered, lo, hi), axis=0)

        counts = sum(self._by_columns(d, k, median_of), np.zeros(k, np.int64))
        self.influence = torch.from_numpy(counts / ((hi - lo + 1) * d))
        return torch.from_numpy(out)


@dataclass
class TrimmedMeanParams:
    beta: float = 0.1  # the share of values dropped at each end of every coordinate


@register
class TrimmedMean(_Individual):
    """The coordinate-wise trimmed mean: per coordinate, the b = floor(beta k) largest and b
    smallest values dropped and the k - 2b others averaged (unweighted)."""

    name = "trimmed_mean"
    section = "trimmed_mean"
    Params = TrimmedMeanParams

    def check(self, params: TrimmedMeanParams) -> None:
        require(finite_number(params.beta) and 0 <= params.beta < 0.5, "beta",
                "must be in [0, 0.5)", params.beta)

    def check_plan(self, plan: RoundPlan) -> None:
        beta, k = self.params.beta, plan.clients_per_round
        b = math.floor(beta * k)
        require(2 * b < k, "beta", f"trims 2 x {b} of the {k} clients per round "
                f"(sampling.clients_per_round), leaving none: needs 2 floor(beta k) < k", beta)
        require(b >= 1 or beta == 0, "beta", f"trims nothing at {k} clients per round "
                f"(floor(beta k) = 0): set it to at least 1/{k}, or 0 for the plain mean",
                beta)

    def aggregate(self, updates: torch.Tensor, clients: ClientRows,
                  acc: PartialSum) -> torch.Tensor:
        rows = _rows_of(updates)
        k, d = rows.shape
        b = trim_count(self.params.beta, k)
        kept = k - 2 * b
        out = np.empty(d, np.float64)

        def trimmed_of(start: int, stop: int) -> np.ndarray:
            block = rows[:, start:stop]
            if b == 0:  # nothing trimmed: every value
                out[start:stop] = _masked_mean(block, np.ones(block.shape, bool), kept)
                return np.full(k, stop - start, np.int64)
            part = np.ascontiguousarray(block.T)
            keep = stable_window(part, np.sort(part, axis=1), b, k - 1 - b)
            out[start:stop] = _masked_mean(block, keep.T, kept)
            return np.count_nonzero(keep, axis=0)

        counts = sum(self._by_columns(d, k, trimmed_of), np.zeros(k, np.int64))
        self.influence = torch.from_numpy(counts / (kept * d))
        self._metrics = {"trimmed_mean_b": float(b)}
        return torch.from_numpy(out)


def squared_distances(agg: _Individual, rows: np.ndarray) -> np.ndarray:
    """The (k, k) float64 squared Euclidean distances between the rows, each a float64 sum
    of the squared float64 differences (exact differences of float32 values up to an
    exponent gap of 29 bits), slice of columns by slice, the slices summed in column order.
    Equal rows get bit-equal distances to every other row."""
    k, d = rows.shape

    def part_of(start: int, stop: int) -> np.ndarray:
        block = rows[:, start:stop].astype(np.float64)
        part = np.zeros((k, k), np.float64)
        for i in range(k - 1):
            diff = block[i + 1:] - block[i]
            part[i, i + 1:] = np.einsum("ij,ij->i", diff, diff)
        return part

    # each slice's k^2 scratch matters here, not its k values per column
    dist = sum(agg._by_columns(d, k, part_of), np.zeros((k, k), np.float64))
    return dist + dist.T


def krum_scores(dist: np.ndarray, f: int) -> np.ndarray:
    """Krum's score of each of the n rows of ``dist`` (their squared distances): the sum
    of its n - f - 2 smallest distances to the other rows (none when n <= f + 2)."""
    n = dist.shape[0]
    q = max(0, n - f - 2)
    others = dist + np.diag(np.full(n, np.inf))  # a row is not its own neighbour
    return np.sort(others, axis=1)[:, :q].sum(axis=1)


def _check_f(f: Any) -> None:
    require(_integer(f) and f >= 0, "f", "must be an integer >= 0", f)


def _check_krum_plan(f: int, plan: RoundPlan, who: str) -> None:
    k = plan.clients_per_round
    require(k > 2 * f + 2, "f", f"{who} tolerates f Byzantine clients only with more than "
            f"2f + 2 = {2 * f + 2} clients per round, and sampling.clients_per_round is {k}",
            f)


@dataclass
class MultiKrumParams:
    f: int = 1  # the Byzantine clients per round it tolerates (needs n > 2f + 2)
    m: int | None = None  # the rows averaged; null: n - f


@register
class MultiKrum(_Individual):
    """Multi-Krum: the unweighted mean of the m rows of lowest Krum score (ties: the lower
    rows), scored once. With two rows or fewer there is nothing to compare a row with:
    their mean."""

    name = "multi_krum"
    section = "multi_krum"
    Params = MultiKrumParams
    label = "Multi-Krum"

    def check(self, params: Any) -> None:
        _check_f(params.f)
        m = getattr(params, "m", None)
        require(m is None or _integer(m) and m >= 1, "m",
                "must be an integer >= 1 (or null: n - f)", m)

    def check_plan(self, plan: RoundPlan) -> None:
        f, m, k = self.params.f, self._wanted_m(), plan.clients_per_round
        _check_krum_plan(f, plan, self.label)
        require(m is None or m <= k - f, "m", f"averages at most n - f = {k - f} "
                f"rows with sampling.clients_per_round {k} and f {f}", m)

    def _wanted_m(self) -> int | None:
        return self.params.m

    def _metrics_of(self, f: int, m: int) -> dict[str, float]:
        return {"multi_krum_f": float(f), "multi_krum_m": float(m)}

    def aggregate(self, updates: torch.Tensor, clients: ClientRows,
                  acc: PartialSum) -> torch.Tensor:
        rows = _rows_of(updates)
        n = rows.shape[0]
        f = krum_f(self.params.f, n)
        wanted = self._wanted_m()
        m = n - f if wanted is None else min(wanted, n - f)
        if n <= 2:
            m = n
            chosen = np.arange(n)
        else:
            scores = krum_scores(squared_distances(self, rows), f)
            chosen = np.sort(np.argsort(scores, kind="stable")[:m])
        self._metrics = self._metrics_of(f, m)
        self.influence = torch.zeros(n, dtype=torch.float64)
        self.influence[torch.from_numpy(chosen)] = 1.0 / m
        # one chosen row (Krum): its float64 copy, exactly (a float32 value added to 0.0)
        return torch.from_numpy(_mean_rows(self, rows, chosen))


@dataclass
class KrumParams:
    f: int = 1  # the Byzantine clients per round it tolerates (needs n > 2f + 2)


@register
class Krum(MultiKrum):
    """Krum: the row whose n - f - 2 nearest other rows are closest (lowest summed squared
    distance; ties: the lower row), i.e. Multi-Krum with m = 1. With two rows or fewer,
    their mean."""

    name = "krum"
    section = "krum"
    Params = KrumParams
    label = "Krum"

    def _wanted_m(self) -> int | None:
        return 1

    def _metrics_of(self, f: int, m: int) -> dict[str, float]:
        return {"krum_f": float(f)}


@dataclass
class BulyanParams:
    f: int = 1  # the Byzantine clients per round it tolerates (needs n >= 4f + 3)


@register
class Bulyan(_Individual):
    """Bulyan: theta = n - 2f rows selected by Krum (with f) again and again on the rows not
    yet selected, then per coordinate the mean of the beta = theta - 2f selected values
    closest to their median (ties: the lower rows)."""

    name = "bulyan"
    section = "bulyan"
    Params = BulyanParams

    def check(self, params: BulyanParams) -> None:
        _check_f(params.f)

    def check_plan(self, plan: RoundPlan) -> None:
        f, k = self.params.f, plan.clients_per_round
        require(k >= 4 * f + 3, "f", f"Bulyan tolerates f Byzantine clients only with at least "
                f"4f + 3 = {4 * f + 3} clients per round, and sampling.clients_per_round is "
                f"{k}", f)

    def select(self, rows: np.ndarray, f: int) -> np.ndarray:
        """The theta = n - 2f rows Krum picks one by one, each time among the rows left (its
        neighbours: the r - f - 2 nearest of the r left), ascending."""
        n = rows.shape[0]
        theta = n - 2 * f
        if theta == n:
            return np.arange(n)
        dist = squared_distances(self, rows)
        left = np.arange(n)
        chosen = []
        for _ in range(theta):
            sub = dist[np.ix_(left, left)]
            best = int(np.argmin(krum_scores(sub, f)))
            chosen.append(left[best])
            left = np.delete(left, best)
        return np.sort(np.array(chosen))

    def aggregate(self, updates: torch.Tensor, clients: ClientRows,
                  acc: PartialSum) -> torch.Tensor:
        rows = _rows_of(updates)
        n, d = rows.shape
        f = bulyan_f(self.params.f, n)
        selected = self.select(rows, f)
        theta = len(selected)
        beta = theta - 2 * f
        lo, hi = (theta - 1) // 2, theta // 2
        out = np.empty(d, np.float64)

        def closest_of(start: int, stop: int) -> np.ndarray:
            block = rows[selected, start:stop]  # (theta, c), a copy
            if beta == theta:  # f = 0: every value
                out[start:stop] = _masked_mean(block, np.ones(block.shape, bool), beta)
                return np.full(theta, stop - start, np.int64)
            part = np.ascontiguousarray(block.T)
            ordered = np.sort(part, axis=1)
            median = (ordered[:, lo].astype(np.float64) + ordered[:, hi]) / 2
            gap = np.abs(part.astype(np.float64) - median[:, None])
            keep = stable_window(gap, np.sort(gap, axis=1), 0, beta - 1)
            out[start:stop] = _masked_mean(block, keep.T, beta)
            return np.count_nonzero(keep, axis=0)

        counts = sum(self._by_columns(d, theta, closest_of), np.zeros(theta, np.int64))
        influence = np.zeros(n, np.float64)
        influence[selected] = counts / (beta * d)
        self.influence = torch.from_numpy(influence)
        self._metrics = {"bulyan_f": float(f)}
        return torch.from_numpy(out)


@dataclass
class CenteredClipParams:
    tau: float = 1.0  # the clipping radius around the center
    iterations: int = 1  # clipping steps per round


@register
class CenteredClip(_Individual):
    """Centered clipping: from the previous round's aggregate v (zero before round 1),
    ``iterations`` times v <- v + (1/n) sum_i (x_i - v) min(1, tau / ||x_i - v||); v is
    the round's update and the next round's center (``state['center']``, checkpointed)."""

    name = "centered_clip"
    section = "centered_clip"
    Params = CenteredClipParams

    def check(self, params: CenteredClipParams) -> None:
        require(finite_number(params.tau) and params.tau > 0, "tau", "must be > 0",
                params.tau)
        require(_integer(params.iterations) and params.iterations >= 1, "iterations",
                "must be an integer >= 1", params.iterations)

    def init_server(self, num_params: int, population: int) -> None:
        super().init_server(num_params, population)
        self.state["center"] = torch.zeros(num_params, dtype=torch.float64)

    def aggregate(self, updates: torch.Tensor, clients: ClientRows,
                  acc: PartialSum) -> torch.Tensor:
        n, d = updates.shape
        v = self.state["center"]
        if v.numel() != d:
            # sized num_params before round 1; the rows also carry the model's float
            # buffers (BatchNorm statistics): a center still at zero grows to them
            if bool(v.any()):
                raise ValueError(f"aggregator centered_clip: its center has {v.numel()} "
                                 f"values, the round's updates {d}")
            v = torch.zeros(d, dtype=torch.float64)
        rows, center = _rows_of(updates), v.numpy()
        tau = self.params.tau
        for _ in range(self.params.iterations):
            center, factors = self._clip_step(rows, center, tau)
        v = torch.from_numpy(center)
        self.state["center"] = v.clone()
        self.influence = torch.from_numpy(factors / factors.sum())
        self._metrics = {"centered_clip_clipped": float(np.mean(factors < 1))}
        return v

    def _clip_step(self, rows: np.ndarray, v: np.ndarray,
                   tau: float) -> tuple[np.ndarray, np.ndarray]:
        """One step from center ``v``: the new center and the rows' clip factors. Two passes
        over slices of columns: the rows' distances to ``v`` (float64, the slices' sums
        added in column order), then the clipped differences, added in row order."""
        n, d = rows.shape

        def dist_of(start: int, stop: int) -> np.ndarray:
            diff = rows[:, start:stop] - v[start:stop]  # float64: exact differences
            return np.einsum("ij,ij->i", diff, diff)

        norms = np.sqrt(sum(self._by_columns(d, n, dist_of), np.zeros(n, np.float64)))
        factors = np.ones(n, np.float64)
        far = norms > tau
        factors[far] = tau / norms[far]
        out = np.empty(d, np.float64)

        def step_of(start: int, stop: int) -> None:
            acc = np.zeros(stop - start, np.float64)
            for i in range(n):
                acc += factors[i] * (rows[i, start:stop] - v[start:stop])
            out[start:stop] = v[start:stop] + acc / n

        self._by_columns(d, n, step_of)
        return out, factors


# -- FLTrust: trust bootstrapped from the server's own data --------------------------------


@dataclass
class FLTrustParams:
    # the clients whose data is the server's root data set: trained every round
    # (sampling.always) from the global model like any client, their mean update is the
    # server's g0; never aggregated, never malicious
    root_clients: list[int] = field(default_factory=list)


@register
class FLTrust(_Individual):
    """FLTrust (Cao, Fang, Liu, Gong, "FLTrust: Byzantine-robust Federated Learning via
    Trust Bootstrapping", NDSS 2021): the server trains on a small root data set of its
    own, g0, and trusts a client by how much its update points the same way: trust
    TS_i = ReLU(cos(g_i, g0)), each update rescaled to g0's norm, the round's update
    sum_i TS_i (||g0|| / ||g_i||) g_i / sum_i TS_i. The root data set is named as clients of
    the store (``root_clients``), held out from the attackers and from the aggregate: each
    round they train from the global model with the job's client section, as the paper's
    server does, and their (example-weighted) mean update is g0. A round without a root
    update, or in which no client's trust is positive, leaves the model as it is."""

    name = "fltrust"
    section = "fltrust"
    Params = FLTrustParams

    def check(self, params: FLTrustParams) -> None:
        roots = params.root_clients
        require(isinstance(roots, list) and len(roots) >= 1 and all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in roots),
            "root_clients", "must name the root data set's clients, a list of ids >= 0",
            roots)
        require(len(set(roots)) == len(roots), "root_clients", "names a client twice", roots)
        self.trusted = tuple(roots)

    def check_plan(self, plan: RoundPlan) -> None:
        roots = self.params.root_clients
        require(max(roots) < plan.population, "root_clients", f"names client {max(roots)}; "
                f"the data has clients 0..{plan.population - 1}", roots)
        missing = [c for c in roots if c not in plan.always]
        require(not missing, "root_clients", f"must train every round: add {missing} to "
                "sampling.always", roots)
        require(plan.clients_per_round > len(roots), "root_clients", f"leave no client to "
                f"aggregate: sampling.clients_per_round is {plan.clients_per_round}", roots)

    def aggregate(self, updates: torch.Tensor, clients: ClientRows,
                  acc: PartialSum) -> torch.Tensor:
        rows = _rows_of(updates)
        k, d = rows.shape
        ids = clients.ids.detach().cpu().numpy()
        root = np.isin(ids, np.asarray(self.params.root_clients, np.int64))
        influence = np.zeros(k, np.float64)
        self.influence = torch.from_numpy(influence)
        out = np.zeros(d, np.float64)
        others = np.flatnonzero(~root)
        self._metrics = {"fltrust_trusted": 0.0}
        if not root.any() or not len(others):
            return torch.from_numpy(out)
        n = clients.num_examples.detach().cpu().numpy().astype(np.float64)[root]
        g0 = _mean_rows(self, rows, np.flatnonzero(root), n if n.sum() > 0 else None)
        norm0 = float(np.linalg.norm(g0))
        trust = np.zeros(len(others), np.float64)
        scale = np.zeros(len(others), np.float64)
        for j, i in enumerate(others):
            g = rows[i].astype(np.float64)
            norm = float(np.linalg.norm(g))
            if norm > 0 and norm0 > 0:
                trust[j] = max(0.0, float(g @ g0) / (norm * norm0))
                scale[j] = norm0 / norm
        if not trust.sum() > 0:
            return torch.from_numpy(out)
        keep = others[trust > 0]
        w = (trust * scale)[trust > 0]
        out = _mean_rows(self, rows, keep, w) * (w.sum() / trust.sum())
        influence[others] = trust / trust.sum()
        self._metrics = {"fltrust_trusted": float((trust > 0).sum())}
        return torch.from_numpy(out)


# -- the norm bound: a stage on every client's update ---------------------------------------


@dataclass
class NormBoundParams:
    max_norm: float = 1.0  # the L2 bound on each client's update


@register
class NormBound(UpdateStage):
    """delta * min(1, max_norm / ||delta||) on the worker, for every client's update
    (``update.flagged`` when it clips): O(d) memory, any aggregator."""

    name = "norm_bound"
    section = "norm_bound"
    Params = NormBoundParams

    def check(self, params: NormBoundParams) -> None:
        require(finite_number(params.max_norm) and params.max_norm > 0, "max_norm",
                "must be > 0", params.max_norm)

    def client_update(self, env: WorkerEnv | None, ctx: ClientContext | None,
                      update: LocalUpdate, acc: PartialSum | None) -> None:
        """Reads neither ``env``, ``ctx`` nor ``acc``. The clipped update is a new tensor:
        ``update.delta`` may be the kernel's buffer, reused for the next client."""
        clipped = update.delta.clone()
        # privacy.clip_: its norm (float64) before, and the scaled update's exact norm <= C
        if clip_(clipped, self.params.max_norm) > self.params.max_norm:
            update.delta = clipped
            update.flagged = True

    def payload(self, before: Payload) -> Payload:
        """Clipping changes no value's encoding: the update costs what it did."""
        return before


for _name in ("median", "trimmed_mean", "krum", "multi_krum", "bulyan", "centered_clip",
              "fltrust"):
    register_preset(_name, "local_sgd", _name, "sgd")
del _name
