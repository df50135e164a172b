"""LEAF's Synthetic data set, generated: ``source.name: leaf_synthetic`` (no download, no path).

What it is. LEAF (Caldas et al. 2018, arXiv:1812.01097) ships a generator, not files:
TalwalkarLab/leaf ``data/synthetic/main.py`` draws the users' sizes and
``data/synthetic/data_generator.py`` (``SyntheticDataset``) draws their data; LEAF's
``data/utils/split_data.py`` then splits each user's samples into train and test. This
module draws from the same distributions, formula by formula, with fedray's own random
streams: it gives LEAF's distribution, not LEAF's exact draws (LEAF seeds numpy's global
``np.random`` with 931231 and draws everything from that one sequence; here every quantity
comes from ``fedray.core.seeding.rng(seed, TAG, ...)``, and no global numpy state is used).

The generative process (notation: d = ``num_dim``, C = ``num_classes``, K = ``num_users``;
LEAF's README command is ``main.py -num-tasks 1000 -num-classes 5 -num-dim 60``, so the
defaults are K = 1000, C = 5, d = 60; N(m, s^2) has standard deviation s):

- Per-user sample count (main.py ``get_num_samples``): n_k = min(floor(L_k) + 5, 1000) with
  L_k ~ LogNormal(3, 2), i.e. log L_k ~ N(3, 2^2). So 5 <= n_k <= 1000; E[n_k] = 101.22 and
  sd(n_k) = 200.68, computed exactly from this law (tests/data/test_leaf_synthetic.py).
- Model clusters (data_generator.py, ``PROB_CLUSTERS = [1.0]`` in main.py: one cluster, so
  the side information has L = 1 dimension): one tensor Q in R^{(d+1) x C x L} with entries
  N(0, 1), shared by every user; per cluster j a center mu_j in R^L, mu_j ~ N(c_j 1, I),
  c_j ~ N(0, 1). With L = 1 every user's cluster is cluster 0.
- Per-user features: B_k ~ N(0, 1); v_k ~ N(B_k 1, I_d); each sample x ~ N(v_k, Sigma) with
  Sigma = diag(j^-1.2), j = 1..d. A constant 1 is prepended for the model's bias and dropped
  from the stored sample: the stored x is in R^d.
- Per-user model: u_k ~ N(mu_j, 0.1^2 I_L) (LEAF's "model_info"), W_k = Q u_k in
  R^{(d+1) x C}; with L = 1 that is W_k = u_k Q[:, :, 0], every user's model a scalar
  multiple of one shared matrix.
- Labels: z_i = [1, x_i] W_k + e_i, e_i ~ N(0, 0.1^2 I_C), for the user's samples i; then
  LEAF's ``_softmax`` divides exp(z_ic) by the sum over the user's *samples* (Python's
  ``sum`` over a 2-D array adds its rows), not over the classes, and takes the argmax over
  classes: y_i = argmax_c [z_ic - log sum_i' exp(z_i'c)]. So a label is the argmax of the
  user's noisy logits shifted by a per-class offset that depends on the user's other samples;
  this is what LEAF's code does, and what gives LEAF's label distribution, so it is kept.
  The offset is computed as a log-sum-exp (equal to LEAF's ratio wherever that does not
  overflow).
- Split (split_data.py ``--by_sample``, which LEAF's models require, README: ``-t sample``):
  per user, n_train = max(1, int(f * n)) with f = ``train_fraction`` (``--tf``, default 0.9),
  and n_train = 1 when n = 2; the train samples are a uniform random subset, both parts keep
  the generated order. (Users with fewer than 2 samples are dropped by LEAF; n_k >= 5 here.)

Not reproduced: LEAF's optional ``sample.py`` (``-s``/``--sf``; ``--sf 1.0`` keeps every user)
and ``remove_users.py`` (``-k K`` keeps users with more than K samples in all, counted before
the split). LEAF's paper (Table 1) counts the data before either, 1,000 devices; to drop small
users use the ``natural`` partitioner's ``min_examples``, which counts train examples.

How it relates to FedProx's Synthetic(alpha, beta) (Li et al. 2020, MLSys; litian96/FedProx
``data/synthetic_*/generate_synthetic.py``): there W_k ~ N(u_k, 1), b_k ~ N(u_k, 1) with
u_k ~ N(0, alpha) (independent entries, 10 classes), and B_k ~ N(0, beta), v_k ~ N(B_k, 1),
x ~ N(v_k, Sigma) as here, y = argmax softmax(W_k x + b_k) over classes, with 30 users of
floor(LogNormal(4, 2)) + 50 samples. LEAF's features are FedProx's with beta = 1 (B_k ~
N(0, 1)); LEAF has no alpha: its users' models are not independent Gaussian matrices but
multiples u_k of one shared Gaussian Q, with u_k ~ N(mu, 0.1^2) around one shared center, and
LEAF adds logit noise and the per-sample normalization above. So neither alpha nor beta is a
parameter here; LEAF's generator is not Synthetic(alpha, beta) for any alpha.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedray.core.seeding import rng
from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.errors import key_error

# LEAF's defaults: data/synthetic/README.md's command, main.py's constants, split_data.py's --tf
NUM_USERS, NUM_CLASSES, NUM_DIM, TRAIN_FRACTION = 1000, 5, 60, 0.9
MIN_SAMPLES, MAX_SAMPLES = 5, 1000  # main.py get_num_samples
SIZE_MU, SIZE_SIGMA = 3.0, 2.0  # main.py: np.random.lognormal(3, 2)
PROB_CLUSTERS = (1.0,)  # main.py PROB_CLUSTERS
MODEL_SD = NOISE_SD = 0.1  # data_generator.py: model_info and logit noise, scale=0.1
COV_EXPONENT = -1.2  # Sigma_jj = j^-1.2

# fedray's streams for this generator (module-local tags, fixed forever)
_TAG_SHARED, _TAG_USER, _TAG_SPLIT = 301, 302, 303


def check_options(num_users: int, num_classes: int | None, num_dim: int, seed: int,
                  train_fraction: float) -> None:
    """One line naming ``source.<key>`` for an impossible value, before anything is drawn."""
    def count(key: str, value: Any, least: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise key_error(f"source.{key}", f"must be an integer >= {least}", value,
                            what="recipe")

    count("num_users", num_users, 1)
    if num_classes is not None:
        count("num_classes", num_classes, 2)
    count("num_dim", num_dim, 1)
    count("seed", seed, 0)
    if (isinstance(train_fraction, bool) or not isinstance(train_fraction, (int, float))
            or not 0.0 < train_fraction < 1.0):
        raise key_error("source.train_fraction", "must be a number in (0, 1): the share of "
                        "each user's samples kept for training (LEAF --tf)", train_fraction,
                        what="recipe")


def sample_sizes(g: np.random.Generator, size: int | None = None) -> Any:
    """n = min(floor(LogNormal(3, 2)) + 5, 1000), main.py's get_num_samples."""
    return np.minimum(np.floor(g.lognormal(SIZE_MU, SIZE_SIGMA, size)).astype(np.int64)
                      + MIN_SAMPLES, MAX_SAMPLES)


