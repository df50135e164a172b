"""fedray and Flower side by side on the anchors' own protocols, in one command.

    python benchmarks/protocols.py --flower-python /tmp/flower/bin/python
    python benchmarks/protocols.py --protocol femnist-flute quickstart --rounds 6 --repeat 2
    python benchmarks/protocols.py --json protocols.json --markdown protocols.md

Each protocol is a fedray job run as a user runs it, ``fedray run JOB`` in a subprocess (its
wall time is the whole process: Python start-up, Ray, the workers, the rounds, the
checkpoint and outputs it writes by default), with evaluation switched off on both sides
and fewer rounds than the paper's (``--rounds``):

  cifar10-pfl-iid: pfl-research's CIFAR-10 benchmark (jobs/cifar10/pfl_iid.yaml: 1,000 iid
    clients x 50 images, 50 a round, batch 10, 1 local epoch, ``pfl_cifar10_cnn``) on
    generated inputs: CIFAR-10-format pickles of random pixels (benchmarks/cifar10_pickles.py)
    partitioned with partitions/cifar10_iid.yaml; the speed is the real data set's.
  femnist-flute: FLUTE's FEMNIST experiment (FLUTE below) on the real LEAF FEMNIST sample
    (105 writers, partitions/femnist.yaml), through jobs/femnist_leaf.yaml with every
    protocol value set from FLUTE's files.
  quickstart: jobs/quickstart.yaml as it is (1,000 generated writers, 20 a round,
    ``emnist_cnn``).

Flower's simulation engine runs the same protocol under ``--flower-python`` (an environment
of its own with flwr[simulation]; benchmarks/flower_side.py ``--spec``): the same model, the
same clients and data (the clients fedray's rounds train, written to an .npz), the same
client ids each round (fedray's sampling, sent to Flower's sampled nodes), local epochs,
batch, lr and rounds; the examples each round trains are checked to be equal on both sides.
Its wall time is flower_side.py's process, from Python start-up to exit.

Steady state: the mean seconds per round after the first ``--warmup`` rounds (fedray's
``train_s`` in metrics.jsonl; Flower's configure_fit to aggregate_fit). Each side's
fraction of this machine's fp32 GEMM peak (a timed 2048^3 torch.matmul on 2 threads, the
best of several, before and after the runs) is its training FLOP rate over that peak, with
training FLOPs counted as 6 x forward multiply-accumulates per example per epoch (forward
2 x MACs, backward about twice the forward), the MACs counted from the model's convolution
and linear layers on the protocol's input shape (``forward_macs``).

FLUTE (microsoft/msrflute at commit 8bfe0854ab293c6226df66856b3d96b39dbe61fe):
  experiments/cv_cnn_femnist/config.yaml: strategy: FedAvg; num_clients_per_iteration: 10;
    initial_lr_client: 0.1 (client optimizer sgd); client train batch_size: 20; server
    optimizer sgd lr 1.0; max_iteration: 800 (rounds);
  experiments/cv_cnn_femnist/model.py: CNN = CNN_DropOut(only_digits=False): conv3x3-32,
    conv3x3-64, maxpool 2, dropout 0.25, fc128, dropout 0.5, fc62, which is fedray's
    ``emnist_cnn`` (the TFF / Reddi et al. CNN, not the LEAF CNN; ``--femnist-model
    leaf_cnn`` runs the LEAF FEMNIST CNN instead);
  core/trainer.py: train_desired_samples makes one pass (run_train_epoch) over the client's
    data, stopping at desired_max_samples (config.yaml: 5000; every sample writer has fewer):
    one local epoch;
  core/strategies/fedavg.py: each client's update weighted by its number of samples, as
    fedray's fedavg weights by examples.
  FLUTE's data is FedML's fed_emnist .h5 (TFF's 3,400 writers,
  experiments/cv_cnn_femnist/dataloaders/preprocess.py); here, the real LEAF sample.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

FLUTE = "microsoft/msrflute@8bfe085"


@dataclass(frozen=True)
class Protocol:
    """One anchor's protocol: the fedray job that runs it and how its inputs are built."""

    title: str
    job: str  # relative to the repository root
    paper_rounds: int
    recipe: str | None = None  # partitions/*.yaml; None: the job's own (synthetic) data
    source: str | None = None  # 'cifar10-generated' or 'femnist-sample'
    overrides: tuple[str, ...] = ()  # key=value on top of the job (FLUTE's values)


