"""On Spark: plain stream-static joins mix table versions in windows; txstream's strategies do not.

The joins and windows run on executors (``txstream.spark.reference``); the
strategies pin the rows each micro-batch's CQ-derived transaction reads.  The
oracles: :class:`CQEngine` fed the same micro-batches with the same updates
between them (itself checked against brute force in ``test_cq_trees.py``), and
a brute-force evaluation written here from the window definitions.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.cq import CQEngine, CQError, Updaters
from txstream.cq.workload import COLUMNS, TABLE, build_query, load_table, new_part
from txstream.errors import TxStreamError
from txstream.jobs.cq import EVENT_SCHEMA, MODES, SparkCQ, read_results

STRATEGIES = ("snapshot", "s2pl", "optimistic")


def write_batches(folder: Path, batches: list[list[dict[str, int]]], first: int = 0) -> None:
    """One CSV file per micro-batch, with increasing modification times (the file order)."""
    folder.mkdir(exist_ok=True)
    for f, events in enumerate(batches, start=first):
        path = folder / f"e{f:04d}.csv"
        path.write_text("".join(f"{e['id']},{e['part']},{e['qty']}\n" for e in events))
        os.utime(path, (1_000_000 + f, 1_000_000 + f))


def make_batches(rng: random.Random, n: int, size: int, parts: int) -> list[list[dict[str, int]]]:
    ids = iter(range(n * size))
    return [
        [{"id": next(ids), "part": rng.randrange(parts), "qty": 1} for _ in range(size)]
        for _ in range(n)
    ]


def price_setter(tm: Any, keys: list[int], seed: int) -> Callable[[int], None]:
    """Another system rewriting every price (and deleting or inserting a row) between batches."""

    def update(batch_id: int) -> None:
        with tm.begin() as t:
            for k in keys:
                t.put(TABLE, k, {"price": 1 + (k * 7 + batch_id * 13 + seed) % 60, "cat": 0})
            if batch_id % 2:
                t.delete(TABLE, keys[0])

    return update


def query(
    spark: Any,
    folder: Path,
    tm: Any,
    strategy: str,
    r: int,
    s: int,
    agg: str = "avg",
    time: str | None = None,
    schema: str = EVENT_SCHEMA,
) -> SparkCQ:
    from txstream.spark.sources import csv_files

    stream = csv_files(spark, folder, schema, max_files_per_trigger=1)
    return (
        SparkCQ("timed" if time else "mean_price", tm, strategy)
        .stream(stream, order="id")
        .join(TABLE, on="part", schema="price long")
        .where("price <= 50")
        .window(agg, "price", r=r, s=s, time=time)
    )


def run(q: SparkCQ, checkpoint: Path, **kw: Any) -> Any:
    handle = q.start(checkpoint, **kw)
    try:
        handle.processAllAvailable()
    finally:
        handle.stop()
    return handle


def engine_oracle(
    rows: dict[int, Any], batches: list[list[dict[str, int]]], r: int, s: int, seed: int
) -> list[tuple[int, int, float]]:
    """CQEngine fed the same micro-batches, the same updates between them."""
    tm = load_table("snapshot", dict(rows))
    engine = CQEngine(build_query(r, s), tm, "snapshot", {TABLE: COLUMNS})
    update = price_setter(tm, sorted(rows), seed)
    out = []
    for b, events in enumerate(batches):
        out += [(x.window, x.lwm, round(x.value, 9)) for x in engine.feed(events)]
        update(b)
    return out


def brute_force(
    states: list[dict[int, Any]], batches: list[list[dict[str, int]]], r: int, s: int
) -> list[tuple[int, int, float]]:
    """From the definitions: window n starts at its LWM and holds the first r selected events
    from there, all joined under the table state of the batch in which it completes; the
    next starts at its s-th selected event (s < r) or right after it (s = r)."""
    out: list[tuple[int, int, float]] = []
    seen: list[dict[str, int]] = []
    start = 0
    for state, events in zip(states, batches, strict=True):
        seen += events
        while True:
            chosen = []
            i = start
            while i < len(seen) and len(chosen) < r:
                row = state.get(seen[i]["part"])
                if row is not None and row["price"] <= 50:
                    chosen.append((i, row["price"]))
                i += 1
            if len(chosen) < r:
                break
            value = sum(p for _, p in chosen) / r
            out.append((len(out), seen[start]["id"], round(value, 9)))
            start = chosen[s][0] if s < r else i
    return out


def test_windows_spanning_micro_batches(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    rng = random.Random(4)
    rows = {k: {"price": rng.randint(1, 60), "cat": 0} for k in range(10)}
    batches = make_batches(rng, 6, 12, 12)  # parts 10 and 11 have no row: absent reads
    write_batches(tmp_path / "events", batches)
    r, s = 8, 3
    want = engine_oracle(rows, batches, r, s, seed=0)
    assert want

    tm = load_table("naive", dict(rows))
    plain = run(
        query(spark, tmp_path / "events", tm, "plain", r, s),
        tmp_path / "cp-plain",
        after_batch=price_setter(tm, sorted(rows), 0),
    )
    assert plain.results and any(not x.consistent for x in plain.results)

    for strategy in STRATEGIES:
        tm = load_table(strategy, dict(rows))
        row_locks: list[str] = []
        table_locks: list[str] = []
        if strategy == "s2pl":  # count the driver's lock requests (see below)
            protocol = tm.protocol
            read, whole = protocol.before_read, getattr(protocol, "lock_table", None)

            def lock_row(txn: Any, item: str, read: Any = read, out: Any = row_locks) -> None:
                out.append(item)
                read(txn, item)

            def lock_whole(txn: Any, name: str, whole: Any = whole, out: Any = table_locks) -> None:
                out.append(name)
                whole(txn, name)

            monkeypatch.setattr(protocol, "before_read", lock_row)
            if whole is not None:
                monkeypatch.setattr(protocol, "lock_table", lock_whole)
        got = run(
            query(spark, tmp_path / "events", tm, strategy, r, s),
            tmp_path / f"cp-{strategy}",
            after_batch=price_setter(tm, sorted(rows), 0),
        )
        assert all(x.consistent for x in got.results), strategy
        assert [(x.window, x.lwm, round(x.value, 9)) for x in got.results] == want, strategy
        # the read sets stay on the executors unless asked for (read_sets=True)
        assert all(not x.versions for x in got.results)
        if strategy == "s2pl":
            # the driver's work per batch, not per key (issue 31): one shared lock on the
            # joined table per micro-batch, no read lock per key it joins on
            assert row_locks == [] and table_locks == [TABLE] * got.stats.batches


@settings(max_examples=6, derandomize=True, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    r=st.integers(1, 6),
    slide=st.integers(1, 6),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4),
    strategy=st.sampled_from(STRATEGIES),
)
def test_windows_equal_a_brute_force_oracle(
    spark: Any,
    tmp_path_factory: Any,
    seed: int,
    r: int,
    slide: int,
    sizes: list[int],
    strategy: str,
) -> None:
    s = min(slide, r)
    rng = random.Random(seed)
    rows = {k: {"price": rng.randint(1, 80), "cat": 0} for k in range(6)}
    ids = iter(range(100))
    batches = [
        [{"id": next(ids), "part": rng.randrange(7), "qty": 1} for _ in range(n)] for n in sizes
    ]
    folder = tmp_path_factory.mktemp("cq")
    write_batches(folder / "events", batches)
    tm = load_table(strategy, dict(rows))
    update = price_setter(tm, sorted(rows), seed)
    states = []
    check = load_table("snapshot", dict(rows))  # the same updates, to know each batch's state
    check_update = price_setter(check, sorted(rows), seed)
    for b in range(len(batches)):
        states.append({k: v for k, v in check.table(TABLE).rows().items() if k != "__version__"})
        check_update(b)
    got = run(
        query(spark, folder / "events", tm, strategy, r, s), folder / "cp", after_batch=update
    )
    assert [(x.window, x.lwm, round(x.value, 9)) for x in got.results] == brute_force(
        states, batches, r, s
    )
    assert all(x.consistent for x in got.results)


def test_concurrent_updaters_never_mix_versions(spark: Any, tmp_path: Path) -> None:
    """Real updater threads while the query runs: every window consistent.

    At 2,000 updates/s on 200 rows (each row rewritten ten times a second)
    hardly an ``optimistic`` window survives its validation: each commits as a
    read of its batch's pinned snapshot, and every one of them must be consistent.
    """
    rng = random.Random(7)
    rows = {k: new_part(rng) for k in range(200)}
    batches = make_batches(rng, 8, 400, 200)
    write_batches(tmp_path / "events", batches)
    for strategy in STRATEGIES:
        tm = load_table(strategy, dict(rows))
        up = Updaters(tm, TABLE, range(200), 2_000, new_part, seed=1).start()
        try:
            got = run(query(spark, tmp_path / "events", tm, strategy, 5, 2), tmp_path / strategy)
        finally:
            reached = up.stop()
        assert reached > 0 and got.results, strategy
        assert all(x.consistent for x in got.results), strategy
        assert got.stats.windows == len(got.results)
        if strategy == "optimistic":  # validation failed, and cost no redo
            assert got.stats.stale > 0 and got.stats.redos == 0


def test_restart_goes_on_where_it_stopped_exactly_once(spark: Any, tmp_path: Path) -> None:
    rng = random.Random(11)
    rows = {k: {"price": rng.randint(1, 60), "cat": 0} for k in range(10)}
    batches = make_batches(rng, 6, 10, 10)
    r, s = 6, 2
    want = engine_oracle(rows, batches, r, s, seed=3)
    tm = load_table("snapshot", dict(rows))
    update = price_setter(tm, sorted(rows), 3)
    folder, cp, out = tmp_path / "events", tmp_path / "cp", tmp_path / "out"
    write_batches(folder, batches[:3])
    first = run(query(spark, folder, tm, "snapshot", r, s), cp, output=out, after_batch=update)
    assert first.stats.batches == 3
    # a crash after txstream saved batch 2 but before Spark committed it: Spark replays it
    (cp / "spark" / "commits" / "2").unlink()
    write_batches(folder, batches[3:], first=3)
    second = run(query(spark, folder, tm, "snapshot", r, s), cp, output=out, after_batch=update)
    assert 2 in second.stats.skipped
    got = [(x["window"], x["lwm"], round(x["value"], 9)) for x in read_results(out)]
    assert got == want
    assert all(x["consistent"] for x in read_results(out))


KILL_CHILD = """
import os, random, signal, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import test_cq_spark as t
import txstream.jobs.cq as cq_job
from txstream.spark import local_session

