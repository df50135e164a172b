"""What the bring-your-own-data sources share: the keys that name their columns, the checks
that turn one column into labels, features, images, tokens, user ids or split flags, and the
assembly of those arrays into a Dataset.

Why one place: ``numpy``, ``table`` and ``hf_disk`` (and the Python calls ``from_arrays``,
``from_table`` and ``from_hf_disk`` that they are) must refuse the same bad input with the
same one line, naming the file, the column and the row, and must turn the same values into
the same arrays, so that a store built from a CSV file and one built from the same data as
NumPy arrays are the same store, shard for shard.

A column arrives as a NumPy array (an .npz array, a ``from_arrays`` argument) or a pyarrow
array (a CSV, parquet or Arrow column); ``_numpy`` turns either into values and a null mask.
Rows are numbered from 0 within the file or split they come from.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from fedray.data.dataset import Dataset
from fedray.data.examples import MAX_CLASSES, Split, first_nonfinite
from fedray.data.sources.shakespeare import PAD, char_ids
from fedray.data.sources.spec import SourceSpec
from fedray.errors import FedrayError, key_error, one_line

# source.<key>s that each bring-your-own source reads (recipe.SourceSpec documents them)
SOURCE_KEYS: dict[str, tuple[str, ...]] = {
    "numpy": ("x", "label", "user", "split", "num_classes", "channels_last", "scale"),
    "table": ("label", "features", "image", "text", "text_length", "user", "split",
              "num_classes"),
    "hf_disk": ("label", "features", "image", "text", "text_length", "user", "split",
                "num_classes", "train_split", "test_split"),
}
COLUMN_KEYS = ("x", "label", "image", "text", "user", "split")  # each names one column
DEFAULT_LABEL = {"numpy": "y", "table": "label", "hf_disk": "label"}  # source.label: null
SPLIT_VALUES = {"train": False, "test": True, 0: False, 1: True}


def _bad(key: str, problem: str, *value: Any) -> FedrayError:
    return key_error(f"source.{key}", problem, *value, what="recipe")


def check_keys(source: str, keys: Mapping[str, Any]) -> None:
    """Everything about a bring-your-own source's keys that can be checked without its data:
    the recipe checks them before reading anything, ``from_*`` before opening the file."""
    named: dict[str, str] = {}  # column -> the key that names it
    for key in COLUMN_KEYS:
        name = keys.get(key)
        if key == "label" and name is None:
            name = DEFAULT_LABEL[source]
        if name is None:
            continue
        if not isinstance(name, str) or not name:
            raise _bad(key, "must be a column name", name)
        if name in named:
            raise _bad(key, f"column {name!r} is already source.{named[name]}", name)
        named[name] = key
    features = keys.get("features")
    if features is not None:
        if isinstance(features, str) or not isinstance(features, Sequence) or not features \
                or not all(isinstance(f, str) and f for f in features):
            raise _bad("features", "must be a non-empty list of column names", features)
        for f in features:
            if f in named:
                raise _bad("features", f"column {f!r} is already source.{named[f]}", list(features))
            named[f] = "features"
    chosen = [k for k in ("features", "image", "text") if keys.get(k) is not None]
    if len(chosen) > 1:
        raise _bad(chosen[1], f"the inputs are either source.features, source.image or "
                   f"source.text; source.{chosen[0]} is set too", keys[chosen[1]])
    if source == "table" and not chosen:
        raise _bad("features", "name the input columns: source.features (numeric columns), "
                   "source.image (encoded images) or source.text")
    length = keys.get("text_length", 80)
    if not _is_int(length) or length < 1:
        raise _bad("text_length", "must be a whole number >= 1", length)
    k = keys.get("num_classes")
    if k is not None and (not _is_int(k) or k < 1):
        raise _bad("num_classes", "must be a whole number >= 1 (or null: max label + 1)", k)
    if k is not None and k > MAX_CLASSES:
        raise _bad("num_classes", f"must be at most {MAX_CLASSES:,} (the most classes fedray "
                   f"takes)", k)
    scale = keys.get("scale")
    if scale is not None and (isinstance(scale, (bool, np.bool_)) or not isinstance(
            scale, (int, float, np.integer, np.floating)) or not math.isfinite(scale)
                              or scale <= 0):
        raise _bad("scale", "must be a number > 0 (or null: 1/255 for uint8 x, else 1)", scale)
    train, test = keys.get("train_split", "train"), keys.get("test_split", "test")
    if not isinstance(train, str) or not train:
        raise _bad("train_split", "must be a split name", train)
    if test is not None and (not isinstance(test, str) or not test or test == train):
        raise _bad("test_split", "must be a split name other than source.train_split (or "
                   "null: no test split)", test)


def source_doc(name: str, path: str | None, **keys: Any) -> dict:
    """The recipe ``source`` section that describes data read by a ``from_*`` call
    (recipe.SourceSpec's defaults, then ``keys``), recorded in the store it ends in."""
    return {**asdict(SourceSpec()), "name": name, "path": path,
            **{k: list(v) if isinstance(v, (list, tuple)) else v for k, v in keys.items()}}


@dataclass(frozen=True)
class Column:
    """One column (or .npz array, or from_arrays argument) of one file, for error lines."""

    where: str  # the file or directory (or "from_arrays")
    name: str  # the column's name
    kind: str = "column"  # what the source calls it: column, array, argument

    def error(self, problem: str, row: int | None = None) -> FedrayError:
        at = "" if row is None else f", row {row}"
        return FedrayError(f"{self.where}: {self.kind} {self.name!r}{at}: {problem}")


def missing_column(where: str, name: str, key: str, has: Sequence[str],
                   kind: str = "column") -> FedrayError:
    return FedrayError(f"{where}: no {kind} {name!r} (source.{key}); it has: "
                       f"{', '.join(map(str, has)) or 'none'}")


def _numpy(col: Column, values: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """(values, null mask or None) of a pyarrow or NumPy column. A pyarrow list column of
    numbers becomes a 2-d array when every row has the same length (ragged: an error)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if not isinstance(values, pa.Array):
        arr = values if isinstance(values, np.ndarray) else _array(values)
        if arr.ndim == 0:
            raise col.error(f"must hold one value per row, got the single value {_short(arr)}")
        if arr.dtype == object and arr.ndim == 1:
            null = np.fromiter((v is None for v in arr), bool, count=len(arr))
            return arr, null if null.any() else None
        return arr, None
    null = values.is_null().to_numpy(zero_copy_only=False) if values.null_count else None
    if pa.types.is_list(values.type) or pa.types.is_large_list(values.type) \
            or pa.types.is_fixed_size_list(values.type):
        inner = values.type.value_type
        if pa.types.is_integer(inner) or pa.types.is_floating(inner) \
                or pa.types.is_boolean(inner):
            return _list_numbers(col, values, null), None
    return values.to_numpy(zero_copy_only=False), null


def _array(values: Any) -> np.ndarray:
    """A NumPy array of a sequence; rows of different lengths stay a 1-d object array (for
    ``numbers`` to name the first ragged row) instead of NumPy's inhomogeneous-shape error."""
    try:
        return np.asarray(values)
    except ValueError:
        rows = list(values)
        arr = np.empty(len(rows), dtype=object)
        arr[:] = rows
        return arr


def _list_numbers(col: Column, values: pa.Array, null: np.ndarray | None) -> np.ndarray:
    if null is not None:
        raise col.error("missing value (null)", int(np.flatnonzero(null)[0]))
    import pyarrow.compute as pc

    lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
    if len(lengths) and (lengths != lengths[0]).any():
        r = int(np.flatnonzero(lengths != lengths[0])[0])
        raise col.error(f"has {lengths[r]} values but row 0 has {lengths[0]}: every row needs "
                        f"the same number (ragged features)", r)
    flat = pc.list_flatten(values)
    if flat.null_count:
        pos = int(np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0])
        raise col.error("missing value (null) in the list", pos // max(1, int(lengths[0])))
    width = int(lengths[0]) if len(lengths) else 0
    return flat.to_numpy(zero_copy_only=False).reshape(len(values), width)


def _first_null(col: Column, null: np.ndarray | None, what: str = "missing value") -> None:
    if null is not None and null.any():
        raise col.error(f"{what} (null)", int(np.flatnonzero(null)[0]))


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def labels(col: Column, values: Any) -> np.ndarray:
    """One integer class label >= 0 per row, as int64. Whole floats (3.0, as a column with
    missing values once was) are integers; 2.5, strings, booleans and nulls are not."""
    v, null = _numpy(col, values)
    _first_null(col, null, "missing label")
    if v.ndim != 1:
        raise col.error(f"must hold one label per row, got shape {v.shape[1:]} per row")
    if v.dtype.kind in "iu":
        _no_huge_label(col, v)
        out = v.astype(np.int64)
    elif v.dtype.kind == "f":
        nan = np.flatnonzero(np.isnan(v))
        if len(nan):
            raise col.error("missing label (NaN)", int(nan[0]))
        frac = np.flatnonzero(~np.isfinite(v) | (v != np.round(v)))
        if len(frac):
            raise col.error(f"{v[frac[0]].item()!r} is not an integer label", int(frac[0]))
        _no_huge_label(col, v)
        out = v.astype(np.int64)
    else:
        out = np.zeros(len(v), dtype=np.int64)
        for r, x in enumerate(v):
            value = _parsed(x, int) if isinstance(x, (str, np.str_)) else x
            whole = isinstance(value, (float, np.floating)) and math.isfinite(value) \
                and value == round(value)
            if not (_is_int(value) or whole):
                raise col.error(f"{_short(x)} is not an integer label", r)
            if value > MAX_CLASSES - 1:
                raise col.error(_huge_label(value), r)
            out[r] = int(value)
    neg = np.flatnonzero(out < 0)
    if len(neg):
        raise col.error(f"label {out[neg[0]]} is negative (labels are 0, 1, ...)", int(neg[0]))
    return out


def _huge_label(value: Any) -> str:
    v = value.item() if isinstance(value, np.generic) else value
    text = str(int(v)) if isinstance(v, float) and v.is_integer() and abs(v) < 1e15 else \
        f"{v:g}" if isinstance(v, float) else _short(v)
    return (f"label {text} is beyond the largest class fedray takes "
            f"({MAX_CLASSES - 1:,}: at most {MAX_CLASSES:,} classes)")


def _no_huge_label(col: Column, v: np.ndarray) -> None:
    """Refuse a label past MAX_CLASSES before it is cast to int64 (where 1e30 or a uint64
    past 2**63 would wrap to a negative number and be reported as one)."""
    over = np.flatnonzero(v > MAX_CLASSES - 1)
    if len(over):
        raise col.error(_huge_label(v[over[0]]), int(over[0]))


def numbers(col: Column, values: Any) -> np.ndarray:
    """The column's rows as one numeric array [n, ...] (its own dtype): a number per row, or
    a list or array of numbers per row, all of the same shape. Nulls, NaN or infinite
    values, text and ragged rows are errors naming the row (``finite_inputs`` checks them
    again as model inputs, once cast to float32 and scaled)."""
    v, null = _numpy(col, values)
    _first_null(col, null)
    if v.dtype == object or v.dtype.kind in "US":
        v = _stack_rows(col, v)
    if v.dtype.kind not in "iufb":
        raise col.error(f"holds {v.dtype}, not numbers")
    if v.dtype.kind == "f" and len(v):
        bad = ~np.isfinite(v.reshape(len(v), -1)).all(axis=1)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            which = "missing value (NaN)" if np.isnan(v[r]).any() else "infinite value"
            raise col.error(which, r)
    return v


def _parsed(text: str, kind: type) -> Any:
    """A number written as text (a CSV column with one stray word is read as text: its
    other cells still hold numbers), or the text itself when it is none."""
    try:
        return kind(text)
    except ValueError:
        return text


def _stack_rows(col: Column, v: np.ndarray) -> np.ndarray:
    rows, shape = [], None
    for r, row in enumerate(v):
        if isinstance(row, (str, np.str_)):
            row = _parsed(row, float)
        if isinstance(row, (str, bytes, np.str_, np.bytes_)):
            raise col.error(f"{_short(row)} is not a number", r)
        a = np.asarray(row)
        if a.dtype.kind not in "iufb":
            raise col.error(f"{_short(row)} is not a number (or a list of numbers)", r)
        if shape is None:
            shape = a.shape
        elif a.shape != shape:
            raise col.error(f"has shape {a.shape} but row 0 has {shape}: every row needs the "
                            f"same number of values (ragged features)", r)
        rows.append(a)
    return np.stack(rows) if rows else np.zeros((0,), np.float32)


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value.item() if isinstance(value, np.generic) else value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# PIL modes kept as one grey channel; every other 8-bit mode becomes RGB
_GREY_MODES = ("1", "L", "LA")
_DEEP_MODES = ("I", "F", "I;16", "I;16B", "I;16L", "I;16N")


def images(col: Column, values: Any) -> np.ndarray:
    """Encoded images (PNG, JPEG, ... bytes; or Hugging Face's {bytes, path} structs) decoded
    with PIL into uint8 [n, C, H, W]: C = 1 when every image is grey, else 3 (RGB; a grey
    image's plane repeated, alpha dropped, palettes expanded). Every image must have the
    same size; 16-bit and float images are refused rather than silently cut to 8 bits."""
    from PIL import Image

    v, null = _numpy(col, values)
    _first_null(col, null, "missing image")
    decoded, size = [], None
    for r, item in enumerate(v):
        data = item.get("bytes") if isinstance(item, dict) else item
        if data is None:
            path = item.get("path") if isinstance(item, dict) else None
            only = f", only the path {path!r}" if path else ""
            raise col.error(f"missing image (no bytes{only})", r)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise col.error(f"is not encoded image bytes (got {type(data).__name__})", r)
        try:
            with Image.open(io.BytesIO(bytes(data))) as im:
                im.load()
                if im.mode in _DEEP_MODES:
                    raise col.error(f"image mode {im.mode!r} is not 8-bit; only 8-bit images "
                                    f"are read", r)
                im = im.convert("L" if im.mode in _GREY_MODES else "RGB")
        except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
            raise col.error(f"cannot decode the image ({one_line(exc)})", r) from None
        if size is None:
            size = im.size
        elif im.size != size:
            raise col.error(f"image is {im.size[1]}x{im.size[0]} (height x width) but row "
                            f"0's is {size[1]}x{size[0]}: every image needs the same size", r)
        decoded.append(np.asarray(im, dtype=np.uint8))
    if not decoded:
        return np.zeros((0, 1, 1, 1), np.uint8)
    color = any(a.ndim == 3 for a in decoded)
    planes = [np.repeat(a[None], 3, axis=0) if color and a.ndim == 2 else
              (a.transpose(2, 0, 1) if a.ndim == 3 else a[None]) for a in decoded]
    return np.ascontiguousarray(np.stack(planes))


def tokens(col: Column, values: Any, length: int) -> np.ndarray:
    """Text as ``length`` character ids per row, uint8 [n, length]: fedray's Shakespeare
    vocabulary (fedray.data.sources.shakespeare: TFF's 86 characters as ids 1..86, any other
    character 87), cut after ``length`` characters or padded with 0."""
    v, null = _numpy(col, values)
    _first_null(col, null, "missing text")
    out = np.full((len(v), length), PAD, dtype=np.uint8)
    for r, text in enumerate(v):
        if not isinstance(text, (str, np.str_)):
            raise col.error(f"{_short(text)} is not text", r)
        ids = char_ids(str(text)[:length])
        out[r, :len(ids)] = ids
    return out


def user_ids(col: Column, values: Any) -> np.ndarray:
    """One user id per row, as text (integer ids as their decimal digits)."""
    v, null = _numpy(col, values)
    _first_null(col, null, "missing user id")
    if v.dtype.kind in "iu":
        return v.astype(str)
    if v.dtype.kind == "U":
        return v
    for r, u in enumerate(v):
        if not (_is_int(u) or isinstance(u, (str, np.str_))):
            raise col.error(f"{_short(u)} is not a user id (an integer or a string)", r)
    return np.array([str(u) for u in v], dtype=str) if len(v) else np.zeros(0, dtype=str)


def split_flags(col: Column, values: Any) -> np.ndarray:
    """Per row, whether it is a test row: "train"/"test", or 0 (train) / 1 (test)."""
    v, null = _numpy(col, values)
    _first_null(col, null, "missing split")
    out = np.zeros(len(v), dtype=bool)
    for r, s in enumerate(v.tolist()):
        try:
            flag = None if isinstance(s, bool) else SPLIT_VALUES.get(s)
        except TypeError:  # unhashable: a list
            flag = None
        if flag is None:
            raise col.error(f"{_short(s)} is not a split (use 'train'/'test' or 0/1)", r)
        out[r] = flag
    return out


def finite_inputs(col: Column, x: np.ndarray, scale: float) -> None:
    """Refuse inputs that are not finite as model inputs (``float32(x) * scale``): a
    finite float64 such as 1e300 is inf in float32, and would make every update non-finite.
    Refused here, naming the file, the column and the row, rather than by the store writer,
    which can name only the client."""
    bad = first_nonfinite(x, scale)
    if bad is not None:
        raise col.error(f"{bad[1]}: not a finite model input", bad[0])


@dataclass
class Part:
    """The checked columns of one file, or one split of a Hugging Face DatasetDict."""

    where: str
    x: np.ndarray  # [n, ...]
    y: np.ndarray  # [n] int64
    label: Column  # the label column, for a label >= num_classes
    users: np.ndarray | None = None  # [n] str
    test: np.ndarray | bool = False  # per row, or the whole part


def inferred_classes(parts: list[Part]) -> int:
    """The number of classes when none is given: the largest label + 1, provided the labels
    use at least half of 0..largest (largest + 1 <= 2 x the number of distinct labels).

    Why a rule: a single stray label (a typo, an id pasted into the label column: 1e9)
    would otherwise make that many classes -- a model with a billion outputs, a store whose
    every reader allocates for them -- from data that has a handful. A label set that is
    really that sparse is given with ``source.num_classes``, which this rule never
    overrides."""
    distinct = np.unique(np.concatenate([p.y for p in parts]))
    top = int(distinct[-1])
    if top + 1 <= 2 * len(distinct):
        return top + 1
    p = next(p for p in parts if len(p.y) and int(p.y.max()) == top)
    row = int(np.flatnonzero(p.y == top)[0])
    below = f"the next largest is {int(distinct[-2])}" if len(distinct) > 1 else "no other"
    raise p.label.error(f"label {top:,} would make {top + 1:,} classes, but the labels take "
                        f"only {len(distinct)} distinct values ({below}); without "
                        f"source.num_classes the labels must use at least half of 0..largest: "
                        f"fix the label, or give source.num_classes", row)


def assemble(name: str, parts: list[Part], *, scale: float, num_classes: int | None,
             source: dict) -> Dataset:
    """One Dataset from the parts: their train rows, then their test rows (a split column
    or a test split), with owners = every user id of either split, sorted as text (one
    ``natural`` client per user, with that user's test rows: as LEAF's writers)."""
    first = parts[0]
    for p in parts[1:]:
        if p.x.shape[1:] != first.x.shape[1:]:
            raise FedrayError(f"{p.where}: examples of shape {p.x.shape[1:]}, but {first.where} "
                              f"has {first.x.shape[1:]}")
    if sum(len(p.y) for p in parts) == 0:
        raise FedrayError(f"{first.where}: no rows")
    if all(np.all(p.test) for p in parts):
        raise FedrayError(f"{first.where}: no train rows (every row is a test row)")
    if num_classes is None:
        num_classes = inferred_classes(parts)
    elif num_classes > MAX_CLASSES:  # a ClassLabel's num_classes (the keys are checked)
        raise FedrayError(f"{first.where}: {num_classes:,} classes; fedray takes at most "
                          f"{MAX_CLASSES:,}")
    for p in parts:
        over = np.flatnonzero(p.y >= num_classes)
        if len(over):
            raise p.label.error(f"label {p.y[over[0]]} is outside 0..{num_classes - 1} "
                                f"(source.num_classes: {num_classes})", int(over[0]))
    has_users = first.users is not None
    owners, owner = None, [None] * len(parts)
    if has_users:
        every = np.concatenate([p.users for p in parts])
        uniq, inverse = np.unique(every, return_inverse=True)
        owners = [str(u) for u in uniq]
        bounds = np.cumsum([0] + [len(p.y) for p in parts])
        owner = [inverse[a:b].astype(np.int64) for a, b in zip(bounds[:-1], bounds[1:],
                                                                strict=True)]
    splits = []
    for want_test in (False, True):
        xs, ys, os_ = [], [], []
        for p, o in zip(parts, owner, strict=True):
            rows = np.flatnonzero(np.broadcast_to(np.asarray(p.test) == want_test, len(p.y)))
            xs.append(p.x[rows])
            ys.append(p.y[rows])
            os_.append(None if o is None else o[rows])
        n = sum(len(y) for y in ys)
        if want_test and n == 0:
            splits.append(None)
            continue
        splits.append(Split(np.concatenate(xs), np.concatenate(ys),
                            owner=np.concatenate(os_) if has_users else None))
    return Dataset(name=name, train=splits[0], test=splits[1], num_classes=num_classes,
                   owners=owners, scale=scale, source=source)
