"""The ``fedray`` command line."""

from __future__ import annotations

import argparse
import os
import sys

from fedray import __version__
from fedray.errors import FedrayError

RUN_HELP = """Run a federated job: JOB.yaml merged with key=value overrides.

examples:
  fedray run jobs/quickstart.yaml
  fedray run jobs/quickstart.yaml rounds=50 sampling.clients_per_round=20 output.dir=runs/a
  fedray run jobs/quickstart.yaml runtime.address=auto runtime.worker.num_gpus=0.25

The run directory (output.dir, any fsspec URL) receives config.yaml, metrics.jsonl,
summary.json and model.safetensors. Config keys: docs/config.md."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedray", description="Ray-based simulation of "
                                "cross-device federated learning.")
    p.add_argument("--version", action="version", version=f"fedray {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run a federated job", description=RUN_HELP,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("job", metavar="JOB.yaml", help="job configuration file")
    run.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    return p


def _run(args: argparse.Namespace) -> int:
    import fedray
    from fedray.api import prepare
    from fedray.progress import Progress

    cfg = prepare(args.job, args.overrides)  # fail fast, before anything starts
    progress = None if args.quiet else Progress(cfg.rounds)
    try:
        result = fedray.run(args.job, overrides=args.overrides, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    final = result.summary.get("final", {})
    acc = final.get("test_accuracy", final.get("fed_test_accuracy"))
    acc_text = f"test accuracy {acc:.4f}, " if acc is not None else ""
    print(f"done: {result.summary['rounds']} rounds, {acc_text}"
          f"{result.summary['total_s']:.1f}s; results in {result.run_dir}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    debug = getattr(args, "debug", False) or bool(os.environ.get("FEDRAY_DEBUG"))
    try:
        return _run(args)
    except FedrayError as exc:
        if debug:
            raise
        print(f"fedray: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedray: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
