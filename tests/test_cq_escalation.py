"""``optimistic`` always makes progress: a window that keeps failing its validation escalates.

An updater that rewrites the rows a window reads faster than the window's
transaction runs would fail its validation forever.  After
``CQEngine.escalate_after`` failed attempts the window runs on a snapshot
(``TransactionManager.begin_snapshot``), which always commits; the next window
is optimistic again.

The saturation here does not depend on timing: the query's own selection
waits, for every row it reads, until the updater thread (which rewrites the
rows as fast as it can) has committed a newer version of that row, so every
optimistic attempt has a read overwritten before its validation.  Each window
is judged from outside the engine against the updater's record of every
committed version (the audit of ``tests/test_cq_keep_all.py``).
"""

from __future__ import annotations

import random
import sys
import threading
from typing import Any

import pytest

from txstream.cq import CQEngine, CQError, RefJoin, Result, Select, Source, WindowAgg
from txstream.cq.workload import COLUMNS, TABLE, load_table
from txstream.txn import TransactionManager
from txstream.txn.base import TransactionError

R, S = 5, 2
ROWS = 8
EVENTS = 60  # every price passes the selection: window k holds events 2k .. 2k+4
STALLED = 100  # validations failed in a row with no window committed: no progress


class Saturator:
    """An updater thread that rewrites every row, round robin, as fast as it can.

    ``history[key]`` lists every committed (version, row) of the key, oldest
    first (one updater: right after its commit the newest version is its own).
    Row ``n`` is the updater's sequence number of that version of the key; prices stay
    at most 50, so every event passes the selection and the windows are fixed.
    """

    def __init__(self, tm: TransactionManager, seed: int) -> None:
        self.tm = tm
        self.tbl = tm.table(TABLE)
        self.rng = random.Random(seed)
        self.history = {k: [self.tbl.latest(k)] for k in range(ROWS)}
        self.seq = dict.fromkeys(range(ROWS), 0)
        self.changed = threading.Condition()
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                for key in range(ROWS):
                    n = self.seq[key] + 1
                    row = {"price": self.rng.randint(1, 50), "cat": 0, "n": n}
                    with self.tm.begin() as t:
                        t.put(TABLE, key, row)
                    self.history[key].append(self.tbl.latest(key))
                    with self.changed:
                        self.seq[key] = n
                        self.changed.notify_all()
        except BaseException as exc:  # seen by the waiting query, which fails the test
            self.error = exc
            with self.changed:
                self.changed.notify_all()

    def overwritten(self, key: int, n: int) -> None:
        """Wait until a version of ``key`` newer than its ``n``-th is committed."""
        with self.changed:
            while self.seq[key] <= n:
                if self.error is not None or not self.thread.is_alive():
                    raise AssertionError(f"the updater stopped: {self.error!r}")
                self.changed.wait(1.0)  # (only to look at the thread again; no deadline)


