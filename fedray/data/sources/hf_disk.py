"""hf_disk: a Hugging Face ``datasets`` directory written by ``save_to_disk``, read with
pyarrow alone (``from_hf_disk``; the ``hf_disk`` source of ``fedray partition``).

The layout (the ``datasets`` library's, checked against version 5.2.0, whose list
features are ``List``; older versions call them ``Sequence``, read the same):
- a Dataset: ``dataset_info.json`` (``features``: each column's type), ``state.json``
  (``_data_files``: the data files in order) and ``data-00000-of-0000N.arrow``, Arrow IPC
  *stream* files;
- a DatasetDict: ``dataset_dict.json`` (``{"splits": [...]}``) and one such Dataset
  directory per split. ``source.train_split`` (default train) is the train data and
  ``source.test_split`` (default test; null for none) the test data.

Column types come from ``features``: a ``ClassLabel`` is an integer label (its number of
names is ``num_classes``), an ``Image`` is a struct of encoded ``bytes`` and a ``path``
(decoded like ``table``'s image columns), a ``Value`` of a number type or a ``List`` /
``Sequence`` of them is a numeric feature, a ``Value`` string can be the ``text`` column.
With no input column named, the data set's one Image column is the input, or else every
numeric column that is not the label, user or split column. The rows of each split then go
through ``fedray.data.sources.table.table_part``: the same checks and arrays as a table's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from fedray.data.dataset import Dataset
from fedray.data.sources.columns import DEFAULT_LABEL, assemble, check_keys, source_doc
from fedray.data.sources.table import table_part
from fedray.errors import FedrayError, key_error, one_line

_NUMBER_TYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "float16", "float32", "float64", "float", "double")
_LIST_TYPES = ("List", "Sequence", "LargeList")


def from_hf_disk(path: str | os.PathLike, *, label: str | None = "label",
                 features: list[str] | None = None, image: str | None = None,
                 text: str | None = None, text_length: int = 80, user: str | None = None,
                 split: str | None = None, train_split: str = "train",
                 test_split: str | None = "test", num_classes: int | None = None) -> Dataset:
    """A Dataset from the ``save_to_disk`` directory ``path`` (a Dataset or a DatasetDict);
    the keys mean what ``from_table``'s do, plus the DatasetDict's ``train_split`` and
    ``test_split``. No ``datasets`` import is needed."""
    keys = {"label": DEFAULT_LABEL["hf_disk"] if label is None else label, "features": features,
            "image": image, "text": text, "text_length": text_length, "user": user,
            "split": split, "num_classes": num_classes, "train_split": train_split,
            "test_split": test_split}
    check_keys("hf_disk", keys)
    root = Path(path)
    if (root / "dataset_dict.json").is_file():
        if split is not None:
            raise key_error("source.split", f"{root} is a DatasetDict: its splits are "
                            f"source.train_split and source.test_split, not a column", split,
                            what="recipe")
        names = _dict_splits(root)
        for key in ("train_split", "test_split"):
            if keys[key] is not None and keys[key] not in names:
                raise key_error(f"source.{key}", f"{root} has no split {keys[key]!r} (it has: "
                                f"{', '.join(names)})", keys[key], what="recipe")
        dirs = [(root / train_split, False)]
        if test_split is not None:
            dirs.append((root / test_split, True))
    elif (root / "dataset_info.json").is_file():
        dirs = [(root, False)]
    else:
        raise FedrayError(f"{root}: not a Hugging Face save_to_disk directory (no "
                          f"dataset_dict.json or dataset_info.json)")
    parts, scale, classes = [], 1.0, None
    for directory, test in dirs:
        table, types = _read_dataset(directory, test)
        chosen = _inputs(directory, types, keys)
        part, scale = table_part(str(directory), table, chosen)
        if test:
            part.test = True
        parts.append(part)
        label_type = types.get(keys["label"], {})
        if label_type.get("_type") == "ClassLabel" and classes is None:
            classes = _class_count(label_type)
    num = num_classes if num_classes is not None else classes
    return assemble("hf_disk", parts, scale=scale, num_classes=num,
                    source=source_doc("hf_disk", os.fspath(path), **keys))



def _json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FedrayError(f"{file}: missing (not a complete save_to_disk directory)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FedrayError(f"{file}: not readable JSON ({one_line(exc)})") from None


def _dict_splits(root: Path) -> list[str]:
    doc = _json(root / "dataset_dict.json")
    splits = doc.get("splits") if isinstance(doc, dict) else None
    if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
        raise FedrayError(f"{root / 'dataset_dict.json'}: expected {{\"splits\": [names]}}")
    return splits


def _read_dataset(directory: Path, test: bool = False) -> tuple[pa.Table, dict[str, dict]]:
    """One saved Dataset's rows (its data files in ``state.json``'s order) and column types."""
    info = _json(directory / "dataset_info.json")
    types = info.get("features") if isinstance(info, dict) else None
    if not isinstance(types, dict):
        raise FedrayError(f"{directory / 'dataset_info.json'}: no 'features' object")
    state = _json(directory / "state.json")
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not files or not all(
            isinstance(f, dict) and isinstance(f.get("filename"), str) for f in files):
        raise FedrayError(f"{directory / 'state.json'}: no '_data_files' list of filenames")
    tables = []
    for entry in files:
        file = directory / entry["filename"]
        try:
            with pa.memory_map(str(file)) as source:
                tables.append(pa.ipc.open_stream(source).read_all())
        except FileNotFoundError:
            raise FedrayError(f"{file}: missing (listed in state.json)") from None
        except (pa.ArrowException, OSError) as exc:
            raise FedrayError(f"{file}: not an Arrow IPC stream ({one_line(exc)})") from None
    try:
        table = pa.concat_tables(tables)
    except pa.ArrowInvalid as exc:
        raise FedrayError(f"{directory}: its data files differ in columns ({one_line(exc)})") \
            from None
    if table.num_rows == 0:
        raise FedrayError(f"{directory}: its {len(files)} data file(s) hold no rows (an empty "
                          f"split{'; source.test_split: null reads none' if test else ''})")
    return table, types


def _kind(feature: Any) -> str:
    """image, label, text, number or other: what fedray can make of a column's feature."""
    if not isinstance(feature, dict):
        return "other"
    t = feature.get("_type")
    if t == "Image":
        return "image"
    if t == "ClassLabel":
        return "label"
    if t == "Value":
        dtype = feature.get("dtype")
        return "text" if dtype in ("string", "large_string") else \
            "number" if dtype in _NUMBER_TYPES else "other"
    if t in _LIST_TYPES:
        return "number" if _kind(feature.get("feature")) == "number" else "other"
    return "other"


