"""bf16 autocast against fp32, per training step and for the vectorized chain step.

Why it exists: ``runtime.precision: bf16`` pays only where the hardware computes in
bfloat16 (GPU tensor cores, CPUs with AVX512_BF16 or AMX); this says, on the machine at
hand, what one local step costs each way, before a whole run (docs/performance.md, "Reduced
precision"). One thread, interleaved timings, best of 3 each side.

    python benchmarks/precision_step.py                 # steps, then the chain
    python benchmarks/precision_step.py --models mlp logreg --batches 20

Steps: ``build_model(name, (1, 28, 28), 62)``, zero_grad + forward + cross entropy +
backward; bf16 runs the forward as fedray does (``fedray.kernels.precision.forward``: under
autocast, the output cast back to float32 for the loss). Chain: one ``vmap_local_sgd`` of a
group (1 epoch, batch 20, clients of 30-90 examples) by ``chain_sgd_step`` in fp32, and by
torch.func in fp32 and in bf16.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from functools import partial

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fedray.core.flat_model import FlatModel  # noqa: E402
from fedray.core.models import build_model  # noqa: E402
from fedray.kernels.precision import forward  # noqa: E402
from fedray.kernels.vectorized import group_size, vmap_local_sgd  # noqa: E402


def best(fn, n: int, rounds: int = 3) -> float:
    fn()
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t) / n)
    return min(times)


def step(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, precision: str) -> None:
    m.zero_grad()
    F.cross_entropy(forward(precision, "cpu", m, x), y).backward()


def step_rows(models: list[str], batches: list[int]) -> None:
    for name in models:
        m = build_model(name, (1, 28, 28), 62)
        for b in batches:
            x, y = torch.randn(b, 1, 28, 28), torch.randint(0, 62, (b,))

            n = (3 if b >= 400 else 5) if "cnn" in name else 50
            t = {p: [] for p in ("fp32", "bf16")}
            for _ in range(3):  # interleaved
                for p in t:
                    t[p].append(best(partial(step, m, x, y, p), n, 1))
            f, h = min(t["fp32"]), min(t["bf16"])
            print(f"step {name:10s} batch {b:4d}: fp32 {f * 1e3:8.2f} ms, bf16 {h * 1e3:8.2f} ms,"
                  f" bf16 speed-up {f / h:.2f}x", flush=True)


def chain_rows() -> None:
    g = torch.Generator().manual_seed(0)
    for name in ("logreg", "mlp"):
        model = FlatModel(build_model(name, (1, 28, 28), 62))
        size = min(32, group_size(model.num_params))
        data = []
        for _ in range(size):
            n = int(torch.randint(30, 91, (1,), generator=g))
            data.append((torch.rand(n, 1, 28, 28, generator=g),
                         torch.randint(0, 62, (n,), generator=g)))
        w = model.flat.clone()
        cases = {"chain_sgd_step fp32": {"closed_form": True},
                 "torch.func fp32": {"closed_form": False},
                 "torch.func bf16": {"closed_form": False, "precision": "bf16"}}
        t = {k: [] for k in cases}
        for _ in range(3):
            for k, kw in cases.items():
                t[k].append(best(partial(
                    vmap_local_sgd, model, w, data, lrs=[0.05] * size, batch_size=20,
                    local_epochs=1, local_steps=None, seeds=list(range(size)), **kw), 1, 1))
        print(f"chain {name} group of {size}: "
              + ", ".join(f"{k} {min(v) * 1e3:.0f} ms" for k, v in t.items()), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["leaf_cnn", "emnist_cnn", "mlp", "logreg"])
    p.add_argument("--batches", nargs="+", type=int, default=[20, 400])
    p.add_argument("--no-chain", action="store_true", help="skip the chain step's rows")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"load average {open('/proc/loadavg').read().split()[:3]}, "
          f"torch {torch.__version__}", flush=True)
    step_rows(args.models, args.batches)
    if not args.no_chain:
        chain_rows()
    return 0


if __name__ == "__main__":
    sys.exit(main())
