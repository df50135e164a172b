"""The ``fedray`` command line."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from typing import NoReturn

# Each subcommand imports what it runs inside its own function, not here: `fedray --help`,
# `fedray --version` and the one-line errors of a bad command line then load no torch, Ray,
# omegaconf or fsspec (start-up time: about 45 ms instead of seconds)
from fedray.errors import FedrayError, printable_line
from fedray.privacy.commands import add_privacy_command, run_privacy
from fedray.state.redact import mask
from fedray.timing.trace_commands import add_traces_command, run_traces
from fedray.version import __version__

RUN_HELP = """Run a federated job: JOB (a file, or a bundled job's name: fedray jobs) merged with
key=value overrides.

examples:
  fedray run quickstart
  fedray run jobs/quickstart.yaml
  fedray run jobs/quickstart.yaml rounds=50 sampling.clients_per_round=20 output.dir=runs/a
  fedray run jobs/quickstart.yaml runtime.address=auto runtime.worker.num_gpus=0.25
  fedray run jobs/femnist/scaffold.yaml
  fedray run jobs/quickstart.yaml algorithm.client=fedprox algorithm.aggregator=elastic
  fedray run jobs/quickstart.yaml algorithm.selector=oort clock.enabled=true
  fedray run --resume runs/a                        # continue a killed run
  fedray run --resume runs/a rounds=200 --allow-change rounds   # extend a finished one

The run directory (output.dir, any fsspec URL) receives config.yaml, metrics.jsonl,
summary.json, events.out.tfevents.fedray (TensorBoard), model.safetensors,
server_state.safetensors, checkpoint.safetensors (every checkpoint.every rounds or
checkpoint.every_s seconds), for SCAFFOLD client_state/, with output.participants (or
oort, ifca) participants/, and for IFCA its other clusters' models/. --resume RUN_DIR
continues from the checkpoint, bit-identically; the checkpoint must be the run's own (the
run id on config.yaml's first line), and the config (RUN_DIR/config.yaml, or JOB.yaml
given again, plus overrides) must equal the one the checkpoint records, except keys named
with --allow-change (rounds, eval.every, eval.batch_size, checkpoint.*, output.*,
runtime.* keep the run bit-identical; any other changes the rounds after the checkpoint,
and is said).
Config keys: docs/config.md; algorithms: docs/algorithms.md; faults and resuming:
docs/fault_tolerance.md."""

PARTITION_HELP = """Build a partition store from a recipe (a file, or a bundled recipe's name:
fedray recipes), or describe one.

examples:
  fedray partition femnist source.path=../data/femnist out=stores/femnist
  fedray partition partitions/femnist.yaml source.path=../data/femnist out=stores/femnist
  fedray partition partitions/dirichlet.yaml partitioner.alpha=0.1 out=stores/dir01
  fedray partition partitions/table.yaml source.path=data/mine.csv out=stores/mine
  fedray partition --describe stores/femnist --plot femnist.png