def shared_model(seed: int, num_classes: int, num_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Q [(d+1), C, L] ~ N(0, 1) and the cluster centers mu [L clusters, L] of
    data_generator.py (L = len(PROB_CLUSTERS))."""
    g = rng(seed, _TAG_SHARED)
    side = len(PROB_CLUSTERS)
    q = g.normal(0.0, 1.0, size=(num_dim + 1, num_classes, side))
    means = np.stack([g.normal(g.normal(0.0, 1.0), 1.0, size=side) for _ in PROB_CLUSTERS])
    return q, means


def sigma_diagonal(num_dim: int) -> np.ndarray:
    return np.arange(1, num_dim + 1, dtype=np.float64) ** COV_EXPONENT


def user_data(seed: int, k: int, q: np.ndarray, means: np.ndarray) -> dict[str, np.ndarray]:
    """User k's samples, labels and the draws behind them (for tests): its own stream, so a
    user's data does not depend on how many users are generated."""
    g = rng(seed, _TAG_USER, k)
    n = int(sample_sizes(g))
    num_dim, num_classes = q.shape[0] - 1, q.shape[1]
    cluster = int(g.choice(len(PROB_CLUSTERS), p=PROB_CLUSTERS))
    b = g.normal(0.0, 1.0)
    v = g.normal(b, 1.0, size=num_dim)
    x = v + np.sqrt(sigma_diagonal(num_dim)) * g.normal(0.0, 1.0, size=(n, num_dim))
    u = g.normal(means[cluster], MODEL_SD)
    w = q @ u  # [(d+1), C]
    noise = g.normal(0.0, NOISE_SD, size=(n, num_classes))
    z = w[0] + x @ w[1:] + noise  # [1, x] W + e
    # LEAF's _softmax normalizes each class over the user's samples (see the module doc)
    top = z.max(axis=0)
    log_norm = top + np.log(np.exp(z - top).sum(axis=0))
    y = np.argmax(z - log_norm, axis=1)
    return {"x": x, "y": y.astype(np.int64), "w": w, "noise": noise, "u": u, "b": np.array(b),
            "v": v}


def train_mask(seed: int, k: int, n: int, train_fraction: float) -> np.ndarray:
    """split_data.py --by_sample: max(1, int(f n)) train samples (1 when n = 2), a uniform
    subset; both parts keep the generated order."""
    n_train = 1 if n == 2 else max(1, int(train_fraction * n))
    mask = np.zeros(n, dtype=bool)
    mask[rng(seed, _TAG_SPLIT, k).choice(n, size=n_train, replace=False)] = True
    return mask


def generate_leaf_synthetic(num_users: int = NUM_USERS, num_classes: int | None = None,
                            num_dim: int = NUM_DIM, seed: int = 0,
                            train_fraction: float = TRAIN_FRACTION) -> Dataset:
    """LEAF's Synthetic data set (module doc), split per user: user k is owner ``str(k)``,
    LEAF's own user id; x float32 [n, num_dim]; ``num_classes`` None means LEAF's 5."""
    check_options(num_users, num_classes, num_dim, seed, train_fraction)
    classes = NUM_CLASSES if num_classes is None else num_classes
    q, means = shared_model(seed, classes, num_dim)
    parts: dict[str, list[tuple[np.ndarray, np.ndarray, int]]] = {"train": [], "test": []}
    for k in range(num_users):
        data = user_data(seed, k, q, means)
        mask = train_mask(seed, k, len(data["y"]), train_fraction)
        parts["train"].append((data["x"][mask], data["y"][mask], k))
        parts["test"].append((data["x"][~mask], data["y"][~mask], k))
    splits = {name: Split(
        x=np.concatenate([p[0] for p in rows]).astype(np.float32),
        y=np.concatenate([p[1] for p in rows]),
        owner=np.repeat(np.array([p[2] for p in rows], dtype=np.int64), [len(p[1]) for p in rows]),
    ) for name, rows in parts.items()}
    return Dataset(name="leaf_synthetic", train=splits["train"], test=splits["test"],
                   num_classes=classes, owners=[str(k) for k in range(num_users)])


def expected_size_moments() -> tuple[float, float, float]:
    """E[n], Var[n] and the fourth central moment of one user's count n (exact, from the
    law above): the tests' yardstick for sampling noise."""
    def phi(t: float) -> float:
        return 0.5 * math.erfc(-t / math.sqrt(2.0))

    probs, values, below = [], [], 0.0
    for m in range(MAX_SAMPLES - MIN_SAMPLES):  # floor(L) = m
        upper = phi((math.log(m + 1) - SIZE_MU) / SIZE_SIGMA)
        probs.append(upper - below)
        values.append(m + MIN_SAMPLES)
        below = upper
    probs.append(1.0 - below)  # floor(L) >= 995: capped at 1000
    values.append(MAX_SAMPLES)
    p, n = np.array(probs), np.array(values, dtype=np.float64)
    mean = float((p * n).sum())
    var = float((p * (n - mean) ** 2).sum())
    return mean, var, float((p * (n - mean) ** 4).sum())