def _inputs(directory: Path, types: dict[str, dict], keys: dict) -> dict:
    """``keys`` with the input column chosen when none is named: the one Image column, else
    every numeric column that is not the label, user or split."""
    if any(keys.get(k) is not None for k in ("features", "image", "text")):
        return keys
    found = [c for c, f in types.items() if _kind(f) == "image"]
    if len(found) > 1:
        raise key_error("source.image", f"{directory} has {len(found)} Image columns "
                        f"({', '.join(found)}): name one", what="recipe")
    if found:
        return {**keys, "image": found[0]}
    taken = {keys.get(k) for k in ("label", "user", "split")}
    numeric = [c for c, f in types.items() if _kind(f) == "number" and c not in taken]
    if not numeric:
        listed = ", ".join(f"{c} ({f.get('_type') if isinstance(f, dict) else '?'})"
                           for c, f in types.items())
        raise key_error("source.features", f"{directory} has no Image or numeric column to "
                        f"read by default; name source.features, source.image or source.text "
                        f"(columns: {listed})", what="recipe")
    return {**keys, "features": numeric}


def _class_count(feature: dict) -> int | None:
    names = feature.get("names")
    if isinstance(names, list) and names:
        return len(names)
    n = feature.get("num_classes")
    return n if isinstance(n, int) and n >= 1 else None
