"""Seed 003's metrics from fedray runs: rounds to a target accuracy (the seed's acc40,
line 136), the test accuracy at half time and at the end (line 111), mean +- std over seeds.

    python jobs/paper/expalpha_mnist/table.py runs/paper/expalpha_mnist/label_flip \
        --targets 0.4 0.8 --out docs/figures/expalpha_mnist/label_flip.md

Every finished run directory under the given folders named ``<method>-s<seed>`` is one repetition of
``<method>``; a run that never reaches a target counts as ``rounds + 1`` (and is flagged).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics


def curve(run: pathlib.Path) -> dict[int, float]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "test_accuracy" in m:
            out[int(m["round"])] = float(m["test_accuracy"])
    return out


def first_reach(acc: dict[int, float], target: float, horizon: int) -> tuple[int, bool]:
    for r in sorted(acc):
        if r <= horizon and acc[r] >= target:
            return r, True
    return horizon + 1, False


def fmt(values: list[float], digits: int) -> str:
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folders", type=pathlib.Path, nargs="+")
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="only these seeds")
    ap.add_argument("--targets", type=float, nargs="+", default=[0.4])
    ap.add_argument("--rounds", type=int, default=None, help="horizon (default: each run's)")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    args = ap.parse_args()
    groups: dict[str, list[pathlib.Path]] = {}
    for folder in args.folders:
        for run in sorted(folder.iterdir()):
            m = re.fullmatch(r"(.+)-s(\d+)", run.name)
            if not m or not (run / "summary.json").exists():  # finished runs only
                continue
            if args.seeds is None or int(m.group(2)) in args.seeds:
                groups.setdefault(m.group(1), []).append(run)
    head = ["method", "seeds"] + [f"rounds to {t:.2f}" for t in args.targets]
    head += ["acc at t/2", "acc at t (final test)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, runs in groups.items():
        curves = [curve(r) for r in runs]
        horizon = args.rounds or min(max(c) for c in curves)
        row = [method, ", ".join(r.name.split("-s")[-1] for r in runs)]
        for t in args.targets:
            hits = [first_reach(c, t, horizon) for c in curves]
            cell = fmt([h[0] for h in hits], 1)
            missed = sum(not h[1] for h in hits)
            row.append(cell + (f" ({missed} never)" if missed else ""))
        row.append(fmt([c[horizon // 2] for c in curves], 4))
        row.append(fmt([c[horizon] for c in curves], 4))
        lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
