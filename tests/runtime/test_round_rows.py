"""The driver's rows of individual updates (Aggregator.individual): placed in the round's
sampled order whatever order the workers send them in, the clients without an update
squeezed out, and the buffer reused from round to round. No Ray."""

import numpy as np
import torch

from fedray.runtime.driver import _RoundRows
from fedray.runtime.messages import ClientUpdates


def _part(ids, d):
    ids = np.asarray(ids, np.int64)
    return ClientUpdates(updates=np.stack([np.full(d, c, np.float32) for c in ids]),
                         ids=ids, num_examples=ids * 10, losses=ids / 2.0)


def test_rows_in_sampled_order_and_the_buffer_reused():
    d = 5
    first = _RoundRows([7, 3, 9, 1], d)
    first.put(_part([9, 7], d))  # a worker's clients, in its own order
    first.put(_part([1], d))  # client 3 sent nothing (dropped)
    rows, who = first.assemble()
    assert who.ids.tolist() == [7, 9, 1] and rows[:, 0].tolist() == [7.0, 9.0, 1.0]
    assert who.num_examples.tolist() == [70, 90, 10]
    buffer = first.updates
    second = _RoundRows([4, 2], d, buffer)  # fewer clients: the same memory
    assert second.updates.data_ptr() == buffer.data_ptr()
    second.put(_part([2, 4], d))
    rows, who = second.assemble()
    assert who.ids.tolist() == [4, 2] and torch.equal(rows, torch.tensor(
        [[4.0] * d, [2.0] * d]))
    more = _RoundRows(list(range(6)), d, buffer)  # more clients than it holds: a new one
    assert more.updates.shape == (6, d) and more.updates.data_ptr() != buffer.data_ptr()
    other = _RoundRows([1], d + 1, buffer)  # another model size: a new one
    assert other.updates.shape == (1, d + 1)
