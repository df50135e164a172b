"""LEAF CelebA (fedray.data.sources.leaf_celeba): LEAF's JSON written as its
metadata_to_json.py and split_data.py write it (labels as the floats 0.0 / 1.0), images
written with PIL, resized as LEAF's model resizes them; one-line errors; a recipe build and a
training round of LEAF's CNN."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fedray.core.models import build_model
from fedray.data.recipe import build
from fedray.data.sources.leaf_celeba import IMAGE_SIZE, load_image, load_leaf_celeba
from fedray.data.store.reader import StoreSource
from fedray.errors import FedrayError
from tests.data.leaf_files import leaf_doc, write_split

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "partitions" / "leaf_celeba.yaml"


def _image(folder: Path, name: str, shade: int, mode: str = "RGB") -> None:
    """A small CelebA-like image (CelebA's are 178 x 218 JPEGs; small ones keep tests fast)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(shade)
    pixels = rng.integers(0, 256, (22, 18, 3), dtype=np.uint8) // 4 + shade
    img = Image.fromarray(pixels, "RGB")
    img = img.convert(mode) if mode != "RGB" else img
    img.save(folder / name)


def _data(root: Path, images: Path | None = None) -> str:
    images = images or root / "raw" / "img_align_celeba"
    for i in range(1, 8):
        _image(images, f"{i:06d}.jpg", 20 * i)
    _image(images, "000008.png", 30, mode="L")  # grey PNG: read as RGB
    # metadata_to_json.py: y = (int(attr) + 1) / 2, floats in the JSON
    train = leaf_doc({"2880": (["000001.jpg", "000002.jpg", "000003.jpg"], [1.0, 0.0, 1.0]),
                      "15": (["000004.jpg", "000008.png"], [0.0, 1.0])})
    test = leaf_doc({"2880": (["000005.jpg"], [0.0]), "15": (["000006.jpg"], [1.0])})
    return write_split(root, train, test, name="all_data_niid_05_keep_5_{split}_9.json")


def test_loader_reads_leafs_layout(tmp_path):
    ds = load_leaf_celeba(_data(tmp_path))
    assert ds.name == "leaf_celeba" and ds.num_classes == 2 and ds.scale == 1 / 255
    assert ds.owners == ["15", "2880"]  # sorted as strings
    assert ds.train.x.shape == (5, 3, IMAGE_SIZE, IMAGE_SIZE) and ds.train.x.dtype == np.uint8
    np.testing.assert_array_equal(ds.train.y, [0, 1, 1, 0, 1])
    np.testing.assert_array_equal(ds.train.owner, [0, 0, 1, 1, 1])
    folder = tmp_path / "raw" / "img_align_celeba"
    # LEAF's model: Image.open(...).resize((84, 84)).convert('RGB')
    with Image.open(folder / "000004.jpg") as img:
        want = np.asarray(img.resize((84, 84), Image.Resampling.BICUBIC).convert("RGB"))
    np.testing.assert_array_equal(ds.train.x[0], want.transpose(2, 0, 1))
    grey = ds.train.x[1]
    assert (grey[0] == grey[1]).all() and (grey[1] == grey[2]).all()  # 'L' -> RGB
    np.testing.assert_array_equal(ds.test.y, [1, 0])


def test_images_key_names_another_folder(tmp_path):
    images = tmp_path / "elsewhere"
    root = _data(tmp_path / "data", images)
    assert len(load_leaf_celeba(root, images=str(images)).train) == 5
    with pytest.raises(FedrayError, match=r"img_align_celeba: CelebA image folder not found"):
        load_leaf_celeba(root)


def test_integer_labels_are_read_too(tmp_path):
    root = Path(_data(tmp_path))
    doc = leaf_doc({"15": (["000001.jpg", "000002.jpg"], [1, 0])})
    write_split(root, doc, doc, name="all_data_niid_05_keep_5_{split}_9.json")
    np.testing.assert_array_equal(load_leaf_celeba(str(root)).train.y, [1, 0])


@pytest.mark.parametrize("case, pattern", [
    ("missing key", r"train_9\.json: missing key 'user_data'"),
    ("count", r"train_9\.json: user '15': num_samples says 4 but x has 2 images and y has 2"),
    ("users type", r"train_9\.json: users and num_samples must be lists"),
    ("name", r"train_9\.json: user '15': sample 1: x must be an image file name \(got 7\)"),
    ("label", r"train_9\.json: user '15': sample 0: y must be 0 or 1 \(got 0\.5\)"),
    ("string label", r"train_9\.json: user '15': sample 0: y must be 0 or 1 \(got '1'\)"),
    ("missing image", r"train_9\.json: user '15': sample 1: image \S*img_align_celeba/"
                      r"000099\.jpg not found"),
    ("unreadable image", r"train_9\.json: user '15': sample 0: cannot read image "
                         r"\S*img_align_celeba/000001\.jpg \(UnidentifiedImageError: "),
])
def test_malformed_files_give_one_line_errors(tmp_path, case, pattern):
    root = Path(_data(tmp_path))
    doc = leaf_doc({"15": (["000001.jpg", "000002.jpg"], [1.0, 0.0])})
    entry = doc["user_data"]["15"]
    if case == "missing key":
        del doc["user_data"]
    elif case == "count":
        doc["num_samples"] = [4]
    elif case == "users type":
        doc["users"] = "15"
    elif case == "name":
        entry["x"][1] = 7
    elif case == "label":
        entry["y"][0] = 0.5
    elif case == "string label":
        entry["y"][0] = "1"
    elif case == "missing image":
        entry["x"][1] = "000099.jpg"
    elif case == "unreadable image":
        (root / "raw" / "img_align_celeba" / "000001.jpg").write_bytes(b"not a jpeg")
    write_split(root, doc, leaf_doc({"15": (["000003.jpg"], [1.0])}),
                name="all_data_niid_05_keep_5_{split}_9.json")
    with pytest.raises(FedrayError, match=pattern) as err:
        load_leaf_celeba(str(root))
    assert "\n" not in str(err.value)


def test_cnn_is_leafs_shape():
    model = build_model("leaf_celeba_cnn", (3, 84, 84), 2)
    assert model(torch.rand(4, 3, 84, 84)).shape == (4, 2)
    assert not list(model.buffers())  # batch statistics always, as LEAF's training=True
    assert model[-1].in_features == 32 * 6 * 6  # 84 -> 42 -> 21 -> 11 -> 6
    convs = [m for m in model if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size) for c in convs] == [(32, (3, 3))] * 4


