"""multi_label_bce (fedray.core.losses): the loss and recall@5 against a hand computation,
evaluation's sums, the model checks, the Stack Overflow models' shapes, and batched
(vectorized) training giving sequential training's update."""

from __future__ import annotations

import math

import pytest
import torch

from fedray.core.evaluation import evaluate
from fedray.core.flat_model import FlatModel
from fedray.core.losses import (
    PER_POSITION,
    RECALL_AT,
    VECTOR_LABEL,
    correct_fn,
    count_fn,
    loss_fn,
)
from fedray.core.models import build_model, fit_problem
from fedray.kernels.sequential import local_sgd
from fedray.kernels.vectorized import vectorize_plan, vmap_local_sgd


def _bce(z: float, t: int) -> float:
    """-log sigmoid(z) for a true label, -log(1 - sigmoid(z)) for a false one."""
    p = 1.0 / (1.0 + math.exp(-z))
    return -math.log(p) if t else -math.log(1.0 - p)


def _hand_case() -> tuple[torch.Tensor, torch.Tensor]:
    """Two examples over 7 labels. Example 0: true labels 0, 3 and 6; its 5 highest logits
    are labels 1, 2, 3, 4, 5, so 1 of its 3 true labels is found. Example 1: true label 2,
    among its top 5 (2, 0, 1, 3, 4)."""
    out = torch.tensor([[-1.0, 5.0, 4.0, 3.0, 2.0, 1.0, -2.0],
                        [4.0, 3.0, 5.0, 2.0, 1.0, -1.0, -3.0]])
    y = torch.tensor([[1, 0, 0, 1, 0, 0, 1], [0, 0, 1, 0, 0, 0, 0]])
    return out, y


def test_loss_is_per_label_bce_summed_over_labels_averaged_over_examples():
    out, y = _hand_case()
    per = [sum(_bce(float(out[i, j]), int(y[i, j])) for j in range(7)) for i in range(2)]
    loss = loss_fn("multi_label_bce")
    assert loss(out, y, reduction="none").tolist() == pytest.approx(per, rel=1e-6)
    assert float(loss(out, y, reduction="sum")) == pytest.approx(sum(per), rel=1e-6)
    assert float(loss(out, y)) == pytest.approx(sum(per) / 2, rel=1e-6)
    assert float(loss(out, y.float())) == pytest.approx(sum(per) / 2, rel=1e-6)  # float y


def test_recall_at_5_counts_true_labels_in_the_top_5():
    out, y = _hand_case()
    assert RECALL_AT == 5
    assert correct_fn("multi_label_bce")(out, y) == 1 + 1  # found: label 3; label 2
    assert count_fn("multi_label_bce")(y) == 3 + 1  # every true label
    # fewer labels than 5: all of them are the "top 5"
    assert correct_fn("multi_label_bce")(out[:, :3], y[:, :3]) == 2


def test_evaluation_reports_recall_and_divides_by_the_true_labels():
    out, y = _hand_case()

    class Fixed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return out[x[:, 0].long()]

    sums = evaluate(Fixed(), torch.tensor([[0.0], [1.0]]), y, batch_size=1,
                    device=torch.device("cpu"), loss="multi_label_bce")
    assert sums.count == 4 and sums.correct == 2 and sums.accuracy == 0.5  # recall@5
    total = float(loss_fn("multi_label_bce")(out, y, reduction="sum"))
    assert sums.mean_loss == pytest.approx(total / 4, rel=1e-6)


def test_loss_tables_and_model_checks():
    assert "multi_label_bce" in VECTOR_LABEL and "multi_label_bce" not in PER_POSITION
    logreg = build_model("tag_logreg", (7,), 3)
    assert fit_problem(logreg, (7,), 3, "multi_label_bce", label_shape=(3,)) is None
    assert "needs a vector of labels per example" in fit_problem(
        logreg, (7,), 3, "multi_label_bce")
    assert "one logit per label: 4" in fit_problem(logreg, (7,), 3, "multi_label_bce",
                                                   label_shape=(4,))
    assert "multi_label_bce (a 0/1 vector of labels)" in fit_problem(
        logreg, (7,), 3, "cross_entropy", label_shape=(3,))


def test_stackoverflow_models_have_reddi_et_als_shapes():
    lstm = build_model("word_lstm", (20,), 10_004)
    assert lstm.embed.weight.shape == (10_004, 96)
    assert lstm.lstm.hidden_size == 670 and lstm.lstm.num_layers == 1
    assert lstm.project.weight.shape == (96, 670) and lstm.out.weight.shape == (10_004, 96)
    # Keras' count (one LSTM bias) is 2,680 fewer: torch keeps two bias vectors
    assert sum(p.numel() for p in lstm.parameters()) - 4 * 670 == 4_050_748
    assert lstm(torch.zeros(2, 20)).shape == (2, 20, 10_004)
    assert float(lstm.lstm.bias_ih_l0.detach()[670:1340].min()) == 1.0  # Keras' unit forget bias
    assert fit_problem(lstm, (20,), 10_004, "sequence_cross_entropy", label_shape=(20,)) \
        is None
    tag = build_model("tag_logreg", (10_000,), 500)
    assert tag(torch.zeros(2, 10_000)).shape == (2, 500)
    assert float(tag[1].bias.detach().abs().max()) == 0.0
    with pytest.raises(ValueError, match=r"word_lstm needs \(sequence length,\) inputs"):
        build_model("word_lstm", (1, 28, 28), 62)


def test_vectorized_training_matches_sequential():
    """The batched step (torch.func) takes per-example losses and their masked mean: for
    multi_label_bce that is the training loss's mean, so two clients trained together move
    as each trained alone."""
    torch.manual_seed(0)
    model = FlatModel(build_model("tag_logreg", (7,), 3))
    assert vectorize_plan(model.module, "auto", gpu=False, loss="multi_label_bce") == \
        (True, None)
    data = [(torch.rand(5, 7), torch.randint(0, 2, (5, 3))),
            (torch.rand(3, 7), torch.randint(0, 2, (3, 3)))]
    start = model.flat.clone()
    group = vmap_local_sgd(model, start, data, lrs=[0.5, 0.5], batch_size=2,
                           local_epochs=2, local_steps=None, seeds=[1, 2],
                           loss="multi_label_bce")
    for i, (x, y) in enumerate(data):
        delta = torch.empty_like(start)
        local_sgd(model, start, x, y, lr=0.5, batch_size=2, local_epochs=2, local_steps=None,
                  seed=[1, 2][i], delta_out=delta, loss="multi_label_bce")
        # different computations (a batched matmul vs one client's, summed in another
        # order): float32 eps is 1.2e-7, so 4 steps of updates of size ~0.1-1 differ by a
        # few ulps each; rtol 1e-5 (~80 ulps) bounds that, atol 1e-6 the entries near 0
        torch.testing.assert_close(group.delta(i), delta, rtol=1e-5, atol=1e-6)
