"""Shakespeare (fedray.data.sources.shakespeare): TFF's 90-token layout, the tokenizer, the three
sources (LEAF JSON and TFF h5 written here in exactly their formats; the real First Folio
plays from shared/data), the speaker merge rule, the split, one-line errors, the store and a
two-round run of the character LSTM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from fedray.core.losses import SEQUENCE_PAD
from fedray.data.recipe import build
from fedray.data.sources.loaders import LOADERS
from fedray.data.sources.shakespeare import (
    BOS,
    CHAR_VOCAB,
    EOS,
    MIN_LINES,
    OOV,
    PAD,
    SEQUENCE_LENGTH,
    VOCAB_SIZE,
    char_ids,
    decode,
    load_leaf_shakespeare,
    load_shakespeare_folio,
    load_tff_shakespeare,
    merge_speakers,
    parse_play,
    split_speeches,
    to_ids,
    to_sequences,
    unigram_accuracy,
)
from fedray.data.store.describe import describe
from fedray.data.store.reader import StoreSource
from fedray.data.store.verify import verify_store
from fedray.errors import FedrayError

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "partitions" / "shakespeare.yaml"

# --- vocabulary and tokenizer ------------------------------------------------------------


def test_vocabulary_is_tffs_90_token_layout():
    assert len(CHAR_VOCAB) == 86 and len(set(CHAR_VOCAB)) == 86
    assert (PAD, OOV, BOS, EOS, VOCAB_SIZE) == (0, 87, 88, 89, 90)
    assert SEQUENCE_PAD == PAD  # the loss leaves out the tokenizer's padding
    assert CHAR_VOCAB[:6] == "dhlptx" and CHAR_VOCAB[-1] == "\r"  # TFF's order
    ids = char_ids(CHAR_VOCAB)
    np.testing.assert_array_equal(ids, np.arange(1, 87))  # id = position + 1
    assert int(char_ids("~")[0]) == OOV  # '~' is not in the vocabulary


def test_tokenizer_round_trip_and_oov():
    text = "To be, or not to be: that is the Question:\n"
    ids = to_ids(text)
    assert ids[0] == BOS and ids[-1] == EOS and len(ids) == len(text) + 2
    assert decode(ids) == text
    np.testing.assert_array_equal(to_ids(text.encode()), ids)  # str and bytes agree on ASCII
    # outside the vocabulary: one OOV per character (str), one per UTF-8 byte (bytes, as TFF)
    np.testing.assert_array_equal(char_ids("é~"), [OOV, OOV])
    np.testing.assert_array_equal(char_ids("é".encode()), [OOV, OOV])
    assert decode(to_ids("a~b")) == "a\ufffdb"


def test_sequences_are_tffs_81_id_rows_shifted_by_one():
    text = "x" * 100  # BOS + 100 + EOS = 102 ids: two rows of 81, the second padded
    x, y = to_sequences(text)
    assert x.shape == y.shape == (2, SEQUENCE_LENGTH) and x.dtype == y.dtype == np.int64
    ids = np.zeros(162, dtype=np.int64)
    ids[:102] = to_ids(text)
    np.testing.assert_array_equal(x, [ids[0:80], ids[81:161]])
    np.testing.assert_array_equal(y, [ids[1:81], ids[82:162]])
    assert y[1, 19] == EOS and (y[1, 20:] == PAD).all() and (x[1, 21:] == PAD).all()
    # 80 characters: the second row would hold only EOS as input and nothing to predict
    x, y = to_sequences("y" * 80)
    assert x.shape == (1, 80) and x[0, 0] == BOS and (y[0] != PAD).all()
    x, y = to_sequences("")
    np.testing.assert_array_equal(x, [[BOS, EOS] + [PAD] * 78])
    np.testing.assert_array_equal(y, [[EOS] + [PAD] * 79])


def test_unigram_baseline():
    train = np.array([[1, 1, 2, 0], [1, 3, 0, 0]])  # 1 is the most frequent non-pad target
    test = np.array([[1, 2, 0, 0], [1, 1, 3, 0]])  # 3 of its 5 non-pad positions are 1
    token, acc = unigram_accuracy(train, test)
    assert token == 1 and acc == pytest.approx(3 / 5)


# --- LEAF JSON -----------------------------------------------------------------------------

LINE = "Now is the winter of our discontent, made glorious summer by this sun of York; and"


def _windows(text: str, n: int) -> tuple[list[str], list[str]]:
    """LEAF's samples: 80-character windows of ``text`` and the character after each."""
    return [text[i:i + 80] for i in range(n)], [text[i + 80] for i in range(n)]


