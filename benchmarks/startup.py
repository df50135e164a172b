"""Run start-up: the wall time of a whole ``fedray run`` process, phase by phase, or of a short
fedray.run in one Ray session.

A sweep of many short trials, a notebook re-running a job, the test suite: all pay a run's
fixed cost many times. Two ways to see it:

**A whole process** (the default): ``fedray run jobs/quickstart.yaml rounds=1`` started as a
user would, from a fresh directory under the system's temp folder (not the repository: the
job's relative paths, output.dir's ``runs/...`` among them, resolve there), timed from just
before the exec to its exit, ``--runs`` times. Inside the process a probe (``PROBE`` below,
run with ``python -c``; it only wraps functions, so it times any fedray version that has
them) stamps the phases as the command sees them: the interpreter, ``import fedray.cli``, the
command's check of the job (``fedray.api.prepare``), fedray.run's own preparation and the
imports a Ray run needs, ``ray.init``, building the client source, starting the driver and
worker actors, the driver's ``setup`` (its process boot and imports, then the wait for its
workers: summary.json's ``pool_start_s``), the round (training and evaluation, from
metrics.jsonl), ``finish`` (writing the outputs), ending the actors, ``ray.shutdown`` and the
interpreter's exit. ``--tree NAME=PATH`` (repeatable) times several fedray source trees
(PYTHONPATH=PATH each), their runs interleaved, so that they meet the same machine load::

    python benchmarks/startup.py                       # 5 runs of this tree's fedray
    python benchmarks/startup.py --runs 6 --tree before=/tmp/old --tree after=. --json s.json

**In one Ray session** (``--in-session``): the test suite's ``tiny_job`` (tests/conftest.py:
logistic regression on 40 synthetic writers, 8 clients per round, 3 rounds, two workers of
one CPU), ``--runs`` times in this process's Ray session, each run's wall time and
``pool_start_s`` (how long its driver waited for its workers). It leaves out what a session
pays once (Ray's start, this process's imports) and shows what every run pays again::

    python benchmarks/startup.py --in-session --runs 10 --json startup.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# The probe: run as `python -c PROBE JOB key=value ...` with FEDRAY_STARTUP_MARKS naming the
# file its time stamps go to. It wraps, where they exist, the functions a run passes
# through, and records (name, time.time()) as each starts and ends; then it runs the CLI as
# the `fedray` console script does. session.get is how fedray.run waits for each of the
# driver's methods, in order: setup, begin, run_round (once per round), finish, state_dict.
PROBE = r"""
import json, os, sys, time
marks = [("python", time.time())]
def mark(name):
    marks.append((name, time.time()))
cpu = {}  # pid -> [command line, CPU seconds so far]: this process and what it starts
sampler = [0.0]  # the CPU seconds of the sampling itself, taken off this process's
def watch():
    import psutil
    me, procs = psutil.Process(), {}
    while True:
        for p in me.children(recursive=True):
            procs.setdefault(p.pid, p)
        for pid, p in [(me.pid, me), *procs.items()]:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    name = "CLI" if p is me else " ".join(p.cmdline()[:3])
                entry = cpu.setdefault(pid, ["", 0.0])
                entry[0] = name or entry[0]
                entry[1] = t.user + t.system
            except Exception:
                pass
        sampler[0] = time.thread_time()
        time.sleep(0.1)
import atexit, threading
threading.Thread(target=watch, daemon=True).start()
def write():  # registered first, so run last of the atexit handlers, however the CLI exits
    mark("main_returned")
    cpu.setdefault(os.getpid(), ["CLI", 0.0])[1] -= sampler[0]
    with open(os.environ["FEDRAY_STARTUP_MARKS"], "w") as f:
        json.dump({"marks": marks, "cpu": list(cpu.values())}, f)
atexit.register(write)
import fedray.cli
mark("cli_imported")
import fedray.api as api
import fedray.runtime.session as session
def wrap(owner, attr, label):
    fn = getattr(owner, attr, None)
    if fn is None:
        return
    def wrapped(*a, **k):
        n = sum(1 for m in marks if m[0].startswith(label + "#") and m[0].endswith(":in"))
        mark(f"{label}#{n}:in")
        try:
            return fn(*a, **k)
        finally:
            mark(f"{label}#{n}:out")
    setattr(owner, attr, wrapped)
