"""Linear Road under the transaction manager: Figure 3's stores, Section 5.3's transactions.

The stores are txstream tables in one :class:`~txstream.txn.TransactionManager`
(durable when ``state_dir`` is given: write-ahead log plus checkpoints):

=================  ================================  ===========================================
store              key                               row
=================  ================================  ===========================================
``cars``           VID                               the car's last report, stop counter, whether
                                                     that report entered a segment, and its
                                                     running speed sum in the current
                                                     segment-minute (CAR SEGM CHANGE)
``segstats``       (XWay, Dir, Seg, minute)          speed sum, report count, distinct cars, sum
                                                     of per-car mean speeds (POSITION REPORTS
                                                     aggregated as they arrive)
``stops``          (XWay, Dir, Seg)                  stopped cars ``[spot, vid, first, last,
                                                     moved]``
``accidents``      (XWay, Dir, Seg)                  ``[minute, active]`` (ACCIDENTS)
``tolls``          (XWay, Dir, Seg)                  ``[minute, LAV, toll, accident segment
                                                     or -1]`` (TOLLS)
``balance``        VID                               ``[balance, pending toll, last entry time]``
``toll_alerts``    (VID, Time)                       ``[LAV, toll, emit]`` (TOLL ALERTS)
``acc_alerts``     (VID, Time)                       ``[XWay, Seg, Dir, emit]`` (ACCIDENT ALERTS)
``bal_reports``    QID                               ``[Time, balance, emit]`` (BALANCE REPORTS)
``exp_reports``    QID                               ``[Time, toll, emit]``
``rejected``       input line number                 ``[reason, raw line]``
``pending``        (line, serial)                    a notification or query the ingest owes,
                                                     deleted by the transaction that answers it
=================  ================================  ===========================================

HISTORICAL TOLLS is a static relation, read without locks.

The processing paths run concurrently, one thread each, like the queries of
Figure 3 connected by stores:

* **ingest** (the caller's thread, e.g. Spark's ``foreachBatch``): one
  transaction per run of input tuples within a minute updates ``cars``,
  ``segstats`` and ``stops`` and yields the segment entries and queries;
* **minute**: at each minute boundary, the minute's accidents in one
  transaction ``{r(stops) w(accidents)}``, then the minute's tolls in one
  ``{r(segstats) r(accidents) w(tolls)}``, then the output sink;
* **toll**: one transaction per toll notification (or per 1, 2 or 3 seconds of
  them, ``txn_size``): ``r(balance) r(tolls) w(balance) w(toll_alerts)
  [w(acc_alerts)]`` (the toll transaction, which read ACCIDENTS, stores the
  accident segment with each toll, so one read serves both notifications);
* **query**: account-balance and daily-expenditure queries.

Variants:

* ``serializable``: SS2PL with the *predefined order* (the tuples' arrival
  order): every transaction takes its place in the order when the ingest
  path creates it, so a notification of minute ``m`` is ordered after the
  tolls and accidents of minute ``m`` and waits for them if that path is
  behind; commits follow the order.
* ``not-serializable``: the same transactions with writers' locks only
  (protocol ``none``) and no order: a notification reads whatever the stores
  hold when it runs, so when the minute path is behind it uses the previous
  minute's tolls and misses new accidents.  Alerts are written without a key
  check, so a duplicated input report produces a duplicate alert and a double
  charge (the ADHOC implementation's behaviour).

A re-delivered report (a duplicate from a faulty source, or a replay after a
crash) re-emits its segment entry; the notification charges the balance, then
inserts the alert, whose key already exists, so the transaction manager rolls
the transaction back: balance restored, no duplicate alert.

Exactly-once after a crash: the ingest transaction commits the offset of its
last input line together with every row derived from its tuples, the
``pending`` rows of the notifications and queries they owe included, so the
recovered offset and the stores always agree; on restart every ``pending``
row left is re-submitted (in line order, before any new work) and the input
resumes after the offset.  (Committing an older offset with the ingest let a
crash before the notifications leave ``cars`` ahead of the offset: the replay
then skipped a car's earlier report of the minute and lost its notification.)
Answers leave the stores through the sink, which appends them to the answers
file and commits the file's new length; on restart the file is cut back to
the committed length.
"""

from __future__ import annotations

