"""Model registry: name -> factory(input_shape, num_classes) -> torch.nn.Module.

Architectures follow the papers fedray reproduces: ``emnist_cnn`` (TFF / Reddi et al.),
``leaf_cnn`` (LEAF FEMNIST, Caldas et al.), ``leaf_logreg`` (LEAF Synthetic's), ``mlp``
(SCAFFOLD's 2-layer fully connected network; its width is fedray's choice), ``logreg``,
``resnet18_gn`` (GroupNorm ResNet-18 for CIFAR-100, Hsieh et al. / Reddi et al., with its
input preprocessing built in), ``shakespeare_lstm`` (seed 002's character LSTM), ``word_lstm``
and ``tag_logreg`` (Reddi et al.'s Stack Overflow next-word and tag models),
``pfl_cifar10_cnn`` (pfl-research's CIFAR-10 benchmark CNN).
``emnist_cnn_bn`` and ``cifar_cnn_bn`` are
BatchNorm CNNs for FedBN-style personalization (Li et al., ICLR 2021), kept apart from the
networks above because BatchNorm's running statistics are buffers: such a model trains one
client after another (fedray.kernels.vectorized.unsupported_reason refuses it), and its
statistics travel in the flat weight vector with the parameters.

A job may instead name a user's model by import path (``model.name: my_models:Net`` or
``path/to/file.py:Net``, the syntax and resolver of algorithm parts,
fedray.algorithms.registry) with keyword arguments from ``model.args``; from Python, any
nn.Module factory can be passed as ``fedray.run(model_fn=...)``.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from fedray.algorithms.registry import import_object, is_import_path
from fedray.core.losses import VECTOR_LABEL
from fedray.errors import key_error, one_line
from fedray.section import thawed

ModelFactory = Callable[[tuple[int, ...], int], nn.Module]


class SafeBatchNorm1d(nn.BatchNorm1d):
    """BatchNorm1d that trains on a batch of one example instead of raising.

    torch refuses a training batch with one value per feature (its variance is zero), but
    fedray's batches can hold one example: the last minibatch of an epoch when a client's
    count is 1 more than a multiple of the batch size, or a client with one example. Such a
    batch is normalized with the running statistics, as in evaluation, and leaves them
    unchanged; every other batch is plain BatchNorm1d."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] == 1 and self.track_running_stats:
            return nn.functional.batch_norm(x, self.running_mean, self.running_var,
                                            self.weight, self.bias, False, 0.0, self.eps)
        return super().forward(x)


