"""The contract of the partitioned transactional runtime.

A *job* declares tables, inputs, outputs, a transaction boundary and one
transaction function per input.  The runtime executes the job's transactions
the way H-Store/VoltDB and S-Store do: the state is split into ``P`` partitions
by a declared *partition value*; each partition executes its transactions one
after the other in the declared (arrival) order, with no lock manager.

Call order, for every micro-batch ``b`` (enforced by the runtime)::

    order   the batch's events get their arrival position (batch, order value,
            input, source position): the *declared order*, fixed before execution
    group   the boundary turns the ordered events into transactions (groups)
    phase 1 every partition runs its transactions in order; a multi-partition
            one runs at its home partition with the others' rows forwarded
            (``forward``, see :mod:`.forward`), or, deferring, a transaction on
            a partition value that an earlier multi-partition transaction of
            the batch touched is *deferred* (per-value chains)
    phase 2 one coordinator task runs the deferred transactions in order over the
            rows of the deferred values, shipped to it (only when any exist)
    phase 3 the owners take the coordinator's rows back (only after phase 2)
    commit  every partition's state delta, outputs and history for ``b`` are on
            disk; the driver writes the batch's commit marker

Invariants:

* a transaction function touches only rows whose partition value is one of its
  events' declared keys (:class:`UndeclaredKeyError` otherwise), so two
  transactions with disjoint keys commute and per-value order is enough for
  conflict-serializability in arrival order (CSAO, EDBT 2012 Def. 9);
* a transaction function is deterministic: a replayed batch (after a crash)
  produces the same state, outputs and history, which is what makes every
  effect exactly-once together with the commit marker;
* a transaction that raises is rolled back (its undo log) and reported with its
  input position; when its events span partitions, the batch is re-executed
  with the transaction aborted everywhere (aborts are rare; no coordination is
  paid when there are none).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter
from typing import Any, Protocol

from txstream.spark.runtime.errors import (  # (re-exported: imported from here before)
    DuplicateKeyError as DuplicateKeyError,
)
from txstream.spark.runtime.errors import (
    MissingRowError as MissingRowError,
)
from txstream.spark.runtime.errors import (
    RuntimeJobError as RuntimeJobError,
)
from txstream.spark.runtime.errors import (
    SchemaError as SchemaError,
)
from txstream.spark.runtime.errors import (
    TransactionAborted as TransactionAborted,
)
from txstream.spark.runtime.errors import (
    UndeclaredKeyError as UndeclaredKeyError,
)

Row = dict[str, Any]
Key = Any
"""A table key or partition value: a scalar (int, str, bool) or a tuple of them."""


_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "int": (int,),
    "integer": (int,),
    "long": (int,),
    "bigint": (int,),
    "double": (float, int),
    "float": (float, int),
    "boolean": (bool,),
    "bool": (bool,),
}


_BOOLS = ("boolean", "bool")

LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
"""The range of Spark's ``long`` (and of Arrow's int64, pandas' and Delta's)."""

_LONGS = frozenset({"int", "integer", "long", "bigint"})


_KINDS = {"int": "long", "integer": "long", "bigint": "long", "float": "double", "bool": "boolean"}


def canonical_kind(kind: str) -> str:
    """A column type's one name among its synonyms (``bigint`` and ``int`` are ``long``).

    Synonyms take the same Python values, so a store does not tell them apart.
    """
    return _KINDS.get(kind, kind)


def parse_schema(schema: str) -> dict[str, str]:
    """Parse ``"a string, b long"`` into ``{"a": "string", "b": "long"}``."""
    if not isinstance(schema, str):
        raise RuntimeJobError(f"a schema is a string like 'id long, name string', not {schema!r}")
    if not schema.strip():
        # (it meant "no schema": nothing checked, where the user asked for checks)
        raise RuntimeJobError(
            "an empty schema declares no column: leave schema out for no checks, "
            "or write 'name type, ...'"
        )
    columns: dict[str, str] = {}
    for part in schema.split(","):
        words = part.split()
        if len(words) != 2 or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", words[0]):
            raise RuntimeJobError(
                f"bad column {part.strip()!r} in schema {schema!r}; write 'name type'"
            )
        name, kind = words[0], words[1].lower()
        if kind not in _TYPES:
            raise RuntimeJobError(
                f"unknown type {kind!r} of column {name!r}; "
                f"choose one of: {', '.join(sorted(_TYPES))}"
            )
        columns[name] = kind
    return columns


def check_row(what: str, columns: dict[str, str], row: Row) -> None:
    """Raise :class:`SchemaError` unless ``row`` has exactly ``columns`` with fitting types."""
    if not isinstance(row, dict):
        raise SchemaError(f"{what}: a row is a dict of columns, not {type(row).__name__}")
    if row.keys() != columns.keys():
        missing = [c for c in columns if c not in row]
        extra = [c for c in row if c not in columns]
        said = [f"missing columns {missing}"] if missing else []
        said += [f"unknown columns {extra}"] if extra else []
        raise SchemaError(f"{what}: {', '.join(said)}")
    for name, kind in columns.items():
        check_value(what, name, kind, row[name])


def check_value(what: str, name: str, kind: str, value: Any) -> None:
    """Raise :class:`SchemaError` unless ``value`` fits column ``name`` of type ``kind``."""
    if value is None:
        return
    # bool is an int in Python, but not a number column's value.
    if not isinstance(value, _TYPES[kind]) or (type(value) is bool and kind not in _BOOLS):
        raise SchemaError(f"{what}: column {name!r} is {kind}, got {value!r}")
    # A Python int has no bound; a long beyond 64 bits would come out of Spark's
    # readers as null, and out of read_output_arrow as an OverflowError.
    if kind in _LONGS and isinstance(value, int) and not LONG_MIN <= value <= LONG_MAX:
        raise SchemaError(
            f"{what}: column {name!r} is {kind}, a 64-bit integer; {value} is beyond its range"
        )


def exact_types(columns: dict[str, str] | None) -> dict[str, frozenset[type]] | None:
    """Per column, the exact types of the values that fit it (None included); None for None.

    The hot paths test ``type(value) in types`` inline and call
    :func:`check_value` only when that fails: a value of exactly one of these
    types always fits (``bool`` is listed only for boolean columns), and
    anything else (a subclass, a wrong type) gets the full check.
    """
    if columns is None:
        return None
    return {name: frozenset({*_TYPES[kind], type(None)}) for name, kind in columns.items()}


def check_key(what: str, spec: TableSpec, key: Key) -> None:
    """Raise :class:`SchemaError` when ``key`` does not fit the types of ``spec``'s key columns.

    Every verb that takes a key (``read``, ``update``, ``increment``,
    ``delete``) checks it, after the cheap test :meth:`TableSpec.key_fits`: a
    key of another type (``"5"`` for a long column) never finds a row, so
    without this a typed table would answer "no row" (``MissingRowError``) for
    every such key, and a ``True`` or ``1.0`` would find the row of ``1``.
    """
    if spec.columns is None:
        return
    if len(spec.key) > 1 and (not isinstance(key, tuple) or len(key) != len(spec.key)):
        raise SchemaError(
            f"{what} by key: the key columns are {list(spec.key)}, a tuple of "
            f"{len(spec.key)} values; got {key!r}"
        )
    values = key if len(spec.key) > 1 else (key,)
    for name, value in zip(spec.key, values, strict=True):
        check_value(f"{what} by key", name, spec.columns[name], value)


def check_partition_value(what: str, spec: TableSpec, value: Key) -> None:
    """Raise :class:`SchemaError` when ``value`` does not fit ``spec``'s ``partition_by`` types.

    What ``scan`` checks, as :func:`check_key` is for the verbs that take a key.
    """
    if spec.columns is None:
        return
    names = spec.partition_by
    values = value if len(names) > 1 and type(value) is tuple else (value,)
    for name, part in zip(names, values, strict=False):
        check_value(f"{what} by partition value", name, spec.columns[name], part)


def table_spec(job: JobSpec, table: str) -> TableSpec:
    """The declared table ``table``; :class:`SchemaError` naming the tables when there is none."""
    spec = job.tables.get(table)
    if spec is None:
        raise SchemaError(f"unknown table {table!r}; tables: {', '.join(job.tables)}")
    return spec


def duplicate_key(table: str, key: Key) -> DuplicateKeyError:
    """The error of ``insert`` of a key that exists (both engines raise this one)."""
    return DuplicateKeyError(f"insert into {table}: key {key!r} exists")


def missing_row(what: str, key: Key) -> MissingRowError:
    """The error of ``what`` (``update of t``, ``delete from t``...) on a key without a row."""
    return MissingRowError(f"{what}: no row with key {key!r}")


def keyed_values(table: str) -> UndeclaredKeyError:
    """The error of ``values(table)`` in an event with keys (it is for keyless events)."""
    return UndeclaredKeyError(
        f"values({table!r}) is for events of an input declared without keys "
        "(they reach every partition); this event has keys"
    )


def undeclared_total(table: str, column: str | None) -> UndeclaredKeyError:
    """The error of ``sum``/``count`` of a total the event's input did not declare."""
    what = f"{table}.{column}" if column is not None else table
    return UndeclaredKeyError(
        f"a read of {what} across all partitions needs an input without keys declared "
        f"with global_reads=[{what!r}]"
    )


