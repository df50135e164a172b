"""The ``source`` section of a partition recipe (``fedray partition``): which data set, where,
and the options each source reads. Its defaults are also what a store written from Python
(``from_arrays(...).partition(...).write_store(...)``) records as its source.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SourceSpec:
    # leaf_femnist | tff_emnist | tff_cifar100 | cifar100 | mnist | leaf_shakespeare |
    # tff_shakespeare | shakespeare_folio | leaf_sent140 | leaf_celeba | leaf_reddit |
    # synthetic; your own data: numpy | table | hf_disk
    name: str = ""
    path: str | None = None  # where the raw files are (not used by 'synthetic')
    # The keys below are each read by some sources only (fedray.data.sources.loaders.
    # SOURCE_OPTIONS, which the recipe checks: a key set for another source is refused).
    # numpy | table | hf_disk (fedray.data.sources.columns.SOURCE_KEYS says which reads which;
    # docs/partitions.md, "Bring your own data"). Row numbers in error lines count from 0.
    x: str = "x"  # numpy only: the .npz array of inputs [n, ...]
    label: str | None = None  # the label column (integers >= 0); null: 'y' (numpy), 'label'
    features: list[str] | None = None  # table, hf_disk: numeric columns (or lists of numbers)
    image: str | None = None  # table, hf_disk: a column of encoded images (PNG, JPEG, ...)
    text: str | None = None  # table, hf_disk: a text column, read as character ids
    text_length: int = 80  # table, hf_disk with text: ids per example (cut or padded with 0)
    user: str | None = None  # the user-id column (integers or strings): natural's clients
    split: str | None = None  # a column of 'train'/'test' (or 0/1) per row: the test rows
    num_classes: int | None = None  # null: the largest label + 1 (hf_disk: a ClassLabel's)
    channels_last: bool = False  # numpy only: x is [n, H, W, C] images, made [n, C, H, W]
    scale: float | None = None  # numpy only: model input = x * scale; null: 1/255 for uint8
    train_split: str = "train"  # hf_disk only: the DatasetDict split read as train data
    test_split: str | None = "test"  # hf_disk only: the DatasetDict's test split (null: none)
    num_writers: int = 1000  # synthetic only: writers to generate
    min_examples: int = 30  # synthetic only
    max_examples: int = 90  # synthetic only
    seed: int = 0  # synthetic only: identity of the generated data
    # synthetic only: float32, or uint8 (pixels rounded to 1/255 steps, stored as bytes with
    # the store's scale 1/255: a quarter of the disk)
    dtype: str = "float32"
    # shakespeare_folio only: the share of each role's speeches (its last ones) held out as
    # that role's test data (fedray.data.sources.shakespeare.load_shakespeare_folio)
    client_test_fraction: float = 0.2
    # leaf_sent140, leaf_reddit only: a vocabulary file (one word per line, or GloVe's
    # "word v1 .. vd" lines); null: built from the train split's most frequent words
    vocab: str | None = None
    # leaf_sent140, leaf_reddit only, without source.vocab: the number of token ids of the
    # vocabulary built from the train split, special ids included (Sent140: words + 1
    # out-of-vocabulary/padding id; Reddit: words + <PAD> + <UNK>, LEAF's 10,000)
    vocab_size: int = 10000
    # leaf_celeba only: the folder of CelebA images the JSON names; null: LEAF's place,
    # raw/img_align_celeba under source.path
    images: str | None = None
