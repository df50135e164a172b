"""LEAF Reddit: next-word prediction on Reddit comments of December 2017, one client per
Reddit user, read from LEAF's JSON (``train/*.json`` and ``test/*.json``; ``val/`` is not
read: LEAF evaluates on it only with ``--use-val-set``).

The format (TalwalkarLab/leaf, data/reddit/source/preprocess.py, which writes
``<name>_train.json``, ``<name>_val.json`` and ``<name>_test.json`` from ``reddit_<i>.json``;
the README's hosted ``data/`` holds its output): each user's comments, sorted by time, are
split 60/20/20 into train, val and test. A user's ``x`` is a list of comments, each a list
of rows of 10 token strings: ``<BOS>``, the comment's tokens (already lower-cased and
tokenised by LEAF: reddit_utils.py), ``<EOS>``, padded with ``<PAD>`` to a multiple of 10.
Its ``y`` is a list of one dict per comment: ``subreddit``, ``created_utc``, ``score``,
``target_tokens`` (the same rows shifted by one token: the comment's tokens, ``<EOS>``,
``<PAD>``, padded) and ``count_tokens`` (1 where the input is a token, 0 where padding).
``num_samples`` is copied from the unsplit file, so it counts the user's comments in all
three splits (preprocess.py ``create_leaf_json``): a split file's user holds at most that
many, which is what is checked (we could not inspect the hosted files themselves).

Each 10-token row is one example: input ``x`` the row's ids, target ``y`` its
``target_tokens`` row's ids (fedray.core.losses ``sequence_cross_entropy``), as LEAF's model
trains on rows (its batches are rows of the user's comments). Ids, laid out as LEAF's
build_vocab.py lays them out (``pad_symbol`` 0, ``unk_symbol`` 1):

==========  ======  ============================================================
token       id      notes
==========  ======  ============================================================
``<PAD>``   0       padding; fedray's sequence loss and accuracy leave it out
``<UNK>``   1       any token not in the vocabulary
words       2..     the vocabulary's words in order (``<BOS>``, ``<EOS>`` included)
==========  ======  ============================================================

The vocabulary: ``vocab``, a plain-text file of one token per line in id order (``<PAD>``
and ``<UNK>`` lines are skipped: their ids are fixed), or, without one, built from the
train split as LEAF's build_vocab.py builds it: every input token counted, sorted by count
(descending) and then token, the first ``vocab_size`` kept (LEAF's ``vocab_size`` counts
``<PAD>`` and ``<UNK>`` too: its 10,000 ids are ``vocab_size`` 9,998 here). LEAF numbers
them from 1,
skipping ``<PAD>``, so when ``<PAD>`` is the most frequent token, as padding makes it, its
words get ids 2, 3, ... exactly as here (where ``<PAD>`` is never counted as a word). LEAF
stores its vocabulary as a pickle (``reddit_vocab.pck``), which fedray never reads: write
its words one per line, in id order, instead.

Where fedray departs from LEAF: LEAF's loss weights (``count_tokens``) also count the
``<PAD>`` target after ``<EOS>``, and its accuracy counts a predicted ``<UNK>`` as wrong;
here every ``<PAD>`` target is left out of loss and accuracy and ``<UNK>`` is a class like
any other. LEAF carries the LSTM state from one batch to the next; fedray's model starts
each row from zeros.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.data.sources.leaf import _read_split, owner_columns, user_lists
from fedray.data.sources.leaf_text import check_vocab_size, most_frequent, read_vocab_file
from fedray.errors import FedrayError

SEQ_LEN = 10  # LEAF preprocess.py SEQ_LEN, baseline_constants.py reddit seq_len
PAD, UNK = 0, 1  # LEAF build_vocab.py pad_symbol, unk_symbol
PAD_TOKEN, UNK_TOKEN = "<PAD>", "<UNK>"
DEFAULT_VOCAB_SIZE = 10_000  # LEAF build_vocab.py --vocab-size default (PAD and UNK included)

# (user, input rows [k] of token lists, target rows [k] of token lists) before the vocabulary
_Raw = tuple[str, list[list[str]], list[list[str]]]


def load_leaf_reddit(path: str, vocab: str | None = None,
                     vocab_size: int = DEFAULT_VOCAB_SIZE) -> Dataset:
    """Read LEAF Reddit from ``path/train/*.json`` and ``path/test/*.json``: x [n, 10] ids
    (uint16, int32 beyond 65,536 ids), y [n, 10] int64 target ids, ``num_classes`` the
    number of ids (the model's vocabulary), owners the users. ``vocab``: a token-per-line
    file; without one, the train split's ``vocab_size`` most frequent words, so
    ``vocab_size + 2`` ids (module docstring)."""
    root = Path(path)
    parts: list[list[Any]] = [_read_split(root, split, _read_user, who="user",
                                          pattern="*.json") for split in ("train", "test")]
    if vocab is not None:
        words = read_vocab_file(vocab, skip=(PAD_TOKEN, UNK_TOKEN))
    else:
        size = check_vocab_size(vocab_size, 1)
        counts: Counter[str] = Counter()
        for _, rows, _ in parts[0]:
            for row in rows:
                counts.update(row)
        counts.pop(PAD_TOKEN, None)
        counts.pop(UNK_TOKEN, None)
        words = most_frequent(counts, size)
    index = {PAD_TOKEN: PAD, UNK_TOKEN: UNK} | {w: i + 2 for i, w in enumerate(words)}
    num_ids = len(words) + 2
    dtype = np.uint16 if num_ids <= 2**16 else np.int32
    owners, owner_of = owner_columns(parts)
    splits = []
    for records, owner in zip(parts, owner_of, strict=True):
        x = _ids([row for r in records for row in r[1]], index)
        y = _ids([row for r in records for row in r[2]], index)
        splits.append(Split(x.astype(dtype), y, owner=owner))
    return Dataset(name="leaf_reddit", train=splits[0], test=splits[1], num_classes=num_ids,
                   owners=owners, scale=1.0)


def _ids(rows: list[list[str]], index: dict[str, int]) -> np.ndarray:
    """[k, SEQ_LEN] int64 ids of ``rows``; a token outside the vocabulary is UNK."""
    return np.asarray([[index.get(t, UNK) for t in row] for row in rows],
                      dtype=np.int64).reshape(-1, SEQ_LEN)


def _rows(where: str, what: str, rows: Any) -> list[list[str]]:
    """A comment's rows of ``SEQ_LEN`` token strings, checked."""
    if not isinstance(rows, list) or not rows:
        raise FedrayError(f"{where}: {what} must be a non-empty list of rows of {SEQ_LEN} "
                          f"tokens (got {rows!r:.40})")
    for r, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != SEQ_LEN \
                or not all(isinstance(t, str) and t for t in row):
            raise FedrayError(f"{where}: {what} row {r} must be a list of {SEQ_LEN} "
                              f"non-empty token strings (got {row!r:.60})")
    return rows


def _read_user(file: Path, user: str, n: int, entry: Any) -> _Raw:
    where = f"{file}: user {user!r}"
    # num_samples counts the user's comments in every split (LEAF copies it from the
    # unsplit file): checked below as an upper bound
    xs, ys = user_lists(where, entry, None, "x must be a list of comments, y a list of dicts",
                        ("comments", "dicts"))
    if len(xs) != len(ys) or len(xs) > n:
        raise FedrayError(f"{where}: x has {len(xs)} comments and y {len(ys)}; they must "
                          f"be as many, and at most num_samples ({n}, the user's comments "
                          f"in all splits)")
    inputs: list[list[str]] = []
    targets: list[list[str]] = []
    for i, (comment, label) in enumerate(zip(xs, ys, strict=True)):
        rows = _rows(f"{where}: comment {i}", "x", comment)
        if not isinstance(label, dict) or "target_tokens" not in label:
            raise FedrayError(f"{where}: comment {i}: y must be a dict with 'target_tokens' "
                              f"(got {type(label).__name__})")
        target = _rows(f"{where}: comment {i}", "y's target_tokens", label["target_tokens"])
        if len(target) != len(rows):
            raise FedrayError(f"{where}: comment {i}: x has {len(rows)} rows but y's "
                              f"target_tokens has {len(target)}")
        inputs.extend(rows)
        targets.extend(target)
    return user, inputs, targets
