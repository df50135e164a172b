"""The Shakespeare character model and its sequence loss: seed 002's shapes, the loss and
accuracy that leave padding out (against a hand computation), evaluation's denominator, and
why such a model always trains one client after another."""

from __future__ import annotations

import math

import pytest
import torch

from fedray.core.evaluation import evaluate
from fedray.core.losses import SEQUENCE_PAD, correct_fn, count_fn, loss_fn
from fedray.core.models import build_model, fit_problem
from fedray.errors import FedrayError
from fedray.kernels.vectorized import vectorize_plan


def test_shakespeare_lstm_has_seed_002s_shapes():
    model = build_model("shakespeare_lstm", (80,), 90)
    assert model.embed.weight.shape == (90, 8)  # 8-dimensional embedding of 90 tokens
    assert model.lstm.num_layers == 2 and model.lstm.hidden_size == 256
    assert model.out.weight.shape == (90, 256)
    x = torch.randint(0, 90, (3, 80)).float()  # stores hand token ids over as floats
    assert model(x).shape == (3, 80, 90)
    seq = (80,)  # the store's label_shape
    assert fit_problem(model, (80,), 90, "sequence_cross_entropy", label_shape=seq) is None
    assert "needs [positions, classes] logits" in fit_problem(
        build_model("logreg", (80,), 90), (80,), 90, "sequence_cross_entropy", label_shape=seq)
    # the loss and the labels must agree, before any round
    assert "use model.loss=sequence_cross_entropy" in fit_problem(
        model, (80,), 90, "cross_entropy", "the store s", label_shape=seq)
    assert "needs a vector of labels per example; the data has one" in fit_problem(
        model, (80,), 90, "sequence_cross_entropy")
    assert "trains with model.loss=sequence_cross_entropy" in fit_problem(
        model, (80,), 90, "cross_entropy")
    with pytest.raises(ValueError, match="needs \\(sequence length,\\) inputs"):
        build_model("shakespeare_lstm", (1, 28, 28), 62)


def _hand_case() -> tuple[torch.Tensor, torch.Tensor]:
    """Two sequences of 3 positions over 4 classes; 2 of the 6 targets are padding."""
    out = torch.tensor([[[2.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0], [0.0, 0.0, 0.0, 9.0]],
                        [[0.0, 0.0, 1.0, 0.0], [5.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])
    y = torch.tensor([[1, 1, SEQUENCE_PAD], [2, 3, SEQUENCE_PAD]])
    return out, y


def test_sequence_loss_and_accuracy_leave_padding_out():
    out, y = _hand_case()

    def ce(logits: list[float], target: int) -> float:
        return math.log(sum(math.exp(v) for v in logits)) - logits[target]

    terms = [ce([2, 0, 0, 0], 1), ce([0, 3, 0, 0], 1), ce([0, 0, 1, 0], 2), ce([5, 0, 0, 0], 3)]
    # float32 log-softmax against float64 math: a few float32 ulps (2^-23 ~ 1.2e-7 relative)
    # per term and per sum, so rel 1e-6 (~8 ulps); leaving padding in would be off by whole
    # terms (> 10% here)
    loss = loss_fn("sequence_cross_entropy")
    assert float(loss(out, y, reduction="sum")) == pytest.approx(sum(terms), rel=1e-6)
    assert float(loss(out, y)) == pytest.approx(sum(terms) / 4, rel=1e-6)  # 4 counted
    per_sequence = loss(out, y, reduction="none")
    assert per_sequence.tolist() == pytest.approx([terms[0] + terms[1], terms[2] + terms[3]],
                                                  rel=1e-6)
    # argmax: position (0,0) says 0 (target 1), (0,1) 1 (right), (1,0) 2 (right), (1,1) 0
    # (target 3); the padded positions' argmax (3, 0) do not count
    assert correct_fn("sequence_cross_entropy")(out, y) == 2
    assert count_fn("sequence_cross_entropy")(y) == 4
    assert count_fn("cross_entropy")(y) == 2  # examples
    all_pad = torch.full((1, 3), SEQUENCE_PAD)
    assert float(loss(out[:1], all_pad)) == 0.0  # nothing to predict: no NaN


def test_evaluation_divides_by_non_padding_positions():
    out, y = _hand_case()

    class Fixed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return out[x[:, 0].long()]

    x = torch.tensor([[0.0], [1.0]])
    sums = evaluate(Fixed(), x, y, batch_size=1, device=torch.device("cpu"),
                    loss="sequence_cross_entropy")
    assert sums.count == 4 and sums.correct == 2 and sums.accuracy == 0.5
    total = float(loss_fn("sequence_cross_entropy")(out, y, reduction="sum"))
    assert sums.mean_loss == pytest.approx(total / 4, rel=1e-6)


def test_recurrent_models_train_sequentially_unless_forced():
    """auto keeps the LSTM sequential (the unrolled, batched LSTM measured slower: issue 47,
    docs/performance.md) and says why; on trains it batched, the sequence loss included
    (tests/kernels/test_recurrent.py checks it against sequential training)."""
    lstm = build_model("shakespeare_lstm", (80,), 90)
    on, why = vectorize_plan(lstm, "auto", gpu=False, loss="sequence_cross_entropy")
    assert not on and "LSTM, unrolled for batched training" in why and "\n" not in why
    assert vectorize_plan(lstm, "auto", gpu=True)[0] is False
    assert vectorize_plan(lstm, "on", gpu=True, loss="sequence_cross_entropy") == (True, None)
    # a model without a recurrent layer, with a loss over positions: batched under auto
    logreg = build_model("logreg", (80,), 90)
    assert vectorize_plan(logreg, "auto", gpu=False, loss="sequence_cross_entropy") == (True,
                                                                                        None)


def test_in_memory_sequence_clients_train(tmp_path):
    """client_data with [n, L] integer labels are sequences of targets (fedray.run's
    in-memory route, as benchmarks/throughput.py's LSTM workload uses it): two rounds of the
    LSTM, in process, with accuracy counted over the non-padding positions only."""
    import numpy as np

    import fedray

    g = np.random.default_rng(0)
    clients = {}
    for c in range(3):
        x = g.integers(1, 90, size=(5, 80))
        y = np.concatenate([x[:, 1:], g.integers(1, 90, size=(5, 1))], axis=1)
        y[:, 70:] = SEQUENCE_PAD  # padded tails
        clients[c] = (x.astype(np.float32), y)
    test = (clients[0][0], clients[0][1])
    res = fedray.run({"rounds": 2, "model": {"name": "shakespeare_lstm",
                                            "loss": "sequence_cross_entropy"},
                      "client": {"batch_size": 4, "lr": 0.5},
                      "sampling": {"clients_per_round": 2},
                      "runtime": {"backend": "inline", "num_workers": 1},
                      "output": {"dir": str(tmp_path / "run")}},
                     model_fn=lambda: build_model("shakespeare_lstm", (80,), 90),
                     client_data=clients, test_data=test)
    final = res.summary["final"]
    assert math.isfinite(final["test_loss"]) and 0 <= final["test_accuracy"] <= 1
    with pytest.raises(FedrayError, match="clients have different label shapes"):
        fedray.run({"rounds": 1, "output": {"dir": str(tmp_path / "bad")},
                    "sampling": {"clients_per_round": 2}, "runtime": {"backend": "inline"}},
                   model_fn=lambda: build_model("shakespeare_lstm", (80,), 90),
                   client_data={0: clients[0], 1: (clients[1][0], clients[1][1][:, 0])})
