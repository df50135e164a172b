"""LEAF Sent140: tweets labelled by sentiment, one client per Twitter user, read from the JSON
that LEAF's ``preprocess.sh`` writes (``train/all_data_*_train_*.json`` and
``test/all_data_*_test_*.json``, as LEAF FEMNIST).

The format (TalwalkarLab/leaf, data/sent140/preprocess/data_to_json.py and README.md): per
user, ``x`` is a list of the raw Sentiment140 CSV records of that user's tweets without the
polarity, ``[id, date, query, user, text, "training" | "test"]`` (strings; the last field is
added by combine_data.py), and ``y`` the labels, 1 for polarity "4" (positive) and 0 for any
other. LEAF's model reads the text at index 4 (models/sent140/stacked_lstm.py ``process_x``);
so does fedray, and a record needs at least those five fields.

Tokenising as LEAF does (models/utils/language_utils.py ``line_to_indices``): the text is cut
into words by ``split_line`` (runs of letters, digits, underscores and apostrophes, and each
of ``. , ! ? ;``; not lower-cased: LEAF does not lower-case, so with GloVe's lower-case
words a capitalised word is out of vocabulary, as it is in LEAF), the first 25 words are
mapped to ids and the row is padded to 25 ids at its end. The ids, as LEAF lays them out:

=================  ========  ==========================================================
token              id        notes
=================  ========  ==========================================================
vocabulary words   0..W-1    the vocabulary's order (a file's line order)
out of vocabulary  W         LEAF's ``unk_id = len(word2id)``
padding            W         the same id: LEAF pads with its unknown-word id
=================  ========  ==========================================================

So a model needs W + 1 embedding rows (LEAF's embedding is ``[vocab_size + 1, n_hidden]``
for its W = ``vocab_size`` words; fedray's ``source.vocab_size`` is W too). The vocabulary is either
``vocab`` (a file: GloVe's ``glove.6B.300d.txt``, which LEAF's get_embs.py reads, or one word
per line; fedray.data.sources.leaf_text.read_vocab_file), or, when none is given, built from
the train split's tweets: its ``vocab_size`` most frequent words, ties broken by the
word (fedray's choice: LEAF always uses GloVe's 400,000 words, which cannot be downloaded
here). A tweet whose text is empty is an error naming the file, the user and the sample.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.data.sources.leaf import _read_split, owner_columns, user_lists
from fedray.data.sources.leaf_text import (
    check_vocab_size,
    most_frequent,
    read_vocab_file,
    split_line,
)
from fedray.errors import FedrayError

NUM_CLASSES = 2
MAX_WORDS = 25  # LEAF's max_words (line_to_indices) and seq_len (baseline_constants.py)
TEXT_FIELD = 4  # the tweet's text in a LEAF record (stacked_lstm.py: e[4])
DEFAULT_VOCAB_SIZE = 10_000  # ids of a vocabulary built from the train split (fedray's)


def load_leaf_sent140(path: str, vocab: str | None = None,
                      vocab_size: int = DEFAULT_VOCAB_SIZE) -> Dataset:
    """Read LEAF Sent140 from ``path/train`` and ``path/test``: x [n, 25] word ids (uint16,
    or int32 for a vocabulary of more than 65,536 ids, such as GloVe's 400,001), y [n] 0/1,
    owners the users. ``vocab``: a vocabulary file (module docstring); without one, the
    train split's ``vocab_size`` most frequent words (so ``vocab_size + 1`` ids, with the
    OOV/padding id)."""
    root = Path(path)
    parts = [_read_split(root, split, _read_user, who="user") for split in ("train", "test")]
    if vocab is not None:
        words = read_vocab_file(vocab)
    else:
        size = check_vocab_size(vocab_size, 1)
        counts: Counter[str] = Counter()
        for _, texts, _ in parts[0]:
            for text in texts:
                counts.update(split_line(text))
        words = most_frequent(counts, size)
    index = {w: i for i, w in enumerate(words)}
    oov = len(words)
    dtype = np.uint16 if oov < 2**16 else np.int32
    owners, owner_of = owner_columns(parts)
    splits = []
    for records, owner in zip(parts, owner_of, strict=True):
        rows = [tokenize(text, index, oov) for _, texts, _ in records for text in texts]
        x = np.asarray(rows, dtype=dtype).reshape(-1, MAX_WORDS)
        y = (np.concatenate([r[2] for r in records]) if records
             else np.zeros(0, np.int64))
        splits.append(Split(x, y, owner=owner))
    return Dataset(name="leaf_sent140", train=splits[0], test=splits[1],
                   num_classes=NUM_CLASSES, owners=owners, scale=1.0)


def tokenize(text: str, index: dict[str, int], oov: int) -> list[int]:
    """LEAF's ``line_to_indices``: the ids of the first 25 words, padded with ``oov``."""
    ids = [index.get(w, oov) for w in split_line(text)[:MAX_WORDS]]
    return ids + [oov] * (MAX_WORDS - len(ids))


def _read_user(file: Path, user: str, n: int, entry: Any
               ) -> tuple[str, np.ndarray, np.ndarray]:
    """One user's texts (an object array of str) and labels, checked."""
    where = f"{file}: user {user!r}"
    xs, ys = user_lists(where, entry, n, "x must be a list of tweet records, y a list of "
                        "labels", ("records", "labels"))
    texts = []
    for i, (record, label) in enumerate(zip(xs, ys, strict=True)):
        if not isinstance(record, list) or len(record) <= TEXT_FIELD:
            raise FedrayError(f"{where}: sample {i}: x must be a record [id, date, query, "
                              f"user, text, ...] (got {_show(record)})")
        text = record[TEXT_FIELD]
        if not isinstance(text, str):
            raise FedrayError(f"{where}: sample {i}: x[{TEXT_FIELD}], the text, must be a "
                              f"string (got {type(text).__name__})")
        if not text.strip():
            raise FedrayError(f"{where}: sample {i}: x[{TEXT_FIELD}], the text, is empty")
        if type(label) is not int or label not in (0, 1):  # bool, 1.0, "1" refused
            raise FedrayError(f"{where}: sample {i}: y must be 0 or 1 (got {label!r})")
        texts.append(text)
    return user, np.array(texts, dtype=object), np.asarray(ys, dtype=np.int64).reshape(n)


def _show(value: Any) -> str:
    if isinstance(value, list):
        return f"a list of {len(value)} fields"
    return type(value).__name__
