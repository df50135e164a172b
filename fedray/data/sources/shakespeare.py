"""Shakespeare next-character prediction: the vocabulary, the tokenizer and three sources.

Seed 002 (Charles & Konečný, App. E.1) sets the task up; the seed text is
``shared/seeds/002_ca229c69b5271fde.txt`` and the numbers below are its lines. Clients are
roles in plays with at least two lines of dialogue (line 1080); each role's text is cut into
sequences of 80 characters, padded (1080); the vocabulary has 90 tokens: 86 characters plus
beginning-of-line, end-of-line, padding and out-of-vocabulary tokens (1080); the model reads
80 tokens and predicts the sequence shifted by one, 80 x 90 outputs (1080). The seed uses
TensorFlow Federated's version of the data (1065), so the token ids here are TFF's, and a
model trained on them reads TFF-preprocessed data unchanged:

==========  ======  ==============================================================
token       id      notes
==========  ======  ==============================================================
padding     0       ``PAD``: fills a snippet's last sequence; never a target that counts
characters  1..86   ``CHAR_VOCAB[i]`` has id ``i + 1`` (TFF's ``CHAR_VOCAB`` order)
OOV         87      ``OOV``: any other character
BOS         88      ``BOS``: starts every snippet
EOS         89      ``EOS``: ends every snippet
==========  ======  ==============================================================

This is the layout of TFF's Shakespeare preprocessing (its ``get_special_tokens`` returns
pad 0, oov 87, bos 88, eos 89, and character ids are the vocabulary position plus one).
Tokenizing a snippet as TFF does: ``[BOS] + characters + [EOS]``, padded with ``PAD`` to a
multiple of 81 ids and cut into rows of 81; a row's first 80 ids are the input and its last
80 the target. A ``str`` is mapped character by character (a character outside the
vocabulary is one OOV); ``bytes`` are mapped byte by byte, as TFF maps its byte strings (a
non-ASCII character is one OOV per UTF-8 byte). The two agree on ASCII text. Where fedray
departs from TFF: a row whose 80 targets are all padding (left when a snippet's ids fill
their rows but for one, EOS, which is then that row's only input) is dropped, because it
has nothing to predict and would only dilute FedAvg's example weights.

Sources (``source.name`` in a recipe, each with the natural partition by role):
- ``leaf_shakespeare``: the JSON that LEAF's ``preprocess.sh`` writes (``train/`` and
  ``test/``, as LEAF FEMNIST); LEAF's samples are 80-character windows ``x`` with the next
  character ``y``, read as input ``x`` and target ``x[1:] + y`` (no BOS, EOS or padding).
- ``tff_shakespeare``: TFF's ``shakespeare_{train,test}.h5`` (``examples/<client>/snippets``,
  variable-length byte strings), each snippet tokenized as above.
- ``shakespeare_folio``: the Project Gutenberg First Folio plays (one ``*.txt`` per play),
  parsed here; ``load_shakespeare_folio`` documents the rules (speech detection, the merge of
  a speaker's abbreviations, the two-line rule, the train/test split).
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.data.sources.leaf import _read_split, owner_columns, stack_records, user_lists
from fedray.errors import FedrayError

# TFF's Shakespeare character vocabulary, in TFF's order (id = position + 1)
CHAR_VOCAB = ("dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\n"
              "aeimquyAEIMQUY]!%)-159\r")
PAD = 0
OOV = len(CHAR_VOCAB) + 1  # 87
BOS = len(CHAR_VOCAB) + 2  # 88
EOS = len(CHAR_VOCAB) + 3  # 89
VOCAB_SIZE = len(CHAR_VOCAB) + 4  # 90
SEQUENCE_LENGTH = 80

_TABLE = np.full(256, OOV, dtype=np.int64)  # code point (< 256) or byte -> id
_TABLE[[ord(c) for c in CHAR_VOCAB]] = np.arange(1, len(CHAR_VOCAB) + 1)

# A token array: [n, SEQUENCE_LENGTH] int64
_EMPTY = np.zeros((0, SEQUENCE_LENGTH), dtype=np.int64)


def char_ids(text: str | bytes) -> np.ndarray:
    """The ids of ``text``'s characters (str) or bytes (bytes), without BOS or EOS."""
    if isinstance(text, (bytes, bytearray, np.bytes_)):
        return _TABLE[np.frombuffer(bytes(text), dtype=np.uint8)]
    points = np.frombuffer(str(text).encode("utf-32-le", "surrogatepass"), dtype="<u4")
    return np.where(points < 256, _TABLE[np.minimum(points, 255)], OOV).astype(np.int64)


