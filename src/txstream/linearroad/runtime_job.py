"""Linear Road as a ``tx.Job``: the main job on the partitioned executor runtime.

:func:`linear_road_job` declares the job - Figure 3's stores as tables
partitioned by ``(xway, dir)``, one input of raw lines placed by the
report's ``(xway, dir)`` (account-balance queries reach every partition), the
input line number as the declared order, and the transaction function of
:mod:`txstream.linearroad.txns`, which parses each line.  The same job runs on Spark
(:func:`txstream.linearroad.spark_job.run_runtime`) and in this process
(:func:`run_local`, the tests' and benchmarks' reference without a JVM).

Answers leave through :class:`AnswersFile`, a sink that appends each committed
batch's answers to ``answers.txt`` exactly once per batch id (the file is cut
back to the length recorded with the previous batch before a batch is written
again after a crash), stamping each answer's ``Emit`` with its commit time.

The not-serializable variant is two such jobs over the same input, with no
order in common (:func:`path_jobs`): the minute path (statistics, stopped
cars, each minute's accidents and tolls, published through
:class:`~txstream.linearroad.tollstore.TollsPublisher` when its batches commit)
and the notification path (segment entries, charges, alerts, queries, which
reads the published tolls as they are when a notification runs).  On Spark
they are two streaming queries running side by side; in this process they
take turns batch by batch (:func:`run_local`, ``first``).

The ``adhoc`` variant (Botan et al.'s ADHOC SERIALIZABLE) is the same two jobs
with the synchronization built into the TOLLS store: the notification path's
input waits at a :class:`~txstream.linearroad.tollstore.Gate` until the minute
path has published the minute of every report in it, and a notification reads
its own minute's rows.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from txstream.errors import TxStreamError
from txstream.linearroad.engine import TXN_SIZES, Latency
from txstream.linearroad.formats import open_text
from txstream.linearroad.replay import duplicate_entries, numbered_lines
from txstream.linearroad.tollstore import Gate, TollsPublisher
from txstream.linearroad.txns import PARTITION_BY, PATHS, TABLES, LinearRoadTxns, combine_balance
from txstream.spark.runtime import Job, read_output
from txstream.spark.runtime.state import RuntimeStore

VARIANTS: dict[str, str] = {
    "serializable": "one job: every path of a partition in one serial order",
    "not-serializable": "two jobs, the minute path and the notification path, with no "
    "common order: a notification reads whatever the TOLLS store holds",
    "adhoc": "the same two jobs synchronized by the TOLLS store (the paper's ADHOC "
    "SERIALIZABLE): a notification waits until its minute's tolls are published",
}
"""The runtime's variants by name (the driver engine runs the first two)."""


def check_variant(name: str) -> str:
    """Return ``name`` if it names a variant of the runtime, else :class:`UnknownNameError`."""
    if name not in VARIANTS:
        from txstream.errors import UnknownNameError

        raise UnknownNameError("variant", name, list(VARIANTS))
    return name


def linear_road_job(
    txns: LinearRoadTxns,
    txn_size: str = "event",
    source: Any = None,
    record: bool = False,
) -> Job:
    """The Linear Road job; ``source`` is the streaming DataFrame of :func:`lines_source`.

    One input, ``lines``, in the declared order of the input line number
    ``seq``: each row is a raw input line with the fields that place it
    (:data:`PLACEMENT`): ``(xk, dk)``, the report's ``(xway, dir)``, and
    ``everywhere``, true for an account-balance query, which reaches every
    partition (a fragment per partition).  The transaction function parses the
    line (:meth:`LinearRoadTxns.line`); Spark only reads the few fields that
    place it, so a line crosses the shuffle as its text, not as 15 columns.

    ``txn_size``: ``event`` (one transaction per report, Section 5.3) or ``1s``,
    ``2s``, ``3s`` (a partition's consecutive events of the same period of
    input time in one transaction).
    """
    if txn_size not in TXN_SIZES:
        raise TxStreamError(f"unknown transaction size {txn_size!r}; one of {list(TXN_SIZES)}")
    job = Job("linear_road" if txns.path == "all" else f"linear_road_{txns.path}")
    for name in PATHS[txns.path]:
        job.table(name, key=TABLES[name], partition_by=PARTITION_BY)
    job.input("lines", source, keys=[("xk", "dk")], order="seq", broadcast="everywhere")
    outputs = ("tolls",) if txns.path == "minute" else ("answers", "rejected", "duplicates")
    for name in outputs:
        job.output(name)
    job.on("lines", txns.line)
    period = TXN_SIZES[txn_size]
    if period:
        job.boundary("by", group=_Period(period))
    job.option("arrivalTime", "handoff")
    job.option("recordHistory", record)
    return job