def _leaf_doc(users: dict[str, tuple[list, list]], counts: dict | None = None) -> dict:
    counts = counts or {}
    return {"users": list(users), "hierarchies": ["THE_PLAY"] * len(users),
            "num_samples": [counts.get(u, len(y)) for u, (_, y) in users.items()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}


def _write_leaf(root: Path, train: dict, test: dict) -> str:
    for split, doc in (("train", train), ("test", test)):
        (root / split).mkdir(parents=True, exist_ok=True)
        (root / split / f"all_data_niid_0_keep_0_{split}_9.json").write_text(json.dumps(doc))
    return str(root)


def test_leaf_json_loader(tmp_path):
    text = LINE * 2
    train = _leaf_doc({"RICHARD": _windows(text, 3), "ANNE": _windows(text[5:], 2)})
    test = _leaf_doc({"RICHARD": _windows(text[40:], 1), "CLARENCE": _windows(text, 1)})
    ds = load_leaf_shakespeare(_write_leaf(tmp_path, train, test))
    assert ds.name == "leaf_shakespeare" and ds.num_classes == VOCAB_SIZE
    assert ds.owners == ["ANNE", "CLARENCE", "RICHARD"]
    np.testing.assert_array_equal(ds.train.owner, [0, 0, 2, 2, 2])  # users sorted
    np.testing.assert_array_equal(ds.test.owner, [1, 2])
    assert ds.train.x.shape == ds.train.y.shape == (5, 80) and ds.input_shape == (80,)
    # RICHARD's second sample: input = its window, target = the window shifted by one + y
    np.testing.assert_array_equal(ds.train.x[3], char_ids(text[1:81]))
    np.testing.assert_array_equal(ds.train.y[3], char_ids(text[2:82]))
    assert (ds.train.y != PAD).all()  # LEAF's windows carry no BOS, EOS or padding


@pytest.mark.parametrize("case, pattern", [
    ("count", r"train_9\.json: user 'A': num_samples says 3 but x has 2 samples and y has 2"),
    ("short", r"train_9\.json: user 'A': sample 1: x must be a string of 80 characters, "
              r"got 79 characters"),
    ("y", r"train_9\.json: user 'A': sample 0: y must be one character, got 'ab'"),
    ("users", r"train_9\.json: user_data has user 'B' that is not in users"),
])
def test_leaf_json_errors_are_one_line(tmp_path, case, pattern):
    x, y = _windows(LINE * 2, 2)
    doc = _leaf_doc({"A": (x, y)}, counts={"A": 3} if case == "count" else None)
    if case == "short":
        doc["user_data"]["A"]["x"][1] = x[1][:79]
    if case == "y":
        doc["user_data"]["A"]["y"][0] = "ab"
    if case == "users":
        doc["user_data"]["B"] = {"x": x, "y": y}
    _write_leaf(tmp_path, doc, _leaf_doc({"A": (x, y)}))
    with pytest.raises(FedrayError, match=pattern) as err:
        load_leaf_shakespeare(str(tmp_path))
    assert "\n" not in str(err.value)


def test_leaf_json_missing_directory(tmp_path):
    with pytest.raises(FedrayError, match=r"train: LEAF train/ directory not found"):
        load_leaf_shakespeare(str(tmp_path))


# --- TFF h5 --------------------------------------------------------------------------------


def _write_tff(path: Path, clients: dict[str, list[bytes]]) -> None:
    """As TFF's shakespeare_*.h5: examples/<client>/snippets, variable-length byte strings."""
    with h5py.File(path, "w") as f:
        for cid, snippets in clients.items():
            f.create_dataset(f"examples/{cid}/snippets", data=np.array(snippets, dtype=object),
                             dtype=h5py.vlen_dtype(bytes))


def test_tff_h5_loader(tmp_path):
    _write_tff(tmp_path / "shakespeare_train.h5", {
        "THE_TRAGEDY_OF_KING_LEAR_KING": [b"Meantime we shall expresse our darker purpose.",
                                          LINE.encode() * 2],
        "ALLS_WELL_THAT_ENDS_WELL_HELENA": [b"I do affect a sorrow indeed"]})
    _write_tff(tmp_path / "shakespeare_test.h5", {
        "THE_TRAGEDY_OF_KING_LEAR_KING": [b"Nothing will come of nothing, speake againe."]})
    ds = load_tff_shakespeare(str(tmp_path))
    assert ds.name == "tff_shakespeare" and ds.num_classes == 90
    assert ds.owners == ["ALLS_WELL_THAT_ENDS_WELL_HELENA", "THE_TRAGEDY_OF_KING_LEAR_KING"]
    # HELENA's snippet is one row; LEAR's two are 1 + 3 rows (164 characters + BOS + EOS)
    np.testing.assert_array_equal(ds.train.owner, [0, 1, 1, 1, 1])
    np.testing.assert_array_equal(ds.test.owner, [1])
    np.testing.assert_array_equal(ds.train.x[1], to_sequences(
        b"Meantime we shall expresse our darker purpose.")[0][0])
    row = ds.test.y[0]
    assert decode(row) == "Nothing will come of nothing, speake againe."
    assert row[len("Nothing will come of nothing, speake againe.")] == EOS


@pytest.mark.parametrize("case, pattern", [
    ("no_examples", r"shakespeare_train\.h5: missing key 'examples'"),
    ("no_snippets", r"shakespeare_train\.h5: missing key 'examples/A/snippets'"),
    ("numbers", r"shakespeare_train\.h5: 'examples/A/snippets' must be a 1-d dataset of "
                r"strings"),
    ("missing_test", r"shakespeare_test\.h5: file not found"),
])
def test_tff_h5_errors_are_one_line(tmp_path, case, pattern):
    train = tmp_path / "shakespeare_train.h5"
    if case == "no_examples":
        with h5py.File(train, "w") as f:
            f.create_group("other")
    elif case == "no_snippets":
        with h5py.File(train, "w") as f:
            f.create_dataset("examples/A/text", data=np.zeros(2))
    elif case == "numbers":
        with h5py.File(train, "w") as f:
            f.create_dataset("examples/A/snippets", data=np.zeros(2))
    else:
        _write_tff(train, {"A": [b"ok"]})
    if case != "missing_test":
        _write_tff(tmp_path / "shakespeare_test.h5", {"A": [b"ok"]})
    with pytest.raises(FedrayError, match=pattern) as err:
        load_tff_shakespeare(str(tmp_path))
    assert "\n" not in str(err.value)


# --- First Folio ---------------------------------------------------------------------------

PLAY = """The Tragedie of Tests

Actus Primus. Scoena Prima.

Enter Barnardo and Francisco two
Centinels.

  Barnardo. Who's there?
  Fran. Nay answer me: Stand & vnfold
your selfe

   Bar. Long liue the King
   Barn. He
Enter the Ghost.

Looke where it comes againe
   Lor. I am ambiguous
   Lord. A lord speakes
   Lorenzo. And Lorenzo
   Hor. Tush
   Hora. tush
   Horatio. 'twill not appeare
   Mes. One line only
Exeunt.

Scena Secunda.

After a heading, nobody speakes this.
   S.Dro. A speaker with a period in the name. Two sentences.
   Watch 1. And one with a number

FINIS. The Tragedie of Tests.
  Ham. Never read
"""


def test_parse_play_speeches_directions_and_headings():
    speeches = parse_play(PLAY)
    got = [(s.speaker, s.lines) for s in speeches]
    assert got[:4] == [
        ("Barnardo", ["Who's there?"]),
        ("Fran", ["Nay answer me: Stand & vnfold", "your selfe"]),
        ("Bar", ["Long liue the King"]),
        # a stage direction inside a speech is skipped; the speech goes on after it
        ("Barn", ["He", "Looke where it comes againe"]),
    ]
    assert ("S.Dro", ["A speaker with a period in the name. Two sentences."]) in got
    assert ("Watch 1", ["And one with a number"]) in got
    text = " ".join(line for _, lines in got for line in lines)
    for skipped in ("Centinels", "Ghost", "nobody", "Never read", "Tragedie"):
        assert skipped not in text  # directions, text after a heading, after FINIS, title


def test_merge_rule_prefixes_on_one_chain_merge_branches_stay():
    merged = merge_speakers(["Bar", "Barn", "Barnardo", "Hor", "Hora", "Horatio", "Lor",
                             "Lord", "Lorenzo", "Fran", "S.Dro", "S. Dromio"])
    assert merged["bar"] == merged["barn"] == merged["barnardo"] == "barnardo"
    assert merged["hor"] == merged["hora"] == "horatio"  # hora is itself a prefix of horatio
    assert merged["lor"] == "lor"  # a prefix of both lord and lorenzo: ambiguous, kept apart
    assert merged["lord"] == "lord" and merged["lorenzo"] == "lorenzo"
    assert merged["fran"] == "fran"  # nothing extends it
    assert merged["s dro"] == "s dromio"  # periods and spaces compare as one space


def test_folio_loader_roles_lines_and_split(tmp_path):
    (tmp_path / "tests_gut_f.txt").write_text(PLAY)
    ds = load_shakespeare_folio(str(tmp_path))
    # Mes. and the others with one line are dropped (MIN_LINES = 2 printed lines)
    assert MIN_LINES == 2
    assert ds.owners == ["tests/Barnardo", "tests/Fran", "tests/Horatio"]
    # Barnardo: 3 speeches (4 lines) -> 2 train, 1 test; Fran: 1 speech -> train only;
    # Horatio: 3 speeches of one line each -> 2 train, 1 test
    np.testing.assert_array_equal(ds.train.owner, [0, 0, 1, 2, 2])
    np.testing.assert_array_equal(ds.test.owner, [0, 2])
    assert decode(ds.train.x[2]) == "Nay answer me: Stand & vnfold your selfe"  # one space
    assert decode(ds.test.x[0]) == "He Looke where it comes againe"  # Barnardo's last speech
    assert ds.train.x.dtype == np.uint8 and ds.train.y.dtype == np.int64
    none = load_shakespeare_folio(str(tmp_path), test_fraction=0.0)
    assert len(none.test) == 0 and len(none.train) == 7


def test_split_rule():
    assert [split_speeches(n, 0.2) for n in (1, 2, 4, 5, 9, 10, 11)] == [0, 1, 1, 1, 1, 2, 2]
    assert split_speeches(10, 0.0) == 0


def test_folio_errors_are_one_line(tmp_path):
    with pytest.raises(FedrayError, match=r"nowhere: First Folio directory not found"):
        load_shakespeare_folio(str(tmp_path / "nowhere"))
    with pytest.raises(FedrayError, match=r"no First Folio plays \(\*\.txt files\) found"):
        load_shakespeare_folio(str(tmp_path))
    (tmp_path / "empty_gut_f.txt").write_text("A Title\n\nNo speeches here at all.\n")
    with pytest.raises(FedrayError, match=r"empty_gut_f\.txt: no speeches found"):
        load_shakespeare_folio(str(tmp_path))
    (tmp_path / "empty_gut_f.txt").write_bytes(b"Title\n\n  Ham. caf\xe9\n")
    with pytest.raises(FedrayError, match=r"empty_gut_f\.txt: not UTF-8 text") as err:
        load_shakespeare_folio(str(tmp_path))
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def folio(shared_data) -> Path:
    return shared_data / "shakespeare-first-folio"


def test_folio_real_plays(folio):
    """The numbers docs/partitions.md reports for the 35 plays."""
    ds = load_shakespeare_folio(str(folio))
    assert len(ds.owners) == 1351 and len(ds.train) == 50_436 and len(ds.test) == 12_481
    # Hamlet's guard, printed "Barnardo.", "Bar." and "Barn.", is one role
    assert "hamlet/Barnardo" in ds.owners
    assert not {"hamlet/Bar", "hamlet/Barn"} & set(ds.owners)
    assert "henry_vi_part_1/Exet" in ds.owners  # Exeter, not a stage direction
    y = np.concatenate([ds.train.y, ds.test.y])
    assert y.max() < VOCAB_SIZE and (np.bincount(y.reshape(-1), minlength=90)[OOV] < 100)


# --- recipe, store, run --------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_store(folio, tmp_path_factory) -> Path:
    """A store of the shortest play, built with partitions/shakespeare.yaml."""
    base = tmp_path_factory.mktemp("shakespeare")
    plays = base / "plays"
    plays.mkdir()
    for name in ("comedy_of_errours_gut_f.txt",):
        shutil.copy(folio / name, plays / name)
    out, manifest = build(RECIPE, [f"source.path={plays}", f"out={base / 'store'}"])
    assert manifest["label_shape"] == [80] and manifest["input_shape"] == [80]
    return Path(out)


def test_store_holds_token_sequences(small_store):
    verify_store(str(small_store))
    report = describe(str(small_store), verify=False)
    assert "labels:       80 per example (a target sequence)" in report
    src = StoreSource(str(small_store))
    assert src.num_classes == 90 and src.input_shape == (80,) and src.label_shape == (80,)
    x, y = src.client(0)
    assert x.shape == y.shape == (len(y), 80) and y.dtype == np.int64
    assert x.dtype == np.float32 and x.max() < 90  # token ids, as floats for the model
    hist = src.index.histograms("train")  # every position's target token counts
    assert hist.shape == (src.population, 90)
    np.testing.assert_array_equal(hist[0], np.bincount(y.reshape(-1), minlength=90))


def test_class_partitioners_refuse_sequence_labels(folio, tmp_path):
    plays = tmp_path / "plays"
    plays.mkdir()
    shutil.copy(folio / "macbeth_gut_f.txt", plays)
    with pytest.raises(FedrayError, match=r"recipe key 'partitioner.name': .* cannot split by "
                                          r"class; use one of: natural, iid"):
        build(RECIPE, [f"source.path={plays}", f"out={tmp_path / 's'}",
                       "partitioner.name=dirichlet", "partitioner.num_clients=5",
                       "partitioner.alpha=0.5"])
    assert not (tmp_path / "s").exists()


def test_sources_are_registered():
    assert {"leaf_shakespeare", "tff_shakespeare", "shakespeare_folio"} <= set(LOADERS)


def test_two_rounds_of_the_lstm_count_accuracy_over_characters(small_store, tmp_path):
    """fedray.run (in-process) trains the LSTM on the store; its test accuracy is the share
    of correct predictions among the central test set's non-padding positions."""
    import torch

    import fedray
    from fedray.core.models import build_model

    job = {"name": "shakespeare_tiny", "seed": 0, "rounds": 2,
           "data": {"partition": str(small_store)},
           "model": {"name": "shakespeare_lstm", "loss": "sequence_cross_entropy"},
           "client": {"lr": 1.0, "batch_size": 4, "local_steps": 2},
           "sampling": {"clients_per_round": 2},
           "eval": {"every": 0, "batch_size": 512},
           "runtime": {"backend": "inline", "num_workers": 1},
           "checkpoint": {"every": 0},
           "output": {"dir": str(tmp_path / "run"), "tensorboard": False}}
    result = fedray.run(job)
    last = result.metrics[-1]
    assert all(np.isfinite(m["train_loss"]) for m in result.metrics)
    assert np.isfinite(last["test_loss"]) and 0.0 < last["test_accuracy"] < 1.0
    x, y = StoreSource(str(small_store)).central_test()
    model = build_model("shakespeare_lstm", (80,), 90)
    model.load_state_dict(result.weights)
    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(x)).argmax(-1).numpy()
    counted = y != PAD
    assert last["test_accuracy"] == pytest.approx((pred == y)[counted].mean(), abs=1e-9)
