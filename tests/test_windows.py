"""Sliding windows under concurrent slides: schedulers, histories, answers, TTU optimality."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txstream.cli import main
from txstream.errors import UnknownNameError
from txstream.model import check, parse_one
from txstream.model.check import CheckOptions
from txstream.windows import (
    SCHEDULERS,
    Query,
    QueryGroup,
    SlidingWindow,
    SubWindow,
    WindowEngine,
    WindowError,
    evaluate_directly,
    get_scheduler,
)
from txstream.windows.feed import WindowFeed
from txstream.windows.sim import WindowParams, packets, run

ALL = sorted(SCHEDULERS)


class KeepingWindow(SlidingWindow):
    """A window that remembers every version it ever held: the test oracle's memory."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.versions: dict[tuple[int, int], SubWindow] = {}

    def slide(self, rows: Any, *, start: float = 0.0, full: float = 0.0) -> SubWindow:
        sub = super().slide(rows, start=start, full=full)
        self.versions[(sub.index, sub.version)] = sub
        return sub


def rows(rng: random.Random, count: int, start: float = 0.0) -> list[tuple[Any, ...]]:
    return [
        (start + k * 1e-3, rng.randrange(12), rng.randrange(12), rng.randint(1, 100))
        for k in range(count)
    ]


def opts(n: int) -> CheckOptions:
    return CheckOptions(subwindows=n)


# -- the window ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 1}, "n >= 2"),
        ({"n": 5, "t": 0}, "t > 0"),
        ({"n": 5, "t": -1.0}, "t > 0"),
        ({"n": 5, "tuples_per_subwindow": 0}, "at least 1 tuple"),
        ({"n": 5, "groups": ("nope",)}, "unknown attribute"),
    ],
)
def test_bad_windows_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(WindowError, match=message):
        SlidingWindow(**kwargs)


def test_a_slide_replaces_the_oldest_sub_window_and_ttu_counts_down() -> None:
    w = SlidingWindow(4, 1.0)
    for j in range(4):
        w.slide([(j, 1, 1, 10)])
    assert w.youngest() == [3, 2, 1, 0]
    assert [w.ttu(i) for i in range(4)] == [1, 2, 3, 4]  # sub-window 0 goes next
    w.slide([(4, 2, 2, 20)])
    assert w.current(0).version == 4 and w.youngest(2) == [0, 3]
    assert [w.ttu(i) for i in range(4)] == [4, 1, 2, 3]
    with pytest.raises(WindowError, match=r"longer|does not fit"):
        w.youngest(5)


def test_retained_versions_outlive_their_slide_only_while_claimed() -> None:
    w = SlidingWindow(2, 1.0)
    w.slide([(0, 1, 1, 1)])
    w.slide([(1, 1, 1, 1)])
    w.retain(0, 0)
    w.slide([(2, 1, 1, 1)])
    assert w.get_version(0, 0).version == 0 and w.retained_count() == 1
    w.release(0, 0)
    with pytest.raises(WindowError, match="expired"):
        w.get_version(0, 0)


# -- queries: summary scan equals window scan ---------------------------------------------

AGGS = ["count", "sum", "avg", "min", "max", "topk", "percentile", "count-distinct"]


@given(
    seed=st.integers(0, 10_000),
    aggregate=st.sampled_from(AGGS),
    lengths=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    sizes=st.lists(st.integers(0, 30), min_size=5, max_size=5),
    subset=st.booleans(),
)
def test_summary_scan_answers_equal_a_plain_window_scan(
    seed: int, aggregate: str, lengths: list[int], sizes: list[int], subset: bool
) -> None:
    rng = random.Random(seed)
    w = SlidingWindow(5, 1.0)
    for size in sizes:
        w.slide(rows(rng, size))
    use_subset = subset and aggregate in ("count", "sum", "avg")
    qs = [
        Query(
            aggregate,
            n,
            attr="dst",
            k=3,
            p=75.0,
            subset=frozenset(range(0, 12, 3)) if use_subset else None,
        )
        for n in lengths
    ]
    group = QueryGroup(qs, w)
    subs = [w.current(i) for i in w.youngest(group.length)]
    partials = [group.partial(s)[0] for s in subs]
    assert group.answers(partials) == evaluate_directly(group, subs)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (Query("topk", 6), "longer than the window"),
        (Query("topk", 0), r"longer than the window|empty"),
        (Query("median", 3), "unknown aggregate"),
        (Query("min", 3, subset=frozenset({1})), "not supported"),
        (Query("topk", 3, attr="size"), "grouping attribute"),
        (Query("percentile", 3, p=0), "0 < p"),
    ],
)
def test_bad_queries_are_refused(query: Query, message: str) -> None:
    with pytest.raises(WindowError, match=message):
        QueryGroup([query], SlidingWindow(5, 1.0))


