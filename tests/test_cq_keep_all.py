"""Windows that keep every read for a few windows (``CQEngine.release_every``).

Under ``s2pl`` and ``optimistic`` without a recorder, a window's transaction
commits with ``TransactionManager.commit_keeping_all``: the next window keeps
every read lock or read-set item, and the ones it does not need are sorted
out only every ``release_every`` windows, or at once when an updater waits
for a lock.  These tests run real updater threads against such windows and
judge every result from outside the engine: an audit of every committed row
version, kept by the updaters themselves, and the result recomputed from the
events and the versions it says it read.
"""

from __future__ import annotations

import random
import sys
import threading
import time
import types
from itertools import islice
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import txstream.cq.engine as engine_mod
from txstream.cq import CQEngine, CQError, Result, make_manager
from txstream.cq.workload import COLUMNS, TABLE, build_query, load_table, new_part
from txstream.errors import TransientError
from txstream.txn import TransactionManager

R = 5
ROWS = 24


def audited_run(
    strategy: str, release_every: int, seed: int, path: Path | None = None
) -> tuple[list[Result], dict[int, list[tuple[int, Any]]], list[dict[str, int]]]:
    """Run the query under two updater threads; the results, the audit and the events.

    The run ends once both sides got to run (``enough``), whatever the machine's
    speed: the engine's clock is replaced by one that reaches the deadline then.

    Each updater owns its keys (even or odd), so right after its commit the
    newest version of its key is its own: ``history[key]`` lists every
    committed (version, row) of the key, oldest first.  ``path``: a durable
    store there (its log keeps the windows off the short paths).
    """
    rng = random.Random(seed)
    if path is None:
        tm = load_table(strategy, {k: new_part(rng) for k in range(ROWS)})
    else:
        tm = TransactionManager(
            protocol=make_manager(strategy).protocol.name, path=path, sync="off"
        )
        tm.table(TABLE)
        with tm.begin() as t:
            for k in range(ROWS):
                t.put(TABLE, k, new_part(rng))
    tbl = tm.table(TABLE)
    history = {k: [tbl.latest(k)] for k in range(ROWS)}
    engine = CQEngine(build_query(R), tm, strategy, {TABLE: COLUMNS})
    engine.release_every = release_every
    stop = threading.Event()

    def update(parity: int) -> None:
        urng = random.Random(seed * 10 + parity)
        keys = [k for k in range(ROWS) if k % 2 == parity]
        while not stop.is_set():
            key, row = urng.choice(keys), new_part(urng)
            try:
                with tm.begin() as t:
                    t.put(TABLE, key, row)
            except TransientError:
                continue
            history[key].append(tbl.latest(key))
            time.sleep(0.0002)

    threads = [threading.Thread(target=update, args=(p,), daemon=True) for p in (0, 1)]
    events = [{"id": i, "part": rng.randrange(ROWS), "qty": 1} for i in range(200_000)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # threads take turns often: updates land inside windows

    def enough() -> float:
        """1.0 (the deadline) once there are enough windows, enough updates, and the
        newest window read a row an updater rewrote."""
        done = engine._results  # (the engine's own list of this run's results)
        ended = (
            len(done) >= 150
            and sum(len(v) - 1 for v in history.values()) >= 30
            and any(v > 1 for _, _, v in done[-1].versions)
        )
        return 1.0 if ended else 0.0

    for th in threads:
        th.start()
    try:
        with mock.patch.object(engine_mod, "time", types.SimpleNamespace(monotonic=enough)):
            results = engine.run(events, until=1.0)
    finally:
        stop.set()
        for th in threads:
            th.join()
        sys.setswitchinterval(interval)
    tm.locks.check_idle()  # the run ended: no read lock is left behind
    return results, history, events


def judge(
    result: Result, history: dict[int, dict[int, tuple[Any, int]]], events: list[Any]
) -> None:
    """The result's versions were all current at one instant, and its value follows from them.

    ``history[key][version]``: the row of that version and the next version's
    timestamp (none: far in the future).
    """
    seen = {key: version for _, key, version in result.versions}
    assert len(seen) == len(result.versions), "two versions of one row in one window"
    lo, hi = 0, 1 << 62
    rows = {}
    for key, version in seen.items():
        assert version in history[key], f"row {key}: version {version} was never committed"
        rows[key], following = history[key][version]
        lo = max(lo, version)
        hi = min(hi, following - 1)
    assert lo <= hi, f"window {result.window} mixes versions: no instant had them all"
    assert result.consistent
    prices: list[int] = []
    for event in islice(events, result.lwm, None):
        row = rows.get(event["part"])
        assert row is not None, f"window {result.window} did not read row {event['part']}"
        if row["price"] <= 50:
            prices.append(row["price"])
            if len(prices) == R:
                break
    assert result.value == pytest.approx(sum(prices) / R)


@pytest.mark.parametrize(
    ("strategy", "store"),
    [
        *((s, k) for s in ("s2pl", "optimistic") for k in ("memory-1", "memory-32", "durable-32")),
        ("snapshot", "memory-1"),  # windows that go on in one snapshot (see below)
    ],
)
def test_every_window_reads_one_state_and_its_value_follows_from_it(
    strategy: str, store: str, tmp_path: Path
) -> None:
    kind, every = store.split("-")
    path = tmp_path / "store" if kind == "durable" else None
    results, history, events = audited_run(strategy, int(every), seed=7, path=path)
    updates = sum(len(v) - 1 for v in history.values())
    assert len(results) >= 150 and updates >= 30  # both sides got to run
    by_version = {}  # key -> version -> (row, the next version's timestamp)
    for key, v in history.items():
        following = [*(ts for ts, _ in v[1:]), 1 << 62]
        by_version[key] = {ts: (row, nxt) for (ts, row), nxt in zip(v, following, strict=True)}
    changed = 0
    for res in results:
        judge(res, by_version, events)
        changed += any(v > 1 for _, _, v in res.versions)
    assert changed > 0  # some windows read rows the updaters had rewritten


def test_an_updater_waiting_for_a_kept_lock_gets_it_within_a_window() -> None:
    """Rows no window needs any more are kept only until someone waits for one.

    With ``release_every`` out of reach, the read lock on row 0 (read by the
    first event only) would be held to the end of the run; the updater that
    asks for it must get it while the query still runs.
    """
    rng = random.Random(3)
    tm = load_table("s2pl", {k: new_part(rng) for k in range(ROWS)})
    engine = CQEngine(build_query(R), tm, "s2pl", {TABLE: COLUMNS})
    engine.release_every = 1 << 30
    events = [{"id": 0, "part": 0, "qty": 1}]
    events += [{"id": i, "part": 1 + rng.randrange(ROWS - 1), "qty": 1} for i in range(1, 400_000)]
    out: list[list[Result]] = []
    updated = threading.Event()
    granted: list[bool] = []
    hand_over = tm.commit_and_continue

    def commit_and_continue(*args: Any, **kwargs: Any) -> Any:
        # Windows keep every read until someone queues for a lock: then a
        # hand-over keeps only the next window's rows.  After it, the updater
        # must have row 0: the query waits for its commit here (bounded, for the
        # failing case), so the outcome depends on the lock manager alone, not
        # on how the threads are scheduled.
        heir = hand_over(*args, **kwargs)
        if not granted:
            granted.append(updated.wait(120))
        return heir

    tm.commit_and_continue = commit_and_continue  # type: ignore[method-assign]
    query = threading.Thread(target=lambda: out.append(engine.run(events)), daemon=True)
    query.start()
    while not tm.locks.holders(tm.table(TABLE).item(0)) and query.is_alive():
        time.sleep(0.001)
    assert query.is_alive(), "the query ended before the test could start its updater"
    with tm.begin() as t:
        t.put(TABLE, 0, {"price": 1, "cat": 0})
    updated.set()
    query.join()
    assert granted == [True], "the updater got row 0 only at the end of the query"
    assert out and len(out[0]) > 1000
    tm.locks.check_idle()


@pytest.mark.parametrize("every", [0, -3, 2.5, "32", True])
def test_a_bad_release_every_is_one_error_before_anything_runs(every: Any) -> None:
    tm = load_table("s2pl", {k: {"price": 1, "cat": 0} for k in range(ROWS)})
    engine = CQEngine(build_query(R), tm, "s2pl", {TABLE: COLUMNS})
    engine.release_every = every
    with pytest.raises(CQError, match="release_every must be a positive number of windows"):
        engine.run([{"id": 0, "part": 0, "qty": 1}])
    tm.locks.check_idle()


def test_snapshot_windows_share_a_transaction_until_something_commits() -> None:
    """``snapshot``: while nothing commits, the next window goes on in the previous
    window's read-only transaction (a new one would get the same snapshot); once
    something committed, the next window reads a snapshot that includes it."""
    rng = random.Random(3)
    tm = load_table("snapshot", {k: new_part(rng) for k in range(ROWS)})
    engine = CQEngine(build_query(R), tm, "snapshot", {TABLE: COLUMNS})
    events = [{"id": i, "part": i % ROWS, "qty": 1} for i in range(400)]
    with mock.patch.object(tm, "begin", wraps=tm.begin) as begin:
        quiet = engine.run(events)
    assert len(quiet) > 20 and begin.call_count == 1
    assert not tm.snapshots  # the run ended: its transaction too

    # an update committed between two windows, from this thread, without a callback
    # (which would make every window begin its own transaction)
    engine = CQEngine(build_query(R), tm, "snapshot", {TABLE: COLUMNS})
    emit = engine._emit
    committed_at: list[int] = []

    def emit_then_update(p: Any, attempts: int) -> None:
        emit(p, attempts)
        if p.window == 10:
            with tm.begin() as t:
                t.put(TABLE, 0, {"price": 1, "cat": 0})
            committed_at.append(tm.clock)

    with mock.patch.object(engine, "_emit", emit_then_update):
        results = engine.run(events)
    assert committed_at and [r.value for r in results[:11]] == [r.value for r in quiet[:11]]
    for res in results[11:]:
        assert res.state is not None and res.state[1] >= committed_at[0], res
        assert ("parts", 0, committed_at[0]) in res.versions or all(
            key != 0 for _, key, _ in res.versions
        )
    assert not tm.snapshots