PROTOCOLS: dict[str, Protocol] = {
    "cifar10-pfl-iid": Protocol(
        title="CIFAR-10, pfl-research iid (generated pixels)",
        job="jobs/cifar10/pfl_iid.yaml", paper_rounds=1500,
        recipe="partitions/cifar10_iid.yaml", source="cifar10-generated"),
    "femnist-flute": Protocol(
        title="FEMNIST, FLUTE (real LEAF sample)",
        job="jobs/femnist_leaf.yaml", paper_rounds=800,  # config.yaml max_iteration
        recipe="partitions/femnist.yaml", source="femnist-sample",
        overrides=("algorithm.name=fedavg",  # config.yaml strategy: FedAvg
                   "model.name=emnist_cnn",  # model.py CNN_DropOut(only_digits=False)
                   "sampling.clients_per_round=10",  # config.yaml num_clients_per_iteration
                   "client.lr=0.1",  # config.yaml initial_lr_client (client sgd)
                   "client.batch_size=20",  # config.yaml client_config train batch_size
                   "client.local_epochs=1",  # core/trainer.py: one run_train_epoch
                   "server.lr=1.0")),  # config.yaml server optimizer_config: sgd, lr 1.0
    "quickstart": Protocol(title="quickstart (1,000 generated writers)",
                           job="jobs/quickstart.yaml", paper_rounds=50),
}
# what every run switches off: both sides only train (Flower's fraction_evaluate is 0)
NO_EVAL = ("eval.every=0", "eval.central=false", "eval.federated_clients=0")
GEMM_N, GEMM_THREADS = 2048, 2


# ---- counting FLOPs --------------------------------------------------------------------

def forward_macs(model: nn.Module, input_shape: Sequence[int]) -> int:
    """Multiply-accumulates of one example's forward pass through the model's convolution
    and linear layers (the GEMM work; activations, pooling and dropout are not counted),
    measured on a forward pass of one zero example of ``input_shape``, so that the layers'
    real output sizes are used. A parameterized layer it cannot count (a recurrent or
    normalization layer) is an error rather than a silent undercount."""
    counts: list[int] = []

    def conv(m: nn.modules.conv._ConvNd, out: torch.Tensor) -> int:
        per_output = (m.in_channels // m.groups) * math.prod(m.kernel_size)
        return out.numel() * per_output

    def hook(m: nn.Module, inputs: tuple, out: torch.Tensor) -> None:
        if isinstance(m, nn.modules.conv._ConvNd):
            counts.append(conv(m, out))
        elif isinstance(m, nn.Linear):
            counts.append(out.numel() * m.in_features)

    leaves = [m for m in model.modules() if not list(m.children())]
    for m in leaves:
        if any(True for _ in m.parameters(recurse=False)) and not isinstance(
                m, (nn.modules.conv._ConvNd, nn.Linear)):
            raise ValueError(f"forward_macs cannot count {type(m).__name__} layers")
    handles = [m.register_forward_hook(hook) for m in leaves]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros((1, *input_shape)))
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return int(sum(counts))


def training_flops(macs_per_example: int, examples: int, local_epochs: int = 1) -> float:
    """FLOPs of local training on ``examples`` examples for ``local_epochs`` epochs: forward
    2 x MACs, backward about twice the forward (the gradients of the inputs and of the
    weights), so 6 x MACs per example per epoch (the first layer's input gradient, which
    nothing needs, is counted too)."""
    return 6.0 * macs_per_example * examples * local_epochs


