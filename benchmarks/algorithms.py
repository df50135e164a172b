"""Every algorithm preset on one job: final and best test accuracy, side by side.

Runs each preset of fedray.algorithms on the same job and data (by default the real
LEAF FEMNIST sample's writers, built by ``fedray partition partitions/femnist.yaml``), with
per-algorithm server settings from Reddi et al. where the server optimizer needs its own
learning rate. Nothing is tuned here: it shows that every algorithm trains on real data and
how they compare at one setting, not the papers' best numbers.

    fedray partition partitions/femnist.yaml source.path=../shared/data/femnist-leaf-sample \\
        out=stores/femnist
    python benchmarks/algorithms.py --store stores/femnist --rounds 50 --out runs/algorithms
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

# Per-preset overrides on top of the base job. Adaptive server optimizers need a much smaller
# server lr than FedAvg's 1.0 (Reddi et al., Table 8's EMNIST CNN grid: server lr 10^-2.5
# for Adam/Yogi, 10^-1 for Adagrad, tau 10^-3).
SETTINGS: dict[str, list[str]] = {
    "fedavg": [],
    "fedsgd": ["client.lr=0.1"],
    "fedprox": ["algorithm.fedprox.mu=0.01"],
    "fedavgm": ["server.momentum=0.9", "server.lr=0.3"],
    "fednesterov": ["server.momentum=0.9", "server.lr=0.3"],
    "fedadam": ["server.lr=0.003", "server.tau=0.001"],
    "fedyogi": ["server.lr=0.003", "server.tau=0.001"],
    "fedadagrad": ["server.lr=0.1", "server.tau=0.001", "server.beta1=0.0"],
    "scaffold": [],
    "elastic_fedavgm": ["server.momentum=0.9", "server.lr=0.3"],
    "elastic_fedprox": ["algorithm.fedprox.mu=0.01"],
    "expalpha": ["algorithm.expalpha.alpha=0.2"],
    "expalpha_fedavgm": ["algorithm.expalpha.alpha=0.2", "server.momentum=0.9", "server.lr=0.3"],
}


def main(argv: list[str] | None = None) -> int:
    from fedray.algorithms import PRESETS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", default="stores/femnist", help="partition store path or URL")
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--algorithms", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    p.add_argument("--out", default="runs/algorithms", help="run directories and table go here")
    p.add_argument("overrides", nargs="*", help="key=value applied to every run")
    args = p.parse_args(argv)

    import fedray
    from fedray.config import load_config
    from fedray.errors import FedrayError
    from fedray.runtime.session import ray_session

    base = {"name": "algorithms", "seed": 0, "rounds": args.rounds,
            "data": {"partition": args.store}, "model": {"name": "emnist_cnn"},
            "client": {"lr": 0.1, "batch_size": 20, "local_epochs": 1},
            "sampling": {"clients_per_round": 10},
            "eval": {"every": 10, "federated_clients": 20},
            "output": {"save_weights": False}}
    rows = []
    try:
        with ray_session(load_config(base, args.overrides).runtime):
            for name in args.algorithms:
                over = [f"algorithm.name={name}", f"output.dir={args.out}/{name}",
                        *SETTINGS.get(name, []), *args.overrides]
                t0 = time.perf_counter()
                res = fedray.run(base, overrides=over)
                s = res.summary
                row = {"algorithm": name, **s["algorithm"],
                       "final_test_accuracy": s["final"].get("test_accuracy"),
                       "best_test_accuracy": s["best_test_accuracy"],
                       "final_fed_test_accuracy": s["final"].get("fed_test_accuracy"),
                       "settings": " ".join(SETTINGS.get(name, [])) or "-",
                       "wall_s": time.perf_counter() - t0}
                rows.append(row)
                print(f"{name:>17}: final test acc {row['final_test_accuracy']:.4f}, best "
                      f"{row['best_test_accuracy']:.4f} ({row['wall_s']:.0f}s)", flush=True)
    except FedrayError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    table = ["| algorithm | client | aggregator | server_opt | settings | final acc | best acc "
             "| final fed acc | time |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['algorithm']} | {r['client']} | {r['aggregator']} | "
                     f"{r['server_opt']} | {r['settings']} | {r['final_test_accuracy']:.4f} | "
                     f"{r['best_test_accuracy']:.4f} | {r['final_fed_test_accuracy']:.4f} | "
                     f"{r['wall_s']:.0f}s |")
    text = "\n".join(table) + "\n"
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
