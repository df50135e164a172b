"""Where elastic aggregation's sensitivity sits in the model: Omega / max Omega per tensor.

For a finished run's global model (model.safetensors), every client's B_k (the same
10% held out as in the run: holdout_seed(seed, client id)) gives Omega_k with the run's
method; Omega = sum_k |D_k| Omega_k / sum_k |D_k| over all 100 clients (not a round's 10).
Prints, per parameter tensor, its size, the largest Omega / max Omega, and the share of its
parameters that a tau would boost (Omega / max Omega < tau), for a few tau.
    python jobs/paper/elastic_dirichlet/sensitivity_profile.py \
        runs/paper/elastic_dirichlet/elastic_fedavgm-s0

With --json, also writes for each run and tau: the boosted share (zeta > 1) of all parameters
and of each tensor, the mean zeta (the uniform server step the scale amounts to on average),
and the share of parameters that zeta restricts by more than 10% against the least sensitive
ones (zeta < 0.9 (1 + tau), i.e. Omega / max Omega > 0.1 (1 + tau)): the parameters the
per-parameter scale actually treats differently, whatever tau does to the overall step.
"""

from __future__ import annotations

import argparse
import json

import torch
import yaml
from safetensors.torch import load_file

from fedray.algorithms.elastic import holdout_seed, holdout_split, sensitivity
from fedray.core.flat_model import FlatModel
from fedray.core.models import build_model
from fedray.data.store.reader import StoreSource

TAUS = (0.5, 0.1, 0.01, 0.001)


def main(run_dir: str, taus: tuple[float, ...] = TAUS) -> dict:
    cfg = yaml.safe_load(open(f"{run_dir}/config.yaml"))
    el = cfg["algorithm"]["elastic"]
    source = StoreSource(cfg["data"]["partition"])
    model = FlatModel(build_model(cfg["model"]["name"], tuple(source.input_shape),
                                  source.num_classes, **(cfg["model"].get("args") or {})))
    model.module.load_state_dict(load_file(f"{run_dir}/model.safetensors"))
    w = model.flat.clone()
    omega = torch.zeros(model.num_params, dtype=torch.float64)
    out, total = torch.zeros(model.num_params), 0
    for cid in range(source.population):
        x = torch.from_numpy(source.client(cid)[0])
        held, keep = holdout_split(len(x), el["holdout"], holdout_seed(cfg["seed"], cid))
        bs = min(cfg["client"]["batch_size"], len(x))
        sensitivity(model, w, x[held], batch_size=bs, mu=el["mu"], out=out, method=el["method"])
        omega += len(keep) * out.double()
        total += len(keep)
    ratio = omega / total / (omega / total).max()
    profile = {"run": run_dir.rstrip("/").rsplit("/", 1)[-1], "num_params": model.num_params,
               "taus": {}}
    for t in taus:
        zeta = 1 + t - ratio
        profile["taus"][f"{t:g}"] = {
            "boosted_share": float((ratio < t).double().mean()),
            "mean_zeta": float(zeta.mean()),
            "restricted_over_10pct": float((zeta < 0.9 * (1 + t)).double().mean()),
            "per_tensor_boosted": {}}
    print(
        f"{run_dir}: {model.num_params} parameters; boosted share by tau: "
        + ", ".join(f"{t}: {profile['taus'][f'{t:g}']['boosted_share']:.4f}" for t in taus)
    )
    lo = 0
    for name, p in model.module.named_parameters():
        r = ratio[lo : lo + p.numel()]
        lo += p.numel()
        shares = {f"{t:g}": float((r < t).double().mean()) for t in taus}
        for key, share in shares.items():
            profile["taus"][key]["per_tensor_boosted"][name] = share
        print(
            f"  {name:10s} {p.numel():7d}  max {float(r.max()):.4f}  median "
            f"{float(r.median()):.2e}  below tau: "
            + ", ".join(f"{t}: {shares[f'{t:g}']:.3f}" for t in taus)
        )
    return profile


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("runs", nargs="+", help="finished run directories (config.yaml, "
                    "model.safetensors)")
    ap.add_argument("--taus", type=float, nargs="+", default=list(TAUS),
                    help="the tau values to profile (default: 0.5 0.1 0.01 0.001)")
    ap.add_argument("--json", default=None,
                    help="also write the profiles, one per run, to this JSON file")
    args = ap.parse_args()
    profiles = [main(d, tuple(args.taus)) for d in args.runs]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(profiles, f, indent=2)
            f.write("\n")
