"""Sinks: where a job's committed outputs go, exactly once per batch id.

A sink is a callable ``sink(batch_id, rows)``.  The runtime calls it for every
committed batch of its output, in batch order, after the batch's commit marker
is written, and records the delivery (``sinks/<output>/<batch>.done``).  A
driver that dies between the call and the record calls it again for the same
batch id after the restart, so a sink must be idempotent per batch id; the
built-in ones are:

* the store's own files (always: :func:`~txstream.spark.runtime.read_output`);
* :class:`PostgresSink`: the rows and the batch id go into PostgreSQL in one
  transaction, and a batch id that is already there is skipped;
* :class:`DeltaSink`: one Delta commit per batch with its batch id as Delta's
  application transaction version;
* :class:`FolderSink`: one JSON-lines file per batch, the source of
  ``TxQuery.output_stream``.

A running query hands batches to the built-in sinks on a thread of its own
(:class:`BackgroundDelivery`), so that the next micro-batch does not wait
for a Delta commit or a database round trip; a user's own callable runs in
the batch's thread, in order with the batch, because it may call back into
the query (``query.stop()``).
"""

from __future__ import annotations

import json
import logging
import queue
import re
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple, Protocol, cast

from txstream.errors import TxStreamError
from txstream.spark.runtime.base import RuntimeJobError
from txstream.spark.runtime.results import arrow_table, read_batch_output
from txstream.spark.runtime.state import RuntimeStore, write_atomic

Sink = Callable[[int, list[dict[str, Any]]], None]

log = logging.getLogger("txstream.runtime")

_ARROW_TYPES = {
    "string": "string",
    "int": "int64",
    "integer": "int64",
    "long": "int64",
    "bigint": "int64",
    "double": "float64",
    "float": "float64",
    "boolean": "bool",
    "bool": "bool",
}
"""Each type of an output's declared schema (``Job.output(name, schema=...)``) in Arrow:
the Python values the runtime accepts for it (ints are 64-bit, floats doubles)."""


def arrow_schema(columns: dict[str, str]) -> Any:
    """An output's declared columns (``{"id": "long"}``) as a ``pyarrow.Schema``."""
    import pyarrow as pa

    return pa.schema(
        [(name, pa.type_for_alias(_ARROW_TYPES[kind])) for name, kind in columns.items()]
    )


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SinkOwner(NamedTuple):
    """Whose batches a built-in sink writes: one output of one store.

    A batch id means something only within one store and one output, so a
    built-in sink claims its target (a PostgreSQL sink name, a Delta app id, a
    folder) for the first owner that writes to it and refuses, in one line,
    another owner's batches: a second job, a second output, or the same job on
    a new checkpoint would otherwise have its batches skipped as "delivered
    before a crash" (or, in a folder, overwrite the first one's files).
    """

    key: str
    """The store's ``job.json`` id (its path for a store without one) and the output."""
    text: str
    """The same for a message: ``output 'alerts' of /ckpt``."""


class ClaimingSink(Protocol):
    """A built-in sink (``claims = True``): it is handed the owner of the batches it writes."""

    def __call__(self, batch: int, rows: list[dict[str, Any]], owner: SinkOwner | None) -> None:
        """Write batch ``batch``'s ``rows`` for ``owner`` (refused when the target is another's)."""


def sink_owner(store: RuntimeStore, output: str) -> SinkOwner:
    """The owner a built-in sink claims its target for when ``store`` delivers ``output``."""
    record = store.job_record() or {}
    ident = record.get("id") or str(store.root.resolve())
    return SinkOwner(f"{ident}:{output}", f"output {output!r} of {store.root}")


def _foreign(what: str, other: str, fix: str) -> TxStreamError:
    return TxStreamError(
        f"{what} holds the batches of {other}, and batch ids are one store's and one "
        f"output's: {fix}"
    )


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
    owner: tuple[str, SinkOwner] | None = None
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
                    if getattr(sink, "claims", False) is True:
                        if owner is None or owner[0] != output:
                            owner = (output, sink_owner(store, output))
                        cast(ClaimingSink, sink)(batch, rows, owner=owner[1])
                    else:
                        sink(batch, rows)
                except TxStreamError:
                    raise
                except Exception as exc:
                    # one line: drivers' messages (psycopg's "Is the server
                    # running ...?") run on over several
                    first = (str(exc).strip().splitlines() or [""])[0]
                    raise TxStreamError(
                        f"sink of output {output!r} failed on batch {batch}: "
                        f"{type(exc).__name__}: {first}; it is called again on restart"
                    ) from exc
            write_atomic(marker, b"")
            done += 1
    return done