# -- every scheduler: recorded histories and answers --------------------------------------


@pytest.fixture(params=ALL, scope="module")
def scheduler(request: pytest.FixtureRequest) -> str:
    """Every scheduler by name: the same contract tests run against each."""
    return str(request.param)


def drive(name: str, n: int, seed: int, steps: int, *, scope: str = "window") -> WindowEngine:
    """A random interleaving of slides, long queries and snapshot queries."""
    rng = random.Random(seed)
    w = KeepingWindow(n, 1.0)
    engine = WindowEngine(w, get_scheduler(name), record=True)
    engine.fill([rows(rng, rng.randint(1, 8)) for _ in range(n)])
    groups = [
        QueryGroup([Query("topk", rng.randint(1, n), k=2)], w, scope=scope),
        QueryGroup([Query("sum", rng.randint(1, n)), Query("max", rng.randint(1, n))], w),
        QueryGroup([Query("count-distinct", n, attr="dst")], w, scope=scope),
    ]
    now = 0.0
    for _ in range(steps):
        roll = rng.random()
        if roll < 0.25:
            engine.offer_slide(rows(rng, rng.randint(0, 8), now), now, now)
            engine.apply_slides()
        elif roll < 0.4:
            g = rng.randrange(len(groups))
            engine.submit(groups[g], now, priority=rng.choice((0, 0, 1)), tag=g)
        else:
            txn = engine.pick()
            if txn is not None:
                now += engine.step(txn, now) + 1e-3
        if not engine.blocked():
            engine.apply_slides()
    return engine


@given(seed=st.integers(0, 100_000), n=st.integers(2, 5))
def test_histories_satisfy_the_schedulers_criterion(scheduler: str, seed: int, n: int) -> None:
    engine = drive(scheduler, n, seed, 120)
    assert engine.log is not None
    history = parse_one(engine.log.text())
    guarantee = engine.scheduler.guarantees
    verdict = check(history, guarantee, opts(n))
    assert verdict.holds, (engine.log.text(), verdict.evidence)
    assert check(history, "cs").holds


@given(
    seed=st.integers(0, 100_000), n=st.integers(2, 5), scope=st.sampled_from(["window", "length"])
)
def test_every_answer_equals_a_direct_scan_of_the_versions_it_reflects(
    scheduler: str, seed: int, n: int, scope: str
) -> None:
    engine = drive(scheduler, n, seed, 150, scope=scope)
    window = engine.window
    assert isinstance(window, KeepingWindow)
    for result in engine.results:
        order = sorted(result.versions, key=lambda i: -result.versions[i])
        subs = [window.versions[(i, result.versions[i])] for i in order]
        assert result.answers == evaluate_directly(result.group, subs)
        # the versions read form one window state: consecutive slide ids
        got = sorted(result.versions.values())
        assert got == list(range(got[0], got[0] + len(got)))


def test_lws_and_ttu_answers_reflect_every_slide_committed_before_them() -> None:
    for name in ("lws", "ttu", "lws-rescan", "ttu-rescan", "serial"):
        for seed in range(40):
            engine = drive(name, 4, seed, 150)
            for r in engine.results:
                # scope=window: the newest version read is the newest slide at commit
                assert r.newest_version == max(r.versions.values())


def test_ws_histories_are_not_lws_when_the_window_slides_during_a_scan() -> None:
    rng = random.Random(1)
    w = SlidingWindow(3, 1.0)
    engine = WindowEngine(w, get_scheduler("ws"), record=True)
    engine.fill([rows(rng, 3) for _ in range(3)])
    group = QueryGroup([Query("sum", 3)], w)
    txn = engine.submit(group, 0.0)
    engine.step(txn, 0.0)  # reads sub-window 0
    engine.offer_slide(rows(rng, 3), 1.0, 1.0)  # T_3 overwrites sub-window 0
    engine.apply_slides()
    engine.step(txn, 1.0)
    engine.step(txn, 1.0)
    assert engine.results and engine.results[0].newest_version == 2  # the start state
    assert engine.log is not None
    history = parse_one(engine.log.text())
    assert check(history, "ws", opts(3)).holds
    lws = check(history, "lws", opts(3))
    assert not lws.holds


def test_serial_slides_wait_for_the_running_query() -> None:
    rng = random.Random(2)
    w = SlidingWindow(3, 1.0)
    engine = WindowEngine(w, get_scheduler("serial"), record=True)
    engine.fill([rows(rng, 3) for _ in range(3)])
    txn = engine.submit(QueryGroup([Query("count", 3)], w), 0.0)
    engine.step(txn, 0.0)
    engine.offer_slide(rows(rng, 3), 1.0, 1.0)
    assert engine.apply_slides() == (0.0, []) and engine.blocked()
    engine.step(txn, 1.0)
    engine.step(txn, 1.0)
    assert not engine.blocked()
    assert engine.apply_slides()[1] == [3]
    assert engine.log is not None
    assert engine.log.operations() == ["rQ1[0]", "rQ1[1]", "rQ1[2]", "cQ1", "w3[0]", "c3"]