def gemm_peak(threads: int = GEMM_THREADS, n: int = GEMM_N, repeats: int = 5) -> float:
    """This machine's fp32 GEMM rate in FLOP/s: the fastest of ``repeats`` timed n x n
    torch.matmul on ``threads`` intra-op threads, after one untimed call."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
        torch.matmul(a, b)
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return 2.0 * n ** 3 / best


# ---- one side's numbers ------------------------------------------------------------------

def side_numbers(round_s: Sequence[float], examples: Sequence[int], whole_s: float,
                 warmup: int, flops_per_example: float) -> dict:
    """One side's row values from its per-round seconds and examples: the whole process and
    the steady state (the rounds after ``warmup``: their mean seconds), each with its
    training FLOP rate."""
    if len(round_s) <= warmup:
        raise ValueError(f"{len(round_s)} rounds leave none after {warmup} warm-up rounds")
    steady_s = list(round_s[warmup:])
    steady_flops = flops_per_example * sum(examples[warmup:])
    total_flops = flops_per_example * sum(examples)
    return {"whole_s": whole_s, "round_s": list(round_s), "examples": list(examples),
            "steady_s_per_round": sum(steady_s) / len(steady_s),
            "steady_median_s": statistics.median(steady_s),
            "outside_rounds_s": whole_s - sum(round_s),
            "steady_flop_s": steady_flops / sum(steady_s),
            "whole_flop_s": total_flops / whole_s}


def median_side(runs: list[dict]) -> dict:
    """Several repeats of one side as one: the medians of its whole-process and steady
    numbers, the runs themselves kept under ``runs``."""
    keys = ("whole_s", "steady_s_per_round", "steady_median_s", "outside_rounds_s",
            "steady_flop_s", "whole_flop_s")
    out = {k: statistics.median(r[k] for r in runs) for k in keys}
    out["runs"] = runs
    return out


# ---- the table ---------------------------------------------------------------------------

def with_peak(row: dict, peak: float) -> None:
    """Each side's FLOP rates of ``row`` as fractions of ``peak`` FLOP/s."""
    for side in ("fedray", "flower"):
        if row.get(side):
            row[side]["steady_peak_fraction"] = row[side]["steady_flop_s"] / peak
            row[side]["whole_peak_fraction"] = row[side]["whole_flop_s"] / peak


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} s"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def ratios(row: dict) -> tuple[float | None, float | None]:
    """fedray's speed over Flower's: Flower's steady seconds per round over fedray's, and
    Flower's whole process over fedray's (above 1: fedray is faster); None without Flower."""
    f, fl = row["fedray"], row.get("flower")
    if not fl:
        return None, None
    return fl["steady_s_per_round"] / f["steady_s_per_round"], fl["whole_s"] / f["whole_s"]


