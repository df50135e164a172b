"""Model registry: shapes, parameter counts, input checks and the CIFAR preprocessing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision
from tolerance import f32_atol
from torch import nn

from fedray.core.models import (
    MODELS,
    CifarPreprocess,
    SafeBatchNorm1d,
    build_model,
    per_image_standardization,
)

SHAPES = {
    "cifar_cnn_bn": ((3, 32, 32), 10),
    "emnist_cnn": ((1, 28, 28), 62),
    "emnist_cnn_bn": ((1, 28, 28), 62),
    "leaf_cnn": ((1, 28, 28), 62),
    "leaf_logreg": ((60,), 5),
    "leaf_celeba_cnn": ((3, 84, 84), 2),
    "leaf_sent140_lstm": ((25,), 2),  # word ids; rand() inputs read as id 0
    "logreg": ((1, 28, 28), 10),
    "mlp": ((1, 28, 28), 10),
    "pfl_cifar10_cnn": ((3, 32, 32), 10),
    "resnet18_gn": ((3, 32, 32), 100),
    "tag_logreg": ((10_000,), 500),  # Stack Overflow: bag of words -> tags
}
# one output per position, [batch, positions, classes] (tests/core/test_sequence_model.py)
SEQUENCE_SHAPES = {
    "shakespeare_lstm": ((80,), 90),
    "word_lstm": ((20,), 10_004),  # Stack Overflow: 20 words, 10,000 + 4 tokens
    "leaf_reddit_lstm": ((10,), 50),
}


def num_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def test_every_registered_model_has_a_test_shape():
    assert set(SHAPES) | set(SEQUENCE_SHAPES) == set(MODELS)


@pytest.mark.parametrize("name", sorted(SEQUENCE_SHAPES))
def test_sequence_output_shape(name):
    torch.manual_seed(0)
    (length,), classes = SEQUENCE_SHAPES[name]
    out = build_model(name, (length,), classes)(torch.randint(0, classes, (3, length)).float())
    assert out.shape == (3, length, classes) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("train", [True, False])
def test_output_shape(name, train):
    torch.manual_seed(0)
    shape, classes = SHAPES[name]
    model = build_model(name, shape, classes).train(train)
    with torch.no_grad():
        out = model(torch.rand(3, *shape))
    assert out.shape == (3, classes)
    assert torch.isfinite(out).all()


def test_leaf_cnn_param_count():
    expected = (1 * 32 * 25 + 32) + (32 * 64 * 25 + 64) + (3136 * 2048 + 2048) + (2048 * 62 + 62)
    assert num_params(build_model("leaf_cnn", (1, 28, 28), 62)) == expected


def test_leaf_cnn_other_size():
    model = build_model("leaf_cnn", (3, 30, 30), 5)
    assert model(torch.rand(2, 3, 30, 30)).shape == (2, 5)


def test_mlp_param_count():
    expected = 784 * 200 + 200 + 200 * 10 + 10
    assert num_params(build_model("mlp", (1, 28, 28), 10)) == expected
    assert build_model("mlp", (784,), 10)(torch.rand(2, 784)).shape == (2, 10)


def test_resnet18_gn_param_count():
    reference = num_params(torchvision.models.resnet18(num_classes=100))
    # Only the stem differs: 7x7x3x64 -> 3x3x3x64; GroupNorm has BatchNorm's affine params.
    expected = reference - 7 * 7 * 3 * 64 + 3 * 3 * 3 * 64
    model = build_model("resnet18_gn", (3, 32, 32), 100)
    assert num_params(model) == expected


def test_resnet18_gn_structure():
    model = build_model("resnet18_gn", (3, 32, 32), 100)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    gns = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert len(gns) == 20 and all(m.num_groups == 2 for m in gns)
    assert list(model.buffers()) == []
    assert isinstance(model[0], CifarPreprocess)
    net = model[1]
    assert net.conv1.kernel_size == (3, 3) and net.conv1.stride == (1, 1)
    assert isinstance(net.maxpool, nn.Identity)


def test_resnet18_gn_flat_model_forward_backward():
    from fedray.core.flat_model import FlatModel

    torch.manual_seed(0)
    model = build_model("resnet18_gn", (3, 32, 32), 100)
    flat = FlatModel(model)
    assert flat.size == flat.num_params == num_params(model)
    model.train()
    loss = nn.functional.cross_entropy(model(torch.rand(2, 3, 32, 32)), torch.tensor([1, 7]))
    loss.backward()
    assert torch.isfinite(flat.grad).all() and flat.grad.abs().sum() > 0


@pytest.mark.parametrize("name,shape,needle", [
    ("leaf_cnn", (784,), "leaf_cnn"),
    ("leaf_cnn", (1, 2, 2), "leaf_cnn"),
    ("emnist_cnn", (784,), "emnist_cnn"),
    ("resnet18_gn", (3, 16, 16), "resnet18_gn"),
    ("resnet18_gn", (3, 32, 20), "resnet18_gn"),
    ("resnet18_gn", (3072,), "resnet18_gn"),
    ("mlp", (), "mlp"),
    ("emnist_cnn_bn", (784,), "emnist_cnn_bn"),
    ("emnist_cnn_bn", (1, 5, 28), "emnist_cnn_bn"),
    ("cifar_cnn_bn", (3072,), "cifar_cnn_bn"),
    ("cifar_cnn_bn", (3, 32, 3), "cifar_cnn_bn"),
])
def test_bad_shapes_raise(name, shape, needle):
    with pytest.raises(ValueError, match=needle):
        build_model(name, shape, 10)


# --- BatchNorm models (FedBN) ------------------------------------------------------------

BN_MODELS = {"emnist_cnn_bn": [((1, 28, 28), 10), ((3, 32, 32), 10)],
             "cifar_cnn_bn": [((3, 32, 32), 10), ((1, 28, 28), 10)]}


@pytest.mark.parametrize("name", sorted(BN_MODELS))
def test_bn_model_shapes_stats_and_flat_vector(name):
    """Each BatchNorm model builds for MNIST and CIFAR shapes, has running statistics, one
    training step updates them, and the flat vector carries them (so averaging and FedBN's
    ``local`` reach them)."""
    from fedray.core.flat_model import FlatModel
    from fedray.core.model_parts import head_prefixes

    for shape, classes in BN_MODELS[name]:
        torch.manual_seed(0)
        model = build_model(name, shape, classes)
        bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        assert [type(m) for m in bns] == [nn.BatchNorm2d, nn.BatchNorm2d, SafeBatchNorm1d]
        flat = FlatModel(model)
        names = [n for n, _, _ in flat.spans]
        assert sum(n.endswith("running_mean") for n in names) == 3
        assert sum(n.endswith("running_var") for n in names) == 3
        assert flat.size == flat.num_params + 2 * sum(m.num_features for m in bns)
        assert head_prefixes(model) == ("classifier." + str(len(model.classifier) - 1) + ".",)
        before = flat.flat.clone()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model.train()
        x, y = torch.rand(8, *shape), torch.randint(0, classes, (8,))
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        assert torch.isfinite(loss) and torch.isfinite(flat.flat).all()
        moved = {n for n, o, k in flat.spans if not torch.equal(flat.flat[o:o + k],
                                                                 before[o:o + k])}
        assert {n for n in names if "running_" in n} <= moved
        with torch.no_grad():
            assert model.eval()(x).shape == (8, classes)


def test_emnist_cnn_bn_is_emnist_cnn_with_normalization():
    """The same layers as emnist_cnn, the three a BatchNorm follows without their bias."""
    plain, bn = (build_model(n, (1, 28, 28), 62) for n in ("emnist_cnn", "emnist_cnn_bn"))
    norm = 2 * (32 + 64 + 128)  # each BatchNorm's weight and bias
    assert num_params(bn) == num_params(plain) - (32 + 64 + 128) + norm
    assert [type(m) for m in bn.features] == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.Conv2d,
                                              nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d,
                                              nn.Dropout, nn.Flatten]


def test_cifar_cnn_bn_param_count():
    expected = (3 * 32 * 25 + 2 * 32) + (32 * 64 * 25 + 2 * 64) + (4096 * 512 + 2 * 512) \
        + (512 * 10 + 10)
    assert num_params(build_model("cifar_cnn_bn", (3, 32, 32), 10)) == expected


def test_a_training_batch_of_one_example_uses_the_running_statistics():
    """A batch of one (an epoch's last, a one-example client) trains instead of raising,
    normalized like evaluation, and leaves the fc BatchNorm's statistics as they were."""
    torch.manual_seed(0)
    model = build_model("emnist_cnn_bn", (1, 28, 28), 10).train()
    bn1d = model.classifier[1]
    mean, var = bn1d.running_mean.clone(), bn1d.running_var.clone()
    loss = nn.functional.cross_entropy(model(torch.rand(1, 1, 28, 28)), torch.tensor([3]))
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.equal(bn1d.running_mean, mean) and torch.equal(bn1d.running_var, var)
    x = torch.rand(1, 128)
    torch.testing.assert_close(bn1d(x), bn1d.eval()(x), rtol=0, atol=0)


def test_bn_models_are_refused_by_the_vectorized_kernel():
    from fedray.kernels.vectorized import unsupported_reason

    for name in BN_MODELS:
        assert "batch-norm" in unsupported_reason(build_model(name, *SHAPES[name]))


# --- preprocessing -----------------------------------------------------------------------

def np_standardize(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    n = x[0].size
    mean = x.reshape(len(x), -1).mean(1)[:, None, None, None]
    std = x.reshape(len(x), -1).std(1)[:, None, None, None]
    return (x - mean) / np.maximum(std, 1 / np.sqrt(n))


def std_atol(expected: np.ndarray) -> float:
    """float32 standardization against float64: the mean and std are float32 reductions
    over 1,728 values (3 x 24 x 24) summed in the CPU's order (vector width, blocking), off
    by up to ~log2(1728) = 11 ulps of their size each, which (x - mean) / std scales by
    |mean| / std (about 1.7 for uniform pixels) and |z| (below 2): 32 ulps of the largest
    standardized value."""
    return f32_atol(expected, ulps=32)


def test_eval_mode_is_central_crop_then_standardization():
    x = torch.rand(5, 3, 32, 32) * 255
    out = CifarPreprocess().eval()(x)
    expected = np_standardize(x.numpy()[:, :, 4:28, 4:28])
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=std_atol(expected))


def test_eval_mode_odd_margin():
    x = torch.rand(2, 3, 27, 25)
    out = CifarPreprocess().eval()(x)
    expected = np_standardize(x.numpy()[:, :, 1:25, 0:24])
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=std_atol(expected))


