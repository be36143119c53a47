"""The experiment of Oyamada et al. Section 6: stream-table equi-join, selection, windowed mean.

An event ``(id, part, qty)`` joins the row of a random part in a table of
``rows`` parts (``price`` 1..100, ``cat``); a selection keeps the joined events
with ``price <= 50`` (selectivity about 0.5); the mean price is computed over
count-based windows of range ``r`` and slide ``floor(r/2)``.  Updaters rewrite
random parts at a given rate while the query runs.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from txstream.cq.base import CQError, Operator, RefJoin, Row, Select, Source, WindowAgg
from txstream.cq.engine import VERSION_KEY, CQEngine, Updaters, make_manager
from txstream.model.check import check

TABLE = "parts"
COLUMNS = ("price", "cat")


def build_query(
    r: int, s: int | None = None, *, table: str = TABLE, column: str = "price"
) -> Operator:
    """join(parts) -> select(price <= 50) -> mean(column) over windows (r, s)."""
    s = max(1, r // 2) if s is None else s
    src = Source("events", ("id", "part", "qty"))
    join = RefJoin("join_parts", src, table, "part")
    cheap = Select("cheap", join, lambda v: v["price"] <= 50)
    return WindowAgg("mean_price", cheap, "avg", column, r, s)


def new_part(rng: random.Random) -> Row:
    """A random part row."""
    return {"price": rng.randint(1, 100), "cat": rng.randrange(4)}


_EVENTS: dict[tuple[int, int, int], list[Row]] = {}


def events(n: int, rows: int, seed: int) -> list[Row]:
    """``n`` raw events over parts ``0 .. rows-1`` (kept for reuse: runs repeat them)."""
    key = (n, rows, seed)
    if key not in _EVENTS:
        rng = random.Random(seed)
        _EVENTS.clear()
        _EVENTS[key] = [
            {"id": k, "part": rng.randrange(rows), "qty": rng.randint(1, 9)} for k in range(n)
        ]
    return _EVENTS[key]


def load_table(strategy: str, rows: dict[int, Row], *, record: bool = False) -> Any:
    """A transaction manager for ``strategy`` with the parts table loaded (version 0)."""
    tm = make_manager(strategy, record=record)
    tm.table(TABLE)
    with tm.begin() as t:
        t.put(TABLE, VERSION_KEY, 0)
        for key, row in rows.items():
            t.put(TABLE, key, row)
    return tm


@dataclass
class CQRun:
    """Settings of one run (defaults: the paper's, scaled to a few seconds)."""

    strategy: str = "snapshot"
    update_rate: float = 1000.0  # update transactions per second; 0: no updaters
    r: int = 5
    s: int | None = None  # slide; default floor(r/2)
    table: str = TABLE
    column: str = "price"
    rows: int = 10_000
    seconds: float = 2.0
    events: int = 400_000
    threads: int = 2
    seed: int = 0
    record: bool = False


def run(p: CQRun) -> dict[str, Any]:
    """Run the query for ``p.seconds`` under ``p.strategy`` with updaters; the metrics."""
    if p.rows < 1 or p.seconds <= 0 or p.update_rate < 0 or p.threads < 1 or p.events < 1:
        raise CQError("rows, seconds, events and threads must be positive, update_rate >= 0")
    query = build_query(p.r, p.s, table=p.table, column=p.column)  # checks r and s
    rng = random.Random(p.seed)
    tm = load_table(p.strategy, {key: new_part(rng) for key in range(p.rows)}, record=p.record)
    engine = CQEngine(query, tm, p.strategy, {TABLE: COLUMNS})
    stream = events(p.events, p.rows, p.seed + 1)
    updaters = None
    if p.update_rate > 0:
        updaters = Updaters(
            tm, TABLE, range(p.rows), p.update_rate, new_part, threads=p.threads, seed=p.seed
        ).start()
    start = time.monotonic()
    cpu = time.thread_time()  # the query's own thread (the updaters have theirs)
    try:
        results = engine.run(stream, until=start + p.seconds)
        cpu = time.thread_time() - cpu
    finally:
        update_tput = updaters.stop() if updaters is not None else 0.0
    elapsed = time.monotonic() - start
    consistent = sum(1 for res in results if res.consistent)
    out: dict[str, Any] = {
        "results": len(results),
        "consistent_ratio": consistent / len(results) if results else 1.0,
        "cq_throughput": len(results) / elapsed,
        # results per CPU second of the query's thread: what holds on a loaded machine
        "cq_cpu_throughput": len(results) / cpu if cpu > 0 else 0.0,
        "update_throughput": update_tput,
        "redos": engine.stats.redos,
        "reevaluated": engine.stats.reevaluated,
    }
    if p.record:
        history = tm.history()
        out["cs"] = check(history, "cs").holds
        out["history"] = history
    return out
