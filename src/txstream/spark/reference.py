"""Count- and time-based windows over stream-table joins, on executors against pinned rows.

The Spark half of a consistent continuous query (``txstream.jobs.cq`` is the
other half, which decides *which* table version the rows are and whether the
windows they produce commit).  For one micro-batch:

* the caller *pins* each referenced table: the rows a strategy lets the batch
  see, each with the commit timestamp of its version (``__v``) and the instant
  it was read (``__seen``), shipped to the executors as a broadcast relation
  (:func:`pin`);
* :func:`evaluate` joins the events (the batch's, after the ones carried from
  earlier batches) with the pinned rows (left outer: an event whose key has no
  row read an absent row, version 0), applies the selection, numbers the
  selected events in arrival order and assigns every event to the count-based
  windows it belongs to, then aggregates each *complete* window: its value,
  and the read set of every event in its span (the events the selection
  dropped included, so that a phantom is a read too).  Only the complete
  windows and the events the next window still needs (the *carry*) come back
  to the driver, in one Spark job.

Window semantics (Oyamada et al., as :class:`txstream.cq.CQEngine` runs them):
window ``n`` starts at a raw event (its LWM) and holds the first ``r`` selected
events from there; the next window starts at the ``s``-th selected event of
window ``n`` (``s < r``) or right after its last event (``s == r``).  A
time-based window ``k`` (:class:`TimeWindow`) spans the raw events whose time
lies in ``[t0 + k*s, t0 + k*s + r)``, ``t0`` being the first event's time; it
is complete once an event at or after its end has arrived, is emitted even when
empty, aggregates its selected events and reads what all its events read; its
LWM is its first event's order value (an empty window's: the next event's).

With ``rejoin=True`` the carried events are raw and are joined again with this
batch's pinned rows (a window never mixes versions).  With ``rejoin=False``
they keep the columns they were joined with in their own batch: what Spark's
stream-static join does by itself (the baseline).

Importing this module does not import pyspark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from txstream.errors import TxStreamError
from txstream.spark.sql import literal

Columns = dict[str, list[Any]]
"""Rows by column: ``{name: [value of row 0, value of row 1, ...]}``."""

AGGREGATES = ("count", "sum", "avg", "min", "max")
"""The window aggregates, by the names Spark SQL gives them."""


@dataclass(frozen=True)
class Join:
    """A stream-table equi-join: ``on`` (a column of the stream or of an earlier join) = key."""

    table: str
    on: str
    schema: str  # DDL of the table's columns the query uses (the key excluded)
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class CountWindow:
    """Count-based window: range ``r`` and slide ``s`` (1 <= s <= r) over selected events."""

    r: int
    s: int
    aggregate: str
    column: str | None  # None for count


@dataclass(frozen=True)
class TimeWindow:
    """Time-based window: range ``r`` and slide ``s`` (0 < s <= r) in units of column ``time``.

    Window ``k`` holds the events whose ``time`` lies in ``[t0 + k*s, t0 + k*s + r)``,
    ``t0`` being the first event's time (``time`` is a stream column, non-decreasing
    in the order column).
    """

    r: float
    s: float
    aggregate: str
    column: str | None  # None for count
    time: str


@dataclass
class Evaluated:
    """What one evaluation brought back to the driver."""

    columns: dict[str, list[Any]] = field(default_factory=dict)
    """The complete windows by column, in order (:attr:`windows` has them by window):
    ``window``, ``value``, ``lwm``, ``lo``, ``hi``, ``at`` and with ``read_sets``
    ``reads``; the driver reads them without making an object per window."""
    carry: Columns = field(default_factory=dict)
    """The events the next window needs, by column (raw, or joined without ``rejoin``)."""
    t0: float | None = None
    """Time-based windows: the first event's time (None while no event has come)."""
    keys: list[Any] = field(default_factory=list)
    """With ``watch``: per join, an Arrow list array of the keys each grouped row read
    whose version was current when pinned (a window's ``at`` is its row)."""

    @property
    def windows(self) -> list[dict[str, Any]]:
        """Complete windows in order, one dict each (made on demand).

        ``window`` (0-based within the batch; time-based: counted from ``first``),
        ``value``, ``lwm`` (order value of its first event), ``lo`` and ``hi``
        (the newest version it read; the last instant all it read was known
        current when pinned), ``at`` (its row in :attr:`keys`, None for an empty
        time window) and, with ``read_sets``, ``reads``: one list per join of
        ``(key, version, seen)``; a read of a key without a pinned row is
        ``(key, 0, None)``: the caller knows when it pinned.
        """
        names = list(self.columns)
        rows = zip(*(self.columns[n] for n in names), strict=True)
        return [dict(zip(names, row, strict=True)) for row in rows]

    def __len__(self) -> int:
        """The number of complete windows."""
        return len(self.columns.get("window", ()))


