"""Max-pooling searched channels-last (fedray/kernels/pooling.py): torch's own outputs and
input gradients, bit for bit -- the same maxima and the same indices, so no tolerance -- and
local training unchanged by it (pure math, no Ray)."""

from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fedray.kernels.pooling as pooling
from fedray.core.flat_model import FlatModel
from fedray.core.models import build_model
from fedray.kernels.pooling import ChannelsLastPooling
from fedray.kernels.sequential import local_sgd

# (kernel, stride, padding, dilation, ceil_mode): overlapping and not, padded, dilated, ceil
CONFIGS = [(2, None, 0, 1, False), (3, 2, 1, 1, False), (3, 1, 1, 1, False),
           (2, 2, 0, 2, False), (3, 2, 0, 1, True), ((2, 3), (1, 2), (1, 0), 1, False)]


def _input(shape, seed=0):
    """ReLU'd normals (a quarter of windows all zero: ties), values repeated across a row
    (ties between positive values), a NaN and an infinity."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).sub_(0.3).relu_()
    x[:, :, 1, :] = x[:, :, 0, :]
    x[0, 0, 2, 3] = float("nan")
    x[-1, -1, 0, 0] = float("inf")
    return x


@pytest.mark.parametrize("config", CONFIGS, ids=[str(c) for c in CONFIGS])
@pytest.mark.parametrize("shape", [(20, 32, 28, 28), (3, 70, 15, 11)])
def test_outputs_and_gradients_are_torchs_bit_for_bit(config, shape):
    kernel, stride, padding, dilation, ceil_mode = config
    layer = nn.MaxPool2d(kernel, stride, padding, dilation, ceil_mode=ceil_mode).train()
    x = _input(shape)
    assert x.numel() >= pooling.SMALLEST  # the channels-last search is what runs
    results = []
    for ours in (False, True):
        xi = x.clone().requires_grad_(True)
        if ours:
            with ChannelsLastPooling(layer).active():
                out = layer(xi)
        else:
            out = layer(xi)
        weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        (out.nan_to_num(0.0, 0.0, 0.0) * weights).sum().backward()
        results.append((out.detach(), xi.grad))
    (want, want_grad), (got, got_grad) = results
    assert got.is_contiguous() and got.shape == want.shape
    assert torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got_grad, want_grad)
    assert "forward" not in layer.__dict__  # the patch is gone


def test_small_and_unusual_inputs_take_torchs_path(monkeypatch):
    calls = []
    monkeypatch.setattr(pooling._MaxPool, "apply", lambda *a: calls.append(a))
    layer = nn.MaxPool2d(2)
    with ChannelsLastPooling(layer).active():
        small = layer(torch.randn(2, 3, 8, 8))  # below SMALLEST
        unbatched = layer(torch.randn(64, 32, 32))  # [C, H, W]
        cl = layer(torch.randn(8, 64, 16, 16).contiguous(memory_format=torch.channels_last))
    assert calls == [] and small.shape == (2, 3, 4, 4) and unbatched.shape == (64, 16, 16)
    assert cl.shape == (8, 64, 8, 8)


def test_layers_it_leaves_alone():
    class Mine(nn.MaxPool2d):  # a subclass may compute something else
        pass

    indices = nn.MaxPool2d(2, return_indices=True)
    own = nn.MaxPool2d(2)
    own.forward = lambda x: F.max_pool2d(x, 2)  # a forward of the user's
    model = nn.Sequential(Mine(2), indices, own, nn.MaxPool2d(2))
    assert ChannelsLastPooling(model).layers == [model[3]]
    assert not ChannelsLastPooling(model, "cuda")  # not on a GPU


def test_the_patch_is_removed_when_the_forward_fails():
    layer = nn.MaxPool2d(2)
    x = torch.randn(64, 600, 1, 1)  # 1x1 planes: no whole window, torch's error
    assert x.numel() >= pooling.SMALLEST
    with pytest.raises(RuntimeError), ChannelsLastPooling(layer).active():
        layer(x)
    assert "forward" not in layer.__dict__


@pytest.mark.parametrize("name", ["leaf_cnn", "emnist_cnn"])
def test_local_training_is_unchanged_bit_for_bit(name, monkeypatch):
    """The CNNs' local updates with and without the channels-last search: the same floats
    (every pinned CNN result elsewhere stays as it was)."""
    torch.manual_seed(0)
    model = FlatModel(build_model(name, (1, 28, 28), 62))
    w0 = model.flat.clone()
    g = torch.Generator().manual_seed(2)
    x, y = torch.rand(45, 1, 28, 28, generator=g), torch.randint(0, 62, (45,), generator=g)
    searched = []
    real = pooling._MaxPool.apply
    monkeypatch.setattr(pooling._MaxPool, "apply",
                        staticmethod(lambda *a: searched.append(1) or real(*a)))
    deltas = []
    for ours in (True, False):
        if not ours:
            monkeypatch.setattr(ChannelsLastPooling, "active", lambda self: nullcontext())
        out = torch.empty_like(w0)
        local_sgd(model, w0, x, y, lr=0.05, batch_size=20, local_epochs=1, local_steps=None,
                  seed=7, delta_out=out)
        deltas.append(out)
    assert searched  # the first run did search channels-last
    assert torch.equal(deltas[0], deltas[1]) and deltas[0].abs().max() > 0