def test_train_mode_shape_and_moments():
    torch.manual_seed(0)
    out = CifarPreprocess().train()(torch.rand(16, 3, 32, 32) * 255)
    assert out.shape == (16, 3, 24, 24)
    flat = out.reshape(16, -1)
    torch.testing.assert_close(flat.mean(1), torch.zeros(16), atol=1e-4, rtol=0)
    torch.testing.assert_close(flat.std(1, correction=0), torch.ones(16), atol=1e-4, rtol=0)


def test_train_mode_seeded():
    pre = CifarPreprocess().train()
    x = torch.rand(8, 3, 32, 32)
    torch.manual_seed(1)
    a = pre(x)
    torch.manual_seed(1)
    b = pre(x)
    torch.manual_seed(2)
    c = pre(x)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def _matches(out_img: np.ndarray, full: np.ndarray) -> list[tuple[int, int, bool]]:
    hits = []
    for top in range(9):
        for left in range(9):
            window = full[:, top:top + 24, left:left + 24]
            for flip in (False, True):
                cand = window[:, :, ::-1] if flip else window
                expected = np_standardize(cand[None])[0]
                if np.allclose(out_img, expected, rtol=0, atol=std_atol(expected)):
                    hits.append((top, left, flip))
    return hits


def test_train_mode_is_a_window_possibly_flipped():
    x = torch.rand(4, 3, 32, 32)
    pre = CifarPreprocess().train()
    seen_flip = set()
    for seed in range(4):
        torch.manual_seed(seed)
        out = pre(x).numpy()
        for i in range(4):
            hits = _matches(out[i], x[i].numpy())
            assert len(hits) == 1, (seed, i, hits)
            seen_flip.add(hits[0][2])
    assert seen_flip == {False, True}