folder, cp, out, kill_at = Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5])
real = cq_job._Runner._save

def save(self, batch, carry):
    real(self, batch, carry)
    if batch == kill_at:  # the state is saved, Spark has not committed the batch
        os.killpg(0, signal.SIGKILL)  # this driver and its JVM, at once

cq_job._Runner._save = save
rows, batches = t.kill_case()
tm = t.load_table("snapshot", dict(rows))
query = t.query(local_session("cq-kill"), folder, tm, "snapshot", 6, 2)
handle = query.start(cp, output=out, after_batch=t.price_setter(tm, sorted(rows), 3))
handle.processAllAvailable()
"""


def kill_case() -> tuple[dict[int, Any], list[list[dict[str, int]]]]:
    """The rows and micro-batches of the SIGKILL test (its child process makes them too)."""
    rng = random.Random(13)
    rows = {k: {"price": rng.randint(1, 60), "cat": 0} for k in range(10)}
    return rows, make_batches(rng, 5, 10, 10)


def test_a_driver_killed_after_saving_a_batch_loses_no_result(spark: Any, tmp_path: Path) -> None:
    """The driver is SIGKILLed (with its JVM) right after txstream saved batch 2's state,
    before Spark committed it: restarted, Spark replays batch 2, which is skipped, and the
    output holds every window once, equal to the uninterrupted CQEngine.  (The results
    used to be written after the state: batch 2's were lost.)"""
    import subprocess
    import sys

    rows, batches = kill_case()
    folder, cp, out = tmp_path / "events", tmp_path / "cp", tmp_path / "out"
    write_batches(folder, batches)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            KILL_CHILD,
            str(Path(__file__).parent),
            *map(str, (folder, cp, out)),
            "2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,  # its own process group: the kill takes its JVM along
    )
    assert child.returncode == -9, child.stderr[-3000:]
    assert (cp / "txstream-cq" / "state-2.json").exists()
    assert not (cp / "spark" / "commits" / "2").exists()
    tm = load_table("snapshot", dict(rows))  # the tables as the killed driver left them
    update = price_setter(tm, sorted(rows), 3)
    for b in range(3):
        update(b)
    again = run(query(spark, folder, tm, "snapshot", 6, 2), cp, output=out, after_batch=update)
    assert again.stats.skipped == [2]
    got = [(x["window"], x["lwm"], round(x["value"], 9)) for x in read_results(out)]
    assert got == engine_oracle(rows, batches, 6, 2, seed=3)
    assert all(x["consistent"] for x in read_results(out))


