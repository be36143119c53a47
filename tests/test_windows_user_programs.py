"""A new user's own programs against the sliding-window engine: the docs' example,
bad input, and answers against a brute force over the slides they reflect.

Each test here failed before the fix it names; see the commit that added it (to
tests/test_users_7.py, which was split by subject into this file and two others).
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

# -- sliding windows ------------------------------------------------------------------

WINDOW_SCHEDULERS = ["serial", "ws", "lws", "ttu", "lws-rescan", "ttu-rescan"]


@pytest.mark.parametrize("name", WINDOW_SCHEDULERS)
def test_the_docs_window_example_runs_under_every_scheduler(name) -> None:
    # docs/windows.md steps the handle submit() returned until the engine is
    # idle.  Under lws the slide aborts it and the restart used to be a new
    # object, so stepping the old handle raised ValueError (list.remove).
    from txstream.windows import Query, QueryGroup, SlidingWindow, WindowEngine, get_scheduler

    w = SlidingWindow(n=10, t=1.0)
    engine = WindowEngine(w, get_scheduler(name), record=True)
    engine.fill([[(0.0, 1, 2, 100)]] * 10)
    top = QueryGroup([Query("topk", 10, attr="src", k=5), Query("topk", 3, attr="src", k=5)], w)
    txn = engine.submit(top, now=0.0)
    engine.step(txn, 0.0)
    engine.offer_slide([(1.0, 3, 4, 60)], 0.0, 1.0)
    engine.apply_slides()
    for _ in range(30):
        if not engine.active:
            break
        engine.step(txn, 1.0)
    assert not engine.active
    (result,) = engine.results
    assert result.tid == txn.tid  # the handle follows its restarts
    if name in ("ws", "serial"):  # the window as of its start; the slide waited
        assert result.answers == [[(1, 1000.0)], [(1, 300.0)]]
    else:  # every slide committed before the query
        assert result.answers == [[(1, 900.0), (3, 60.0)], [(1, 200.0), (3, 60.0)]]
    assert engine.aborts == (1 if name == "lws" else 0)


def test_stepping_a_query_the_engine_is_not_running_is_one_line() -> None:
    from txstream.windows import (
        Query,
        QueryGroup,
        SlidingWindow,
        WindowEngine,
        WindowError,
        get_scheduler,
    )

    w = SlidingWindow(3, 1.0)
    engine = WindowEngine(w, get_scheduler("ttu"))
    engine.fill([[(0.0, 1, 1, 1)]] * 3)
    txn = engine.submit(QueryGroup([Query("count", 3)], w), 0.0)
    while engine.active:
        engine.step(engine.pick(), 0.0)
    with pytest.raises(WindowError, match="not running"):
        engine.step(txn, 0.0)  # committed already: used to raise ValueError
    with pytest.raises(WindowError, match="not running"):
        engine.step(None, 0.0)  # type: ignore[arg-type]
    assert len(engine.results) == 1


@settings(max_examples=60, deadline=None)
@example(totals=list(range(1, 101)), p=7)
@example(totals=list(range(1, 101)), p=56)
@example(totals=list(range(1, 1001)), p=1.1)
@given(
    totals=st.lists(st.integers(1, 10**6), min_size=1, max_size=120, unique=True),
    p=st.one_of(st.integers(1, 100), st.sampled_from([0.1, 1.1, 7.0, 12.5, 33.3, 99.9])),
)
def test_percentile_is_the_nearest_rank_of_the_definition(totals, p) -> None:
    # The p-th percentile by nearest rank is the smallest total with at least
    # p% of the totals <= it: rank ceil(p * N / 100).  0.07 * 100 is
    # 7.000000000000001 in floats, so p=7 over 100 totals answered the 8th.
    import math
    from fractions import Fraction

    from txstream.windows import Query, QueryGroup, SlidingWindow, WindowEngine, get_scheduler

    w = SlidingWindow(2, 1.0)
    engine = WindowEngine(w, get_scheduler("ttu"))
    engine.fill([[(0.0, k, 0, v) for k, v in enumerate(totals)], []])
    for mode in ("ss", "ws"):
        engine.submit(QueryGroup([Query("percentile", 2, attr="src", p=p)], w, mode=mode), 0.0)
        while engine.active:
            engine.step(engine.pick(), 0.0)
        rank = math.ceil(Fraction(str(p)) * len(totals) / 100)
        assert engine.results[-1].answers == [float(sorted(totals)[rank - 1])]


def test_a_summary_scan_over_another_attribute_than_the_measure_is_refused() -> None:
    # Summaries keep per-value sums of the window's measure only; a summary
    # scan of topk/percentile/subset sums over another numeric attribute
    # answered with the measure's sums (clicks instead of dwell) silently.
    from txstream.windows import (
        Query,
        QueryGroup,
        SlidingWindow,
        WindowEngine,
        WindowError,
        get_scheduler,
    )

    w = SlidingWindow(
        2,
        1.0,
        fields=("ts", "user", "clicks", "dwell"),
        numeric=("clicks", "dwell"),
        groups=("user",),
        measure="clicks",
    )
    queries = [
        Query("sum", 2, attr="user", value="dwell", subset=frozenset(["a"])),
        Query("topk", 2, attr="user", value="dwell", k=2),
        Query("percentile", 2, attr="user", value="dwell"),
    ]
    for q in queries:
        with pytest.raises(WindowError, match="clicks"):
            QueryGroup([q], w)
        with pytest.raises(WindowError, match="clicks"):
            QueryGroup([q], w, cost="tuples")
    engine = WindowEngine(w, get_scheduler("ttu"))
    engine.fill([[(0, "a", 1, 100), (0, "b", 2, 5)], [(0, "a", 1, 50)]])
    for q, want in zip(queries, [150.0, [("a", 150.0), ("b", 5.0)], 5.0], strict=True):
        engine.submit(QueryGroup([q], w, mode="ws"), 0.0)  # a window scan can
        while engine.active:
            engine.step(engine.pick(), 0.0)
        assert engine.results[-1].answers == [want]
    # the measure itself, and plain aggregates of any numeric attribute, still work
    QueryGroup([Query("topk", 2, attr="user", value="clicks")], w)
    QueryGroup([Query("sum", 2, value="dwell")], w)


def test_subset_queries_over_different_attributes_are_not_grouped_together() -> None:
    # The group's partial results are computed with its first query's
    # attribute; a subset sum over dst grouped with one over src answered the
    # src sum for both (10 and 10, not 10 and 100).
    from txstream.windows import (
        Query,
        QueryGroup,
        SlidingWindow,
        WindowEngine,
        WindowError,
        get_scheduler,
    )

    w = SlidingWindow(2, 1.0)
    engine = WindowEngine(w, get_scheduler("ttu"))
    engine.fill([[(0.0, 1, 2, 10), (0.0, 2, 1, 100)], []])
    pair = [
        Query("sum", 2, attr="src", subset=frozenset([1])),
        Query("sum", 2, attr="dst", subset=frozenset([1])),
    ]
    for mode in ("ss", "ws"):
        with pytest.raises(WindowError, match="same partial results"):
            QueryGroup(pair, w, mode=mode)
        for q, want in zip(pair, [10.0, 100.0], strict=True):
            engine.submit(QueryGroup([q], w, mode=mode), 0.0)
            while engine.active:
                engine.step(engine.pick(), 0.0)
            assert engine.results[-1].answers == [want]
    # the same attribute and subset still share one scan
    QueryGroup([pair[0], Query("avg", 1, attr="src", subset=frozenset([1]))], w)


@pytest.mark.parametrize("n,t", [(8, 0.2), (3, 0.1), (30, 0.7)])
def test_windows_run_without_snapshot_queries_ends_cleanly(n, t) -> None:
    # With snapshot_interval=0, a slide that moved the clock past the end made
    # the snapshot loop divide by zero (txstream windows run --n 8 --t 0.2).
    from txstream.windows.sim import WindowParams, run

    for scheduler in WINDOW_SCHEDULERS:
        result = run(WindowParams(scheduler=scheduler, n=n, t=t, long_queries=5, seed=1))
        assert result.metrics["snapshots"] == 0


@pytest.mark.parametrize(
    "args,reason",
    [
        # fills a window of 100 million packets (used 23 GB and ran for minutes)
        (["--n", "10000", "--t", "10", "--duration", "0.01"], "packets"),
        # 10 million one-packet reads, each over 100 sub-windows (75 s)
        (["--n", "100", "--t", "0.001", "--duration", "100"], "reads"),
        # 360 million slides
        (["--n", "2", "--t", "0.00001", "--duration", "3600"], "slides"),
    ],
)
def test_windows_run_refuses_settings_that_run_for_hours_or_fill_memory(args, reason) -> None:
    import os
    import subprocess
    import sys

    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
        "from txstream.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, "windows", "run", *args],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"windows run {' '.join(args)} still runs after 30 s")
    assert proc.returncode == 2, proc.stderr[-300:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0], proc.stderr[-300:]
    assert proc.stdout == ""


def test_bad_input_to_the_window_api_is_one_line_and_leaves_the_engine_working() -> None:
    from txstream.errors import UnknownNameError
    from txstream.windows import (
        Query,
        QueryGroup,
        SlidingWindow,
        WindowEngine,
        WindowError,
        get_scheduler,
    )

    w = SlidingWindow(3, 1.0)
    engine = WindowEngine(w, get_scheduler("lws"))
    count = QueryGroup([Query("count", 3)], w)
    nan, inf = float("nan"), float("inf")
    bad = [
        lambda: SlidingWindow(10**9, 1.0),  # allocated a list of a billion slots
        lambda: SlidingWindow(3, "1"),
        lambda: SlidingWindow(3, inf),
        lambda: SlidingWindow(3, None, tuples_per_subwindow=1.5),
        lambda: SlidingWindow(3, None, tuples_per_subwindow="2"),
        lambda: SlidingWindow(3, None, tuples_per_subwindow=True),
        lambda: SlidingWindow(3, 1.0, fields=("ts", "src", "src", "size")),
        lambda: SlidingWindow(3, 1.0, fields=(1, 2, 3, 4)),
        lambda: get_scheduler(["ttu"]),
        lambda: QueryGroup([Query("count", 1.5)], w),
        lambda: QueryGroup([Query("count", "2")], w),
        lambda: QueryGroup([Query("count", True)], w),
        lambda: QueryGroup([Query("topk", 2, k=1.5)], w),
        lambda: QueryGroup([Query("topk", 2, k="3")], w),
        lambda: QueryGroup([Query("topk", 2, k=None)], w),
        lambda: QueryGroup([Query("percentile", 2, p="50")], w),
        lambda: QueryGroup([Query("percentile", 2, p=None)], w),
        lambda: QueryGroup([Query("sum", 2, subset=3)], w),  # TypeError at the first read
        lambda: QueryGroup([Query("sum", 2, subset="ab")], w),
        lambda: QueryGroup([Query("sum", 2, subset=[[1]])], w),
        lambda: QueryGroup(Query("count", 1), w),
        lambda: QueryGroup(["count"], w),
        lambda: QueryGroup([Query("count", 1)], None),
        lambda: WindowEngine(None, get_scheduler("ttu")),
        lambda: WindowEngine(w, 3),
        lambda: engine.fill([[(0.0, 1)], [], []]),  # too few fields
        lambda: engine.fill([[(0.0, 1, 2, "x")], [], []]),
        lambda: engine.fill([[(0.0, 1, 2, nan)], [], []]),
        lambda: engine.fill([[(0.0, 1, 2, inf)], [], []]),
        lambda: engine.fill([[(0.0, [1], 2, 3)], [], []]),  # unhashable address
        lambda: engine.fill([[1], [2], [3]]),
        lambda: engine.fill([None, [], []]),
        lambda: engine.fill([[], []]),
        lambda: engine.submit(None, 0.0),
    ]
    for k, fn in enumerate(bad):
        with pytest.raises((WindowError, UnknownNameError)) as info:
            fn()
        assert "\n" not in str(info.value), k
    engine.fill(iter([[(0.0, 1, 2, 10)], [], [(0.0, 2, 2, 5)]]))  # any iterable of buffers
    for rows in ([(1.0, 1)], None, [(1.0, 1, 2, nan)], [(1.0, {}, 2, 3)]):
        with pytest.raises(WindowError):
            engine.offer_slide(rows, 1.0, 1.0)
            engine.apply_slides()
    for index in (3, -1, 1.0, "0"):
        with pytest.raises(WindowError):  # -1 used to insert into sub-window 2
            engine.insert(index, [(0.0, 1, 2, 3)])  # type: ignore[arg-type]
    with pytest.raises(WindowError):
        engine.insert(0, [(0.0, 1)])
    # nothing bad was queued or applied: the window and the engine still work
    engine.offer_slide([(1.0, 3, 3, 7)], 1.0, 1.0)
    assert engine.apply_slides()[1] == [3]
    engine.submit(count, 1.0)
    while engine.active:
        engine.step(engine.pick(), 1.0)
    assert engine.results[-1].answers == [2]  # sub-windows 0, 1, 2: 1 + 0 + 1 tuples
    assert [w.current(i).version for i in range(3)] == [3, 1, 2]


# -- end to end: answers against a brute force --------------------------------------


def _brute_window_answer(q, tuples):
    """A query's answer from the definitions (tuples are (ts, src, dst, size))."""
    import math
    from fractions import Fraction

    col = {"ts": 0, "src": 1, "dst": 2, "size": 3}
    a, v = col[q.attr], col[q.value]
    if q.aggregate in ("count", "sum", "avg", "min", "max"):
        vals = [float(r[v]) for r in tuples if q.subset is None or r[a] in q.subset]
        return {
            "count": len(vals),
            "sum": float(sum(vals)),
            "avg": sum(vals) / len(vals) if vals else None,
            "min": min(vals, default=None),
            "max": max(vals, default=None),
        }[q.aggregate]
    totals: dict = {}
    for r in tuples:
        totals[r[a]] = totals.get(r[a], 0.0) + float(r[v])
    if q.aggregate == "count-distinct":
        return len(totals)
    if q.aggregate == "topk":
        return totals  # checked against the top k below
    ranked = sorted(totals.values())
    if not ranked:
        return None
    return ranked[math.ceil(Fraction(str(q.p)) * len(ranked) / 100) - 1]