def ddl_names(schema: str) -> tuple[str, ...]:
    """The column names of a DDL schema string (``"price long, cat long"``)."""
    return tuple(_parsed(schema).names)


NEVER = 1 << 62
"""``__until`` of a row version still current when it was pinned (no later change known)."""


def pin_schema(events: Any, joins: Sequence[Join], i: int) -> Any:
    """The Spark schema of join ``i``'s pinned rows.

    ``__k`` (the key, typed like the column it is joined on), the join's
    columns, ``__v`` (the commit timestamp of the row's version), ``__seen``
    (the instant it was pinned), ``__until`` (the last instant at which that
    version was known current when pinned: :data:`NEVER` if it still was) and
    ``__p`` (false for a deleted or not yet inserted key: an absent row, whose
    version is the deletion's or 0).
    """
    from pyspark.sql.types import BooleanType, LongType, StructField, StructType

    join = joins[i]
    fields = [StructField("__k", _type_of(events, joins[:i], join.on))]
    fields += _parsed(join.schema).fields
    fields += [
        StructField("__v", LongType()),
        StructField("__seen", LongType()),
        StructField("__until", LongType()),
        StructField("__p", BooleanType()),
    ]
    return StructType(fields)


def arrow_rows(join: Join, schema: Any, rows: Columns) -> Any:
    """``rows`` (by column, named as in ``schema``) as an Arrow table of ``schema``.

    A key or value of another type than its column is one line naming the
    table, the row and the types (pyarrow's own error reached the query cut to
    "Traceback (most recent call last):").
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return pa.table(
            {f.name: rows[f.name] for f in schema.fields}, schema=to_arrow_schema(schema)
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise TxStreamError(
            _mistyped(join, schema.fields, rows)
            or f"table {join.table!r}: {str(exc).splitlines()[0]}"
        ) from None


PINNED = ("__k", "__v", "__seen", "__until", "__p")
"""The pinned rows' own columns; join ``i``'s DataFrame names them with suffix ``i``."""


def pin_frame(events: Any, schema: Any, table: Any, i: int) -> Any:
    """An Arrow table of join ``i``'s pinned rows (:func:`arrow_rows`) as a DataFrame.

    Its own columns are named for join ``i`` (``__k{i}``, ``__v{i}``, ...), as
    :func:`evaluate` joins them (renamed here in Arrow: no Spark call).
    """
    from pyspark.sql.types import StructField, StructType

    def named(name: str) -> str:
        return f"{name}{i}" if name in PINNED else name

    fields = [StructField(named(f.name), f.dataType, f.nullable) for f in schema.fields]
    renamed = table.rename_columns([named(n) for n in table.column_names])
    return events.sparkSession.createDataFrame(renamed, StructType(fields))


def pin(events: Any, joins: Sequence[Join], i: int, rows: Columns) -> Any:
    """Join ``i``'s pinned rows as a DataFrame (columns: :func:`pin_schema`, see :func:`pin_frame`).

    ``rows`` holds those columns by name.  Built over Arrow, so shipping a
    10,000-row table costs milliseconds.
    """
    schema = pin_schema(events, joins, i)
    return pin_frame(events, schema, arrow_rows(joins[i], schema, rows), i)


def _mistyped(join: Join, fields: Sequence[Any], rows: Columns) -> str | None:
    """The first key or value of the pinned rows that is not of its column's Spark type."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    for f in fields:
        kind = to_arrow_type(f.dataType)
        for n, value in enumerate(rows[f.name]):
            try:
                pa.array([value], type=kind)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                what = f"{type(value).__name__} {value!r:.40}"
                want = f.dataType.simpleString()
                if f.name == "__k":
                    return (
                        f"table {join.table!r}: key {value!r:.40} is {type(value).__name__}, not "
                        f"{want} like column {join.on!r} it is joined on; give the table keys "
                        f"of that type (or cast the column)"
                    )
                return (
                    f"table {join.table!r}: column {f.name!r} of row {rows['__k'][n]!r:.40} is "
                    f"{what}, not {want} as the join's schema says"
                )
    return None