def test_the_pinned_relation_follows_the_tables_changes_without_walking_it(spark: Any) -> None:
    """No Spark job (the session parses the schema): the driver's copy of a table
    (``_Versions``) is built once, then only the keys committed since are recomputed.
    Pinned at a snapshot older than a commit, a changed row is its version at the
    snapshot, says until when that was current and is recomputed at the next pin; a
    deleted key is an absent row with its deletion's timestamp; a counter row is left
    out; the windows that read a changed key are found in Arrow (``touched``)."""
    from types import SimpleNamespace

    import pyarrow as pa
    from pyspark.sql.types import LongType, StructField, StructType

    import txstream.jobs.cq as cq_job
    from txstream.spark.reference import NEVER, Join, touched

    tm = load_table("snapshot", {k: {"price": 10 + k, "cat": 0} for k in range(5)})
    tbl = tm.table(TABLE)
    stream = SimpleNamespace(
        columns=["id", "part"],
        schema=StructType([StructField("id", LongType()), StructField("part", LongType())]),
    )
    join = Join(TABLE, "part", "price long", ("price",))
    runner = SimpleNamespace(tm=tm, joins=[join], tables=[tbl], cq=SimpleNamespace(_stream=stream))
    v = cq_job._Versions(runner, 0)  # type: ignore[arg-type]
    built = tbl.chain_steps

    def rows() -> dict[int, tuple[int, int, int | None, bool]]:
        got = v.rel.to_pylist()
        return {r["__k"]: (r["__v"], r["__until"], r["price"], r["__p"]) for r in got}

    start = tm.clock
    assert rows() == {k: (start, NEVER, 10 + k, True) for k in range(5)}  # no counter row
    snap = tm.begin_snapshot()
    with tm.begin() as t:
        t.put(TABLE, 1, {"price": 99, "cat": 0})
        t.delete(TABLE, 2)
    changed = tm.clock
    with tm.commit_mutex:
        assert v.drain() == {1: changed, 2: changed}
        v.update(snap.snapshot_ts)  # the rows as of the snapshot, before that commit
    assert rows()[1] == (start, changed - 1, 11, True)
    assert rows()[2] == (start, changed - 1, 12, True)
    assert set(v.pending) == {1, 2}
    snap.commit()
    with tm.commit_mutex:
        assert v.drain() == {}
        v.update(tm.clock)
    assert rows() == {
        0: (start, NEVER, 10, True),
        1: (changed, NEVER, 99, True),
        2: (changed, NEVER, None, False),  # deleted: absent, with its deletion's timestamp
        3: (start, NEVER, 13, True),
        4: (start, NEVER, 14, True),
    }
    assert not v.pending and tbl.chain_steps - built < 20
    v.close()
    with tm.begin() as t:
        t.put(TABLE, 3, {"price": 1, "cat": 0})
    assert v.drain() == {}  # closed: no longer watching
    # windows (rows) 0 and 2 read key 1, row 1 read keys 3 and 4
    keys = pa.array([[0, 1], [3, 4], [1, 2, 1]], type=pa.list_(pa.int64()))
    assert touched(keys, {1: 7, 4: 9, 8: 1}) == {0: 7, 1: 9, 2: 7}
    assert touched(keys, {}) == {} and touched(keys, {"x": 3}) == {}


