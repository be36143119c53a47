"""Linear Road as transaction functions for the partitioned runtime (``tx.Job``).

The same queries as :class:`~txstream.linearroad.engine.LinearRoadEngine`, but
written for one partition that runs its transactions serially in arrival
order (H-Store/S-Store): no locks, no paths, no threads.  Every table is
partitioned by ``(xway, dir)``, so a position report and everything it
triggers (segment statistics, stopped cars, the minute's accidents and tolls,
its toll and accident notifications, the charge of the previous toll) touch
one partition only:

=================  ==========================  =====================================
table              key                         row
=================  ==========================  =====================================
``meta``           (xway, dir)                 the partition's current minute and
                                               latest report time
``cars``           (xway, dir, vid)            the car's last report there, stop
                                               counter, running speed sum of its
                                               segment-minute (CAR SEGM CHANGE)
``segstats``       (xway, dir, seg, minute)    speed sum, reports, distinct cars,
                                               sum of per-car mean speeds
``stops``          (xway, dir, seg)            stopped cars ``[spot, vid, first,
                                               last, moved]`` (ACCIDENTS' input)
``tolls``          (xway, dir, seg)            the minute's LAV, toll and nearest
                                               accident segment (TOLLS)
``balance``        (xway, dir, vid)            tolls charged there, the toll
                                               pending (charged at the car's next
                                               entry) and the time of that entry
=================  ==========================  =====================================

A minute's accidents and tolls are computed by the first report of that
minute in the partition, before the report itself (the engine's minute path
runs at the same place of the order).  The transaction per toll notification
of Section 5.3 is the report's own transaction (boundary ``event``); the 1, 2
and 3 s sizes group a partition's consecutive events of the same period.

**Account balances across partitions.** A car's tolls are charged in the
partition where it drives, so its balance is spread over the ``(xway, dir)``
partitions it used.  An account-balance query is a keyless event: one
fragment per partition reads the car's row there at the query's place in the
order (a read-only transaction split into per-partition pieces, each at the
same position of every partition's serial order), and :func:`combine_balance`
adds the parts.  The pending toll of every partition but the one of the car's
latest entry has been charged by that later entry, which is exactly what a
single balance row would hold.

Each handler is deterministic (a replayed micro-batch does the same thing), as
the runtime requires, except the notification path's read of the TOLLS store
(:data:`PATHS`): the not-serializable variant's one read outside its job,
which sees what the minute path has published when it runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txstream.linearroad.engine import (
    MEAN_SCALE,
    HistoricalTolls,
    _downstream,
    _lav,
    _span,
    _spot,
    _still_needed,
    _stop_entry,
    check_accident_end,
    stops_here,
)
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
    VID,
    XWAY,
    MalformedTupleError,
    out_of_order,
    parse_input_line,
)
from txstream.linearroad.tollstore import published_toll, toll_at

TABLES: dict[str, tuple[str, ...]] = {
    "meta": ("xway", "dir"),
    "cars": ("xway", "dir", "vid"),
    "segstats": ("xway", "dir", "seg", "minute"),
    "stops": ("xway", "dir", "seg"),
    "tolls": ("xway", "dir", "seg"),
    "balance": ("xway", "dir", "vid"),
}
"""Every table's key; each is partitioned by its first two columns ``(xway, dir)``."""

PARTITION_BY = ("xway", "dir")

PATHS: dict[str, tuple[str, ...]] = {
    "all": tuple(TABLES),
    "minute": ("meta", "cars", "segstats", "stops", "tolls"),
    "notify": ("meta", "cars", "balance"),
}
"""Each job's processing paths by name, with the tables it keeps.

``all``: the serializable job, every path in one serial order per partition.
The not-serializable variant runs two jobs with no common order: ``minute``
(statistics, stopped cars, each minute's accidents and tolls, which it
publishes to the TOLLS store) and ``notify`` (segment entries, charges, toll
and accident alerts, queries; it reads the TOLLS store as it is when a
notification runs).
"""

_TOLLS_CACHE: dict[str, HistoricalTolls] = {}
"""Historical tolls per file, loaded once per Python worker (a static relation)."""


