"""The clock's arithmetic against hand computations, and the synchronous round's rules."""

import numpy as np
import pytest

from fedray.errors import FedrayError
from fedray.timing.clock import examples_processed, synchronous_round, update_times
from fedray.timing.devices import DeviceProfiles


def test_examples_processed_by_hand():
    n = np.array([45, 4, 0, 10])
    assert examples_processed(n, batch_size=10, local_epochs=2).tolist() == [90, 8, 0, 20]
    # 45 examples, batches of 10: an epoch is 10+10+10+10+5; 7 steps = 45 + 20 = 65
    assert examples_processed(n, batch_size=10, local_steps=7).tolist() == [65, 28, 0, 70]
    assert examples_processed(n, batch_size=10, local_steps=12).tolist() == [110, 48, 0, 120]
    assert examples_processed(n, batch_size=10, local_steps=7,
                              independent=True).tolist() == [70, 28, 0, 70]


def test_examples_processed_matches_the_batch_schedule():
    # the schedule fedray's training really follows (imports torch: about 2 s)
    from fedray.kernels.sequential import batch_schedule

    for n in (0, 1, 7, 20, 21, 45):
        for b in (1, 3, 10, 64):
            for steps in (None, 1, 2, 5, 13):
                for indep in (False, True):
                    if indep and steps is None:
                        continue
                    got = examples_processed([n], batch_size=b, local_epochs=3,
                                             local_steps=steps, independent=indep)[0]
                    schedule = batch_schedule(n, b, 3, steps, seed=0, independent=indep)
                    assert got == sum(len(batch) for batch in schedule), (n, b, steps, indep)


def test_update_times_by_hand():
    # dyadic numbers, so the float results are exact: 90 examples * 1/64 s = 1.40625 s;
    # 4 MiB down at 1 MiB/s = 4 s; 1 MiB up at 256 KiB/s = 4 s
    profiles = DeviceProfiles(np.array([1 / 64, 1 / 32]), np.array([2.0**20, 2.0**21]),
                              np.array([2.0**18, 2.0**20]))
    t = update_times(profiles, np.array([90, 10]), down_bytes=2.0**22, up_bytes=2.0**20)
    assert t.compute_s.tolist() == [1.40625, 0.3125]
    assert t.download_s.tolist() == [4.0, 2.0]
    assert t.upload_s.tolist() == [4.0, 1.0]
    assert t.total_s.tolist() == [9.40625, 3.3125]
    with pytest.raises(FedrayError, match="up_bytes must be >= 0"):
        update_times(profiles, [1, 1], down_bytes=1.0, up_bytes=-1.0)
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):  # aligned with the ids: read-only
        t.compute_s = np.zeros(2)


INF = np.inf
# start 100; finish: 5 -> 110, 3 -> 120 but offline at 115, 9 -> 105, 1 -> 130, 7 -> 115
IDS = np.array([5, 3, 9, 1, 7])
DUR = np.array([10.0, 20.0, 5.0, 30.0, 15.0])
UNTIL = np.array([INF, 115.0, INF, INF, 200.0])


def test_round_keeps_the_first_k_finishers():
    r = synchronous_round(100.0, IDS, DUR, UNTIL, k=3)
    assert r.kept.tolist() == [5, 7, 9] and r.kept_finish_s.tolist() == [110.0, 115.0, 105.0]
    assert r.end_s == 115.0 and r.duration_s == 15.0
    assert r.dropped.tolist() == [3]  # offline at 115, when the round closes
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):  # an outcome is not edited later
        r.end_s = 0.0
    assert r.late.tolist() == [1]  # over-selected, beyond the first 3: not trained


def test_round_with_a_deadline_and_fewer_than_k():
    r = synchronous_round(100.0, IDS, DUR, UNTIL, k=3, deadline_s=12.0)
    assert r.kept.tolist() == [5, 9] and r.end_s == 112.0 and r.duration_s == 12.0
    assert r.dropped.tolist() == []  # 3 would go offline at 115, after the deadline
    assert r.late.tolist() == [1, 3, 7]


