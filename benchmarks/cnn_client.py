"""What a CNN client costs a worker beyond torch's own step, and the two cuts of issue 47.

One thread, as a worker of one CPU; every figure is the median of ``--repeat`` passes, the two
sides of each row interleaved so that a slow spell of the machine lands on both:

1. **Max-pooling** (fedray/kernels/pooling.py): one forward and backward of ``nn.MaxPool2d(2)``
   on the activations the zoo's CNNs pool at batch 20, torch's NCHW search against fedray's
   channels-last search with torch's backward; the outputs and input gradients are checked
   equal bit for bit.
2. **The fold** (fedray.core.tensors.add_scaled_): one client's float32 update of the LEAF
   CNN's size (6.6 M values) added into a float64 partial sum, torch's mixed-dtype add
   against the chunked float64 add; the sums are checked equal bit for bit.
3. **Local training** (fedray.kernels.sequential.local_sgd): 3 clients of 45-80 synthetic
   examples, batch 20, 1 epoch, with the channels-last search off and on; the deltas are
   checked equal bit for bit.

    python benchmarks/cnn_client.py                      # all three, --repeat 5
    python benchmarks/cnn_client.py --part pooling --repeat 9 --json cnn.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import nullcontext

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import fedray.kernels.pooling as pooling  # noqa: E402
from fedray.core.flat_model import FlatModel  # noqa: E402
from fedray.core.models import build_model  # noqa: E402
from fedray.core.tensors import add_scaled_  # noqa: E402
from fedray.kernels.sequential import local_sgd  # noqa: E402

# the activations the zoo's CNNs pool at batch 20 on 28x28 inputs
POOL_SHAPES = {"leaf_cnn pool 1": (20, 32, 28, 28), "leaf_cnn pool 2": (20, 64, 14, 14),
               "emnist_cnn pool": (20, 64, 24, 24)}
LEAF_CNN_PARAMS = 6_603_710  # build_model("leaf_cnn", (1, 28, 28), 62)'s parameter count


def interleaved(sides: dict, repeat: int, inner: int = 1) -> dict[str, float]:
    """Median seconds per call of each side (a zero-argument function), the sides taking
    turns ``repeat`` times, each turn ``inner`` calls."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(repeat):
        for name, fn in sides.items():
            t = time.perf_counter()
            for _ in range(inner):
                fn()
            times[name].append((time.perf_counter() - t) / inner)
    return {name: statistics.median(ts) for name, ts in times.items()}


def pool_row(label: str, shape: tuple[int, ...], repeat: int) -> dict:
    """One pooled activation, both ways."""
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(shape, generator=g).relu()
    grad = torch.randn(shape[0], shape[1], shape[2] // 2, shape[3] // 2, generator=g)
    layer = nn.MaxPool2d(2)
    outs = {}

    def step(name: str, ours: bool) -> None:
        x = x0.clone().requires_grad_(True)
        with pooling.ChannelsLastPooling(layer).active() if ours else nullcontext():
            out = layer(x)
        out.backward(grad)
        outs[name] = (out.detach(), x.grad)

    sides = {"torch NCHW": lambda: step("torch NCHW", False),
             "channels-last search": lambda: step("channels-last search", True)}
    ms = interleaved(sides, repeat, inner=5)
    same = all(torch.equal(a, b) for a, b in zip(*outs.values(), strict=True))
    return {"part": "pooling", "case": f"{label} {list(shape)}",
            "before_ms": ms["torch NCHW"] * 1e3, "after_ms": ms["channels-last search"] * 1e3,
            "bit_identical": same}


def fold_rows(repeat: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    acc0 = torch.randn(LEAF_CNN_PARAMS, dtype=torch.float64, generator=g)
    value = torch.randn(LEAF_CNN_PARAMS, generator=g)
    accs = {"mixed": acc0.clone(), "chunked": acc0.clone()}
    sides = {"mixed": lambda: accs["mixed"].add_(value, alpha=37.0),
             "chunked": lambda: add_scaled_(accs["chunked"], value, 37.0)}
    ms = interleaved(sides, repeat, inner=3)
    return [{"part": "fold", "case": f"{LEAF_CNN_PARAMS:,} values into float64",
             "before_ms": ms["mixed"] * 1e3, "after_ms": ms["chunked"] * 1e3,
             "bit_identical": torch.equal(accs["mixed"], accs["chunked"])}]


def local_row(name: str, repeat: int) -> dict:
    """3 clients of ``name`` trained by local_sgd, the channels-last search off and on."""
    real = pooling.ChannelsLastPooling.active
    torch.manual_seed(0)
    model = FlatModel(build_model(name, (1, 28, 28), 62))
    w0 = model.flat.clone()
    g = torch.Generator().manual_seed(1)
    data = [(torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 62, (n,), generator=g))
            for n in (60, 45, 80)]
    deltas = {}

    def clients(side: str, ours: bool) -> None:
        pooling.ChannelsLastPooling.active = real if ours else (lambda self: nullcontext())
        try:
            out = torch.empty_like(w0)
            for i, (x, y) in enumerate(data):
                local_sgd(model, w0, x, y, lr=0.05, batch_size=20, local_epochs=1,
                          local_steps=None, seed=i, delta_out=out)
            deltas[side] = out
        finally:
            pooling.ChannelsLastPooling.active = real

    sides = {"off": lambda: clients("off", False), "on": lambda: clients("on", True)}
    ms = interleaved(sides, repeat)
    return {"part": "local training", "case": f"{name}, 3 clients",
            "before_ms": ms["off"] * 1e3, "after_ms": ms["on"] * 1e3,
            "bit_identical": torch.equal(deltas["off"], deltas["on"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["pooling", "fold", "local", "all"], default="all")
    p.add_argument("--models", nargs="+", default=["emnist_cnn", "leaf_cnn"],
                   help="models for the local-training part (default: emnist_cnn leaf_cnn)")
    p.add_argument("--repeat", type=int, default=5, help="interleaved passes (default 5)")
    p.add_argument("--json", help="write the rows to this file")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    torch.set_num_threads(1)
    print(f"one thread, torch {torch.__version__}, medians of {args.repeat} interleaved passes",
          flush=True)
    parts = ["pooling", "fold", "local"] if args.part == "all" else [args.part]
    rows: list[dict] = []
    for part in parts:
        if part == "pooling":
            new = [pool_row(label, shape, args.repeat) for label, shape in POOL_SHAPES.items()]
        elif part == "fold":
            new = fold_rows(args.repeat)
        else:
            new = [local_row(name, args.repeat) for name in args.models]
        for r in new:
            print(f"{r['part']:>14} | {r['case']:<40} | before {r['before_ms']:8.2f} ms | "
                  f"after {r['after_ms']:8.2f} ms | {r['before_ms'] / r['after_ms']:.2f}x | "
                  f"bit-identical: {r['bit_identical']}", flush=True)
        rows += new
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["bit_identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
