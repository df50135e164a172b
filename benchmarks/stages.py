"""What the update stages cost a worker (docs/performance.md, "Update stages").

The quickstart's model (the TFF EMNIST CNN, 1.2M parameters) on its synthetic writers,
inline (no Ray: the workers' own time, without scheduling noise), 20 clients a round, one
worker: per-client worker time with no stage and with each built-in stage, interleaved
over ``--repeats`` passes, each starting with another case, so that the machine's drift
and any first-run cost hit every case alike; and each stage's own work on one client's
update in isolation (its ``client_update`` on 1.2M float32 entries), which the end-to-end
figure, dominated by training, can only bound. The ratio to
"none" is the figure to read; absolute times vary with the machine.

    python benchmarks/stages.py [--rounds 5] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import fedray
from fedray.config import load_config, to_dict

CASES = {
    "none": {"name": "fedavg", "aggregator": "uniform"},
    "dp (central)": {"name": "dp_fedavg", "dp": {"clip": 1.0, "noise_multiplier": 1.0}},
    "dp (adaptive)": {"name": "dp_fedavg",
                      "dp": {"clip": 1.0, "noise_multiplier": 1.0, "target_quantile": 0.5}},
    "dp (local)": {"name": "dp_fedavg", "dp": {"mode": "local", "clip": 1.0}},
    "topk 1% + error feedback": {"name": "fedavg", "aggregator": "uniform",
                                 "stages": ["topk"]},
    "quantize 8 bits": {"name": "fedavg", "aggregator": "uniform", "stages": ["quantize"]},
    "secagg 32 bits": {"name": "fedavg", "aggregator": "uniform", "stages": ["secagg"],
                       "secagg": {"bits": 32, "precision_bits": 16, "min_clients": 5}},
}


def _run(algorithm: dict, rounds: int, out: str) -> float:
    """Median over rounds (after the first) of the worker's busy time per client."""
    cfg = load_config("jobs/quickstart.yaml", [
        f"rounds={rounds}", "eval.every=0", "eval.central=false", "runtime.backend=inline",
        "runtime.num_workers=1", "runtime.worker.num_cpus=2", f"output.dir={out}"])
    job = {**to_dict(cfg), "algorithm": algorithm}
    lines = []
    fedray.run(job, progress=lines.append)
    return statistics.median(m["worker_busy_s"] / m["clients"] for m in lines[1:]) * 1e3


def stage_ms(algorithm: dict, n: int = 1_206_590, repeats: int = 30) -> float:
    """One stage's own work on one client's update of n float32 entries (the quickstart
    CNN's size), in isolation: its client_update, without training or the worker around it
    (median over ``repeats`` clients)."""
    import torch

    from fedray.algorithms.base import ClientContext, LocalUpdate, PartialSum, WorkerEnv
    from fedray.algorithms.registry import resolve
    from fedray.config import load_config
    from fedray.core.flat_model import FlatModel

    resolved = resolve(algorithm, load_config().server)
    model = FlatModel(torch.nn.Linear(n - 1, 1))
    env = WorkerEnv(model=model, device=torch.device("cpu"), lr=0.1, loss="cross_entropy",
                    eval_batch_size=1, batch_size_for=lambda k: k,
                    broadcast={"dp_clip": torch.tensor([1.0])})
    acc = PartialSum(n, extras={k: n if v == "params" else int(v) for st in resolved.stages
                                for k, v in st.extras.items()})
    for stage in resolved.stages:
        stage.setup(env)
    g = torch.Generator().manual_seed(0)
    times = []
    for i in range(repeats):
        delta = torch.randn(n, generator=g) * 1e-3
        ctx = ClientContext(i, 1, i, torch.zeros(1), torch.zeros(1), 1)
        start = time.perf_counter()
        for stage in resolved.stages:
            new = stage.client_update(env, ctx, LocalUpdate(delta, 1, 0.0, 1, 1), acc)
            ctx.state = {k: v.clone() for k, v in (new or {}).items()} or None
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    times: dict[str, list[float]] = {k: [] for k in CASES}
    with tempfile.TemporaryDirectory() as tmp:
        names = list(CASES)
        for rep in range(args.repeats):  # each pass starts with another case: no order bias
            for i, name in enumerate(names[rep % len(names):] + names[:rep % len(names)]):
                times[name].append(_run(CASES[name], args.rounds, f"{tmp}/{rep}-{i}"))
    base = statistics.median(times["none"])
    print("| stage | worker ms per client (median; min-max over passes) | vs none | the "
          "stage alone, ms per client |")
    print("|---|---|---|---|")
    for name, ts in times.items():
        t = statistics.median(ts)
        alone = stage_ms(CASES[name]) if name != "none" else 0.0
        print(f"| {name} | {t:.1f} ({min(ts):.1f}-{max(ts):.1f}) | {t / base:.2f} | "
              f"{alone:.1f} |")


if __name__ == "__main__":
    main()
