"""One small data set, written in each bring-your-own format exactly as its own tools write
it: np.savez, a CSV file, parquet (pyarrow), parquet with PNG bytes (PIL), and a Hugging
Face ``save_to_disk`` directory (a Dataset and a DatasetDict).

``write_hf`` mirrors the layout that ``datasets`` 5.2.0's ``save_to_disk`` writes, checked
once against that library (a Dataset and a DatasetDict with Image, ClassLabel, string and
float32 Value columns, saved by the library, read by fedray.data.sources.hf_disk; and this
fixture's directories opened by ``datasets.load_from_disk``): ``dataset_info.json`` with
the ``features``, ``state.json`` listing ``_data_files``, ``data-00000-of-00001.arrow`` as
an Arrow IPC *stream* whose schema carries the features under the ``huggingface`` metadata
key, an Image column as a struct of ``bytes`` and ``path``, a ClassLabel as int64; a
DatasetDict is ``dataset_dict.json`` (``{"splits": [...]}``) and one such directory per
split.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

N = 60  # rows
USERS = 6


@dataclass
class Data:
    images: np.ndarray  # [N, 1, 6, 5] uint8
    features: np.ndarray  # [N, 3] float32
    y: np.ndarray  # [N] int64, labels 0..3
    users: np.ndarray  # [N] str ("u0".."u5")
    split: np.ndarray  # [N] "train" / "test" (every fifth row is a test row)
    text: list[str]


def data(seed: int = 0) -> Data:
    g = np.random.default_rng(seed)
    y = g.integers(0, 4, N)
    y[:4] = [0, 1, 2, 3]
    words = ["the cat", "a dog ran", "Hello, World!", "x" * 90, "", "ünïcode"]
    return Data(images=g.integers(0, 256, size=(N, 1, 6, 5), dtype=np.uint8),
                features=g.normal(size=(N, 3)).astype(np.float32), y=y.astype(np.int64),
                users=np.array([f"u{(i * 7) % USERS}" for i in range(N)]),
                split=np.where(np.arange(N) % 5 == 4, "test", "train"),
                text=[words[i % len(words)] for i in range(N)])


def png(pixels: np.ndarray) -> bytes:
    """[1, H, W] (grey) or [3, H, W] (RGB) uint8 as PNG bytes."""
    from PIL import Image

    a = pixels[0] if pixels.shape[0] == 1 else pixels.transpose(1, 2, 0)
    buf = io.BytesIO()
    Image.fromarray(a, "L" if pixels.shape[0] == 1 else "RGB").save(buf, "PNG")
    return buf.getvalue()


def table(d: Data, *, image: bool = False) -> pa.Table:
    cols = {f"f{j}": pa.array(d.features[:, j]) for j in range(d.features.shape[1])}
    if image:
        cols = {"image": pa.array([png(a) for a in d.images], pa.binary())}
    return pa.table({**cols, "label": d.y, "user": d.users, "split": d.split})


def write_npz(path: Path, d: Data, **arrays) -> Path:
    np.savez(path, x=d.features, y=d.y, user=d.users, split=d.split, **arrays)
    return path


def write_csv(path: Path, d: Data) -> Path:
    """A CSV as a spreadsheet or pandas writes one: a header, then one line per row; the
    float32 features with the 9 significant digits that round-trip them."""
    lines = ["f0,f1,f2,label,user,split"]
    for i in range(N):
        feats = ",".join(format(float(v), ".9g") for v in d.features[i])
        lines.append(f"{feats},{d.y[i]},{d.users[i]},{d.split[i]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def write_parquet(path: Path, d: Data, *, image: bool = False) -> Path:
    pq.write_table(table(d, image=image), path)
    return path


HF_FEATURES = {
    "image": {"_type": "Image"},
    "label": {"names": ["zero", "one", "two", "three", "four"], "_type": "ClassLabel"},
    "text": {"dtype": "string", "_type": "Value"},
    "f0": {"dtype": "float32", "_type": "Value"},
    "vec": {"feature": {"dtype": "float32", "_type": "Value"}, "_type": "List"},
    "user": {"dtype": "string", "_type": "Value"},
}


def hf_table(d: Data, rows: np.ndarray) -> pa.Table:
    image = pa.StructArray.from_arrays(
        [pa.array([png(d.images[i]) for i in rows], pa.binary()),
         pa.array([None] * len(rows), pa.string())], names=["bytes", "path"])
    return pa.table({"image": image, "label": pa.array(d.y[rows], pa.int64()),
                     "text": pa.array([d.text[i] for i in rows], pa.string()),
                     "f0": pa.array(d.features[rows, 0], pa.float32()),
                     "vec": pa.array([list(v) for v in d.features[rows, 1:]],
                                     pa.list_(pa.float32())),
                     "user": pa.array(d.users[rows], pa.string())})


def write_hf(directory: Path, t: pa.Table, features: dict = HF_FEATURES) -> Path:
    """One saved Dataset: the files save_to_disk writes (module docstring)."""
    directory.mkdir(parents=True)
    meta = json.dumps({"info": {"features": features}})
    schema = t.schema.with_metadata({"huggingface": meta})
    with pa.OSFile(str(directory / "data-00000-of-00001.arrow"), "wb") as sink, \
            pa.ipc.new_stream(sink, schema) as writer:
        writer.write_table(t.cast(schema))
    info = {"citation": "", "description": "", "features": features, "homepage": "",
            "license": ""}
    (directory / "dataset_info.json").write_text(json.dumps(info, indent=2))
    state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}],
             "_fingerprint": "0123456789abcdef", "_format_columns": None, "_format_kwargs": {},
             "_format_type": None, "_output_all_columns": False, "_split": None}
    (directory / "state.json").write_text(json.dumps(state, indent=2))
    return directory


def write_hf_dict(directory: Path, d: Data) -> Path:
    """A DatasetDict: the train rows and the test rows of ``d`` as two splits."""
    directory.mkdir(parents=True)
    (directory / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    for name in ("train", "test"):
        write_hf(directory / name, hf_table(d, np.flatnonzero(d.split == name)))
    return directory
