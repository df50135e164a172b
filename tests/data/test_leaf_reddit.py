"""LEAF Reddit (fedray.data.sources.leaf_reddit): LEAF's JSON written as its preprocess.py
writes it (comments as rows of 10 tokens, y dicts with target_tokens and count_tokens,
num_samples counting all three splits, files <name>_<split>.json), the id layout and the
vocabulary (built from train, or a plain-text file), one-line errors, a recipe build and a
training round of LEAF's LSTM."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fedray.core.losses import SEQUENCE_PAD
from fedray.core.models import build_model
from fedray.data.recipe import build
from fedray.data.sources.leaf_reddit import PAD, SEQ_LEN, UNK, load_leaf_reddit
from fedray.data.store.reader import StoreSource
from fedray.errors import FedrayError
from tests.data.leaf_files import leaf_doc, write_split

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "partitions" / "leaf_reddit.yaml"
NAME = "reddit_0_{split}.json"  # preprocess.py: '{}_{}.json'.format(file_name, set_name)


def _pad(tokens: list[str]) -> list[list[str]]:
    tokens = tokens + ["<PAD>"] * (-len(tokens) % SEQ_LEN)
    return [tokens[i:i + SEQ_LEN] for i in range(0, len(tokens), SEQ_LEN)]


def comment(text: str, utc: float = 1512086400.0) -> tuple[list, dict]:
    """One comment as LEAF's preprocess.py stores it: input rows <BOS> tokens <EOS>, target
    rows tokens <EOS> <PAD>, both padded with <PAD> to rows of 10; count_tokens 1.0 over the
    input's tokens."""
    words = text.split()
    rows = _pad(["<BOS>", *words, "<EOS>"])
    counts = [1.0] * (len(words) + 2) + [0.0] * (-(len(words) + 2) % SEQ_LEN)
    label = {"subreddit": "AskReddit", "created_utc": utc, "score": 3,
             "target_tokens": _pad([*words, "<EOS>", "<PAD>"]),
             "count_tokens": [counts[i:i + SEQ_LEN] for i in range(0, len(counts), SEQ_LEN)]}
    return rows, label


def user(*texts: str) -> tuple[list, list]:
    pairs = [comment(t) for t in texts]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _files(root: Path) -> str:
    train = {"1": user("i think so", "the cat is on the mat and the dog is not here ok"),
             "2": user("so i think the cat")}
    test = {"1": user("the dog"), "2": user("i do not know")}
    # num_samples copies the unsplit file's: all of a user's comments (here 4 and 2)
    return write_split(root, leaf_doc(train, counts={"1": 4, "2": 2}),
                       leaf_doc(test, counts={"1": 4, "2": 2}), name=NAME)


def test_loader_rows_targets_and_built_vocabulary(tmp_path):
    ds = load_leaf_reddit(_files(tmp_path), vocab_size=4)
    # train counts: <BOS> 3, <EOS> 3, the 4, cat 2, i 2, is 2, ... (ties by token)
    # kept: 4 words: the, <BOS>, <EOS>, cat -> ids 2, 3, 4, 5 (with <PAD>, <UNK>: 6 ids)
    assert ds.name == "leaf_reddit" and ds.num_classes == 6
    assert ds.owners == ["1", "2"] and ds.input_shape == (SEQ_LEN,)
    assert ds.train.x.shape == ds.train.y.shape == (4, SEQ_LEN)  # comment 2 of user 1: 2 rows
    np.testing.assert_array_equal(ds.train.owner, [0, 0, 0, 1])
    assert ds.train.x[0].tolist() == [3, UNK, UNK, UNK, 4] + [PAD] * 5  # <BOS> i think so <EOS>
    assert ds.train.y[0].tolist() == [UNK, UNK, UNK, 4] + [PAD] * 6  # i think so <EOS> <PAD>
    assert PAD == SEQUENCE_PAD  # the loss leaves the padding targets out
    assert ds.train.x.dtype == np.uint16 and ds.train.y.dtype == np.int64
    assert ds.test.x[0].tolist()[:4] == [3, 2, UNK, 4]  # <BOS> the dog <EOS>