def test_the_decision_by_column_gives_each_window_its_state() -> None:
    """No Spark: the driver's decision over the executors' columns (``_Runner._results``)
    cuts ``hi`` at the clock and at the first commit since the pin of a key the window
    read, a snapshot's at its instant; the windows, counted consistent by column, become
    the same ``Result`` objects when made."""
    from types import SimpleNamespace

    from txstream.jobs.cq import _Runner
    from txstream.spark.reference import NEVER, Evaluated

    out = Evaluated(
        columns={
            "window": [0, 1, 2, 3],
            "value": [1.5, 2.0, None, 4.0],
            "lwm": [10, 12, 14, 16],
            "lo": [3, 5, 9, 2],
            "hi": [NEVER, 8, NEVER, NEVER],
            "at": [1, 2, 3, 4],
        }
    )
    runner = SimpleNamespace(read_sets=False)
    # window 0 read a key committed at 7 since the pin; window 2 one committed at 9
    got = _Runner._results(runner, out, None, 2, 100, 20, {1: 7, 3: 9})  # type: ignore[arg-type]
    assert got.his == [6, 8, 8, 20] and got.numbers == [100, 101, 102, 103]
    assert got.consistent() == 3  # window 2: lo 9 > hi 8
    made = got.made()
    assert [(x.window, x.value, x.lwm, x.attempts, x.state) for x in made] == [
        (100, 1.5, 10, 2, (3, 6)),
        (101, 2.0, 12, 2, (5, 8)),
        (102, None, 14, 2, (9, 8)),
        (103, 4.0, 16, 2, (2, 20)),
    ]
    assert [x.consistent for x in made] == [True, True, False, True]
    assert made[0].row == {"window": 100, "value": 1.5} and made[0].versions == frozenset()
    assert len(got) == 4 and got.consistent() == 3
    snap = SimpleNamespace(snapshot_ts=4)
    under = _Runner._results(runner, out, snap, 1, 0, 20, {1: 7})  # type: ignore[arg-type]
    assert under.his == [4, 4, 4, 4] and under.consistent() == 2


def test_bad_queries_fail_in_one_line(spark: Any) -> None:
    df = spark.createDataFrame([(1, 2, 3)], EVENT_SCHEMA)
    tm = load_table("snapshot", {1: {"price": 1, "cat": 0}})
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: SparkCQ("q", tm, "bogus"), "unknown strategy 'bogus'"),
        (lambda: SparkCQ("q", tm, "s2pl"), "needs a transaction manager with protocol"),
        (lambda: SparkCQ("q", tm).stream(df, order="ts"), "order column 'ts'"),
        (lambda: SparkCQ("q", tm).stream(df, "id").join("nope", "part", "price long"), "'nope'"),
        (lambda: SparkCQ("q", tm).stream(df, "id").join(TABLE, "pt", "price long"), "'pt'"),
        (lambda: SparkCQ("q", tm).stream(df, "id").join(TABLE, "part", "qty long"), "'qty'"),
        (
            lambda: (
                SparkCQ("q", tm)
                .stream(df, "id")
                .join(TABLE, "part", "price long")
                .window("avg", "price", r=2, s=3)
            ),
            "1 <= slide <= range",
        ),
        (
            lambda: (
                SparkCQ("q", tm)
                .stream(df, "id")
                .join(TABLE, "part", "price long")
                .window("median", "price", r=2)
            ),
            "unknown aggregate 'median'",
        ),
        (lambda: SparkCQ("q", tm).stream(df, "id").start("/nonexistent/cp"), "needs .stream"),
        (
            lambda: SparkCQ("q", tm).stream(df.selectExpr("cast(id as string) id", "part"), "id"),
            "order column 'id' is string, which does not sort in arrival order",
        ),
        (  # a batch DataFrame: Spark's AnalysisException only once the query started
            lambda: (
                SparkCQ("q", tm)
                .stream(df, "id")
                .join(TABLE, "part", "price long")
                .window("avg", "price", r=2)
                .start("/nonexistent/cp")
            ),
            "SparkCQ reads a streaming DataFrame",
        ),
    ]
    for make, message in cases:
        with pytest.raises(CQError) as err:
            make()
        assert message in str(err.value) and "\n" not in str(err.value)
    assert set(MODES) == {"plain", *STRATEGIES}


def test_a_bad_selection_or_window_column_fails_in_one_line_before_spark_runs(
    spark: Any, tmp_path: Path
) -> None:
    # before: the stream started and the first micro-batch failed with "An exception
    # was raised by the Python Proxy. Return Message: Traceback (most recent call last):"
    (tmp_path / "in").mkdir()
    df = spark.readStream.schema(EVENT_SCHEMA).csv(str(tmp_path / "in"))
    tm = load_table("snapshot", {1: {"price": 1, "cat": 0}})

    def q(where: str | None, schema: str = "price long") -> SparkCQ:
        cq = SparkCQ("q", tm).stream(df, "id").join(TABLE, "part", schema)
        return (cq.where(where) if where else cq).window("avg", "price", r=2)

    cases = [
        (lambda: q("nope <= 50"), "where 'nope <= 50': [UNRESOLVED_COLUMN"),
        (lambda: q("price <="), "where 'price <=': [PARSE_SYNTAX_ERROR]"),
        (lambda: q(None, "price string"), "window column 'price' is string, not a number"),
    ]
    for make, message in cases:
        with pytest.raises(CQError) as err:
            make().start(tmp_path / "ckpt")
        assert message in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(TxStreamError, match="not a schema: 'price lng'") as bad:
        SparkCQ("q", tm).stream(df, "id").join(TABLE, "part", "price lng")
    assert "\n" not in str(bad.value)  # before: Spark's multi-line ParseException


def test_a_file_checkpoint_or_rows_without_the_schemas_columns_fail_before_spark_runs(
    spark: Any, tmp_path: Path
) -> None:
    (tmp_path / "in").mkdir()
    stream = spark.readStream.schema(EVENT_SCHEMA).csv(str(tmp_path / "in"))
    tm = load_table("snapshot", {1: {"price": 1, "cat": 0}, 2: {"cost": 3}})

    def q(schema: str) -> SparkCQ:
        cq = SparkCQ("q", tm).stream(stream, "id").join(TABLE, "part", schema)
        return cq.window("avg", "price", r=2)

    (tmp_path / "file").write_text("")
    with pytest.raises(TxStreamError, match=r"checkpoint .*file is a file; give a directory"):
        q("price long").start(tmp_path / "file")  # before: a raw NotADirectoryError
    # before: row 2 joined with price null in every window, silently
    with pytest.raises(CQError, match="table 'parts': row 2 has no column 'price'"):
        q("price long").start(tmp_path / "ckpt")


