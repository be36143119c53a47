"""The counted serial share and hot floor of txstream.bench.schedule, on hand-worked schedules."""

from __future__ import annotations

import pytest

from txstream.bench.schedule import (
    Counts,
    batched,
    count,
    hot_floor,
    keys_of,
    rehome,
    serial_events,
    serial_share,
)
from txstream.spark.runtime.forward import LEND_AHEAD, handed
from txstream.spark.runtime.partitioning import partition_of


def on(partition: int, partitions: int = 2, skip: int = 0) -> int:
    """An account on ``partition`` (the ``skip``-th such one)."""
    found = [k for k in range(1000) if partition_of(k, partitions) == partition]
    return found[skip]


A, A2, B, C = on(0), on(0, skip=1), on(1), on(1, skip=1)


def test_independent_transactions_on_both_partitions_wait_for_nothing() -> None:
    assert serial_share([(A,), (B,), (A2,), (C,)], 2) == 0.0
    assert serial_share([], 2) == 0.0


def test_a_partition_waiting_for_a_value_makes_the_other_partitions_events_serial() -> None:
    # t0 runs at A's partition and touches B; t1 at B's partition waits for it:
    # step 0 runs t0 while partition 1 idle-waits (serial); step 1 runs t1 alone,
    # partition 0 has nothing left (finished is not waiting).
    assert serial_events([(A, B), (B,)], 2) == 1
    assert serial_share([(A, B), (B,)], 2) == 0.5


def test_a_blocked_transaction_does_not_hold_back_later_ready_ones() -> None:
    # partition 1 runs t2 (ready) while t1 waits for t0: nobody idles
    assert serial_share([(A, B), (B,), (C,)], 2) == 0.0


def test_a_global_read_is_no_barrier_later_transactions_run_past_it() -> None:
    # homes: 0, 0, 1, 0 (the audit), 1.  Step 0: both partitions admit all they
    # have (the audit's part is admitted past t0, t1 at 0 and t2 at 1); t0, t2
    # run.  Step 1: t1 and t4 (after the audit, not waiting for it): the parts
    # are taken.  Step 2: the audit, partition 1 has nothing left.  As a
    # barrier (the model before session 22) t4 waited for the audit: 2 serial.
    txns = [(A,), (A2,), (B,), (), (C,)]
    assert serial_events(txns, 2) == 0
    found = count(txns, 2)
    assert (found.at_once, found.past, found.barriers) == (0, 2, 0)


def test_a_global_read_waits_for_every_partitions_earlier_transactions() -> None:
    # The audit (home 0) waits for partition 1's t0, t1; t3 runs past it in
    # step 0.  Step 1: partition 0 idle-waits (the audit's part at 1 is not
    # taken) while t1 runs: 1 serial.  Partition 0's part meets nothing
    # unfinished: taken at once.
    txns = [(B,), (C,), (), (A,)]
    assert serial_events(txns, 2, reads=1) == 1
    found = count(txns, 2, reads=1)
    assert (found.at_once, found.past, found.barriers) == (1, 1, 0)


def test_a_second_read_while_the_first_waits_is_a_barrier() -> None:
    # t0 crosses (home 0, B on 1); both reads come before t3.  Each partition
    # admits the first read past t0 and meets the second while the first's part
    # waits for t0: a barrier, so partition 1 does not admit t3 until t0 ran
    # (step 0: t0 while partition 1 idle-waits), then t3 and the two reads.
    txns = [(A, B), (), (), (C,)]
    assert serial_events(txns, 2, reads=1) == 1
    found = count(txns, 2, reads=1)
    assert (found.at_once, found.past, found.barriers) == (0, 2, 2)
    # two reads at a time past (the runtime, since session 22, up to READS_PAST): t3 runs at once
    assert count(txns, 2, reads=2) == Counts(serial=0, past=4, at_once=0, barriers=0)
    with pytest.raises(ValueError, match="at least 1"):
        count(txns, 2, reads=0)
    # With two reads past at partition 1, t4 (between them) holds back the
    # second's part only: the first's is taken after t2 (step 2, partition 0
    # idle-waiting in steps 1 and 2), not after t1 (which would take 1 serial).
    two = [(A2, B), (B,), (B,), (), (C,), ()]
    assert count(two, 2, chunk=2, reads=2) == Counts(serial=2, past=4, at_once=0, barriers=0)
    # One at a time, not every other one: in chunks of 1 both partitions admit
    # the first read past t0 and reach the second after t0 ran (its parts
    # taken): nothing is unfinished then, so its parts are taken at once.
    later = [(A, B), (), (A2,), (C,), (A2,), (C,), ()]
    assert count(later, 2, chunk=1, reads=1) == Counts(serial=0, past=2, at_once=2, barriers=0)


