"""The final-weight hash of every preset, to show an API change leaves each bit-identical.

Each preset runs a short inline job (no Ray) on the synthetic population, with logistic
regression and the MLP trained vectorized and one after another, and the LEAF CNN one after
another; the sha256 of the final weights' bytes is printed as JSON. Run it before and after a
change and compare the files:

    python tools/preset_hashes.py > before.json   # on the old commit
    python tools/preset_hashes.py > after.json
    diff before.json after.json                   # empty: every preset bit-identical
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile

import torch

import fedray
from fedray.algorithms.registry import PRESETS, load_builtins

# parts that no preset uses, each as a variant of fedavg (its overrides)
EXTRAS = {"fedavg+topk": ["algorithm.stages=[topk]"],
          "fedavg+quantize": ["algorithm.stages=[quantize]"],
          "fedavg+secagg": ["algorithm.aggregator=uniform", "algorithm.stages=[secagg]"],
          "fedavg+qffl": ["algorithm.aggregator=examples.qffl:QFedAvg"],
          "scaffold-option1": ["algorithm.name=scaffold", "algorithm.scaffold.option=1"]}
CASES = (("logreg", "on"), ("logreg", "off"), ("mlp", "on"),
         ("mlp", "off"), ("leaf_cnn", "off"))


def weights_hash(weights: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode())
        h.update(weights[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def run_one(preset: str, model: str, vectorize: str, out: str) -> str:
    extra = EXTRAS.get(preset, [])
    name = preset.split("+")[0].split("-")[0]
    overrides = [f"algorithm.name={name}", *extra, f"model.name={model}", "rounds=3", "seed=3",
                 "data.synthetic.num_clients=40", "sampling.clients_per_round=6",
                 "client.lr=0.05", "client.batch_size=10", "eval.every=0",
                 "runtime.backend=inline", "runtime.num_workers=2",
                 f"runtime.worker.vectorize={vectorize}", f"output.dir={out}"]
    if preset == "fedbuff":
        overrides += ["clock.enabled=true", "sampling.concurrency=8"]
    try:
        result = fedray.run(None, overrides=overrides)
    except Exception as exc:  # noqa: BLE001 -- recorded: a preset that cannot run this case
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return weights_hash(result.weights)


def main() -> None:
    load_builtins()
    out: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        names = [*sorted(PRESETS), *EXTRAS]
        for k, preset in enumerate(names):
            out[preset] = {}
            for model, vec in CASES:
                out[preset][f"{model}/{vec}"] = run_one(preset, model, vec,
                                                        f"{tmp}/{preset}-{model}-{vec}")
            print(f"{k + 1}/{len(names)} {preset}", file=sys.stderr, flush=True)
    json.dump(out, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