def test_constant_image_is_finite():
    x = torch.full((2, 3, 32, 32), 7.0)
    for train in (True, False):
        out = CifarPreprocess().train(train)(x)
        assert torch.isfinite(out).all()
        assert torch.equal(out, torch.zeros_like(out))
    assert torch.isfinite(per_image_standardization(torch.zeros(1, 3, 4, 4))).all()


def test_preprocess_has_no_state():
    pre = CifarPreprocess()
    assert list(pre.parameters()) == [] and list(pre.buffers()) == []


# -- a user's model by import path (model.name: module:Class or file.py:Class) --------------

USER_MODELS = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, input_shape, num_classes, width: int = 3):
        super().__init__()
        self.seen = (tuple(input_shape), num_classes, width)
        self.fc = nn.Linear(input_shape[-1], num_classes)

    def forward(self, x):
        return self.fc(x)


class Fixed(nn.Module):
    def __init__(self, num_classes: int = 2, **kwargs):  # **kwargs: no input_shape given
        super().__init__()
        self.seen = (num_classes, kwargs)
        self.fc = nn.Linear(4, num_classes)


class Picky(nn.Module):
    def __init__(self, width: int = 3):
        super().__init__()
        if not isinstance(width, int):
            raise TypeError(f"width must be an int, not {type(width).__name__}")