@pytest.mark.parametrize("scheduler", WINDOW_SCHEDULERS)
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(2, 6))
def test_window_answers_equal_a_brute_force_over_the_slides_they_reflect(
    scheduler, seed, n
) -> None:
    import math
    import random

    from txstream.model import CheckOptions, check, parse_one
    from txstream.windows import Query, QueryGroup, SlidingWindow, WindowEngine, get_scheduler

    rng = random.Random(seed)
    w = SlidingWindow(n, 1.0)
    engine = WindowEngine(w, scheduler, record=True)
    slides: dict[int, list] = {}

    def buffer() -> list:
        return [
            (0.0, rng.randint(1, 5), rng.randint(1, 5), rng.randint(1, 40))
            for _ in range(rng.randint(0, 4))
        ]

    first = [buffer() for _ in range(n)]
    slides.update(enumerate(first))
    engine.fill(first)
    subset = frozenset(rng.sample(range(1, 6), 2))
    groups = [
        QueryGroup([Query(agg, rng.randint(1, n)) for agg in ("count", "sum", "min")], w),
        QueryGroup([Query("avg", rng.randint(1, n), attr="dst", subset=subset)], w, mode="ws"),
        QueryGroup(
            [
                Query("topk", rng.randint(1, n), k=2),
                Query("percentile", rng.randint(1, n), p=rng.choice([7, 50, 90])),
                Query("count-distinct", rng.randint(1, n)),
            ],
            w,
            scope=rng.choice(["length", "window"]),
        ),
    ]
    now = 0.0
    for _ in range(120):
        r = rng.random()
        if r < 0.25:
            rows = buffer()
            slides[w.slides + len(engine.pending)] = rows
            engine.offer_slide(rows, now, now)
            engine.apply_slides()
        elif r < 0.35:
            engine.submit(rng.choice(groups), now, priority=rng.choice([0, 1]))
        elif engine.active:
            engine.step(engine.pick(), now)
        now += 0.01
    while engine.active:
        engine.apply_slides()
        engine.step(engine.pick(), now)
    for res in engine.results:
        newest = max(res.versions.values())
        for q, got in zip(res.group.queries, res.answers, strict=True):
            tuples = [t for j in range(newest, newest - q.length, -1) for t in slides[j]]
            want = _brute_window_answer(q, tuples)
            if q.aggregate == "topk":
                assert [x for _, x in got] == sorted(want.values(), reverse=True)[: q.k]
                assert all(want[key] == x for key, x in got)
            elif want is None or got is None:
                assert got == want
            else:
                assert math.isclose(got, want, rel_tol=1e-9), (q, got, want)
    history = parse_one(engine.log.text())
    options = CheckOptions(subwindows=n)
    assert check(history, get_scheduler(scheduler).guarantees, options).holds
    assert check(history, "cs", options).holds


