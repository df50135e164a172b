"""Stateful clients at population scale: SCAFFOLD over 100,000 clients, 100 per round.

Each client's control variate c_i lives in the run directory's client state store, one
safetensors file per client that took part (fedray/state/client_state.py); workers keep a bounded
cache. This reports the driver's and the workers' private memory after rounds 1, 10 and 50
(they should stay flat while the store grows), and checks that exactly the clients that took
part have a state file.

    python benchmarks/scaffold_state.py                      # 100,000 clients, logreg, 50 rounds
    python benchmarks/scaffold_state.py --population 1000000 --rounds 20
    python benchmarks/scaffold_state.py --population 1000000 --per-round 1000 --rounds 20

It also prints the driver's private memory after every round: the driver's index of which
version of each client's state is current grows with the clients that took part, never
with the population (fedray.state.client_state.ClientVersions).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def _du_mb(path: str) -> float:
    total = 0
    for root, _, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total / 2**20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--population", type=int, default=100_000)
    p.add_argument("--per-round", type=int, default=100)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--model", default="logreg")
    p.add_argument("--report", type=int, nargs="+", default=[1, 10, 50])
    p.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    p.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = p.parse_args(argv)

    import fedray
    from fedray.core.sampling import sample_clients
    from fedray.state.client_state import ClientStateStore

    tmp = None
    if args.out is None:
        tmp = tempfile.TemporaryDirectory()
        args.out = os.path.join(tmp.name, "run")
    job = {"name": "scaffold-state", "seed": 0, "rounds": args.rounds,
           "data": {"synthetic": {"num_clients": args.population}},
           "model": {"name": args.model}, "algorithm": {"name": "scaffold"},
           "client": {"lr": 0.05, "batch_size": 20, "local_epochs": 1},
           "sampling": {"clients_per_round": args.per_round},
           "eval": {"every": 0, "central": True},
           "output": {"dir": args.out}}
    t0 = time.perf_counter()
    res = fedray.run(job, overrides=args.overrides)
    wall = time.perf_counter() - t0
    print(f"SCAFFOLD, {args.model}, population {args.population:,}, {args.per_round} clients "
          f"per round, {args.rounds} rounds: {wall:.0f}s, final test accuracy "
          f"{res.summary['final'].get('test_accuracy', float('nan')):.4f}")
    print("| after round | driver private MB | largest worker private MB | round s |")
    print("|---|---|---|---|")
    for m in res.metrics:
        if m["round"] in args.report:
            print(f"| {m['round']} | {m['driver_mem_mb']:.0f} | {m['worker_mem_mb']:.0f} | "
                  f"{m['wall_s']:.2f} |")
    driver = [m["driver_mem_mb"] for m in res.metrics]
    print(f"driver private MB after rounds 1..{len(driver)}: "
          f"{', '.join(f'{d:.0f}' for d in driver)}")
    print(f"driver memory over rounds 2..{len(driver)}: min {min(driver[1:] or driver):.0f} "
          f"MB, max {max(driver[1:] or driver):.0f} MB; round 1 {driver[0]:.0f} MB")
    took_part = set()
    for r in range(1, args.rounds + 1):
        took_part.update(int(c) for c in sample_clients(0, r, args.population, args.per_round))
    state_dir = os.path.join(res.run_dir, "client_state")
    stored = ClientStateStore(state_dir).clients()
    same = stored == sorted(took_part)
    print(f"state files: {len(stored):,} for {len(took_part):,} distinct participants of "
          f"{args.population:,} clients; exactly the participants: {same}; "
          f"{_du_mb(state_dir):.0f} MB on disk")
    if tmp is not None:
        tmp.cleanup()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
