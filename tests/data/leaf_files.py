"""Writing LEAF JSON files exactly as LEAF's scripts write them, for the loader tests."""

from __future__ import annotations

import json
from pathlib import Path


def leaf_doc(users: dict[str, tuple[list, list]], counts: dict | None = None) -> dict:
    """One LEAF file: users, num_samples (len(y) unless ``counts`` says), user_data."""
    counts = counts or {}
    return {"users": list(users),
            "num_samples": [counts.get(u, len(y)) for u, (_, y) in users.items()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}


def write_split(root: Path, train: dict, test: dict,
                name: str = "all_data_niid_05_keep_3_{split}_9.json") -> str:
    """``root/train`` and ``root/test`` with one file each; the default name is what LEAF's
    data/utils/split_data.py writes (``<file>_<split>_<frac digits>.json``)."""
    for split, doc in (("train", train), ("test", test)):
        (root / split).mkdir(parents=True, exist_ok=True)
        (root / split / name.format(split=split)).write_text(json.dumps(doc))
    return str(root)
