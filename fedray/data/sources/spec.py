"""The ``source`` section of a partition recipe (``fedray partition``): which data set, where,
and the options each source reads. Its defaults are also what a store written from Python
(``from_arrays(...).partition(...).write_store(...)``) records as its source.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SourceSpec:
    # a name of fedray.data.sources.loaders.SOURCE_OPTIONS: an official format (leaf_femnist,
    # tff_emnist, ...), a generator (synthetic, ...), or your own data (numpy, table, hf_disk)
    name: str = ""
    # where the raw files are (not used by the generated ones, loaders.GENERATED)
    path: str | None = None
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
    # numpy, table, hf_disk: null = the largest label + 1 (hf_disk: a ClassLabel's);
    # leaf_synthetic: the classes to generate, null = LEAF's 5
    num_classes: int | None = None
    channels_last: bool = False  # numpy only: x is [n, H, W, C] images, made [n, C, H, W]
    scale: float | None = None  # numpy only: model input = x * scale; null: 1/255 for uint8
    train_split: str = "train"  # hf_disk only: the DatasetDict split read as train data
    test_split: str | None = "test"  # hf_disk only: the DatasetDict's test split (null: none)
    num_writers: int = 1000  # synthetic only: writers to generate
    min_examples: int = 30  # synthetic only
    max_examples: int = 90  # synthetic only
    seed: int = 0  # synthetic, leaf_synthetic: identity of the generated data
    # synthetic only: float32, or uint8 (pixels rounded to 1/255 steps, stored as bytes with
    # the store's scale 1/255: a quarter of the disk)
    dtype: str = "float32"
    # shakespeare_folio only: the share of each role's speeches (its last ones) held out as
    # that role's test data (fedray.data.sources.shakespeare.load_shakespeare_folio)
    client_test_fraction: float = 0.2
    # tff_stackoverflow only (fedray.data.sources.stackoverflow): the task, next_word or tag
    # (required), the tags predicted (tag only), the words per example (next_word only), and
    # each train user's first posts kept (null: all; Reddi et al. keep 1000)
    task: str | None = None
    num_tags: int = 500
    sequence_length: int = 20
    max_client_examples: int | None = None
    # leaf_synthetic only (fedray.data.sources.leaf_synthetic): LEAF's -num-tasks (users),
    # -num-dim (features per sample) and split_data.py's --tf (each user's train share)
    num_users: int = 1000
    num_dim: int = 60
    train_fraction: float = 0.9
    # leaf_sent140, leaf_reddit only: a vocabulary file (one word per line, or GloVe's
    # "word v1 .. vd" lines); null: built from the train split's most frequent words
    vocab: str | None = None
    # tff_stackoverflow, and leaf_sent140 / leaf_reddit without source.vocab: the words the
    # vocabulary keeps, the most frequent first; each source's special ids come on top
    # (Stack Overflow: padding, OOV, BOS, EOS; Sent140: one OOV/padding id; Reddit: <PAD>,
    # <UNK>)
    vocab_size: int = 10000
    # leaf_celeba only: the folder of CelebA images the JSON names; null: LEAF's place,
    # raw/img_align_celeba under source.path
    images: str | None = None