def to_ids(snippet: str | bytes) -> np.ndarray:
    """``[BOS] + ids of the snippet + [EOS]``, as TFF tokenizes a snippet."""
    return np.concatenate([[BOS], char_ids(snippet), [EOS]]).astype(np.int64)


def to_sequences(snippet: str | bytes) -> tuple[np.ndarray, np.ndarray]:
    """One snippet's (x, y), each [k, 80] int64: its ids padded to a multiple of 81 and cut
    into rows of 81, x a row's first 80 ids and y its last 80. Rows without a target (all
    padding) are dropped (see the module docstring)."""
    return snippets_to_sequences([snippet])


def snippets_to_sequences(snippets: Iterable[str | bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Every snippet's sequences, in order, stacked (``to_sequences`` of each, one after
    another), computed for all of them at once: the 35 plays' 27,000 speeches in a fraction
    of a second rather than seconds."""
    x, y, _ = _sequences(snippets)
    return x, y


def _sequences(snippets: Iterable[str | bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``snippets_to_sequences`` and, per row, the index of the snippet it comes from."""
    items = [bytes(s) if isinstance(s, (bytearray, np.bytes_)) else s for s in snippets]
    if not items:
        return _EMPTY.copy(), _EMPTY.copy(), np.zeros(0, dtype=np.int64)
    if all(isinstance(s, bytes) for s in items):
        chars = char_ids(b"".join(items))
    elif all(isinstance(s, str) for s in items):
        chars = char_ids("".join(items))
    else:  # a mix of str and bytes: each its own way
        chars = np.concatenate([char_ids(s) for s in items])
    width = SEQUENCE_LENGTH + 1
    lengths = np.fromiter((len(s) for s in items), dtype=np.int64, count=len(items))
    rows = -(-(lengths + 2) // width)  # each snippet's rows: BOS + chars + EOS, padded
    start = np.concatenate([[0], np.cumsum(rows)[:-1]]) * width  # where each snippet starts
    flat = np.zeros(int(rows.sum()) * width, dtype=np.int64)
    flat[start] = BOS
    flat[start + lengths + 1] = EOS
    first_char = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    flat[np.repeat(start + 1 - first_char, lengths) + np.arange(len(chars))] = chars
    table = flat.reshape(-1, width)
    keep = (table[:, 1:] != PAD).any(axis=1)
    table = table[keep]
    source = np.repeat(np.arange(len(items), dtype=np.int64), rows)[keep]
    return np.ascontiguousarray(table[:, :-1]), np.ascontiguousarray(table[:, 1:]), source


def decode(ids: Iterable[int]) -> str:
    """The characters of ``ids``; BOS, EOS and padding are left out, OOV becomes U+FFFD."""
    out = []
    for i in ids:
        i = int(i)
        if 1 <= i <= len(CHAR_VOCAB):
            out.append(CHAR_VOCAB[i - 1])
        elif i == OOV:
            out.append("\ufffd")
    return "".join(out)


def unigram_accuracy(train_y: np.ndarray, test_y: np.ndarray) -> tuple[int, float]:
    """The baseline an LSTM must beat: always predict the most frequent non-padding target
    token of ``train_y``; returns that token and its accuracy over ``test_y``'s non-padding
    positions (the positions fedray's accuracy counts)."""
    train = np.asarray(train_y).reshape(-1)
    test = np.asarray(test_y).reshape(-1)
    counts = np.bincount(train[train != PAD], minlength=VOCAB_SIZE)
    token = int(counts.argmax())
    scored = test[test != PAD]
    return token, float((scored == token).mean()) if len(scored) else 0.0


def _dataset(name: str, parts: Sequence[list[tuple[str, np.ndarray, np.ndarray]]]) -> Dataset:
    """A Dataset from (owner, x, y) records per split; owners sorted across both splits.

    x is kept as uint8 token ids (all < 90: an eighth of a store's int64 bytes; the model
    casts its input to integer ids), y as int64 (the loss indexes with it)."""
    owners, owner_of = owner_columns(parts)
    splits = []
    for records, owner in zip(parts, owner_of, strict=True):
        x, y = stack_records(records, (_EMPTY.copy(), _EMPTY.copy()))
        splits.append(Split(x.astype(np.uint8), y, owner=owner))
    return Dataset(name=name, train=splits[0], test=splits[1], num_classes=VOCAB_SIZE,
                   owners=owners, scale=1.0)


# --- LEAF JSON -----------------------------------------------------------------------------


def load_leaf_shakespeare(path: str) -> Dataset:
    """Read LEAF's Shakespeare JSON: ``path/train/all_data_*_train_*.json`` and
    ``path/test/all_data_*_test_*.json`` (LEAF's ``preprocess.sh`` output, as for FEMNIST).

    A LEAF sample is an 80-character window ``x`` and the character ``y`` after it; it
    becomes input ``ids(x)`` and target ``ids(x[1:] + y)``. Users are the natural clients;
    counts are checked as for LEAF FEMNIST, and a window that is not 80 characters or a ``y``
    that is not one character is an error naming the file, the user and the sample."""
    root = Path(path)
    parts = [_read_split(root, split, _read_leaf_user, who="user")
             for split in ("train", "test")]
    return _dataset("leaf_shakespeare", parts)


def _read_leaf_user(file: Path, user: str, n: int, entry: Any
                    ) -> tuple[str, np.ndarray, np.ndarray]:
    where = f"{file}: user {user!r}"
    xs, ys = user_lists(where, entry, n, "x and y must be lists of strings", ("samples", ""))
    for i, (window, nxt) in enumerate(zip(xs, ys, strict=True)):
        if not isinstance(window, str) or len(window) != SEQUENCE_LENGTH:
            got = f"{len(window)} characters" if isinstance(window, str) else \
                type(window).__name__
            raise FedrayError(f"{where}: sample {i}: x must be a string of "
                              f"{SEQUENCE_LENGTH} characters, got {got}")
        if not isinstance(nxt, str) or len(nxt) != 1:
            raise FedrayError(f"{where}: sample {i}: y must be one character, got {nxt!r}")
    # all windows at once: LEAF's full Shakespeare has millions of samples
    x = char_ids("".join(xs)).reshape(n, SEQUENCE_LENGTH)
    nxt = char_ids("".join(ys)).reshape(n, 1)
    return user, x, np.concatenate([x[:, 1:], nxt], axis=1)


# --- TFF h5 --------------------------------------------------------------------------------


def load_tff_shakespeare(path: str) -> Dataset:
    """Read TFF's ``shakespeare_train.h5`` and ``shakespeare_test.h5`` from directory
    ``path``: ``examples/<client>/snippets``, one variable-length byte string per snippet,
    clients in sorted id order. Each snippet is tokenized as TFF does (module docstring).
    Train and test clients are the same roles, so ``owners`` joins them."""
    # imported when used, not at the top: it loads h5py (start-up time)
    from fedray.data.sources.tff import _read_clients, _require

    root = Path(path)
    parts = []
    for file in _require(root / "shakespeare_train.h5", root / "shakespeare_test.h5"):
        clients, (columns,) = _read_clients(file, ("snippets",))
        records = []
        for cid, snippets in zip(clients, columns, strict=True):
            if snippets.ndim != 1 or snippets.dtype.kind not in "OSU":
                raise FedrayError(f"{file}: 'examples/{cid}/snippets' must be a 1-d dataset "
                                  f"of strings (got {snippets.dtype} {snippets.shape})")
            for i, s in enumerate(snippets):
                if not isinstance(s, (bytes, str, np.bytes_, np.str_)):
                    raise FedrayError(f"{file}: 'examples/{cid}/snippets' row {i} is not a "
                                      f"string ({type(s).__name__})")
            x, y = snippets_to_sequences(snippets.tolist())
            records.append((cid, x, y))
        parts.append(records)
    return _dataset("tff_shakespeare", parts)


# --- First Folio plain text ----------------------------------------------------------------

MIN_LINES = 2  # a role needs this many lines of dialogue (seed 002, line 1080)
DEFAULT_TEST_FRACTION = 0.2

# "  Ham. A little more then kin": 2-4 spaces, a name of up to four words (joined by spaces
# or periods: "S.Dro", "Watch 1", "Sir To"), a period, then the speech's first line if any.
# The name is matched lazily, so "  Ham. I do. Go on." is Ham's, not "Ham. I do"'s.
_HEADER = re.compile(r"^ {2,4}(?P<name>[A-Za-z0-9][\w'&-]*(?:[ .]+[A-Za-z0-9][\w'&-]*){0,3}?)"
                     r"\.(?:\s+(?P<text>\S.*?))?\s*$")
_HEADING = re.compile(r"^(Actus|Sc[oa]?ena)\b")
_END = re.compile(r"^(FINIS\b|(The )?Names of the Actors)", re.IGNORECASE)
_FIRST_WORD = re.compile(r"[\s.,:;]")
# first words of stage-direction lines (Gutenberg's First Folio spellings); ambiguous ones
# that also open dialogue lines ("Sound", "Knocke", "Within") are not in the list, nor
# "Exet", which is Exeter's speaker name in the Henry VI plays
STAGE_WORDS = frozenset({
    "Enter", "Exit", "Exeunt", "Manet", "Manent", "Flourish", "Florish", "Alarum",
    "Alarums", "Sennet", "Senet", "Hoboyes", "Hoboys", "Cornets", "Trumpets", "Excursions",
    "Retreat", "Thunder"})


@dataclass
class Speech:
    speaker: str  # the name as printed before the speech ("Barn")
    lines: list[str]  # its text lines, stripped


def parse_play(text: str) -> list[Speech]:
    """The speeches of one First Folio play, in order.

    - The first non-empty line (the title) is skipped; reading stops at ``FINIS`` or at a
      list of "Names of the Actors".
    - A speech starts on a line indented by 2-4 spaces with the speaker's name and a period
      (``_HEADER``); the text after the period is its first line. Every following line that
      is not a heading, a stage direction or another speech's start belongs to it, blank
      lines included, so a speech interrupted by "Enter the Ghost." goes on after it.
    - Act/scene headings ("Actus Primus. Scoena Prima.", "Scena Secunda.") end the current
      speech; the lines after one belong to nobody until the next speech starts.
    - A stage direction is a line whose first word is in ``STAGE_WORDS`` ("Enter", "Exit",
      "Exeunt", ...); the unindented lines that follow it up to the next blank line are its
      continuation ("Enter Horatio and\\nMarcellus.") and are skipped too.
    Stage directions printed inside a dialogue line ("... dies.") stay in the text: the
    transcription does not mark them."""
    speeches: list[Speech] = []
    current: Speech | None = None
    in_direction = False
    lines = text.splitlines()
    start = next((i + 1 for i, ln in enumerate(lines) if ln.strip()), len(lines))
    for raw in lines[start:]:
        s = raw.strip()
        if not s:
            in_direction = False
            continue
        if _END.match(s):
            break
        if _HEADING.match(s):
            current, in_direction = None, False
            continue
        if _FIRST_WORD.split(s, maxsplit=1)[0] in STAGE_WORDS:
            in_direction = True
            continue
        m = _HEADER.match(raw)
        if m:
            current = Speech(m["name"], [m["text"]] if m["text"] else [])
            speeches.append(current)
            in_direction = False
            continue
        if in_direction or current is None:
            continue
        current.lines.append(s)
    return [sp for sp in speeches if sp.lines]


@functools.lru_cache(maxsize=4096)
def speaker_key(name: str) -> str:
    """How speaker names compare: case-folded, runs of spaces and periods as one space
    ("S.Dro" and "S. Dro" are one name)."""
    return re.sub(r"[\s.]+", " ", name).strip().casefold()


def merge_speakers(names: Iterable[str]) -> dict[str, str]:
    """The merge rule for one play: key (``speaker_key``) -> the key of the role it is.

    The Folio abbreviates a speaker's name differently from speech to speech ("Bar.",
    "Barn.", "Barnardo."). Within one play, a name that is a prefix of longer names is merged
    into the longest of them when those longer names all lie on one chain of prefixes
    ("hor" -> "horatio", as "hora" is itself a prefix of "horatio"); when they branch ("lor"
    of both "lord" and "lorenzo") the name is ambiguous and stays a role of its own. A name
    no other name extends is its own role. The rule cannot tell two people whose names
    share a prefix when only one of them is ever printed in full (a "Pet." who is Peter in a
    play whose only longer "Pet..." is Petruchio); such a role joins the longer one."""
    keys = sorted({speaker_key(n) for n in names})
    merged = {}
    for a in keys:
        longer = [b for b in keys if b != a and b.startswith(a)]
        top = max(longer, key=len) if longer else a
        merged[a] = top if all(top.startswith(b) for b in longer) else a
    return merged


def folio_roles(path: str | Path) -> dict[str, list[list[str]]]:
    """Every role of the plays in directory ``path``: ``"play/Speaker"`` -> its speeches
    (each a list of text lines), in play order, after the merge rule; roles of any size.

    ``play`` is the file name without ``_gut_f.txt``; ``Speaker`` the longest spelling of
    the role's name (its first occurrence)."""
    root = Path(path)
    if not root.is_dir():
        raise FedrayError(f"{root}: First Folio directory not found")
    files = sorted(p for p in root.glob("*.txt") if p.is_file())
    if not files:
        raise FedrayError(f"{root}: no First Folio plays (*.txt files) found")
    roles: dict[str, list[list[str]]] = {}
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise FedrayError(f"{file}: not UTF-8 text ({e.reason} at byte {e.start})") from None
        except OSError as e:
            raise FedrayError(f"{file}: cannot read ({e.strerror or e})") from None
        speeches = parse_play(text)
        if not speeches:
            raise FedrayError(f"{file}: no speeches found (a speech starts with an indented "
                              f"speaker name and a period, e.g. '  Ham. A little more')")
        play = file.name.removesuffix(".txt").removesuffix("_gut_f")
        merged = merge_speakers(sp.speaker for sp in speeches)
        display: dict[str, str] = {}
        for sp in speeches:
            display.setdefault(speaker_key(sp.speaker), sp.speaker.strip())
        by_role: dict[str, list[list[str]]] = defaultdict(list)
        for sp in speeches:
            by_role[merged[speaker_key(sp.speaker)]].append(sp.lines)
        for key, speeches_of in by_role.items():
            roles[f"{play}/{display[key]}"] = speeches_of
    return roles


def split_speeches(n: int, test_fraction: float) -> int:
    """How many of a role's ``n`` speeches are its test data: its last
    ``max(1, floor(test_fraction * n))`` when it has at least two speeches (LEAF's per-role
    rule, on speeches), none otherwise or when ``test_fraction`` is 0."""
    if test_fraction <= 0 or n < 2:
        return 0
    return max(1, int(test_fraction * n))


def load_shakespeare_folio(path: str, test_fraction: float = DEFAULT_TEST_FRACTION) -> Dataset:
    """One client per role of the First Folio plays in ``path`` (``*.txt``, Project
    Gutenberg's transcriptions), with its own train and test sequences.

    - Speeches and roles: ``parse_play`` and the merge rule ``merge_speakers``; a role is a
      (play, merged speaker) pair.
    - A *line* is one printed text line of dialogue (as LEAF counts lines): a role is kept
      when its speeches hold at least ``MIN_LINES`` = 2 of them (seed 002, line 1080).
    - A *snippet* is one speech, its lines joined by single spaces (LEAF's text joins a
      role's lines with spaces too); it is tokenized as TFF tokenizes a snippet
      (``to_sequences``), so one sequence never mixes two speeches.
    - Split: deterministic and per role, by speech, in play order: the last
      ``split_speeches(n, test_fraction)`` speeches are the role's test data, the rest its
      train data (LEAF holds out each role's last lines the same way). A speech is never cut
      between the splits, and a role with one speech has no test data. No randomness, so
      no seed.
    """
    if not 0.0 <= test_fraction < 1.0:
        raise FedrayError(f"test_fraction must be in [0, 1), got {test_fraction}")
    roles = folio_roles(path)
    kept = [name for name in sorted(roles)
            if sum(len(lines) for lines in roles[name]) >= MIN_LINES]
    if not kept:
        raise FedrayError(f"{path}: no role has {MIN_LINES} lines of dialogue")
    snippets: list[str] = []
    group: list[int] = []  # 2 * role + (0 train, 1 test) of each snippet
    for r, name in enumerate(kept):
        speeches = roles[name]
        k = len(speeches) - split_speeches(len(speeches), test_fraction)
        snippets += [" ".join(lines) for lines in speeches]
        group += [2 * r] * k + [2 * r + 1] * (len(speeches) - k)
    x, y, source = _sequences(snippets)  # one pass over every speech
    of_row = np.asarray(group, dtype=np.int64)[source]
    bounds = np.searchsorted(of_row, np.arange(2 * len(kept) + 1))
    parts: list[list[tuple[str, np.ndarray, np.ndarray]]] = [[], []]
    for g in range(2 * len(kept)):
        rows = slice(bounds[g], bounds[g + 1])
        parts[g % 2].append((kept[g // 2], x[rows], y[rows]))
    return _dataset("shakespeare_folio", parts)