def numeric(events: Any, column: str) -> bool:
    """Whether ``column`` of the stream has a numeric Spark type."""
    from pyspark.sql.types import NumericType

    return isinstance(events.schema[column].dataType, NumericType)


def orderable(events: Any, column: str) -> str | None:
    """None when ``column`` sorts in arrival order (a number, timestamp or date); else its type."""
    from pyspark.sql.types import DateType, NumericType, TimestampNTZType, TimestampType

    kind = events.schema[column].dataType
    if isinstance(kind, NumericType | TimestampType | TimestampNTZType | DateType):
        return None
    return str(kind.simpleString())


def key_values(events: Any, columns: Sequence[str]) -> dict[str, list[Any]]:
    """The distinct values of ``columns`` in the batch's events (one Spark job).

    What a locking strategy must lock before it reads: the keys the batch joins on.
    """
    if not columns:
        return {}
    from pyspark.sql import functions as F

    aggs = [F.collect_set(c).alias(c) for c in columns]
    row = events.agg(*aggs).toArrow().to_pylist()[0]
    return {c: list(row[c] or []) for c in columns}


def check_plan(
    events: Any, joins: Sequence[Join], condition: str | None, column: str | None
) -> str | None:
    """Why ``condition`` or the aggregated ``column`` does not fit the joined columns.

    None when they fit.  Spark analyses the condition on an empty DataFrame of
    the stream's and the joins' columns (no Spark job runs), so a bad query
    fails in one line before the stream starts instead of in a micro-batch.
    """
    from pyspark.sql.types import NumericType, StructType

    fields = list(events.schema.fields)
    for join in joins:
        fields += _parsed(join.schema).fields
    empty = events.sparkSession.createDataFrame([], StructType(fields))
    if condition is not None:
        try:
            empty.where(condition)
        except Exception as exc:  # Spark's parse or analysis error
            first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
            return f"where {condition!r}: {first.strip()[:300]}"
    if column is not None:
        kind = empty.schema[column].dataType
        if not isinstance(kind, NumericType):
            return (
                f"window column {column!r} is {kind.simpleString()}, not a number; "
                "aggregate a numeric column (or use count)"
            )
    return None


