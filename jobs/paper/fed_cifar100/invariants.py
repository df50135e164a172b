#!/usr/bin/env python
"""Fed-CIFAR100 partition invariants and the per-client coarse/fine label figure (reproduction 8).

Why: every Fed-CIFAR100 number in the reproductions (Reddi et al.'s adaptive optimizers, the
algorithm comparisons) rests on the store that ``partitions/fed_cifar100.yaml`` builds. If that
store is not TFF's Pachinko split as seed 000's appendix defines it (lines 38-64 of
../shared/seeds/000_*.txt) -- 500 train and 100 test clients (lines 39-43) of exactly 100
examples (line 60), every example used once (line 40), coarse labels right, per-client label
skew as Dirichlet(0.1) over the 20 coarse labels (lines 47-48) and Dirichlet(10) over each
coarse label's 5 fine labels (lines 48, 60), exhausted labels removed and renormalised
(lines 63-64) -- the accuracy comparisons measure something else. This script builds the
store exactly as a user would (``fedray.data.recipe.build`` on the recipe), reads it back (the
manifest and the Arrow shards), and checks it against the definition:

* structure: client counts and sizes, every example assigned exactly once (by image content,
  not just by label counts), the stored ``coarse`` column, shard checksums;
* reproducibility: the same seed gives the same store; with ``--generate``, a second data set
  with different pixels but the same labels gives the same per-client label histograms (the
  split depends on the labels only);
* statistics, against two Monte Carlo references computed here, independently of
  ``fedray.data.partitioners``:
  - the *Dirichlet reference*: many clients drawn from Dirichlet(0.1) / Dirichlet(10) with
    multinomial sampling and no depletion -- the process as TFF states it, before any label
    runs out. It is compared with the store's clients that were built before any fine label
    was exhausted;
  - the *sequential reference*: the whole process replayed one example at a time, with the
    same label counts, removing exhausted labels and renormalising (as the docstring of
    ``fedray.data.partitioners.pachinko`` states it), replicated many times. Because the split
    assigns every example, the last clients can only draw from the few labels left: they
    have fewer distinct coarse labels and a larger top share than the Dirichlet reference.
    This reference has the depletion in it, so it judges all clients, first and last.

It writes ``labels.png``, ``invariants.md`` and ``invariants.json`` to ``--out`` and exits 0 when
every invariant holds, 1 when one fails, 2 on bad input. Real CIFAR-100 (``--cifar``) or files
generated in exactly the official format (``--generate``) are accepted.

    python jobs/paper/fed_cifar100/invariants.py --generate --out docs/figures/fed_cifar100
    python jobs/paper/fed_cifar100/invariants.py --cifar ~/data/cifar-100-python.tar.gz --out DIR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import pickle
import shlex
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

from fedray.data.sources.cifar100 import FINE_TO_COARSE, NUM_CLASSES, NUM_COARSE  # noqa: E402
from fedray.errors import FedrayError  # noqa: E402

RECIPE = ROOT / "partitions" / "fed_cifar100.yaml"
SCRIPT = "jobs/paper/fed_cifar100/invariants.py"
F2C = np.asarray(FINE_TO_COARSE, dtype=np.int64)
FINE_PER_COARSE = NUM_CLASSES // NUM_COARSE  # 5
SIGMAS = 4.0  # statistical rows pass within 4 standard errors (see tolerance notes)

# The official label names (alphabetical), as the real files' meta holds them.
COARSE_NAMES = (
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables",
    "household_electrical_devices", "household_furniture", "insects", "large_carnivores",
    "large_man-made_outdoor_things", "large_natural_outdoor_scenes",
    "large_omnivores_and_herbivores", "medium_mammals", "non-insect_invertebrates", "people",
    "reptiles", "small_mammals", "trees", "vehicles_1", "vehicles_2",
)
FINE_NAMES = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle",
    "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle",
    "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch",
    "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish", "forest", "fox",
    "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion",
    "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain", "mouse", "mushroom",
    "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree",
    "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road",
    "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake",
    "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank",
    "telephone", "television", "tiger", "tractor", "train", "trout", "tulip", "turtle",
    "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
)
assert len(COARSE_NAMES) == NUM_COARSE and len(FINE_NAMES) == NUM_CLASSES


class BadInput(Exception):
    """A problem with the command line or the input files: exit 2 with one line."""


@dataclass
class Row:
    """One invariant: what was measured, what it should be, and whether it is."""

    name: str
    value: str
    expected: str
    status: str  # "pass", "FAIL", or "skip" (does not apply to this input; note says why)
    note: str = ""


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)

    def check(self, name: str, ok: bool, value: Any, expected: Any, note: str = "") -> bool:
        self.rows.append(Row(name, str(value), str(expected), "pass" if ok else "FAIL", note))
        return ok

    def skip(self, name: str, expected: Any, note: str) -> None:
        self.rows.append(Row(name, "-", str(expected), "skip", note))

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.status == "FAIL"]


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage too)
        raise BadInput(f"{message} (see --help)")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = _Parser(
        prog=SCRIPT,
        description="Build the Fed-CIFAR100 store (partitions/fed_cifar100.yaml), check its "
                    "invariants (client counts and sizes, every example assigned once, the "
                    "coarse column, determinism, label-only dependence, per-client label "
                    "statistics vs Monte Carlo references) and draw the per-client coarse/fine "
                    "label figure. Exit 0: all invariants hold; 1: one fails; 2: bad input.",
        epilog="example: %(prog)s --generate --out docs/figures/fed_cifar100",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--cifar", metavar="PATH",
                     help="real CIFAR-100, python version: a cifar-100-python/ folder, its "
                          "parent, or cifar-100-python.tar.gz")
    src.add_argument("--generate", action="store_true",
                     help="generate official-format pickles (cifar-100-python/{train,test,"
                          "meta}, random pixels, the official fine->coarse mapping, shuffled) "
                          "in a temporary directory and use them")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="where labels.png, invariants.md and invariants.json go (created)")
    p.add_argument("--seed", type=int, default=0, help="partition seed (the recipe's seed)")
    p.add_argument("--per-fine-train", type=int, default=500, metavar="N",
                   help="--generate: train images per fine label (test: N // 5); 500 is the "
                        "real size, small values make a quick test (>= 5)")
    p.add_argument("--data-seed", type=int, default=0,
                   help="--generate: seed of the generated labels and pixels")
    p.add_argument("--replicates", type=int, default=20, metavar="R",
                   help="replicates of the sequential (with depletion) Monte Carlo reference")
    p.add_argument("--reference-clients", type=int, default=20_000, metavar="M",
                   help="clients in the Dirichlet (no depletion) Monte Carlo reference")
    a = p.parse_args(argv)
    if a.cifar is not None:
        if not Path(a.cifar).expanduser().exists():
            raise BadInput(f"--cifar {a.cifar}: no such file or directory")
        if a.per_fine_train != 500:
            raise BadInput("--per-fine-train applies to --generate only")
    if a.per_fine_train < 5:
        raise BadInput(f"--per-fine-train must be >= 5 (the test split needs N // 5 >= 1 "
                       f"image per fine label), got {a.per_fine_train}")
    if a.seed < 0 or a.data_seed < 0:
        raise BadInput("--seed and --data-seed must be >= 0")
    if a.replicates < 2 or a.reference_clients < 100:
        raise BadInput("--replicates must be >= 2 and --reference-clients >= 100")
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {a.out}: exists and is not a directory")
    return a


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------


def generate_cifar(root: Path, per_fine_train: int, label_seed: int, pixel_seed: int) -> Path:
    """Write ``root/cifar-100-python/{train,test,meta}`` in the official format.

    Labels (and their shuffled order) come from ``label_seed``, pixels from ``pixel_seed``,
    so two calls with the same ``label_seed`` give the same labels in the same order with
    different images. Returns ``root``.
    """
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    g_label = np.random.default_rng([label_seed, 1])
    g_pixel = np.random.default_rng([pixel_seed, 2])
    for split, per in (("train", per_fine_train), ("test", per_fine_train // 5)):
        fine = g_label.permutation(np.repeat(np.arange(NUM_CLASSES), per))
        doc = {b"filenames": [f"{FINE_NAMES[f]}_s_{i:06d}.png".encode()
                              for i, f in enumerate(fine)],
               b"batch_label": f"{split}ing batch 1 of 1".encode(),
               b"fine_labels": fine.tolist(),
               b"coarse_labels": F2C[fine].tolist(),
               b"data": g_pixel.integers(0, 256, size=(len(fine), 3072), dtype=np.uint8)}
        with open(folder / split, "wb") as f:
            pickle.dump(doc, f, protocol=2)
    with open(folder / "meta", "wb") as f:
        pickle.dump({b"fine_label_names": [n.encode() for n in FINE_NAMES],
                     b"coarse_label_names": [n.encode() for n in COARSE_NAMES]}, f, protocol=2)
    return root


def build_store(cifar: Path, out: Path, seed: int,
                log: Callable[[str], None]) -> tuple[str, dict]:
    """Build the store with the shipped recipe; returns its URL and the manifest read back,
    with its client index under ``clients`` as arrays: names, and per split count, shard,
    offset and the dense label_histogram (600 clients x 100 classes: small)."""
    from fedray.data.recipe import build
    from fedray.data.store.format import read_manifest
    from fedray.data.store.reader import client_index

    url, _ = build(RECIPE, [f"source.path={cifar}", f"out={out}", f"seed={seed}"],
                   log=lambda s: log(f"    {s.strip()}"))
    m = read_manifest(url)
    ix = client_index(url, m)
    m["clients"] = {"names": ix.names(), **{
        s: {"count": ix.counts(s), "shard": ix.shards(s), "offset": ix.offsets(s),
            "label_histogram": ix.histograms(s)} for s in ix.splits}}
    return url, m


def row_digests(x: np.ndarray) -> list[bytes]:
    """A 16-byte digest of each image (row of ``x``)."""
    flat = np.ascontiguousarray(x).reshape(len(x), -1)
    return [hashlib.blake2b(r.tobytes(), digest_size=16).digest() for r in flat]


def read_split(url: str, manifest: dict, split: str) -> dict[str, np.ndarray]:
    """Concatenate the split's Arrow shards (in shard order): x (uint8 rows), y, coarse."""
    import pyarrow as pa

    xs, ys, cs = [], [], []
    for shard in (s for s in manifest["shards"] if s["split"] == split):
        with pa.memory_map(str(Path(url) / shard["file"]), "r") as src:
            batch = pa.ipc.open_file(src).get_batch(0)
            names = batch.schema.names
            if "coarse" not in names:
                raise FedrayError(f"{shard['file']}: no 'coarse' column (columns: {names})")
            n = batch.num_rows
            xs.append(batch.column(names.index("x")).flatten().to_numpy().reshape(n, -1).copy())
            ys.append(batch.column(names.index("y")).to_numpy().copy())
            cs.append(batch.column(names.index("coarse")).to_numpy().copy())
    return {"x": np.concatenate(xs), "y": np.concatenate(ys), "coarse": np.concatenate(cs),
            "shards": np.array([s["rows"] for s in manifest["shards"] if s["split"] == split])}