def test_plain_vocab_file(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("<PAD>\n<UNK>\n<BOS>\n<EOS>\ni\nthink\n")  # specials skipped: fixed ids
    ds = load_leaf_reddit(_files(tmp_path / "data"), vocab=str(vocab))
    assert ds.num_classes == 6
    assert ds.train.x[0].tolist()[:5] == [2, 4, 5, UNK, 3]


@pytest.mark.parametrize("case, pattern", [
    ("missing key", r"reddit_0_train\.json: missing key 'users'"),
    ("counts", r"reddit_0_train\.json: user '1': x has 1 comments and y 1; they must be as "
               r"many, and at most num_samples \(0, "),
    ("mismatch", r"reddit_0_train\.json: user '1': x has 1 comments and y 0"),
    ("row length", r"reddit_0_train\.json: user '1': comment 0: x row 0 must be a list of 10 "
                   r"non-empty token strings"),
    ("empty comment", r"reddit_0_train\.json: user '1': comment 0: x must be a non-empty list"),
    ("token type", r"reddit_0_train\.json: user '1': comment 0: x row 0 must be a list of 10"),
    ("label", r"reddit_0_train\.json: user '1': comment 0: y must be a dict with "
              r"'target_tokens' \(got str\)"),
    ("targets", r"reddit_0_train\.json: user '1': comment 0: x has 1 rows but y's "
                r"target_tokens has 2"),
])
def test_malformed_files_give_one_line_errors(tmp_path, case, pattern):
    doc = leaf_doc({"1": user("hello there")})
    entry = doc["user_data"]["1"]
    if case == "missing key":
        del doc["users"]
    elif case == "counts":
        doc["num_samples"] = [0]
    elif case == "mismatch":
        entry["y"] = []
    elif case == "row length":
        entry["x"][0][0] = entry["x"][0][0][:9]
    elif case == "empty comment":
        entry["x"][0] = []
    elif case == "token type":
        entry["x"][0][0][3] = 5
    elif case == "label":
        entry["y"][0] = "hello"
    elif case == "targets":
        entry["y"][0]["target_tokens"] *= 2
    write_split(tmp_path, doc, leaf_doc({"1": user("bye")}), name=NAME)
    with pytest.raises(FedrayError, match=pattern) as err:
        load_leaf_reddit(str(tmp_path))
    assert "\n" not in str(err.value)


def test_missing_files(tmp_path):
    (tmp_path / "train").mkdir()
    with pytest.raises(FedrayError, match=r"train: no LEAF files matching \*\.json"):
        load_leaf_reddit(str(tmp_path))


def test_recipe_builds_a_store_and_the_lstm_trains_on_it(tmp_path):
    import fedray

    root = _files(tmp_path / "data")
    out, manifest = build(RECIPE, [f"source.path={root}", f"out={tmp_path / 'store'}",
                                   "source.vocab_size=20"])
    assert manifest["input_shape"] == [SEQ_LEN] and manifest["label_shape"] == [SEQ_LEN]
    src = StoreSource(out)
    # 15 distinct train tokens: fewer ids than vocab_size asked for
    assert src.num_classes == 15 + 2 and src.population == 2
    x, _ = src.client(0)
    model = build_model("leaf_reddit_lstm", (SEQ_LEN,), src.num_classes)
    assert model(torch.from_numpy(x)).shape == (len(x), SEQ_LEN, 17)
    assert all(p.abs().max() <= 0.1 for p in model.parameters())  # LEAF's init_scale
    job = {"name": "reddit_tiny", "seed": 0, "rounds": 1, "data": {"partition": out},
           "model": {"name": "leaf_reddit_lstm", "loss": "sequence_cross_entropy"},
           "client": {"lr": 1.0, "batch_size": 2, "local_steps": 1},
           "sampling": {"clients_per_round": 2}, "eval": {"every": 0},
           "runtime": {"backend": "inline", "num_workers": 1}, "checkpoint": {"every": 0},
           "output": {"dir": str(tmp_path / "run"), "tensorboard": False}}
    result = fedray.run(job)
    assert np.isfinite(result.metrics[-1]["train_loss"])
