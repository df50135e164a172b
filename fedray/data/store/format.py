"""The partition store's format: its file names, its splits, the manifest and the columns of
its shards, and the checks of a manifest read from disk (``read_manifest``,
``check_manifest``). The package docstring (fedray.data.store) describes the layout.
"""

from __future__ import annotations

import json
import math
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from fedray.data.examples import MAX_CLASSES
from fedray.errors import FedrayError, key_error
from fedray.state.storage import filesystem

MANIFEST = "manifest.json"
FORMAT = "fedray-partition-store"
FORMAT_VERSION = 2
READS_VERSIONS = (1, 2)
SPLITS = ("train", "test", "central_test")


def join_path(path: str, name: str) -> str:
    return posixpath.join(path.rstrip("/"), name)


def columns_schema(dtype: np.dtype, row_size: int, coarse: bool, label_size: int | None = None
            ) -> pa.Schema:
    """x: a fixed-size list per example; y: one int64 label, or a fixed-size list of
    ``label_size`` int64 labels per example (sequence targets: next-character prediction)."""
    y_type = pa.int64() if label_size is None else pa.list_(pa.int64(), label_size)
    fields = [pa.field("x", pa.list_(pa.from_numpy_dtype(dtype), row_size)),
              pa.field("y", y_type)]
    if coarse:
        fields.append(pa.field("coarse", pa.int64()))
    return pa.schema(fields)


def read_manifest(url: str) -> dict:
    """The store's manifest, checked for what is cheap to check: the store-wide facts and
    where the client index is. Its clients are checked against the shards when the store is
    built and by ``verify_store``; a worker checks each client it reads."""
    fs, path = filesystem(url, "data.partition")
    mpath = join_path(path, MANIFEST)
    if not fs.exists(mpath):
        raise key_error("data.partition", f"no partition store at {url} ({MANIFEST} missing)")
    try:
        with fs.open(mpath, "r") as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FedrayError(f"{url}/{MANIFEST} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FedrayError(f"{url}/{MANIFEST} is not a fedray partition store manifest")
    version = manifest.get("format_version")
    if type(version) is not int or version not in READS_VERSIONS:  # not true, not 1.0
        raise FedrayError(f"{url}: store format version {manifest.get('format_version')} is not "
                          f"supported (this fedray reads versions "
                          f"{' and '.join(map(str, READS_VERSIONS))})")
    check_manifest(url, manifest)
    return manifest


# --- the manifest's schema ---------------------------------------------------------------
# One table per object of manifest.json: every field a reader relies on, what a good value
# is, and whether it may be absent. ``check_manifest`` checks a manifest against them when a
# store is opened (a few dozen values, whatever the population); what needs the shards
# (their Arrow schema, rows, labels, finite inputs) is checked as a shard is opened and by
# ``verify_store``. A store is read on workers anywhere, so a manifest is as untrusted as
# any input: a shard path must not leave the store's directory, and no number may make a
# reader allocate without bound.

# the numeric dtypes a store's inputs may have (what numpy and Arrow share, byte order native)
STORE_DTYPES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
                "float16", "float32", "float64")
_MAX_DIMS = 8
_FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}")  # no '/', '\\', ':', '..'
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Field:
    """One manifest field: ``ok(value)`` says whether a value is good, ``need`` what one
    is (for the message), ``required`` whether the field must be present."""

    ok: Callable[[Any], bool]
    need: str
    required: bool = True


def _whole(lo: int, hi: int | None = None) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo \
        and (hi is None or v <= hi)