def in_background(sinks: dict[str, list[Sink]]) -> bool:
    """Whether every sink is one that may run off the batch's thread (``background = True``).

    The built-in sinks are: they write where the batch says and call nothing
    of the query.  A user's callable is not, since it may stop the query or
    read what the batch left.
    """
    return bool(sinks) and all(
        getattr(sink, "background", False) is True for targets in sinks.values() for sink in targets
    )


class BackgroundDelivery:
    """Delivers a running query's committed batches to its sinks on a thread of its own.

    :meth:`submit` queues a batch that has just committed, and the thread
    calls :func:`deliver` for it, batch after batch, in order, while the next
    micro-batch already runs.  At most :data:`DEPTH` batches wait: a slower
    sink holds the query back rather than falling behind without bound.  A
    batch committed and not yet delivered when the driver dies is delivered
    at the next start (its ``.done`` record is missing), as before.

    A sink's failure stops the delivery of every later batch (their order
    would break) and is raised, one line, by the next :meth:`submit` (so the
    next micro-batch fails, as it would have had the sink run in its thread)
    or by :meth:`flush`.

    Ownership: ``submit`` is called from the query's batch thread, ``flush``
    and ``close`` from whoever waits for the query (``processAllAvailable``,
    ``awaitTermination``, ``stop``); only the delivery thread calls the sinks
    and writes their ``.done`` records.
    """

    DEPTH = 2
    """Committed batches that may wait for their delivery before ``submit`` blocks."""

    def __init__(self, store: RuntimeStore, sinks: dict[str, list[Sink]], name: str) -> None:
        self._store = store
        self._sinks = sinks
        self._name = name
        self._queue: queue.Queue[int | None] = queue.Queue(maxsize=self.DEPTH)
        self._error: TxStreamError | None = None
        self._reported = False
        self._thread = threading.Thread(
            target=self._loop, name=f"txstream sinks {name}", daemon=True
        )
        self._thread.start()

    def _loop(self) -> None:
        while True:
            batch = self._queue.get()
            try:
                if batch is None:
                    return
                if self._error is None:
                    deliver(self._store, self._sinks, [batch])
            except Exception as exc:  # (deliver gives a TxStreamError; anything else: a bug)
                error = (
                    exc
                    if isinstance(exc, TxStreamError)
                    else TxStreamError(
                        f"delivery of batch {batch} to the sinks failed: "
                        f"{type(exc).__name__}: {exc}"
                    )
                )
                log.error("job %r: %s", self._name, error)
                self._error = error
            finally:
                self._queue.task_done()

    def submit(self, batch: int) -> None:
        """Queue committed batch ``batch`` (raises a failure of an earlier delivery)."""
        self._raise()
        self._queue.put(batch)

    def flush(self) -> None:
        """Wait until every queued batch is delivered; raise a delivery's failure once."""
        if self._thread.is_alive():
            self._queue.join()
        if not self._reported:
            self._raise()

    def close(self) -> None:
        """Deliver what is queued, then end the thread (idempotent)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            self._reported = True
            raise self._error


class FolderSink:
    """Writes each committed batch of an output as one JSON-lines file in a folder, exactly once.

    Batch ``n``'s rows go to ``<path>/batch-<n>.jsonl`` (12 digits), written
    whole through a hidden temporary file and a rename, after the batch's
    commit marker; a batch re-delivered after a crash rewrites the same file
    with the same rows.  The folder is what ``TxQuery.output_stream(name)``
    reads as a Spark file source: Spark takes each file once, by its path, so a
    downstream query with Spark's own exactly-once file sink (Parquet, ...)
    sees every committed row once.  A batch without rows writes no file.

    >>> import txstream as tx
    >>> tx.FolderSink("")
    Traceback (most recent call last):
    txstream.spark.runtime.errors.RuntimeJobError: FolderSink: an empty path; name a folder
    """

    background = True
    """It may run off the batch's thread (see :class:`BackgroundDelivery`)."""
    claims = True
    """Its target is one output's of one store (see :class:`SinkOwner`)."""

    OWNER_FILE = ".txstream-owner"
    """The folder's claim (hidden: Spark's file source skips it)."""

    def __init__(self, path: str | Path) -> None:
        if not isinstance(path, (str, Path)) or not str(path).strip():
            raise RuntimeJobError("FolderSink: an empty path; name a folder")
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise RuntimeJobError(f"FolderSink: {self.path} is a file; give a folder")

    def __call__(
        self, batch: int, rows: list[dict[str, Any]], owner: SinkOwner | None = None
    ) -> None:
        """Write batch ``batch``'s ``rows`` as ``batch-<n>.jsonl`` (nothing when there are none)."""
        if owner is not None:
            self._claim(owner)
        if not rows:
            return
        text = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)
        write_atomic(self.path / f"batch-{batch:012d}.jsonl", text.encode())

    def target(self) -> tuple[str, ...]:
        """What it writes to: two outputs of one job must not share it (``Job.sink`` checks)."""
        return ("folder", str(self.path.resolve()))

    def _claim(self, owner: SinkOwner) -> None:
        """Claim the folder for ``owner``, or refuse it when another owner has (one line)."""
        claim = self.path / self.OWNER_FILE
        try:
            found = json.loads(claim.read_text())
        except FileNotFoundError:
            # (a folder written before claims: its files are taken as this owner's)
            write_atomic(claim, json.dumps({"owner": owner.key, "of": owner.text}).encode())
            return
        except (OSError, ValueError) as exc:
            raise TxStreamError(f"FolderSink {self.path}: unreadable {claim}: {exc}") from None
        if not isinstance(found, dict) or found.get("owner") != owner.key:
            other = found.get("of", "another store") if isinstance(found, dict) else "another"
            raise _foreign(
                f"FolderSink {self.path}",
                f"{other} (not {owner.text}; its {claim.name})",
                "give each output of each job a folder of its own (or empty this one to "
                "write it anew)",
            )


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

    background = True
    """It may run off the batch's thread (see :class:`BackgroundDelivery`)."""
    claims = True
    """Its name is one output's of one store (ledger ``txstream_sink_owners``, see
    :class:`SinkOwner`)."""

    def __init__(
        self,
        conninfo: str,
        table: str,
        columns: list[str],
        types: dict[str, str] | None = None,
        name: str | None = None,
    ) -> None:
        if not isinstance(conninfo, str):
            raise RuntimeJobError(f"PostgresSink: conninfo is a string, not {conninfo!r}")
        if isinstance(columns, str) or not columns:
            # (a str was taken letter by letter: "id" made columns i and d, NULL in every row)
            raise RuntimeJobError(
                f"PostgresSink: columns must be a non-empty list of column names, not {columns!r}"
            )
        for ident in [table, *columns]:
            if not isinstance(ident, str) or not _IDENT.fullmatch(ident):
                raise RuntimeJobError(f"PostgresSink: {ident!r} is not a plain SQL identifier")
        if len(set(columns)) != len(columns):
            raise RuntimeJobError(f"PostgresSink: a column is named twice in {list(columns)}")
        stray = [c for c in types or {} if c not in columns]
        if stray:  # (a misspelt name left its column text, without a word)
            raise RuntimeJobError(
                f"PostgresSink: types names {', '.join(map(repr, stray))}, not among the "
                f"columns {columns}"
            )
        for column, kind in (types or {}).items():
            if not isinstance(kind, str) or not kind.strip() or ";" in kind:
                # (the type is written into CREATE TABLE as it is)
                raise RuntimeJobError(f"PostgresSink: {kind!r} is not a SQL type ({column!r})")
        self.conninfo = conninfo
        self.table = table
        self.columns = columns
        self.types = types or {}
        self.name = name or table

    def __call__(
        self, batch: int, rows: list[dict[str, Any]], owner: SinkOwner | None = None
    ) -> None:
        """Insert ``rows`` of batch ``batch`` unless that batch is already in."""
        import psycopg

        cols = ", ".join(f"{c} {self.types.get(c, 'text')}" for c in self.columns)
        with psycopg.connect(self.conninfo) as conn, conn.transaction():
            conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} ({cols})")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS txstream_sink_batches "
                "(sink text, batch bigint, PRIMARY KEY (sink, batch))"
            )
            if owner is not None:
                self._claim(conn, owner)
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

    def target(self) -> tuple[str, ...]:
        """What it writes to: two outputs of one job must not share it (``Job.sink`` checks)."""
        return ("postgres", self.conninfo, self.name)

    def declare(self, output: str, columns: dict[str, str]) -> None:
        """Check the sink's columns against output ``output``'s declared ones (``Job.sink``).

        A sink column the output does not declare would be written NULL in
        every row (a misspelt name): a one-line :class:`RuntimeJobError`.
        """
        missing = [c for c in self.columns if c not in columns]
        if missing:
            raise RuntimeJobError(
                f"PostgresSink {self.table}: column(s) {', '.join(missing)} are not in output "
                f"{output!r} ({', '.join(columns)}); every row would hold NULL there: name "
                "the output's columns"
            )

    def _claim(self, conn: Any, owner: SinkOwner) -> None:
        """Claim the sink's name for ``owner`` in the delivery's transaction, or refuse it."""
        conn.execute(
            "CREATE TABLE IF NOT EXISTS txstream_sink_owners "
            "(sink text PRIMARY KEY, owner text, described text)"
        )
        # (a name written before claims: its ledger rows are taken as this owner's)
        conn.execute(
            "INSERT INTO txstream_sink_owners VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            (self.name, owner.key, owner.text),
        )
        found = conn.execute(
            "SELECT owner, described FROM txstream_sink_owners WHERE sink = %s", (self.name,)
        ).fetchone()
        if found[0] != owner.key:
            raise _foreign(
                f"PostgresSink {self.table}: sink name {self.name!r}",
                f"{found[1]} (not {owner.text})",
                f"give this sink a name= of its own per job and output, or delete "
                f"{self.name!r} from txstream_sink_batches and txstream_sink_owners to "
                "deliver anew",
            )