# --------------------------------------------------------------------------------------------
# per-client statistics and the Monte Carlo references
# --------------------------------------------------------------------------------------------

STATS = {
    "distinct": "distinct coarse labels per client",
    "top": "largest coarse share per client",
    "entropy": "fine entropy within coarse, bits",
}


def coarse_counts(hist: np.ndarray) -> np.ndarray:
    """[..., 100 fine] counts -> [..., 20 coarse] counts."""
    out = np.zeros((*hist.shape[:-1], NUM_COARSE), dtype=np.int64)
    for c in range(NUM_COARSE):
        out[..., c] = hist[..., F2C == c].sum(axis=-1)
    return out


def client_stats(hist: np.ndarray) -> dict[str, np.ndarray]:
    """Per-client statistics of fine-label histograms [..., clients, 100].

    distinct: how many coarse labels the client has; top: the share of its largest coarse
    label; entropy: the empirical entropy (bits) of its fine labels within each coarse label,
    averaged over its coarse labels weighted by their counts (at most log2(5))."""
    hist = np.asarray(hist, dtype=np.float64)
    cc = coarse_counts(hist)
    total = cc.sum(axis=-1)
    safe = np.maximum(total, 1)
    ent = np.zeros(hist.shape[:-1])
    for c in range(NUM_COARSE):
        h = hist[..., F2C == c]
        n = h.sum(axis=-1, keepdims=True)
        p = np.divide(h, n, out=np.zeros_like(h), where=n > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            hc = -np.where(p > 0, p * np.log2(p), 0.0).sum(axis=-1)
        ent += n[..., 0] * hc
    return {"distinct": (cc > 0).sum(axis=-1).astype(np.float64),
            "top": cc.max(axis=-1) / safe, "entropy": ent / safe}


def dirichlet_reference(m: int, per: int, coarse_alpha: float, fine_alpha: float,
                        g: np.random.Generator) -> np.ndarray:
    """m clients of the Pachinko process with no depletion: [m, 100] fine-label counts."""
    pc = g.dirichlet(np.full(NUM_COARSE, coarse_alpha), size=m)
    pc /= pc.sum(axis=1, keepdims=True)
    cc = g.multinomial(per, pc)  # [m, 20]
    qf = g.dirichlet(np.full(FINE_PER_COARSE, fine_alpha), size=(m, NUM_COARSE))
    qf /= qf.sum(axis=-1, keepdims=True)
    fc = g.multinomial(cc, qf)  # [m, 20, 5]
    hist = np.zeros((m, NUM_CLASSES), dtype=np.int64)
    for c in range(NUM_COARSE):
        hist[:, np.flatnonzero(F2C == c)] = fc[:, c]
    return hist


def sequential_reference(label_counts: np.ndarray, clients: int, per: int, coarse_alpha: float,
                         fine_alpha: float, replicates: int,
                         g: np.random.Generator) -> np.ndarray:
    """The Pachinko process replayed one example at a time, ``replicates`` times at once.

    Each client draws p ~ Dirichlet(coarse_alpha) over the 20 coarse labels and, per coarse
    label, q ~ Dirichlet(fine_alpha) over its 5 fine labels; each of its ``per`` examples is a
    coarse label from p restricted to coarse labels with examples left (renormalised), then a
    fine label from that label's q restricted to fine labels with examples left. Written from
    the definition, sharing no code with fedray.data.partitioners. Returns [replicates, clients,
    100] fine-label counts.
    """
    nc, w = NUM_COARSE, FINE_PER_COARSE
    order = np.argsort(F2C, kind="stable")  # slot c*5+j holds coarse c's j-th fine label
    left = np.tile(np.asarray(label_counts, dtype=np.int64)[order].reshape(nc, w),
                   (replicates, 1, 1))
    hist = np.zeros((replicates, clients, nc * w), dtype=np.int32)
    r = np.arange(replicates)
    for k in range(clients):
        pc = g.dirichlet(np.full(nc, coarse_alpha), size=replicates)
        qf = g.dirichlet(np.full(w, fine_alpha), size=(replicates, nc))
        for _ in range(per):
            avail = left > 0
            wc = pc * avail.any(axis=-1)
            s = wc.sum(axis=1)
            if not (s > 0).all():  # every remaining coarse weight underflowed: uniform
                bad = ~(s > 0)
                wc[bad] = avail[bad].any(axis=-1)
                s = wc.sum(axis=1)
            u = g.random((replicates, 2))
            c = np.minimum((np.cumsum(wc, axis=1) <= (u[:, 0] * s)[:, None]).sum(axis=1), nc - 1)
            q = qf[r, c] * avail[r, c]
            f = np.minimum((np.cumsum(q, axis=1) <= (u[:, 1] * q.sum(axis=1))[:, None])
                           .sum(axis=1), w - 1)
            left[r, c, f] -= 1
            hist[r, k, c * w + f] += 1
    if (left < 0).any():
        raise AssertionError("sequential reference drew a label that had run out")
    back = np.empty(NUM_CLASSES, dtype=np.int64)
    back[order] = np.arange(NUM_CLASSES)
    return hist[:, :, back]


def first_exhaustion(hist: np.ndarray, label_counts: np.ndarray) -> int:
    """Index of the first client after which some fine label has no examples left
    (clients before it drew with every label available); len(hist) if none ran out."""
    cum = np.cumsum(hist, axis=0)
    done = (cum >= np.asarray(label_counts)[None, :]).any(axis=1)
    return int(np.argmax(done)) if done.any() else len(hist)


def exhausted_after(hist: np.ndarray, label_counts: np.ndarray) -> np.ndarray:
    """Number of exhausted fine labels after each client."""
    return (np.cumsum(hist, axis=0) >= np.asarray(label_counts)[None, :]).sum(axis=1)


# --------------------------------------------------------------------------------------------
# the checks
# --------------------------------------------------------------------------------------------


def _fmt(v: float) -> str:
    return f"{v:.3f}"


def check_structure(rep: Report, m: dict, ds, url: str, expect: dict) -> dict[str, dict]:
    """Counts, sizes, exactly-once assignment, the coarse column, the shards."""
    from fedray.data.store.verify import verify_store

    per = expect["per"]
    info = m.get("info", {})
    kt, ke = expect["train_clients"], expect["test_clients"]
    counts = {s: np.asarray(m["clients"][s]["count"]) for s in ("train", "test")}
    hists = {s: np.asarray(m["clients"][s]["label_histogram"]) for s in ("train", "test")}
    rep.check("train clients", info.get("train_clients") == kt and m["num_clients"] == kt
              and int((counts["train"] > 0).sum()) == kt,
              f"{info.get('train_clients')} (manifest num_clients {m['num_clients']})", kt)
    rep.check("test clients", info.get("test_clients") == ke
              and int((counts["test"] > 0).sum()) == ke,
              info.get("test_clients"), f"{ke} (clients 0..{ke - 1})")
    rep.check("client names", m["clients"]["names"] == [str(i) for i in range(kt)],
              f"{m['clients']['names'][:2]}..{m['clients']['names'][-1:]}", f"'0'..'{kt - 1}'")
    tr = counts["train"]
    rep.check("train examples per client", bool((tr == per).all()),
              f"min {tr.min()}, max {tr.max()}", f"{per} each")
    te = counts["test"]
    rep.check("test examples per client", bool((te[:ke] == per).all() and (te[ke:] == 0).all()),
              f"min {te[:ke].min()}, max {te[:ke].max()}; {int((te[ke:] > 0).sum())} clients "
              f">= {ke} with test data", f"{per} for clients < {ke}, 0 after")
    for s, n_per in (("train", expect["per_fine_train"]), ("test", expect["per_fine_test"])):
        col = hists[s].sum(axis=0)
        rep.check(f"{s} examples per fine label (histogram column sums)",
                  bool((col == n_per).all()) and hists[s].shape[1] == NUM_CLASSES,
                  f"min {col.min()}, max {col.max()} over {hists[s].shape[1]} labels",
                  f"{n_per} for each of {NUM_CLASSES}")
        rep.check(f"{s} histogram rows = client counts",
                  bool((hists[s].sum(axis=1) == counts[s]).all()), "equal" if
                  (hists[s].sum(axis=1) == counts[s]).all() else "differ", "equal")
    una = (info.get("unassigned_train"), info.get("unassigned_test"))
    rep.check("unassigned examples (info)", una == (0, 0), f"train {una[0]}, test {una[1]}",
              "train 0, test 0")

    try:
        verify_store(url, m)
        ok, value = True, f"{len(m['shards'])} shards match"
    except FedrayError as e:
        ok, value = False, str(e)
    rep.check("shard sizes and sha256 vs manifest", ok, value, "all match")

    shards = {s: read_split(url, m, s) for s in ("train", "test")}
    for s, source in (("train", ds.train), ("test", ds.test)):
        sh = shards[s]
        expected_coarse = F2C[sh["y"]]
        bad = int((sh["coarse"] != expected_coarse).sum())
        rep.check(f"{s} shards: coarse == FINE_TO_COARSE[fine]", bad == 0,
                  f"{bad} of {len(sh['y']):,} rows differ", "0 rows differ")
        # the shards' rows, client by client, give the manifest's histograms
        cidx = np.asarray(m["clients"][s]["shard"])
        off = np.asarray(m["clients"][s]["offset"])
        starts = np.concatenate([[0], np.cumsum(sh["shards"])])[cidx] + off
        hist = np.zeros_like(hists[s])
        for k, (a, n) in enumerate(zip(starts, counts[s], strict=True)):
            hist[k] = np.bincount(sh["y"][a:a + n], minlength=NUM_CLASSES)
        rep.check(f"{s} shards: per-client labels == manifest histograms",
                  bool((hist == hists[s]).all()), "equal" if (hist == hists[s]).all()
                  else f"{int((hist != hists[s]).any(axis=1).sum())} clients differ", "equal")
        # every source image exactly once: multisets of (image digest, fine label) are equal
        store_set = Counter(zip(row_digests(sh["x"]), sh["y"].tolist(), strict=True))
        src_set = Counter(zip(row_digests(source.x), np.asarray(source.y).tolist(), strict=True))
        missing = sum((src_set - store_set).values())
        extra = sum((store_set - src_set).values())
        rep.check(f"{s}: every source image stored exactly once (by content)",
                  missing == 0 and extra == 0,
                  f"{len(sh['y']):,} stored of {len(source.y):,}; {missing} missing, "
                  f"{extra} extra/duplicated", f"{len(source.y):,} stored; 0 missing, 0 extra")
    return shards


def _hist_of(m: dict, s: str) -> np.ndarray:
    return np.asarray(m["clients"][s]["label_histogram"])


def check_same(rep: Report, name: str, a: dict, b: dict, note: str) -> None:
    splits = ("train", "test")
    diff = {s: int((_hist_of(a, s) != _hist_of(b, s)).any(axis=1).sum()) for s in splits}
    same_counts = all(np.array_equal(a["clients"][s]["count"], b["clients"][s]["count"])
                      for s in splits)
    rep.check(name, diff == {"train": 0, "test": 0} and same_counts,
              f"{diff['train']} train / {diff['test']} test clients differ",
              "0 / 0 clients differ", note)


def check_statistics(rep: Report, hist: np.ndarray, split: str, label_counts: np.ndarray,
                     params: dict, seq: np.ndarray, dref: dict[str, np.ndarray]) -> dict:
    """The statistical rows of one split; returns the measurements."""
    k = len(hist)
    win = max(1, k // 5)  # 100 of 500 train clients
    st = client_stats(hist)
    sq = client_stats(seq)  # [R, k]
    r = seq.shape[0]
    windows = {"all": slice(0, k), f"first {win}": slice(0, win), f"last {win}": slice(k - win, k)}
    if split == "test":
        windows = {"all": slice(0, k)}
    meas: dict[str, Any] = {"clients": k, "window": win}
    for key, desc in STATS.items():
        for wname, sl in windows.items():
            v = float(st[key][sl].mean())
            reps = sq[key][:, sl].mean(axis=1)
            mu, sd = float(reps.mean()), float(reps.std(ddof=1))
            tol = SIGMAS * sd * math.sqrt(1 + 1 / r)
            rep.check(f"{split} {desc}: {wname} clients vs sequential ref.",
                      abs(v - mu) <= tol, _fmt(v), f"{_fmt(mu)} ± {_fmt(tol)}",
                      f"{r} replicates with depletion; tolerance {SIGMAS:g} sd of the "
                      f"replicates' {wname}-client mean")
            meas[f"{key} {wname}"] = {"store": v, "sequential_mean": mu, "sequential_sd": sd}
        meas[f"{key} dirichlet_reference"] = float(dref[key].mean())
    # Before any fine label runs out, clients are pure Dirichlet/multinomial draws.
    k0 = first_exhaustion(hist, label_counts)
    n = min(win, k0)
    meas["first_exhausted_after_client"] = k0
    seq_k0 = [first_exhaustion(h, label_counts) for h in seq]
    meas["sequential_first_exhausted_after_client"] = {"median": float(np.median(seq_k0)),
                                                       "min": int(min(seq_k0)),
                                                       "max": int(max(seq_k0))}
    ex = exhausted_after(hist, label_counts)
    meas["exhausted_fine_labels_after_client"] = {
        str(i): int(ex[i]) for i in sorted({k // 4 - 1, k // 2 - 1, 3 * k // 4 - 1, k - 2, k - 1})
        if i >= 0}
    for key, desc in STATS.items():
        name = f"{split} {desc}: pre-depletion clients vs Dirichlet ref."
        m_ref = len(dref[key])
        mu, sd = float(dref[key].mean()), float(dref[key].std(ddof=1))
        if n < 10:
            rep.skip(name, _fmt(mu), f"only {k0} clients were built before a fine label ran "
                     f"out (need 10); depletion dominates at this scale, the sequential "
                     f"reference rows cover it")
            continue
        v = float(st[key][:n].mean())
        tol = SIGMAS * sd * math.sqrt(1 / n + 1 / m_ref)
        rep.check(name, abs(v - mu) <= tol, f"{_fmt(v)} (first {n})", f"{_fmt(mu)} ± {_fmt(tol)}",
                  f"{m_ref:,} reference clients, no depletion; tolerance {SIGMAS:g} standard "
                  f"errors of a {n}-client mean")
    return meas


# --------------------------------------------------------------------------------------------
# figure and reports
# --------------------------------------------------------------------------------------------


def _moving_mean(v: np.ndarray, span: int) -> np.ndarray:
    """Centred moving mean over ``span`` points (fewer at the ends, no zero padding)."""
    kern = np.ones(span)
    return np.convolve(v, kern, "same") / np.convolve(np.ones(len(v)), kern, "same")


def draw_figure(path: Path, hist: np.ndarray, seq: np.ndarray, dref: np.ndarray,
                title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.gridspec import GridSpec

    k = len(hist)
    cc = coarse_counts(hist)
    major = cc.argmax(axis=1)
    share = cc.max(axis=1) / np.maximum(cc.sum(axis=1), 1)
    order = np.lexsort((np.arange(k), -share, major))  # by majority coarse label, then share
    cprop = (cc[order] / np.maximum(cc[order].sum(axis=1, keepdims=True), 1)).T
    fine_rows = np.lexsort((np.arange(NUM_CLASSES), F2C))  # fine labels grouped by coarse
    fprop = (hist[order][:, fine_rows] / np.maximum(hist[order].sum(axis=1, keepdims=True), 1)).T

    fig = plt.figure(figsize=(17, 10.5), dpi=130)
    gs = GridSpec(2, 5, figure=fig, height_ratios=[3.2, 1.25],  # column 2: a spacer
                  width_ratios=[1, 0.022, 0.1, 1, 0.022], hspace=0.28, wspace=0.05, left=0.14,
                  right=0.95, top=0.93, bottom=0.06)
    ax_c = fig.add_subplot(gs[0, 0])
    ax_f = fig.add_subplot(gs[0, 3], sharex=ax_c)
    kw = {"aspect": "auto", "interpolation": "nearest", "cmap": "magma_r", "vmin": 0.0}
    im_c = ax_c.imshow(cprop, vmax=1.0, **kw)
    ax_c.set_yticks(range(NUM_COARSE), [f"{c} {n}" for c, n in enumerate(COARSE_NAMES)],
                    fontsize=6.5)
    ax_c.set_title(f"coarse-label proportions (20 labels x {k} train clients)", fontsize=10)
    ax_c.set_xlabel("train client, sorted by majority coarse label, then its share")
    fmax = float(np.quantile(fprop[fprop > 0], 0.99)) if (fprop > 0).any() else 1.0
    im_f = ax_f.imshow(fprop, vmax=max(0.1, fmax), **kw)
    for b in range(FINE_PER_COARSE, NUM_CLASSES, FINE_PER_COARSE):
        ax_f.axhline(b - 0.5, color="0.55", lw=0.35)
    ax_f.set_yticks([c * FINE_PER_COARSE + 2 for c in range(NUM_COARSE)],
                    [str(c) for c in range(NUM_COARSE)], fontsize=6.5)
    ax_f.set_ylabel("fine labels, grouped by coarse label (5 per group)", fontsize=8)
    ax_f.set_title("fine-label proportions (100 labels, same clients in the same order)",
                   fontsize=10)
    ax_f.set_xlabel("train client, same order")
    fig.colorbar(im_c, cax=fig.add_subplot(gs[0, 1]))
    fig.colorbar(im_f, cax=fig.add_subplot(gs[0, 4]),
                 label="share of the client's examples (fine: clipped at the 99th percentile)")
    for a in (ax_c, ax_f):
        a.tick_params(axis="x", labelsize=7)

    ax_h = fig.add_subplot(gs[1, 0])
    d_store = client_stats(hist)["distinct"]
    s_seq = client_stats(seq)["distinct"]  # [R, k]
    d_ref = client_stats(dref)["distinct"]
    bins = np.arange(0.5, NUM_COARSE + 1.5)
    centers = np.arange(1, NUM_COARSE + 1)
    ax_h.bar(centers, np.histogram(d_store, bins)[0] / k, width=0.8, color="tab:blue",
             alpha=0.6, label=f"store ({k} clients, mean {d_store.mean():.2f})")
    ax_h.plot(centers, np.histogram(d_ref, bins)[0] / len(d_ref), "o-", color="k", ms=3.5,
              lw=1, label=f"Dirichlet ref., no depletion (mean {d_ref.mean():.2f})")
    ax_h.plot(centers, np.histogram(s_seq, bins)[0] / s_seq.size, "s--", color="tab:red",
              ms=3, lw=1, label=f"sequential ref., with depletion (mean {s_seq.mean():.2f})")
    ax_h.set_xlim(0.3, min(NUM_COARSE, max(d_store.max(), s_seq.max()) + 1.5))
    ax_h.set_xlabel("distinct coarse labels per train client")
    ax_h.set_ylabel("fraction of clients")
    ax_h.legend(fontsize=7.5, frameon=False)

    ax_t = fig.add_subplot(gs[1, 3])
    span = max(1, k // 20)
    x = np.arange(k)
    smooth_seq = np.stack([_moving_mean(r, span) for r in s_seq])
    lo, hi = np.quantile(smooth_seq, [0.05, 0.95], axis=0)
    ax_t.fill_between(x, lo, hi, color="tab:red", alpha=0.18, lw=0,
                      label=f"sequential ref., 5-95% of {len(s_seq)} replicates")
    ax_t.plot(x, smooth_seq.mean(axis=0), color="tab:red", lw=1, label="sequential ref., mean")
    ax_t.plot(x, _moving_mean(d_store, span), color="tab:blue", lw=1.2, label="store")
    ax_t.axhline(d_ref.mean(), color="k", lw=0.8, ls=":", label="Dirichlet ref., no depletion")
    ax_t.set_xlabel("train client index (the order the partitioner builds them)")
    ax_t.set_ylabel("distinct coarse labels")
    ax_t.set_title(f"{span}-client moving mean: once fine labels run out, the last clients "
                   f"draw from the few left", fontsize=9)
    ax_t.legend(fontsize=7, frameon=False, loc="lower left")
    fig.suptitle(title, fontsize=12)
    fig.savefig(path)
    plt.close(fig)


def write_reports(out: Path, rep: Report, command: str, meta: dict) -> None:
    lines = [f"# Fed-CIFAR100 partition invariants ({meta['data']})", "",
             "```bash", command, "```", "",
             f"{sum(r.status == 'pass' for r in rep.rows)} pass, {len(rep.failed)} fail, "
             f"{sum(r.status == 'skip' for r in rep.rows)} skipped; "
             f"{meta['seconds']:.0f} s. Figure: [labels.png](labels.png).", "",
             "| # | invariant | value | expected | status | note |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(rep.rows, 1):
        status = "**FAIL**" if r.status == "FAIL" else r.status
        cells = [str(i), r.name, r.value, r.expected, status, r.note]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    lines += ["", "## Depletion (train split)", ""]
    tm = rep.measurements.get("train", {})
    if tm:
        win = tm["window"]
        k0 = tm["first_exhausted_after_client"]
        lines.append(f"- First fine label exhausted during client {k0}"
                     f" (sequential reference: median "
                     f"{tm['sequential_first_exhausted_after_client']['median']:.0f}, range "
                     f"{tm['sequential_first_exhausted_after_client']['min']}-"
                     f"{tm['sequential_first_exhausted_after_client']['max']}).")
        ex = ", ".join(f"after client {k}: {v}" for k, v in
                       tm["exhausted_fine_labels_after_client"].items())
        lines.append(f"- Exhausted fine labels: {ex}.")
        lines += ["", f"| statistic | Dirichlet ref. (no depletion) | store first {win} | "
                  f"store last {win} | sequential ref. first {win} | sequential ref. last {win} |"
                  " store all | sequential ref. all |", "|---|---|---|---|---|---|---|---|"]
        for key, desc in STATS.items():
            f_, l_, a_ = (tm[f"{key} first {win}"], tm[f"{key} last {win}"], tm[f"{key} all"])
            lines.append(f"| {desc} | {tm[f'{key} dirichlet_reference']:.3f} | "
                         f"{f_['store']:.3f} | {l_['store']:.3f} | {f_['sequential_mean']:.3f} | "
                         f"{l_['sequential_mean']:.3f} | {a_['store']:.3f} | "
                         f"{a_['sequential_mean']:.3f} |")
        lines += ["", f"log2(5) = {math.log2(5):.4f} bits is the most a client's fine labels "
                  f"within a coarse label can have; Dirichlet(10) proportions have "
                  f"{meta['dirichlet10_entropy']:.4f} bits on average, and the empirical entropy "
                  f"of a few examples is lower still, so the references are computed the same "
                  f"way as the store's value."]
    lines += ["", "## Tolerances", "",
              f"- Sequential reference rows: the process replayed one example at a time with "
              f"depletion, {meta['replicates']} replicates; a row passes within {SIGMAS:g} "
              f"standard deviations of the replicates' window mean (times sqrt(1 + 1/R) for "
              f"the reference's own error). The store is one draw of the same process, so this "
              f"has about a 6e-5 false-alarm rate per row if the window mean is near normal.",
              f"- Dirichlet reference rows: {meta['reference_clients']:,} clients with no "
              f"depletion, compared with the store's clients that were built before any fine "
              f"label ran out (at most the first {tm.get('window', '?')}); {SIGMAS:g} standard "
              f"errors of that mean. They are skipped when fewer than 10 clients precede the "
              f"first exhaustion (small --per-fine-train).", ""]
    (out / "invariants.md").write_text("\n".join(lines))
    doc = {"command": command, **meta, "rows": [asdict(r) for r in rep.rows],
           "failed": [r.name for r in rep.failed], "measurements": rep.measurements}
    (out / "invariants.json").write_text(json.dumps(doc, indent=1) + "\n")


def print_table(rep: Report) -> None:
    w = [max(len(getattr(r, c)) for r in rep.rows) for c in ("name", "value", "expected")]
    print(f"\n{'invariant':<{w[0]}}  {'value':<{w[1]}}  {'expected':<{w[2]}}  status")
    for r in rep.rows:
        print(f"{r.name:<{w[0]}}  {r.value:<{w[1]}}  {r.expected:<{w[2]}}  {r.status}")
    print()


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def run(a: argparse.Namespace, command: str) -> int:
    from fedray.data.recipe import load_recipe
    from fedray.data.sources.cifar100 import load_cifar100

    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    out = Path(a.out)
    recipe = load_recipe(RECIPE, ["source.path=unused", "out=unused"])
    par = {k: recipe.partitioner[k] for k in ("examples_per_client", "coarse_alpha", "fine_alpha")}
    per = int(par["examples_per_client"])
    rep = Report()
    with tempfile.TemporaryDirectory(prefix="fed_cifar100_inv_") as tmp_name:
        tmp = Path(tmp_name)
        if a.generate:
            n = a.per_fine_train
            log(f"generating official-format CIFAR-100 pickles: {n} train / {n // 5} test "
                f"images per fine label (data seed {a.data_seed})")
            cifar = generate_cifar(tmp / "data", n, a.data_seed, a.data_seed)
            data_desc = f"generated official-format files, {n} train images per fine label"
        else:
            cifar = Path(a.cifar).expanduser().resolve()
            data_desc = f"CIFAR-100 from {cifar}"
        log(f"loading {cifar}")
        try:
            ds = load_cifar100(str(cifar))
        except FedrayError as e:
            raise BadInput(str(e)) from None
        lc_train = np.bincount(ds.train.y, minlength=NUM_CLASSES)
        lc_test = np.bincount(ds.test.y, minlength=NUM_CLASSES)
        n_train = a.per_fine_train if a.generate else 500
        expect = {"per": per, "per_fine_train": n_train, "per_fine_test": n_train // 5,
                  "train_clients": NUM_CLASSES * n_train // per,
                  "test_clients": NUM_CLASSES * (n_train // 5) // per}
        src_coarse_ok = all((s.coarse == F2C[s.y]).all() for s in (ds.train, ds.test))
        rep.check("source: coarse_labels follow the official mapping", src_coarse_ok,
                  "yes" if src_coarse_ok else "no", "yes")

        log(f"building the store (recipe {RECIPE.relative_to(ROOT)}, seed {a.seed})")
        try:
            url, m = build_store(cifar, tmp / "store", a.seed, log)
        except FedrayError as e:
            raise BadInput(f"building the store: {e}") from None
        log("checking structure: counts, sizes, shards, exactly-once assignment")
        check_structure(rep, m, ds, url, expect)
        del ds

        log("rebuilding with the same seed (determinism)")
        _, again = build_store(cifar, tmp / "store_again", a.seed, log)
        check_same(rep, "same seed, rebuilt: per-client histograms", m, again,
                   "train and test label histograms and counts")
        same_bytes = [s["sha256"] for s in m["shards"]] == [s["sha256"] for s in again["shards"]]
        rep.check("same seed, rebuilt: shards byte-identical", same_bytes,
                  "identical" if same_bytes else "differ", "identical")
        shutil.rmtree(tmp / "store_again", ignore_errors=True)
        if a.generate:
            log("generating the same labels with different pixels; building (labels only)")
            other = generate_cifar(tmp / "data_pixels", a.per_fine_train, a.data_seed,
                                   a.data_seed + 1_000_003)
            _, m2 = build_store(other, tmp / "store_pixels", a.seed, log)
            check_same(rep, "different pixels, same labels: per-client histograms", m, m2,
                       "the split depends on the labels only")
            same_sha = [s["sha256"] for s in m["shards"]] == [s["sha256"] for s in m2["shards"]]
            rep.check("different pixels: the stores differ (the check above is not vacuous)",
                      not same_sha, "differ" if not same_sha else "identical", "differ")
            shutil.rmtree(tmp / "store_pixels", ignore_errors=True)
        else:
            rep.skip("different pixels, same labels: per-client histograms", "0 / 0 clients "
                     "differ", "needs --generate (a second data set with the same labels)")

    log(f"Monte Carlo references: {a.reference_clients:,} Dirichlet clients; "
        f"{a.replicates} sequential replicates per split")
    g = np.random.default_rng([a.seed, 8])
    dref_hist = dirichlet_reference(a.reference_clients, per, par["coarse_alpha"],
                                    par["fine_alpha"], g)
    dref = client_stats(dref_hist)
    q = g.dirichlet(np.full(FINE_PER_COARSE, par["fine_alpha"]), size=200_000)
    dir10_entropy = float(-(q * np.log2(q)).sum(axis=1).mean())
    hist = {s: np.asarray(m["clients"][s]["label_histogram"]) for s in ("train", "test")}
    # the clients the partitioner made (info), whatever the expectation: the references
    # replay the process with the same number of clients and label counts
    for s in ("train", "test"):
        hist[s] = hist[s][:int(m["info"][f"{s}_clients"])]
    seq = {}
    for s, lc in (("train", lc_train), ("test", lc_test)):
        seq[s] = sequential_reference(lc, len(hist[s]), per, par["coarse_alpha"],
                                      par["fine_alpha"], a.replicates, g)
    log("checking statistics")
    for s, lc in (("train", lc_train), ("test", lc_test)):
        rep.measurements[s] = check_statistics(rep, hist[s], s, lc, par, seq[s], dref)

    out.mkdir(parents=True, exist_ok=True)
    log(f"drawing {out / 'labels.png'}")
    draw_figure(out / "labels.png", hist["train"], seq["train"], dref_hist,
                f"Fed-CIFAR100 (Pachinko: coarse Dirichlet {par['coarse_alpha']:g}, fine "
                f"Dirichlet {par['fine_alpha']:g}, {per} examples per client), seed {a.seed}: "
                f"{len(hist['train'])} train clients - {data_desc}")
    meta = {"data": data_desc, "seed": a.seed, "partitioner": par,
            "replicates": a.replicates, "reference_clients": a.reference_clients,
            "dirichlet10_entropy": dir10_entropy, "log2_5": math.log2(5),
            "seconds": time.perf_counter() - t0}
    write_reports(out, rep, command, meta)
    print_table(rep)
    log(f"wrote {out / 'invariants.md'}, {out / 'invariants.json'}, {out / 'labels.png'}")
    if rep.failed:
        print(f"FAILED: {len(rep.failed)} invariant(s): " + "; ".join(r.name for r in rep.failed))
        return 1
    print(f"all {sum(r.status == 'pass' for r in rep.rows)} invariants hold "
          f"({sum(r.status == 'skip' for r in rep.rows)} skipped)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks; returns the exit code (0 ok, 1 an invariant failed, 2 bad input)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        a = parse_args(args)
        return run(a, shlex.join(["python", SCRIPT, *args]))
    except BadInput as e:
        print(f"{SCRIPT}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