def markdown_table(rows: list[dict]) -> str:
    """The protocol table, paste-ready: one line per protocol."""
    lines = ["| protocol | rounds (timed) | fedray whole process | fedray steady s/round | "
             "Flower whole process | Flower steady s/round | fedray / Flower (steady; whole) "
             "| GEMM peak, steady: fedray / Flower | GEMM peak, whole: fedray / Flower |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        f, fl = row["fedray"], row.get("flower") or {}
        steady, whole = ratios(row)
        speed = "-" if steady is None else f"**{_x(steady)}**; {_x(whole)}"
        lines.append(
            f"| {row['title']} | {row['rounds']} of {row['paper_rounds']:,} "
            f"({row['rounds'] - row['warmup']}) | {_s(f['whole_s'])} | "
            f"{_s(f['steady_s_per_round'])} | {_s(fl.get('whole_s'))} | "
            f"{_s(fl.get('steady_s_per_round'))} | {speed} | "
            f"{_pct(f['steady_peak_fraction'])} / {_pct(fl.get('steady_peak_fraction'))} | "
            f"{_pct(f['whole_peak_fraction'])} / {_pct(fl.get('whole_peak_fraction'))} |")
    return "\n".join(lines)


def markdown_notes(rows: list[dict], meta: dict) -> str:
    """What the table was measured on and how, one bullet per fact."""
    out = [f"- Command: `{meta['command']}`",
           f"- Machine: {meta['machine']}; torch {meta['torch']}; fp32 GEMM peak "
           f"{meta['gemm_peak_gflops']:.1f} GFLOP/s ({GEMM_THREADS} threads, "
           f"{GEMM_N}^3 matmul, best of before {meta['gemm_before_gflops']:.1f} and after "
           f"{meta['gemm_after_gflops']:.1f}); Flower {meta.get('flower_version') or '-'}.",
           f"- Load average (1 min): {meta['load_start']} at the start, at most "
           f"{meta['load_max']} after a run, {meta['load_end']} at the end"
           f"{' (a loaded machine: preliminary numbers)' if meta['loaded'] else ''}; "
           f"repeats: {meta['repeat']} (medians)."]
    out += [f"- {name}: FAILED: {why}" for name, why in meta.get("failed", {}).items()]
    for row in rows:
        out.append(f"- {row['title']}: `{row['model']}`, {row['clients_per_round']} of "
                   f"{row['population']:,} clients a round, batch {row['batch_size']}, "
                   f"{row['local_epochs']} local epoch(s), lr {row['lr']}; "
                   f"{row['forward_macs']:,} forward MACs per example, "
                   f"{row['flops_per_round'] / 1e9:.1f} GFLOP of training per round "
                   f"(mean); fedray {row['fedray_workers']} workers, "
                   f"{'vectorized' if row['fedray_vectorized'] else 'sequential'} clients; "
                   f"outside the rounds (start-up, shutdown): fedray "
                   f"{_s(row['fedray']['outside_rounds_s'])}, Flower "
                   f"{_s((row.get('flower') or {}).get('outside_rounds_s'))}.")
    return "\n".join(out)


# ---- running the sides -------------------------------------------------------------------

def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return env


class ProtocolFailed(Exception):
    """A side of a protocol failed or did other work than the other; the other protocols
    still run."""


def _call(cmd: list[str], what: str, timeout: float, **kw) -> float:
    """``cmd`` in its own process, with the environment of ``_env``; returns its wall
    seconds. A failure or a time-out is a ProtocolFailed naming ``what`` and the last lines
    it printed."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True,
                              timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        raise ProtocolFailed(f"{what} took over {timeout:.0f}s (--timeout)") from e
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:]
        raise ProtocolFailed(f"{what} failed (exit {proc.returncode}): " + " | ".join(tail))
    return time.perf_counter() - t0


def retrying(fn: Callable[[int], dict], retries: int) -> dict:
    """``fn(attempt)``, tried up to ``1 + retries`` times: a loaded machine can time out
    Ray's start-up, which says nothing about either side's speed."""
    for attempt in range(retries + 1):
        try:
            return fn(attempt)
        except ProtocolFailed as e:
            if attempt == retries:
                raise
            print(f"  {e}; trying again", file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def build_inputs(name: str, work: str, femnist: str, timeout: float) -> str | None:
    """The partition store a protocol's job reads (built once per work directory), or None
    for a job with its own data."""
    p = PROTOCOLS[name]
    if p.recipe is None:
        return None
    store = os.path.join(work, f"store-{name}")
    if os.path.exists(os.path.join(store, "manifest.json")):
        return store
    if p.source == "cifar10-generated":
        from pathlib import Path

        import cifar10_pickles

        raw = os.path.join(work, "cifar10_generated")
        if not os.path.isdir(os.path.join(raw, "cifar-10-batches-py")):
            cifar10_pickles.write(Path(raw))
        path = raw
    else:
        path = femnist
    t0 = time.perf_counter()
    _call([sys.executable, "-m", "fedray.cli", "partition", p.recipe, f"source.path={path}",
           f"out={store}", "--quiet"], f"fedray partition {p.recipe}", timeout, cwd=ROOT)
    print(f"  store for {name}: {time.perf_counter() - t0:.1f}s", flush=True)
    return store


def job_overrides(name: str, store: str | None, rounds: int, model: str | None) -> list[str]:
    """The ``key=value`` overrides of a protocol's fedray run."""
    p = PROTOCOLS[name]
    out = list(p.overrides)
    if model is not None:
        out = [o for o in out if not o.startswith("model.name=")] + [f"model.name={model}"]
    if store is not None:
        out.append(f"data.partition={store}")
    return [*out, f"rounds={rounds}", *NO_EVAL]


def run_fedray(name: str, overrides: list[str], out_dir: str, timeout: float) -> dict:
    """``fedray run`` in its own process: its wall time, and per round train_s and
    examples from metrics.jsonl, with summary.json."""
    cmd = [sys.executable, "-m", "fedray.cli", "run", PROTOCOLS[name].job, *overrides,
           f"output.dir={out_dir}"]
    whole = _call(cmd, f"fedray run {PROTOCOLS[name].job}", timeout, cwd=ROOT)
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f if line.strip()]
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    return {"whole_s": whole, "round_s": [m["train_s"] for m in metrics],
            "examples": [int(m["examples"]) for m in metrics], "summary": summary}


