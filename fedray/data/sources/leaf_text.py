"""Word vocabularies for LEAF's two text data sets (Sent140, Reddit): LEAF's word splitting
for tweets, a plain-text vocabulary file, and a vocabulary built from the train split.

Why one module: both data sets map words to ids through a vocabulary the user either brings
(a file) or that fedray builds from the train split, and both builds must be deterministic
(the same train files always give the same ids, so a store rebuilt from the same recipe is
the same store). The id layouts differ, as LEAF's do; each source's module documents its own.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from fedray.errors import FedrayError, key_error

# LEAF models/utils/language_utils.py split_line: runs of word characters and apostrophes,
# and each of . , ! ? ; on its own; everything else (spaces, other punctuation) separates.
_WORDS = re.compile(r"[\w']+|[.,!?;]")


def split_line(line: str) -> list[str]:
    """A tweet's words as LEAF's ``split_line`` finds them (no lower-casing: LEAF has none)."""
    return _WORDS.findall(line)


def most_frequent(counts: Counter[str], k: int) -> list[str]:
    """The ``k`` most frequent words, ties broken by the word itself (ascending), so the
    order never depends on the order the words were counted in (LEAF's Reddit
    ``build_vocab.py`` sorts by the same key: count descending, then word)."""
    return [w for w, _ in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))[:k]]


def check_vocab_size(vocab_size: object, least: int) -> int:
    """``source.vocab_size`` as an int >= ``least``, else a one-line recipe error."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < least:
        raise key_error("source.vocab_size", f"must be an integer >= {least}", vocab_size,
                        what="recipe")
    return vocab_size


def read_vocab_file(path: str | Path, skip: Iterable[str] = ()) -> list[str]:
    """The words of a vocabulary file, in file order (a word's position is its rank).

    Two layouts are read, line by line: one word per line, or GloVe's text format (the word,
    then its vector's values, separated by spaces: ``glove.6B.300d.txt``, which LEAF's
    Sent140 model takes its vocabulary from, models/sent140/get_embs.py). Only the first
    field of each line is used, so the vectors are never parsed; like LEAF's reader the line
    is split on whitespace. Blank lines are an error (a word of a GloVe file cannot be
    empty), and so is a word listed twice (its id would be ambiguous). Words in ``skip``
    (special tokens with fixed ids) are left out. Safe formats only: LEAF's Reddit vocabulary
    is a pickle, which fedray does not read; write its words one per line instead."""
    file = Path(path).expanduser()
    try:
        with open(file, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise key_error("source.vocab", f"cannot read {file} ({e.strerror or e})",
                        what="recipe") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FedrayError(f"{file}: vocabulary is not UTF-8 text ({e.reason} at byte "
                          f"{e.start})") from None
    skip = set(skip)
    words: list[str] = []
    seen: dict[str, int] = {}
    width = None
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split(maxsplit=1)
        if not fields:
            raise FedrayError(f"{file}: line {number}: empty line (one word per line, or "
                              f"a word and its vector)")
        word = fields[0]
        has_vector = len(fields) > 1
        if width is None:
            width = has_vector
        elif has_vector != width:
            layout = "a word and its vector" if width else "one word"
            raise FedrayError(f"{file}: line {number}: {layout} on every line, as on line 1")
        if word in seen:
            raise FedrayError(f"{file}: line {number}: word {word!r} already on line "
                              f"{seen[word]}")
        seen[word] = number
        if word not in skip:
            words.append(word)
    if not words:
        raise FedrayError(f"{file}: the vocabulary lists no words")
    return words
