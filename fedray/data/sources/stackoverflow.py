"""TensorFlow Federated's Stack Overflow, read without TensorFlow: next-word prediction and
tag prediction, preprocessed as TFF's research baselines preprocess them.

Files (TFF's ``stackoverflow.tar.bz2``, extracted; ``tff.simulation.datasets.stackoverflow``):

- ``stackoverflow_train.h5``, ``stackoverflow_test.h5``: HDF5, ``examples/<user id>/<field>``,
  one row per post (a question's or an answer's sentence), the fields ``tokens`` (the text,
  lower-cased, tokens separated by single spaces), ``title``, ``tags`` (the question's tags
  joined by ``|``), ``type``, ``creation_date`` (byte strings) and ``score`` (int64). The
  train split is every post before 2018-01-01, the test split every post after, of the same
  population of users (TFF's ``load_data`` docstring), so a user's test posts are that
  client's own test data.
- ``stackoverflow_held_out.h5`` (users whose id is 0 mod 10, all dates) is not read: it is a
  separate population, and the baselines this source reproduces ignore it too
  (google-research/federated ``utils/datasets/stackoverflow_word_prediction.py``:
  "ignores the heldout Stack Overflow dataset for consistency with Adaptive Federated
  Optimization").
- ``stackoverflow.word_count`` (optional): plain text, one ``word count`` pair per line,
  most frequent first; the count is the number of train users who used the word in a
  post's body. TFF's ``load_word_counts`` reads it in file order and the vocabulary is its
  first ``vocab_size`` words. ``stackoverflow.tag_count`` (optional): a JSON object
  ``{tag: count}``; TFF's ``load_tag_counts`` sorts it by count, highest first (a stable
  sort: ties keep the file's order), and the tag vocabulary is its first ``num_tags`` tags.
  Without a count file the list is built from the train split as TFF defines the counts
  (users whose train posts use the word in ``tokens`` / carry the tag), highest count first,
  ties broken by the word's bytes, ascending, so the same files give the same vocabulary.

Next-word prediction (``task: next_word``; google-research/federated
``utils/datasets/stackoverflow_word_prediction.py``, ``build_to_ids_fn`` and
``get_special_tokens`` with one out-of-vocabulary bucket). With V = ``vocab_size``:

==========  ==========  =================================================================
token       id          notes
==========  ==========  =================================================================
padding     0           ``PAD``; never a target that counts (``sequence_cross_entropy``)
words       1..V        the vocabulary's i-th word (0-based) has id i + 1
OOV         V + 1       any other word
BOS         V + 2       starts every post
EOS         V + 3       ends a post of fewer than ``sequence_length`` words
==========  ==========  =================================================================

so the model's output has V + 4 classes (10,004 for V = 10,000). A post's ``tokens`` are
split at each single space (``tf.strings.split(..., sep=' ')``: two spaces in a row make an
empty word, an OOV), cut to its first ``sequence_length`` words, mapped to ids, EOS appended
when the post had fewer words than that, BOS put in front, and the whole padded with 0 to
``sequence_length + 1`` ids: x is its first ``sequence_length`` ids, y its last (the
targets: the input shifted by one). One post is one example; a post's words beyond
``sequence_length`` are dropped, as TFF drops them.

Tag prediction (``task: tag``; ``utils/datasets/stackoverflow_tag_prediction.py``,
``build_to_ids_fn``): a post's ``tokens`` and ``title``, joined by a space and split at
whitespace, become a bag of words over the V words: each word's share of the post's words
(out-of-vocabulary words count in the denominator but have no column), float32 [V]. Its
``tags`` split at ``|`` become a multi-hot vector over the ``num_tags`` most frequent tags
(int64 0/1 [num_tags]; a tag outside them is dropped). Where fedray departs from TFF: a post
with no words at all gets a zero vector (TFF's mean over no words is NaN), and a tag listed
twice counts once (TFF's one-hot sum would make it 2).

The bag of words is stored dense, exactly as TFF computes it: 40,000 bytes of inputs and
500 int64 labels (4,000 bytes) per example for V = 10,000 and 500 tags. That is the price of
keeping TFF's inputs bit for bit; it makes the tag task a store for a subset of the users
(``max_client_examples`` caps each train user's posts as Reddi et al. do), not for all
135.8 million train posts.

Memory: the loader reads every client of the two files into memory (as the other TFF
sources do) before building the arrays.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.errors import FedrayError, key_error

PAD = 0
VOCAB_SIZE = 10_000  # Reddi et al. / google-research/federated: the 10,000 most frequent words
NUM_TAGS = 500  # the 500 most frequent tags (the same sources)
SEQUENCE_LENGTH = 20  # words per next-word example (the same sources)
TASKS = ("next_word", "tag")
TRAIN_FILE = "stackoverflow_train.h5"
TEST_FILE = "stackoverflow_test.h5"
WORD_COUNT_FILE = "stackoverflow.word_count"
TAG_COUNT_FILE = "stackoverflow.tag_count"

# the h5 fields each task reads
_FIELDS = {"next_word": ("tokens",), "tag": ("tokens", "title", "tags")}


def special_tokens(vocab_size: int) -> dict[str, int]:
    """The ids of padding, OOV, BOS and EOS for a vocabulary of ``vocab_size`` words."""
    return {"pad": PAD, "oov": vocab_size + 1, "bos": vocab_size + 2, "eos": vocab_size + 3}


def num_tokens(vocab_size: int) -> int:
    """Classes of the next-word task: the words, padding, OOV, BOS and EOS."""
    return vocab_size + 4


# --- count files ---------------------------------------------------------------------------


def read_word_counts(file: str | Path) -> list[str]:
    """The words of a ``stackoverflow.word_count`` file, in file order (most frequent first):
    each line ``word count`` (two whitespace-separated fields, the count an integer >= 0).
    A line of another shape, a repeated word or an unreadable file is a one-line FedrayError
    naming the file and the line."""
    path = Path(file)
    words: list[str] = []
    seen: set[str] = set()
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                fields = line.split()
                if len(fields) != 2:
                    raise FedrayError(f"{path}: line {number}: expected 'word count', got "
                                      f"{len(fields)} fields")
                word, count = fields
                if not count.isdigit():
                    raise FedrayError(f"{path}: line {number}: count {count!r} of word "
                                      f"{word!r} is not an integer >= 0")
                if word in seen:
                    raise FedrayError(f"{path}: line {number}: word {word!r} is listed twice")
                seen.add(word)
                words.append(word)
    except UnicodeDecodeError as e:
        raise FedrayError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise FedrayError(f"{path}: cannot read ({e.strerror or e})") from None
    if not words:
        raise FedrayError(f"{path}: no words")
    return words


def read_tag_counts(file: str | Path) -> list[str]:
    """The tags of a ``stackoverflow.tag_count`` file (a JSON object ``{tag: count}``), by
    count, highest first, ties in file order (TFF's stable sort)."""
    path = Path(file)
    try:
        counts = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise FedrayError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise FedrayError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    except OSError as e:
        raise FedrayError(f"{path}: cannot read ({e.strerror or e})") from None
    if not isinstance(counts, dict) or not counts:
        raise FedrayError(f"{path}: must be a non-empty JSON object of tag: count")
    for tag, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise FedrayError(f"{path}: count of tag {tag!r} must be an integer >= 0, "
                              f"got {count!r}")
    return sorted(counts, key=lambda tag: -counts[tag])  # stable: ties keep file order


def users_per_item(clients: Iterable[Iterable[bytes]], split: bytes | None) -> list[bytes]:
    """Every word (``split`` None: whitespace; else that separator) of the clients' strings,
    by the number of clients that use it, highest first, ties by the bytes, ascending: TFF's
    count (users, not occurrences) where its count file is absent."""
    users: Counter[bytes] = Counter()
    for texts in clients:
        items: set[bytes] = set()
        for text in texts:
            items.update(text.split(split))
        items.discard(b"")
        users.update(items)
    return sorted(users, key=lambda w: (-users[w], w))


# --- the two tasks -------------------------------------------------------------------------


def index_of(words: Sequence[str | bytes], size: int) -> dict[bytes, int]:
    """word (bytes) -> its 0-based place among the first ``size`` of ``words``."""
    return {(w.encode("utf-8") if isinstance(w, str) else bytes(w)): i
            for i, w in enumerate(words[:size])}


def to_ids(tokens: bytes, vocab: dict[bytes, int], vocab_size: int,
           sequence_length: int = SEQUENCE_LENGTH) -> np.ndarray:
    """A post's ``sequence_length + 1`` ids, as TFF's ``build_to_ids_fn`` makes them and
    its padded batch pads them: BOS, the ids of its first ``sequence_length`` words, EOS if
    the post was shorter, then padding."""
    special = special_tokens(vocab_size)
    words = tokens.split(b" ")[:sequence_length]
    ids = [special["bos"]] + [vocab.get(w, vocab_size) + 1 for w in words]
    if len(words) < sequence_length:
        ids.append(special["eos"])
    out = np.zeros(sequence_length + 1, dtype=np.int64)
    out[:len(ids)] = ids
    return out


def next_word_examples(posts: Sequence[bytes], vocab: dict[bytes, int], vocab_size: int,
                       sequence_length: int = SEQUENCE_LENGTH) -> tuple[np.ndarray, np.ndarray]:
    """x and y, each [n, sequence_length] int64: each post's ids but the last, and but the
    first (the next word at every position)."""
    rows = np.zeros((len(posts), sequence_length + 1), dtype=np.int64)
    for i, post in enumerate(posts):
        rows[i] = to_ids(post, vocab, vocab_size, sequence_length)
    return rows[:, :-1], rows[:, 1:]


def bag_of_words(tokens: Sequence[bytes], titles: Sequence[bytes], vocab: dict[bytes, int],
                 vocab_size: int) -> np.ndarray:
    """[n, vocab_size] float32: each vocabulary word's share of the words of the post's
    ``tokens + ' ' + title`` split at whitespace (OOV words count in the share's
    denominator only; a post without words is all zeros)."""
    out = np.zeros((len(tokens), vocab_size), dtype=np.float32)
    for i, (body, title) in enumerate(zip(tokens, titles, strict=True)):
        words = (body + b" " + title).split()
        if not words:
            continue
        ids = np.fromiter((vocab.get(w, vocab_size) for w in words), dtype=np.int64,
                          count=len(words))
        counts = np.bincount(ids, minlength=vocab_size + 1)[:vocab_size]
        out[i] = counts.astype(np.float32) / np.float32(len(words))
    return out


def tag_labels(tags: Sequence[bytes], tag_index: dict[bytes, int], num_tags: int) -> np.ndarray:
    """[n, num_tags] int64 multi-hot: 1 for each of the post's ``|``-separated tags among the
    ``num_tags`` most frequent."""
    out = np.zeros((len(tags), num_tags), dtype=np.int64)
    for i, joined in enumerate(tags):
        for tag in joined.split(b"|"):
            j = tag_index.get(tag)
            if j is not None:
                out[i, j] = 1
    return out


# --- reading the h5 files ------------------------------------------------------------------


def _strings(file: Path, cid: str, field: str, a: np.ndarray) -> list[bytes]:
    """A field's rows as bytes; anything but a 1-d array of strings names file and field."""
    if a.ndim != 1 or a.dtype.kind not in "OS":
        raise FedrayError(f"{file}: 'examples/{cid}/{field}' must be a 1-d dataset of byte "
                          f"strings (got {a.dtype} {a.shape})")
    out = []
    for i, s in enumerate(a.tolist()):
        if isinstance(s, str):  # h5py hands back str for a dataset declared UTF-8
            s = s.encode("utf-8")
        if not isinstance(s, bytes):
            raise FedrayError(f"{file}: 'examples/{cid}/{field}' row {i} is not a string "
                              f"({type(s).__name__})")
        out.append(s)
    return out


def _read(file: Path, fields: tuple[str, ...]) -> tuple[list[str], list[list[list[bytes]]]]:
    """Client ids (sorted) and, per field, each client's rows as bytes."""
    # imported when used, not at the top: it loads h5py (start-up time)
    from fedray.data.sources.tff import _read_clients

    clients, columns = _read_clients(file, fields)
    return clients, [[_strings(file, cid, field, a) for cid, a in zip(clients, col, strict=True)]
                     for field, col in zip(fields, columns, strict=True)]


def _positive(key: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise key_error(f"source.{key}", f"must be an integer >= {low}", value, what="recipe")
    return int(value)


def check_options(task: str | None = None, vocab_size: int = VOCAB_SIZE,
                  num_tags: int = NUM_TAGS, sequence_length: int = SEQUENCE_LENGTH,
                  max_client_examples: int | None = None) -> None:
    """The source's keys, checked before any file is opened (the recipe calls this first)."""
    if task not in TASKS:
        raise key_error("source.task", f"must be one of: {', '.join(TASKS)}", task,
                        what="recipe")
    _positive("vocab_size", vocab_size, 1)
    _positive("num_tags", num_tags, 2)  # 2: labels 0/1 are checked against it
    _positive("sequence_length", sequence_length, 1)
    if max_client_examples is not None:
        _positive("max_client_examples", max_client_examples, 1)


def load_tff_stackoverflow(path: str, task: str | None = None, vocab_size: int = VOCAB_SIZE,
                           num_tags: int = NUM_TAGS, sequence_length: int = SEQUENCE_LENGTH,
                           max_client_examples: int | None = None) -> Dataset:
    """Read ``stackoverflow_{train,test}.h5`` (and the count files, when present) from
    directory ``path`` for ``task`` ``next_word`` or ``tag`` (module docstring).

    Users are the natural clients; a user's test posts (``stackoverflow_test.h5``) are its
    own test data, and ``owners`` is the union of both files' user ids (a user with test
    posts only has no train examples: ``natural``'s ``min_examples: 1`` leaves it out).
    ``max_client_examples``: keep only each user's first that many train posts, in the
    file's order (TFF's ``dataset.take(max_elements_per_client)``; Reddi et al. use 1000);
    the test split is kept whole, as TFF keeps it. ``num_tags`` is read by ``tag`` only,
    ``sequence_length`` by ``next_word`` only."""
    check_options(task, vocab_size, num_tags, sequence_length, max_client_examples)
    vocab_size, num_tags, sequence_length = int(vocab_size), int(num_tags), int(sequence_length)
    cap = None if max_client_examples is None else int(max_client_examples)
    root = Path(path)
    for name in (TRAIN_FILE, TEST_FILE):
        if not (root / name).is_file():
            raise FedrayError(f"{root / name}: file not found")
    fields = _FIELDS[task]
    train_ids, train_cols = _read(root / TRAIN_FILE, fields)
    test_ids, test_cols = _read(root / TEST_FILE, fields)
    # the vocabularies count every train post (TFF's counts do), the cap applies after
    word_file = root / WORD_COUNT_FILE
    words = read_word_counts(word_file) if word_file.is_file() else \
        users_per_item(train_cols[0], b" ")
    vocab = index_of(words, vocab_size)
    tag_index: dict[bytes, int] = {}
    if task == "tag":
        tag_file = root / TAG_COUNT_FILE
        tags = read_tag_counts(tag_file) if tag_file.is_file() else \
            users_per_item(train_cols[2], b"|")
        tag_index = index_of(tags, num_tags)
    if cap is not None:
        train_cols = [[rows[:cap] for rows in col] for col in train_cols]
    if task == "next_word":
        def examples(cols: list[list[list[bytes]]]) -> list[tuple[np.ndarray, np.ndarray]]:
            return [next_word_examples(posts, vocab, vocab_size, sequence_length)
                    for posts in cols[0]]
        num_classes = num_tokens(vocab_size)
    else:
        def examples(cols: list[list[list[bytes]]]) -> list[tuple[np.ndarray, np.ndarray]]:
            return [(bag_of_words(body, title, vocab, vocab_size),
                     tag_labels(tag, tag_index, num_tags))
                    for body, title, tag in zip(*cols, strict=True)]
        num_classes = num_tags
    return _dataset(f"tff_stackoverflow_{task}",
                    [(train_ids, examples(train_cols)), (test_ids, examples(test_cols))],
                    num_classes, task, vocab_size, sequence_length)


def _dataset(name: str, parts: list[tuple[list[str], list[tuple[np.ndarray, np.ndarray]]]],
             num_classes: int, task: str, vocab_size: int, sequence_length: int) -> Dataset:
    owners = sorted({cid for ids, _ in parts for cid in ids})
    index = {cid: i for i, cid in enumerate(owners)}
    # next_word ids as the smallest integer type that holds them (uint16 for 10,004 tokens:
    # a quarter of int64's bytes; the model casts its input to ids)
    x_dtype = (np.float32 if task == "tag" else
               np.uint16 if num_classes <= 2**16 else np.int32)
    width = vocab_size if task == "tag" else sequence_length
    label_width = num_classes if task == "tag" else sequence_length
    splits = []
    for ids, rows in parts:
        sizes = [len(y) for _, y in rows]
        x = np.concatenate([x for x, _ in rows]) if rows else np.zeros((0, width))
        y = np.concatenate([y for _, y in rows]) if rows else np.zeros((0, label_width))
        owner = np.repeat(np.array([index[c] for c in ids], dtype=np.int64), sizes)
        splits.append(Split(x.astype(x_dtype), y.astype(np.int64), owner=owner))
    return Dataset(name=name, train=splits[0], test=splits[1], num_classes=num_classes,
                   owners=owners, scale=1.0)
