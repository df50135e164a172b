"""What one checkpoint costs the driver: encode it and write it atomically into a run
directory, as ``Driver._checkpoint`` does, for a model of ``--params`` weights with a
SCAFFOLD-sized server state, the client-version index of ``--clients`` clients and
``--rounds`` metrics lines. The figure decides checkpoint.every_s's default: a period of
10 s costs a run ``median / 10 s`` of its time (docs/config.md, docs/performance.md).

    python benchmarks/checkpoint_cost.py --params 1206590 --clients 3400 --repeat 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np
import torch

from fedray.state.checkpoint import CHECKPOINT_FILE, Checkpoint, encode
from fedray.state.client_state import ClientVersions
from fedray.state.run_dir import RunDir


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--params", type=int, default=1_206_590, help="model size (emnist_cnn's)")
    p.add_argument("--clients", type=int, default=3400, help="clients with state")
    p.add_argument("--rounds", type=int, default=100, help="metrics lines in the header")
    p.add_argument("--repeat", type=int, default=20)
    a = p.parse_args()
    weights = torch.randn(a.params)
    versions = ClientVersions(a.clients)
    versions.record(np.arange(a.clients), 3, np.zeros(a.clients, dtype=np.int64))
    lines = [json.dumps({"round": r, "train_loss": 1.0 / r}) + "\n" for r in range(1, a.rounds + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = RunDir(tmp)
        times = []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            run_dir.write_bytes(CHECKPOINT_FILE, encode(Checkpoint(
                round=a.rounds, weights=weights, server_state={"aggregator.c": weights.clone()},
                client_versions=versions, metrics_lines=lines, run_id="ab" * 8,
                config={"seed": 0})))
            times.append(time.perf_counter() - t0)
    mb = (2 * a.params * 4) / 2**20
    print(f"checkpoint of {a.params:,} weights + as much server state ({mb:.1f} MB), "
          f"{a.clients:,} client versions: median {statistics.median(times) * 1e3:.1f} ms, "
          f"max {max(times) * 1e3:.1f} ms over {a.repeat}")


if __name__ == "__main__":
    main()