def saturated_run(
    release_every: int, seed: int
) -> tuple[CQEngine, list[Result], dict[int, list[tuple[int, Any]]], list[dict[str, int]]]:
    """The experiment's query, every read overwritten before its window validates."""
    rng = random.Random(seed)
    tm = load_table(
        "optimistic", {k: {"price": rng.randint(1, 50), "cat": 0, "n": 0} for k in range(ROWS)}
    )
    updater = Saturator(tm, seed)
    engine: CQEngine | None = None
    progress = {"windows": 0, "failed": tm.protocol.stats()["validation_failures"]}

    def saturate(v: dict[str, Any]) -> bool:
        assert engine is not None
        failed = tm.protocol.stats()["validation_failures"]
        if engine.stats.windows != progress["windows"]:
            progress.update(windows=engine.stats.windows, failed=failed)
        assert failed - progress["failed"] < STALLED, (
            f"window {engine.stats.windows}: {STALLED} validations failed in a row, "
            "none committed (no progress)"
        )
        updater.overwritten(v["part"], v["n"])  # the row just read is now stale
        return True

    src = Source("events", ("id", "part", "qty"))
    join = RefJoin("join_parts", src, TABLE, "part")
    cheap = Select("cheap", join, lambda v: saturate(v) and v["price"] <= 50)
    query = WindowAgg("mean_price", cheap, "avg", "price", R, S)
    engine = CQEngine(query, tm, "optimistic", {TABLE: COLUMNS})
    engine.release_every = release_every
    events = [{"id": i, "part": rng.randrange(ROWS), "qty": 1} for i in range(EVENTS)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # (speed only: a waiting read is handed the GIL sooner)
    updater.thread.start()
    try:
        results = engine.run(events)
    finally:
        updater.stop.set()
        updater.thread.join()
        sys.setswitchinterval(interval)
    assert updater.error is None
    return engine, results, updater.history, events


def judge(result: Result, history: dict[int, list[tuple[int, Any]]], events: list[Any]) -> None:
    """One instant had every version the window read current, and its value follows from them."""
    seen = {key: version for _, key, version in result.versions}
    assert len(seen) == len(result.versions), "two versions of one row in one window"
    lo, hi = 0, 1 << 62
    rows = {}
    for key, version in seen.items():
        chain = history[key]
        at = [i for i, (ts, _) in enumerate(chain) if ts == version]
        assert at, f"row {key}: version {version} was never committed"
        rows[key] = chain[at[0]][1]
        following = chain[at[0] + 1][0] if at[0] + 1 < len(chain) else 1 << 62
        lo, hi = max(lo, version), min(hi, following - 1)
    assert lo <= hi, f"window {result.window} mixes versions: no instant had them all"
    assert result.consistent
    prices: list[int] = []
    for event in events[result.lwm :]:
        row = rows.get(event["part"])
        assert row is not None, f"window {result.window} did not read row {event['part']}"
        if row["price"] <= 50:
            prices.append(row["price"])
            if len(prices) == R:
                break
    assert len(prices) == R
    assert result.value == pytest.approx(sum(prices) / R)


@pytest.mark.parametrize("release_every", [1, 32])
def test_a_saturated_optimistic_window_escalates_and_every_window_commits(
    release_every: int,
) -> None:
    engine, results, history, events = saturated_run(release_every, seed=release_every)
    # progress: the run went through its input, every window committed, in order
    assert len(results) == (EVENTS - R) // S + 1
    assert [r.window for r in results] == list(range(len(results)))
    assert engine.stats.windows == len(results)
    # each window failed escalate_after validations, then committed on a snapshot (the
    # last, incomplete one too: its "not complete yet" is validated like a result)
    assert engine.stats.escalations == len(results) + 1
    assert all(r.attempts == engine.escalate_after + 1 for r in results)
    assert engine.stats.redos == engine.escalate_after * (len(results) + 1)
    # and each is still right: one state of the table, its value from that state
    for r in results:
        judge(r, history, events)
    assert any(v > 0 for r in results for _, _, v in r.versions)  # updated rows were read


def test_begin_snapshot_reads_its_start_and_always_commits() -> None:
    tm = load_table("optimistic", {1: {"price": 10, "cat": 0}})
    reader = tm.begin_snapshot()
    assert reader.read(TABLE, 1) == {"price": 10, "cat": 0}
    with tm.begin() as t:
        t.put(TABLE, 1, {"price": 99, "cat": 0})
    assert reader.read(TABLE, 1) == {"price": 10, "cat": 0}  # still its start's version
    reader.commit()  # a plain optimistic reader would fail its validation here
    assert reader.status == "committed" and not tm.snapshots
    plain = tm.begin(read_only=True)
    plain.read(TABLE, 1)
    with tm.begin() as t:
        t.put(TABLE, 1, {"price": 5, "cat": 0})
    with pytest.raises(Exception, match="changed after it was read"):
        plain.commit()
    with pytest.raises(TransactionError, match="optimistic or snapshot"):
        load_table("s2pl", {}).begin_snapshot()


@pytest.mark.parametrize("after", [0, -1, 2.5, "8", True])
def test_a_bad_escalate_after_is_one_error_before_anything_runs(after: Any) -> None:
    tm = load_table("optimistic", {k: {"price": 1, "cat": 0} for k in range(ROWS)})
    src = Source("events", ("id", "part", "qty"))
    query = WindowAgg("w", RefJoin("j", src, TABLE, "part"), "avg", "price", R, S)
    engine = CQEngine(query, tm, "optimistic", {TABLE: COLUMNS})
    engine.escalate_after = after
    with pytest.raises(CQError, match="escalate_after must be a positive number of attempts"):
        engine.run([{"id": 0, "part": 0, "qty": 1}])
