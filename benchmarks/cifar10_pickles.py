"""Write CIFAR-10-format pickles of random pixels: the real format, fake content.

For timing the CIFAR-10 recipes and jobs where the real data set is not at hand (nothing is
downloaded). The files are what ``fedray.data.sources.cifar10`` reads: cifar-10-batches-py/
data_batch_1..5 and test_batch (protocol-2 pickles of dicts with b'batch_label',
b'labels', b'data' uint8 [n, 3072], b'filenames') and batches.meta. Pixels are uniform
random bytes and labels uniform over the 10 classes, so accuracies on them mean nothing;
the sizes (10,000 images per batch) are the real ones.

    python benchmarks/cifar10_pickles.py /tmp/cifar10_fake
    fedray partition partitions/cifar10_iid.yaml source.path=/tmp/cifar10_fake out=stores/c10
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path

import numpy as np

NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse",
         b"ship", b"truck"]


def write(root: Path, per_batch: int = 10_000, seed: int = 0) -> Path:
    """cifar-10-batches-py/ under ``root`` with ``per_batch`` random images per batch."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    g = np.random.default_rng(seed)
    batches = [(f"data_batch_{i}", f"training batch {i} of 5") for i in range(1, 6)]
    for name, label in [*batches, ("test_batch", "testing batch 1 of 1")]:
        doc = {b"batch_label": label.encode(),
               b"labels": [int(v) for v in g.integers(0, 10, per_batch)],
               b"data": g.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
               b"filenames": [f"{name}_{i}.png".encode() for i in range(per_batch)]}
        (folder / name).write_bytes(pickle.dumps(doc, protocol=2))
    meta = {b"label_names": NAMES, b"num_cases_per_batch": per_batch, b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="where cifar-10-batches-py/ is written")
    parser.add_argument("--per-batch", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write(args.root, args.per_batch, args.seed))


if __name__ == "__main__":
    main()
