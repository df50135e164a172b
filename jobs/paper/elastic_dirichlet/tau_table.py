"""Seed 000's tau sweep (section 7 of docs/reproductions.md): elastic FedAvgM with the momentum
and the average sensitivity at several tau, against FedAvgM and FedAvgM with a server step of
1 + tau (the uniform step that zeta = 1 + tau - Omega / max Omega tends to when almost every
Omega / max Omega is near 0), 3 seeds each.

    python jobs/paper/elastic_dirichlet/tau_table.py runs/paper/elastic_dirichlet \
        --taus 0.5 0.1 0.01 --out docs/figures/elastic_tau

Run directories under RUNS are named ``<group>-s<seed>``: ``fedavgm``;
``elastic_fedavgm`` and ``elastic_fedavgm_average`` at tau 0.5 (the section's default) and
``elastic_fedavgm_tau<tau>``, ``elastic_fedavgm_average_tau<tau>`` at other tau; the
controls ``fedavgm_lr<1 + tau>`` (e.g. ``fedavgm_lr1.5``). A group with no finished run is
left out (its cells read "—").

The metric is the section's "last 10": the mean test accuracy over a run's last 10
evaluations (rounds 82-100 with evaluation every 2 rounds); mean and population std
(ddof=0) over the seeds. The boosted share (zeta > 1, the quantity of the seed's Fig. 1,
line 52) is each run's ``elastic_boosted_share``, averaged over rounds and over seeds, with
the std over the seeds' means and the lowest round of any seed. Writes ``tau.json`` and
``tau.md`` under --out.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics

LAST = 10  # evaluations averaged: the section's "last 10" column


def _tag(x: float) -> str:
    return f"{x:g}"


def elastic_group(tau: float, method: str, batch1: bool = False) -> str:
    """The run-directory group of elastic FedAvgM with ``method`` at ``tau`` (0.5: the
    section's runs, named without a tau); ``batch1``: the ablation with one example per B_k
    batch, ``elastic_fedavgm_<method>_b1``."""
    if batch1:
        base = f"elastic_fedavgm_{method}_b1"
    else:
        base = "elastic_fedavgm" + ("" if method == "momentum" else f"_{method}")
    return base if tau == 0.5 else f"{base}_tau{_tag(tau)}"


def control_group(tau: float) -> str:
    """FedAvgM with server lr 1 + tau: the uniform step a near-uniform zeta amounts to."""
    return f"fedavgm_lr{_tag(round(1 + tau, 6))}"


def read_run(run: pathlib.Path) -> dict:
    acc, boosted = [], []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if "test_accuracy" in m:
            acc.append(float(m["test_accuracy"]))
        if "elastic_boosted_share" in m:
            boosted.append(float(m["elastic_boosted_share"]))
    out = {"last10": statistics.fmean(acc[-LAST:]), "final": acc[-1]}
    if boosted:
        out["boosted_mean"] = statistics.fmean(boosted)
        out["boosted_min"] = min(boosted)
    return out


def read_group(runs: pathlib.Path, group: str) -> dict[int, dict]:
    found = {}
    for run in sorted(runs.glob(f"{group}-s*")):
        seed = run.name[len(group) + 2:]
        if seed.isdigit() and (run / "summary.json").exists():
            found[int(seed)] = read_run(run)
    return found


def summary(per_seed: dict[int, dict]) -> dict | None:
    if not per_seed:
        return None
    last = [r["last10"] for r in per_seed.values()]
    out = {"seeds": sorted(per_seed), "last10_mean": statistics.fmean(last),
           "last10_std": statistics.pstdev(last),
           "last10_per_seed": [per_seed[s]["last10"] for s in sorted(per_seed)]}
    if all("boosted_mean" in r for r in per_seed.values()):
        per = [per_seed[s]["boosted_mean"] for s in sorted(per_seed)]
        out["boosted_mean"], out["boosted_std"] = statistics.fmean(per), statistics.pstdev(per)
        out["boosted_per_seed"] = per
        out["boosted_min"] = min(r["boosted_min"] for r in per_seed.values())
    return out


def diffs(a: dict[int, dict], b: dict[int, dict]) -> list[float]:
    """Per-seed ``a - b`` of the last-10 accuracy, over the seeds both have."""
    return [a[s]["last10"] - b[s]["last10"] for s in sorted(set(a) & set(b))]


def beyond_spread(a: dict | None, b: dict | None) -> bool | None:
    """The criteria's spread rule: |mean a - mean b| > max(std a, std b)."""
    if a is None or b is None:
        return None
    return abs(a["last10_mean"] - b["last10_mean"]) > max(a["last10_std"], b["last10_std"])


def table(runs: pathlib.Path, taus: list[float], batch1: bool = False) -> dict:
    base = read_group(runs, "fedavgm")
    out = {"metric": f"mean test accuracy over the last {LAST} evaluations",
           "std": "population (ddof=0) over seeds", "batch1": batch1, "base": summary(base),
           "taus": []}
    for tau in taus:
        ctrl = read_group(runs, control_group(tau))
        row = {"tau": tau, "control": control_group(tau), "control_summary": summary(ctrl)}
        for method in ("momentum", "average"):
            el = read_group(runs, elastic_group(tau, method, batch1))
            s = summary(el)
            row[method] = {
                "group": elastic_group(tau, method, batch1), "summary": s,
                "minus_base": diffs(el, base), "minus_control": diffs(el, ctrl),
                "beyond_spread_vs_base": beyond_spread(s, out["base"]),
                "beyond_spread_vs_control": beyond_spread(s, row["control_summary"]),
            }
        mom, avg = (read_group(runs, elastic_group(tau, m, batch1))
                    for m in ("momentum", "average"))
        row["momentum_minus_average"] = diffs(mom, avg)
        out["taus"].append(row)
    for method in ("momentum", "average"):
        means = [r[method]["summary"]["last10_mean"] for r in out["taus"]
                 if r[method]["summary"] is not None]
        out[f"{method}_range_over_tau"] = max(means) - min(means) if means else None
    return out


def _ms(s: dict | None) -> str:
    return "—" if s is None else f"{s['last10_mean']:.4f} ± {s['last10_std']:.4f}"


def _d(v: list[float]) -> str:
    return ", ".join(f"{x:+.4f}" for x in v) if v else "—"


def _b(s: dict | None) -> str:
    if s is None or "boosted_mean" not in s:
        return "—"
    return f"{s['boosted_mean']:.4f} ± {s['boosted_std']:.4f} ({s['boosted_min']:.4f})"


def markdown(t: dict) -> str:
    lines = [f"FedAvgM (base), last 10: {_ms(t['base'])}", "",
             "| τ | sensitivity | last 10 | minus FedAvgM, per seed | control (server lr 1 + τ) "
             "| minus control, per seed | boosted share: mean over rounds, ± std over seeds "
             "(lowest round) |",
             "|---|---|---|---|---|---|---|"]
    for r in t["taus"]:
        for method in ("momentum", "average"):
            m = r[method]
            lines.append(f"| {r['tau']:g} | {method} | {_ms(m['summary'])} | {_d(m['minus_base'])} "
                         f"| {_ms(r['control_summary'])} | {_d(m['minus_control'])} "
                         f"| {_b(m['summary'])} |")
    lines += ["", "| τ | momentum minus average, per seed |", "|---|---|"]
    lines += [f"| {r['tau']:g} | {_d(r['momentum_minus_average'])} |" for r in t["taus"]]
    rng = [t.get(f"{m}_range_over_tau") for m in ("momentum", "average")]
    if None not in rng:
        lines += ["", f"Range over τ of the mean last 10: momentum {rng[0]:.4f}, "
                      f"average {rng[1]:.4f}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("runs", type=pathlib.Path, help="folder holding the <group>-s<seed> runs")
    p.add_argument("--taus", type=float, nargs="+", default=[0.5, 0.1, 0.01],
                   help="the tau values, one table row pair each (default: 0.5 0.1 0.01)")
    p.add_argument("--out", type=pathlib.Path, default=None,
                   help="folder for tau.json and tau.md (default: print only)")
    p.add_argument("--batch1", action="store_true",
                   help="the ablation with one example per B_k batch (groups "
                   "elastic_fedavgm_<method>_b1[_tau<tau>]); writes tau_b1.json and tau_b1.md")
    args = p.parse_args()
    t = table(args.runs, args.taus, args.batch1)
    text = markdown(t)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = "tau_b1" if args.batch1 else "tau"
        (args.out / f"{stem}.json").write_text(json.dumps(t, indent=2) + "\n")
        (args.out / f"{stem}.md").write_text(text)


if __name__ == "__main__":
    main()
