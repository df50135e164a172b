"""LEAF Sent140 (fedray.data.sources.leaf_sent140): LEAF's JSON written as its
data_to_json.py and split_data.py write it, LEAF's tokenisation and id layout, the two
vocabulary file layouts, one-line errors, a recipe build and a training round of the LSTM."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedray.core.models import build_model
from fedray.data.recipe import build
from fedray.data.sources.leaf_sent140 import MAX_WORDS, load_leaf_sent140, tokenize
from fedray.data.sources.leaf_text import most_frequent, read_vocab_file, split_line
from fedray.data.store.reader import StoreSource
from fedray.errors import FedrayError
from tests.data.leaf_files import leaf_doc, write_split

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "partitions" / "leaf_sent140.yaml"


def record(text: str, user: str = "bob", i: int = 0) -> list[str]:
    """A LEAF Sent140 x row: the CSV row without its polarity, plus combine_data.py's tag."""
    return [str(1467810369 + i), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", user, text,
            "training"]


TWEETS = {
    "alice": (["I love it !", "so sad today", "love love love"], [1, 0, 1]),
    "bob": (["Can't wait, really", "sad sad"], [1, 0]),
}


def _files(root: Path, train=None, test=None) -> str:
    def doc(users):
        return leaf_doc({u: ([record(t, u, i) for i, t in enumerate(x)], y)
                         for u, (x, y) in users.items()})
    return write_split(root, doc(train or TWEETS), doc(test or {"alice": (["love it"], [1])}))


def test_split_line_is_leafs():
    assert split_line("Can't wait!!  see you @bob, ok?") == \
        ["Can't", "wait", "!", "!", "see", "you", "bob", ",", "ok", "?"]
    assert split_line("Hello-World") == ["Hello", "World"]  # '-' separates, case kept
    assert split_line("♥♥") == []


def test_tokenize_cuts_at_25_words_and_pads_with_the_oov_id():
    index = {"a": 0, "b": 1}
    assert tokenize("a c b", index, 2) == [0, 2, 1] + [2] * 22
    assert tokenize(" ".join(["a"] * 30), index, 2) == [0] * MAX_WORDS


def test_most_frequent_breaks_ties_by_word():
    from collections import Counter
    assert most_frequent(Counter({"b": 2, "a": 2, "c": 3, "d": 1}), 3) == ["c", "a", "b"]


def test_loader_builds_the_vocabulary_from_train(tmp_path):
    ds = load_leaf_sent140(_files(tmp_path), vocab_size=3)
    # train words: love x4, sad x3, then ties of 1 by word: '!' < 'Can't' < ...
    assert ds.name == "leaf_sent140" and ds.num_classes == 2
    assert ds.owners == ["alice", "bob"] and ds.input_shape == (MAX_WORDS,)
    assert ds.train.x.dtype == np.uint16
    np.testing.assert_array_equal(ds.train.y, [1, 0, 1, 1, 0])
    np.testing.assert_array_equal(ds.train.owner, [0, 0, 0, 1, 1])
    # vocabulary: love 0, sad 1, '!' 2; OOV and padding 3
    assert ds.train.x[0].tolist() == [3, 0, 3, 2] + [3] * 21  # "I love it !": I, it OOV
    assert ds.train.x[2].tolist()[:4] == [0, 0, 0, 3]
    assert ds.test.x[0].tolist()[:2] == [0, 3]


def test_vocab_files_one_word_per_line_and_glove(tmp_path):
    root = _files(tmp_path / "data")
    plain = tmp_path / "words.txt"
    plain.write_text("love\nsad\nI\n")
    glove = tmp_path / "glove.txt"
    glove.write_text("love 0.1 -0.2 0.3\nsad 1e-3 2 3\nI 0 0 0\n")  # GloVe: word v1 .. vd
    a, b = load_leaf_sent140(root, vocab=str(plain)), load_leaf_sent140(root, vocab=str(glove))
    np.testing.assert_array_equal(a.train.x, b.train.x)
    assert a.train.x[0].tolist()[:4] == [2, 0, 3, 3]  # I love it ! -> 2 0 OOV OOV
    assert read_vocab_file(glove) == ["love", "sad", "I"]


@pytest.mark.parametrize("content, pattern", [
    ("a\n\nb\n", r"line 2: empty line"),
    ("a\nb\na\n", r"line 3: word 'a' already on line 1"),
    ("a 0.1\nb\n", r"line 2: a word and its vector on every line, as on line 1"),
    (b"a\n\xff\n", r"vocabulary is not UTF-8 text"),
])
def test_vocab_file_errors(tmp_path, content, pattern):
    file = tmp_path / "v.txt"
    file.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(FedrayError, match=pattern) as err:
        load_leaf_sent140(_files(tmp_path / "data"), vocab=str(file))
    assert str(file) in str(err.value) and "\n" not in str(err.value)