def test_plain_baseline_reports_mixed_versions_per_row(spark: Any, tmp_path: Path) -> None:
    """The judgement is per row: an update of a row no window read leaves plain consistent."""
    rng = random.Random(2)
    rows = {k: {"price": rng.randint(1, 40), "cat": 0} for k in range(12)}
    batches = make_batches(rng, 4, 10, 6)  # only parts 0-5 are ever read

    def others(tm: Any) -> Callable[[int], None]:
        def update(batch_id: int) -> None:
            with tm.begin() as t:
                for k in range(6, 12):
                    t.put(TABLE, k, {"price": batch_id, "cat": 0})

        return update

    write_batches(tmp_path / "events", batches)
    tm = load_table("naive", dict(rows))
    got = run(
        query(spark, tmp_path / "events", tm, "plain", 7, 3),
        tmp_path / "cp",
        after_batch=others(tm),
    )
    assert got.results and all(x.consistent for x in got.results)


@pytest.mark.parametrize("strategy", MODES)
def test_the_executors_judge_each_window_as_its_read_set_does(
    spark: Any, tmp_path: Path, monkeypatch: Any, strategy: str
) -> None:
    """Each window's state (lo, hi) comes from the executors and the changes matched in
    Arrow, not from its reads on the driver; judged here from outside, from its read set
    (``read_sets=True``) and the record of every commit: lo is the newest version it read,
    hi the instant before the first commit after a version it read (at most the clock at
    its decision; its snapshot's instant under ``snapshot``).  Rows change between
    batches (one deleted and re-inserted) and while a batch is on the executors, after
    its pin (not under ``s2pl``, whose read locks would make this thread wait for itself)."""
    import txstream.jobs.cq as cq_job

    rng = random.Random(9)
    keys = list(range(10))
    rows = {k: {"price": rng.randint(1, 60), "cat": 0} for k in keys}
    batches = make_batches(rng, 4, 40, 12)  # parts 10 and 11 have no row: absent reads
    write_batches(tmp_path / "events", batches)
    tm = load_table("naive" if strategy == "plain" else strategy, dict(rows))
    commits: dict[int, list[int]] = {k: [] for k in keys}

    def commit(puts: list[int], delete: int | None = None) -> None:
        with tm.begin() as t:
            for k in puts:
                t.put(TABLE, k, {"price": rng.randint(1, 60), "cat": 0})
            if delete is not None:
                t.delete(TABLE, delete)
        for k in [*puts, *([delete] if delete is not None else [])]:
            commits[k].append(tm.clock)  # no other committer: the clock is its timestamp

    real_evaluate, real_results = cq_job.evaluate, cq_job._Runner._results
    calls: list[int] = []

    def evaluate(*args: Any, **kw: Any) -> Any:
        out = real_evaluate(*args, **kw)
        calls.append(1)
        if strategy != "s2pl" and len(calls) % 2:  # every other attempt: a redo can commit
            commit([keys[len(calls) % len(keys)], keys[(3 * len(calls)) % len(keys)]])
        return out

    decided: dict[int, tuple[int, int | None]] = {}

    def results(self: Any, out: Any, txn: Any, *rest: Any) -> Any:
        got = real_results(self, out, txn, *rest)  # the windows by column
        now = rest[2]
        for window in got.numbers:
            decided[window] = (now, txn.snapshot_ts if txn is not None else None)
        return got

    monkeypatch.setattr(cq_job, "evaluate", evaluate)
    monkeypatch.setattr(cq_job._Runner, "_results", results)

    def between(batch_id: int) -> None:
        commit(keys[batch_id % 2 :: 2], delete=keys[0] if batch_id % 2 else None)

    got = run(
        query(spark, tmp_path / "events", tm, strategy, 6, 2),
        tmp_path / "cp",
        after_batch=between,
        read_sets=True,
    )
    assert len(got.results) > 20 and len(calls) >= 4
    for x in got.results:
        now, snap = decided[x.window]
        lo = max((version for _, _, version in x.versions), default=0)
        hi = now if snap is None else snap
        if snap is None:
            for _, key, version in x.versions:
                later = [ts for ts in commits.get(key, []) if ts > version]
                if later:
                    hi = min(hi, later[0] - 1)
        assert x.state == (lo, hi), (strategy, x.window, x.versions)
    if strategy == "plain":
        assert any(not x.consistent for x in got.results)
    else:
        assert all(x.consistent for x in got.results)