MINUTE_CKPT = "ckpt-minute"
"""The minute path's checkpoint folder beside ``ckpt`` (the notification path's)."""
TOLLS_STORE = "tolls-store.json"
"""The TOLLS store file between the two paths, in the run's folder."""


NOTIFY_SOURCE = "source-notify"
"""The ``adhoc`` variant's notification path reads its input here, behind the gate."""


def path_jobs(
    txns: LinearRoadTxns, out: Path, versioned: bool = False
) -> tuple[LinearRoadTxns, LinearRoadTxns]:
    """The two-job variants' jobs' functions: (minute path, notification path).

    They share ``txns``' readings of the specification and the TOLLS store
    file in ``out`` (absolute, so that executors find it); ``versioned``
    (``adhoc``): a notification reads its own minute's rows, and a duplicated
    segment entry is not rolled back (the paper's ADHOC cannot).
    """
    from dataclasses import replace

    store = str((out / TOLLS_STORE).resolve())
    notify = replace(
        txns, path="notify", published=store, versioned=versioned, rollback=not versioned
    )
    return replace(txns, path="minute"), notify


def gate_needs(line: str) -> tuple[int, int, int] | None:
    """What a tagged input line waits for at the ``adhoc`` gate: ``(xway, dir, minute)``.

    A position report the minute path runs waits for its partition's minute;
    anything else (queries, lines the minute path ignores) for nothing.
    """
    from txstream.linearroad.formats import DIR, XWAY, parse_input_line
    from txstream.spark.sources import TAG

    raw = line.split(TAG, 2)[-1]
    place = placement(raw)
    if place["time"] < 0 or place["everywhere"] or place["xk"] < 0:
        return None
    try:
        f = parse_input_line(raw)
    except TxStreamError:
        return None
    if f[0] != 0 or (f[XWAY], f[DIR]) != (place["xk"], place["dk"]):
        return None
    return place["xk"], place["dk"], place["time"] // 60 + 1


PLACEMENT = (("xk", 5), ("dk", 7), ("time", 2), ("kind", 1))
"""The fields (1-based) read to place a line, as integers; -1 when a field is not one.

Read alike in Spark SQL (:func:`lines_source`) and in Python (:func:`placement`).
Only the partitioning depends on them: the transaction function parses the
whole line and refuses one whose parsed fields disagree with its placement.
"""


def placement(raw: str) -> dict[str, Any]:
    """The placement fields of ``raw`` (:data:`PLACEMENT`), as :func:`lines_source` reads them."""
    parts = raw.split(",")
    out: dict[str, Any] = {}
    for name, k in PLACEMENT:
        try:
            out[name] = int(parts[k - 1].strip(" ")) if k <= len(parts) else -1
        except ValueError:
            out[name] = -1
    out["everywhere"] = out.pop("kind") == 2
    return out


@dataclass(frozen=True)
class _Period:
    """The boundary's grouping: input time divided by the period (a line without one alone)."""

    seconds: int

    def __call__(self, row: dict[str, Any]) -> Any:
        when = row["time"]
        return ("line", row["seq"]) if when < 0 else when // self.seconds