def test_a_reads_part_waits_for_what_came_before_it_not_after() -> None:
    # Chunks of 1.  Step 0: partition 0 admits t1 (its rows at partition 1 not
    # admitted yet), the read past it, and runs t3, which came after the read:
    # the read's part there still waits for t1.  Step 1: partition 0 meets the
    # second read with the first's part waiting: a barrier; partition 1 admits
    # t1, the first read past it and meets the second: a barrier, so it cannot
    # admit t5 and idle-waits while t1 runs (1 serial).  Had t3 counted as
    # before the read, partition 0 would have taken the part in step 0 and
    # admitted the second read past.
    txns = [(C,), (A, B), (), (A2,), (), (C,)]
    assert count(txns, 2, chunk=1, reads=1) == Counts(serial=1, past=2, at_once=0, barriers=2)


def test_admission_in_chunks_limits_how_far_a_partition_looks_ahead() -> None:
    # t0 (home 0) needs partition 1 to admit it, which partition 1 does only
    # when nothing of its own is ready: with chunks of 1 it runs t1 first, so
    # partition 0 idle-waits in step 0 (t2, behind t0 on A, cannot run).
    txns = [(C,), (A, B), (A,)]
    assert serial_events(txns, 2, chunk=1) == 1
    assert serial_events(txns, 2, chunk=2) == 0
    with pytest.raises(ValueError, match="at least 1"):
        serial_events(txns, 2, chunk=0)


def test_a_participant_lends_ahead_what_nothing_earlier_not_admitted_touches() -> None:
    # As above, chunks of 1, but partition 1 looks one past its admission point:
    # t1's part there (B) meets no earlier event not admitted yet on B, so it is
    # admitted at once and t1 runs in step 0 beside t0.
    txns = [(C,), (A, B), (A,)]
    assert count(txns, 2, chunk=1, lend=1) == Counts(serial=0, lent=1)
    # t1 touches B before t2 does: t2's part waits for admission (as without lending)
    assert count([(C,), (B,), (A, B), (A,)], 2, chunk=1, lend=2) == Counts(serial=2)
    # nothing is lent past a global read not admitted yet
    assert count([(C,), (), (A, B), (A,)], 2, chunk=1, lend=2) == Counts(serial=1, at_once=2)
    # a local transaction on another value is no obstacle, once the look-ahead reaches t2
    assert count([(C,), (C,), (A, B), (A,)], 2, chunk=1, lend=2) == Counts(serial=0, lent=1)
    assert count([(C,), (C,), (A, B), (A,)], 2, chunk=1, lend=1) == Counts(serial=1, lent=1)
    # the runtime's default: from LEND_FROM partitions on
    assert count(txns, 2, chunk=1) == count(txns, 2, chunk=1, lend=0)
    assert count(txns, 8, chunk=1) == count(txns, 8, chunk=1, lend=LEND_AHEAD)
    with pytest.raises(ValueError, match="at least 0"):
        count(txns, 2, lend=-1)


def test_a_partition_with_more_rows_hands_its_peer_a_crossing_transaction() -> None:
    # Partition 0 homes three (rows 3 against 1: 2 more, one per partition of 2),
    # so it hands partition 1 one of its candidates, (A, B).  Run at partition 0, t2
    # comes after t0 and t1 there, and partition 1 idle-waits three steps for it;
    # run at partition 1 it waits only for t0 (A): one step.
    txns = [(A,), (A2,), (A, B), (B,)]
    homes = [0, 0, 0, 1]
    assert rehome(txns, homes, 2) == 1 and homes == [0, 0, 1, 1]
    assert count(txns, 2, hand=False) == Counts(serial=3)
    assert count(txns, 2) == Counts(serial=1, handed=1)
    # one row more only: nothing to hand
    assert count([(A,), (A, B), (B,)], 2) == count([(A,), (A, B), (B,)], 2, hand=False)