class EmnistCNN(nn.Module):
    """The EMNIST CNN of TFF and Reddi et al. (Adaptive Federated Optimization, Table 4):
    conv3x3-32, conv3x3-64, maxpool 2x2, dropout 0.25, fc128, dropout 0.5, fc62.

    ``batch_norm``: a BatchNorm after each convolution (BatchNorm2d) and after fc128
    (BatchNorm1d), each between its layer and the ReLU (``emnist_cnn_bn``, fedray's
    variant for FedBN). Those three layers then drop their bias, which the normalization
    would cancel (BatchNorm's own shift takes its place). Off, the model is the paper's,
    built with the same random draws as before the option existed."""

    def __init__(self, input_shape: tuple[int, ...] = (1, 28, 28), num_classes: int = 62,
                 batch_norm: bool = False):
        super().__init__()
        channels, height, width = input_shape
        bias = not batch_norm

        def norm(layer: type[nn.Module], size: int) -> list[nn.Module]:
            return [layer(size)] if batch_norm else []

        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 3, bias=bias), *norm(nn.BatchNorm2d, 32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, bias=bias), *norm(nn.BatchNorm2d, 64), nn.ReLU(),
            nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten(),
        )
        flat = 64 * ((height - 4) // 2) * ((width - 4) // 2)
        self.classifier = nn.Sequential(
            nn.Linear(flat, 128, bias=bias), *norm(SafeBatchNorm1d, 128), nn.ReLU(),
            nn.Dropout(0.5), nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def logistic_regression(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Multinomial logistic regression on the flattened input."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


def leaf_logreg(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """LEAF's Synthetic model (TalwalkarLab/leaf models/synthetic/log_reg.py): one dense
    layer whose sigmoid outputs are the logits of the softmax cross-entropy. The sigmoid
    leaves the predicted class (the argmax) as ``logreg``'s but bounds the logits to (0, 1),
    which slows and flattens training; kept apart from ``logreg`` to train as LEAF does."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes),
                         nn.Sigmoid())


def _image_shape(name: str, input_shape: tuple[int, ...], least: int) -> None:
    if len(input_shape) != 3:
        raise ValueError(f"{name} needs (channels, height, width) inputs, got {input_shape}")
    if input_shape[1] < least or input_shape[2] < least:
        raise ValueError(f"{name} needs height and width >= {least}, got {input_shape}")


def emnist_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if len(input_shape) != 3:
        raise ValueError(f"emnist_cnn needs (channels, height, width) inputs, got {input_shape}")
    return EmnistCNN(input_shape, num_classes)


def emnist_cnn_bn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """``emnist_cnn`` with conv-BatchNorm-ReLU blocks and a BatchNorm after fc128 (EmnistCNN's
    ``batch_norm``): the model FedBN keeps the normalization layers of local (``@norm``);
    its head, the last Linear (``classifier.4``), is still its last parameterized module.
    A separate name, not an option of ``emnist_cnn``: BatchNorm's running statistics are
    buffers, so it trains one client after another (the vectorized kernel refuses it) and
    averaging it also averages the statistics, which a job should choose knowingly."""
    _image_shape("emnist_cnn_bn", input_shape, 6)
    return EmnistCNN(input_shape, num_classes, batch_norm=True)


def cifar_cnn_bn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A small BatchNorm CNN for CIFAR-shaped (3, 32, 32) inputs: conv5x5-32 (padding 2)-BN-
    ReLU-maxpool2, conv5x5-64 (padding 2)-BN-ReLU-maxpool2, fc512-BN-ReLU, fc.

    fedray's choice, modelled on the CIFAR CNN of McMahan et al. 2017 (FedAvg) with a
    BatchNorm after each hidden layer, as FedBN adds them, so that its normalization layers
    can stay local (``@norm``); the layers a BatchNorm follows drop their bias, which it
    would cancel. No preprocessing is built in (unlike ``resnet18_gn``): it trains on the
    inputs as stored. Any (C, H, W) with H, W >= 4 works (the two poolings give
    64 * (H // 4) * (W // 4) features). Like ``emnist_cnn_bn``, it trains one client after
    another (the vectorized kernel refuses BatchNorm's buffers)."""
    _image_shape("cifar_cnn_bn", input_shape, 4)
    channels, height, width = input_shape
    flat = 64 * (height // 4) * (width // 4)
    features = nn.Sequential(
        nn.Conv2d(channels, 32, 5, padding=2, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(),
    )
    classifier = nn.Sequential(
        nn.Linear(flat, 512, bias=False), SafeBatchNorm1d(512), nn.ReLU(),
        nn.Linear(512, num_classes),
    )
    return nn.Sequential(OrderedDict(features=features, classifier=classifier))


def leaf_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The LEAF FEMNIST CNN (Caldas et al.): conv5x5-32, maxpool, conv5x5-64, maxpool, fc2048.

    'same' padding keeps the two poolings the only size reductions, so 28x28 gives 64*7*7.
    """
    if len(input_shape) != 3:
        raise ValueError(f"leaf_cnn needs (channels, height, width) inputs, got {input_shape}")
    channels, height, width = input_shape
    if height < 4 or width < 4:
        raise ValueError(f"leaf_cnn needs height and width >= 4, got {input_shape}")
    flat = 64 * (height // 4) * (width // 4)
    return nn.Sequential(
        nn.Conv2d(channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, 2048), nn.ReLU(), nn.Linear(2048, num_classes),
    )


def mlp(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """A 2-layer fully connected network, the non-convex model of SCAFFOLD's Table 5 (seed 004,
    lines 306 and 364). The seed gives no width: one hidden layer of 200 ReLUs is fedray's
    choice."""
    if len(input_shape) == 0 or math.prod(input_shape) < 1:
        raise ValueError(f"mlp needs a non-empty input shape, got {input_shape}")
    return nn.Sequential(
        nn.Flatten(), nn.Linear(math.prod(input_shape), 200), nn.ReLU(),
        nn.Linear(200, num_classes),
    )


def pfl_cifar10_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """pfl-research's ``simple_cnn`` for CIFAR-10 (apple/pfl-research,
    benchmarks/model/pytorch/cnn.py): conv3x3-32, ReLU, conv3x3-64, ReLU, maxpool 2x2,
    dropout 0.25, fc128, ReLU, dropout 0.5, fc10, no padding (32x32 -> 64 x 14 x 14 =
    12,544 features), every conv and linear weight Glorot/Xavier-uniform (its biases
    PyTorch's default), as that file does to match its TF2 twin.

    The layers are ``emnist_cnn``'s (the same Keras-style CNN), so it is built from
    EmnistCNN and only the initialization differs. Preprocessing is not pfl-research's:
    its benchmarks/dataset/cifar10 standardizes each channel with the train set's mean and
    std, after reshaping each stored row (R, G, B planes) as 32x32x3 (download_preprocess.py),
    which interleaves the planes; fedray reads the planes as stored and feeds x / 255 (the
    store's scale) unstandardized, since a model factory sees no data statistics."""
    _image_shape("pfl_cifar10_cnn", input_shape, 6)
    model = EmnistCNN(input_shape, num_classes)
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(m.weight)
    return model


class CifarPreprocess(nn.Module):
    """Reddi et al.'s CIFAR preprocessing: random crop + horizontal flip when training, the
    central crop when evaluating, then tf.image.per_image_standardization.

    It lives inside the model so the runtime needs no per-dataset transform: the training
    randomness draws on torch's global RNG, which the client seeds with ``torch.manual_seed``,
    so each client's augmentation is reproducible, and the same module evaluates
    deterministically by switching to eval mode. It has no parameters or buffers, so it adds
    nothing to the flat weight vector.
    """

    def __init__(self, crop: int = 24):
        super().__init__()
        self.crop = crop

    def extra_repr(self) -> str:
        return f"crop={self.crop}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:
            raise ValueError(f"CifarPreprocess needs (batch, C, H, W) inputs, got {tuple(x.shape)}")
        n, c, h, w = x.shape
        k = self.crop
        if h < k or w < k:
            raise ValueError(f"CifarPreprocess needs H, W >= {k}, got {tuple(x.shape)}")
        if not x.is_floating_point():
            x = x.float()
        if self.training:
            x = self._random_crop_flip(x, k)
        else:
            top, left = (h - k) // 2, (w - k) // 2
            x = x[:, :, top:top + k, left:left + k]
        return per_image_standardization(x)

    @staticmethod
    def _random_crop_flip(x: torch.Tensor, k: int) -> torch.Tensor:
        # Vectorised: one advanced-indexing gather with per-image row/column index grids.
        n, c, h, w = x.shape
        dev = x.device
        top = torch.randint(0, h - k + 1, (n,), device=dev)
        left = torch.randint(0, w - k + 1, (n,), device=dev)
        flip = torch.rand(n, device=dev) < 0.5
        offs = torch.arange(k, device=dev)
        rows = top[:, None] + offs                                    # (n, k)
        cols = left[:, None] + torch.where(flip[:, None], offs.flip(0), offs)  # (n, k)
        batch = torch.arange(n, device=dev)[:, None, None, None]
        chan = torch.arange(c, device=dev)[None, :, None, None]
        return x[batch, chan, rows[:, None, :, None], cols[:, None, None, :]]


def per_image_standardization(x: torch.Tensor) -> torch.Tensor:
    """tf.image.per_image_standardization over each image's C*H*W values; the std floor of
    1/sqrt(num_elements) keeps constant images finite (they map to zeros)."""
    dims = tuple(range(1, x.dim()))
    mean = x.mean(dim=dims, keepdim=True)
    std = x.std(dim=dims, keepdim=True, correction=0)
    floor = 1.0 / math.sqrt(math.prod(x.shape[1:]))
    return (x - mean) / std.clamp_min(floor)


def _group_norm(channels: int) -> nn.Module:
    # Module-level (not a lambda) so torchvision's ResNet, which keeps it, stays picklable.
    return nn.GroupNorm(2, channels)


def resnet18_gn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """ResNet-18 with GroupNorm(2 groups) for CIFAR-100 (Hsieh et al. 2020, Reddi et al.).

    BatchNorm's running statistics do not average meaningfully across non-IID clients, and
    GroupNorm has no buffers, so the whole model is parameters. The CIFAR stem (3x3 stride-1
    conv, no max-pool) keeps resolution on 24x24 crops; preprocessing is the first stage.
    """
    if len(input_shape) != 3:
        raise ValueError(f"resnet18_gn needs (channels, height, width) inputs, got {input_shape}")
    channels, height, width = input_shape
    if height < 24 or width < 24:
        raise ValueError(f"resnet18_gn needs height and width >= 24, got {input_shape}")
    import torchvision  # only this model needs it; workers of other models skip the import

    net = torchvision.models.resnet18(num_classes=num_classes, norm_layer=_group_norm)
    net.conv1 = nn.Conv2d(channels, 64, 3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    net.maxpool = nn.Identity()
    return nn.Sequential(OrderedDict(preprocess=CifarPreprocess(24), net=net))


class CharLSTM(nn.Module):
    """Seed 002's Shakespeare RNN (App. E.1, line 1080 of the seed text): an 8-dimensional
    embedding of the 90 tokens, two LSTM layers of 256 units, and a dense softmax layer over
    the 90 tokens at every position: [batch, 80] ids -> [batch, 80, 90] logits (the softmax
    is in the loss). Inputs arrive as floats (stores hold them as uint8, sources hand
    float32 to models) and are cast to ids here. Padding is a token like any other: it sits
    only at a sequence's end, so in this left-to-right model it never changes the outputs at
    real positions, and the loss leaves its positions out (TFF masks it in the embedding
    instead, with the same effect on those outputs)."""

    def __init__(self, vocab_size: int = 90, embedding: int = 8, hidden: int = 256,
                 layers: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=layers, batch_first=True)
        self.out = nn.Linear(hidden, vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(x.long()))
        return self.out(h)


def shakespeare_lstm(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """CharLSTM over sequences of ``input_shape`` = (length,) token ids; the vocabulary is
    the data's ``num_classes`` (90 for fedray.data.sources.shakespeare's tokens)."""
    if len(input_shape) != 1 or input_shape[0] < 1:
        raise ValueError(f"shakespeare_lstm needs (sequence length,) inputs, got {input_shape}")
    return CharLSTM(vocab_size=num_classes)


# --- Stack Overflow (TFF; Reddi et al., "Adaptive Federated Optimization", ICLR 2021) ------


def _keras_truncated_normal_(w: torch.Tensor, std: float) -> None:
    """Keras' GlorotNormal / HeNormal draw: a normal of ``std`` / 0.8796 cut at two of its
    own standard deviations (so the cut normal's std is ``std``)."""
    scaled = std / 0.87962566103423978
    nn.init.trunc_normal_(w, std=scaled, a=-2 * scaled, b=2 * scaled)


class WordLSTM(nn.Module):
    """Reddi et al.'s Stack Overflow next-word model, as google-research/federated builds it
    (``utils/models/stackoverflow_models.py``, ``create_recurrent_model`` with the defaults
    ``optimization/tasks/stackoverflow_nwp.py`` passes): an embedding of 96 over the
    vocabulary and its special tokens, one LSTM layer of 670 units, a dense projection back
    to 96 (no activation), and a dense layer of logits over the same tokens at every
    position: [batch, 20] ids -> [batch, 20, vocab_size + 4] (10,004 for the 10,000 words
    with padding, OOV, BOS and EOS; fedray.data.sources.stackoverflow).

    Initialized as there: embedding uniform in [-0.05, 0.05], LSTM kernel He-normal and
    recurrent kernel orthogonal, its bias 0 with the forget gate's 1 (Keras' unit forget
    bias), dense kernels Glorot-normal, dense biases 0. torch's LSTM keeps two bias vectors
    (input and recurrent) where Keras keeps one; the recurrent one starts at 0, so the sum
    is Keras' bias, and the model has 4 x 670 = 2,680 parameters more than the Keras one.
    Padding is embedded like any token; it only ever follows a post's last word, so in this
    left-to-right model it changes no output at a real position (Keras masks it instead),
    and the loss leaves its positions out."""

    def __init__(self, vocab_size: int = 10_004, embedding: int = 96, hidden: int = 670):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embedding)
        self.lstm = nn.LSTM(embedding, hidden, batch_first=True)
        self.project = nn.Linear(hidden, embedding)
        self.out = nn.Linear(embedding, vocab_size)
        nn.init.uniform_(self.embed.weight, -0.05, 0.05)
        # Keras draws the four gates' kernels as one matrix (fan-in: the embedding), and the
        # recurrent one as one orthogonal [hidden, 4 hidden] matrix: torch's [4 hidden,
        # hidden] transpose then has orthonormal columns, as orthogonal_ makes them
        _keras_truncated_normal_(self.lstm.weight_ih_l0, math.sqrt(2.0 / embedding))
        nn.init.orthogonal_(self.lstm.weight_hh_l0)
        nn.init.zeros_(self.lstm.bias_ih_l0)
        nn.init.zeros_(self.lstm.bias_hh_l0)
        with torch.no_grad():  # torch's gate order: input, forget, cell, output
            self.lstm.bias_ih_l0[hidden:2 * hidden] = 1.0
        for layer in (self.project, self.out):
            _keras_truncated_normal_(layer.weight,
                                     math.sqrt(2.0 / (layer.in_features + layer.out_features)))
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(x.long()))
        return self.out(self.project(h))


def word_lstm(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """WordLSTM over sequences of ``input_shape`` = (length,) token ids; its vocabulary is
    the data's ``num_classes`` (the words and the four special tokens)."""
    if len(input_shape) != 1 or input_shape[0] < 1:
        raise ValueError(f"word_lstm needs (sequence length,) inputs, got {input_shape}")
    return WordLSTM(vocab_size=num_classes)


def tag_logreg(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Reddi et al.'s Stack Overflow tag model: logistic regression from the bag of words to
    one logit per tag (google-research/federated ``utils/models/stackoverflow_lr_models.py``:
    one dense layer, Glorot-normal kernel, zero bias; its sigmoid is in the loss,
    ``multi_label_bce``). ``logreg`` with Keras' initialization; trained on its own it
    learns the same."""
    model = logistic_regression(input_shape, num_classes)
    linear = model[1]
    _keras_truncated_normal_(linear.weight,
                             math.sqrt(2.0 / (linear.in_features + linear.out_features)))
    nn.init.zeros_(linear.bias)
    return model


# --- LEAF's models (TalwalkarLab/leaf, models/<data set>/*.py, TensorFlow 1) ---------------


def leaf_celeba_cnn(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """LEAF's CelebA CNN (models/celeba/cnn.py): four blocks of conv3x3-32 ('same'),
    batch normalization, maxpool 2x2 stride 2 ('same'), ReLU, in that order; then one dense
    layer to the classes. 84x84 inputs pool to 42, 21, 11, 6: 32*6*6 = 1152 features.

    LEAF calls ``tf.layers.batch_normalization(..., training=True)`` in training and
    evaluation alike, so it always normalizes with the batch's own statistics and never uses
    running averages; ``track_running_stats=False`` does the same here, and the model has no
    buffers (FedAvg averages only its parameters). TF's epsilon, 1e-3, is kept. TF's 'same'
    pooling of an odd size keeps the last row: ``ceil_mode=True``."""
    _image_shape("leaf_celeba_cnn", input_shape, 1)
    channels, height, width = input_shape
    layers: list[nn.Module] = []
    for block in range(4):
        layers += [nn.Conv2d(channels if block == 0 else 32, 32, 3, padding=1),
                   nn.BatchNorm2d(32, eps=1e-3, track_running_stats=False),
                   nn.MaxPool2d(2, 2, ceil_mode=True), nn.ReLU()]
        height, width = -(-height // 2), -(-width // 2)
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(32 * height * width, num_classes))


class LeafSent140LSTM(nn.Module):
    """LEAF's Sent140 classifier (models/sent140/stacked_lstm.py, baseline_constants.py
    ``sent140.stacked_lstm``: seq_len 25, n_hidden 100): an embedding of ``n_hidden`` = 100
    per id, two LSTM layers of 100 units, the output at the last position (the 25th, which
    after LEAF's end padding is usually a padding position), a dense layer of 128 units
    without activation (``tf.layers.dense``'s default) and a dense layer to the classes.

    The embedding is trained from a random start, as in LEAF: its model creates the
    ``[vocab_size + 1, n_hidden]`` variable and never loads the GloVe vectors into it (they
    are 300-dimensional; the embedding is 100). ``vocab_size`` here is the number of ids,
    LEAF's ``vocab_size + 1`` (fedray.data.sources.leaf_sent140: W words + the OOV/padding
    id); 10,000 is fedray's built vocabulary's default, 400,001 GloVe 6B's."""

    def __init__(self, vocab_size: int = 10_000, num_classes: int = 2, hidden: int = 100):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=2, batch_first=True)
        self.fc = nn.Linear(hidden, 128)
        self.out = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x.long()
        _check_ids(ids, self.embed.num_embeddings, "leaf_sent140_lstm")
        h, _ = self.lstm(self.embed(ids))
        return self.out(self.fc(h[:, -1]))


def _check_ids(ids: torch.Tensor, rows: int, name: str) -> None:
    # a clear line rather than torch's "index out of range in self" from inside a worker
    if ids.numel() and (int(ids.max()) >= rows or int(ids.min()) < 0):
        raise ValueError(f"{name}: token ids must be in 0..{rows - 1} (its vocabulary of "
                         f"{rows} ids), got {int(ids.min())}..{int(ids.max())}; set "
                         f"model.args.vocab_size to the data's number of ids")


def leaf_sent140_lstm(input_shape: tuple[int, ...], num_classes: int, *,
                      vocab_size: int = 10_000) -> nn.Module:
    """LeafSent140LSTM over (25,) word ids; ``vocab_size`` (``model.args.vocab_size``) the
    number of ids of the data's vocabulary."""
    if len(input_shape) != 1 or input_shape[0] < 1:
        raise ValueError(f"leaf_sent140_lstm needs (sequence length,) inputs, got {input_shape}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"leaf_sent140_lstm: vocab_size must be a positive integer, got "
                         f"{vocab_size!r}")
    return LeafSent140LSTM(vocab_size=vocab_size, num_classes=num_classes)


class LeafRedditLSTM(nn.Module):
    """LEAF's Reddit next-word model (models/reddit/stacked_lstm.py, baseline_constants.py
    ``reddit.stacked_lstm``: seq_len 10, n_hidden 256, num_layers 2): an embedding of 256
    per id, two LSTM layers of 256 units and a dense softmax layer over the vocabulary at
    every position: [batch, 10] ids -> [batch, 10, vocab] logits (as CharLSTM).

    LEAF initializes every variable of its scope uniformly in [-0.1, 0.1] (``init_scale``);
    so does this model, LSTM biases included (whether TF's LSTMBlockCell takes the scope's
    initializer for its bias we did not verify). LEAF's forget-gate bias of 0, its gradient
    clipping at global norm 5 and its LSTM state carried from batch to batch have no
    counterpart here (fedray's client has no clipping; each row starts from zero state)."""

    def __init__(self, vocab_size: int, hidden: int = 256, layers: int = 2,
                 init_scale: float = 0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True)
        self.out = nn.Linear(hidden, vocab_size)
        for p in self.parameters():
            nn.init.uniform_(p, -init_scale, init_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x.long()
        _check_ids(ids, self.embed.num_embeddings, "leaf_reddit_lstm")
        h, _ = self.lstm(self.embed(ids))
        return self.out(h)


def leaf_reddit_lstm(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """LeafRedditLSTM over (10,) token ids; the vocabulary is the data's ``num_classes``
    (fedray.data.sources.leaf_reddit: its number of ids, <PAD> and <UNK> included)."""
    if len(input_shape) != 1 or input_shape[0] < 1:
        raise ValueError(f"leaf_reddit_lstm needs (sequence length,) inputs, got {input_shape}")
    return LeafRedditLSTM(vocab_size=num_classes)


MODELS: dict[str, ModelFactory] = {
    "cifar_cnn_bn": cifar_cnn_bn,
    "emnist_cnn": emnist_cnn,
    "emnist_cnn_bn": emnist_cnn_bn,
    "leaf_celeba_cnn": leaf_celeba_cnn,
    "leaf_cnn": leaf_cnn,
    "leaf_logreg": leaf_logreg,
    "leaf_reddit_lstm": leaf_reddit_lstm,
    "leaf_sent140_lstm": leaf_sent140_lstm,
    "logreg": logistic_regression,
    "mlp": mlp,
    "pfl_cifar10_cnn": pfl_cifar10_cnn,
    "resnet18_gn": resnet18_gn,
    "shakespeare_lstm": shakespeare_lstm,
    "tag_logreg": tag_logreg,
    "word_lstm": word_lstm,
}


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int,
                **args: Any) -> nn.Module:
    """Registered model ``name`` for the data's shape and classes; ``args`` (``model.args``)
    go to its keyword-only parameters (``registered_args`` checks them first)."""
    return MODELS[name](tuple(input_shape), num_classes, **args)


def registered_args(name: str) -> tuple[str, ...]:
    """The ``model.args`` keys registered model ``name`` takes: its factory's keyword-only
    parameters (``leaf_sent140_lstm``'s ``vocab_size``); most take none."""
    params = inspect.signature(MODELS[name]).parameters.values()
    return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)


# what a user's model is told about the data, when its signature names the argument and
# model.args does not set it
_DATA_ARGS = ("input_shape", "num_classes")


def user_model(name: str, args: Mapping[str, Any] | None = None) -> Callable[..., nn.Module]:
    """The class (or factory function) an import path ``model.name`` names, checked against
    ``model.args`` without being called: importable, an nn.Module subclass or a callable, and
    able to take those keyword arguments. Imported here, in the caller, so that the object
    travels to the Ray processes by value (fedray.algorithms.registry) rather than by name.
    Each problem is one line naming ``model.name`` or ``model.args``."""
    obj = import_object(name, "model.name")
    if isinstance(obj, type) and not issubclass(obj, nn.Module) or not callable(obj):
        what = ("a class that is not one" if isinstance(obj, type) else
                f"a {type(obj).__name__} object")
        raise key_error("model.name", "must name a torch.nn.Module subclass or a function "
                        f"that returns one; {name.rpartition(':')[2]} is {what}", name)
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without one: its call says what is wrong
        return obj
    try:
        signature.bind(**model_kwargs(obj, args, (1,), 1))
    except TypeError as exc:
        raise key_error("model.args", f"{name} does not take them: {exc}",
                        dict(args or {})) from None
    return obj


def model_kwargs(obj: Callable[..., nn.Module], args: Mapping[str, Any] | None,
                 input_shape: tuple[int, ...], num_classes: int) -> dict[str, Any]:
    """``model.args``, plus ``input_shape=`` and ``num_classes=`` (the data's) for each that
    ``obj``'s signature names and ``model.args`` leaves unset: a model written for one data
    set can still be told the shape of another without a key in every job."""
    kwargs = dict(args or {})
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return kwargs
    given = {"input_shape": tuple(input_shape), "num_classes": int(num_classes)}
    for key in _DATA_ARGS:
        p = params.get(key)
        if key not in kwargs and p is not None and p.kind in (
                inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
            kwargs[key] = given[key]
    return kwargs


def build_user_model(obj: Callable[..., nn.Module], name: str, args: Mapping[str, Any],
                     input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """``obj(**model.args)`` with the data's shape where it asks for it (``model_kwargs``);
    a call that refuses the arguments names ``model.args``, a result that is not an
    nn.Module names ``model.name``, each in one line (the driver builds the model before
    round 1, so this fails before any round runs or anything is written)."""
    try:
        module = obj(**model_kwargs(obj, args, input_shape, num_classes))
    except TypeError as exc:
        raise key_error("model.args", f"{name} refused them: {one_line(exc)}",
                        dict(args)) from None
    if not isinstance(module, nn.Module):
        raise key_error("model.name", f"must build a torch.nn.Module; it returned a "
                        f"{type(module).__name__}", name)
    return module


def model_factory(name: str, args: Mapping[str, Any] | None, input_shape: tuple[int, ...],
                  num_classes: int) -> Callable[[], nn.Module]:
    """The zero-argument model factory a run hands its driver and workers: a registered
    name's (unchanged: ``build_model``), or a user's model by import path, resolved here
    (``user_model``) so that it is pickled by value with its module."""
    if not is_import_path(name):
        return functools.partial(build_model, name, tuple(input_shape), num_classes,
                                 **dict(args or {}))
    args = dict(args or {})
    return functools.partial(build_user_model, user_model(name, args), name, args,
                             tuple(input_shape), num_classes)


def source_model_factory(model: Any, source: Any) -> Callable[[], nn.Module]:
    """``model_factory`` for a job's ``model`` section (name and args) and the inputs and
    classes of the ``source`` it trains on: what a run, and a sweep's estimate of a trial,
    build."""
    from omegaconf import OmegaConf

    args = (OmegaConf.to_container(model.args, resolve=True) if OmegaConf.is_config(model.args)
            else thawed(model.args))  # a typed section's (fedray.config.typed)
    return model_factory(model.name, args, tuple(source.input_shape), source.num_classes)


def fit_problem(module: nn.Module, input_shape: tuple[int, ...], num_classes: int,
                loss: str, data: str = "the data", label_shape: tuple[int, ...] = ()
                ) -> str | None:
    """Why ``module`` cannot train on data of ``input_shape`` with labels in
    ``0..num_classes-1`` under ``loss``, or None when it can. ``label_shape``: () for one
    label per example, (L,) for a vector of L: a sequence (next-character or next-word
    targets), which ``sequence_cross_entropy`` takes, or a 0/1 vector over the classes
    (tags), which ``multi_label_bce`` takes; each of those two losses needs one.

    One forward pass on a single zero example, in eval mode and without gradients (no
    dropout mask or batch-norm statistic changes), finds a wrong input width or too few
    outputs before the first round, where otherwise a worker fails mid-round with a raw
    shape or index error that names neither the model nor the data."""
    if label_shape and loss not in VECTOR_LABEL:
        return (f"trains with model.loss={loss}, but {data} has a sequence of "
                f"{' x '.join(map(str, label_shape))} labels per example: use "
                "model.loss=sequence_cross_entropy (a target per position) or "
                "multi_label_bce (a 0/1 vector of labels)")
    if loss in VECTOR_LABEL and not label_shape:
        return (f"trains with model.loss={loss}, which needs a vector of labels per "
                f"example; {data} has one")
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            param = next(module.parameters(), None)
            device = param.device if param is not None else torch.device("cpu")
            out = module(torch.zeros((1, *input_shape), device=device))
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"cannot run on the inputs of {data}, of shape {tuple(input_shape)}: {first}"
    finally:
        module.train(was_training)
    if not isinstance(out, torch.Tensor) or out.dim() < 1 or len(out) != 1:
        return "must return one output row per example"
    width = out[0].numel()
    if loss == "cross_entropy" and out.dim() == 3:
        return (f"outputs {out.shape[1]} x {out.shape[2]} logits per example (a row per "
                f"position), which model.loss=cross_entropy cannot score: such a model "
                f"trains with model.loss=sequence_cross_entropy")
    if loss == "cross_entropy" and (out.dim() != 2 or width < num_classes):
        return (f"outputs {width} logits per example, but {data} has {num_classes} "
                f"classes (labels 0..{num_classes - 1})")
    if loss == "sequence_cross_entropy" and (out.dim() != 3 or out.shape[-1] < num_classes):
        return (f"outputs shape {tuple(out.shape[1:])} per example; "
                f"model.loss=sequence_cross_entropy needs [positions, classes] logits with "
                f"at least the {num_classes} classes of {data}")
    if loss == "multi_label_bce" and (out.dim() != 2 or width != math.prod(label_shape)):
        return (f"outputs shape {tuple(out.shape[1:])} per example; model.loss="
                f"multi_label_bce needs one logit per label: {math.prod(label_shape)}")
    if loss == "bce" and width != 1:
        return f"outputs {width} values per example; model.loss=bce needs one logit"
    return None