class DeltaSink:
    """Appends an output's rows to a Delta Lake table (delta-rs), exactly once per batch id.

    Each batch is one Delta commit carrying an application transaction (the
    ``txn`` action: app id, version = batch id), the way Spark's own Delta sink
    uses ``txnAppId``/``txnVersion``; a batch whose id is not above the table's
    recorded version for the app id is skipped, so a batch re-delivered after a
    crash is written once.  ``app_id`` defaults to ``txstream:<name>`` with
    ``name`` the table's folder name: two jobs appending to one table must give
    different names.  ``schema`` (a ``pyarrow.Schema``) fixes the columns;
    without it the first batch's inferred schema is used and a later batch that
    does not fit is refused in one line, before anything is written.

    >>> import txstream as tx
    >>> tx.DeltaSink(42)
    Traceback (most recent call last):
    txstream.spark.runtime.errors.RuntimeJobError: DeltaSink: the path must be a str or a Path,
    not int
    """

    background = True
    """It may run off the batch's thread (see :class:`BackgroundDelivery`)."""
    claims = True
    """Its app id is one output's of one store (see :class:`SinkOwner`)."""

    def __init__(self, path: str | Path, schema: Any = None, name: str | None = None) -> None:
        if not isinstance(path, (str, Path)):
            raise RuntimeJobError(
                f"DeltaSink: the path must be a str or a Path, not {type(path).__name__}"
            )
        if not str(path).strip():
            raise RuntimeJobError("DeltaSink: an empty path; name a folder for the table")
        if isinstance(path, Path) or "://" not in path:
            local = Path(path)
            if local.exists() and not local.is_dir():
                raise RuntimeJobError(f"DeltaSink: {path} is a file; give a folder for the table")
        self.path = str(path)
        self.schema = schema
        self.name = name or Path(str(path).rstrip("/")).name
        self.app_id = f"txstream:{self.name}"

    def declare(self, output: str, columns: dict[str, str]) -> None:
        """Take output ``output``'s declared columns as the table's schema (``Job.sink`` calls it).

        A sink built without ``schema`` takes the output's; one built with a
        schema, or a table that exists already, must have the output's column
        names in its order and types that hold its values, else a one-line
        :class:`RuntimeJobError` before the job starts.
        """
        import pyarrow as pa
        from deltalake import DeltaTable

        declared = arrow_schema(columns)
        for what, schema in (("the sink's schema", self.schema), ("the table", None)):
            if what == "the table":
                if not DeltaTable.is_deltatable(self.path):
                    continue
                schema = pa.schema(DeltaTable(self.path).schema().to_arrow())
            if schema is None:
                continue
            got = [(f.name, str(f.type)) for f in schema]
            want = [(f.name, str(f.type)) for f in declared]
            if [n for n, _ in got] != [n for n, _ in want] or not all(
                _holds(g, w) for (_, g), (_, w) in zip(got, want, strict=True)
            ):
                raise RuntimeJobError(
                    f"DeltaSink {self.path}: {what} ({', '.join(f'{n} {t}' for n, t in got)}) "
                    f"does not fit output {output!r} "
                    f"({', '.join(f'{n} {t}' for n, t in want)})"
                )
        if self.schema is None:
            self.schema = declared

    def _table(self, rows: list[dict[str, Any]]) -> Any:
        """The batch as an Arrow table in the sink's schema (or a one-line error)."""
        import pyarrow as pa

        if self.schema is not None:
            # (from_pylist with a schema dropped a row's other columns without a word)
            _no_other_columns(self.path, rows, self.schema.names, "the sink's schema")
        try:
            if self.schema is None:
                return arrow_table(rows)
            return pa.Table.from_pylist(rows, schema=self.schema)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise TxStreamError(
                f"DeltaSink {self.path}: a row does not fit the schema: {exc}"
            ) from None

    def __call__(
        self, batch: int, rows: list[dict[str, Any]], owner: SinkOwner | None = None
    ) -> None:
        """Append ``rows`` as one Delta commit unless batch ``batch`` is already in."""
        import pyarrow as pa
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

        existing: Any = None
        if DeltaTable.is_deltatable(self.path):
            existing = DeltaTable(self.path)
            seen = existing.transaction_version(self.app_id)
            if seen is not None and owner is not None:
                self._check_claim(existing, owner)
            if seen is not None and batch <= seen:
                return  # delivered before a crash: skip
        if not rows and existing is None and self.schema is None:
            return  # nothing to infer a schema from yet
        data = self._table(rows)
        if existing is not None:
            want = pa.schema(existing.schema().to_arrow())
            if [(f.name, f.type) for f in want] != [(f.name, f.type) for f in data.schema]:
                if not rows:
                    data = want.empty_table()
                else:
                    # (select() dropped a batch's other columns without a word)
                    _no_other_columns(self.path, rows, want.names, "the table")
                    for field in want:  # a column no row of the batch has: null
                        if field.name not in data.column_names and field.nullable:
                            data = data.append_column(field.name, pa.nulls(len(data)))
                    try:
                        data = data.select(want.names).cast(want)
                    except (pa.ArrowException, KeyError, ValueError) as exc:
                        raise TxStreamError(
                            f"DeltaSink {self.path}: batch {batch} does not fit the table's "
                            f"schema ({want}): {exc}"
                        ) from None
        apps = [Transaction(self.app_id, batch)]
        meta: dict[str, str] = {}
        if owner is not None:
            apps.append(Transaction(f"{self.app_id}@{owner.key}", batch))
            meta = {
                "txstream.app": self.app_id,
                "txstream.owner": owner.key,
                "txstream.of": owner.text,
            }
        write_deltalake(
            self.path,
            data,
            mode="append",
            commit_properties=CommitProperties(app_transactions=apps, custom_metadata=meta),
        )

    def target(self) -> tuple[str, ...]:
        """What it writes to: two outputs of one job must not share it (``Job.sink`` checks)."""
        local = "://" not in self.path
        return ("delta", str(Path(self.path).resolve()) if local else self.path, self.app_id)

    def _check_claim(self, table: Any, owner: SinkOwner) -> None:
        """Refuse, in one line, an app id whose batches another owner wrote.

        Each commit records its owner as a second app transaction
        (``<app id>@<owner>``) and in its commit info; the first is what a
        restart of the same owner finds at once, the second names the other
        owner when there is one (the history is read only then).
        """
        if table.transaction_version(f"{self.app_id}@{owner.key}") is not None:
            return
        for commit in table.history():
            if commit.get("txstream.app") == self.app_id:
                if commit.get("txstream.owner") != owner.key:
                    raise _foreign(
                        f"DeltaSink {self.path}: app id {self.app_id!r}",
                        f"{commit.get('txstream.of', 'another store')} (not {owner.text})",
                        "give this sink a name= of its own per job and output (or delete "
                        "the table to write it anew)",
                    )
                return
        # (an app id written before claims: its batches are taken as this owner's)


def _no_other_columns(path: str, rows: list[dict[str, Any]], names: list[str], what: str) -> None:
    """Refuse, in one line, rows with a column that ``what`` (of columns ``names``) lacks."""
    known = set(names)
    other = [c for c in dict.fromkeys(c for row in rows for c in row) if c not in known]
    if other:
        raise TxStreamError(
            f"DeltaSink {path}: a row does not fit {what} ({', '.join(names)}): it has "
            f"column(s) {', '.join(map(str, other))}; nothing of the batch is written: declare "
            "the output's schema with every column, or write them to a new table"
        )


def _holds(have: str, need: str) -> bool:
    """Whether an Arrow column of type ``have`` is the declared ``need`` (strings: any kind)."""
    strings = ("string", "large_string", "string_view")
    return have == need or (have in strings and need in strings)
