"""An MNIST store whose clients each hold a test split of their own: what federated and
personalized evaluation of jobs/personalization/feature_shift_mnist.yaml score clients on.

    python jobs/personalization/mnist_clients.py ../shared/data/mnist-t10k stores/mnist_clients20

The recipes' MNIST partitioners keep MNIST's test split (or a ``test_fraction`` of it) as one
central test set, so no MNIST recipe gives clients test data; this script does, through the
Python path to a store (fedray.data.from_arrays(...).partition("natural")). Every example
goes to one of ``--clients`` clients, uniformly at random from ``--seed``; with MNIST's test
files present their examples are the clients' test data, else each example is held out as
test data with probability ``--test-fraction``. Pixels stay uint8 (models get x / 255).
"""

from __future__ import annotations

import argparse

import numpy as np

from fedray.data import from_arrays
from fedray.data.sources.loaders import load_source


def client_split(n_train: int, n_test: int, clients: int, test_fraction: float,
                 seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Each example's client and split ("train"/"test"): the train examples' then the test
    examples', in order."""
    g = np.random.default_rng(seed)
    users = g.integers(0, clients, n_train + n_test)
    split = np.array(["train"] * n_train + ["test"] * n_test)
    if not n_test:
        split[g.random(n_train) < test_fraction] = "test"
    return users, split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mnist", help="directory of MNIST's IDX files (t10k alone will do)")
    ap.add_argument("out", help="where the store goes (absent or empty)")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--test-fraction", type=float, default=0.2,
                    help="share held out per client when the source has no test files")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.clients < 1 or not 0.0 < args.test_fraction < 1.0:
        ap.error("--clients must be >= 1 and --test-fraction in (0, 1)")
    data = load_source("mnist", args.mnist)
    parts = [data.train] + ([data.test] if data.test is not None else [])
    users, split = client_split(len(data.train), len(data.test) if data.test is not None else 0,
                                args.clients, args.test_fraction, args.seed)
    x = np.concatenate([p.x for p in parts])
    y = np.concatenate([p.y for p in parts])
    written = from_arrays(x, y, user_ids=users, split=split).partition("natural").write_store(
        args.out)
    m = written.manifest
    print(f"{written.url}: {m['num_clients']} clients, {len(x) - (split == 'test').sum()} train "
          f"and {(split == 'test').sum()} test examples")


if __name__ == "__main__":
    main()