def _parsed(schema: str) -> Any:
    from pyspark.sql.types import StructType, _parse_datatype_string

    try:
        parsed = _parse_datatype_string(schema)
    except Exception as exc:  # Spark's multi-line ParseException
        first = next((ln for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
        raise TxStreamError(f"not a schema: {schema!r} ({first.strip()[:200]})") from None
    if not isinstance(parsed, StructType):
        raise TxStreamError(f"not a schema: {schema!r} (expected e.g. 'price long, cat long')")
    return parsed


def _type_of(events: Any, earlier: Sequence[Join], column: str) -> Any:
    """The Spark type of ``column``: a column of the stream or of an earlier join."""
    if column in events.columns:
        return events.schema[column].dataType
    for join in earlier:
        parsed = _parsed(join.schema)
        if column in parsed.names:
            return parsed[column].dataType
    raise TxStreamError(f"no column {column!r} in the stream or an earlier join")


SMALL = 512
"""Rows up to which :func:`_frame` writes a frame of plain columns as SQL literals."""


def _frame(like: Any, schema: Any, rows: Columns) -> Any:
    """``rows`` (by column) as a DataFrame of ``schema`` in ``like``'s session.

    A few rows of numbers, strings and booleans (the carry, usually) become one
    ``SELECT ... FROM VALUES`` statement: one call to Spark, where building a
    DataFrame from Arrow takes some thirty.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    small = _values(schema, rows)
    if small is not None:
        return like.sparkSession.sql(small)
    arrow = pa.table({f.name: rows[f.name] for f in schema.fields}, schema=to_arrow_schema(schema))
    return like.sparkSession.createDataFrame(arrow, schema)


def _values(schema: Any, rows: Columns) -> str | None:
    """``rows`` as a ``SELECT ... FROM VALUES`` statement; None if too many or not plain."""
    import math

    from pyspark.sql.types import (
        BooleanType,
        ByteType,
        DoubleType,
        FloatType,
        IntegerType,
        LongType,
        ShortType,
        StringType,
    )

    whole = (LongType, IntegerType, ShortType, ByteType)
    fields = schema.fields
    n = len(rows[fields[0].name]) if fields else 0
    if not fields or not 0 < n <= SMALL:
        return None
    columns = []
    for f in fields:
        kind, values = f.dataType, rows[f.name]
        if isinstance(kind, whole):
            ok = all(v is None or (type(v) is int) for v in values)
            text = [literal(v) for v in values]
        elif isinstance(kind, DoubleType | FloatType):
            ok = all(v is None or type(v) in (int, float) for v in values)
            text = [
                "NULL" if v is None else repr(float(v)) if math.isfinite(v) else f"'{v}'"
                for v in values
            ]
        elif isinstance(kind, StringType):
            ok = all(v is None or type(v) is str for v in values)
            text = [literal(v) for v in values]
        elif isinstance(kind, BooleanType):
            ok = all(v is None or type(v) is bool for v in values)
            text = [literal(v) for v in values]
        else:
            return None
        if not ok:
            return None
        columns.append(text)
    names = [f"c{i}" for i in range(len(fields))]
    tuples = ", ".join("(" + ", ".join(row) + ")" for row in zip(*columns, strict=True))
    casts = ", ".join(
        f"CAST({c} AS {f.dataType.simpleString()}) AS `{f.name}`"
        for c, f in zip(names, fields, strict=True)
    )
    return f"SELECT {casts} FROM VALUES {tuples} AS t({', '.join(names)})"


def evaluate(
    events: Any,
    carry: Columns,
    pinned: Sequence[Any],
    joins: Sequence[Join],
    order: str,
    condition: str | None,
    window: CountWindow | TimeWindow,
    rejoin: bool,
    *,
    first: int = 0,
    t0: float | None = None,
    read_sets: bool = True,
    watch: bool = False,
    view: str = "__txstream_cq",
) -> Evaluated:
    """Join, select and window the events on executors; bring back complete windows and carry.

    Each window comes back with ``lo`` and ``hi``, computed on the executors:
    the newest version it read and the last instant at which all it read was
    known current when pinned (:data:`NEVER` if it still was).  ``read_sets``
    also brings back every read (``reads``, per-read work on the driver);
    ``watch`` brings back, per window and join, the keys of the reads still
    current when pinned (:attr:`Evaluated.keys`), so that the caller can learn,
    vectorized, which windows read a row changed since (:func:`touched`).
    ``view`` names the temporary view the aggregation reads (in the batch's
    session: give each query its own).

    ``events``: this batch's events (a DataFrame); ``carry``: the events carried
    from earlier batches, by column (raw when ``rejoin``, else joined, as
    :attr:`Evaluated.carry` gave them); ``pinned``: one DataFrame per join from
    :func:`pin`.  Time-based windows only: ``first`` is the number of the first
    window not emitted yet (window numbers count from ``t0``, the first event's
    time, None before any event: then this batch's first event gives it).
    """
    joined, raw_columns, joined_columns = _joined(events, carry, pinned, joins, rejoin)
    keep_columns = raw_columns if rejoin else joined_columns
    present = " AND ".join(f"coalesce(__p{i}, FALSE)" for i in range(len(joins))) or "TRUE"
    selected = f"({present})" + (f" AND ({condition})" if condition else "")
    if isinstance(window, TimeWindow):
        return _evaluate_time(
            events,
            joined,
            selected,
            joins,
            order,
            window,
            keep_columns,
            first,
            t0,
            read_sets,
            watch,
            view,
        )
    r, s = window.r, window.s
    ordered = f"ORDER BY `{order}` ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
    # one SQL statement over the joined rows' view, not three selectExpr (each of their
    # expressions is a call to the JVM: the driver's cost per batch)
    p = (
        f"SELECT *, CAST(sum(CAST(__sel AS INT)) OVER ({ordered}) AS BIGINT) AS __c, "
        f"CAST(count_if(__sel) OVER () AS BIGINT) AS __m FROM "
        f"(SELECT *, coalesce({selected}, FALSE) AS __sel FROM {view}) AS __s1"
    )
    # complete windows K, the next window's first selected position P = K*s
    k = f"if(__m >= {r}, (__m - {r}) DIV {s} + 1, 0)"
    # an unselected event after c selected ones lies between positions c-1 and c
    lo = f"greatest(0, CAST(ceil((if(__sel, __c - 1, __c) - {r} + 1) / {s}) AS BIGINT))"
    hi = f"least({k} - 1, CAST(if(__sel OR __c > 0, floor((__c - 1) / {s}), 0) AS BIGINT))"
    keep_unselected = f"__c >= {k} * {s} + {1 if s < r else 0}"
    kept = f"{k} = 0 OR if(__sel, __c - 1 >= {k} * {s}, {keep_unselected})"
    w = (
        f"(SELECT *, explode(concat(if({lo} <= {hi}, sequence({lo}, {hi}), array()), "
        f"if({kept}, array(CAST(-1 AS BIGINT)), array()))) AS __w FROM ({p}) AS __s2) AS __s3"
    )
    got, keys, carried = _grouped(
        joined, joins, order, window, keep_columns, read_sets, watch, view, source=w
    )
    out = Evaluated(carry={c: [] for c in keep_columns}, keys=keys)
    skip = 0
    if carried is not None:
        out.carry = _carried(carried, order, keep_columns)
        skip = 1  # the carry's grouped row comes first
    ws = got["__w"][skip:]
    out.columns = {
        "window": ws,
        "value": got["value"][skip:],
        "lwm": got["lwm"][skip:],
        "lo": got["lo"][skip:],
        "hi": got["hi"][skip:],
        "at": list(range(skip, skip + len(ws))),
    }
    if read_sets:
        out.columns["reads"] = _reads(got, len(joins), skip)
    return out


def _joined(
    events: Any, carry: Columns, pinned: Sequence[Any], joins: Sequence[Join], rejoin: bool
) -> tuple[Any, list[str], list[str]]:
    """The events (after the carried ones) joined with the pinned rows, and the column names."""
    from pyspark.sql import functions as F

    raw_columns = list(events.columns)
    has_carry = bool(carry) and bool(next(iter(carry.values())))
    if rejoin and has_carry:
        events = events.unionByName(_frame(events, events.schema, carry))
    joined = events
    for i, rows in enumerate(pinned):
        on = joins[i].on
        joined = joined.join(F.broadcast(rows), F.expr(f"`{on}` = __k{i}"), "left")
        joined = joined.drop(f"__k{i}")
    joined_columns = list(joined.columns)
    if not rejoin and has_carry:
        joined = joined.unionByName(_frame(events, joined.schema, carry))
    return joined, raw_columns, joined_columns


def _grouped(
    w: Any,
    joins: Sequence[Join],
    order: str,
    window: CountWindow | TimeWindow,
    keep_columns: Sequence[str],
    read_sets: bool,
    watch: bool,
    view: str,
    extra: Sequence[str] = (),
    source: str | None = None,
) -> tuple[dict[str, list[Any]], list[Any], list[Any] | None]:
    """One row per window id ``__w`` (-1: the carry), in window order (one Spark job).

    ``w`` has a row per event and window id; or, with ``source``, ``w`` is the
    view ``view`` names and ``source`` the SQL (a subquery over it) of those rows.

    By column: a few numbers per window (``__w``, ``lwm``, ``value``, ``lo``,
    ``hi`` and ``extra``), each window's reads only with ``read_sets``; with
    ``watch``, the second value holds one Arrow list array per join (a list of
    keys per row), left in Arrow; the third, the carry's events (None: none).
    """
    # one Spark call per aggregate ("expr AS name"): the driver's cost per batch
    aggs = [f"min(`{order}`) AS lwm", f"{_aggregate(window)} AS value", *extra]
    versions = ", ".join(f"coalesce(__v{i}, 0)" for i in range(len(joins)))
    untils = ", ".join(f"coalesce(__until{i}, {NEVER})" for i in range(len(joins)))
    aggs.append(f"max(if(__w >= 0, greatest({versions}, 0), 0)) AS lo")
    aggs.append(f"min(if(__w >= 0, least({untils}, {NEVER}), {NEVER})) AS hi")
    for i, join in enumerate(joins):
        if read_sets:
            aggs.append(
                f"collect_list(if(__w >= 0, struct(`{join.on}` AS k, coalesce(__v{i}, 0) "
                f"AS v, __seen{i} AS seen), NULL)) AS reads{i}"
            )
        if watch:  # the keys whose version was current when pinned (null keys read nothing)
            aggs.append(
                f"collect_list(if(__w >= 0 AND coalesce(__until{i}, {NEVER}) >= {NEVER}, "
                f"`{join.on}`, NULL)) AS keys{i}"
            )
    inner = ", ".join(f"`{c}`" for c in keep_columns)
    aggs.append(f"collect_list(if(__w < 0, struct({inner}), NULL)) AS carry")
    # one SQL statement over a view: two Spark calls, where the DataFrame API makes a
    # few per aggregate (each expression and each list element is a call to the JVM)
    w.createOrReplaceTempView(view)
    rows = view if source is None else source
    table = w.sparkSession.sql(f"SELECT __w, {', '.join(aggs)} FROM {rows} GROUP BY __w").toArrow()
    table = table.take(_argsort(table.column("__w")))
    keys = [table.column(f"keys{i}").combine_chunks() for i in range(len(joins)) if watch]
    # by column: Arrow converts each column at once (far cheaper than row by row)
    names = [n for n in table.column_names if n != "carry" and not n.startswith("keys")]
    columns = {n: table.column(n).to_pylist() for n in names}
    carried = None
    if columns["__w"] and columns["__w"][0] < 0:  # the carry's row comes first
        carried = table.column("carry")[0].as_py()
    return columns, keys, carried


def _carried(carried: list[Any], order: str, keep_columns: Sequence[str]) -> Columns:
    """The carry group's events by column, in order."""
    rows = sorted(carried, key=lambda e: e[order])
    return {c: [e[c] for e in rows] for c in keep_columns}


def _reads(got: dict[str, list[Any]], joins: int, skip: int) -> list[list[list[Any]]]:
    """``read_sets``: per window, per join, its reads as ``(key, version, seen)``."""
    per_join = [got[f"reads{i}"][skip:] for i in range(joins)]
    return [
        [[(x["k"], x["v"], x["seen"]) for x in reads] for reads in window]
        for window in zip(*per_join, strict=True)
    ]


def _argsort(column: Any) -> Any:
    import pyarrow.compute as pc

    return pc.sort_indices(column)


def touched(keys: Any, changes: dict[Any, int]) -> dict[int, int]:
    """Per grouped row: the earliest change in ``changes`` (key -> commit timestamp) it read.

    ``keys`` is one join's list array from :attr:`Evaluated.keys`; rows that
    read no changed key are left out.  Vectorized: Python looks only at the
    reads of changed keys.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if not changes or len(keys) == 0:
        return {}
    flat = pc.list_flatten(keys)
    parents = pc.list_parent_indices(keys)
    try:
        wanted = pa.array(list(changes), type=flat.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # keys of another type: none
        wanted = pa.array([k for k in changes if fits(k, flat.type)], type=flat.type)
    hits = pc.indices_nonzero(pc.is_in(flat, value_set=wanted)).to_pylist()
    out: dict[int, int] = {}
    if not hits:
        return out
    found = flat.take(pa.array(hits)).to_pylist()
    rows = parents.take(pa.array(hits)).to_pylist()
    for key, row in zip(found, rows, strict=True):
        ts = changes[key]
        if ts < out.get(row, NEVER):
            out[row] = ts
    return out


def arrow_type(kind: Any) -> Any:
    """The Arrow type of a Spark type."""
    from pyspark.sql.pandas.types import to_arrow_type

    return to_arrow_type(kind)


def fits(value: Any, kind: Any) -> bool:
    """Whether ``value`` is a value of Arrow type ``kind``."""
    import pyarrow as pa

    try:
        pa.array([value], type=kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return False
    return True


def _evaluate_time(
    events: Any,
    joined: Any,
    selected: str,
    joins: Sequence[Join],
    order: str,
    window: TimeWindow,
    keep_columns: Sequence[str],
    first: int,
    t0: float | None,
    read_sets: bool,
    watch: bool,
    view: str,
) -> Evaluated:
    """Time-based windows: window k holds the events whose time lies in [t0 + k*s, t0 + k*s + r).

    Window k is complete once an event at or after its end has arrived; the
    latest event is always carried (s <= r), so the latest time seen is that of
    the events at hand.  Every window from ``first`` up to the last complete one
    is emitted, empty ones included; the carry is every event of a window not
    complete yet.
    """
    time = f"`{window.time}`"
    out = Evaluated(carry={c: [] for c in keep_columns}, t0=t0)
    if t0 is None:  # the query's first events: the first one's time is t0 (time follows order)
        row = events.selectExpr(f"min_by({time}, `{order}`) AS t0").toArrow().to_pylist()[0]
        if row["t0"] is None:
            return out
        t0 = out.t0 = row["t0"]
    # Window k is [t0 + k*s, t0 + k*s + r) computed in doubles as written (as CQEngine
    # does): a quotient's floor gives k up to one, the bounds themselves decide (else an
    # event at 1.3 from t0 = 0.3 fell in [0.3, 1.3), (1.3 - 0.3) / 1 being 0.999...).
    start, r, s = (f"CAST({x!r} AS DOUBLE)" for x in (float(t0), window.r, window.s))

    def begin(k: str) -> str:  # where window k starts
        return f"({start} + CAST({k} AS DOUBLE) * {s})"

    def end(k: str) -> str:  # where window k ends
        return f"({begin(k)} + {r})"

    t = "__t"
    p = (
        joined.selectExpr(
            "*",
            f"coalesce({selected}, FALSE) AS __sel",
            f"CAST({time} AS DOUBLE) AS {t}",
            f"max(CAST({time} AS DOUBLE)) OVER () AS __last",
        )
        .selectExpr(
            "*",
            f"if(__last - {start} >= {r}, CAST(floor((__last - {start} - {r}) / {s}) AS BIGINT) "
            "+ 1, CAST(0 AS BIGINT)) AS __K0",
            f"CAST(floor(({t} - {start}) / {s}) AS BIGINT) AS __h0",
            f"CAST(floor(({t} - {start} - {r}) / {s}) AS BIGINT) + 1 AS __l0",
        )
        .selectExpr(
            "*",
            # complete windows: 0 .. __K - 1 (an event at or after the end of each has arrived)
            f"__K0 - if(__K0 > 0 AND {end('__K0 - 1')} > __last, 1, 0) "
            f"+ if({end('__K0')} <= __last, 1, 0) AS __K",
            # the last window the event is in: the last that starts at or before it
            f"__h0 - if({begin('__h0')} > {t}, 1, 0) + if({begin('__h0 + 1')} <= {t}, 1, 0) "
            "AS __hi",
            # the first: the first that ends after it
            f"greatest(CAST({first} AS BIGINT), __l0 - if({end('__l0 - 1')} > {t}, 1, 0) "
            f"+ if({end('__l0')} <= {t}, 1, 0)) AS __lo",
        )
        .drop("__K0", "__h0", "__l0", t)
    )
    w = p.selectExpr(
        "*",
        "explode(concat(if(__lo <= least(__hi, __K - 1), sequence(__lo, least(__hi, __K - 1)), "
        "array()), if(__hi >= __K, array(CAST(-1 AS BIGINT)), array()))) AS __w",
    )
    got, out.keys, carried = _grouped(
        w, joins, order, window, keep_columns, read_sets, watch, view, ["max(__K) AS K"]
    )
    if carried is not None:
        out.carry = _carried(carried, order, keep_columns)
    reads = _reads(got, len(joins), 0) if read_sets else None
    found: dict[int, tuple[int, dict[str, Any]]] = {}
    complete = max([first, *got["K"]])
    for n, k in enumerate(got["__w"]):
        if k >= 0:
            row = {"value": got["value"][n], "lwm": got["lwm"][n]}
            row.update(lo=got["lo"][n], hi=got["hi"][n])
            if reads is not None:
                row["reads"] = reads[n]
            found[k] = (n, row)
    # an empty window's LWM: the first event from its start on (a later window's, or carried)
    later = out.carry[order][0] if out.carry.get(order) else None
    windows: list[dict[str, Any]] = []
    for k in range(complete - 1, first - 1, -1):
        got_row = found.get(k)
        if got_row is None:
            empty = 0.0 if window.aggregate == "count" else None
            none: dict[str, Any] = {"window": k - first, "value": empty, "lwm": later}
            none.update(lo=0, hi=NEVER, at=None)
            if read_sets:
                none["reads"] = [[] for _ in joins]
            windows.append(none)
            continue
        n, row = got_row
        windows.append({"window": k - first, **row, "at": n})
        later = row["lwm"]
    names = ["window", "value", "lwm", "lo", "hi", "at"] + (["reads"] if read_sets else [])
    out.columns = {c: [w[c] for w in reversed(windows)] for c in names}
    return out


def _aggregate(window: CountWindow | TimeWindow) -> str:
    """The SQL of the window's aggregate over its selected events."""
    if window.aggregate == "count":
        return "CAST(count_if(__w >= 0 AND __sel) AS DOUBLE)"
    column = f"`{window.column}`"
    return f"CAST({window.aggregate}(if(__w >= 0 AND __sel, {column}, NULL)) AS DOUBLE)"