NOT_RUN = "; it was not run"
"""How the error of an event that had no place ends (see :func:`bad_event`)."""


def bad_event(
    batch: int, where: str, mid: int, order: list[Any], what: str, value: Any = None
) -> dict[str, Any]:
    """The failure of the event at ``where`` with a null key (``what="key"``) or ``order value``.

    Such an event has no place (no partition, or no place in the declared
    order): it is not run, and it is reported like a failed transaction, with
    its input position, by every engine.  ``value``: the order value when it is
    not null but not finite (NaN, an infinity): it has no place in the order
    either (NaN compares as neither before nor after anything, and an infinity
    would hold or release every other event).
    """
    detail = f"a null {what}" if value is None else f"a non-finite {what} ({value})"
    return {
        "txn": f"b{batch}_{mid}",
        "kind": "error",
        "position": where,
        "order": order,
        "error": f"SchemaError: the event has {detail}{NOT_RUN}",
    }


def finite(value: float | None) -> bool:
    """Whether an order value (a float from Spark, or None) is a finite number.

    ``x - x`` is 0.0 for a finite float and NaN for NaN and the infinities (the
    cheapest test for the per-event loops).
    """
    return value is not None and value - value == 0.0


def key_of_row(spec: TableSpec, row: Row) -> Key:
    """The key of a row written to ``spec``'s table, after checking it against the columns."""
    if spec.columns is not None:
        check_row(f"row of {spec.name}", spec.columns, row)
    try:
        return spec.key_of(row)
    except (KeyError, TypeError):
        missing = [c for c in spec.key if not isinstance(row, dict) or c not in row]
        raise SchemaError(f"row of {spec.name}: missing key columns {missing}") from None