import itertools
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from txstream.errors import TransientError, TxStreamError
from txstream.linearroad.formats import (
    ACCOUNT_BALANCE,
    DAILY_EXPENDITURE,
    DAY,
    DIR,
    EXIT_LANE,
    LANE,
    LAV_DEFINITIONS,
    POS,
    POSITION_REPORT,
    QID,
    SEG,
    SEGMENTS,
    SPD,
    TIME,
    TYPE,
    VID,
    XWAY,
    out_of_order,
)
from txstream.linearroad.rules import (  # (moved from here: still imported from here)
    _ANSWER_TYPE,
    _NO_TOLL,
    C_COUNT,
    C_DIR,
    C_ENTERED,
    C_LANE,
    C_MINUTE,
    C_POS,
    C_SAME,
    C_SEG,
    C_SUM,
    C_TIME,
    C_XWAY,
    MEAN_SCALE,
    TXN_SIZES,
    VARIANTS,
    Arrival,
    DuplicateEvents,
    Entry,
    HistoricalTolls,
    Job,
    Latency,
    Query,
    Tuple,
    _active,
    _downstream,
    _entry,
    _known,
    _lav,
    _span,
    _spot,
    _still_needed,
    _stop_entry,
    check_accident_end,
    check_txn_size,
    check_variant,
    stops_here,
)
from txstream.storage import DuplicateKeyError
from txstream.storage.files import writing
from txstream.txn import Transaction, TransactionManager

# The rules moved to txstream.linearroad.rules; the names users, txns.py and the tests
# import are still imported from here.
__all__ = [
    "MEAN_SCALE",
    "TXN_SIZES",
    "VARIANTS",
    "Arrival",
    "DuplicateEvents",
    "HistoricalTolls",
    "Latency",
    "LinearRoadEngine",
    "_active",
    "_downstream",
    "_lav",
    "_span",
    "_spot",
    "_still_needed",
    "_stop_entry",
    "check_accident_end",
    "check_txn_size",
    "check_variant",
    "stops_here",
]


