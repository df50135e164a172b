"""The unrolled LSTM (fedray.kernels.recurrent) computes nn.LSTM, and the vectorized kernel
trains an LSTM with the sequence loss as sequential training does, client by client.

Tolerances are float32 ulps of the values' size (tests/tolerance.py). The unrolled LSTM
sums each gate's products in another order than the fused kernel (the input and recurrent
products apart, then added, where the fused kernel may add them in one product; oneDNN or
MKL choose their own blocking per CPU) and its backward pass runs the same chain rule in
another order (each step's gate gradients stacked, W_hh's gradient one product over the
time steps, where the fused backward adds it up step by step). Each of those sums rounds
to within about 1 ulp of its size, and an error in h_t goes on through the later steps
damped by the gates (each factor below 1), so a result is a few ulps of its size off, not
more; a wrong gate order, a missing bias or a wrong derivative is off by far more than
1e-3 of the values (thousands of ulps)."""

import pytest
import torch
from tolerance import ULPS_PER_STEP, f32_atol
from torch import nn
from torch.func import functional_call, grad, vmap

from fedray.core.flat_model import FlatModel
from fedray.core.losses import loss_fn
from fedray.core.models import CharLSTM, build_model
from fedray.kernels.recurrent import UnrolledLSTM, lstm_refusal, unrolled
from fedray.kernels.sequential import local_sgd
from fedray.kernels.vectorized import unsupported_reason, vectorize_plan, vmap_local_sgd

# the forward pass: one product and a few elementwise roundings per gate and step, the
# error carried on at most undamped: 16 ulps of the outputs' size covers a 12-step sequence
# with room for a CPU whose products round differently
FORWARD_ULPS = 16
# the gradients: sums over the batch and the time steps, in another grouping (W_hh's is one
# product here, a running sum there); each rounds to about 1 ulp of the size of the largest
# gradient entry of the same parameter, a few such sums chain: 32 ulps of its size
GRAD_ULPS = 32


def _sequences(n: int, length: int, vocab: int, gen: torch.Generator):
    """``n`` token sequences and their targets, every other one with a padded tail (the
    target pad id 0, as the Shakespeare sources pad), one of them padding only."""
    x = torch.randint(1, vocab, (n, length), generator=gen).float()
    y = torch.randint(1, vocab, (n, length), generator=gen)
    y[::2, length * 2 // 3:] = 0
    if n > 3:
        y[3] = 0
    return x, y


@pytest.mark.parametrize("layers,batch_first,bias", [(2, True, True), (1, False, True),
                                                     (3, True, False)])
def test_unrolled_lstm_is_nn_lstm(layers, batch_first, bias):
    """Outputs, final states and every parameter's gradient, against nn.LSTM's, with and
    without an initial state, batched and unbatched."""
    torch.manual_seed(0)
    lstm = nn.LSTM(5, 7, num_layers=layers, batch_first=batch_first, bias=bias)
    twin = UnrolledLSTM(lstm)
    assert [n for n, _ in twin.named_parameters()] == [n for n, _ in lstm.named_parameters()]
    x = torch.randn((3, 12, 5) if batch_first else (12, 3, 5))
    hx = (torch.randn(layers, 3, 7), torch.randn(layers, 3, 7))
    for state in (None, hx):
        want_out, (want_h, want_c) = lstm(x, state)
        out, (h, c) = twin(x, state)
        for got, want in ((out, want_out), (h, want_h), (c, want_c)):
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=0,
                                       atol=f32_atol(want, ulps=FORWARD_ULPS))
        weights = torch.randn_like(want_out)  # a loss that reads every output
        want_g = torch.autograd.grad((want_out * weights).sum() + want_c.sum(),
                                     list(lstm.parameters()))
        got_g = torch.autograd.grad((out * weights).sum() + c.sum(), list(twin.parameters()))
        for got, want in zip(got_g, want_g, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=f32_atol(want, ulps=GRAD_ULPS))
    one = x[:, 0] if not batch_first else x[0]  # unbatched: [time, features]
    torch.testing.assert_close(twin(one)[0], lstm(one)[0], rtol=0,
                               atol=f32_atol(lstm(one)[0], ulps=FORWARD_ULPS))


def test_vmap_batches_the_unrolled_lstm_client_by_client():
    """Under vmap(grad(...)), each client's gradient of the sequence loss is its own: the
    same as grad of that client alone through the fused nn.LSTM."""
    torch.manual_seed(1)
    model = CharLSTM(vocab_size=11, embedding=4, hidden=9, layers=2)
    call = unrolled(model)
    names = [n for n, _ in model.named_parameters()]
    criterion = loss_fn("sequence_cross_entropy")
    gen = torch.Generator().manual_seed(2)
    clients = [_sequences(4, 10, 11, gen) for _ in range(3)]
    stacks = tuple(torch.stack([p.detach() + 0.05 * k for k in range(3)])
                   for p in model.parameters())

    def client_loss(ws, xb, yb):
        return criterion(functional_call(call, dict(zip(names, ws, strict=True)), (xb,)), yb)

    got = vmap(grad(client_loss))(stacks, torch.stack([c[0] for c in clients]),
                                  torch.stack([c[1] for c in clients]))
    for k, (x, y) in enumerate(clients):
        ws = {n: s[k].clone().requires_grad_() for n, s in zip(names, stacks, strict=True)}
        want = torch.autograd.grad(criterion(functional_call(model, ws, (x,)), y),
                                   list(ws.values()))
        for g_all, w in zip(got, want, strict=True):
            torch.testing.assert_close(g_all[k], w, rtol=0, atol=f32_atol(w, ulps=GRAD_ULPS))