def run_flower(python: str, spec_path: str, timeout: float) -> dict:
    """flower_side.py --spec under ``python``, in its own process and Ray instance: its
    wall time and its per-round seconds and examples."""
    out = spec_path + ".out.json"
    if os.path.exists(out):  # an earlier invocation's, in a kept --work-dir
        os.remove(out)
    whole = _call([python, os.path.join(HERE, "flower_side.py"), "--spec", spec_path,
                   "--json", out], f"flower_side.py under {python}", timeout)
    with open(out) as f:
        result = json.load(f)
    result["whole_s"] = whole
    return result


def protocol_setup(name: str, overrides: list[str], work: str) -> dict:
    """What both sides share, from the job as fedray loads it: the model and its MACs, the
    clients each round trains (fedray's sampling), and Flower's spec, with those clients
    written to an .npz."""
    # imported when used, not at the top: the table and FLOP helpers need no fedray
    # (start-up)
    import flower_side

    from fedray.config import load_config, typed
    from fedray.core.models import build_model
    from fedray.core.sampling import sample_clients
    from fedray.data.client_source import build_source

    job = typed(load_config(os.path.join(ROOT, PROTOCOLS[name].job), overrides))
    source = build_source(job.data)
    sizes = source.train_sizes()
    population, k = len(sizes), job.sampling.clients_per_round
    shape, classes = tuple(source.input_shape), int(source.num_classes)
    ids = [sample_clients(job.seed, r, population, k).tolist()
           for r in range(1, job.rounds + 1)]
    data = os.path.join(work, f"flower-{name}.npz")
    flower_side.write_clients(data, {c: source.client(c) for c in sorted(set(sum(ids, [])))})
    macs = forward_macs(build_model(job.model.name, shape, classes), shape)
    spec = {"name": name, "model": job.model.name, "input_shape": list(shape),
            "num_classes": classes, "lr": job.client.lr, "batch_size": job.client.batch_size,
            "local_epochs": job.client.local_epochs, "seed": job.seed,
            "population": population, "ids": ids, "data": data}
    spec_path = os.path.join(work, f"flower-{name}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    examples = [int(sizes[r].sum()) for r in ids]
    return {"spec": spec, "spec_path": spec_path, "examples": examples, "macs": macs}


def measure(name: str, args: argparse.Namespace, work: str, loads: list[float]) -> dict:
    """One protocol, both sides ``args.repeat`` times interleaved (fedray, then Flower);
    the load average after each run is appended to ``loads``."""
    p = PROTOCOLS[name]
    store = build_inputs(name, work, args.femnist, args.timeout)
    model = args.femnist_model if name == "femnist-flute" else None
    overrides = job_overrides(name, store, args.rounds, model)
    setup = protocol_setup(name, overrides, work)
    spec = setup["spec"]
    per_example = training_flops(setup["macs"], 1, spec["local_epochs"])
    runs: dict[str, list[dict]] = {"fedray": [], "flower": []}
    summary: dict = {}
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory(dir=work) as tmp:
            fed = retrying(lambda a: run_fedray(name, overrides, os.path.join(tmp, f"run{a}"),
                                                args.timeout), args.retries)
        if fed["examples"] != setup["examples"]:
            raise ProtocolFailed(f"fedray trained {fed['examples']} examples "
                             f"per round, not those of its sampled clients "
                             f"{setup['examples']}: the Flower side would not do the same work")
        summary = fed["summary"]
        runs["fedray"].append(side_numbers(fed["round_s"], fed["examples"], fed["whole_s"],
                                           args.warmup, per_example))
        text = (f"  {name} [{i + 1}/{args.repeat}] fedray: {fed['whole_s']:.1f}s whole, "
                f"{runs['fedray'][-1]['steady_s_per_round']:.2f} s/round steady")
        loads.append(os.getloadavg()[0])
        if args.flower_python:
            fl = retrying(lambda a: run_flower(args.flower_python, setup["spec_path"],
                                               args.timeout), args.retries)
            if fl["examples"] != setup["examples"]:
                raise ProtocolFailed(f"Flower trained {fl['examples']} "
                                 f"examples per round, not {setup['examples']}")
            runs["flower"].append(side_numbers(fl["round_s"], fl["examples"], fl["whole_s"],
                                               args.warmup, per_example))
            summary["flower_version"] = fl["flower_version"]
            text += (f" | Flower: {fl['whole_s']:.1f}s whole, "
                     f"{runs['flower'][-1]['steady_s_per_round']:.2f} s/round steady")
        print(text + f" | load {loads[-1]:.2f}", flush=True)
    row = {"protocol": name, "title": p.title, "job": p.job, "overrides": overrides,
           "rounds": args.rounds, "warmup": args.warmup, "paper_rounds": p.paper_rounds,
           "model": spec["model"], "clients_per_round": len(spec["ids"][0]),
           "population": spec["population"], "batch_size": spec["batch_size"],
           "local_epochs": spec["local_epochs"], "lr": spec["lr"],
           "forward_macs": setup["macs"],
           "flops_per_round": per_example * statistics.mean(setup["examples"]),
           "fedray_workers": summary.get("num_workers"),
           "fedray_vectorized": bool(summary.get("vectorized")),
           "flower_version": summary.get("flower_version"),
           "fedray": median_side(runs["fedray"])}
    if runs["flower"]:
        row["flower"] = median_side(runs["flower"])
    return row


# ---- the command -------------------------------------------------------------------------

def default_femnist() -> str:
    shared = os.environ.get("FEDRAY_SHARED_DATA") or os.path.join(ROOT, "..", "shared", "data")
    return os.path.join(shared, "femnist-leaf-sample")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--protocol", nargs="+", choices=[*PROTOCOLS, "all"], default=["all"],
                   help="protocols to run (default: all)")
    p.add_argument("--rounds", type=int, default=5,
                   help="rounds per run (default 5; the papers run 50 to 1,500)")
    p.add_argument("--warmup", type=int, default=1,
                   help="first rounds left out of the steady state (default 1)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run both sides this many times, interleaved; medians (default 1)")
    p.add_argument("--flower-python", metavar="PYTHON",
                   help="also run Flower's simulation (flower_side.py) under this Python, of "
                        "an environment with flwr[simulation] (docs/performance.md)")
    p.add_argument("--femnist", default=default_femnist(), metavar="DIR",
                   help="the LEAF FEMNIST directory (train/, test/); default: "
                        "../shared/data/femnist-leaf-sample or $FEDRAY_SHARED_DATA's")
    p.add_argument("--femnist-model", choices=["emnist_cnn", "leaf_cnn"], default="emnist_cnn",
                   help="femnist-flute's model (default emnist_cnn: FLUTE's CNN_DropOut)")
    p.add_argument("--work-dir", metavar="DIR",
                   help="where inputs are built and kept (default: a temporary directory, "
                        "removed after); a store already there is reused")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds any one subprocess may take (default 900)")
    p.add_argument("--retries", type=int, default=1,
                   help="runs again a side that failed (Ray's start-up can time out on a "
                        "loaded machine), this many times (default 1)")
    p.add_argument("--json", metavar="FILE", help="also write the rows and notes as JSON")
    p.add_argument("--markdown", metavar="FILE", help="also write the table and notes")
    args = p.parse_args(argv)
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if args.rounds <= args.warmup:
        p.error("--rounds must be larger than --warmup")
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if args.retries < 0:
        p.error("--retries must be >= 0")
    args.protocol = list(PROTOCOLS) if "all" in args.protocol else list(
        dict.fromkeys(args.protocol))
    if "femnist-flute" in args.protocol and not os.path.isdir(
            os.path.join(args.femnist, "train")):
        p.error(f"--femnist: no LEAF FEMNIST train/ in {args.femnist}")
    if args.flower_python and not os.path.isfile(args.flower_python):
        p.error(f"--flower-python: {args.flower_python} does not exist")
    return args