def _names(value: str | Sequence[str], what: str = "columns") -> tuple[str, ...]:
    """Column names given as one name or a sequence of names; else one RuntimeJobError line."""
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) and n for n in names):
        raise RuntimeJobError(f"{what}: a column name or a list of column names, not {value!r}")
    return tuple(names)


def check_partitions(value: Any, what: str = "partitions") -> int:
    """``value`` as a partition count (1..4096), or :class:`RuntimeJobError` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4096:
        raise RuntimeJobError(f"{what} must be an integer 1..4096, not {value!r}")
    return value


def initial_row(table: TableSpec, row: Any, index: int | None = None) -> Row:
    """Initial row number ``index`` of ``table``, checked.

    A dict with the key columns (and the declared columns, when the table has a schema).
    """
    where = f"table {table.name!r}: " + (
        "an initial row" if index is None else f"initial row {index}"
    )
    if not isinstance(row, dict):
        raise RuntimeJobError(f"{where} is a {type(row).__name__}, not a dict of columns")
    if table.columns is not None:
        try:
            check_row(where, table.columns, row)
        except SchemaError as exc:
            raise RuntimeJobError(str(exc)) from None
    missing = [c for c in table.key if c not in row]
    if missing:
        raise RuntimeJobError(f"{where} lacks key columns {missing}: {row!r}")
    return row


@dataclass(frozen=True)
class TableSpec:
    """A partitioned table: rows keyed by ``key``, placed by ``partition_by``.

    ``partition_by`` names key columns (default: the whole key); a row's
    *partition value* is those columns' values (a scalar for one column).
    """

    name: str
    key: tuple[str, ...]
    partition_by: tuple[str, ...]
    columns: dict[str, str] | None = None
    initial: Any = None
    """Initial contents: a Spark DataFrame, a path (JSON lines, CSV, Parquet) or a list of dicts."""

    def __post_init__(self) -> None:
        # Precomputed once: these run for every row a transaction touches.
        pick = tuple(self.key.index(c) for c in self.partition_by if c in self.key)
        object.__setattr__(self, "_width", len(self.key))
        object.__setattr__(self, "_whole", self.partition_by == self.key)
        object.__setattr__(self, "_pick", itemgetter(*pick) if pick else None)
        object.__setattr__(self, "_row_key", itemgetter(*self.key))
        types = None
        if self.columns is not None:
            # Exact types that fit each key column (and None): a key of one of them
            # needs no further check; any other goes through check_key.
            # (type(True) is bool, not int: a bool is no long key's value.)
            types = tuple(frozenset({*_TYPES[self.columns[c]], type(None)}) for c in self.key)
        object.__setattr__(self, "_key_types", types)
        object.__setattr__(self, "key_types", types[0] if types and len(types) == 1 else None)
        object.__setattr__(self, "simple", len(self.key) == 1)
        object.__setattr__(self, "column_types", exact_types(self.columns))

    key_types: frozenset[type] | None = field(init=False, repr=False, compare=False)
    """For a one-column key of a table with a schema: the exact types that fit it
    (the hot verbs test ``type(key) in key_types`` inline); None otherwise."""
    simple: bool = field(init=False, repr=False, compare=False)
    """Whether the key is one column, so that a key is its own partition value."""
    column_types: dict[str, frozenset[type]] | None = field(init=False, repr=False, compare=False)
    """Per column, the exact types that fit it (see :func:`exact_types`); None without a schema."""

    def key_fits(self, key: Key) -> bool:
        """Whether ``key``'s values are of the exact types of the key columns (a fast test).

        False does not mean it does not fit (a subclass of ``int`` does):
        :func:`check_key` decides then.  True for a table without a schema.
        """
        types: tuple[frozenset[type], ...] | None = self._key_types  # type: ignore[attr-defined]
        if types is None:
            return True
        if len(types) == 1:
            return type(key) in types[0]
        if type(key) is not tuple or len(key) != len(types):
            return False
        return all(type(v) in t for v, t in zip(key, types, strict=True))

    def key_of(self, row: Row) -> Key:
        """The key of ``row``."""
        return self._row_key(row)  # type: ignore[attr-defined]

    def value_of_key(self, key: Key) -> Key:
        """The partition value of the row with ``key``."""
        width: int = self._width  # type: ignore[attr-defined]
        if width == 1:
            return key
        if type(key) is not tuple or len(key) != width:
            raise RuntimeJobError(f"table {self.name!r} has the key {self.key}; got {key!r}")
        if self._whole:  # type: ignore[attr-defined]
            return key
        return self._pick(key)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class InputSpec:
    """An input stream: its events' partition values (``keys``) and order column."""

    name: str
    source: Any
    keys: tuple[tuple[str, ...], ...]
    order: str | None = None
    index: int = 0
    broadcast: str | None = None
    """A boolean column: events where it is true reach every partition (no values)."""
    global_reads: tuple[tuple[str, str | None], ...] = ()
    """(table, column) pairs this keyless input's transactions aggregate over every
    partition (``tx.sum``, ``tx.count``); column None: the table's row count only."""

    def __post_init__(self) -> None:
        # One getter per declared key, built once: this runs for every event.
        getters = tuple(itemgetter(*k) for k in self.keys)
        object.__setattr__(self, "_getters", getters)

    def values_of(self, event: Row) -> list[Key]:
        """The declared partition values of ``event`` (one per entry of ``keys``).

        Empty for an event that reaches every partition (a ``broadcast`` one).
        """
        if self.broadcast is not None and event.get(self.broadcast):
            return []
        return [get(event) for get in self._getters]  # type: ignore[attr-defined]