def test_vectorized_lstm_with_the_sequence_loss_equals_sequential():
    """A small CharLSTM (seed 002's layout: embedding, two LSTM layers, dense logits at every
    position) trained by vmap_local_sgd with model.loss=sequence_cross_entropy: each client's
    delta, loss sum (per step the mean over the batch's non-padding positions, weighed by its
    sequences) and step count are its sequential training's. Clients of other sizes, padded
    batches (a client's last batch is short), sequences of padding only, and a client whose
    targets are all padding (every batch's mean loss is 0 and its gradient 0, as the
    sequential step's) are all in it.

    Tolerance: ULPS_PER_STEP float32 ulps of the weights' size per local step, as every
    other path of the vectorized kernel (tests/tolerance.py): a step's gradient is a few ulps
    of its size off the fused kernel's (the forward and backward sums above), the update
    lr * gradient is rounded at the weights' size, and the steps add up."""
    torch.manual_seed(3)
    model = FlatModel(CharLSTM(vocab_size=13, embedding=4, hidden=16, layers=2))
    gen = torch.Generator().manual_seed(4)
    data = [_sequences(n, 12, 13, gen) for n in (5, 9, 3, 6)]
    data.append((data[0][0][:3], torch.zeros_like(data[0][1][:3])))  # padding targets only
    lrs, seeds = [0.5, 0.3, 0.8, 0.4, 0.6], [1, 2, 3, 4, 5]
    w0 = model.flat.clone()
    kw = dict(batch_size=2, local_epochs=2, local_steps=None, loss="sequence_cross_entropy")
    group = vmap_local_sgd(model, w0, data, lrs=lrs, seeds=seeds, **kw)
    assert group.path == "torch.func"
    assert torch.equal(model.flat, w0)  # the kernel trains copies
    for i, (x, y) in enumerate(data):
        want = local_sgd(model, w0, x, y, lr=lrs[i], seed=seeds[i],
                         delta_out=torch.empty_like(w0), **kw)
        assert group.steps[i] == want.steps and group.examples_seen[i] == want.examples_seen
        if i == len(data) - 1:  # nothing to learn: no step moves it, in either kernel
            assert not want.delta.any() and not group.delta(i).any()
            assert want.loss_sum == group.loss_sums[i] == 0.0
            continue
        assert float(want.delta.abs().max()) > 1e-3  # the clients did train
        atol = f32_atol(w0, w0 + want.delta, ulps=ULPS_PER_STEP * (want.steps + 1))
        torch.testing.assert_close(group.delta(i), want.delta, rtol=0, atol=atol)
        # the loss sums: float32 means of a few ulps each, times the batch's sequences
        assert group.loss_sums[i] == pytest.approx(want.loss_sum, rel=1e-5)


def test_shakespeare_lstm_takes_the_batched_step_when_forced():
    """Seed 002's model itself, at its real size, through one batched step of two clients
    (the probe's path): only ``on`` trains it batched; auto keeps it sequential and says
    why, on the CPU and the GPU (the measured reason: docs/performance.md, "Recurrent
    models, vectorized (issue 47)")."""
    lstm = build_model("shakespeare_lstm", (80,), 90)
    assert unsupported_reason(lstm) is None
    for gpu in (False, True):
        on, why = vectorize_plan(lstm, "auto", gpu=gpu, loss="sequence_cross_entropy")
        assert not on and "LSTM, unrolled for batched training, measured slower" in why
    assert vectorize_plan(lstm, "on", gpu=False, loss="sequence_cross_entropy") == (True, None)
    # a model without a recurrent layer, with the sequence loss: auto batches it
    logreg = build_model("logreg", (80,), 90)
    assert vectorize_plan(logreg, "auto", gpu=False, loss="sequence_cross_entropy") == (True,
                                                                                        None)


@pytest.mark.parametrize("layer,words", [
    (nn.LSTM(4, 5, bidirectional=True), "bidirectional"),
    (nn.LSTM(4, 5, proj_size=3), "projections"),
    (nn.LSTM(4, 5, num_layers=2, dropout=0.2), "dropout between LSTM layers"),
    (nn.GRU(4, 5), "not an nn.LSTM"),
    (nn.RNN(4, 5), "not an nn.LSTM"),
])
def test_recurrent_layers_it_cannot_unroll_are_refused_with_a_reason(layer, words):
    model = nn.Sequential()
    model.add_module("rnn", layer)
    assert words in lstm_refusal("rnn", layer)
    assert words in unsupported_reason(model)
    with pytest.raises(ValueError, match="runtime.worker.vectorize.*" + words):
        vectorize_plan(model, "on", gpu=False)