def test_round_ends_when_nobody_is_running_before_the_deadline():
    r = synchronous_round(100.0, [1, 2], [10.0, 50.0], [INF, 130.0], k=3, deadline_s=100.0)
    assert r.kept.tolist() == [1] and r.dropped.tolist() == [2] and r.late.tolist() == []
    assert r.end_s == 130.0  # the last event: 2 going offline, before the deadline at 200


def test_round_without_deadline_waits_for_every_outcome():
    r = synchronous_round(0.0, [4, 8], [10.0, 50.0], [INF, 20.0], k=5)
    assert r.kept.tolist() == [4] and r.dropped.tolist() == [8] and r.end_s == 20.0


def test_offline_at_the_start_drops_at_once_and_ties_go_to_the_lower_id():
    r = synchronous_round(50.0, [6, 2, 3], [5.0, 5.0, 1.0], [INF, INF, 50.0], k=1)
    assert r.kept.tolist() == [2] and r.late.tolist() == [6] and r.dropped.tolist() == [3]
    assert r.end_s == 55.0
    r = synchronous_round(50.0, [3], [1.0], [50.0], k=1, deadline_s=10.0)
    assert r.kept.size == 0 and r.dropped.tolist() == [3] and r.end_s == 50.0


def test_round_is_independent_of_input_order():
    rng = np.random.default_rng(0)
    ids = rng.choice(10**6, 200, replace=False)
    dur = rng.integers(1, 50, 200).astype(float)  # many ties
    until = np.where(rng.random(200) < 0.2, rng.uniform(0, 60, 200), INF)
    ref = synchronous_round(0.0, ids, dur, until, k=60, deadline_s=40.0)
    perm = rng.permutation(200)
    got = synchronous_round(0.0, ids[perm], dur[perm], until[perm], k=60, deadline_s=40.0)
    for name in ("kept", "kept_finish_s", "dropped", "late"):
        assert np.array_equal(getattr(ref, name), getattr(got, name))
    assert ref.end_s == got.end_s
    everyone = np.concatenate([ref.kept, ref.dropped, ref.late])
    assert np.array_equal(np.sort(everyone), np.sort(ids))  # a partition of the sample


@pytest.mark.parametrize("args, kwargs, message", [
    (([1, 1], [1.0, 1.0], [INF, INF], 1), {}, "distinct"),
    (([1], [-1.0], [INF], 1), {}, "durations must be >= 0"),
    (([1], [1.0], [INF], 0), {}, "k must be >= 1"),
    (([1], [1.0], [INF], 1), {"deadline_s": 0.0}, "deadline_s must be > 0"),
])
def test_bad_round_arguments(args, kwargs, message):
    with pytest.raises(FedrayError, match=message):
        synchronous_round(0.0, *args, **kwargs)


def test_an_arrival_exactly_at_the_deadline_is_in_time():
    """docs/time.md: late means arriving *after* start + deadline_s; at it is in time, and
    the round then ends at the deadline, not before."""
    r = synchronous_round(100.0, [1, 2, 3], [10.0, 12.0, 12.5], [INF, INF, INF], k=3,
                          deadline_s=12.0)
    assert r.kept.tolist() == [1, 2] and r.late.tolist() == [3] and r.dropped.size == 0
    assert r.kept_finish_s.tolist() == [110.0, 112.0] and r.end_s == 112.0


def test_an_arrival_exactly_when_going_offline_counts():
    """A client drops only if its update would finish *after* it goes offline: finishing at
    that very moment, the update arrives (and is kept)."""
    r = synchronous_round(0.0, [4, 8, 9], [10.0, 20.0, 20.0], [10.0, 19.5, INF], k=3)
    assert r.kept.tolist() == [4, 9] and r.dropped.tolist() == [8] and r.late.size == 0
    assert r.end_s == 20.0  # 9 arrives last; 8 dropped at 19.5 before that
    # the k-th arrival closes the round: a drop after it is late, one before it dropped
    r = synchronous_round(0.0, [1, 2, 3], [10.0, 30.0, 30.0], [INF, 9.0, 11.0], k=1)
    assert r.kept.tolist() == [1] and r.end_s == 10.0
    assert r.dropped.tolist() == [2] and r.late.tolist() == [3]
    # a drop exactly at the close is dropped, not late
    r = synchronous_round(0.0, [1, 2], [10.0, 30.0], [INF, 10.0], k=1)
    assert r.dropped.tolist() == [2] and r.late.size == 0


