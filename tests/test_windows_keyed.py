"""One window per group key: the in-process engine and the executors' job agree (no Spark).

The job (:func:`txstream.jobs.windows.window_job`) keeps each key's window in
runtime tables and runs every tuple and snapshot query as a transaction;
``run_local`` runs it through the same executor code as Spark does.  Its
answers, window histories and per-key counters must equal the in-process
engine's (:func:`txstream.windows.keyed.run_keyed`) for every scheduler, on
any cut of the input into micro-batches and across crashes.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from txstream.jobs.windows import window_histories, window_job
from txstream.model import check, parse_one
from txstream.model.check import CheckOptions
from txstream.spark.testing import assert_same_results, run_with_crashes, serial_run
from txstream.windows import Costs, Query, WindowError
from txstream.windows.engine import HistoryLog
from txstream.windows.keyed import (
    KeyedWindows,
    KeyWindow,
    StreamLog,
    history_operations,
    run_keyed,
    snapshot_query,
    workload,
)
from txstream.windows.rows import META

SCHEDULERS = ["serial", "ws", "lws", "ttu", "lws-rescan", "ttu-rescan"]
LONG = (
    (Query("topk", 4, attr="src", k=3), Query("topk", 2, attr="src", k=3)),
    (Query("percentile", 3, attr="dst", p=90.0), Query("count-distinct", 4, attr="dst")),
)


def spec(scheduler: str, **kw: Any) -> KeyedWindows:
    # 4 sub-windows of 0.2 s, about 200 packets each; a read costs about 10-20 ms
    # of the key's CPU: queries span several tuples' arrivals and meet slides.
    return KeyedWindows(
        n=4,
        t=0.2,
        scheduler=scheduler,
        long_queries=LONG,
        costs=Costs(per_unit=3e-5),
        record=True,
        **kw,
    )


EVENTS = workload(3, 3.0, snapshot_interval=0.15, addresses=60, subset=5, n=4, seed=7)


def batches(events: list[Any], seed: int) -> list[list[Any]]:
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(events)), 6))
    return [events[a:b] for a, b in zip([0, *cuts], [*cuts, len(events)], strict=True)]


def by_tid(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["key"], r["tid"]))


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_the_job_on_runtime_tables_gives_the_in_process_engines_answers(
    tmp_path: Path, scheduler: str
) -> None:
    s = spec(scheduler)
    want = run_keyed(s, EVENTS)
    job = window_job(s)
    job.run_local(batches(EVENTS, 1), tmp_path, partitions=2)
    got = tx.read_output(tmp_path, "results")
    assert by_tid(got) == by_tid(want.results)
    kinds = {r["kind"] for r in got}
    assert kinds == {"long", "snapshot"}
    histories = window_histories(tmp_path, 4)
    assert sorted(histories) == ["0", "1", "2"]
    guarantee = "ws" if scheduler == "ws" else "lws"
    for key, text in histories.items():
        assert text == want.history(int(key))
        history = parse_one(text)
        assert check(history, guarantee, CheckOptions(subwindows=4)).holds, text
    # the counters the engine keeps per key come out of the tables as in process
    rows = {r["key"]: r for r in tx.read_table(tmp_path, META)}
    for key, kw in want.windows.items():
        state = rows[key]["engine"]
        assert (state["aborts"], state["rescans"]) == (kw.engine.aborts, kw.engine.rescans)
        assert state["window_slides"] == kw.window.slides


def test_the_schedulers_differ_on_this_input() -> None:
    # The test above would be weak if every scheduler ran the queries alone: here
    # slides meet running queries, lws aborts some, ttu fewer, ws re-reads none.
    runs = {s: run_keyed(spec(s), EVENTS) for s in ("serial", "lws", "ttu", "ws", "lws-rescan")}

    def aborts(s: str) -> int:
        return sum(kw.engine.aborts for kw in runs[s].windows.values())

    assert aborts("lws") > aborts("ttu") >= 0
    assert aborts("serial") == aborts("ws") == 0
    assert sum(kw.engine.rescans for kw in runs["lws-rescan"].windows.values()) > 0
    fresh = {
        s: sum(r["freshness"] for r in runs[s].results if r["kind"] == "snapshot")
        / sum(r["kind"] == "snapshot" for r in runs[s].results)
        for s in runs
    }
    assert fresh["ttu"] < fresh["serial"]


@pytest.mark.parametrize("scheduler", ["ws", "lws"])
def test_crashes_anywhere_leave_the_answers_of_a_run_without_crashes(
    tmp_path: Path, scheduler: str
) -> None:
    s = spec(scheduler)
    job = window_job(s)
    cut = batches(EVENTS, 2)
    rng = random.Random(5)
    crashes = sorted({(b, rng.randrange(len(cut[b]))) for b in rng.sample(range(len(cut)), 4)})
    run_with_crashes(job, cut, tmp_path / "crashed", crashes, partitions=3)
    serial_run(job, cut, tmp_path / "serial")
    assert_same_results(job, tmp_path / "crashed", tmp_path / "serial")
    assert by_tid(tx.read_output(tmp_path / "crashed", "results")) == by_tid(
        run_keyed(s, EVENTS).results
    )


def test_a_bad_tuple_or_query_is_refused_alone_and_changes_nothing(tmp_path: Path) -> None:
    s = spec("ttu")
    bad: list[Any] = [
        ("packets", {"key": 1, "ts": 0.55, "src": 1, "dst": 2, "size": float("nan")}),
        (
            "snapshots",
            {
                "key": 1,
                "ts": 0.56,
                "id": 1,
                "aggregate": "median",
                "length": 2,
                "attr": "src",
                "subset": "",
            },
        ),
        (
            "snapshots",
            {
                "key": 2,
                "ts": 0.57,
                "id": 2,
                "aggregate": "sum",
                "length": 9,
                "attr": "src",
                "subset": "1 2",
            },
        ),
    ]
    events = sorted(EVENTS + bad, key=lambda e: (e[1]["ts"], e[0] != "packets"))
    window_job(s).run_local(batches(events, 3), tmp_path, partitions=2)
    failures = tx.read_failures(tmp_path)
    assert len(failures) == 3
    assert all("WindowError" in f["error"] for f in failures), failures
    assert by_tid(tx.read_output(tmp_path, "results")) == by_tid(run_keyed(s, EVENTS).results)
    kw = KeyWindow(s, 1)
    with pytest.raises(WindowError, match="size must be a finite number"):
        kw.packet((0.1, 1, 2, float("inf")))
    assert kw.now == float("-inf") and kw.buffered == 0


@pytest.mark.parametrize("scheduler", ["serial", "ttu"])
def test_tuple_based_windows_on_runtime_tables_equal_the_in_process_engine(
    tmp_path: Path, scheduler: str
) -> None:
    # A buffer is full at its b-th tuple (not at a span's end): the slide runs in
    # that tuple's own transaction.
    s = KeyedWindows(
        n=4,
        t=None,
        tuples_per_subwindow=150,
        scheduler=scheduler,
        long_queries=LONG,
        costs=Costs(per_unit=3e-5),
        record=True,
    )
    want = run_keyed(s, EVENTS)
    window_job(s).run_local(batches(EVENTS, 4), tmp_path, partitions=2)
    got = tx.read_output(tmp_path, "results")
    assert by_tid(got) == by_tid(want.results) and len(got) > 20
    assert window_histories(tmp_path, 4) == {str(k): want.history(k) for k in want.windows}


class _Tee(HistoryLog):
    """The engine's own history log, with a StreamLog written alongside."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.stream = StreamLog(n)
        self.positions: dict[int, int] = {}

    def slide(self, j: int) -> None:
        super().slide(j)
        self.stream.slide(j)

    def read(self, tid: str, index: int, version: int, current: int) -> int:
        pos = super().read(tid, index, version, current)
        self.positions[pos] = self.stream.read(tid, index, version, current)
        return pos

    def remove(self, pos: int) -> None:
        super().remove(pos)
        self.stream.remove(self.positions.get(pos, -1))

    def end(self, tid: str, committed: bool) -> None:
        super().end(tid, committed)
        self.stream.end(tid, committed)