for attr in ("prepare", "run", "_build_source"):
    wrap(api, attr, attr)
wrap(session, "get", "get")
wrap(session, "kill_actors", "kill_actors")
_ray_session = session.ray_session
def ray_session(*a, **k):
    mark("ray_session:in")
    import ray
    wrap(ray, "init", "init")
    wrap(ray, "shutdown", "shutdown")
    return _ray_session(*a, **k)
session.ray_session = ray_session
_run_inline = getattr(api, "_run_inline", None)
def run_inline(*a, **k):  # runtime.backend inline or auto: the driver in this process
    from fedray.runtime.driver import Driver
    for attr, label in (("setup", "isetup"), ("run_round", "iround"), ("finish", "ifinish")):
        wrap(Driver, attr, label)
    return _run_inline(*a, **k)
if _run_inline is not None:
    api._run_inline = run_inline
sys.argv = ["fedray", "run", *sys.argv[1:]]
fedray.cli.entry()
"""

# The phases, each ending at its mark and starting where the one before it ended; a mark a
# fedray version never reaches (a second prepare it does not make) counts as reached at the
# previous one, so its phase is 0 and the phases always add up to the whole. A run's first
# ``I`` rounds may run in this process (runtime.backend inline, or auto before its hand-over
# to Ray: the Driver's own methods, isetup/iround/ifinish), the other ``R`` on Ray, where
# session.get #0 is setup, #1 begin, #2..#R+1 the rounds, #R+2 finish.
PHASES = [
    ("interpreter start", "python"),
    ("import fedray.cli", "cli_imported"),
    ("check the job (CLI)", "prepare#0:out"),
    ("fedray.run: prepare the job", "prepare#1:out"),
    ("in this process: build the client source", "source@here"),
    ("in this process: driver setup", "isetup#0:out"),
    ("in this process: rounds", "iround#{I-1}:out"),
    ("in this process: finish", "ifinish#0:out"),
    ("imports for a Ray run", "ray_session:in"),
    ("start Ray (ray.init)", "init#0:out"),
    ("build the client source", "source@ray"),
    ("submit driver and workers", "get#0:in"),
    ("driver setup", "get#0:out"),
    ("begin", "get#2:in"),
    ("rounds", "get#{R+1}:out"),
    ("finish: write outputs", "get#{R+2}:out"),
    ("weights back, end the actors", "kill_actors#0:out"),
    ("ray.shutdown", "shutdown#0:out"),
    ("after Ray: CLI ends, atexit", "main_returned"),
    ("interpreter exit", "exit"),
]


def phases(marks: dict[str, float], summary: dict, metrics: list[dict]) -> dict[str, float]:
    """Seconds per phase of one process's ``marks`` (name -> time.time()), with the driver's
    setup split by summary.json's ``pool_start_s`` (its wait for the workers) and the rounds
    by metrics.jsonl (training, evaluation, the rest: metrics and checkpoint writes)."""
    # the client source is built by the check of the job (for the model's shapes), for
    # the rounds in this process, and on Ray: the last build before each part's setup
    built = sorted(t for m, t in marks.items() if m.startswith("_build_source#")
                   and m.endswith(":out"))
    marks = dict(marks)
    for key, setup in (("source@here", "isetup#0:in"), ("source@ray", "get#0:in")):
        before = [t for t in built if setup in marks and t <= marks[setup]]
        if before:
            marks[key] = before[-1]
    here = sum(1 for m in marks if m.startswith("iround#") and m.endswith(":in"))
    rounds = len(metrics) - here
    at_count = {"{I-1}": here - 1, "{R+1}": rounds + 1, "{R+2}": rounds + 2}
    out, last = {}, marks["exec"]
    for name, mark in PHASES:
        for k, v in at_count.items():
            mark = mark.replace(k, str(v))
        at = marks.get(mark, last)
        out[name], last = at - last, max(at, last)
    wait = min(summary.get("pool_start_s", 0.0), out["driver setup"])

    def by_round(label: str, rows: list[dict], whole: float) -> dict[str, float]:
        train = sum(m["train_s"] for m in rows)
        wall = sum(m["wall_s"] for m in rows)
        return {f"{label}: train": train, f"{label}: evaluate": wall - train,
                f"{label}: the rest": whole - wall}

    split = {"driver setup": {"driver: boot, imports, setup": out["driver setup"] - wait,
                              "driver waits for its workers": wait},
             "in this process: rounds": by_round("in this process: rounds", metrics[:here],
                                                 out["in this process: rounds"]),
             "rounds": by_round("rounds", metrics[here:], out["rounds"])}
    out = {k: v for name, t in out.items() for k, v in split.get(name, {name: t}).items()}
    out["total"] = marks["exit"] - marks["exec"]
    return out


# the processes of a run, told apart by their command lines (a Ray worker process's is its
# title: ray::IDLE until it hosts an actor, then ray::Driver..., ray::ClientWorker...; the
# agents rename themselves too)
KINDS = [("CLI", "CLI process"), ("gcs_server", "GCS server"), ("/raylet", "raylet"),
         ("log_monitor.py", "log monitor"), ("monitor.py", "autoscaler monitor"),
         ("dashboard.py", "dashboard head"), ("DashboardAgent", "dashboard agent"),
         ("dashboard/agent.py", "dashboard agent"), ("RuntimeEnvAgent", "runtime-env agent"),
         ("runtime_env/agent", "runtime-env agent"), ("fedray.runtime.reaper", "fedray reaper"),
         ("ray::Driver", "driver actor"), ("ray::ClientWorker", "worker actors"),
         ("ray::", "idle Ray workers"), ("default_worker.py", "idle Ray workers")]


def cpu_by_kind(cpu: list[tuple[str, float]]) -> dict[str, float]:
    """CPU seconds (user + system) by kind of process, from the probe's samples: work that
    does not depend on how loaded the machine is, unlike wall time."""
    out = {f"cpu: {kind}": 0.0 for _, kind in KINDS} | {"cpu: other": 0.0}
    for cmdline, seconds in cpu:
        kind = next((k for pattern, k in KINDS if pattern in cmdline), "other")
        out[f"cpu: {kind}"] += seconds
    out["cpu: total"] = sum(out.values())
    return out


def run_process(tree: str, job: str, overrides: list[str], python: str) -> dict:
    """One ``fedray run JOB overrides`` process of the fedray in ``tree``, from a fresh
    directory; its phases (``phases``)."""
    cwd = tempfile.mkdtemp(prefix="fedray-startup-")
    marks_file = os.path.join(cwd, "marks.json")
    env = dict(os.environ, PYTHONPATH=tree, FEDRAY_STARTUP_MARKS=marks_file)
    env.pop("RAY_ADDRESS", None)  # a private Ray, as on a laptop
    try:
        t0 = time.time()
        proc = subprocess.run([python, "-c", PROBE, job, *overrides, "--quiet"], cwd=cwd,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
        t1 = time.time()
        if proc.returncode != 0:
            raise RuntimeError(f"fedray run failed ({proc.returncode}):\n{proc.stdout}")
        with open(marks_file) as f:
            probed = json.load(f)
        marks = dict(probed["marks"])
        marks.update(exec=t0, exit=t1)
        (run_dir,) = glob.glob(os.path.join(cwd, "runs", "*"))
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            metrics = [json.loads(line) for line in f if line.strip()]
        return {**phases(marks, summary, metrics), **cpu_by_kind(probed["cpu"])}
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def process_mode(args: argparse.Namespace) -> dict:
    trees = dict(t.split("=", 1) for t in args.tree) if args.tree else {"fedray": ROOT}
    trees = {k: os.path.abspath(v) for k, v in trees.items()}
    rows: dict[str, list[dict]] = {k: [] for k in trees}
    for i in range(args.runs):
        for name, tree in trees.items():
            job = args.job or os.path.join(tree, "jobs", "quickstart.yaml")
            load = os.getloadavg()[0]
            try:
                row = run_process(tree, job, args.overrides, args.python)
            except RuntimeError as exc:  # Ray's start timing out on an overloaded machine
                print(f"run {i + 1}/{args.runs} {name}: {exc}", flush=True)
                continue
            row["loadavg_1m"] = load
            rows[name].append(row)
            print(f"run {i + 1}/{args.runs} {name}: {row['total']:5.2f}s "
                  f"(start Ray {row['start Ray (ray.init)']:.2f}s; "
                  f"load {load:.2f})", flush=True)
    if not all(rows.values()):
        raise SystemExit("a tree has no successful run")
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
               for name, rs in rows.items()}
    names = list(trees)
    print(f"\nmedian of {', '.join(f'{len(r)} {n}' for n, r in rows.items())} runs, seconds: "
          f"fedray run {os.path.basename(args.job or 'jobs/quickstart.yaml')} "
          f"{' '.join(args.overrides)}")
    print(f"{'phase':38s}" + "".join(f"{n:>12s}" for n in names))
    for key in medians[names[0]]:
        if key == "loadavg_1m":
            continue
        print(f"{key:38s}" + "".join(f"{medians[n][key]:12.2f}" for n in names))
    if len(names) > 1:
        base = medians[names[0]]["total"]
        print("total / " + names[0] + ": " + ", ".join(
            f"{n} {medians[n]['total'] / base:.2f}x" for n in names[1:]))
    return {"mode": "process", "runs": rows, "median": medians, "trees": trees,
            "overrides": args.overrides}


def time_runs(runs: int, out_dir: str) -> list[dict]:
    """``runs`` runs of tiny_job one after another in the current Ray session, each timed."""
    import pathlib

    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
    from conftest import tiny_job  # the test suite's job: the run it pays most often

    import fedray.api

    rows = []
    for i in range(runs):
        job = tiny_job(pathlib.Path(out_dir) / f"run{i}")
        t0 = time.perf_counter()
        result = fedray.api.run(job)
        wall = time.perf_counter() - t0
        s = result.summary
        rows.append({"wall_s": wall, "pool_start_s": s["pool_start_s"],
                     "rounds_s": s["total_s"], "workers": s["num_workers"]})
        print(f"run {i + 1}/{runs}: {wall:5.2f}s, of which the driver waited "
              f"{s['pool_start_s']:.2f}s for its workers and the rounds took "
              f"{s['total_s']:.2f}s", flush=True)
    return rows


def session_mode(args: argparse.Namespace) -> dict:
    import ray

    sys.path[:0] = [ROOT]
    import fedray.api  # noqa: F401  (imported here, so the first run does not pay for it)

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, logging_level="ERROR")
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            rows = time_runs(args.runs, out_dir)
    finally:
        if started:
            ray.shutdown()
    result = {"mode": "session", "runs": rows,
              "median_wall_s": statistics.median(r["wall_s"] for r in rows),
              "median_pool_start_s": statistics.median(r["pool_start_s"] for r in rows)}
    print(f"median of {len(rows)}: {result['median_wall_s']:.2f}s a run, "
          f"{result['median_pool_start_s']:.2f}s waiting for workers")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="runs to time (default 5)")
    p.add_argument("--in-session", action="store_true",
                   help="time fedray.run of tiny_job in this process's Ray session instead")
    p.add_argument("--job", help="the job a process runs (default: the tree's "
                   "jobs/quickstart.yaml)")
    p.add_argument("--tree", action="append", metavar="NAME=PATH",
                   help="a fedray source tree to time (repeatable; default: this one)")
    p.add_argument("--python", default=sys.executable,
                   help="the interpreter the processes run (default: this one)")
    p.add_argument("overrides", nargs="*", default=None, metavar="key=value",
                   help="the job's overrides (default: rounds=1)")
    p.add_argument("--num-cpus", type=int, default=2,
                   help="--in-session: CPUs of the local Ray instance (default 2)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    args.overrides = args.overrides or ["rounds=1"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    result = session_mode(args) if args.in_session else process_mode(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