@dataclass(frozen=True)
class OutputSpec:
    """A named output: emitted rows, optionally checked against ``columns``."""

    name: str
    columns: dict[str, str] | None = None

    def __post_init__(self) -> None:
        # Built once: ``emit`` checks every emitted row against these.
        types = exact_types(self.columns)
        object.__setattr__(self, "column_types", None if types is None else tuple(types.items()))
        fast = types is not None and "__order" not in types  # (see below)
        object.__setattr__(self, "types_by_name", types if fast else None)

    column_types: tuple[tuple[str, frozenset[type]], ...] | None = field(
        init=False, repr=False, compare=False
    )
    """The columns with the exact types that fit them (see :func:`exact_types`)."""
    types_by_name: dict[str, frozenset[type]] | None = field(init=False, repr=False, compare=False)
    """The same by column name, for ``emit``'s one pass over a row; None without a
    schema, or with a column ``__order`` (which the row's order then replaces)."""


class Tx(Protocol):
    """What a transaction function sees: the verbs over its partition values' rows.

    ``fn(t, event)`` gets one of these for each transaction (``Job.on``).  Every
    engine implements it: the executors' and ``run_local``'s
    (:class:`~txstream.spark.runtime.executor.ExecutorTx`) and the driver
    engine's (:class:`~txstream.spark.runtime.driver.DriverTx`); annotate with
    ``tx.Tx``.  Rows are dicts of columns; every row handed out is a copy.
    A row names its own key in the table's key columns (``insert(table, row)``),
    where the transaction manager's :class:`~txstream.txn.Transaction`, a layer
    below over key/value tables, takes the key apart (``insert(table, key,
    value)``; docs/txn.md compares the two).

    Rules every verb keeps:

    * a verb may touch only rows whose partition value is one of the
      transaction's events' declared keys (:class:`UndeclaredKeyError`
      otherwise; see ``Job.input(keys=...)``);
    * a key or row that does not fit the table's declared columns, or an unknown
      table or output, is a :class:`SchemaError` (a ``"5"`` for a long key
      never finds a row: it is refused, not missed);
    * when the function raises (or calls :meth:`abort`) every change of the
      transaction is undone and nothing it emitted is sent; the failure is
      recorded with the event's position (``tx.read_failures``).

    >>> import txstream as tx
    >>> def pay(t: tx.Tx, e):
    ...     src = t.read("accounts", e["src"])
    ...     if src is None or src["balance"] < e["amount"]:
    ...         t.abort("cannot pay")                     # nothing of it stays
    ...     t.update("accounts", e["src"], balance=src["balance"] - e["amount"])
    ...     if t.read("accounts", e["dst"]) is None:
    ...         t.insert("accounts", {"acct": e["dst"], "balance": 0})
    ...     t.increment("accounts", e["dst"], "balance", e["amount"])
    ...     t.emit("payments", {"to": e["dst"], "amount": e["amount"]})
    >>> job = (tx.Job().table("accounts", key="acct", initial=[{"acct": 1, "balance": 10}])
    ...        .input("pay", None, keys=["src", "dst"]).output("payments").on("pay", pay))
    >>> _ = job.run_local([[("pay", {"src": 1, "dst": 2, "amount": 4}),
    ...                     ("pay", {"src": 2, "dst": 3, "amount": 9})]], "ckpt/tx")
    >>> tx.read_table("ckpt/tx", "accounts"), tx.read_output("ckpt/tx", "payments")
    ([{'acct': 1, 'balance': 6}, {'acct': 2, 'balance': 4}], [{'to': 2, 'amount': 4}])
    """

    # -- reads ---------------------------------------------------------------------
    def read(self, table: str, key: Key, default: Any = None) -> Any:
        """The row of ``table`` with ``key`` (a copy), or ``default`` when there is none.

        Reads one row; :class:`SchemaError` for a key of the wrong type,
        :class:`UndeclaredKeyError` for a key of an undeclared partition value.
        """
        ...

    def scan(self, table: str, value: Key) -> list[Row]:
        """Every row of ``table`` in partition value ``value`` (copies, in canonical key order).

        Reads the rows and the set of the value's keys (an insert into the value
        conflicts with it); :class:`SchemaError` for a value of the wrong type,
        :class:`UndeclaredKeyError` for an undeclared one.
        """
        ...

    def values(self, table: str) -> list[Key]:
        """For a keyless event's fragment: the partition values of ``table`` with rows there.

        An event of an input without keys reaches every partition; each of its
        fragments lists the values of its own partition (canonical order).
        :class:`UndeclaredKeyError` in an event with keys.
        """
        ...

    def sum(self, table: str, column: str) -> Any:
        """The sum of ``column`` over every row of ``table`` in every partition (nulls skipped).

        For an input declared with ``global_reads=["table.column"]``: the total
        as of this transaction's place in the order (an int unless a float was
        summed).  :class:`UndeclaredKeyError` when the input does not declare it.
        """
        ...

    def count(self, table: str) -> int:
        """The number of rows of ``table`` in every partition (declared as for :meth:`sum`)."""
        ...

    @property
    def home(self) -> int | None:
        """For an event that reaches every partition: the partition this fragment runs on.

        Each partition ``0 .. P-1`` runs one fragment of such an event (an input
        without keys); ``home == 0`` picks one of them, e.g. to emit once per
        event.  An input with ``global_reads`` runs each event once, at
        partition 0: ``home`` is 0.  None for an event with keys.
        """
        ...

    # -- writes --------------------------------------------------------------------
    def insert(self, table: str, row: Row) -> None:
        """Add ``row`` (its key is in its key columns); :class:`DuplicateKeyError` when it exists.

        :class:`SchemaError` when the row lacks key columns or does not fit the
        table's declared columns.
        """
        ...

    def upsert(self, table: str, row: Row) -> None:
        """Insert ``row``, or replace the row with its key.

        :class:`SchemaError` as for :meth:`insert`; an existing key is no error.
        """
        ...

    def update(self, table: str, key: Key, changes: Row | None = None, **columns: Any) -> Row:
        """Change some columns of the row with ``key``; returns the new row (a copy).

        ``changes`` and ``columns`` name the new values.  :class:`MissingRowError`
        when there is no such row; :class:`SchemaError` for a change of a key
        column or a value that does not fit its column.
        """
        ...

    def increment(self, table: str, key: Key, column: str, by: float = 1) -> Any:
        """Add ``by`` to ``column`` of the row with ``key``; returns the new value.

        :class:`MissingRowError` when there is no such row; :class:`SchemaError`
        when the column is missing or not a number.
        """
        ...

    def delete(self, table: str, key: Key) -> None:
        """Remove the row with ``key``; :class:`MissingRowError` when there is none."""
        ...

    def emit(self, output: str, row: Row) -> None:
        """Send a copy of ``row`` to ``output`` when (and only if) the transaction commits.

        :class:`SchemaError` for an unknown output or a row that does not fit
        the output's declared schema.
        """
        ...

    def abort(self, reason: str = "aborted by the transaction") -> None:
        """Roll the transaction back: raises :class:`TransactionAborted` with ``reason``.

        Its failure record has ``kind`` ``abort``, not ``error``.
        """
        ...