def test_recipe_builds_a_store_and_the_cnn_trains_on_it(tmp_path):
    import fedray

    root = _data(tmp_path / "data")
    out, manifest = build(RECIPE, [f"source.path={root}", f"out={tmp_path / 'store'}"])
    assert manifest["input_shape"] == [3, 84, 84] and manifest["dtype"] == "uint8"
    src = StoreSource(out)
    x, _ = src.client(0)
    assert x.dtype == np.float32 and 0.0 <= x.min() and x.max() <= 1.0  # scale 1/255
    job = {"name": "celeba_tiny", "seed": 0, "rounds": 1, "data": {"partition": out},
           "model": {"name": "leaf_celeba_cnn"},
           "client": {"lr": 0.1, "batch_size": 2, "local_steps": 1},
           "sampling": {"clients_per_round": 2}, "eval": {"every": 0},
           "runtime": {"backend": "inline", "num_workers": 1}, "checkpoint": {"every": 0},
           "output": {"dir": str(tmp_path / "run"), "tensorboard": False}}
    result = fedray.run(job)
    assert np.isfinite(result.metrics[-1]["train_loss"])


def test_load_image_is_uint8_channels_first(tmp_path):
    _image(tmp_path, "a.png", 10)
    assert load_image(tmp_path / "a.png").shape == (3, IMAGE_SIZE, IMAGE_SIZE)