@pytest.mark.parametrize("scheduler", ["ws", "lws", "lws-rescan", "ttu-rescan"])
def test_the_streamed_history_is_the_engines_own_history(scheduler: str) -> None:
    # The executors emit a key's history as entries; put in order they must give
    # the text WindowEngine's HistoryLog gives (ws reads of expired versions moved
    # before their expiry, reads undone by a re-scan left out).
    class Teed(KeyWindow):
        def _new_engine(self, log_seq: int = 0) -> Any:
            engine = super()._new_engine(log_seq)
            engine.log = _Tee(self.window.n)
            return engine

    s = spec(scheduler)
    kw = Teed(s, 0)
    for kind, row in EVENTS:
        if row["key"] != 0:
            continue
        if kind == "packets":
            kw.packet(tuple(row[f] for f in s.fields))
        else:
            kw.snapshot(row["ts"], snapshot_query(row), row["id"])
    log = kw.engine.log
    assert isinstance(log, _Tee)
    ops = log.operations()
    assert len(ops) > 100
    assert history_operations(log.stream.entries) == ops
    if scheduler == "ws":
        assert any(e[2] >= 0 for e in log.stream.entries)  # reads placed before an expiry
    if scheduler == "lws-rescan":
        assert any(e[1] is None for e in log.stream.entries)  # reads undone