def test_optimistic_whose_every_read_goes_stale_commits_every_window_on_its_pin(
    spark: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """Every row rewritten after each evaluation, before the validation: no window of
    any attempt is still current at its commit.  Each commits at the first attempt as
    a read of its batch's pinned snapshot (it used to redo the batch ESCALATE_AFTER
    times, then run it on a snapshot); each window is judged against the record of
    every committed version: its state is the span in which all it read was current,
    and its value comes from those versions."""
    import txstream.jobs.cq as cq_job

    rng = random.Random(5)
    keys = range(20)
    rows = {k: {"price": rng.randint(1, 50), "cat": 0} for k in keys}  # all selected
    batches = make_batches(rng, 2, 200, 20)
    write_batches(tmp_path / "events", batches)
    tm = load_table("optimistic", dict(rows))
    tbl = tm.table(TABLE)
    history = {k: [tbl.latest(k)] for k in keys}
    real = cq_job.evaluate

    def evaluate(*args: Any, **kw: Any) -> Any:
        out = real(*args, **kw)
        with tm.begin() as t:  # another system rewrites every row: every read is stale
            for k in keys:
                t.put(TABLE, k, {"price": rng.randint(1, 50), "cat": 0})
        for k in keys:
            history[k].append(tbl.latest(k))
        return out

    monkeypatch.setattr(cq_job, "evaluate", evaluate)
    got = run(
        query(spark, tmp_path / "events", tm, "optimistic", 5, 2), tmp_path / "cp", read_sets=True
    )
    events = [e for batch in batches for e in batch]
    assert [x.window for x in got.results] == list(range((len(events) - 5) // 2 + 1))
    assert all(x.attempts == 1 for x in got.results)
    assert got.stats.redos == 0 and got.stats.escalations == 0
    assert got.stats.stale == len(got.results)  # none was current at its commit
    pins = set()
    for x in got.results:  # one instant had all its versions current; its value from them
        seen = {key: version for _, key, version in x.versions}
        lo, hi, prices = 0, 1 << 62, []
        for key, version in seen.items():
            chain = [ts for ts, _ in history[key]]
            i = chain.index(version)
            lo = max(lo, version)
            hi = min(hi, chain[i + 1] - 1 if i + 1 < len(chain) else 1 << 62)
        assert x.state == (lo, hi) and lo <= hi and x.consistent
        pins.add(hi)
        for e in events[x.lwm : x.lwm + 5]:
            version = seen[e["part"]]
            prices.append(dict(history[e["part"]])[version]["price"])
        assert x.value == pytest.approx(sum(prices) / 5)
    assert len(pins) == 2  # one pinned snapshot per batch, each cut at that batch's rewrite


def test_bench_point_measures_a_mode_against_the_same_input(spark: Any, tmp_path: Path) -> None:
    from txstream.bench.cq_spark import measure, summarize

    rows = []
    for mode in ("plain", "snapshot"):
        point = {"mode": mode, "update_rate": 50.0, "window_range": 5, "events": 4_000}
        got = measure({**point, "batch": 1_000, "seconds": 60.0, "_out": str(tmp_path)}, 0)
        assert got["finished"] and got["error"] == "" and got["batches"] == 4
        assert got["results"] > 500 and got["results_per_s"] > 0
        rows.append({**point, **got})
    assert rows[1]["consistent_ratio"] == 1.0
    assert "| 5 | 50 |" in summarize(rows)


def test_two_tables_joined_in_a_chain(spark: Any, tmp_path: Path) -> None:
    """events -> parts (on part) -> cats (on the part's cat): both tables change between
    batches; every strategy equals CQEngine on the same tree, plain mixes versions."""
    from txstream.cq import RefJoin, Select, Source, WindowAgg, make_manager
    from txstream.spark.sources import csv_files

    rng = random.Random(9)
    parts = {k: {"price": rng.randint(1, 60), "cat": k % 3} for k in range(8)}
    cats = {c: {"discount": c * 5} for c in range(2)}  # cat 2 has no row: absent reads
    batches = make_batches(rng, 5, 12, 9)
    write_batches(tmp_path / "events", batches)

    def load(strategy: str) -> Any:
        tm = make_manager(strategy)
        tm.table("parts"), tm.table("cats")
        with tm.begin() as t:
            for k, row in parts.items():
                t.put("parts", k, row)
            for c, row in cats.items():
                t.put("cats", c, row)
        return tm

    def change(tm: Any) -> Callable[[int], None]:
        def update(batch_id: int) -> None:
            with tm.begin() as t:
                for k in parts:
                    t.put("parts", k, {"price": 1 + (k * 11 + batch_id * 7) % 60, "cat": k % 3})
                t.put("cats", 1, {"discount": 5 + batch_id * 9})

        return update

    src = Source("events", ("id", "part", "qty"))
    tree = WindowAgg(
        "w",
        Select(
            "cheap",
            RefJoin("c", RefJoin("p", src, "parts", "part"), "cats", "cat"),
            lambda v: v["price"] - v["discount"] <= 40,
        ),
        "sum",
        "price",
        r=4,
        s=2,
    )
    oracle_tm = load("snapshot")
    engine = CQEngine(
        tree, oracle_tm, "snapshot", {"parts": ("price", "cat"), "cats": ("discount",)}
    )
    want = []
    for b, events in enumerate(batches):
        want += [(x.window, x.lwm, round(x.value, 9)) for x in engine.feed(events)]
        change(oracle_tm)(b)
    assert len(want) > 5

    for strategy in MODES:
        tm = load("naive" if strategy == "plain" else strategy)
        q = (
            SparkCQ("chain", tm, strategy)
            .stream(
                csv_files(spark, tmp_path / "events", EVENT_SCHEMA, max_files_per_trigger=1), "id"
            )
            .join("parts", on="part", schema="price long, cat long")
            .join("cats", on="cat", schema="discount long")
            .where("price - discount <= 40")
            .window("sum", "price", r=4, s=2)
        )
        got = run(q, tmp_path / f"cp-{strategy}", after_batch=change(tm), read_sets=True)
        if strategy == "plain":
            assert any(not x.consistent for x in got.results)
            continue
        assert [(x.window, x.lwm, round(x.value, 9)) for x in got.results] == want, strategy
        assert all(x.consistent for x in got.results), strategy
        assert {t for x in got.results for t in x.tables()} == {"parts", "cats"}


# -- time-based windows ---------------------------------------------------------------------

TIMED_SCHEMA = "id LONG, part LONG, qty LONG, ts LONG"


def timed_batches(
    rng: random.Random, sizes: list[int], parts: int, steps: tuple[float, ...] = (0, 1, 1, 2)
) -> list[list[dict[str, Any]]]:
    """Events with a non-decreasing time ``ts`` (ties, steps and gaps drawn from ``steps``)."""
    ids, t = iter(range(sum(sizes))), 3 * steps[-1]
    out = []
    for n in sizes:
        batch = []
        for _ in range(n):
            t += rng.choice(steps)
            batch.append({"id": next(ids), "part": rng.randrange(parts), "qty": 1, "ts": t})
        out.append(batch)
    return out


def write_timed(folder: Path, batches: list[list[dict[str, Any]]]) -> None:
    folder.mkdir(exist_ok=True)
    for f, events in enumerate(batches):
        path = folder / f"e{f:04d}.csv"
        path.write_text("".join(f"{e['id']},{e['part']},{e['qty']},{e['ts']}\n" for e in events))
        os.utime(path, (1_000_000 + f, 1_000_000 + f))


def timed_query(
    spark: Any, folder: Path, tm: Any, strategy: str, agg: str, r: int, s: int, schema: str
) -> SparkCQ:
    return query(spark, folder, tm, strategy, r, s, agg=agg, time="ts", schema=schema)


def timed_oracle(
    rows: dict[int, Any], batches: list[list[dict[str, Any]]], agg: str, r: int, s: int, seed: int
) -> list[tuple[int, int, float | None]]:
    """CQEngine with a time-based WindowAgg, fed the same micro-batches and updates."""
    from txstream.cq import RefJoin, Select, Source, WindowAgg

    src = Source("events", ("id", "part", "qty", "ts"))
    cheap = Select("cheap", RefJoin("j", src, TABLE, "part"), lambda v: v["price"] <= 50)
    tree = WindowAgg("w", cheap, agg, "price", r, s, time_column="ts")
    tm = load_table("snapshot", dict(rows))
    engine = CQEngine(tree, tm, "snapshot", {TABLE: COLUMNS})
    update = price_setter(tm, sorted(rows), seed)
    out = []
    for b, events in enumerate(batches):
        out += [(x.window, x.lwm, _rounded(x.value)) for x in engine.feed(events)]
        update(b)
    return out


def _rounded(value: Any) -> float | None:
    return None if value is None else round(value, 9)


def _timed(results: list[Any]) -> list[tuple[int, int, float | None]]:
    return [(x.window, x.lwm, _rounded(x.value)) for x in results]


def test_time_windows_spanning_micro_batches(spark: Any, tmp_path: Path) -> None:
    """Time windows over several micro-batches, the table rewritten between them: every
    strategy equals CQEngine's time-based WindowAgg, plain mixes versions."""
    rng = random.Random(21)
    rows = {k: {"price": rng.randint(1, 60), "cat": 0} for k in range(10)}
    batches = timed_batches(rng, [9, 7, 10, 8, 9], 12)  # parts 10, 11: absent reads
    write_timed(tmp_path / "events", batches)
    r, s = 6, 2
    want = timed_oracle(rows, batches, "avg", r, s, seed=1)
    assert len(want) > 5

    for strategy in MODES:
        tm = load_table("naive" if strategy == "plain" else strategy, dict(rows))
        got = run(
            timed_query(spark, tmp_path / "events", tm, strategy, "avg", r, s, TIMED_SCHEMA),
            tmp_path / f"cp-{strategy}",
            after_batch=price_setter(tm, sorted(rows), 1),
            read_sets=True,
        )
        if strategy == "plain":
            assert any(not x.consistent for x in got.results)
            continue
        assert _timed(got.results) == want, strategy
        assert all(x.consistent for x in got.results), strategy
        # every result names the rows it read, per (table, key), one version each
        assert all(len(v) == 1 for x in got.results for v in x.rows().values())


def test_time_windows_over_gaps_are_emitted_empty(spark: Any, tmp_path: Path) -> None:
    """Gaps in time (inside a batch and between batches) give empty windows, as CQEngine's."""
    rng = random.Random(8)
    rows = {k: {"price": rng.randint(1, 60), "cat": 0} for k in range(6)}
    batches = timed_batches(rng, [6, 5, 6, 4], 7, steps=(0, 0.5, 1.5, 11.5))
    write_timed(tmp_path / "events", batches)
    schema = TIMED_SCHEMA.replace("ts LONG", "ts DOUBLE")
    for strategy, agg in (("snapshot", "avg"), ("optimistic", "count")):
        r, s = 4, 3
        want = timed_oracle(rows, batches, agg, r, s, seed=2)
        empty = 0.0 if agg == "count" else None
        assert any(v == empty for _, _, v in want), agg
        tm = load_table(strategy, dict(rows))
        got = run(
            timed_query(spark, tmp_path / "events", tm, strategy, agg, r, s, schema),
            tmp_path / f"cp-{strategy}",
            after_batch=price_setter(tm, sorted(rows), 2),
        )
        assert _timed(got.results) == want, strategy
        assert all(x.consistent for x in got.results), strategy


def test_time_windows_restart_exactly_once(spark: Any, tmp_path: Path) -> None:
    rng = random.Random(13)
    rows = {k: {"price": rng.randint(1, 60), "cat": 0} for k in range(8)}
    batches = timed_batches(rng, [8, 8, 8, 8, 8], 8)
    r, s = 5, 2
    want = timed_oracle(rows, batches, "sum", r, s, seed=4)
    tm = load_table("snapshot", dict(rows))
    update = price_setter(tm, sorted(rows), 4)
    folder, cp, out = tmp_path / "events", tmp_path / "cp", tmp_path / "out"
    write_timed(folder, batches[:3])

    def q() -> SparkCQ:
        return timed_query(spark, folder, tm, "snapshot", "sum", r, s, TIMED_SCHEMA)

    first = run(q(), cp, output=out, after_batch=update)
    assert first.stats.batches == 3
    (cp / "spark" / "commits" / "2").unlink()  # txstream saved batch 2, Spark did not
    write_timed(folder, batches)
    second = run(q(), cp, output=out, after_batch=update)
    assert 2 in second.stats.skipped
    got = [(x["window"], x["lwm"], _rounded(x["value"])) for x in read_results(out)]
    assert got == want
    assert all(x["consistent"] for x in read_results(out))


def test_bad_time_windows_fail_in_one_line(spark: Any) -> None:
    df = spark.createDataFrame([(1, 2, 3, "x")], "id LONG, part LONG, qty LONG, s STRING")
    tm = load_table("snapshot", {1: {"price": 1, "cat": 0}})

    def window(**kw: Any) -> Any:
        q = SparkCQ("q", tm).stream(df, "id").join(TABLE, "part", "price long")
        return q.window("avg", "price", **kw)

    for kw, message in (
        ({"r": 5, "time": "ts"}, "time column 'ts' is not a column of the stream"),
        ({"r": 5, "time": "price"}, "time column 'price' is not a column of the stream"),
        ({"r": 5, "time": "s"}, "time column 's' is string, not a number"),
        ({"r": 5, "s": 6, "time": "qty"}, "0 < slide <= range"),
        ({"r": 0, "time": "qty"}, "0 < slide <= range"),
    ):
        with pytest.raises(CQError) as err:
            window(**kw)
        assert message in str(err.value) and "\n" not in str(err.value), kw


def test_an_attempt_that_keeps_failing_transiently_escalates_to_a_snapshot(
    spark: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """Every optimistic attempt fails with a TransientError until ESCALATE_AFTER of them
    have: the next attempt of the batch pins a snapshot and commits every window; the
    next batch tries its strategy again (and fails the same way)."""
    import txstream.jobs.cq as cq_job
    from txstream.errors import TransientError

    rng = random.Random(6)
    rows = {k: {"price": rng.randint(1, 50), "cat": 0} for k in range(20)}
    batches = make_batches(rng, 2, 200, 20)
    write_batches(tmp_path / "events", batches)
    tm = load_table("optimistic", dict(rows))
    real = cq_job.evaluate
    failing: list[int] = []

    def evaluate(*args: Any, **kw: Any) -> Any:
        out = real(*args, **kw)
        if len(failing) % (cq_job.ESCALATE_AFTER + 1) < cq_job.ESCALATE_AFTER:
            failing.append(1)
            raise TransientError("as a deadlock victim would")
        failing.append(0)
        return out

    monkeypatch.setattr(cq_job, "evaluate", evaluate)
    got = run(query(spark, tmp_path / "events", tm, "optimistic", 5, 2), tmp_path / "cp")
    events = [e for batch in batches for e in batch]
    assert [x.window for x in got.results] == list(range((len(events) - 5) // 2 + 1))
    assert all(x.attempts == cq_job.ESCALATE_AFTER + 1 for x in got.results)
    assert got.stats.escalations == 2  # one per batch
    assert got.stats.redos == 2 * cq_job.ESCALATE_AFTER
    assert all(x.consistent for x in got.results)


def test_optimistic_time_windows_that_read_a_changed_row_commit_on_the_pin(
    spark: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """A row changes while a micro-batch's windows are evaluated: every window of the
    batch commits in that attempt, numbered from t0 as before, each value the windows'
    definition under the state the batch pinned; those that read the row say they
    were current until just before the change, the others until the decision."""
    import txstream.jobs.cq as cq_job

    rng = random.Random(17)
    rows = {k: {"price": rng.randint(1, 60), "cat": 0} for k in range(6)}
    batches = timed_batches(rng, [6, 14, 6], 6)
    write_timed(tmp_path / "events", batches)
    r, s = 3, 1
    want = timed_oracle(rows, batches, "avg", r, s, seed=5)
    tm = load_table("optimistic", dict(rows))
    check = load_table("snapshot", dict(rows))  # the same updates: each batch's state
    states, check_update = [], price_setter(check, sorted(rows), 5)
    for b in range(len(batches)):
        states.append({k: v for k, v in check.table(TABLE).rows().items() if k != "__version__"})
        check_update(b)
    changed: dict[str, Any] = {}
    done: list[int] = []  # results emitted by the end of each batch
    got_results: list[Any] = []
    real = cq_job.evaluate

    def evaluate(*args: Any, **kw: Any) -> Any:
        out = real(*args, **kw)
        if not changed and len(out.windows) >= 3:  # change a row the first window did not read
            read_first = {key for key, _, _ in out.windows[0]["reads"][0]}
            later = [key for w in out.windows[1:] for key, _, _ in w["reads"][0]]
            key = next((k for k in later if k not in read_first and k in rows), None)
            if key is not None:
                with tm.begin() as t:
                    t.put(TABLE, key, {"price": 7, "cat": 0})
                changed.update(key=key, first=kw["first"], batch=len(done), ts=tm.clock)
        return out

    monkeypatch.setattr(cq_job, "evaluate", evaluate)
    update = price_setter(tm, sorted(rows), 5)
    got = run(
        timed_query(spark, tmp_path / "events", tm, "optimistic", "avg", r, s, TIMED_SCHEMA),
        tmp_path / "cp",
        after_batch=lambda b: (done.append(len(got_results)), update(b)),
        on_result=lambda x: got_results.append(x),
        read_sets=True,
    )
    assert changed and got.stats.redos == 0 and got.stats.stale >= 1
    assert all(x.consistent and x.attempts == 1 for x in got.results)
    assert [(w, lwm) for w, lwm, _ in _timed(got.results)] == [(w, lwm) for w, lwm, _ in want]
    # the value of each window under the state its batch pinned
    events = [e for batch in batches for e in batch]
    t0, key = events[0]["ts"], changed["key"]
    stale = 0
    for x in got.results:
        b = next(i for i, n in enumerate(done) if x.window < n)
        span = [e for e in events if t0 + x.window * s <= e["ts"] < t0 + x.window * s + r]
        prices = [states[b][e["part"]]["price"] for e in span if e["part"] in states[b]]
        prices = [p for p in prices if p <= 50]
        assert _rounded(x.value) == (_rounded(sum(prices) / len(prices)) if prices else None)
        if b == changed["batch"] and any(e["part"] == key for e in span):
            assert x.state[1] == changed["ts"] - 1  # current until just before the change
            stale += 1
        elif b == changed["batch"]:
            assert x.state[1] >= changed["ts"]
    assert stale == got.stats.stale
