"""The table of docs/evaluation.md: pooled vs per-client vs personalized accuracy at the
final round of runs of jobs/personalization/femnist.yaml (one per seed).

    python jobs/personalization/table.py RUN_DIR [RUN_DIR ...]

Reads each run's last client_eval table (fedray.tracking.client_eval) and metrics.jsonl;
prints one markdown row per seed and the mean ± std over seeds.
"""

from __future__ import annotations

import argparse
import json

import fsspec
import numpy as np

from fedray.state.run_dir import read_metrics
from fedray.tracking.client_eval import client_metrics, read_table, table_name

COLUMNS = [  # (header, metrics key)
    ("pooled", "fed_test_accuracy"),
    ("pooled, personalized", "fed_test_personalized_accuracy"),
    ("client mean", "clients_accuracy_mean"),
    ("client mean, personalized", "clients_personalized_accuracy_mean"),
    ("client p10", "clients_accuracy_p10"),
    ("client p10, personalized", "clients_personalized_accuracy_p10"),
    ("worst 10%", "clients_accuracy_worst10"),
    ("worst 10%, personalized", "clients_personalized_accuracy_worst10"),
]


def final_row(run_dir: str) -> tuple[int, int, dict]:
    """(seed, round, metrics) of the run's last eval round, its clients_* statistics
    recomputed from that round's table (they must equal the logged ones)."""
    m = [r for r in read_metrics(run_dir) if "clients_evaluated" in r][-1]
    with fsspec.open(f"{run_dir.rstrip('/')}/{table_name(m['round'])}", "rb") as f:
        stats = client_metrics(read_table(f.read()))
    for k, v in stats.items():
        assert m[k] == v, (run_dir, k, m[k], v)
    with fsspec.open(f"{run_dir.rstrip('/')}/config.yaml") as f:
        seed = next(int(line.split(":")[1]) for line in f.read().decode().splitlines()
                    if line.startswith("seed:"))
    return seed, m["round"], m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()
    rows = sorted(final_row(r) for r in args.runs)
    print("| seed | round | clients | " + " | ".join(h for h, _ in COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 3) + "|")
    for seed, r, m in rows:
        print(f"| {seed} | {r} | {m['clients_evaluated']} | "
              + " | ".join(f"{m[k]:.3f}" for _, k in COLUMNS) + " |")
    values = np.array([[m[k] for _, k in COLUMNS] for _, _, m in rows])
    print(f"| mean ± std ({len(rows)} seeds) | | | "
          + " | ".join(f"{mu:.3f} ± {sd:.3f}" for mu, sd in
                       zip(values.mean(0), values.std(0), strict=True)) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"seed": s, "round": r, **{k: m[k] for _, k in COLUMNS}}
                       for s, r, m in rows], f, indent=2)


if __name__ == "__main__":
    main()