def factory(hidden: int = 2):
    return nn.Linear(4, hidden)


def not_a_model():
    return torch.zeros(3)


class Plain:
    pass


CONSTANT = 7
'''


@pytest.fixture
def user_file(tmp_path, monkeypatch):
    """A user's models file, named by its path; the import path it adds to sys.path (its
    directory, for its neighbours) is undone after the test."""
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    path = tmp_path / f"usermodels_{tmp_path.name.replace('-', '_')}.py"
    path.write_text(USER_MODELS)
    return str(path)


def test_a_user_model_gets_its_args_and_the_data_where_its_signature_names_them(user_file):
    from fedray.core.models import model_factory

    net = model_factory(f"{user_file}:Net", {"width": 5}, (1, 4), 3)()
    assert net.seen == ((1, 4), 3, 5)
    net = model_factory(f"{user_file}:Net", {"num_classes": 9}, (1, 4), 3)()
    assert net.seen == ((1, 4), 9, 3)  # model.args wins over the data's
    fixed = model_factory(f"{user_file}:Fixed", {}, (1, 4), 3)()
    assert fixed.seen == (3, {})  # named: num_classes; caught by **kwargs only: nothing
    assert isinstance(model_factory(f"{user_file}:factory", {"hidden": 6}, (1, 4), 3)(),
                      nn.Linear)


def test_a_registered_model_is_built_as_before():
    """A registered name takes the unchanged path: the same factory, the same draws."""
    from fedray.core.models import model_factory

    torch.manual_seed(0)
    want = build_model("mlp", (1, 28, 28), 10).state_dict()
    torch.manual_seed(0)
    got = model_factory("mlp", {}, (1, 28, 28), 10)().state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("attr, args, key, needle", [
    ("Nope", {}, "model.name", r"module .*usermodels_\w+\.py has no Nope"),
    ("Plain", {}, "model.name", r"must name a torch\.nn\.Module subclass or a function that "
                                r"returns one; Plain is a class that is not one"),
    ("CONSTANT", {}, "model.name", r"CONSTANT is a int object"),
    ("Net", {"depth": 2}, "model.args", r"Net does not take them: got an unexpected keyword "
                                        r"argument 'depth', got \{'depth': 2\}"),
    ("Picky", {"width": 1, "input_shape": [3]}, "model.args", r"Picky does not take them"),
])
def test_what_cannot_be_a_model_is_refused_in_one_line(user_file, attr, args, key, needle):
    from fedray.core.models import user_model
    from fedray.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^config key '{key}': .*{needle}") as exc:
        user_model(f"{user_file}:{attr}", args)
    assert "\n" not in str(exc.value)


def test_what_fails_only_when_built_names_its_key(user_file):
    """A constructor that refuses a value's type (only a call finds it), and a function that
    returns something other than a module."""
    from fedray.core.models import model_factory
    from fedray.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^config key 'model\.args': .*Picky refused them: "
                                          r"width must be an int, not str, got \{'width'"):
        model_factory(f"{user_file}:Picky", {"width": "3"}, (1, 4), 3)()
    with pytest.raises(ConfigError, match=r"^config key 'model\.name': must build a torch\.nn"
                                          r"\.Module; it returned a Tensor, got '.*:not_a_model'"):
        model_factory(f"{user_file}:not_a_model", {}, (1, 4), 3)()
    with pytest.raises(ConfigError, match=r"^config key 'model\.name': no such file"):
        model_factory(f"{user_file}x:Net", {}, (1, 4), 3)


def test_a_model_file_and_the_helper_beside_it_travel_by_value(tmp_path, monkeypatch):
    """A model in ``dir/net.py`` that imports ``dir/layers_*.py``: imported by path, the
    helper resolves as it does for `python dir/net.py`, and both are pickled by value, so a
    process that has neither file on its path (a Ray worker) unpickles the model's class."""
    import pickle
    import subprocess
    import sys

    from ray import cloudpickle

    from fedray.core.models import model_factory

    monkeypatch.setattr("sys.path", list(sys.path))
    helper = f"layers_{tmp_path.name.replace('-', '_')}"  # a name no process has imported
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / f"{helper}.py").write_text("from torch import nn\n\n\ndef head(n):\n"
                                         "    return nn.Linear(4, n)\n")
    (folder / "net.py").write_text(f"from torch import nn\n\nimport {helper}\n\n\n"
                                   "class Net(nn.Sequential):\n"
                                   "    def __init__(self, num_classes):\n"
                                   f"        super().__init__({helper}.head(num_classes))\n")
    make = model_factory(f"{folder / 'net.py'}:Net", {}, (4,), 3)
    blob = cloudpickle.dumps(make)
    code = ("import pickle, sys; make = pickle.loads(sys.stdin.buffer.read()); "
            "print(type(make()).__name__, make()[0].out_features)")
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True,
                         cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    assert out.stdout.decode().split() == ["Net", "3"]
    assert pickle.loads(blob)()[0].out_features == 3


def test_a_model_file_that_failed_to_import_is_imported_again_once_fixed(tmp_path,
                                                                         monkeypatch):
    """A file whose import raised is not left half-run in sys.modules (where the next
    import would find it and say it has no such class); a path that is not Python source
    is refused without running anything."""
    from fedray.core.models import user_model
    from fedray.errors import ConfigError

    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    path = tmp_path / f"fixme_{tmp_path.name.replace('-', '_')}.py"
    path.write_text("raise RuntimeError('not yet')\n")
    with pytest.raises(ConfigError, match=r"cannot import .*: RuntimeError: not yet"):
        user_model(f"{path}:Net")
    path.write_text("from torch import nn\n\n\nclass Net(nn.Linear):\n"
                    "    def __init__(self):\n        super().__init__(2, 2)\n")
    assert user_model(f"{path}:Net").__name__ == "Net"
    (tmp_path / "weights.bin").write_bytes(b"\0")
    with pytest.raises(ConfigError, match=r"^config key 'model\.name': cannot import .*"
                                          r"weights\.bin: not a \.py file"):
        user_model(f"{tmp_path / 'weights.bin'}:Net")


def test_pfl_cifar10_cnn_is_pfl_researchs_simple_cnn():
    """apple/pfl-research benchmarks/model/pytorch/cnn.py simple_cnn((32, 32, 3), 10):
    unpadded 3x3 convs of 32 and 64, one 2x2 pooling, fc128, fc10 (12,544 flat features),
    dropout 0.25 and 0.5, Xavier-uniform weights."""
    torch.manual_seed(0)
    m = build_model("pfl_cifar10_cnn", (3, 32, 32), 10)
    shapes = [tuple(p.shape) for p in m.parameters()]
    assert shapes == [(32, 3, 3, 3), (32,), (64, 32, 3, 3), (64,), (128, 12544), (128,),
                      (10, 128), (10,)]
    assert num_params(m) == 896 + 18_496 + 1_605_760 + 1_290
    assert [mod.p for mod in m.modules() if isinstance(mod, nn.Dropout)] == [0.25, 0.5]
    for w in [p for p in m.parameters() if p.dim() > 1]:
        fan_in = w.shape[1] * w[0, 0].numel()
        fan_out = w.shape[0] * w[0, 0].numel()
        bound = (6 / (fan_in + fan_out)) ** 0.5  # Glorot uniform
        assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound

