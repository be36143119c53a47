"""Sinks: where a job's committed outputs go, exactly once per batch id.

A sink is a callable ``sink(batch_id, rows)``.  The runtime calls it for every
committed batch of its output, in batch order, after the batch's commit marker
is written, and records the delivery (``sinks/<output>/<batch>.done``).  A
driver that dies between the call and the record calls it again for the same
batch id after the restart, so a sink must be idempotent per batch id; the
built-in ones are:

* the store's own files (always: :func:`~txstream.spark.runtime.read_output`);
* :class:`PostgresSink`: the rows and the batch id go into PostgreSQL in one
  transaction, and a batch id that is already there is skipped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from txstream.errors import TxStreamError
from txstream.spark.runtime.base import RuntimeJobError
from txstream.spark.runtime.results import read_batch_output
from txstream.spark.runtime.state import RuntimeStore, write_atomic

Sink = Callable[[int, list[dict[str, Any]]], None]
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def deliver(
    store: RuntimeStore, sinks: dict[str, list[Sink]], batches: Iterable[int] | None = None
) -> int:
    """Hand every committed, not yet delivered batch to its output's sinks; returns how many.

    ``batches``: only these committed batches (a running query's new batch).
    Without it every committed batch is looked at (at start, for a batch a
    crash left undelivered): a check per batch ever committed, which a query
    that runs for days must not pay on every micro-batch (it grows with the run).
    """
    done = 0
    todo = list(store.committed() if batches is None else batches) if sinks else []
    for output, targets in sinks.items():
        folder = store.root / "sinks" / output
        for batch in todo:
            marker = folder / f"{batch:012d}.done"
            if marker.exists():
                continue
            rows = read_batch_output(store, output, batch)
            for sink in targets:
                try:
                    sink(batch, rows)
                except TxStreamError:
                    raise
                except Exception as exc:
                    raise TxStreamError(
                        f"sink of output {output!r} failed on batch {batch}: "
                        f"{type(exc).__name__}: {exc}; it is called again on restart"
                    ) from None
            write_atomic(marker, b"")
            done += 1
    return done


class PostgresSink:
    """Writes an output's rows into a PostgreSQL table, exactly once per batch id.

    ``conninfo`` is a libpq connection string; ``table`` and ``columns`` name the
    target table (created when missing, all columns ``text`` unless ``types``
    gives SQL types).  A ledger table ``txstream_sink_batches(sink, batch)`` is
    written in the same transaction as the rows, so a batch delivered twice (after
    a crash) is skipped.

    Making one checks the names; it connects only when a batch is delivered, so
    running the job needs a PostgreSQL server:

    >>> import txstream as tx
    >>> sink = tx.PostgresSink("dbname=shop", "alerts", ["device", "celsius"],
    ...                        types={"celsius": "double precision"})
    >>> job = tx.Job().input("readings", None, keys="device").output("alerts").sink("alerts", sink)
    >>> tx.PostgresSink("dbname=shop", "alerts; drop table x", ["device"])
    Traceback (most recent call last):
    txstream.spark.runtime.errors.RuntimeJobError: PostgresSink: 'alerts; drop table x' is not a
    plain SQL identifier
    >>> job.on("readings", check).start(checkpoint="ckpt/alerts")    # doctest: +SKIP
    """

    def __init__(
        self,
        conninfo: str,
        table: str,
        columns: list[str],
        types: dict[str, str] | None = None,
        name: str | None = None,
    ) -> None:
        for ident in [table, *columns]:
            if not _IDENT.fullmatch(ident):
                raise RuntimeJobError(f"PostgresSink: {ident!r} is not a plain SQL identifier")
        self.conninfo = conninfo
        self.table = table
        self.columns = columns
        self.types = types or {}
        self.name = name or table

    def __call__(self, batch: int, rows: list[dict[str, Any]]) -> None:
        """Insert ``rows`` of batch ``batch`` unless that batch is already in."""
        import psycopg

        cols = ", ".join(f"{c} {self.types.get(c, 'text')}" for c in self.columns)
        with psycopg.connect(self.conninfo) as conn, conn.transaction():
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} ({cols})")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS txstream_sink_batches "
                "(sink text, batch bigint, PRIMARY KEY (sink, batch))"
            )
            seen = conn.execute(
                "INSERT INTO txstream_sink_batches VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (self.name, batch),
            )
            if seen.rowcount == 0:
                return  # delivered before a crash: skip
            marks = ", ".join(["%s"] * len(self.columns))
            with conn.cursor() as cur:
                cur.executemany(
                    f"INSERT INTO {self.table} ({', '.join(self.columns)}) VALUES ({marks})",
                    [tuple(row.get(c) for c in self.columns) for row in rows],
                )