def _historical(path: str | None) -> HistoricalTolls:
    if path is None:
        return HistoricalTolls([])
    found = _TOLLS_CACHE.get(path)
    if found is None:
        found = _TOLLS_CACHE[path] = HistoricalTolls.from_file(path)
    return found


@dataclass(frozen=True)
class LinearRoadTxns:
    """The transaction functions of the job, with the run's readings of the specification.

    ``tolls_path`` names the historical-tolls file; on a cluster it must be
    readable at that path by every executor.
    """

    lav: str = "spec"
    accident_end: str = "spec"
    tolls_path: str | None = None
    path: str = "all"
    """Which processing paths this job runs (:data:`PATHS`): ``all`` (the serializable
    job), or one of the not-serializable variant's two jobs, ``minute`` or ``notify``."""
    published: str | None = None
    """The TOLLS store file between the two paths (:mod:`~txstream.linearroad.tollstore`):
    the notification path reads it; required for ``path="notify"``."""
    versioned: bool = False
    """The ``adhoc`` variant's notification path: read the TOLLS store's row of the
    report's own minute (:func:`~txstream.linearroad.tollstore.toll_at`), which
    the gate has made sure is published, instead of whatever the store holds."""
    rollback: bool = True
    """Whether a re-delivered segment entry is undone before it has effects (the
    transaction manager's rollback).  ``False`` for the ``adhoc`` variant's
    notification path: like the paper's ADHOC implementation it cannot roll
    back the query of a duplicated report, which alerts and charges again
    (Section 6.3, Table 2)."""

    def __post_init__(self) -> None:
        if self.lav not in LAV_DEFINITIONS:
            raise ValueError(f"unknown LAV definition {self.lav!r}")
        check_accident_end(self.accident_end)
        if self.path not in PATHS:
            raise ValueError(f"unknown path {self.path!r}; one of {list(PATHS)}")
        if self.path == "notify" and self.published is None:
            raise ValueError("the notification path needs the TOLLS store's file (published)")

    # -- the input ------------------------------------------------------------------------

    def line(self, t: Any, e: dict[str, Any]) -> None:
        """One input line (``seq``, ``handoff``, ``raw``): parsed here, then its query.

        The line was placed by ``(xk, dk)`` and ``everywhere``, which Spark read
        from its fields without parsing the rest (see ``linearroad.runtime_job``); a
        balance query reaches every partition (``t.home`` is its fragment's
        partition).  A malformed line is reported once, by one fragment.
        """
        # (the minute path reports nothing: the notification path, which reads the
        # same lines, reports each once)
        once = (t.home is None or t.home == 0) and self.path != "minute"
        try:
            f = parse_input_line(e["raw"])
        except MalformedTupleError as exc:
            if once:
                self.rejected(t, e["seq"], str(exc), e["raw"])
            return
        kind = f[0]
        placed = (kind == ACCOUNT_BALANCE) == (t.home is not None) and (
            kind != POSITION_REPORT or (f[XWAY], f[DIR]) == (e["xk"], e["dk"])
        )
        if not placed:
            # The cheap field reading that placed the line disagrees with the parser
            # (exotic white space or digits): refuse it visibly rather than run it
            # on the wrong partition.
            if once:
                self.rejected(t, e["seq"], "fields the partitioning could not read", e["raw"])
            return
        base = {"seq": e["seq"], "handoff": e["handoff"], "time": f[TIME], "vid": f[VID]}
        if kind != POSITION_REPORT and self.path == "minute":
            return  # queries are the notification path's
        if kind == POSITION_REPORT:
            self.report(t, {**base, "spd": f[SPD], "xway": f[XWAY], "lane": f[LANE], "dir": f[DIR],
                            "seg": f[SEG], "pos": f[POS], "raw": e["raw"]})  # fmt: skip
        elif kind == ACCOUNT_BALANCE:
            self.balance(t, {**base, "qid": f[QID]})
        elif kind == DAILY_EXPENDITURE:
            self.expenditure(t, {**base, "qid": f[QID], "xway": f[XWAY], "day": f[DAY]})
        # A travel-time query (type 4) is read and not answered (not implemented).

    # -- position reports ---------------------------------------------------------------

    def report(self, t: Any, e: dict[str, Any]) -> None:
        """A position report: statistics, stops, the minute's tolls, notification and charge."""
        x, d, now, vid = e["xway"], e["dir"], e["time"], e["vid"]
        meta = t.read("meta", (x, d)) or {"xway": x, "dir": d, "minute": 0, "time": -1}
        if now < meta["time"]:
            # The input must come in time order (the validator rejects the same tuple).
            if self.path != "minute":
                self.rejected(t, e["seq"], out_of_order(now, meta["time"]), e["raw"])
            return
        minute = now // 60 + 1
        if self.path != "notify":
            for m in range(meta["minute"] + 1, minute + 1):
                self._minute(t, x, d, m)
        if now != meta["time"]:  # hundreds of reports share a second: write once
            t.upsert("meta", {"xway": x, "dir": d, "minute": max(minute, meta["minute"]),
                              "time": now})  # fmt: skip
        car = t.read("cars", (x, d, vid))
        if car is not None and car["time"] >= now:
            if not self.rollback and car["time"] == now and car.get("entered"):
                # ADHOC: the duplicated segment entry's query runs again (a second
                # charge, duplicated alerts) and nothing can undo it.
                self._notify(t, e)
                return
            # Delivered again (a faulty source or a replay): no effect, reported.
            if self.path != "minute":
                t.emit("duplicates", {"seq": e["seq"]})
            return
        if self.path == "notify":
            self._enter(t, e, car)
            return
        entered = self._ingest(t, e, car, minute)
        if entered and self.path == "all":
            self._notify(t, e)

    def _enter(self, t: Any, e: dict[str, Any], car: Any) -> None:
        """The notification path's report: keep the car's segment; notify when it entered one.

        (Its statistics and stops are the minute path's, in the other job.)
        """
        x, d, now, vid, seg, lane = e["xway"], e["dir"], e["time"], e["vid"], e["seg"], e["lane"]
        # As in _ingest: a new segment, or back from the exit ramp (a new trip).
        entered = (
            car is None or car["seg"] != seg or (car["lane"] == EXIT_LANE and lane != EXIT_LANE)
        )
        t.upsert("cars", {"xway": x, "dir": d, "vid": vid, "time": now, "seg": seg, "lane": lane,
                          "entered": entered})  # fmt: skip
        if entered:
            self._notify(t, e)

    def _ingest(self, t: Any, e: dict[str, Any], car: Any, minute: int) -> bool:
        """Update ``cars``, ``segstats`` and ``stops``; return whether the car entered a segment."""
        x, d, now, vid = e["xway"], e["dir"], e["time"], e["vid"]
        seg, lane, pos, spd = e["seg"], e["lane"], e["pos"], e["spd"]
        moved_on = car is None or car["seg"] != seg
        # A car back from the exit ramp enters its segment again, even the one it
        # left from (a new trip: a new toll notification).
        entered = moved_on or (car["lane"] == EXIT_LANE and lane != EXIT_LANE)
        same = (
            car["same"] + 1 if car is not None and (car["pos"], car["lane"]) == (pos, lane) else 1
        )
        key = (x, d, seg, minute)
        stat = t.read("segstats", key) or {
            "xway": x, "dir": d, "seg": seg, "minute": minute,
            "s": 0, "n": 0, "cars": 0, "means": 0,
        }  # fmt: skip
        stat["s"] += spd
        stat["n"] += 1
        # Per-car means are per segment-minute: a car back from the exit ramp in the
        # same segment and minute is still one car there.
        if car is not None and not moved_on and car["minute"] == minute:
            s0, c0 = car["sum"], car["count"]
            s1, c1 = s0 + spd, c0 + 1
            stat["means"] += MEAN_SCALE * s1 // c1 - MEAN_SCALE * s0 // c0
        else:
            s1, c1 = spd, 1
            stat["cars"] += 1
            stat["means"] += MEAN_SCALE * spd
        t.upsert("segstats", stat)
        if car is not None and car["same"] >= 4 and same == 1:
            # A stopped car moved: this report may clear an accident (clear-minute).
            self._moved(t, x, d, car["seg"], _spot(car["pos"], car["lane"]), vid, now)
        if stops_here(same, lane):
            self._stopped(t, x, d, seg, _spot(pos, lane), vid, now)
        t.upsert(
            "cars",
            {
                "xway": x, "dir": d, "vid": vid, "time": now, "seg": seg, "lane": lane,
                "pos": pos, "same": same, "minute": minute, "sum": s1, "count": c1,
            },
        )  # fmt: skip
        return entered

    def _moved(self, t: Any, x: int, d: int, seg: int, spot: int, vid: int, now: int) -> None:
        row = t.read("stops", (x, d, seg))
        if row is None:
            return
        entries = [list(_stop_entry(s)) for s in row["entries"]]
        for s in entries:
            if s[0] == spot and s[1] == vid:
                s[4] = now
                t.update("stops", (x, d, seg), entries=entries)
                return

    def _stopped(self, t: Any, x: int, d: int, seg: int, spot: int, vid: int, now: int) -> None:
        row = t.read("stops", (x, d, seg))
        entries = [list(_stop_entry(s)) for s in row["entries"]] if row else []
        for s in entries:
            if s[0] == spot and s[1] == vid:
                s[3], s[4] = now, -1
                break
        else:
            entries.append([spot, vid, now, now, -1])
        t.upsert("stops", {"xway": x, "dir": d, "seg": seg, "entries": entries})

    def _notify(self, t: Any, e: dict[str, Any]) -> None:
        """A segment entry: charge the pending toll; off the exit lane, notify the next one."""
        x, d, now, vid, seg = e["xway"], e["dir"], e["time"], e["vid"], e["seg"]
        bal = t.read("balance", (x, d, vid)) or {
            "xway": x, "dir": d, "vid": vid, "charged": 0, "pending": 0, "last": -1,
        }  # fmt: skip
        bal["charged"] += bal["pending"]
        bal["last"] = now
        if e["lane"] == EXIT_LANE:
            bal["pending"] = 0
            t.upsert("balance", bal)
            return
        if self.path == "notify":
            # The TOLLS store as the minute path, another job with no order in
            # common with this one, last published it: the not-serializable read.
            assert self.published is not None
            if self.versioned:  # adhoc: the report's minute, published before it ran
                lav, toll, near = toll_at(self.published, (x, d, seg), now // 60 + 1)
            else:
                lav, toll, near = published_toll(self.published, (x, d, seg))
        else:
            toll_row = t.read("tolls", (x, d, seg))
            lav, toll, near = (
                (toll_row["lav"], toll_row["toll"], toll_row["near"]) if toll_row else (0, 0, -1)
            )
        bal["pending"] = toll
        t.upsert("balance", bal)
        base = {"seq": e["seq"], "handoff": e["handoff"]}
        t.emit("answers", {**base, "kind": 0, "text": f"0,{vid},{now},@,{lav},{toll}"})
        if near >= 0:
            t.emit("answers", {**base, "kind": 1, "text": f"1,{now},@,{x},{near},{d},{vid}"})

    # -- the minute's accidents and tolls --------------------------------------------------

    def _minute(self, t: Any, x: int, d: int, m: int) -> None:
        """Minute ``m`` starts in partition ``(x, d)``: its accidents, then its tolls."""
        active: set[int] = set()
        for seg in range(SEGMENTS):
            row = t.read("stops", (x, d, seg))
            if row is None:
                continue
            entries = row["entries"]
            if _active_in(entries, m, self.accident_end):
                active.add(seg)
            kept = _still_needed(entries, m, self.accident_end)
            if len(kept) != len(entries):
                if kept:
                    t.update("stops", (x, d, seg), entries=kept)
                else:
                    t.delete("stops", (x, d, seg))
        for seg in range(SEGMENTS):
            rows = []
            cars = 0
            for k in range(m - 5, m):
                r = t.read("segstats", (x, d, seg, k))
                if r is not None:
                    rows.append((r["s"], r["n"], r["cars"], r["means"]))
                    if k == m - 1:
                        cars = r["cars"]
            lav = _lav(rows, self.lav)
            near = min((s for s in _downstream(d, seg) if s in active), default=-1)
            toll = 2 * (cars - 50) ** 2 if cars > 50 and lav < 40 and near < 0 else 0
            old = t.read("tolls", (x, d, seg))
            if old is not None or toll or near >= 0 or rows:
                row = {"xway": x, "dir": d, "seg": seg, "lav": lav, "toll": toll, "near": near}
                t.upsert("tolls", row)
                if self.path == "minute":
                    t.emit("tolls", {**row, "minute": m})  # published when the batch commits
            if t.read("segstats", (x, d, seg, m - 6)) is not None:
                t.delete("segstats", (x, d, seg, m - 6))
        if self.path == "minute":
            # The partition reached minute m: its rows of m are all above (the adhoc
            # variant's gate waits for this marker).
            t.emit("tolls", {"xway": x, "dir": d, "seg": -1, "minute": m,
                             "lav": 0, "toll": 0, "near": -1})  # fmt: skip

    # -- queries ------------------------------------------------------------------------------

    def balance(self, t: Any, q: dict[str, Any]) -> None:
        """Account balance: this partition's part (a keyless event: one fragment per partition)."""
        rows = (t.read("balance", (x, d, q["vid"])) for x, d in t.values("balance"))
        charged, pending, last = balance_part(r for r in rows if r is not None)
        _answer(t, q, 2, f"{q['qid']},{q['time']},{charged},{pending},{last}")

    def expenditure(self, t: Any, q: dict[str, Any]) -> None:
        """Daily expenditure: the historical toll of (VID, Day, XWay), a static relation."""
        toll = _historical(self.tolls_path).lookup(q["vid"], q["day"], q["xway"])
        _answer(t, q, 3, f"3,{q['time']},@,{q['qid']},{toll}")

    def rejected(self, t: Any, seq: int, reason: str, raw: str) -> None:
        """A malformed input line: reported with its reason, exactly once."""
        t.emit("rejected", {"seq": seq, "reason": reason, "raw": raw})


def _answer(t: Any, q: dict[str, Any], kind: int, text: str) -> None:
    t.emit("answers", {"seq": q["seq"], "handoff": q["handoff"], "kind": kind, "text": text})


def balance_part(rows: Iterable[dict[str, Any]]) -> tuple[int, int, int]:
    """One partition's part of a balance: (charged, pending, time of the latest entry).

    Of the partition's rows, only the latest entry's toll may still be pending;
    the others were charged when the car entered a segment later.
    """
    charged = pending = 0
    last = -1
    for row in rows:
        charged += row["charged"]
        if row["last"] > last:
            charged += pending
            pending, last = row["pending"], row["last"]
        else:
            charged += row["pending"]
    return charged, pending, last


def _active_in(entries: Sequence[Sequence[int]], minute: int, accident_end: str) -> bool:
    by_pos: dict[int, dict[int, tuple[int, int, int]]] = {}
    for s in entries:
        pos, vid, first, last, moved = _stop_entry(s)
        by_pos.setdefault(pos, {})[vid] = (first, last, moved)
    for cars in by_pos.values():
        span = _span(cars, accident_end)
        if span is not None and span[0] <= minute <= span[1]:
            return True
    return False


def combine_balance(parts: Sequence[str]) -> tuple[int, int, int]:
    """Add up a balance query's per-partition parts: ``(qid, time, balance)``.

    Each part is ``qid,time,charged,pending,last``.  The toll pending in the
    partition of the car's latest entry is not charged yet; every other
    partition's pending toll was charged when the car entered a segment later.
    """
    qid = time = 0
    charged = 0
    latest_last, latest_pending = -1, 0
    for part in parts:
        q, tm, c, p, last = (int(v) for v in part.split(","))
        qid, time = q, tm
        charged += c + p
        if last > latest_last:
            latest_last, latest_pending = last, p
    return qid, time, charged - latest_pending


def tolls_path(path: str | Path | None) -> str | None:
    """The historical-tolls path as the handlers take it (absolute, so executors find it)."""
    return None if path is None else str(Path(path).resolve())
