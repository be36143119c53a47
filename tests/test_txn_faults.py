"""The transaction manager under faults and long runs (issue 15 items 6-8, issue 12 item 5).

Hangs (an earlier transaction left open in ordered mode), nonsense settings,
open snapshots that made commits quadratic, unbounded growth (history
recording, streams, the optimistic write map, the log), and the arrival order
of recorded histories.
"""

from __future__ import annotations

import math
import threading
import time

import pytest

from txstream.errors import TransientError, TxStreamError
from txstream.txn import LockTimeoutError, TransactionManager


def _outcome(fn, limit: float = 5.0) -> BaseException | None:
    """Run ``fn`` in a thread; its exception (``None`` if it returned); fail if it hangs."""
    box: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            box.append(None)
        except BaseException as exc:  # the test inspects it
            box.append(exc)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout=limit)
    assert not th.is_alive(), f"{fn} still blocks after {limit} s"
    return box[0]


# -- item 6: lock_timeout bounds the wait for one's turn; nonsense settings -----------


@pytest.mark.parametrize("protocol", ["ss2pl", "optimistic"])
def test_ordered_commit_does_not_wait_forever_for_an_open_earlier_transaction(protocol) -> None:
    tm = TransactionManager(protocol, ordered=True, lock_timeout=0.2)
    x = tm.table("x")
    x.load({1: 0, 2: 0})
    stuck = tm.begin()  # left open by its owner
    stuck.read(x, 1)
    later = tm.begin()
    later.increment(x, 2, 1)
    started = time.monotonic()
    error = _outcome(later.commit)
    assert time.monotonic() - started < 3
    assert isinstance(error, LockTimeoutError) and isinstance(error, TransientError)
    text = str(error)
    assert "transaction 2 waited more than 0.2 s for its turn" in text
    assert "transaction 1 (position 0, active)" in text
    assert later.status == "aborted" and x.read(2) == 0
    assert tm.stats()["timeouts"] == 1
    # Once the earlier one finishes, the retry keeps its place and commits.
    stuck.commit()
    retry = tm.begin(retry_of=later)
    retry.increment(x, 2, 1)
    retry.commit()
    assert x.snapshot() == {1: 0, 2: 1}


def test_turn_timeout_names_an_aborted_transaction_nobody_retried() -> None:
    tm = TransactionManager("ss2pl", ordered=True, lock_timeout=0.1)
    x = tm.table("x")
    x.load({1: 0})
    first = tm.begin()
    first.abort(retry=True)  # keeps its place, but is never retried
    second = tm.begin()
    second.put(x, 1, 5)
    error = _outcome(second.commit)
    assert isinstance(error, LockTimeoutError)
    assert "transaction 1 (position 0, aborted)" in str(error)
    assert "neither retried nor given up" in str(error)
    tm.give_up(first)
    retry = tm.begin(retry_of=second)
    retry.put(x, 1, 5)
    retry.commit()
    assert x.read(1) == 5


def test_lock_wait_timeout_names_the_holder() -> None:
    tm = TransactionManager("ss2pl", lock_timeout=0.1)
    x = tm.table("x")
    x.load({1: 0})
    holder = tm.begin()
    holder.put(x, 1, 1)
    waiter = tm.begin()
    with pytest.raises(LockTimeoutError, match=r"held or requested first by transaction 1\)"):
        waiter.read(x, 1)
    holder.commit()


@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, -1, 0, 0.0, True, "1", 1e300, None]
)
def test_nonsense_lock_timeouts_are_refused_at_creation(value) -> None:
    if value is None:
        TransactionManager(lock_timeout=None)  # no timeout: the default
        return
    with pytest.raises(TxStreamError, match="lock_timeout must be") as exc:
        TransactionManager("ss2pl", ordered=True, lock_timeout=value)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.5, "x"])
def test_nonsense_group_delays_are_refused_at_creation(value, tmp_path) -> None:
    with pytest.raises(TxStreamError, match="group_delay must be"):
        TransactionManager(path=tmp_path / "db", sync="group", group_delay=value)
    assert not (tmp_path / "db").exists()


# -- item 7: an open snapshot must not make commits scan whole version chains -------


def _commits_with_old_snapshot(n: int) -> tuple[int, TransactionManager]:
    tm = TransactionManager("snapshot", snapshot_updates="locking")
    x = tm.table("x")
    x.load({k: 0 for k in range(10)})
    old = tm.begin(read_only=True)  # left open for the whole run
    assert old.read(x, 3) == 0
    before = x.chain_steps
    for i in range(n):
        with tm.begin() as t:
            t.increment(x, i % 10, 1)
    assert old.read(x, 3) == 0  # still sees its snapshot
    with tm.begin(read_only=True) as new:
        assert new.read(x, 3) == n // 10
    return x.chain_steps - before, tm


def test_an_open_snapshot_keeps_commit_cost_constant() -> None:
    small, tm = _commits_with_old_snapshot(2_000)
    large, _ = _commits_with_old_snapshot(8_000)
    # Before the fix every commit walked every version since the snapshot:
    # 4x the commits cost 16x the steps (and the chains held all of them).
    assert large < 5 * small, (small, large)
    assert large <= 8_000 * 8
    x = tm.table("x")
    assert all(len(x.versions(k)) <= 2 for k in range(10))


def test_versions_between_snapshots_are_dropped_when_no_snapshot_needs_them() -> None:
    import random

    rng = random.Random(5)
    tm = TransactionManager("snapshot", snapshot_updates="locking")
    x = tm.table("x")
    x.load({k: 0 for k in range(3)})
    model = {k: 0 for k in range(3)}
    open_readers: list[tuple[object, dict[int, int]]] = []
    for step in range(3_000):
        r = rng.random()
        if r < 0.1:
            reader = tm.begin(read_only=True)
            open_readers.append((reader, dict(model)))
        elif r < 0.18 and open_readers:
            reader, seen = open_readers.pop(rng.randrange(len(open_readers)))
            for k in range(3):
                assert reader.read(x, k) == seen[k], (step, k)
            reader.commit()
        else:
            k = rng.randrange(3)
            with tm.begin() as t:
                t.increment(x, k, 1)
            model[k] += 1
        for reader, seen in open_readers[:3]:
            k = rng.randrange(3)
            assert reader.read(x, k) == seen[k]
    needed = len(open_readers) + 1
    assert all(len(x.versions(k)) <= 2 * needed + 8 for k in range(3))
    for reader, _ in open_readers:
        reader.commit()
    with tm.begin() as t:
        for k in range(3):
            t.increment(x, k, 0)
    assert all(len(x.versions(k)) == 1 for k in range(3))