def test_handed_brings_each_partitions_rows_to_about_the_mean() -> None:
    # Each pair decides from its two counts alone; summed over the peers, each
    # partition ends within one per peer (the rounding down) of the mean.
    rows = [1061, 1195, 1125, 1180, 1090, 1147, 1102, 1134]
    partitions = len(rows)
    net = list(rows)
    for a in range(partitions):
        for b in range(partitions):
            moved = len(handed(rows[a], rows[b], partitions, 10_000))
            net[a] -= moved
            net[b] += moved
    mean = sum(rows) / partitions
    assert max(abs(r - mean) for r in rows) > 60
    assert max(abs(r - mean) for r in net) < partitions
    # spread evenly over the candidates (in the declared order), never more than there are
    assert handed(20, 0, 4, 10) == [1, 3, 5, 7, 9]
    assert handed(100, 0, 4, 10) == list(range(10))
    assert handed(10, 7, 4, 10) == [] and handed(0, 50, 4, 10) == []


def test_one_partition_never_waits_for_another() -> None:
    assert serial_share([(A, B), (B,), (), (C, A)], 1) == 0.0


def test_the_same_value_twice_in_a_transaction_is_one_touch() -> None:
    assert serial_share([(A, A), (B, B)], 2) == 0.0
    assert hot_floor([(A, A), (A,)], 2) == 1.0


def test_hot_floor_is_the_hottest_values_share_of_its_partition() -> None:
    # partition 0: 4 events, A in 3 of them; partition 1 has none (left out)
    assert hot_floor([(A,), (A,), (A,), (A2,)], 2) == 0.75
    # B in 3 transactions, its partition homes 2: capped at 1
    assert hot_floor([(B,), (A, B), (A, B), (C,)], 2) == 1.0
    # audits are events of partition 0 (their home) but barriers, not hot values
    assert hot_floor([(A,), (A2,), (), (), ()], 2) == 0.2
    assert hot_floor([], 2) == 0.0


def test_batches_are_scheduled_apart_and_weighted_by_size() -> None:
    txns = [(A, B), (B,), (A,), (B,)]
    # one batch of 4: step 0 t0 (t1 blocked, t3 blocked behind t1) while
    # partition 1 waits; step 1 t1 and t2; step 2 t3 alone
    assert serial_events(txns, 2) == 1
    # batches of 2: [t0, t1] as above (1 of 2), then [t2, t3] in parallel
    share, floor = batched(txns, 2, 2)
    assert share == 0.25
    assert floor == pytest.approx((hot_floor(txns[:2], 2) * 2 + hot_floor(txns[2:], 2) * 2) / 4)
    with pytest.raises(ValueError, match="at least 1"):
        batched(txns, 2, 0)


def test_ledger_events_become_their_keys_in_order() -> None:
    stream = [
        ("deposits", {"acct": 4, "amount": 1, "id": 0}),
        ("transfers", {"src": 5, "dst": 6, "amount": 1, "id": 1}),
        ("audits", {"id": 2, "expected": 0}),
    ]
    assert keys_of(stream) == [(4,), (5, 6), ()]


def test_placement_puts_each_connected_group_on_one_partition() -> None:
    from txstream.bench.schedule import placement

    # two transfers between partitions, unconnected: each group is placed whole
    # (A-B on the partition holding more of it: a tie, the lower one, 0, moving B;
    # A2-C then goes to partition 1, which has room, moving A2)
    found = placement([(A, B), (A2, C)], 2)
    assert found.crossing == 1.0
    assert found.placed_crossing == 0.0
    assert found.moved == pytest.approx(2 / 2)
    assert found.load == 1.0


def test_placement_leaves_a_group_too_big_for_one_partition_crossing() -> None:
    from txstream.bench.schedule import placement

    # A-B-C chained by three transactions: 3 of 4 transactions, more than a
    # partition's share (2): left where hash puts it; its two crossing ones remain
    txns = [(A, B), (B, C), (C, A), (A2,)]
    found = placement(txns, 2)
    assert found.crossing == pytest.approx(2 / 4)
    assert found.placed_crossing == pytest.approx(2 / 4)
    assert found.moved == 0.0
    # hash homes: A, B, C, A2 -> 0, 1, 1, 0
    assert found.load == pytest.approx(2 / 2)


def test_placement_ignores_global_reads_and_one_partition() -> None:
    from txstream.bench.schedule import placement

    assert placement([(A, B), ()], 1).placed_crossing == 0.0
    assert placement([(), ()], 2).crossing == 0.0
    found = placement([(A, B), (), (A2,), (C,)], 2)  # the audit joins nothing
    assert (found.crossing, found.placed_crossing) == (pytest.approx(1 / 3), 0.0)
    # one group holding every transaction is more than a partition's share: left crossing
    assert placement([(A, B), (), (B,)], 2).placed_crossing == pytest.approx(1 / 2)