class AnswersFile:
    """A sink that appends answers to ``path`` exactly once per batch id.

    ``start_wall`` is the wall time of the run's first start: ``Emit`` counts
    from it.  ``latencies`` collects each answer's handoff and commit time.
    """

    def __init__(self, path: Path, start_wall: float, clock: Callable[[], float] = time.time):
        self.path = path
        self.state = path.with_name(path.name + ".batches.json")
        self.start_wall = start_wall
        self.clock = clock
        self.latencies: list[Latency] = []
        self.answers = 0
        if not path.exists():
            path.write_bytes(b"")
        done = self._done()
        if path.stat().st_size > done["bytes"]:
            with path.open("r+b") as f:  # a batch written but not recorded: cut it
                f.truncate(done["bytes"])

    def _done(self) -> dict[str, int]:
        if not self.state.exists():
            return {"batch": -1, "bytes": 0}
        try:
            data = json.loads(self.state.read_text())
            return {"batch": int(data["batch"]), "bytes": int(data["bytes"])}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise TxStreamError(
                f"cannot read {self.state}: {exc}; the answers file is in doubt"
            ) from None

    def __call__(self, batch: int, rows: list[dict[str, Any]]) -> None:
        """Write one committed batch's answers (skipped when it was written already)."""
        done = self._done()
        if batch <= done["batch"]:
            return
        now = self.clock()
        emit = f"{now - self.start_wall:.3f}"
        lines, parts = format_answers(rows, emit)
        writing = self.path  # a failed write (a full disk) names no file: say which
        try:
            with self.path.open("r+b") as f:
                f.truncate(done["bytes"])
                f.seek(done["bytes"])
                f.write("".join(line + "\n" for line in lines).encode("ascii"))
                f.flush()
                os.fsync(f.fileno())
                size = f.tell()
            writing = self.state
            tmp = self.state.with_name(self.state.name + ".tmp")
            tmp.write_text(json.dumps({"batch": batch, "bytes": size}))
            os.replace(tmp, self.state)
        except OSError as exc:
            raise TxStreamError(f"cannot write {writing}: {exc.strerror or exc}") from None
        self.answers += len(lines)
        for kind, handoff in parts:
            self.latencies.append(Latency(kind, handoff, now))


def format_answers(rows: Iterable[dict[str, Any]], emit: str) -> tuple[list[str], list[Any]]:
    """A batch's answer rows as answer lines, and (type, handoff) per line.

    Balance parts (one per partition) are combined per query in the order of
    their first part.
    """
    lines: list[str] = []
    kinds: list[tuple[int, float]] = []
    balances: dict[str, list[str]] = {}
    slots: dict[str, int] = {}
    for row in rows:
        kind = row["kind"]
        if kind == 2:
            qid = row["text"].split(",", 1)[0]
            if qid not in balances:
                balances[qid] = []
                slots[qid] = len(lines)
                lines.append("")
                kinds.append((2, float(row["handoff"])))
            balances[qid].append(row["text"])
        else:
            lines.append(row["text"].replace("@", emit, 1))
            kinds.append((kind, float(row["handoff"])))
    for qid, parts in balances.items():
        q, when, balance = combine_balance(parts)
        lines[slots[qid]] = f"2,{when},{emit},{when},{q},{balance}"
    return lines, kinds


# -- in this process (no JVM) ------------------------------------------------------------


