"""Per-client evaluation: the table of each eval round and its statistics in metrics.jsonl.

A pooled test accuracy weights clients by their test examples and hides the ones the model
serves badly; cross-device papers report the distribution over clients instead (its
percentiles and worst-10% mean for fairness, personalized accuracy). The driver gets one row
of sums per evaluated client (fedray.core.evaluation.ClientEval) and, every eval round,
writes them in full as ``client_eval/round_{r:06d}.arrow`` (Arrow IPC file) under the run
directory and their statistics as ``clients_*`` keys of metrics.jsonl.

Columns: ``client_id`` int64, ``count`` int64 (test examples, or counted positions for a
sequence loss), ``loss_sum`` float64, ``correct`` int64, ``loss`` (= loss_sum / count) and
``accuracy`` (= correct / count) float64; ``correct`` and ``accuracy`` only where the loss
has an accuracy (not ``mse``). For a client part that evaluates each client with its own
model (a local head or normalization layers, a personal model, an adapted copy: the
personalization family), those columns are the client's own model's, and the same four
again, prefixed ``global_``, are the global model's on the same examples; with
``eval.personalize`` the same four again, prefixed ``personalized_``. Rows are in client-id
order; the pooled ``fed_test_*`` metrics are their sums added in that order, so they can be
recomputed from the table exactly. A client part that records per-client values
(``ClientWork.columns``: the cluster IFCA evaluates a client with) adds one float64 column
each, under its own name.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from fedray.state.run_dir import CLIENT_EVAL_DIR

if TYPE_CHECKING:  # reading a table (fedray report) needs no torch
    from fedray.core.evaluation import ClientEval, EvalSums

PERCENTILES = (10, 25, 50, 90)
WORST_SHARE = 0.1  # the worst-10% mean: the mean over the ceil(10%) worst clients


def table_name(r: int) -> str:
    """The table of eval round ``r``, relative to the run directory."""
    return f"{CLIENT_EVAL_DIR}/round_{r:06d}.arrow"


def client_stats(values: Any, prefix: str, higher_is_better: bool) -> dict[str, float]:
    """Mean, population std, the worst value, percentiles (numpy's linear interpolation)
    and the mean of the worst 10% of ``values`` (one per client, each counting once), as
    ``{prefix}_<stat>`` keys. Worst is the lowest accuracy or the highest loss."""
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        return {}
    ordered = np.sort(v) if higher_is_better else np.sort(v)[::-1]
    k = max(1, math.ceil(WORST_SHARE * len(v)))
    out = {f"{prefix}_mean": float(v.mean()), f"{prefix}_std": float(v.std()),
           f"{prefix}_{'min' if higher_is_better else 'max'}": float(ordered[0])}
    for q in PERCENTILES:
        out[f"{prefix}_p{q}"] = float(np.percentile(v, q))
    out[f"{prefix}_worst10"] = float(ordered[:k].mean())
    return out


def _columns(sums: Sequence[EvalSums], prefix: str, accuracy: bool) -> dict[str, pa.Array]:
    count = np.array([s.count for s in sums], dtype=np.int64)
    loss_sum = np.array([s.loss_sum for s in sums], dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):  # a client without test data: NaN
        cols = {f"{prefix}loss_sum": loss_sum, f"{prefix}loss": loss_sum / count}
        if accuracy:
            correct = np.array([s.correct for s in sums], dtype=np.int64)
            cols[f"{prefix}correct"] = correct
            cols[f"{prefix}accuracy"] = correct / count
    return {"count": count, **cols} if not prefix else cols


def client_table(rows: Sequence[ClientEval], accuracy: bool) -> pa.Table:
    """The rows as the round's table, in client-id order (see the module docstring)."""
    rows = sorted(rows, key=lambda row: row.client_id)
    cols: dict[str, Any] = {"client_id": np.array([r.client_id for r in rows], np.int64)}
    cols |= _columns([r.sums for r in rows], "", accuracy)
    if rows and rows[0].global_sums is not None:
        cols |= _columns([r.global_sums for r in rows], "global_", accuracy)
    if rows and rows[0].personalized is not None:
        cols |= _columns([r.personalized for r in rows], "personalized_", accuracy)
    for name in (rows[0].columns or {}) if rows else ():  # the client part's (IFCA's cluster)
        cols[name] = np.array([(r.columns or {}).get(name, np.nan) for r in rows], np.float64)
    return pa.table(cols)


def table_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def read_table(data: bytes) -> pa.Table:
    """A table written by ``table_bytes`` (e.g. read from a run directory with fsspec)."""
    return pa.ipc.open_file(pa.BufferReader(data)).read_all()


def client_metrics(table: pa.Table) -> dict[str, float]:
    """The ``clients_*`` keys of metrics.jsonl: how many clients had test data, and the
    statistics of their accuracy and loss (and the global model's, ``clients_global_*``,
    and the fine-tuned copies', ``clients_personalized_*``) over those clients."""
    count = table.column("count").to_numpy()
    has = count > 0
    out: dict[str, float] = {"clients_evaluated": int(has.sum())}
    for prefix in ("", "global_", "personalized_"):
        if f"{prefix}loss" not in table.column_names:
            continue
        name = f"clients_{prefix}"
        if f"{prefix}accuracy" in table.column_names:
            out |= client_stats(table.column(f"{prefix}accuracy").to_numpy()[has],
                                f"{name}accuracy", higher_is_better=True)
        out |= client_stats(table.column(f"{prefix}loss").to_numpy()[has], f"{name}loss",
                            higher_is_better=False)
    return out
