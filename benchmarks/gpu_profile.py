"""GPU profile: client updates per second per GPU with 1, 2, 4 and 8 workers sharing a GPU.

The FEMNIST CNN workload of issue 8: the LEAF FEMNIST CNN (no dropout, so it can be
vectorized), synthetic FEMNIST-shaped writers of about 200 examples (150-250), 1 local
epoch, batch 20. For each number of workers per GPU (runtime.worker.num_gpus = 1/n) it runs
the job with runtime.worker.vectorize off and on, and reports the steady-state client
updates per second per GPU and the mean GPU utilization over the timed rounds (sampled with
nvidia-smi). The target is at least 300 client updates/s per GPU.

    python benchmarks/gpu_profile.py                       # on a machine with a GPU
    python benchmarks/gpu_profile.py --workers-per-gpu 1 8 --rounds 6
    python benchmarks/gpu_profile.py --fake-gpu            # the mechanics on a CPU machine

--fake-gpu declares one GPU to a local Ray on a machine without one: the workers get their
fractional GPU share and train on the CPU, so the run checks placement and bookkeeping, not
speed (utilization is then n/a).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

TARGET = 300.0  # client updates/s per GPU


class GpuSampler:
    """Mean utilization (%) of the visible GPUs between start() and stop(), from nvidia-smi
    every 200 ms; None where nvidia-smi is missing or reports nothing."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self.samples = []
        if shutil.which("nvidia-smi") is None:
            return
        self._proc = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
             "-lms", "200"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                self.samples.append(float(line.strip()))
            except ValueError:
                pass

    def stop(self) -> float | None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
            self._proc = None
        return sum(self.samples) / len(self.samples) if self.samples else None


def run_case(per_gpu: int, gpus: int, vectorize: str, args, out_dir: str) -> dict:
    """One configuration; the GPU is sampled from the end of the warm-up rounds on."""
    import fedray

    sampler = GpuSampler()
    seen = []

    def progress(m: dict) -> None:
        seen.append(m)
        if len(seen) == args.warmup:
            sampler.start()

    cfg = {"name": f"gpu-{per_gpu}-{vectorize}", "seed": 0, "rounds": args.rounds,
           "data": {"synthetic": {"num_clients": args.population,
                                  "min_examples": args.min_examples,
                                  "max_examples": args.max_examples}},
           "model": {"name": args.model},
           "client": {"lr": 0.05, "batch_size": 20, "local_epochs": 1},
           "sampling": {"clients_per_round": args.clients_per_round},
           "runtime": {"num_workers": per_gpu * gpus,
                       "worker": {"num_cpus": args.worker_cpus, "num_gpus": 1.0 / per_gpu,
                                  "vectorize": vectorize}},
           "eval": {"every": 0, "central": False},
           "output": {"dir": out_dir, "save_weights": False}}
    try:
        res = fedray.run(cfg, progress=progress)
    finally:
        util = sampler.stop()
    steady = res.metrics[args.warmup:]
    rate = sum(m["clients"] for m in steady) / sum(m["train_s"] for m in steady)
    devices = sorted({w["device"] for w in res.summary["workers"]})
    return {"workers_per_gpu": per_gpu, "num_gpus_per_worker": 1.0 / per_gpu,
            "vectorize": vectorize, "vectorized": res.summary["vectorized"],
            "workers": res.summary["num_workers"], "devices": devices,
            "updates_per_s": rate, "updates_per_s_per_gpu": rate / gpus,
            "gpu_utilization_pct": util}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers-per-gpu", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--vectorize", nargs="+", choices=["off", "on"], default=["off", "on"])
    p.add_argument("--rounds", type=int, default=8, help="rounds per case (default 8)")
    p.add_argument("--warmup", type=int, default=2, help="untimed first rounds (default 2)")
    p.add_argument("--clients-per-round", type=int, default=400)
    p.add_argument("--population", type=int, default=5000)
    p.add_argument("--model", default="leaf_cnn", help="model.name (default leaf_cnn)")
    p.add_argument("--min-examples", type=int, default=150)
    p.add_argument("--max-examples", type=int, default=250)
    p.add_argument("--worker-cpus", type=float, default=1.0,
                   help="runtime.worker.num_cpus of each worker (default 1)")
    p.add_argument("--fake-gpu", action="store_true",
                   help="declare one GPU to a local Ray on a machine without one")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs for the local Ray")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.rounds <= args.warmup:
        p.error("--rounds must be larger than --warmup")
    if any(n < 1 for n in args.workers_per_gpu):
        p.error("--workers-per-gpu must be >= 1")

    import ray
    import torch

    if not args.fake_gpu and not torch.cuda.is_available():
        print("gpu_profile: no CUDA GPU is visible to torch (use --fake-gpu to check the "
              "mechanics on a CPU machine)", file=sys.stderr)
        return 2
    init = {"include_dashboard": False, "logging_level": "ERROR", "num_cpus": args.num_cpus}
    if args.fake_gpu:
        init["num_gpus"] = 1
    ray.init(**init)
    gpus = int(ray.cluster_resources().get("GPU", 0))
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "declared, none"
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {gpus} GPU(s) ({name}), "
          f"torch {torch.__version__}", flush=True)
    rows = []
    try:
        for per_gpu in args.workers_per_gpu:
            for vectorize in args.vectorize:
                with tempfile.TemporaryDirectory() as tmp:
                    row = run_case(per_gpu, gpus, vectorize, args, f"{tmp}/run")
                rows.append(row)
                util = row["gpu_utilization_pct"]
                print(f"{per_gpu} workers/GPU (num_gpus {1 / per_gpu:.3g}), vectorize "
                      f"{vectorize:3s}: {row['updates_per_s_per_gpu']:8.1f} client updates/s "
                      f"per GPU ({row['updates_per_s_per_gpu'] / TARGET:.2f}x the target of "
                      f"{TARGET:.0f}) | GPU utilization "
                      f"{'n/a' if util is None else f'{util:.0f}%'} | workers on "
                      f"{', '.join(row['devices'])}", flush=True)
    finally:
        ray.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