TxnFunction = Callable[[Tx, Row], None]
"""A transaction function: ``fn(t, event)`` with the transaction's verbs and the event's row."""


@dataclass
class JobSpec:
    """Everything a job declares; built by :class:`txstream.spark.runtime.Job`."""

    name: str
    tables: dict[str, TableSpec] = field(default_factory=dict)
    inputs: dict[str, InputSpec] = field(default_factory=dict)
    outputs: dict[str, OutputSpec] = field(default_factory=dict)
    handlers: dict[str, TxnFunction] = field(default_factory=dict)
    boundary: Any = None
    record_history: bool = False
    cross_partition: str = "forward"
    """How transactions whose values live on several partitions run: ``forward``
    (at their home partition in phase 1, rows forwarded between tasks; see
    :mod:`.forward`) or ``defer`` (phases 2 and 3)."""

    @property
    def may_cross(self) -> bool:
        """Whether a transaction can need rows or totals of another partition.

        An input with several partition values per event, or one with global
        reads; boundaries that group events of several partitions run each
        partition's part on its own (no rows move).
        """
        return any(len(i.keys) > 1 or i.global_reads for i in self.inputs.values())

    def for_tasks(self) -> JobSpec:
        """A copy without the input DataFrames and initial contents, to ship to executors."""
        return JobSpec(
            name=self.name,
            tables={n: replace(t, initial=None) for n, t in self.tables.items()},
            inputs={n: replace(i, source=None) for n, i in self.inputs.items()},
            outputs=dict(self.outputs),
            handlers=dict(self.handlers),
            boundary=self.boundary,
            record_history=self.record_history,
            cross_partition=self.cross_partition,
        )

    def validate(self) -> None:
        """Raise :class:`RuntimeJobError` for a job that cannot run, naming the problem."""
        if not self.inputs:
            raise RuntimeJobError(f"job {self.name!r} has no input; add one with .input(...)")
        for name in self.inputs:
            if name not in self.handlers:
                raise RuntimeJobError(
                    f"input {name!r} has no transaction function; add one with .on({name!r}, fn)"
                )
        for name in self.handlers:
            if name not in self.inputs:
                raise RuntimeJobError(
                    f".on({name!r}, ...) names no input; inputs: {', '.join(self.inputs)}"
                )
        for spec in self.inputs.values():
            for table, column in spec.global_reads:
                known = self.tables.get(table)
                if known is None:
                    raise RuntimeJobError(
                        f"input {spec.name!r}: global_reads names no table {table!r}; "
                        f"tables: {', '.join(self.tables) or '-'}"
                    )
                if column is not None and known.columns is not None and column not in known.columns:
                    raise RuntimeJobError(
                        f"input {spec.name!r}: global_reads names no column {column!r} of "
                        f"table {table!r}; columns: {', '.join(known.columns)}"
                    )
        widths = {len(t.partition_by) for t in self.tables.values()}
        widths |= {len(k) for i in self.inputs.values() for k in i.keys}
        if len(widths) > 1:
            raise RuntimeJobError(
                "tables and inputs must share one partition value shape (the same number "
                f"of partition columns); got {sorted(widths)}"
            )


def null_field(spec: InputSpec, row: Row) -> str | None:
    """``key`` or ``order value`` when ``row`` has a null one (None: it has neither)."""
    if spec.order is not None and spec.order in row and row[spec.order] is None:
        return "order value"
    if spec.broadcast is not None and row.get(spec.broadcast) is True:
        return None  # it reaches every partition: it needs no key
    for columns in spec.keys:
        if any(c in row and row[c] is None for c in columns):
            return "key"
    return None
