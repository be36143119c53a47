"""The counted serial share and hot floor of txstream.bench.schedule, on hand-worked schedules."""

from __future__ import annotations

import pytest

from txstream.bench.schedule import batched, hot_floor, keys_of, serial_events, serial_share
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


def test_a_keyless_audit_is_a_barrier_on_every_partition() -> None:
    # homes: 0, 0, 1, 0 (the audit), 1.  Step 0: t0, t2.  Step 1: t1 while
    # partition 1 idle-waits (t4 waits for the audit).  Step 2: the audit while
    # partition 1 still waits.  Step 3: t4 alone.
    txns = [(A,), (A2,), (B,), (), (C,)]
    assert serial_events(txns, 2) == 2
    assert serial_share(txns, 2) == pytest.approx(0.4)
    # without the audit nobody waits
    assert serial_events([(A,), (A2,), (B,), (C,)], 2) == 0


def test_an_audit_waits_for_every_other_partition_and_later_ones_wait_for_it() -> None:
    # The audit (home 0) waits for partition 1's two transactions and t3 for the
    # audit: partition 0 idle-waits in steps 0 and 1.
    assert serial_events([(B,), (C,), (), (A,)], 2) == 2
    # t3 touches only B, last touched before the audit: it waits for the audit
    # all the same (step 1: partition 1 idle-waits while the audit runs)
    assert serial_events([(B,), (A,), (), (B,)], 2) == 1
    # two audits in a row: the second waits for the first, so partition 0 waits
    # for partition 1's t0 in step 0
    assert serial_events([(B,), (), (), (A,)], 2) == 1


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