def _dims(lo_len: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and lo_len <= len(v) <= _MAX_DIMS \
        and all(_whole(1, 2**31)(d) for d in v) and math.prod(v) <= 2**31


def _file_name(v: Any) -> bool:
    """A file directly in the store's directory: not a path (``../x``, ``/etc/x``,
    ``sub/x``), not a URL (``s3://...``, ``file:...``), not hidden."""
    return isinstance(v, str) and _FILE_NAME.fullmatch(v) is not None


def _object_or_null(v: Any) -> bool:
    return v is None or isinstance(v, dict)


_FILE = Field(_file_name, "a file name in the store's directory (letters, digits, '_', '-', "
                          "'.'; no '/', '..' or ':')")
_BYTES = Field(_whole(0), "a whole number >= 0")
_HASH = Field(lambda v: isinstance(v, str) and _SHA256.fullmatch(v) is not None,
              "64 lowercase hex digits")

MANIFEST_SCHEMA: dict[str, Field] = {
    "num_clients": Field(_whole(1), "a whole number >= 1"),
    "num_classes": Field(_whole(1, MAX_CLASSES), f"a whole number from 1 to {MAX_CLASSES:,}"),
    "num_coarse": Field(lambda v: v is None or _whole(1, MAX_CLASSES)(v),
                        f"null or a whole number from 1 to {MAX_CLASSES:,}", required=False),
    "input_shape": Field(_dims(1), f"a list of 1 to {_MAX_DIMS} whole numbers >= 1 (at most "
                                   f"2**31 values per example)"),
    "label_shape": Field(_dims(0), f"a list of up to {_MAX_DIMS} whole numbers >= 1",
                         required=False),
    "dtype": Field(lambda v: v in STORE_DTYPES, f"one of {', '.join(STORE_DTYPES)}"),
    "scale": Field(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v) and v > 0, "a finite number > 0 (model input = x * "
                   "scale)"),
    "shards": Field(lambda v: isinstance(v, list), "a list of shards"),
    "central_test": Field(lambda v: v is None or (isinstance(v, dict)
                                                  and _whole(0)(v.get("rows"))),
                          'null or {"rows": a whole number >= 0}', required=False),
    "source": Field(_object_or_null, "an object", required=False),
    "partitioner": Field(_object_or_null, "an object", required=False),
    "info": Field(_object_or_null, "an object", required=False),
}
SHARD_SCHEMA: dict[str, Field] = {
    "file": _FILE,
    "split": Field(lambda v: v in SPLITS, f"one of {', '.join(SPLITS)}"),
    "rows": Field(_whole(0), "a whole number >= 0"),
    "bytes": _BYTES,
    "sha256": _HASH,
}
INDEX_SCHEMA: dict[str, Field] = {  # format 2: manifest["client_index"]
    "file": _FILE,
    "bytes": _BYTES,
    "sha256": _HASH,
    "splits": Field(lambda v: v in (["train"], ["train", "test"]),
                    "['train'] or ['train', 'test']"),
}
V1_CLIENTS_SCHEMA: dict[str, Field] = {  # format 1: manifest["clients"] (the lists: from_v1)
    "names": Field(lambda v: isinstance(v, list), "a list of client names"),
    "train": Field(lambda v: isinstance(v, dict), "an object of per-client lists"),
}


def short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_fields(where: str, prefix: str, obj: Any, schema: dict[str, Field]) -> None:
    if not isinstance(obj, dict):
        raise FedrayError(f"{where}: {prefix.rstrip('.') or 'the manifest'} must be an object, "
                          f"got {short_repr(obj)}")
    for key, field in schema.items():
        if key not in obj:
            if field.required:
                raise FedrayError(f"{where}: {prefix}{key} is missing (it must be "
                                  f"{field.need})")
            continue
        if not field.ok(obj[key]):
            raise FedrayError(f"{where}: {prefix}{key} must be {field.need}, got "
                              f"{short_repr(obj[key])}")


def check_manifest(url: str, m: dict) -> None:
    """The manifest against its schema (MANIFEST_SCHEMA, SHARD_SCHEMA for every shard,
    INDEX_SCHEMA or, in format 1, V1_CLIENTS_SCHEMA), then what ties its fields together:
    every file named once. One line names the file and the field."""
    where = f"{url.rstrip('/')}/{MANIFEST}"
    _check_fields(where, "", m, MANIFEST_SCHEMA)
    for i, shard in enumerate(m["shards"]):
        _check_fields(where, f"shards[{i}].", shard, SHARD_SCHEMA)
    if m["format_version"] == 1:
        _check_fields(where, "clients.", m.get("clients"), V1_CLIENTS_SCHEMA)
        if len(m["clients"]["names"]) != m["num_clients"]:
            raise FedrayError(f"{where}: clients.names must list {m['num_clients']} names "
                              f"(num_clients), got {len(m['clients']['names'])}")
        files = []
    else:
        _check_fields(where, "client_index.", m.get("client_index"), INDEX_SCHEMA)
        files = [("client_index.file", m["client_index"]["file"])]
    files += [(f"shards[{i}].file", sh["file"]) for i, sh in enumerate(m["shards"])]
    seen = {MANIFEST}
    for key, name in files:
        if name in seen:
            raise FedrayError(f"{where}: {key} {name!r} is named twice (every file of a "
                              f"store is named once)")
        seen.add(name)


def shard_schema(m: dict) -> pa.Schema:
    """The Arrow schema the manifest's shards must have (the writer's ``columns_schema``): x a
    fixed-size list of ``dtype`` per example, y int64 labels (or a fixed-size list of them),
    and a coarse int64 label where the store has coarse labels."""
    label_shape = m.get("label_shape") or []
    return columns_schema(np.dtype(m["dtype"]), math.prod(m["input_shape"]),
                   m.get("num_coarse") is not None,
                   math.prod(label_shape) if label_shape else None)
