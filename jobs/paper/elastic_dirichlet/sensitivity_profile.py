"""Where elastic aggregation's sensitivity sits in the MLP: Omega / max Omega per layer.

For a finished run's global model (model.safetensors), every client's B_k (the same
10% held out as in the run: holdout_seed(seed, client id)) gives Omega_k with the run's
method; Omega = sum_k |D_k| Omega_k / sum_k |D_k| over all 100 clients (not a round's 10).
Prints, per parameter tensor, its size, the largest Omega / max Omega, and the share of its
parameters that a tau would boost (Omega / max Omega < tau), for a few tau.
    python jobs/paper/elastic_dirichlet/sensitivity_profile.py \
        runs/paper/elastic_dirichlet/elastic_fedavgm-s0
"""

from __future__ import annotations

import sys

import torch
import yaml
from safetensors.torch import load_file

from fedray.algorithms.elastic import holdout_seed, holdout_split, sensitivity
from fedray.core.flat_model import FlatModel
from fedray.core.models import mlp
from fedray.data.store.reader import StoreSource

TAUS = (0.5, 0.1, 0.01, 0.001)


def main(run_dir: str) -> None:
    cfg = yaml.safe_load(open(f"{run_dir}/config.yaml"))
    el = cfg["algorithm"]["elastic"]
    source = StoreSource(cfg["data"]["partition"])
    model = FlatModel(mlp(tuple(source.input_shape), source.num_classes))
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
    print(
        f"{run_dir}: {model.num_params} parameters; boosted share by tau: "
        + ", ".join(f"{t}: {float((ratio < t).double().mean()):.4f}" for t in TAUS)
    )
    lo = 0
    for name, p in model.module.named_parameters():
        r = ratio[lo : lo + p.numel()]
        lo += p.numel()
        print(
            f"  {name:10s} {p.numel():7d}  max {float(r.max()):.4f}  median "
            f"{float(r.median()):.2e}  below tau: "
            + ", ".join(f"{t}: {float((r < t).double().mean()):.3f}" for t in TAUS)
        )


if __name__ == "__main__":
    for d in sys.argv[1:]:
        main(d)
