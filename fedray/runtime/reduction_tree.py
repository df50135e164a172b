"""The reduction tree (``runtime.reduce``): a round's partial sums added in groups of
consecutive worker slots, then the groups' sums by the driver.

Why: the driver otherwise receives and merges one float64 partial sum per worker -- with 64
GPU workers and a ResNet-18, 64 x 88 MB on one process every round. With
``runtime.reduce.group_size: G`` the group's first worker sums its group (``where:
workers``) from its node's object store, and the driver merges one partial per group.

Float64 addition is not associative, so the tree defines the round's arithmetic: each group
is folded from zero in slot order (fedray.algorithms.reduction.fold_partials, the one
function every place that makes a group's sum calls), then the groups' sums are merged in
group order. Which tasks form a group depends on their slots and G alone -- never on which
node a worker runs on -- so a run gives the same weights whatever the placement, and
``where: driver`` (the same groups, summed by the driver) gives the same bits as ``where:
workers``. The pool orders its workers node-major (``node_major``) so that a group tends to
share a node: that changes where the work happens, never what is computed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

from fedray.algorithms.reduction import fold_partials
from fedray.runtime.messages import GroupResult, RoundResult


def slot_groups(slots: Sequence[int], group_size: int) -> list[list[int]]:
    """The round's tasks (given by their slots, in the driver's merge order) cut into
    groups: maximal runs of consecutive tasks whose slots share ``slot // group_size``.

    A round has one task per busy slot, so a group is (up to) ``group_size`` consecutive
    slots; buffered asynchronous training sends one task per model version a slot trains
    from, and each version's tasks form groups of their own. Returns lists of indices into
    ``slots``."""
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2, got {group_size}")
    groups: list[list[int]] = []
    for i, slot in enumerate(slots):
        if groups and slots[groups[-1][-1]] // group_size == slot // group_size:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def node_major(nodes: Sequence[str | None]) -> list[int]:
    """A slot order in which the workers of one node are consecutive: nodes in the order of
    their first worker, workers of a node in their current order. ``nodes[i]`` is worker
    i's node."""
    first: dict[str | None, int] = {}
    for node in nodes:
        first.setdefault(node, len(first))
    return sorted(range(len(nodes)), key=lambda i: first[nodes[i]])


def reduce_results(results: Iterable[RoundResult]) -> GroupResult:
    """A group's results as one: their partial sums folded (``fold_partials``) and each
    result without its partial. ``results`` is consumed one at a time, so a caller that
    fetches each result as it is needed holds one partial sum besides the group's."""
    members: list[RoundResult] = []

    def partials() -> Iterator:
        for res in results:
            members.append(dataclasses.replace(res, partial=None))
            yield res.partial

    return GroupResult(fold_partials(partials()), members)