def loaded(load_start: float, loads: Sequence[float], cpus: int | None = None) -> bool:
    """Whether other work shared the machine: a load average above 0.5 before the runs, or
    above what this benchmark's own two busy processes explain (the CPU count + 1) after one
    of them. Numbers measured so are preliminary."""
    cpus = cpus or os.cpu_count() or 1
    return load_start > 0.5 or max(loads, default=0.0) > cpus + 1


def command_line(argv: Sequence[str]) -> str:
    import shlex

    return " ".join(["python benchmarks/protocols.py", *(shlex.quote(a) for a in argv)])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    load_start = os.getloadavg()[0]
    before = gemm_peak()
    print(f"fp32 GEMM ({GEMM_THREADS} threads): {before / 1e9:.1f} GFLOP/s; "
          f"load {load_start:.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or tmp
        os.makedirs(work, exist_ok=True)
        rows, loads, failed = [], [load_start], {}
        for name in args.protocol:
            print(f"{name}:", flush=True)
            try:
                rows.append(measure(name, args, work, loads))
            except ProtocolFailed as e:
                failed[name] = str(e)
                print(f"protocols.py: {name}: {e}", file=sys.stderr, flush=True)
    after = gemm_peak()
    peak = max(before, after)
    for row in rows:
        with_peak(row, peak)
    load_end = os.getloadavg()[0]
    meta = {"command": command_line(argv),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
            "torch": torch.__version__, "gemm_peak_gflops": peak / 1e9,
            "gemm_before_gflops": before / 1e9, "gemm_after_gflops": after / 1e9,
            "load_start": round(load_start, 2), "load_end": round(load_end, 2),
            "load_max": round(max(loads), 2), "loaded": loaded(load_start, loads),
            "repeat": args.repeat,
            "failed": failed,
            "flower_version": next((r["flower_version"] for r in rows
                                    if r.get("flower_version")), None),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    text = markdown_table(rows) + "\n\n" + markdown_notes(rows, meta)
    print("\n" + text, flush=True)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=2)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
