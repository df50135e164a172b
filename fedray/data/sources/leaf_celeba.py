"""LEAF CelebA: is the celebrity smiling? One client per celebrity, read from the JSON that
LEAF's ``preprocess.sh`` writes (``train/all_data_*_train_*.json`` and
``test/all_data_*_test_*.json``, as LEAF FEMNIST) and the CelebA images it names.

The format (TalwalkarLab/leaf, data/celeba/preprocess/metadata_to_json.py): users are the
celebrity ids of ``identity_CelebA.txt`` with at least 5 images; per user, ``x`` is a list of
image file names (``"000001.jpg"``) and ``y`` the ``Smiling`` attribute of
``list_attr_celeba.txt`` mapped from -1/1 to 0/1 as ``(a + 1) / 2``, which Python 3 writes
to JSON as the floats ``0.0`` and ``1.0``; both those and the integers 0 and 1 are read.

Images: LEAF's model opens each from ``data/celeba/data/raw/img_align_celeba``
(models/celeba/cnn.py ``IMAGES_DIR``, relative to models/), the folder its README has the
user put them in, beside the ``train/`` and ``test/`` that preprocessing writes under
``data/celeba/data``. So the default image folder here is ``<path>/raw/img_align_celeba``;
``images`` names another. Each image is resized to 84 x 84 and then converted to RGB, in
LEAF's order (``img.resize((84, 84)).convert('RGB')``); the resampling filter is given as
bicubic, Pillow's default for ``resize`` since Pillow 7 (LEAF leaves it to the default).
Pixels are kept as uint8 [3, 84, 84] with scale 1/255 (fedray's convention; LEAF feeds the
0..255 values to its CNN, whose first layer is followed by batch normalization, which all
but cancels that scale). A missing or unreadable image is an error naming the JSON file,
the user and the image's path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedray.data.dataset import Dataset
from fedray.data.examples import Split
from fedray.data.sources.leaf import _read_split, owner_columns, stack_records, user_lists
from fedray.errors import FedrayError

IMAGE_SIZE = 84  # LEAF models/celeba/cnn.py IMAGE_SIZE
NUM_CLASSES = 2
DEFAULT_IMAGES = Path("raw") / "img_align_celeba"  # relative to the data root (see above)


def load_leaf_celeba(path: str, images: str | None = None) -> Dataset:
    """Read LEAF CelebA from ``path/train`` and ``path/test`` and its images from ``images``
    (default ``path/raw/img_align_celeba``): x uint8 [n, 3, 84, 84], scale 1/255, y [n] 0/1
    (smiling), owners the celebrity ids."""
    root = Path(path)
    folder = Path(images).expanduser() if images is not None else root / DEFAULT_IMAGES
    if not folder.is_dir():
        raise FedrayError(f"{folder}: CelebA image folder not found (source.images; LEAF's "
                          f"default is img_align_celeba under raw/ beside train/ and test/)")
    parts = [_read_split(root, split, _user_reader(folder), who="user")
             for split in ("train", "test")]
    owners, owner_of = owner_columns(parts)
    splits = []
    for records, owner in zip(parts, owner_of, strict=True):
        x, y = stack_records(records, (np.zeros((0, 3, IMAGE_SIZE, IMAGE_SIZE), np.uint8),
                                       np.zeros(0, np.int64)))
        splits.append(Split(x, y, owner=owner))
    return Dataset(name="leaf_celeba", train=splits[0], test=splits[1],
                   num_classes=NUM_CLASSES, owners=owners, scale=1.0 / 255)


def load_image(file: str | Path) -> np.ndarray:
    """One image as LEAF's model reads it: resized to 84 x 84, then RGB; uint8 [3, 84, 84].
    Raises OSError (missing file) or PIL's errors (not an image)."""
    # imported when used, not at the top: only this source needs Pillow (start-up time)
    from PIL import Image

    with Image.open(file) as img:
        img = img.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BICUBIC).convert("RGB")
        return np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)


def _user_reader(folder: Path):  # noqa: ANN202 -- a fedray.data.sources.leaf.UserReader
    def read(file: Path, user: str, n: int, entry: Any) -> tuple[str, np.ndarray, np.ndarray]:
        where = f"{file}: user {user!r}"
        xs, ys = user_lists(where, entry, n, "x must be a list of image file names, y a list "
                            "of labels", ("images", "labels"))
        x = np.zeros((n, 3, IMAGE_SIZE, IMAGE_SIZE), np.uint8)
        y = np.zeros(n, np.int64)
        for i, (name, label) in enumerate(zip(xs, ys, strict=True)):
            if not isinstance(name, str) or not name:
                raise FedrayError(f"{where}: sample {i}: x must be an image file name "
                                  f"(got {name!r})")
            if type(label) not in (int, float) or label not in (0, 1):
                raise FedrayError(f"{where}: sample {i}: y must be 0 or 1 (got {label!r})")
            image = folder / name
            try:
                x[i] = load_image(image)
            except FileNotFoundError:
                raise FedrayError(f"{where}: sample {i}: image {image} not found") from None
            except Exception as e:  # noqa: BLE001 -- PIL raises many kinds for a bad file
                raise FedrayError(f"{where}: sample {i}: cannot read image {image} "
                                  f"({type(e).__name__}: {' '.join(str(e).split())})") from None
            y[i] = int(label)
        return user, x, y

    return read