def test_fewer_than_k_in_time_end_at_the_deadline_or_the_last_event():
    # the last one still running would arrive after the deadline: the round ends at it
    r = synchronous_round(10.0, [1, 2], [5.0, 50.0], [INF, INF], k=2, deadline_s=20.0)
    assert r.end_s == 30.0 and r.kept.tolist() == [1] and r.late.tolist() == [2]
    # nobody sampled: the round ends where it started
    r = synchronous_round(10.0, [], [], [], k=2, deadline_s=20.0)
    assert r.end_s == 10.0 and r.kept.size == r.dropped.size == r.late.size == 0
    # every update in time but fewer than k: the last arrival
    r = synchronous_round(10.0, [1, 2], [5.0, 7.0], [INF, INF], k=5, deadline_s=20.0)
    assert r.end_s == 17.0 and r.kept.tolist() == [1, 2]
    # an offline client drops when it goes offline, not when its update would have ended
    r = synchronous_round(10.0, [1, 2], [5.0, 70.0], [INF, 40.0], k=5)
    assert r.end_s == 40.0 and r.dropped.tolist() == [2]


def test_bad_update_time_and_example_arguments():
    profiles = DeviceProfiles(np.array([1.0]), np.array([1.0]), np.array([1.0]))
    for kw in ({"down_bytes": -1.0, "up_bytes": 0.0}, {"down_bytes": INF, "up_bytes": 0.0},
               {"down_bytes": 0.0, "up_bytes": np.nan}):
        with pytest.raises(FedrayError, match="must be >= 0 and finite"):
            update_times(profiles, [1], **kw)
    assert update_times(profiles, [2], down_bytes=0.0, up_bytes=0.0).total_s.tolist() == [2.0]
    with pytest.raises(FedrayError, match="examples must be >= 0, got -1"):
        examples_processed([3, -1], batch_size=1)
    for kw in ({"batch_size": 0}, {"batch_size": 1, "local_epochs": 0},
               {"batch_size": 1, "local_steps": 0}):
        with pytest.raises(FedrayError, match="must be >= 1"):
            examples_processed([3], **kw)
    # the defaults: one epoch, no step count, batches drawn by epoch
    assert examples_processed([3, 0], batch_size=2).tolist() == [3, 0]
    assert examples_processed([5], batch_size=2, local_steps=4).tolist() == [7]
    assert examples_processed([], batch_size=2).tolist() == []


@pytest.mark.parametrize("args, kwargs, message", [
    (([1, 2], [1.0], [INF, INF], 1), {}, "1-d arrays of one length"),
    (([1, 2], [1.0, 1.0], [INF], 1), {}, "1-d arrays of one length"),
    (([[1, 2]], [[1.0, 1.0]], [[INF, INF]], 1), {}, "1-d arrays of one length"),
    (([1], [INF], [INF], 1), {}, "finite"),
    (([1], [1.0], [INF], 1), {"deadline_s": INF}, "deadline_s must be > 0"),
    (([1], [1.0], [INF], 1), {"deadline_s": -1.0}, "deadline_s must be > 0"),
])
def test_more_bad_round_arguments(args, kwargs, message):
    with pytest.raises(FedrayError, match=message):
        synchronous_round(0.0, *args, **kwargs)


def test_zero_durations_and_short_deadlines_are_valid():
    """A zero-length update arrives at the start; a deadline under a second is a deadline."""
    r = synchronous_round(5.0, [2, 1], [0.0, 0.25], [INF, INF], k=2, deadline_s=0.5)
    assert r.kept.tolist() == [1, 2] and r.kept_finish_s.tolist() == [5.25, 5.0]
    assert r.end_s == 5.25
    r = synchronous_round(5.0, [2, 1], [0.0, 0.75], [INF, INF], k=2, deadline_s=0.5)
    assert r.kept.tolist() == [2] and r.late.tolist() == [1] and r.end_s == 5.5