def test_lws_aborts_and_ttu_does_not_on_the_papers_history_c() -> None:
    # H_c of Section 3.1 with n = 5: Q1 has read everything but sub-window 0 when T_5 arrives.
    outcomes = {}
    for name in ("lws", "ttu"):
        w = SlidingWindow(5, 1.0)
        engine = WindowEngine(w, get_scheduler(name), record=True)
        engine.fill([[(j, 1, 1, 1)] for j in range(5)])
        txn = engine.submit(QueryGroup([Query("count", 5)], w), 0.0)
        for _ in range(4):
            engine.step(txn, 0.0)
        engine.offer_slide([(5, 1, 1, 1)], 1.0, 1.0)
        engine.apply_slides()
        outcomes[name] = engine.aborts
    # lws reads 0,1,2,3 first (index order) and so read the sub-window T_5 replaces;
    # ttu reads 4,3,2,1 (highest time-to-update first) and keeps 0 for last.
    assert outcomes == {"lws": 1, "ttu": 0}


# -- Theorem 4: TTU aborts no more often than any other read order ------------------------


def aborted_with_order(n: int, start_slide: int, after: list[int], order: list[int]) -> bool:
    """Oracle: a fixed read order, slides after the given read counts; was it aborted?"""
    read: set[int] = set()
    j = start_slide
    for k, i in enumerate(order):
        read.add(i)
        for _ in range(after.count(k + 1)):
            if j % n in read and len(read) < n:
                return True
            j += 1
    return False


@given(
    n=st.integers(2, 5),
    start=st.integers(0, 20),
    after=st.lists(st.integers(1, 4), max_size=4),
)
def test_ttu_is_optimal_against_every_read_order(n: int, start: int, after: list[int]) -> None:
    """Theorem 4 on small cases: if TTU aborts, every fixed read order aborts too.

    Only slides that come before the last read matter; the brute force runs all
    n! orders of one query's reads with the slides at the same points.
    """
    after = [a for a in after if a < n]
    w = SlidingWindow(n, 1.0)
    engine = WindowEngine(w, get_scheduler("ttu"))
    engine.fill([[(j, 1, 1, 1)] for j in range(n)])
    for k in range(start):  # age the window so slide ids do not start at n
        engine.offer_slide([(k, 1, 1, 1)], 0, 0)
        engine.apply_slides()
    txn = engine.submit(QueryGroup([Query("count", n)], w), 0.0)
    for k in range(1, n + 1):
        if engine.aborts or not engine.active:
            break
        engine.step(txn, 0.0)
        for _ in range(after.count(k)):
            engine.offer_slide([(0, 1, 1, 1)], 0, 0)
            engine.apply_slides()
    ttu_aborted = engine.aborts > 0
    others = [
        aborted_with_order(n, n + start, after, list(order))
        for order in itertools.permutations(range(n))
    ]
    assert not ttu_aborted or all(others)


# -- Section 4.2 and 4.3 -----------------------------------------------------------------


def test_rescan_variants_never_abort_where_their_base_does() -> None:
    base = run(WindowParams(scheduler="lws", n=40, t=1.0, long_queries=40, seed=3))
    rescan = run(WindowParams(scheduler="lws-rescan", n=40, t=1.0, long_queries=40, seed=3))
    assert base.metrics["aborts"] > 0
    assert rescan.metrics["aborts"] == 0 and rescan.metrics["rescans"] > 0


def test_tuples_inserted_into_read_sub_windows_reach_the_scanning_query() -> None:
    rng = random.Random(5)
    w = KeepingWindow(4, 1.0)
    engine = WindowEngine(w, get_scheduler("ttu"))
    engine.fill([rows(rng, 4) for _ in range(4)])
    group = QueryGroup([Query("topk", 4, k=3), Query("topk", 2, k=3)], w)
    txn = engine.submit(group, 0.0)
    engine.step(txn, 0.0)
    engine.step(txn, 0.0)  # two sub-windows read
    done = list(txn.read)
    engine.insert(done[0], rows(rng, 5))  # a join result expiring with that sub-window
    engine.insert(3 - done[0], rows(rng, 2))  # and one into a sub-window not read yet
    while engine.active:
        engine.step(txn, 0.0)
    result = engine.results[0]
    subs = [w.current(i) for i in w.youngest(4)]
    assert result.answers == evaluate_directly(group, subs)


# -- the simulation's claims (the paper's shape; numbers in docs/windows.md) ---------------


