"""``fedray partition --describe``: what a partition store holds, as text and as a picture.

How heterogeneous a federation is decides most FL results, and it is easier to see than to
read: the PNG shows every client's label mix (clients sorted by their majority label) and
the distribution of client sizes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedray.data.store.client_index import ClientIndex
from fedray.data.store.format import read_manifest
from fedray.data.store.reader import client_index
from fedray.data.store.verify import verify_store
from fedray.tracking.figures import figure_format, plain_text, write_figure


def _entropy_bits(hist: np.ndarray) -> np.ndarray:
    p = hist / np.maximum(1, hist.sum(axis=-1, keepdims=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log2(p), 0.0)
    return terms.sum(axis=-1)


def _client_entropy_bits(index: ClientIndex, split: str) -> np.ndarray:
    """Every client's label entropy, from the sparse histograms (never N x classes)."""
    _, _, counts = index.sparse(split)
    owner = index.entry_owners(split)
    total = np.bincount(owner, weights=counts, minlength=index.num_clients)
    p = counts / np.maximum(1.0, total[owner])
    return np.bincount(owner, weights=-p * np.log2(p), minlength=index.num_clients)


def _stats(counts: np.ndarray) -> str:
    return (f"{int(counts.sum()):,} examples; per client min {int(counts.min())} / median "
            f"{float(np.median(counts)):g} / max {int(counts.max())}")


def describe(url: str, plot: str | None = None, verify: bool = True) -> str:
    """A short report on the store at ``url``, after checking its manifest's structure and
    (``verify``) every shard against it; writes the label-distribution PNG to ``plot`` if
    given (never otherwise: describing a store changes nothing)."""
    if plot:  # before the store is read: an image type that cannot be written

        figure_format(plot, "--plot")
    m = read_manifest(url)
    if verify:
        verify_store(url, m)
    index = client_index(url, m)
    source = m.get("source") or {}  # the manifest's schema allows it absent
    lines = [f"store:        {url}",
             f"source:       {source.get('name')} ({source.get('path') or 'generated'})",
             f"partitioner:  {m.get('partitioner')}, seed {m.get('seed')}",
             f"clients:      {m['num_clients']:,}",
             f"classes:      {m['num_classes']}, inputs {tuple(m['input_shape'])} {m['dtype']}"]
    label_shape = tuple(m.get("label_shape") or ())
    if label_shape:  # sequence targets: the histograms count every position's label
        shape = " x ".join(str(d) for d in label_shape)
        lines.append(f"labels:       {shape} per example (a target sequence); histograms and "
                     "entropies count every position's label, padding included")
    lines.append(f"train:        {_stats(index.counts('train'))}")
    if "test" in index.splits:
        lines.append(f"test:         {_stats(index.counts('test'))} (per-client test data)")
    if m.get("central_test"):
        what = "central test:" if "test" in index.splits else "test:        "
        lines.append(f"{what} {m['central_test']['rows']:,} examples (central test set)")
    ent = _client_entropy_bits(index, "train")
    lines.append(f"label entropy: per client mean {ent.mean():.2f} bits (min {ent.min():.2f}, "
                 f"max {ent.max():.2f}); all clients together "
                 f"{float(_entropy_bits(index.class_totals('train'))):.2f} bits; uniform over "
                 f"the classes would be {np.log2(m['num_classes']):.2f} bits")
    size = sum(s["bytes"] for s in m["shards"])
    entry = m.get("client_index")
    index_file = f", client index {entry['bytes'] / 2**20:.1f} MB" if entry else ""
    lines.append(f"shards:       {len(m['shards'])} files, {size / 2**20:.1f} MB{index_file}; "
                 f"store format {m['format_version']}" + ("; checksums ok" if verify else ""))
    if m.get("info"):
        info = {k: v for k, v in m["info"].items() if not isinstance(v, (list, dict))}
        if info:
            lines.append(f"partitioner info: {info}")
    if plot:
        with plain_text():  # the manifest's source and partitioner names are text
            fig = _plot(index, m)
        write_figure(fig, plot, "--plot", dpi=110)  # whole, or one line and no file
        lines.append(f"plot:         {plot}")
    return "\n".join(lines)


def _shown_histograms(index: ClientIndex, shown: np.ndarray, dense_up_to: int = 1024
                      ) -> tuple[np.ndarray, np.ndarray | None]:
    """The shown clients' label histograms: over every class for up to ``dense_up_to``
    classes; beyond, over the labels they hold only (and those labels), so that the picture
    costs what the clients hold, not clients x num_classes (up to MAX_CLASSES)."""
    if index.num_classes <= dense_up_to:
        return index.histograms("train", shown), None
    starts, labels, counts = index.sparse("train")
    lo, hi = starts[shown], starts[shown + 1]
    entries = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)]) \
        if len(shown) else np.zeros(0, np.int64)
    present, column = np.unique(labels[entries], return_inverse=True)
    rows = np.repeat(np.arange(len(shown)), hi - lo)
    h = np.zeros((len(shown), max(1, len(present))), dtype=np.int64)
    h[rows, column] = counts[entries]
    return h, present


def _plot(index: ClientIndex, manifest: dict, max_clients: int = 400) -> Any:
    """The label-distribution figure (fedray.tracking.figures writes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = index.num_clients
    shown = np.unique(np.linspace(0, n - 1, min(n, max_clients)).astype(int))
    h, labels = _shown_histograms(index, shown)
    props = h / np.maximum(1, h.sum(axis=1, keepdims=True))
    order = np.lexsort((-props.max(axis=1), props.argmax(axis=1)))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, 4.8), width_ratios=[3, 1])
    im = ax0.imshow(props[order].T, aspect="auto", interpolation="nearest", cmap="viridis")
    ax0.set_xlabel(f"client ({len(shown)} of {n:,}, sorted by majority label)")
    ax0.set_ylabel("label" if labels is None else f"label ({len(labels):,} of "
                   f"{index.num_classes:,} present; rows in label order)")
    ax0.set_title("label proportions per client (train)")
    fig.colorbar(im, ax=ax0, fraction=0.04, pad=0.01)
    ax1.hist(index.counts("train"), bins=40, color="tab:blue")
    ax1.set_xlabel("train examples per client")
    ax1.set_ylabel("clients")
    ax1.set_title("client sizes")
    source = (manifest.get("source") or {}).get("name")
    fig.suptitle(f"{source} / {(manifest.get('partitioner') or {}).get('name')}: "
                 f"{manifest['num_clients']:,} clients")
    fig.tight_layout()
    return fig