def input_events(
    numbered: Iterable[tuple[int, str]], handoff: float = 0.0
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Input lines as the job's events ``(input, row)``, placed as Spark places them."""
    for seq, raw in numbered:
        yield "lines", {"seq": seq, "handoff": handoff, "raw": raw, **placement(raw)}


def run_local(
    input_path: Path,
    out: Path,
    txns: LinearRoadTxns,
    txn_size: str = "event",
    partitions: int = 4,
    batch_lines: int = 5000,
    duplicate_every: int = 0,
    record: bool = False,
    variant: str = "serializable",
    first: str = "notify",
    by_minute: bool = False,
) -> tuple[Path, AnswersFile]:
    """Run the job over ``input_path`` in this process; returns (answers file, its sink).

    Run again on the same ``out`` (after a crash, or after it finished) it
    resumes: the batches are cut from the input the same way each time, and
    those the store in ``out/ckpt`` has committed are not run again (they would
    be new batches to the runner, and their balance queries answered twice).

    Batches are ``batch_lines`` lines, or with ``by_minute`` the lines of one
    minute of input time each.  The ``not-serializable`` variant runs its two
    jobs (:func:`path_jobs`; stores ``out/ckpt`` and ``out/ckpt-minute``) taking
    turns batch by batch, ``first`` (``notify`` or ``minute``) running each
    batch first: the in-process stand-in for two queries side by side, so the
    answers depend on the turns as on Spark they depend on timing.  The
    ``adhoc`` variant's turns are the minute path's first, always (its gate
    lets a notification run only after its minute was published; ``first`` is
    not used).
    """
    check_variant(variant)
    if first not in ("notify", "minute"):
        raise TxStreamError(f"unknown first path {first!r}; notify or minute")
    out.mkdir(parents=True, exist_ok=True)
    answers = AnswersFile(out / "answers.txt", time.time())
    with open_text(input_path) as f:
        events = list(input_events(duplicate_entries(numbered_lines(f), duplicate_every)))
    cuts = _cuts(events, batch_lines, by_minute)
    if variant == "serializable":
        job = linear_road_job(txns, txn_size, record=record).sink("answers", answers)
        done = len(RuntimeStore(out / "ckpt").committed())
        batches = [_handed(events[i:j]) for i, j in cuts[done:]]
        job.run_local(batches, out / "ckpt", partitions=partitions)
        return out / "answers.txt", answers
    adhoc = variant == "adhoc"
    minute, notify = path_jobs(txns, out, versioned=adhoc)
    stores = {"minute": out / MINUTE_CKPT, "notify": out / "ckpt"}
    if adhoc:
        first = "minute"
    jobs = {
        "minute": linear_road_job(minute, txn_size, record=record).sink(
            "tolls", TollsPublisher(out / TOLLS_STORE, versions=adhoc)
        ),
        "notify": linear_road_job(notify, txn_size, record=record).sink("answers", answers),
    }
    order = [first, "minute" if first == "notify" else "notify"]
    ran = {name: len(RuntimeStore(store).committed()) for name, store in stores.items()}
    steps = [(name, k) for k in range(len(cuts)) for name in order if k >= ran[name]]
    _take_turns(jobs, stores, partitions, [(n, events[slice(*cuts[k])]) for n, k in steps])
    return out / "answers.txt", answers


def _cuts(
    events: list[tuple[str, dict[str, Any]]], batch_lines: int, by_minute: bool
) -> list[tuple[int, int]]:
    """Where the batches start and end: every ``batch_lines`` events, or at each new minute."""
    if not by_minute:
        return [(i, min(i + batch_lines, len(events))) for i in range(0, len(events), batch_lines)]
    starts = [0]
    current: int | None = None
    for i, (_, row) in enumerate(events):
        if row["time"] < 0:
            continue  # (a line whose time Spark cannot read stays in the batch it falls in)
        m = row["time"] // 60
        if current is not None and m > current:
            starts.append(i)
        if current is None or m > current:
            current = m
    return [(a, b) for a, b in zip(starts, [*starts[1:], len(events)], strict=True) if b > a]


def _take_turns(
    jobs: dict[str, Job],
    stores: dict[str, Path],
    partitions: int,
    steps: list[tuple[str, list[tuple[str, dict[str, Any]]]]],
) -> None:
    """Run each step's batch on its job, one step after the other, each job in its own runner.

    Each job's ``run_local`` consumes a generator in a thread of its own; the
    generator hands over one batch when this thread says so and reports when
    the runner asks for the next (the batch then committed and went to the
    sinks), so the jobs' batches run strictly in the order of ``steps``.  The
    steps begin once every runner asked for its first batch: a runner first
    delivers the committed batches its sinks missed (a crash between a commit
    and its sink), so the TOLLS store is whole before a notification reads it.
    """
    import queue
    import threading

    feeds: dict[str, queue.Queue[Any]] = {name: queue.Queue() for name in jobs}
    finished: dict[str, queue.Queue[bool]] = {name: queue.Queue() for name in jobs}
    failed: list[BaseException] = []

    def batches(name: str) -> Iterator[Iterator[tuple[str, dict[str, Any]]]]:
        finished[name].put(True)  # ready: the runner asks for its first batch
        while True:
            batch = feeds[name].get()
            if batch is None:
                return
            yield _handed(batch)
            finished[name].put(True)

    def run(name: str) -> None:
        try:
            # (run_local iterates its batches once, in order, so a generator will do)
            lazy = cast("Sequence[Iterable[tuple[str, dict[str, Any]]]]", batches(name))
            jobs[name].run_local(lazy, stores[name], partitions=partitions)
        except BaseException as exc:  # re-raised in the caller's thread
            failed.append(exc)
        finally:
            finished[name].put(False)

    threads = {name: threading.Thread(target=run, args=(name,), daemon=True) for name in jobs}
    for thread in threads.values():
        thread.start()
    try:
        ready = all([finished[name].get() for name in jobs]) and not failed
        for name, batch in steps if ready else []:
            feeds[name].put(batch)
            if not finished[name].get() or failed:
                break
    finally:
        for name in jobs:
            feeds[name].put(None)
        for thread in threads.values():
            thread.join()
    if failed:
        raise failed[0]


def _handed(batch: list[tuple[str, dict[str, Any]]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The batch's events, stamped with the time the runner takes them (their handoff).

    In this process the input is replayed as fast as it runs, so a response time
    is measured from when a batch is handed over, not from any wall clock.
    (Copies: the not-serializable variant's two jobs take the same events.)
    """
    now = time.time()
    for name, row in batch:
        yield name, {**row, "handoff": now}


def rejected_lines(checkpoint: Path) -> list[str]:
    """The rejected input lines, ``line N: reason: raw``, in line order."""
    rows = read_output(checkpoint, "rejected")
    return [f"line {r['seq']}: {r['reason']}: {r.get('raw', '')}" for r in sorted(
        rows, key=lambda r: r["seq"])]  # fmt: skip


# -- on Spark ---------------------------------------------------------------------------------


@dataclass
class SparkRun:
    """What :func:`run_spark` leaves: the feeder, the answers sink and the progress seen."""

    feeder: Any
    answers: AnswersFile
    progress: list[dict[str, Any]]
    master: str
    partitions: int
    gate_waited_s: float = 0.0
    """The ``adhoc`` variant: how long its gate held input chunks back, in all."""


def lines_source(lines: Any) -> Any:
    """The job's input from the tagged input lines: ``seq, handoff, raw`` and the placement.

    Spark reads only the fields that place a line (:data:`PLACEMENT`); the
    transaction function parses it.  Parsing all 15 fields in Spark SQL and
    shuffling them as columns cost three times the whole JVM side of a run
    (measured: 15.8 s against 4.4 s for 1.56 million lines on two cores).
    """
    from txstream.spark.sql import select

    fields = select(untag_lines(lines), "seq", "handoff", "raw", "split(raw, ',') AS _f")

    def num(k: int) -> str:
        return f"coalesce(try_cast(trim(try_element_at(_f, {k})) AS BIGINT), CAST(-1 AS BIGINT))"

    cols = {name: num(k) for name, k in PLACEMENT}
    return select(
        fields, "seq", "handoff", "raw", f"{cols['xk']} AS xk", f"{cols['dk']} AS dk",
        f"{cols['time']} AS time", f"{cols['kind']} = 2 AS everywhere",
    )  # fmt: skip


def untag_lines(lines: Any) -> Any:
    """Tagged lines (``value``) as ``seq, handoff, raw``, without the warm-up line 0."""
    from txstream.spark.sources import untag
    from txstream.spark.sql import where

    return where(untag(lines), "seq > 0")


def run_spark(
    spark: Any,
    input_path: Path,
    work: Path,
    txns: LinearRoadTxns,
    answers: AnswersFile,
    *,
    txn_size: str = "event",
    speedup: float = 1.0,
    duplicate_every: int = 0,
    partitions: int = 4,
    record: bool = False,
    progress: Callable[[str], None] | None = None,
    give_up_after_s: float | None = None,
    variant: str = "serializable",
) -> SparkRun:
    """Replay ``input_path`` through Spark at ``speedup`` into the job; wait for every answer.

    ``work`` holds the source folder and the checkpoint (``ckpt/``: Spark's and
    txstream's); running again with the same folders resumes after a crash.
    The ``not-serializable`` variant starts its two jobs (:func:`path_jobs`) as
    two queries over the same source folder, the minute path's checkpoint in
    ``ckpt-minute/``; they run side by side, ordered by nothing but Spark's
    scheduling.  The ``adhoc`` variant's notification path reads
    ``source-notify/``, where a :class:`~txstream.linearroad.tollstore.Gate`
    hands each chunk on once the minute path has published its minutes.
    """
    from txstream.linearroad.report import FellBehind
    from txstream.linearroad.spark_job import Feeder
    from txstream.spark.sources import text_files

    check_variant(variant)
    # Constraint inference over the SQL parser's large CASE expression exhausted the
    # planner's heap (an OutOfMemoryError before the first batch) when this job still
    # parsed in SQL; the driver engine's job still does and may share this session.
    spark.conf.set("spark.sql.constraintPropagation.enabled", "false")
    chunk_seconds = max(1, int(speedup // 10))  # at most ~10 files per wall second
    feeder = Feeder(input_path, work / "source", speedup, chunk_seconds, duplicate_every)
    plan: list[tuple[LinearRoadTxns, str, str, Callable[[int, list[dict[str, Any]]], None], str]]
    gate: Gate | None = None
    if variant == "serializable":
        plan = [(txns, "ckpt", "answers", answers, "source")]
    else:
        adhoc = variant == "adhoc"
        minute, notify = path_jobs(txns, work, versioned=adhoc)
        publisher = TollsPublisher(work / TOLLS_STORE, versions=adhoc)
        notify_source = NOTIFY_SOURCE if adhoc else "source"
        if adhoc:
            reached = lambda: publisher.reached  # noqa: E731 (read anew at every check)
            gate = Gate(work / "source", work / notify_source, reached, gate_needs)
        # The minute path first: its query starts (and restarts) before the one that reads it.
        plan = [
            (minute, MINUTE_CKPT, "tolls", publisher, "source"),
            (notify, "ckpt", "answers", answers, notify_source),
        ]
    queries: list[Any] = []
    try:
        for fns, ckpt, output, sink, folder in plan:
            (work / folder).mkdir(parents=True, exist_ok=True)
            source = lines_source(text_files(spark, work / folder))
            job = linear_road_job(fns, txn_size, source, record).sink(output, sink)
            job.option("partitions", partitions)
            queries.append(job.start(checkpoint=work / ckpt, spark=spark))
    except BaseException:
        for started in queries:
            started.stop()
        raise
    query = queries[-1]  # the one that answers
    run = SparkRun(feeder, answers, query.recentProgress, spark.sparkContext.master, partitions)
    interrupted = False
    if gate is not None:
        gate.start()
    try:
        feeder.warm_up(
            lambda: min(len(q.recentProgress) for q in queries),
            lambda: not all(q.isActive for q in queries),
        )
        feeder.start()
        last = time.time()
        while feeder.is_alive():
            feeder.join(timeout=1.0)
            for q in queries:
                _check(q, feeder, gate)
            lag = max(_lag(answers, feeder, q) for q in queries)
            if give_up_after_s is not None and lag > give_up_after_s:
                raise FellBehind(f"the answers lag the input by {lag:.0f} s")
            if progress is not None and time.time() - last >= 5:
                last = time.time()
                progress(
                    f"input time {feeder.sim_time} s, {feeder.handed} tuples handed to Spark, "
                    f"{len(query.recentProgress)} batches committed, {answers.answers} answers, "
                    f"recent max response {lag:.2f} s"
                )
        if gate is not None:
            gate.done.set()
        for q in queries:
            if gate is not None and q is query:  # the minute path has read everything
                while gate.is_alive():
                    gate.join(timeout=1.0)
                    _check(queries[0], feeder, gate)
            _check(q, feeder, gate)
            q.processAllAvailable()
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        feeder.stopping.set()
        feeder.join(timeout=5.0)
        if gate is not None:
            gate.stopping.set()
            gate.join(timeout=5.0)
        # Ctrl-C: let Spark read the chunks already handed over, then stop (see TxQuery.stop).
        for q in reversed(queries):
            q.stop(settle_s=10.0 if interrupted else 0.0)
    if gate is not None:
        run.gate_waited_s = gate.waited_s
    return run


def _lag(answers: AnswersFile, feeder: Any, query: Any) -> float:
    """How far behind the job is: the slowest recent answer, or the oldest unread input."""
    recent = answers.latencies[-500:]
    worst = max((x.committed - x.handoff for x in recent), default=0.0)
    last = query.lastProgress
    pending = 0.0
    if last is not None and feeder.handed and last["latency"]["max"] is not None:
        pending = last["latency"]["max"]
    return max(worst, pending)


def _check(query: Any, feeder: Any, gate: Gate | None = None) -> None:
    if feeder.error is not None:
        raise TxStreamError(f"input replay failed: {feeder.error}")
    if gate is not None and gate.error is not None:
        raise TxStreamError(f"the adhoc gate failed: {gate.error}")
    if query.status["failure"]:
        raise TxStreamError(query.status["failure"])
    if not query.isActive:
        raise TxStreamError("the Spark query stopped")