class LinearRoadEngine:
    """Runs the Linear Road queries as transactions; feed it with :meth:`process`.

    Call order: ``start()``, ``process(batch)`` any number of times from one
    thread with tuples in arrival order, ``finish()``.  Tuples at or below
    :attr:`resumed_from` (recovered from ``state_dir``) are skipped.
    """

    def __init__(
        self,
        *,
        variant: str = "serializable",
        txn_size: str = "event",
        lav: str = "spec",
        accident_end: str = "spec",
        state_dir: str | Path | None = None,
        answers_path: str | Path | None = None,
        historical_tolls: HistoricalTolls | None = None,
        sync: str = "off",
        checkpoint_minutes: int = 5,
        clock: Callable[[], float] = time.time,
        record: bool = False,
    ) -> None:
        self.variant = check_variant(variant)
        self.txn_size = check_txn_size(txn_size)
        _known("LAV definition", lav, LAV_DEFINITIONS)
        self.accident_end = check_accident_end(accident_end)
        if checkpoint_minutes < 1:
            raise TxStreamError("checkpoint_minutes must be at least 1")
        self.lav = lav
        self.serializable = variant == "serializable"
        self.period = TXN_SIZES[txn_size]
        self.clock = clock
        self.start_wall = clock()
        self.checkpoint_minutes = checkpoint_minutes
        if state_dir is not None:
            Path(state_dir).mkdir(parents=True, exist_ok=True)
        self.tm = TransactionManager(
            "ss2pl" if self.serializable else "none",
            path=state_dir,
            sync=sync,
            ordered=self.serializable,
            record=record,
            arrival_stream="input",
        )
        tm = self.tm
        self.cars = tm.table("cars")
        self.segstats = tm.table("segstats")
        self.stops = tm.table("stops")
        self.accidents = tm.table("accidents")
        self.tolls = tm.table("tolls")
        self.balance = tm.table("balance")
        self.meta = tm.table("meta")
        self.pending = tm.table("pending")
        self.outputs = {name: tm.table(name) for name in _ANSWER_TYPE}
        self.rejected = tm.table("rejected")
        self.historical = historical_tolls or HistoricalTolls([])

        # Emit times count from the first start, also after a restart.
        self._arrival_keys: dict[str, tuple[float, int, int]] = {}
        """Each committed transaction's place in the input order (``--record`` only)."""
        started = self.meta.read("started")
        if started is None:
            with tm.begin() as txn:
                txn.put(self.meta, "started", self.start_wall)
            self._arrival_keys[txn.hid] = (-math.inf, 0, 0)
        else:
            self.start_wall = float(started)
        self.resumed_from: int = int(tm.offset("input", 0))
        self.minute: int = int(self.meta.read("minute", 0))
        self.xways: set[int] = set(self.meta.read("xways", []))
        self.answers_path = Path(answers_path) if answers_path is not None else None
        self.answer_lines: list[str] = []
        """The answers, when there is no answers file."""
        if self.answers_path is not None:
            self._cut_answers_file(int(tm.offset("answers_bytes", 0)))

        # Keys of ``pending`` rows: (line, serial), the serial after any recovered one.
        owed: list[Any] = list(self.pending.rows())
        self._pending_serial = itertools.count(max((k[1] for k in owed), default=-1) + 1)
        self._arrival_serial = itertools.count()
        self._line = 0
        """The line number the ingest path is at (places minute jobs in the input order)."""
        self._chunk: list[Arrival] = []
        self._rejects: list[tuple[int, str, str]] = []
        self._group: list[Entry] = []
        self._group_period = -1
        self._queues: dict[str, queue.Queue[Job | None]] = {}
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._committed_at: dict[tuple[str, Any], float] = {}
        self._file_lock = threading.Lock()
        self.latencies: list[Latency] = []
        # Without the serializable variant's key check, every alert is a new row.
        self._serial = itertools.count()
        self.rolled_back = 0
        self.retries = 0
        self.tuples = 0
        self.input_time = 0
        """The input time of the latest tuple taken by :meth:`process`."""

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the minute, toll and query paths (one thread each)."""
        for path in ("minute", "toll", "query"):
            q: queue.Queue[Job | None] = queue.Queue()
            self._queues[path] = q
            t = threading.Thread(target=self._worker, args=(q,), name=f"lr-{path}", daemon=True)
            t.start()
            self._threads.append(t)
        self._resubmit_pending()

    def _resubmit_pending(self) -> None:
        """Recreate the notifications and queries whose input was taken before a crash.

        The ingest transaction that took their tuples committed them to
        ``pending`` (with the input offset); the transaction that answers one
        deletes its row.  So after a crash every row left is work still owed,
        and the resumed input starts after the tuples that created it.
        """
        rows: list[tuple[Any, Any]] = sorted(self.pending.rows().items())
        for key, row in rows:
            seq = int(key[0])
            if row[0] == 0:
                _, handoff, vid, when, x, d, seg, ex = row
                self._entry(Entry(seq, handoff, vid, when, x, d, seg, bool(ex), tuple(key)))
            else:
                _, handoff, kind, when, vid, qid, x, day = row
                q = Query(seq, handoff, kind, when, vid, qid, x, day, tuple(key))
                self._submit("query", self._answer_query, [q], at=seq)
        self._close_group()

    def finish(self) -> None:
        """Flush open groups and the outputs, wait for every path, checkpoint, close."""
        self._check()
        self._flush_chunk()
        self._close_group()
        for q in self._queues.values():
            q.put(None)
        for t in self._threads:
            t.join()
        self._check()
        # The last answers leave once every path is idle: a sink enumerates the rows
        # present when it runs, and older transactions may still be queued before that.
        last = Job("minute", self.tm.begin(), self._sink, minute=10**9)
        last.at = (math.inf, 0, next(self._arrival_serial))
        self._execute(last)
        if self.tm.store.durable:
            self.tm.checkpoint()
        self.tm.close()

    def abandon(self) -> None:
        """Stop the paths without flushing (after an error); the durable state stays."""
        for q in self._queues.values():
            q.put(None)
        for t in self._threads:
            t.join(timeout=5)
        self.tm.close()

    def _check(self) -> None:
        if self._errors:
            raise self._errors[0]

    # -- the ingest path (caller's thread) ---------------------------------------------

    def process(
        self, arrivals: Iterable[Arrival], rejected: Iterable[tuple[int, str, str]] = ()
    ) -> None:
        """Take tuples in arrival order (``(line, handoff, fields)``) and malformed lines."""
        self._check()
        self._rejects.extend(r for r in rejected if r[0] > self.resumed_from)
        for arrival in arrivals:
            seq, _, t = arrival
            if seq <= self.resumed_from:
                continue
            if t[TIME] < self.input_time:
                # The input must come in time order (the validator rejects the same tuple).
                self._rejects.append(
                    (seq, out_of_order(t[TIME], self.input_time), ",".join(map(str, t)))
                )
                continue
            minute = t[TIME] // 60 + 1
            if minute > self.minute:
                self._flush_chunk(before=seq)
                self._close_group()
                self._line = seq
                for m in range(self.minute + 1, minute + 1):
                    self._boundary(m)
                self.minute = minute
            self._chunk.append(arrival)
            self.input_time = t[TIME]
            self.tuples += 1
        self._flush_chunk()

    def _submit(
        self,
        path: str,
        run: Callable[[Transaction, Job], list[tuple[str, Any, float]]],
        items: list[Any] | None = None,
        minute: int = 0,
        at: float = 0,
        phase: int = 2,
    ) -> Job:
        job = Job(path, self.tm.begin(), run, items or [], None, minute)
        job.at = (at, phase, next(self._arrival_serial))
        self._queues[path].put(job)
        return job

    def _boundary(self, minute: int) -> None:
        """Minute ``minute`` starts: its accidents, tolls and the output sink, in that order."""
        segments = [(x, d, s) for x in sorted(self.xways) for d in (0, 1) for s in range(SEGMENTS)]
        at = self._line
        self._submit("minute", self._detect_accidents, segments, minute=minute, at=at, phase=0)
        self._submit("minute", self._compute_tolls, segments, minute=minute, at=at, phase=0)
        sink = self._submit("minute", self._sink, minute=minute, at=at, phase=0)
        sink.checkpoint = self.tm.store.durable and minute % self.checkpoint_minutes == 0

    def _flush_chunk(self, before: int | None = None) -> None:
        """Ingest the chunk and the rejected lines (only those before line ``before``).

        The ingest commits the offset of the last line it covers, so it must
        not cover a rejected line that comes after tuples still waiting.
        """
        chunk, self._chunk = self._chunk, []
        if before is None:
            rejects, self._rejects = self._rejects, []
        else:
            rejects = [r for r in self._rejects if r[0] < before]
            self._rejects = [r for r in self._rejects if r[0] >= before]
        if not chunk and not rejects:
            return
        first = min([a[0] for a in chunk[:1]] + [r[0] for r in rejects[:1]])
        last = max([a[0] for a in chunk[-1:]] + [r[0] for r in rejects])
        # The ingest transaction commits the offset of its last line together with
        # every row derived from its tuples, the notifications and queries they owe
        # included (``pending``): the recovered offset and stores always agree.
        job = Job("ingest", self.tm.begin(), self._ingest, [chunk, rejects], last)
        job.at = (first, 1, next(self._arrival_serial))
        outputs = self._execute(job)
        self.xways.update(t[XWAY] for _, _, t in chunk if t[TYPE] == POSITION_REPORT)
        for kind, item, _ in outputs:
            if kind == "entry":
                self._entry(item)
            else:
                self._submit("query", self._answer_query, [item], at=item.seq)

    def _entry(self, entry: Entry) -> None:
        if self.period == 0:
            self._submit("toll", self._notify, [entry], at=entry.seq)
            return
        period = entry.time // self.period
        if self._group and period != self._group_period:
            self._close_group()
        self._group_period = period
        self._group.append(entry)

    def _close_group(self) -> None:
        if not self._group:
            return
        group, self._group = self._group, []
        self._submit("toll", self._notify, group, at=group[-1].seq)

    def _owe(self, txn: Transaction, row: list[Any], seq: int) -> tuple[int, int]:
        """Record in ``pending`` a notification or query this ingest creates."""
        key = (seq, next(self._pending_serial))
        txn.put(self.pending, key, row)
        return key

    def _ingest(self, txn: Transaction, job: Job) -> list[tuple[str, Any, float]]:
        chunk, rejects = job.items
        out: list[tuple[str, Any, float]] = []
        cars, segstats, stops = self.cars, self.segstats, self.stops
        for seq, reason, raw in rejects:
            txn.put(self.rejected, seq, [reason, raw])
        new_xways = False
        for seq, handoff, t in chunk:
            kind = t[TYPE]
            if kind != POSITION_REPORT:
                if kind in (ACCOUNT_BALANCE, DAILY_EXPENDITURE):
                    q = Query(seq, handoff, kind, t[TIME], t[VID], t[QID], t[XWAY], t[DAY])
                    q.pending = self._owe(
                        txn, [1, handoff, kind, q.time, q.vid, q.qid, q.xway, q.day], seq
                    )
                    out.append(("query", q, handoff))
                continue
            vid, now, x, d, seg, lane, pos, spd = (
                t[VID], t[TIME], t[XWAY], t[DIR], t[SEG], t[LANE], t[POS], t[SPD],
            )  # fmt: skip
            car = txn.read(cars, vid)
            if car is not None and car[C_TIME] >= now:
                if car[C_TIME] == now and car[C_ENTERED]:
                    # Delivered again: the entry goes out again; its notification
                    # transaction finds the alert and is rolled back.
                    out.append(("entry", self._entry_of(txn, seq, handoff, t), handoff))
                continue
            new_xways = new_xways or x not in self.xways
            moved_on = car is None or (car[C_SEG], car[C_XWAY], car[C_DIR]) != (seg, x, d)
            # A car back from the exit ramp enters its segment again, even the one
            # it left from (a new trip: a new toll notification).
            entered = moved_on or (car[C_LANE] == EXIT_LANE and lane != EXIT_LANE)
            same = (
                car[C_SAME] + 1
                if car is not None
                and (car[C_POS], car[C_LANE], car[C_XWAY], car[C_DIR]) == (pos, lane, x, d)
                else 1
            )
            minute = now // 60 + 1
            key = (x, d, seg, minute)
            stat = txn.read(segstats, key) or [0, 0, 0, 0]
            stat = list(stat)
            stat[0] += spd
            stat[1] += 1
            # Per-car means are per segment-minute: a car back from the exit ramp in
            # the same segment and minute is still one car there.
            if car is not None and not moved_on and car[C_MINUTE] == minute:
                s0, c0 = car[C_SUM], car[C_COUNT]
                s1, c1 = s0 + spd, c0 + 1
                stat[3] += MEAN_SCALE * s1 // c1 - MEAN_SCALE * s0 // c0
            else:
                s1, c1 = spd, 1
                stat[2] += 1
                stat[3] += MEAN_SCALE * spd
            txn.put(segstats, key, stat)
            if car is not None and car[C_SAME] >= 4 and same == 1:
                # A stopped car moved: this report may clear an accident (clear-minute).
                where = (car[C_XWAY], car[C_DIR], car[C_SEG])
                old = txn.read(stops, where)
                if old:
                    row = [list(_stop_entry(e)) for e in old]
                    for e in row:
                        if e[0] == _spot(car[C_POS], car[C_LANE]) and e[1] == vid:
                            e[4] = now
                            txn.put(stops, where, row)
                            break
            if stops_here(same, lane):
                where = (x, d, seg)
                row = [list(_stop_entry(e)) for e in txn.read(stops, where, [])]
                spot = _spot(pos, lane)
                for e in row:
                    if e[0] == spot and e[1] == vid:
                        e[3], e[4] = now, -1
                        break
                else:
                    row.append([spot, vid, now, now, -1])
                txn.put(stops, where, row)
            txn.put(cars, vid, [now, x, d, seg, lane, pos, same, entered, minute, s1, c1])
            if entered:
                out.append(("entry", self._entry_of(txn, seq, handoff, t), handoff))
        if new_xways:
            seen = sorted(self.xways | {t[XWAY] for _, _, t in chunk if t[TYPE] == POSITION_REPORT})
            txn.put(self.meta, "xways", seen)
        return out

    def _entry_of(self, txn: Transaction, seq: int, handoff: float, t: Tuple) -> Entry:
        e = _entry(seq, handoff, t)
        e.pending = self._owe(
            txn, [0, handoff, e.vid, e.time, e.xway, e.dir, e.seg, int(e.exit)], seq
        )
        return e

    # -- the minute path ---------------------------------------------------------------

    def _detect_accidents(self, txn: Transaction, job: Job) -> list[tuple[str, Any, float]]:
        m = job.minute
        for where in job.items:
            row = txn.read(self.stops, where)
            active = bool(row) and _active(row, m, self.accident_end)
            if row:
                # Stops that cannot make an accident active any more.
                kept = _still_needed(row, m, self.accident_end)
                if len(kept) != len(row):
                    if kept:
                        txn.put(self.stops, where, kept)
                    else:
                        txn.delete(self.stops, where)
            txn.put(self.accidents, where, [m, int(active)])
        return []

    def _compute_tolls(self, txn: Transaction, job: Job) -> list[tuple[str, Any, float]]:
        m = job.minute
        active = {where for where in job.items if txn.read(self.accidents, where, [0, 0])[1]}
        for x, d, seg in job.items:
            rows = []
            cars = 0
            for k in range(m - 5, m):
                r = txn.read(self.segstats, (x, d, seg, k))
                if r is not None:
                    rows.append(r)
                    if k == m - 1:
                        cars = r[2]
            lav = _lav(rows, self.lav)
            near = min((s for s in _downstream(d, seg) if (x, d, s) in active), default=-1)
            toll = 2 * (cars - 50) ** 2 if cars > 50 and lav < 40 and near < 0 else 0
            txn.put(self.tolls, (x, d, seg), [m, lav, toll, near])
            old = (x, d, seg, m - 6)
            if txn.read(self.segstats, old) is not None:
                txn.delete(self.segstats, old)
        txn.put(self.meta, "minute", m)
        return []

    def _sink(self, txn: Transaction, job: Job) -> list[tuple[str, Any, float]]:
        """Move answers older than two minutes (all, at the end) to the answers file."""
        cut = 60 * (job.minute - 2)
        lines: list[str] = []
        for name, table in self.outputs.items():
            kind = _ANSWER_TYPE[name]
            due: list[Any] = []
            key: Any
            for key in list(table.keys()):
                peek = table.read(key)
                when = key[1] if kind in (0, 1) else (peek[0] if peek is not None else 0)
                if when < cut:
                    due.append(key)
            for key in sorted(due):
                row = txn.read(table, key)
                if row is None:
                    continue
                txn.delete(table, key)
                committed = self._committed_at.pop((name, key), row[-1])
                lines.append(_format(kind, key, row, committed - self.start_wall))
        if lines:
            size = self._append_answers(lines)
            txn.commit_offset("answers_bytes", size)
        return []

    # -- the toll and query paths ---------------------------------------------------------

    def _notify(self, txn: Transaction, job: Job) -> list[tuple[str, Any, float]]:
        out: list[tuple[str, Any, float]] = []
        dups: list[int] = []
        stamp = self.clock()
        alerts, acc_alerts = self.outputs["toll_alerts"], self.outputs["acc_alerts"]
        for e in job.dropped:
            txn.delete(self.pending, e.pending)
        for i, e in enumerate(job.items):
            txn.delete(self.pending, e.pending)
            bal = txn.read(self.balance, e.vid, [0, 0, -1])
            if self.serializable and e.exit and bal[2] >= e.time:
                continue  # a charge already made (a replayed exit-lane entry)
            if e.exit:
                txn.put(self.balance, e.vid, [bal[0] + bal[1], 0, e.time])
                continue
            _, lav, toll, near = txn.read(self.tolls, (e.xway, e.dir, e.seg), _NO_TOLL)
            txn.put(self.balance, e.vid, [bal[0] + bal[1], toll, e.time])
            key: tuple[int, ...] = (
                (e.vid, e.time) if self.serializable else (e.vid, e.time, next(self._serial))
            )
            try:
                if self.serializable:
                    txn.insert(alerts, key, [lav, toll, stamp])
                else:
                    txn.put(alerts, key, [lav, toll, stamp])
            except DuplicateKeyError:
                dups.append(i)
                continue
            out.append(("toll_alerts", key, e.handoff))
            if near >= 0:
                txn.put(acc_alerts, key, [e.xway, near, e.dir, stamp])
                out.append(("acc_alerts", key, e.handoff))
        if dups:
            # Rolled back and run again without the duplicates, in the same place in
            # the order (their pending rows still go).
            txn.abort(retry=True)
            raise DuplicateEvents(dups)
        return out

    def _answer_query(self, txn: Transaction, job: Job) -> list[tuple[str, Any, float]]:
        for dropped in job.dropped:
            txn.delete(self.pending, dropped.pending)
        if not job.items:
            return []
        q: Query = job.items[0]
        txn.delete(self.pending, q.pending)
        stamp = self.clock()
        key: Any = q.qid if self.serializable else (q.qid, next(self._serial))
        if q.type == ACCOUNT_BALANCE:
            bal = txn.read(self.balance, q.vid, [0, 0, -1])
            name, row = "bal_reports", [q.time, bal[0], stamp]
        else:
            toll = self.historical.lookup(q.vid, q.day, q.xway)
            name, row = "exp_reports", [q.time, toll, stamp]
        try:
            if self.serializable:
                txn.insert(self.outputs[name], key, row)
            else:
                txn.put(self.outputs[name], key, row)
        except DuplicateKeyError:
            txn.abort(retry=True)
            raise DuplicateEvents([0]) from None
        return [(name, key, q.handoff)]

    # -- running transactions ------------------------------------------------------------

    def _worker(self, q: queue.Queue[Job | None]) -> None:
        while True:
            job = q.get()
            if job is None:
                return
            try:
                self._execute(job)
                if job.checkpoint:
                    self.tm.checkpoint()
            except BaseException as exc:  # surfaced on the ingest thread
                self._errors.append(exc)

    def _execute(self, job: Job) -> list[tuple[str, Any, float]]:
        """Run ``job`` to its commit: retry transient failures, drop duplicated events."""
        txn = job.txn
        while True:
            try:
                with txn:
                    out = job.run(txn, job)
                    if job.offset is not None and job.offset > 0:
                        txn.commit_offset("input", job.offset)
                break
            except TransientError:
                self.retries += 1
                txn = self.tm.begin(retry_of=txn)
            except DuplicateEvents as dup:
                self.rolled_back += 1
                job.dropped += [e for i, e in enumerate(job.items) if i in dup.indexes]
                job.items = [e for i, e in enumerate(job.items) if i not in dup.indexes]
                txn = self.tm.begin(retry_of=txn)
        if self.tm.recorder is not None:
            self._arrival_keys[txn.hid] = job.at
        now = self.clock()
        for name, key, handoff in out:
            if name in _ANSWER_TYPE:
                self._committed_at[(name, key)] = now
                self.latencies.append(Latency(_ANSWER_TYPE[name], handoff, now))
        return out

    # -- the answers file ---------------------------------------------------------------

    def _cut_answers_file(self, size: int) -> None:
        path = self.answers_path
        assert path is not None
        if not path.exists():
            path.write_bytes(b"")
        if path.stat().st_size > size:
            with path.open("r+b") as f:
                f.truncate(size)

    def _append_answers(self, lines: list[str]) -> int:
        text = "".join(line + "\n" for line in lines)
        with self._file_lock:
            if self.answers_path is None:
                self.answer_lines.extend(lines)
                return len(self.answer_lines)
            with writing(self.answers_path), self.answers_path.open("ab") as f:
                f.write(text.encode("ascii"))
                f.flush()
                if self.tm.store.durable:
                    os.fsync(f.fileno())
                return f.tell()

    def history(self) -> Any:
        """The committed history (``record=True``), its arrival order taken from the input.

        The arrival order of stream ``input`` lists the committed transactions by
        the input line each one stems from (the first line of an ingest run, the
        line of a notification's last event or of a query, the line that opened
        a minute for that minute's transactions), never by when they committed:
        a run that is not serializable in the input's order is then not CSAO.
        """
        from txstream.model import History

        recorded = self.tm.history(committed_only=True)
        keys = self._arrival_keys
        committed = recorded.committed()
        order = sorted((hid for hid in keys if hid in committed), key=lambda hid: keys[hid])
        return History(list(recorded.operations), {"input": order})

    def rejected_lines(self) -> list[str]:
        """The malformed input lines: ``line N: reason: raw``, in line order."""
        rows = sorted(self.rejected.rows().items())
        return [f"line {seq}: {reason}: {raw}" for seq, (reason, raw) in rows]

    def stats(self) -> dict[str, int]:
        """Counters of the run: tuples, rolled-back notifications, retries, the TM's."""
        out = {"tuples": self.tuples, "rolled_back": self.rolled_back, "retries": self.retries}
        out.update(self.tm.stats())
        return out


def _format(kind: int, key: Any, row: Sequence[Any], emit: float) -> str:
    if kind == 0:
        return f"0,{key[0]},{key[1]},{emit:.3f},{row[0]},{row[1]}"
    if kind == 1:
        return f"1,{key[1]},{emit:.3f},{row[0]},{row[1]},{row[2]},{key[0]}"
    qid = key if isinstance(key, int) else key[0]
    return (
        f"{kind},{row[0]},{emit:.3f},{row[0]},{qid},{row[1]}"
        if kind == 2
        else (f"3,{row[0]},{emit:.3f},{qid},{row[1]}")
    )
