"""Soak: a long run with worker processes SIGKILLed along the way ends exactly like a clean one.

Runs the same small job twice -- SCAFFOLD (stateful clients) on synthetic FEMNIST writers,
logistic regression, 8 of 40 clients per round -- once undisturbed and once while a killer
SIGKILLs a random worker process (found by its Ray process title, as an OOM killer or a
preempted node would) about every ``--kill-every`` rounds, at a random moment. Reports the
kills, the re-runs the driver made, the client updates lost (participants minus updates
aggregated minus updates the guard dropped: must be 0) and whether the final weights are
bit-identical; writes the numbers to ``--out`` as JSON. Exit code 1 if anything differs.

    python benchmarks/soak.py                       # 500 rounds, a kill about every 20
    python benchmarks/soak.py --rounds 100 --kill-every 10
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def worker_pids() -> list[int]:
    """Live fedray worker processes of the Ray this script started (its descendants; not
    another Ray's on the machine): Ray titles them ``ray::ClientWorker...``."""
    import psutil

    pids = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if cmd and cmd[0].startswith("ray::ClientWorker"):
            pids.append(p.pid)
    return pids


class Killer(threading.Thread):
    """Watches the run's metrics.jsonl (the driver appends a line as each round ends) and,
    every ``every`` rounds (+-50%), SIGKILLs a random worker after a random delay of up to
    ``max_delay_s`` -- usually in the middle of the next round. No kill in the last 2 rounds,
    so every kill hits work that is still to be done."""

    def __init__(self, metrics: str, rounds: int, every: int, max_delay_s: float, seed: int):
        super().__init__(daemon=True)
        # worker processes alive before this run starts are another run's (the clean run's,
        # still exiting on a loaded machine): killing one would cost this run nothing
        self.others = set(worker_pids())
        self.metrics, self.rounds = metrics, rounds
        self.rng = random.Random(seed)
        self.every = every
        self.max_delay_s = max_delay_s
        self.kills: list[dict] = []
        self.stop = threading.Event()

    def _gap(self) -> int:
        return max(1, round(self.every * self.rng.uniform(0.5, 1.5)))

    def _done(self) -> int:
        try:
            with open(self.metrics) as f:
                return sum(1 for _ in f)
        except FileNotFoundError:
            return 0

    def run(self) -> None:
        target = self._gap()
        while not self.stop.is_set() and target <= self.rounds - 2:
            done = self._done()
            if done < target:
                time.sleep(0.005)
                continue
            time.sleep(self.rng.uniform(0, self.max_delay_s))
            pids = [p for p in worker_pids() if p not in self.others]
            if pids:
                pid = self.rng.choice(pids)
                try:
                    os.kill(pid, signal.SIGKILL)
                    done = self._done()  # the rounds finished when the kill landed
                    self.kills.append({"after_round": done, "pid": pid})
                except ProcessLookupError:
                    pass
            target = done + self._gap()


def job(rounds: int, out: str) -> dict:
    return {
        "name": "soak", "seed": 5, "rounds": rounds,
        "data": {"synthetic": {"num_clients": 40, "min_examples": 10, "max_examples": 30,
                               "test_writers": 20}},
        "model": {"name": "logreg"},
        "algorithm": {"name": "scaffold"},
        "client": {"lr": 0.05, "batch_size": 8},
        "sampling": {"clients_per_round": 8},
        "runtime": {"num_workers": 2, "worker": {"num_cpus": 0.5}},
        "eval": {"every": 25},
        "checkpoint": {"every": 10},
        "output": {"dir": out},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=500)
    p.add_argument("--kill-every", type=int, default=20)
    p.add_argument("--max-delay-s", type=float, default=0.05,
                   help="kill this long (uniform) after the round that triggers it")
    p.add_argument("--seed", type=int, default=0, help="the killer's randomness")
    p.add_argument("--out", default="soak.json", help="where the numbers go (JSON)")
    args = p.parse_args(argv)

    import ray
    import torch

    import fedray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            clean = fedray.run(job(args.rounds, f"{tmp}/clean"))
            clean_s = time.perf_counter() - t0
            print(f"clean run: {args.rounds} rounds in {clean_s:.0f}s", flush=True)
            killer = Killer(f"{tmp}/faulted/metrics.jsonl", args.rounds, args.kill_every,
                            args.max_delay_s, args.seed)
            killer.start()
            t0 = time.perf_counter()
            try:
                faulted = fedray.run(job(args.rounds, f"{tmp}/faulted"))
            finally:
                killer.stop.set()
                killer.join()
            faulted_s = time.perf_counter() - t0
    finally:
        ray.shutdown()
    ms = faulted.metrics
    participants = sum(m["clients"] for m in ms)
    aggregated = sum(m["updates"] for m in ms)
    dropped = sum(m["dropped_updates"] for m in ms)
    identical = clean.weights.keys() == faulted.weights.keys() and all(
        torch.equal(v, faulted.weights[k]) for k, v in clean.weights.items())
    result = {
        "rounds": args.rounds, "kills": len(killer.kills),
        "rounds_with_a_kill": sorted({k["after_round"] for k in killer.kills}),
        "worker_failures_rerun": faulted.summary["worker_failures"],
        "rounds_with_a_rerun": [m["round"] for m in ms if m["worker_failures"]],
        "client_updates": participants, "aggregated": aggregated, "guard_dropped": dropped,
        "lost": participants - aggregated - dropped,
        "weights_bit_identical": identical,
        "clean_s": round(clean_s, 1), "faulted_s": round(faulted_s, 1),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"{result['kills']} workers killed in {args.rounds} rounds; the driver re-ran "
          f"{result['worker_failures_rerun']} tasks; {participants:,} client updates, "
          f"{aggregated:,} aggregated, {dropped} dropped by the guard, {result['lost']} lost; "
          f"final weights {'bit-identical' if identical else 'DIFFERENT'} to the clean run's; "
          f"{clean_s:.0f}s clean, {faulted_s:.0f}s with kills; numbers in {args.out}")
    ok = identical and result["lost"] == 0 and result["worker_failures_rerun"] >= result["kills"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