def test_simulation_shapes_hold_on_a_small_run() -> None:
    got = {
        s: run(WindowParams(scheduler=s, n=60, t=1.0, long_queries=40, seed=4)).metrics
        for s in ("serial", "ws", "lws", "ttu")
    }
    assert got["ttu"]["aborts"] == 0 < got["lws"]["aborts"]
    assert got["ttu"]["throughput"] >= 0.96 * got["serial"]["throughput"]
    assert got["ttu"]["lr_freshness"] == min(g["lr_freshness"] for g in got.values())


def test_snapshot_queries_wait_longest_under_serial() -> None:
    got = {
        s: run(
            WindowParams(scheduler=s, n=20, t=5.0, long_queries=100, snapshot_interval=1.0, seed=2)
        ).metrics
        for s in ("serial", "ttu")
    }
    assert got["serial"]["snap_response"] > got["ttu"]["snap_response"]


def test_snapshot_queries_left_queued_at_the_end_are_counted() -> None:
    # At n = 40 a whole-window scan takes ~1.24 s against one arrival a second: the queue
    # grows, and the response means cover only the queries that got through.
    def metrics(n: int) -> dict[str, Any]:
        params = WindowParams(
            scheduler="ttu", n=n, t=5.0, long_queries=100, snapshot_interval=1.0, seed=1
        )
        return run(params).metrics

    light, saturated = metrics(10), metrics(40)
    assert light["snap_unfinished"] == 0 < light["snapshots"]
    total = saturated["snapshots"] + saturated["snap_unfinished"]
    assert saturated["snap_unfinished"] >= 0.2 * total


def test_runs_are_deterministic_by_seed() -> None:
    a = run(WindowParams(scheduler="ttu", n=10, seed=9, record=True))
    b = run(WindowParams(scheduler="ttu", n=10, seed=9, record=True))
    assert a.metrics == b.metrics and a.history == b.history


# -- feeding and the command line ---------------------------------------------------------


def test_feed_fills_then_slides_and_skips_replayed_batches() -> None:
    w = SlidingWindow(3, None, tuples_per_subwindow=2)
    feed = WindowFeed(WindowEngine(w, get_scheduler("ttu")))
    batch = [(float(k), k, k, 10) for k in range(8)]
    assert feed.add_batch(0, batch[:5]) == 2
    assert feed.add_batch(0, batch[:5]) == 0  # replay
    assert feed.add_batch(1, batch[5:]) == 2
    assert w.slides == 4 and w.current(0).tuples == [batch[6], batch[7]]
    with pytest.raises(WindowError, match="fields"):
        feed.add((1.0, 2))


def test_time_based_feed_cuts_sub_windows_by_timestamp() -> None:
    w = SlidingWindow(2, 1.0)
    feed = WindowFeed(WindowEngine(w, get_scheduler("lws")))
    feed.add_batch(0, [(0.1, 1, 1, 1), (0.5, 1, 1, 1), (1.2, 2, 2, 2), (3.4, 3, 3, 3)])
    # spans [0.1, 1.1), [1.1, 2.1) fill the window, [2.1, 3.1) slides it; 3.4 is buffered
    assert w.slides == 3 and [r[0] for r in w.current(0).tuples] == []
    assert [r[0] for r in w.current(1).tuples] == [1.2]


def test_cli_run_records_a_history_that_check_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "h.txt"
    assert main(["windows", "run", "--scheduler", "lws", "--n", "8", "--record", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["scheduler"] == "lws" and summary["commits"] > 0
    assert main(["check", "--criterion", "lws", "--expect", str(out)]) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--n", "1"], "--n: must be >= 2"),
        (["--t", "0"], "--t: must be > 0"),
        (["--t", "inf"], "--t: must be a finite number"),
        (["--scheduler", "fifo"], "unknown scheduler 'fifo'"),
        (["--query", "topk:21"], "longer than the window"),
        (["--query", "median:3"], "unknown aggregate 'median'"),
        # accepted and ignored: sum:5:dst ran sum:5
        (["--query", "sum:5:dst"], "sum is over the packet sizes and takes no ATTR"),
        (["--query", "count:5:zzz"], "takes no ATTR"),
    ],
)
def test_cli_bad_input_is_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["windows", "run", "--n", "20", *args])
    except SystemExit as exc:  # an option's type refused the value while parsing
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_unknown_scheduler_by_name() -> None:
    with pytest.raises(UnknownNameError):
        get_scheduler("nope")


def test_packets_follow_the_rate_with_bursts() -> None:
    p = WindowParams(t=1.0, rate=1000.0)
    rng = random.Random(0)
    counts = [len(packets(rng, p, 0.0)) for _ in range(300)]
    # the factors are scaled to a mean of 1 (the paper's steady-state rate)
    assert min(counts) >= 350 and max(counts) <= 7_700
    assert 900 <= sum(counts) / len(counts) <= 1100
    assert max(counts) > 2000  # some bursts