Every recipe takes source.path=PATH (the raw files, in their official format) and out=URL
(where the store goes: a new local path or fsspec URL). Your own data: source.name numpy
(.npz), table (CSV, parquet) or hf_disk (Hugging Face save_to_disk). Recipes:
partitions/*.yaml; recipe keys and partitioners: docs/partitions.md."""

REPORT_HELP = """Tables and plots from finished runs: one line per method, a band over seeds.

examples:
  fedray report runs/quickstart-* --out reports/quickstart
  fedray report runs/fedavg-s* runs/fedprox-s* --out reports/prox --group-by algorithm.name \\
      --target 0.7
  fedray report runs/* --out reports/loss --metric test_loss \\
      --group-by algorithm.name,sampling.clients_per_round --title "FEMNIST, test loss"
  fedray report runs/clocked-* --out reports/time --x sim_time --target 0.7 --until 36000
  fedray report runs/part/* --out reports/part --vs sampling.clients_per_round --at 10,20
  fedray report sweeps/part --out reports/sweep --vs sampling.clients_per_round --at 10,20

Runs with the same values of the --group-by config keys form one method; its runs are
repetitions (normally different seeds). By default the keys are every config key whose
value differs between the runs, less seed, name and those that cannot change results
(output.*, runtime.*, ...); the report says which. Methods are sorted by those keys'
values, numbers in numeric order. --vs KEY also plots the metric against KEY's values: a
line per method (the runs grouped by every key but KEY), a panel per --at round (default:
the final round) and one of each run's best, mean and min-max band over seeds, and a table
of them. --out receives report.md, report.csv, report.json and <metric>.png (with --vs also
<metric>_vs_<KEY>.png; client_<metric>_cdf.png for runs with per-client evaluation); it is
refused if it already holds a report.md. Run directories can be any fsspec URL; a sweep
directory (fedray sweep's output) stands for its finished trials. Details: docs/report.md."""


SWEEP_HELP = """Sweep config keys over many runs on Ray Tune: a grid or a random search.

examples:
  fedray sweep jobs/sweeps/participation.yaml
  fedray sweep jobs/sweeps/participation.yaml output=runs/part-a max_concurrent_trials=2
  fedray sweep --resume runs/part-a               # continue an interrupted sweep

SWEEP.yaml names a job and the keys to vary, e.g.
  job: ../quickstart.yaml
  parameters:
    sampling.clients_per_round: [10, 50, 100, 500]
    seed: [0, 1, 2]
Each trial is a fedray run with its own driver and workers (workers_per_trial, reserved
through a placement group). Every round's metrics go to Tune (scheduler.name=asha stops poor
trials early); the sweep directory (output, any fsspec URL) receives sweep.yaml,
trials.json (each trial's status), tune/, trials/<trial name>/ (run directories named by
their swept values, e.g. lr=0.1,seed=0, with TensorBoard events), results.csv (a row per
trial: finished, stopped early, error, interrupted) and report/ (a curve per setting, a band
over seeds, of the finished trials only). --resume reads only fedray's own files (never
Tune's pickles) and runs the trials that did not end. Keys: docs/cluster.md."""

SUBMIT_HELP = """Submit a fedray job to a Ray cluster's job server (Ray Jobs).

examples:
  fedray submit jobs/quickstart.yaml output.dir=s3://bucket/runs/q1 --address http://HEAD:8265
  fedray submit jobs/quickstart.yaml output.dir=/shared/runs/q2 --wait
  fedray status JOB_ID; fedray logs JOB_ID --follow; fedray stop JOB_ID
  fedray submit --resume /shared/runs/q2 --wait    # continue a stopped or failed job's run

The job file and this machine's fedray package are shipped with the job (runtime_env);
`fedray run job.yaml key=value ...` runs on the cluster. output.dir, and a partition store,
must be URLs or absolute paths on storage every node shares. --resume RUN_DIR (a URL or an
absolute path, holding a run with a checkpoint) runs `fedray run --resume RUN_DIR` there
instead, with the same shipping: the run continues from its last checkpoint. --address
defaults to RAY_ADDRESS, else http://127.0.0.1:8265. A cluster with token authentication
needs RAY_AUTH_MODE=token here and its token in ~/.ray/auth_token or RAY_AUTH_TOKEN.
Walkthrough: docs/cluster.md."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose usage errors are one line, as every fedray error is:
    ``fedray: error: MESSAGE`` (and, for a verb, where its help is), without the usage
    block argparse prints first, and with a typed value's line breaks shown escaped. The
    verbs' parsers are of this class too (add_subparsers makes them of their parent's)."""

    def error(self, message: str) -> NoReturn:
        verb = self.prog.removeprefix("fedray").strip()
        hint = f" (fedray {verb} --help)" if verb else ""
        self.exit(2, f"fedray: error: {printable_line(message)}{hint}\n")


def _command(sub, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    """A sub-command with its help text kept as written and the shared --debug flag."""
    cmd = sub.add_parser(name, help=summary, description=description,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    cmd.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return cmd


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fedray", description="Ray-based simulation of "
                                "cross-device federated learning.")
    p.add_argument("--version", action="version", version=f"fedray {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = _command(sub, "run", "run a federated job", RUN_HELP)
    run.add_argument("job", metavar="JOB", nargs="?",
                     help="job configuration file, or a bundled job's name (fedray jobs lists "
                     "them: quickstart, femnist/fedavg, ...); optional with --resume")
    run.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    run.add_argument("--resume", metavar="RUN_DIR",
                     help="continue this run directory from its last checkpoint")
    run.add_argument("--allow-change", metavar="KEY", action="append", default=[],
                     help="with --resume: let this config key differ from the config the "
                     "run's checkpoint records; repeatable. Safe keys (rounds, eval.every, "
                     "eval.batch_size, checkpoint.*, output.save_weights, "
                     "output.tensorboard, output.mlflow, output.wandb, output.callbacks, "
                     "runtime.*) keep the run bit-identical; any other changes the rounds "
                     "after the checkpoint")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    part = _command(sub, "partition", "build or describe a partition store", PARTITION_HELP)
    part.add_argument("recipe", metavar="RECIPE", nargs="?", help="partition recipe file, or "
                      "a bundled recipe's name (fedray recipes lists them: femnist, dirichlet, "
                      "...)")
    part.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    part.add_argument("--describe", metavar="URL", help="describe an existing store instead")
    part.add_argument("--plot", metavar="PNG", help="with --describe: also write the label "
                      "distribution plot to this file (default: no plot)")
    part.add_argument("--quiet", action="store_true", help="no progress lines")
    rep = _command(sub, "report", "tables and plots over runs and seeds", REPORT_HELP)
    rep.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (fsspec URLs)")
    rep.add_argument("--out", required=True, metavar="DIR",
                     help="directory for the report, a local path or fsspec URL (created)")
    rep.add_argument("--metric", default="test_accuracy",
                     help="a key of metrics.jsonl (default: test_accuracy); lower is better "
                     "when its name contains 'loss'")
    rep.add_argument("--group-by", metavar="KEY[,KEY...]",
                     help="dotted config keys whose values make a method (default: every key "
                     "whose value differs between the runs, less seed and keys that cannot "
                     "change results)")
    rep.add_argument("--allow-differing", metavar="KEY[,KEY...]",
                     help="let the runs of one method differ in these keys (or KEY.* "
                     "prefixes) and average them anyway (default: refused)")
    rep.add_argument("--client-metric", default="accuracy", metavar="COLUMN",
                     help="column of the per-client tables (client_eval/) whose distribution "
                     "over clients is shown (default: accuracy; also personalized_<COLUMN> "
                     "when present)")
    rep.add_argument("--client-round", type=int, metavar="ROUND",
                     help="the round of that distribution (default: each run's last table)")
    rep.add_argument("--target", type=float, metavar="VALUE",
                     help="report the rounds each run needs to reach VALUE (and, with a time "
                     "--x, the time)")
    rep.add_argument("--x", choices=("round", "sim_time", "wall_time"), default="round",
                     help="x axis of the plot: round (default), sim_time (sim_time_s, runs "
                     "with clock.enabled) or wall_time (elapsed_s); a time axis also adds the "
                     "time to target and the final time to the table")
    rep.add_argument("--until", type=float, metavar="X",
                     help="cut every run at this x value (a round, or seconds with a time "
                     "--x) and read final, best and target there: methods at equal time")
    rep.add_argument("--title", metavar="TEXT", help="title of the report and the plot "
                     "(default: the metric)")
    rep.add_argument("--vs", metavar="KEY",
                     help="also plot the metric against this config key's values (e.g. "
                     "sampling.clients_per_round): a line per method, the runs grouped by "
                     "every key but KEY; not with a time --x or --until")
    rep.add_argument("--at", metavar="ROUND[,ROUND...]",
                     help="with --vs: the rounds to read each run at, a panel each (default: "
                     "each run's final round), besides each run's best; every run must have "
                     "a value at each")
    swp = _command(sub, "sweep", "sweep config keys over many runs (Ray Tune)", SWEEP_HELP)
    swp.add_argument("sweep", metavar="SWEEP.yaml", nargs="?",
                     help="sweep file (optional with --resume)")
    swp.add_argument("overrides", nargs="*", metavar="key=value", help="sweep key overrides")
    swp.add_argument("--resume", metavar="SWEEP_DIR", help="continue this sweep directory")
    sbm = _command(sub, "submit", "submit a job to a Ray cluster", SUBMIT_HELP)
    sbm.add_argument("job", metavar="JOB.yaml", nargs="?",
                     help="job configuration file (optional with --resume)")
    sbm.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    sbm.add_argument("--resume", metavar="RUN_DIR", help="continue this run directory (a URL "
                     "or an absolute path the cluster reaches) from its last checkpoint, as "
                     "fedray run --resume does, on the cluster")
    sbm.add_argument("--allow-change", metavar="KEY", action="append", default=[],
                     help="with --resume: as fedray run's --allow-change; repeatable")
    sbm.add_argument("--address", metavar="URL", help="the job server (default: RAY_ADDRESS, "
                     "else http://127.0.0.1:8265)")
    sbm.add_argument("--job-id", metavar="ID", help="the job's submission id (default: Ray's)")
    sbm.add_argument("--wait", action="store_true",
                     help="follow the job's log until it ends; exit 0 only if it succeeded")
    for verb, summary in (("status", "a submitted job's status"),
                          ("logs", "a submitted job's log"), ("stop", "stop a submitted job")):
        cmd = _command(sub, verb, summary, f"{summary[0].upper()}{summary[1:]} (Ray Jobs); "
                       "see fedray submit --help.")
        cmd.add_argument("job_id", metavar="JOB_ID", help="as printed by fedray submit")
        cmd.add_argument("--address", metavar="URL", help="the job server (default: "
                         "RAY_ADDRESS, else http://127.0.0.1:8265)")
        if verb == "logs":
            cmd.add_argument("--follow", action="store_true", help="until the job ends")
    for verb, folder, what, use in (("jobs", "jobs", "job", "run quickstart"),
                                    ("recipes", "partitions", "recipe", "partition femnist")):
        cmd = _command(sub, verb, f"list the bundled {what}s, or print one",
                       f"The {what}s that come with fedray, one line each; `fedray {verb} show "
                       f"NAME > my.yaml` copies one out to edit. A bundled {what} runs by its "
                       f"name: `fedray {use} key=value ...` (a path to a file still means "
                       "that file)." + (" A sweep file among them is marked [fedray sweep]: "
                                        "`fedray sweep NAME` runs it." if verb == "jobs"
                                        else ""))
        cmd.add_argument("action", nargs="?", choices=["show"], help="print one by name")
        cmd.add_argument("name", nargs="?", metavar="NAME", help=f"a bundled {what}'s name")
        cmd.set_defaults(folder=folder)
    add_traces_command(sub, _command)  # generate, convert-fedscale, describe
    add_privacy_command(sub, _command)  # epsilon, noise
    return p


def _sweep(args: argparse.Namespace) -> int:
    from fedray.cluster.sweep import RESULTS_FILE, format_rows, run_sweep

    if args.resume and args.sweep:  # positional words after --resume DIR
        raise FedrayError("--resume takes no key=value overrides: a sweep resumes as it "
                          "started" if "=" in args.sweep else
                          "give either SWEEP.yaml or --resume SWEEP_DIR, not both")
    from fedray.bundled import resolve

    sweep = resolve("jobs", args.sweep) if args.sweep else None
    result = run_sweep(sweep, args.overrides, resume=args.resume)
    print(mask(format_rows(result.rows)))  # a trial's name holds its swept values
    if result.report_table is not None:
        print(mask(result.report_table))
    where = mask(result.sweep_dir)
    if result.failed:
        raise FedrayError(f"sweep {where}: trials {', '.join(result.failed)} failed (see "
                          f"{RESULTS_FILE}); finish them with fedray sweep --resume {where}")
    took = f"{result.wall_s:.1f}s" + (f" ({result.session_s:.1f}s since the resume)"
                                      if result.wall_s > result.session_s + 0.05 else "")
    print(f"done: {len(result.rows)} trials, {took}; {RESULTS_FILE} and report/ "
          f"in {where}; tensorboard --logdir {where}/trials", flush=True)
    return 0


def _follow_exit(job_id: str, address: str | None) -> int:
    from fedray.cluster.submit import follow

    state = follow(job_id, address)
    print(f"job {job_id}: {state}", flush=True)
    return 0 if state == "SUCCEEDED" else 1


def _address_option(address: str | None) -> str:
    """The ``--address`` of a command printed for the user to copy: the one they gave, as
    they gave it; none when it came from RAY_ADDRESS or the default, which the next command
    finds the same way. An address holding a credential is not printed, so its place is
    named instead (a masked one would not work if copied)."""
    if not address:
        return ""
    if mask(address) != address:
        return (" --address ADDRESS, ADDRESS being the --address given here (not printed: "
                "it holds a credential)")
    return f" --address {shlex.quote(address)}"


def _submit(args: argparse.Namespace) -> int:
    from fedray.bundled import resolve
    from fedray.cluster.submit import job_server, submit, submit_resume

    job, overrides = args.job, list(args.overrides)
    if job is not None and "=" in job and not os.path.exists(job):
        job, overrides = None, [job, *overrides]  # `fedray submit --resume DIR key=value`
    if job is not None:
        job = resolve("jobs", job)
    if args.allow_change and not args.resume:
        raise FedrayError("--allow-change needs --resume RUN_DIR")
    where = mask(job_server(args.address))  # http://user:PASSWORD@head:8265
    if args.resume:
        resumed = submit_resume(args.resume, job, overrides, args.allow_change, args.address,
                                args.job_id)
        job_id = resumed.job_id
        what = (f"submitted {job_id} to {where}: it continues {mask(args.resume)} from its "
                f"checkpoint after round {resumed.round}")
    elif job is None:
        raise FedrayError("fedray submit needs JOB.yaml (or --resume RUN_DIR)")
    else:
        job_id = submit(job, overrides, args.address, args.job_id)
        what = f"submitted {job_id} to {where}"
    print(f"{what}; follow it with: fedray logs {job_id} --follow"
          f"{_address_option(args.address)}", flush=True)
    return _follow_exit(job_id, args.address) if args.wait else 0


def _job_verb(args: argparse.Namespace) -> int:
    from fedray.cluster import submit

    if args.command == "status":
        info = submit.status(args.job_id, args.address)
        print(f"{info['job_id']}: {info['status']}" + (f" ({info['message']})"
                                                       if info["message"] else ""))
    elif args.command == "logs":
        if args.follow:
            return _follow_exit(args.job_id, args.address)
        print(submit.logs(args.job_id, args.address), end="", flush=True)
    else:
        stopped = submit.stop(args.job_id, args.address)
        print(f"{args.job_id}: " + ("stop requested" if stopped else "already ended"))
    return 0


def _report(args: argparse.Namespace) -> int:
    from fedray.state.storage import filesystem
    from fedray.tracking.report import build_report

    filesystem(args.out, "--out", durable=True, what=None)  # a report this process forgets
    report = build_report(args.runs, args.out, metric=args.metric, group_by=args.group_by,
                          target=args.target, title=args.title,
                          allow_differing=args.allow_differing,
                          client_metric=args.client_metric, client_round=args.client_round,
                          x=args.x, until=args.until, vs=args.vs, at=args.at)
    print(mask(report.grouping))  # config values, a store's URL among them
    print(mask(report.table))
    if report.vs_table is not None:
        print(f"\n{args.metric} against {args.vs.strip()}:")
        print(mask(report.vs_table))
    print(f"report in {mask(args.out)}", flush=True)
    return 0


def _bundled(args: argparse.Namespace) -> int:
    from fedray import bundled

    if args.action is None:
        if args.name:
            raise FedrayError(f"fedray {args.command} show NAME prints one; "
                              f"fedray {args.command} lists them")
        print(bundled.table(args.folder), flush=True)
        return 0
    if not args.name:
        raise FedrayError(f"fedray {args.command} show needs a NAME (fedray {args.command} "
                          "lists them)")
    print(bundled.show(args.folder, args.name), end="", flush=True)
    return 0


def _partition(args: argparse.Namespace) -> int:
    from fedray.data import recipe
    from fedray.data.store.describe import describe

    if args.describe:
        if args.recipe:
            raise FedrayError("give either RECIPE.yaml or --describe URL, not both")
        print(mask(describe(args.describe, plot=args.plot)), flush=True)
        return 0
    if not args.recipe:
        raise FedrayError("fedray partition needs RECIPE.yaml (or --describe URL)")
    if args.plot:
        raise FedrayError("--plot goes with --describe URL")
    log = (lambda s: None) if args.quiet else (lambda s: print(mask(s), file=sys.stderr,
                                                                flush=True))
    from fedray.bundled import resolve

    out, manifest = recipe.build(resolve("partitions", args.recipe), args.overrides, log=log)
    train = sum(sh["rows"] for sh in manifest["shards"] if sh["split"] == "train")
    print(f"done: {manifest['num_clients']:,} clients, {train:,} train examples; "
          f"store at {mask(out)}", flush=True)
    return 0


def _run(args: argparse.Namespace) -> int:
    import fedray
    from fedray.api import prepare, prepare_resume
    from fedray.tracking.progress import Progress

    job, overrides = args.job, list(args.overrides)
    if job is not None and "=" in job and not os.path.exists(job):
        job, overrides = None, [job, *overrides]  # `fedray run --resume DIR key=value`
    if job is not None:  # a bundled job's name (fedray jobs), or a file
        from fedray.bundled import resolve

        job = resolve("jobs", job)
    if args.allow_change and not args.resume:
        raise FedrayError("--allow-change needs --resume RUN_DIR")
    if args.resume:
        cfg, _ = prepare_resume(args.resume, job, overrides, args.allow_change)
    elif job is None:
        raise FedrayError("fedray run needs JOB.yaml (or --resume RUN_DIR)")
    else:
        cfg = prepare(job, overrides)  # fail fast, before anything starts
    # a callback: it ends its live line when the run ends or fails
    callbacks = [] if args.quiet else [Progress(cfg.rounds)]
    result = fedray.run(job, overrides=overrides, resume=args.resume,
                        allow_changes=args.allow_change, callbacks=callbacks)
    final = result.summary.get("final", {})
    acc = final.get("test_accuracy", final.get("fed_test_accuracy"))
    acc_text = f"test accuracy {acc:.4f}, " if acc is not None else ""
    stopped = result.summary.get("stopped_early_after_round")
    why = result.summary.get("stopped_by") or "a callback stopped the run"
    rounds = (f"{stopped} of {result.summary['rounds']} rounds ({why}; "
              f"fedray run --resume {mask(result.run_dir)} continues it)"
              if stopped is not None else
              f"{result.summary['rounds']} round{'s' if result.summary['rounds'] != 1 else ''}")
    print(f"done: {rounds}, {acc_text}{result.summary['total_s']:.1f}s; results in "
          f"{mask(result.run_dir)}", flush=True)
    return 0


# the positional list a verb's words after its options still belong to
_TRAILING = {"run": "overrides", "partition": "overrides", "sweep": "overrides",
             "submit": "overrides", "report": "runs"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options and positional words in any order: argparse ends a verb's positional list at
    its first option, so ``fedray run JOB --quiet rounds=2`` would refuse ``rounds=2``. The
    words it leaves over join the verb's list (key=value overrides, or report's runs);
    anything else left over, such as a misspelt option, is still refused."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    options = [w for w in extra if w.startswith("-")]
    trailing = _TRAILING.get(args.command)
    if options or (extra and not trailing):
        parser.error(f"unrecognized arguments: {' '.join(options or extra)}")
    if extra:
        setattr(args, trailing, [*getattr(args, trailing), *extra])
    return args


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so that the same ``finally`` blocks
    stop Ray and remove temporary files; the command then exits 143 (128 + SIGTERM)."""


@contextlib.contextmanager
def _stop_signals() -> Iterator[None]:
    """Ctrl-C and SIGTERM stop a command in order: the first unwinds it (Ray shut down, a
    new run's directory removed, temporary files gone); a second one while that is under
    way exits at once with the same status, and fedray.runtime.reaper ends what Ray left running.
    Without this, SIGTERM met Ray's handler (a C++ stack dump, then abort) and a second
    Ctrl-C could land inside Ray's shutdown and end the process with status 1."""
    stopping: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if stopping:
            word = "interrupted" if stopping[0] == signal.SIGINT else "terminated"
            print(f"fedray: {word}", file=sys.stderr, flush=True)
            os._exit(128 + stopping[0])
        stopping.append(signum)
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated

    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only; main() called from another leaves them
        return
    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


def main(argv: list[str] | None = None) -> int:
    with _stop_signals():  # also while an error or "interrupted" is printed
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    args = parse_args(argv)
    debug = getattr(args, "debug", False) or bool(os.environ.get("FEDRAY_DEBUG"))
    try:
        commands = {"run": _run, "partition": _partition, "report": _report, "sweep": _sweep,
                    "submit": _submit, "status": _job_verb, "logs": _job_verb,
                    "stop": _job_verb, "traces": run_traces, "privacy": run_privacy,
                    "jobs": _bundled, "recipes": _bundled}
        return commands[args.command](args)
    except FedrayError as exc:
        if debug:
            raise
        print(f"fedray: error: {printable_line(mask(str(exc)))}", file=sys.stderr)
        return 2
    except Terminated as exc:  # its text, if any: how to continue (fedray sweep)
        print("fedray: terminated" + (f"; {mask(str(exc))}" if str(exc) else ""),
              file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt as exc:
        print("fedray: interrupted" + (f"; {mask(str(exc))}" if str(exc) else ""),
              file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`fedray jobs | head -1`): end as a
        # command killed by SIGPIPE does, quietly; stdout points at /dev/null from here, so
        # the interpreter's last flush cannot raise the same error again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def entry() -> None:
    """The ``fedray`` console script. Once the command has ended, its exit status is
    decided: a further Ctrl-C or SIGTERM during the interpreter's own exit (which resets
    Python's handlers to the default, killing the process with the signal) is ignored."""
    code = main()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    _exit(code)


def _exit(code: int) -> NoReturn:
    """Exit with ``code`` the way the interpreter does -- other threads waited for, atexit
    handlers run (Ray's, logging's, a tracker's), the output streams flushed -- but without
    its teardown of every module and object, which torch makes slow: 0.3 s on a quiet
    machine, seconds on a busy one (start-up time: docs/performance.md, "Start-up by
    phase"). Where this Python lacks the hooks that takes, it exits the ordinary way."""
    import atexit

    shutdown = getattr(threading, "_shutdown", None)  # what the interpreter calls first
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if shutdown is None or run_exitfuncs is None:
        sys.exit(code)
    shutdown()
    run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone (BrokenPipeError), a stream closed
            pass
    os._exit(code)


if __name__ == "__main__":
    entry()
