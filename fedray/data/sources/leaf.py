"""LEAF FEMNIST: the JSON shards that LEAF's ``preprocess.sh`` writes, read as one Dataset.

LEAF is the reference source of FEMNIST's natural writer split, so we read its own files
rather than a re-export. The shards are produced by a shell pipeline and are often copied
around by hand, so every count is checked: a short or mismatched shard must fail loudly
here, not train silently on misaligned labels. Examples are ordered by file name and then
by writer id, so the same directory always yields the same arrays.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence, Sized
from pathlib import Path
from typing import Any

import numpy as np

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.errors import FedrayError

NUM_CLASSES = 62
PIXELS = 28 * 28

# (writer, x [n, 784] float32, y [n] int64) for one writer of one shard
_Record = tuple[str, np.ndarray, np.ndarray]
# reads one user's user_data entry: (file, user id, num_samples, entry) -> _Record
UserReader = Callable[[Path, str, int, Any], _Record]


def load_leaf_femnist(path: str) -> Dataset:
    """Read ``path/train/all_data_*_train_*.json`` and ``path/test/all_data_*_test_*.json``.

    Returns x float32 [n, 1, 28, 28] in [0, 1] (1.0 = white background), 62 classes, and
    ``owners`` = every writer id of either split, sorted, indexed by each split's ``owner``.
    """
    root = Path(path)
    train = _read_split(root, "train")
    test = _read_split(root, "test")
    owners, (train_owner, test_owner) = owner_columns([train, test])
    return Dataset(name="leaf_femnist", train=_to_split(train, train_owner),
                   test=_to_split(test, test_owner), num_classes=NUM_CLASSES, owners=owners,
                   scale=1.0)


def _read_split(root: Path, split: str, read_user: UserReader | None = None,
                who: str = "writer", pattern: str | None = None) -> list[_Record]:
    """Every user of every LEAF JSON file of ``root/split``, files by name, users by id.

    ``read_user`` turns one user's entry into arrays (FEMNIST's pixels by default;
    fedray.data.sources.shakespeare reads characters with it); ``who`` is what messages
    call a user; ``pattern`` the file names (default ``all_data_*_{split}_*.json``, what
    LEAF's shared split script names them; LEAF's Reddit files are named otherwise)."""
    directory = root / split
    if not directory.is_dir():
        raise FedrayError(f"{directory}: LEAF {split}/ directory not found")
    pattern = pattern or f"all_data_*_{split}_*.json"
    files = sorted((p for p in directory.glob(pattern) if p.is_file()), key=lambda p: p.name)
    if not files:
        raise FedrayError(f"{directory}: no LEAF files matching {pattern}")
    records: list[_Record] = []
    for file in files:
        records.extend(_read_file(file, read_user or _read_writer, who))
    if split == "train" and not any(len(r[2]) for r in records):
        raise FedrayError(f"{directory}: its {len(files)} LEAF file(s) hold no examples "
                          f"({len(records)} {who}s, num_samples all 0)" if records else
                          f"{directory}: its {len(files)} LEAF file(s) list no {who}s")
    return records


def _read_file(file: Path, read_user: UserReader, who: str) -> list[_Record]:
    try:
        with open(file, "rb") as f:
            doc = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise FedrayError(f"{file}: invalid JSON ({e})") from None
    except OSError as e:
        raise FedrayError(f"{file}: cannot read ({e.strerror or e})") from None
    if not isinstance(doc, dict):
        raise FedrayError(f"{file}: expected a JSON object with users, num_samples, user_data")
    for key in ("users", "num_samples", "user_data"):
        if key not in doc:
            raise FedrayError(f"{file}: missing key {key!r}")
    users, counts, data = doc["users"], doc["num_samples"], doc["user_data"]
    if not isinstance(users, list) or not isinstance(counts, list) or not isinstance(data, dict):
        raise FedrayError(f"{file}: users and num_samples must be lists, user_data an object")
    if len(users) != len(counts):
        raise FedrayError(f"{file}: {len(users)} users but {len(counts)} num_samples")
    expected: dict[str, int] = {}
    for writer, n in zip(users, counts, strict=True):
        if not isinstance(writer, str):
            raise FedrayError(f"{file}: {who} id {writer!r} is not a string")
        if writer in expected:
            raise FedrayError(f"{file}: {who} {writer!r} is listed twice in users")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise FedrayError(f"{file}: {who} {writer!r}: num_samples {n!r} is not a count")
        expected[writer] = n
    extra = sorted(set(data) - set(expected))
    if extra:
        raise FedrayError(f"{file}: user_data has {who} {extra[0]!r} that is not in users")
    return [read_user(file, w, expected[w], data.get(w)) for w in sorted(expected)]


def user_lists(where: str, entry: Any, n: int | None, lists: str,
               units: tuple[str, str]) -> tuple[list, list]:
    """A LEAF ``user_data`` entry's ``x`` and ``y`` lists, with the checks every LEAF data set
    needs: both present, both lists (``lists`` says of what, for the message), and, unless
    ``n`` is None (a format whose num_samples counts more than one split), exactly
    ``num_samples`` of each (``units``: what an x item and a y item are called)."""
    if not isinstance(entry, dict) or "x" not in entry or "y" not in entry:
        raise FedrayError(f"{where}: user_data entry with 'x' and 'y' is missing")
    xs, ys = entry["x"], entry["y"]
    if not isinstance(xs, list) or not isinstance(ys, list):
        raise FedrayError(f"{where}: {lists}")
    if n is not None and (len(xs) != n or len(ys) != n):
        raise FedrayError(f"{where}: num_samples says {n} but x has {len(xs)} {units[0]} "
                          f"and y has {len(ys)}{' ' + units[1] if units[1] else ''}")
    return xs, ys


def owner_columns(parts: Sequence[Sequence[tuple[str, Any, Sized]]]
                  ) -> tuple[list[str], list[np.ndarray]]:
    """The users of all splits' (user, x, y) records, sorted: a Dataset's ``owners``; and,
    per split, each example's owner index (a user's index repeated once per label of its
    record), so a user keeps one id across the train and test splits."""
    owners = sorted({r[0] for records in parts for r in records})
    index = {u: i for i, u in enumerate(owners)}
    columns = [np.repeat(np.array([index[r[0]] for r in records], dtype=np.int64),
                         [len(r[2]) for r in records]).astype(np.int64) for records in parts]
    return owners, columns


def _read_writer(file: Path, writer: str, n: int, entry: Any) -> _Record:
    where = f"{file}: writer {writer!r}"
    if not isinstance(entry, dict) or "x" not in entry or "y" not in entry:
        raise FedrayError(f"{where}: user_data entry with 'x' and 'y' is missing")
    try:
        x = np.asarray(entry["x"], dtype=np.float32)
        y = np.asarray(entry["y"])
    except (ValueError, TypeError):
        raise FedrayError(f"{where}: x must be a list of {PIXELS}-value rows of numbers, "
                          f"y a list of integers") from None
    if len(x) != n or len(y) != n:
        raise FedrayError(f"{where}: num_samples says {n} but x has {len(x)} rows "
                          f"and y has {len(y)} labels")
    if n == 0:
        return writer, np.zeros((0, PIXELS), np.float32), np.zeros(0, np.int64)
    if x.ndim != 2 or x.shape[1] != PIXELS:
        raise FedrayError(f"{where}: every x row must have {PIXELS} values "
                          f"(got rows of shape {x.shape[1:]})")
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise FedrayError(f"{where}: y must be a flat list of integer labels")
    if y.min() < 0 or y.max() >= NUM_CLASSES:
        raise FedrayError(f"{where}: labels must be in 0..{NUM_CLASSES - 1} "
                          f"(found {int(y.min())}..{int(y.max())})")
    if not (x.min() >= 0.0 and x.max() <= 1.0):  # also false for NaN
        raise FedrayError(f"{where}: pixels must be in [0, 1]")
    return writer, x, y.astype(np.int64)


def stack_records(records: Sequence[tuple[str, np.ndarray, np.ndarray]],
                  empty: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The x and y of (user, x, y) records one user after the other (the order
    ``owner_columns`` numbers them in); ``empty``, arrays of the right shape, when a split
    has no users."""
    if not records:
        return empty
    return np.concatenate([r[1] for r in records]), np.concatenate([r[2] for r in records])


def _to_split(records: list[_Record], owner: np.ndarray) -> Split:
    x, y = stack_records(records, (np.zeros((0, PIXELS), np.float32), np.zeros(0, np.int64)))
    return Split(x.reshape(-1, 1, 28, 28), y, owner=owner)
