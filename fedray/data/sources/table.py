"""table: a data set as a table with one example per row, from a CSV file, a parquet file, a
directory of parquet files, or a pyarrow Table in memory (``from_table``; the ``table``
source of ``fedray partition``).

The recipe names every column: the inputs (numeric ``features``, an ``image`` column of
encoded images, or a ``text`` column), the ``label``, and optionally the ``user`` id and
``split`` columns. Files are read with pyarrow alone; a file is parquet when it starts with
parquet's magic bytes, CSV otherwise (so ``.csv.gz`` and unusual names work). A CSV's
user-id column is read as text, so ids such as ``007`` keep their digits, and an empty
unquoted cell is a null (a missing value), never an empty id. ``fedray.data.sources.hf_disk`` reads
each split of a Hugging Face data set into a table and builds its Dataset here too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from fedray.data.dataset import Dataset
from fedray.data.sources.columns import (
    DEFAULT_LABEL,
    Column,
    Part,
    assemble,
    check_keys,
    finite_inputs,
    images,
    labels,
    missing_column,
    numbers,
    source_doc,
    split_flags,
    tokens,
    user_ids,
)
from fedray.errors import FedrayError, one_line

PARQUET_MAGIC = b"PAR1"
PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")


def from_table(table: Any, *, label: str | None = "label", features: list[str] | None = None,
               image: str | None = None, text: str | None = None, text_length: int = 80,
               user: str | None = None, split: str | None = None,
               num_classes: int | None = None) -> Dataset:
    """A Dataset from ``table``: the path of a CSV or parquet file (or of a directory of
    parquet files), or a pyarrow Table (or what ``pyarrow.table()`` takes: a pandas
    DataFrame, a dict of columns). Exactly one of ``features`` (numeric columns, or columns
    of lists of numbers: float32 inputs), ``image`` (encoded images: uint8 [C, H, W] pixels,
    scale 1/255) and ``text`` (character ids, ``text_length`` of them) names the inputs;
    ``label`` the integer labels, ``user`` the user ids (``natural``: a client per user),
    ``split`` the train/test rows. Bad input raises a one-line FedrayError naming the file,
    the column and the row (from 0; a CSV's header is not a row)."""
    keys = {"label": DEFAULT_LABEL["table"] if label is None else label, "features": features,
            "image": image, "text": text, "text_length": text_length, "user": user,
            "split": split, "num_classes": num_classes}
    check_keys("table", keys)
    if isinstance(table, (str, os.PathLike)):
        where = os.fspath(table)
        data = read_table(where, keys)
        name, path = "table", where
    else:
        where, name, path = "from_table", "python", None
        try:
            data = table if isinstance(table, pa.Table) else pa.table(table)
        except (TypeError, ValueError, pa.ArrowException) as exc:
            raise FedrayError(f"from_table: not a table ({one_line(exc)})") from None
    part, scale = table_part(where, data, keys)
    return assemble(name, [part], scale=scale, num_classes=num_classes,
                    source=source_doc(name, path, **keys))


def columns_of(keys: dict) -> list[str]:
    """The columns the keys name, in the order the keys are listed."""
    named = [keys.get(k) for k in ("label", "image", "text", "user", "split")]
    return [c for c in [*(keys.get("features") or []), *named] if c is not None]


def _check_columns(where: str, has: list[str], keys: dict) -> None:
    for key in ("features", "image", "text", "label", "user", "split"):
        for name in (keys.get(key) or []) if key == "features" else [keys.get(key)]:
            if name is not None and name not in has:
                raise missing_column(where, name, key, has)


def table_part(where: str, data: pa.Table, keys: dict) -> tuple[Part, float]:
    """The checked columns of one table, and the scale of its inputs."""
    _check_columns(where, data.column_names, keys)
    if keys.get("image") is not None:
        x, scale = images(Column(where, keys["image"]), data[keys["image"]]), 1.0 / 255.0
    elif keys.get("text") is not None:
        x, scale = tokens(Column(where, keys["text"]), data[keys["text"]],
                          keys["text_length"]), 1.0
    else:
        cols = []
        for f in keys["features"]:
            c = numbers(Column(where, f), data[f])
            finite_inputs(Column(where, f), c, 1.0)  # float64 past float32's range: inf
            cols.append(c.reshape(len(c), int(np.prod(c.shape[1:], dtype=np.int64)))
                        .astype(np.float32))
        x = np.concatenate(cols, axis=1)
        scale = 1.0
    label = Column(where, keys["label"])
    user = None if keys.get("user") is None else \
        user_ids(Column(where, keys["user"]), data[keys["user"]])
    test = False if keys.get("split") is None else \
        split_flags(Column(where, keys["split"]), data[keys["split"]])
    return Part(where, np.ascontiguousarray(x), labels(label, data[keys["label"]]), label,
                user, test), scale


def read_table(path: str, keys: dict) -> pa.Table:
    """The columns that ``keys`` name, of the CSV or parquet file (or parquet directory) at
    ``path``; a missing column is an error listing the columns the file has."""
    if os.path.isdir(path):
        files = sorted(p for p in Path(path).rglob("*.parquet") if p.is_file())
        if not files:
            raise FedrayError(f"{path}: a directory with no parquet files (*.parquet)")
        tables = [_read_parquet(str(f), keys) for f in files]
        try:
            table = pa.concat_tables(tables)
        except pa.ArrowInvalid as exc:
            raise FedrayError(f"{path}: its parquet files have different columns or types "
                              f"({one_line(exc)})") from None
        if table.num_rows == 0:
            raise FedrayError(f"{path}: its {len(files)} parquet files hold no rows")
        return table
    try:
        with open(path, "rb") as f:
            magic = f.read(len(PARQUET_MAGIC))
    except OSError as exc:
        raise FedrayError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if magic == PARQUET_MAGIC:
        table = _read_parquet(path, keys)
        if table.num_rows == 0:
            raise FedrayError(f"{path}: an empty parquet file (no rows)")
        return table
    if path.lower().endswith(PARQUET_SUFFIXES):  # not read as CSV: its CSV error would mislead
        raise FedrayError(f"{path}: not a parquet file (it does not start with parquet's "
                          f"magic bytes PAR1{'; it is empty' if not magic else ''})")
    table = _read_csv(path, keys)
    if table.num_rows == 0:
        raise FedrayError(f"{path}: a CSV file with a header and no rows")
    return table


def _read_parquet(file: str, keys: dict) -> pa.Table:
    import pyarrow.parquet as pq

    try:
        _check_columns(file, pq.read_schema(file).names, keys)
        return pq.read_table(file, columns=columns_of(keys))
    except (pa.ArrowException, OSError) as exc:
        raise FedrayError(f"{file}: not a readable parquet file ({one_line(exc)})") from None


def _read_csv(file: str, keys: dict) -> pa.Table:
    import pyarrow.csv as pcsv

    user = keys.get("user")
    convert = pcsv.ConvertOptions(column_types={user: pa.string()} if user else {},
                                  strings_can_be_null=True, quoted_strings_can_be_null=False)
    try:
        table = pcsv.read_csv(file, convert_options=convert)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise FedrayError(f"{file}: not a readable CSV file ({one_line(exc)})") from None
    _check_columns(file, table.column_names, keys)
    return table.select(columns_of(keys))