def test_missing_vocab_file_names_the_key(tmp_path):
    with pytest.raises(FedrayError, match=r"recipe key 'source.vocab': cannot read"):
        load_leaf_sent140(_files(tmp_path), vocab=str(tmp_path / "nope.txt"))


def _broken(case: str) -> dict:
    doc = leaf_doc({"alice": ([record("good day"), record("bad day")], [1, 0])})
    entry = doc["user_data"]["alice"]
    if case == "missing key":
        del doc["num_samples"]
    elif case == "count":
        doc["num_samples"] = [3]
    elif case == "x type":
        entry["x"] = "good day"
    elif case == "short record":
        entry["x"][1] = ["1", "date", "NO_QUERY", "alice"]
    elif case == "text type":
        entry["x"][1][4] = 7
    elif case == "empty text":
        entry["x"][0][4] = "   "
    elif case == "label":
        entry["y"][1] = 4
    elif case == "bool label":
        entry["y"][1] = True
    elif case == "entry":
        entry.pop("y")
    return doc


@pytest.mark.parametrize("case, pattern", [
    ("missing key", r"train_9\.json: missing key 'num_samples'"),
    ("count", r"train_9\.json: user 'alice': num_samples says 3 but x has 2 records"),
    ("x type", r"train_9\.json: user 'alice': x must be a list of tweet records"),
    ("short record", r"train_9\.json: user 'alice': sample 1: x must be a record \[id, date, "
                     r"query, user, text, \.\.\.\] \(got a list of 4 fields\)"),
    ("text type", r"train_9\.json: user 'alice': sample 1: x\[4\], the text, must be a string"),
    ("empty text", r"train_9\.json: user 'alice': sample 0: x\[4\], the text, is empty"),
    ("label", r"train_9\.json: user 'alice': sample 1: y must be 0 or 1 \(got 4\)"),
    ("bool label", r"train_9\.json: user 'alice': sample 1: y must be 0 or 1 \(got True\)"),
    ("entry", r"train_9\.json: user 'alice': user_data entry with 'x' and 'y' is missing"),
])
def test_malformed_files_give_one_line_errors(tmp_path, case, pattern):
    write_split(tmp_path, _broken(case), leaf_doc({"alice": ([record("ok")], [1])}))
    with pytest.raises(FedrayError, match=pattern) as err:
        load_leaf_sent140(str(tmp_path))
    assert "\n" not in str(err.value)


def test_vocab_size_is_checked(tmp_path):
    with pytest.raises(FedrayError, match=r"recipe key 'source.vocab_size': must be an "
                                          r"integer >= 1, got 0"):
        load_leaf_sent140(_files(tmp_path), vocab_size=0)


def test_recipe_builds_a_store_and_the_lstm_trains_on_it(tmp_path):
    import fedray

    root = _files(tmp_path / "data")
    out, manifest = build(RECIPE, [f"source.path={root}", f"out={tmp_path / 'store'}",
                                   "source.vocab_size=49"])  # + the OOV id: 50 ids
    assert manifest["input_shape"] == [MAX_WORDS] and manifest["num_classes"] == 2
    src = StoreSource(out)
    assert src.population == 2
    x, y = src.client(0)
    assert x.shape == (3, MAX_WORDS) and sorted(y.tolist()) == [0, 1, 1]
    model = build_model("leaf_sent140_lstm", (MAX_WORDS,), 2, vocab_size=50)
    assert model(torch.from_numpy(x)).shape == (3, 2)
    job = {"name": "sent140_tiny", "seed": 0, "rounds": 1, "data": {"partition": out},
           "model": {"name": "leaf_sent140_lstm", "args": {"vocab_size": 50}},
           "client": {"lr": 0.1, "batch_size": 2, "local_steps": 1},
           "sampling": {"clients_per_round": 2}, "eval": {"every": 0},
           "runtime": {"backend": "inline", "num_workers": 1}, "checkpoint": {"every": 0},
           "output": {"dir": str(tmp_path / "run"), "tensorboard": False}}
    result = fedray.run(job)
    assert np.isfinite(result.metrics[-1]["train_loss"])
    assert result.weights["embed.weight"].shape == (50, 100)


@pytest.mark.parametrize("args, pattern", [
    ({"vocab_size": 400001}, None),
    ({"vocab": 3}, r"config key 'model.args': leaf_sent140_lstm takes only vocab_size"),
])
def test_model_args_of_the_registered_lstm(args, pattern):
    from fedray.config import load_config, validate

    cfg = load_config({"model": {"name": "leaf_sent140_lstm", "args": args}})
    if pattern is None:
        validate(cfg, population=10)
        return
    with pytest.raises(FedrayError, match=pattern):
        validate(cfg, population=10)