def test_serial_lets_no_other_query_start_while_one_holds_the_window() -> None:
    # Stepping a second query while the first held the window (serial) made
    # the second the holder; when it committed, a slide ran in the middle of
    # the first one's scan, and its history was no longer lws.
    from txstream.model import CheckOptions, check, parse_one
    from txstream.windows import Query, QueryGroup, SlidingWindow, WindowEngine, WindowError

    w = SlidingWindow(3, 1.0)
    engine = WindowEngine(w, "serial", record=True)
    engine.fill([[(0.0, 1, 1, 1)]] * 3)
    group = QueryGroup([Query("count", 3)], w)
    q1 = engine.submit(group, 0.0)
    q2 = engine.submit(group, 0.0)
    engine.step(q1, 0.0)
    with pytest.raises(WindowError, match="holds the window"):
        engine.step(q2, 0.0)
    engine.offer_slide([(1.0, 2, 2, 1)], 1.0, 1.0)
    assert engine.apply_slides() == (0.0, [])  # waits for q1
    while engine.active:
        engine.step(engine.pick(), 1.0)
        engine.apply_slides()
    assert engine.log is not None
    history = parse_one(engine.log.text())
    assert check(history, "lws", CheckOptions(subwindows=3)).holds
    assert [r.answers for r in engine.results] == [[3], [3]]
