"""Stack Overflow (fedray.data.sources.stackoverflow): TFF's h5 files and count files written
here in exactly TFF's layout (``examples/<user>/<field>``, byte strings, ``word count``
lines, a JSON tag count), the next-word ids and the tag bag of words by hand, one-line
errors, the two recipes built to stores, and one round of each task through fedray.run."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from fedray.data.recipe import build
from fedray.data.sources.loaders import LOADERS, SOURCE_OPTIONS
from fedray.data.sources.stackoverflow import (
    PAD,
    bag_of_words,
    index_of,
    load_tff_stackoverflow,
    num_tokens,
    read_tag_counts,
    read_word_counts,
    special_tokens,
    tag_labels,
    to_ids,
    users_per_item,
)
from fedray.data.store.reader import StoreSource
from fedray.data.store.verify import verify_store
from fedray.errors import FedrayError

ROOT = Path(__file__).resolve().parents[2]
NWP_RECIPE = ROOT / "partitions" / "stackoverflow_nwp.yaml"
TAG_RECIPE = ROOT / "partitions" / "stackoverflow_tag.yaml"

FIELDS = ("creation_date", "score", "tags", "title", "tokens", "type")


def _post(tokens: bytes, tags: bytes = b"python|numpy", title: bytes = b"a title") -> dict:
    return {"creation_date": b"2010-01-08 09:34:05 UTC", "score": 3, "tags": tags,
            "title": title, "tokens": tokens, "type": b"answer"}


def write_h5(path: Path, clients: dict[str, list[dict]], strings=None) -> None:
    """As TFF's stackoverflow_*.h5: examples/<user>/<field>, one row per post, the text
    fields variable-length byte strings and score int64."""
    kind = h5py.string_dtype(encoding="ascii") if strings is None else strings
    with h5py.File(path, "w") as f:
        for cid, posts in clients.items():
            for field in FIELDS:
                values = [p[field] for p in posts]
                if field == "score":
                    f.create_dataset(f"examples/{cid}/{field}",
                                     data=np.asarray(values, dtype=np.int64))
                else:
                    data = np.array(values, dtype=object if strings is None else strings)
                    f.create_dataset(f"examples/{cid}/{field}", data=data, dtype=kind)


TRAIN = {
    "00000001": [_post(b"how do i sort a list ?", b"python|sorting", b"sort a list"),
                 _post(b"use sorted ( ) .", b"python", b"sort a list")],
    "00000002": [_post(b"i use numpy to sort", b"numpy|python|sorting", b"numpy sort"),
                 _post(b"thanks .", b"numpy", b"numpy sort"),
                 _post(b"it works .", b"numpy", b"numpy sort")],
}
TEST = {
    "00000001": [_post(b"sort it again", b"python|java", b"again")],
    "00000003": [_post(b"only a test user", b"java", b"test only")],
}
WORDS = ["sort", ".", "i", "a", "list", "use", "numpy"]


@pytest.fixture
def so_dir(tmp_path) -> Path:
    d = tmp_path / "so"
    d.mkdir()
    write_h5(d / "stackoverflow_train.h5", TRAIN)
    write_h5(d / "stackoverflow_test.h5", TEST)
    (d / "stackoverflow.word_count").write_text(
        "".join(f"{w} {100 - i}\n" for i, w in enumerate(WORDS)))
    (d / "stackoverflow.tag_count").write_text(
        json.dumps({"sorting": 5, "python": 9, "numpy": 5, "java": 1}))
    return d


# --- vocabulary and tokenization -----------------------------------------------------------


def test_token_layout_is_tffs():
    # get_special_tokens(10000, 1): pad 0, oov [10001], bos 10002, eos 10003
    assert special_tokens(10_000) == {"pad": 0, "oov": 10_001, "bos": 10_002, "eos": 10_003}
    assert num_tokens(10_000) == 10_004  # create_recurrent_model's extended vocabulary


def test_count_files_in_tffs_formats(so_dir):
    assert read_word_counts(so_dir / "stackoverflow.word_count") == WORDS  # file order
    # by count, highest first; ties (sorting, numpy: 5) keep the JSON object's order
    assert read_tag_counts(so_dir / "stackoverflow.tag_count") == [
        "python", "sorting", "numpy", "java"]


def test_vocabulary_from_the_train_split_counts_users_and_breaks_ties_by_bytes():
    clients = [[b"b a a", b"c"], [b"a c"], [b"d"]]
    # a: 2 users, c: 2 users, b: 1, d: 1 (occurrences do not count; ties by bytes)
    assert users_per_item(clients, b" ") == [b"a", b"c", b"b", b"d"]
    assert users_per_item([[b"x|y"], [b"y"]], b"|") == [b"y", b"x"]


def test_to_ids_truncation_bos_eos_oov():
    vocab = index_of(WORDS, 7)  # sort 1, . 2, i 3, a 4, list 5, use 6, numpy 7
    sp = special_tokens(7)
    assert sp == {"pad": 0, "oov": 8, "bos": 9, "eos": 10}
    # short post: BOS, ids (OOV for unknown words), EOS, padding to 21
    np.testing.assert_array_equal(to_ids(b"i sort a tree", vocab, 7, 6),
                                  [9, 3, 1, 4, 8, 10, 0])
    # as many words as the length: cut there, no EOS (TFF appends it to shorter posts only)
    np.testing.assert_array_equal(to_ids(b"a a a a a a", vocab, 7, 6), [9, 4, 4, 4, 4, 4, 4])
    np.testing.assert_array_equal(to_ids(b"a a a a a a a a", vocab, 7, 6),
                                  [9, 4, 4, 4, 4, 4, 4])
    # split at each single space, as tf.strings.split(sep=' '): "a  a" has an empty word
    np.testing.assert_array_equal(to_ids(b"a  a", vocab, 7, 6), [9, 4, 8, 4, 10, 0, 0])


def test_bag_of_words_and_multi_hot_tags():
    vocab = index_of(WORDS, 7)
    x = bag_of_words([b"sort a list", b"sort sort", b""], [b"a tree", b"", b""], vocab, 7)
    # "sort a list a tree": 5 words, tree OOV (in the denominator, not a column)
    np.testing.assert_allclose(x[0], np.array([1, 0, 0, 2, 1, 0, 0]) / 5, rtol=1e-7)
    np.testing.assert_allclose(x[1], [1, 0, 0, 0, 0, 0, 0])
    assert x.dtype == np.float32 and not x[2].any()  # no words: zeros (TFF: NaN)
    tags = index_of(["python", "sorting", "numpy"], 2)  # the 2 most frequent tags
    y = tag_labels([b"numpy|sorting", b"python|python", b"", b"java"], tags, 2)
    np.testing.assert_array_equal(y, [[0, 1], [1, 0], [0, 0], [0, 0]])


# --- the loader ----------------------------------------------------------------------------


@pytest.mark.parametrize("strings", [None, "S30"])
def test_next_word_loader(so_dir, strings):
    if strings is not None:  # fixed-length byte strings read the same
        write_h5(so_dir / "stackoverflow_train.h5", TRAIN, strings)
    ds = load_tff_stackoverflow(str(so_dir), task="next_word", vocab_size=7,
                                sequence_length=4)
    assert ds.name == "tff_stackoverflow_next_word" and ds.num_classes == 11
    # owners: both files' users; 00000003 has test posts only
    assert ds.owners == ["00000001", "00000002", "00000003"]
    np.testing.assert_array_equal(ds.train.owner, [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(ds.test.owner, [0, 2])
    assert ds.train.x.dtype == np.uint16 and ds.train.y.dtype == np.int64
    # "how do i sort a list ?": BOS how(OOV) do(OOV) i sort | a list ? cut (no EOS)
    np.testing.assert_array_equal(ds.train.x[0], [9, 8, 8, 3])
    np.testing.assert_array_equal(ds.train.y[0], [8, 8, 3, 1])
    # "thanks .": BOS thanks(OOV) . EOS, padded; y is x shifted by one
    np.testing.assert_array_equal(ds.train.x[3], [9, 8, 2, 10])
    np.testing.assert_array_equal(ds.train.y[3], [8, 2, 10, PAD])
    np.testing.assert_array_equal(ds.test.y[1], [8, 4, 8, 8])  # "only a test user"


def test_max_client_examples_keeps_each_users_first_train_posts(so_dir):
    ds = load_tff_stackoverflow(str(so_dir), task="next_word", vocab_size=7,
                                max_client_examples=1)
    np.testing.assert_array_equal(ds.train.owner, [0, 1])
    np.testing.assert_array_equal(ds.test.owner, [0, 2])  # the test split is whole


def test_default_sizes_and_a_vocabulary_without_count_files(so_dir):
    (so_dir / "stackoverflow.word_count").unlink()
    (so_dir / "stackoverflow.tag_count").unlink()
    ds = load_tff_stackoverflow(str(so_dir), task="next_word")
    assert ds.num_classes == 10_004 and ds.train.x.shape == (5, 20)
    # from the train users' posts: the words of both users ('.', i, sort, use) first, then
    # the others by bytes ('(' < ')' < '?' < 'a' < ...), so "use sorted ( ) ." maps as below
    vocab = users_per_item([[p["tokens"] for p in posts] for posts in TRAIN.values()], b" ")
    assert vocab[:6] == [b".", b"i", b"sort", b"use", b"(", b")"]
    ids = {w: i + 1 for i, w in enumerate(vocab)}
    np.testing.assert_array_equal(ds.train.x[1][:6], [10_002] + [ids[w] for w in
                                  b"use sorted ( ) .".split()])
    tag = load_tff_stackoverflow(str(so_dir), task="tag", vocab_size=7, num_tags=2)
    # tags by train users: numpy 1, python 2, sorting 2 -> python, sorting
    np.testing.assert_array_equal(tag.train.y[2], [1, 1])  # numpy|python|sorting
    np.testing.assert_array_equal(tag.train.y[3], [0, 0])  # numpy: not among the two


def test_tag_loader(so_dir):
    ds = load_tff_stackoverflow(str(so_dir), task="tag", vocab_size=7, num_tags=3)
    assert ds.name == "tff_stackoverflow_tag" and ds.num_classes == 3
    assert ds.train.x.shape == (5, 7) and ds.train.x.dtype == np.float32
    assert ds.train.y.shape == (5, 3) and ds.train.y.dtype == np.int64
    # "how do i sort a list ?" + " " + "sort a list": 10 words; i 1, sort 2, a 2, list 2
    np.testing.assert_allclose(ds.train.x[0], np.array([2, 0, 1, 2, 2, 0, 0]) / 10,
                               rtol=1e-7)
    # tag vocabulary python, sorting, numpy (the tag_count file's order)
    np.testing.assert_array_equal(ds.train.y[0], [1, 1, 0])  # python|sorting
    np.testing.assert_array_equal(ds.train.y[2], [1, 1, 1])  # numpy|python|sorting
    np.testing.assert_array_equal(ds.test.y, [[1, 0, 0], [0, 0, 0]])  # java dropped


# --- errors --------------------------------------------------------------------------------


def _broken(d: Path, case: str) -> None:
    train = d / "stackoverflow_train.h5"
    if case == "missing_field":
        with h5py.File(train, "a") as f:
            del f["examples/00000002/tokens"]
    elif case == "numbers":
        with h5py.File(train, "a") as f:
            del f["examples/00000002/tokens"]
            f.create_dataset("examples/00000002/tokens", data=np.zeros(3))
    elif case == "lengths":
        with h5py.File(train, "a") as f:
            del f["examples/00000002/title"]
            f.create_dataset("examples/00000002/title", data=np.array([b"x"], dtype=object),
                             dtype=h5py.string_dtype(encoding="ascii"))
    elif case == "missing_test":
        (d / "stackoverflow_test.h5").unlink()
    elif case == "not_h5":
        train.write_bytes(b"not hdf5")
    elif case == "word_fields":
        (d / "stackoverflow.word_count").write_text("sort 3\nthe 2 extra\n")
    elif case == "word_count_value":
        (d / "stackoverflow.word_count").write_text("sort 3\nthe many\n")
    elif case == "word_twice":
        (d / "stackoverflow.word_count").write_text("sort 3\nsort 2\n")
    elif case == "tag_json":
        (d / "stackoverflow.tag_count").write_text("{\"python\": 3,")
    elif case == "tag_value":
        (d / "stackoverflow.tag_count").write_text(json.dumps({"python": "many"}))
    elif case == "tag_list":
        (d / "stackoverflow.tag_count").write_text(json.dumps(["python"]))


@pytest.mark.parametrize("case, task, pattern", [
    ("missing_field", "next_word",
     r"stackoverflow_train\.h5: missing key 'examples/00000002/tokens'"),
    ("numbers", "next_word", r"stackoverflow_train\.h5: 'examples/00000002/tokens' must be a "
                             r"1-d dataset of byte strings \(got float64 \(3,\)\)"),
    ("lengths", "tag", r"stackoverflow_train\.h5: client '00000002' has different lengths "
                       r"\(tokens 3, title 1, tags 3\)"),
    ("missing_test", "next_word", r"stackoverflow_test\.h5: file not found"),
    ("not_h5", "next_word", r"stackoverflow_train\.h5: not a readable HDF5 file"),
    ("word_fields", "next_word",
     r"stackoverflow\.word_count: line 2: expected 'word count', got 3 fields"),
    ("word_count_value", "tag",
     r"stackoverflow\.word_count: line 2: count 'many' of word 'the' is not an integer"),
    ("word_twice", "next_word", r"stackoverflow\.word_count: line 2: word 'sort' is listed "
                                r"twice"),
    ("tag_json", "tag", r"stackoverflow\.tag_count: not JSON \("),
    ("tag_value", "tag", r"stackoverflow\.tag_count: count of tag 'python' must be an "
                         r"integer >= 0, got 'many'"),
    ("tag_list", "tag", r"stackoverflow\.tag_count: must be a non-empty JSON object"),
])
def test_malformed_inputs_are_one_line_errors(so_dir, case, task, pattern):
    _broken(so_dir, case)
    with pytest.raises(FedrayError, match=pattern) as err:
        load_tff_stackoverflow(str(so_dir), task=task, vocab_size=7, num_tags=3)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("options, pattern", [
    ({}, r"source\.task': must be one of: next_word, tag, got None"),
    ({"task": "words"}, r"source\.task': must be one of: next_word, tag, got 'words'"),
    ({"task": "tag", "num_tags": 1}, r"source\.num_tags': must be an integer >= 2"),
    ({"task": "next_word", "vocab_size": 0}, r"source\.vocab_size': must be an integer >= 1"),
    ({"task": "next_word", "max_client_examples": 0},
     r"source\.max_client_examples': must be an integer >= 1"),
])
def test_bad_options(so_dir, options, pattern):
    with pytest.raises(FedrayError, match=pattern):
        load_tff_stackoverflow(str(so_dir), **options)


def test_source_is_registered_with_its_keys():
    assert LOADERS["tff_stackoverflow"] is load_tff_stackoverflow
    assert SOURCE_OPTIONS["tff_stackoverflow"] == (
        "task", "vocab_size", "num_tags", "sequence_length", "max_client_examples")


# --- recipes, stores, one round of each task -----------------------------------------------


@pytest.fixture
def stores(so_dir, tmp_path) -> dict[str, Path]:
    nwp, manifest = build(NWP_RECIPE, [f"source.path={so_dir}", "source.vocab_size=7",
                                       "source.sequence_length=4",
                                       f"out={tmp_path / 'nwp'}"])
    assert manifest["label_shape"] == [4] and manifest["input_shape"] == [4]
    assert manifest["dtype"] == "uint16" and manifest["num_classes"] == 11
    tag, manifest = build(TAG_RECIPE, [f"source.path={so_dir}", "source.vocab_size=7",
                                       "source.num_tags=3", f"out={tmp_path / 'tag'}"])
    assert manifest["label_shape"] == [3] and manifest["input_shape"] == [7]
    assert manifest["dtype"] == "float32" and manifest["num_classes"] == 3
    return {"nwp": Path(nwp), "tag": Path(tag)}


def test_recipes_build_stores_of_the_train_users(stores, so_dir):
    for store in stores.values():
        verify_store(str(store))
        src = StoreSource(str(store))
        assert src.population == 2  # 00000003 (test posts only) left out: min_examples 1
        assert src.client(0)[1].shape[0] == 2 and src.client(1)[1].shape[0] == 3
    ds = load_tff_stackoverflow(str(so_dir), task="tag", vocab_size=7, num_tags=3)
    x, y = StoreSource(str(stores["tag"])).client(0)
    # the store keeps the bag of words and the multi-hot vector per example as read
    rows = {tuple(r) for r in np.concatenate([ds.train.x[:2], ds.train.y[:2]], 1).tolist()}
    assert {tuple(r) for r in np.concatenate([x, y], 1).tolist()} == rows
    with pytest.raises(FedrayError, match=r"source\.max_client_examples': is read by "
                                          r"source tff_stackoverflow only, not 'mnist'"):
        build(NWP_RECIPE, ["source.name=mnist", f"source.path={so_dir}",
                           f"out={so_dir / 'x'}"])


@pytest.mark.parametrize("task", ["nwp", "tag"])
def test_one_round_of_each_task(stores, tmp_path, task):
    """fedray.run (in-process) trains the task's model one round on its store, with the
    job file's model and loss; evaluation is on the two clients' own test posts."""
    import fedray
    from fedray.config import load_config

    job = load_config(ROOT / "jobs" / "stackoverflow" / f"{task}.yaml")
    config = {"name": f"so_{task}", "seed": 0, "rounds": 1,
              "data": {"partition": str(stores[task])},
              "model": {"name": job.model.name, "loss": job.model.loss},
              "client": {"lr": 0.5, "batch_size": 2, "local_epochs": 1},
              "sampling": {"clients_per_round": 2},
              "eval": {"every": 1, "central": False, "federated_clients": 2},
              "runtime": {"backend": "inline", "num_workers": 1},
              "checkpoint": {"every": 0},
              "output": {"dir": str(tmp_path / "run"), "tensorboard": False}}
    result = fedray.run(config)
    last = result.metrics[-1]
    assert np.isfinite(last["train_loss"]) and np.isfinite(last["fed_test_loss"])
    assert 0.0 <= last["fed_test_accuracy"] <= 1.0
