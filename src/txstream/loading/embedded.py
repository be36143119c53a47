"""The ``embedded`` target: txstream's own tables under the ``ss2pl`` transaction manager.

Each base relation is a :class:`~txstream.storage.Table` keyed by its primary
key; every load transaction is one :class:`~txstream.txn.Transaction` with
strict two-phase tuple-level locks, and it maintains the join views itself,
immediately, in the same transaction, as an RDBMS trigger would:

* a modified tuple is X-locked first (like ``UPDATE``), then changed;
* to maintain a view, the matching tuples of the view's other relations are
  read under S locks - through the key when the join covers it, else through a
  join-value index (a superset of candidate keys, kept outside the locks: each
  candidate is S-locked, then checked; a key is added before the inserting
  transaction reads anything, so of two concurrent inserters of matching
  tuples at least one sees the other and waits for its lock);
* an ordinary view is a table keyed by the tuple of base keys of each row;
* an aggregate view is kept as *delta rows*: each change adds a row with the
  change in COUNT and SUM per group under a fresh key.  Delta rows never
  conflict, which is what the paper's Rule 3 asks of a high-concurrency
  locking protocol on views (V locks are compatible with themselves); the view
  is the sum of its deltas per group.

Deadlocks are found by the lock manager's wait-for graph at once; the victim's
transaction is rolled back with its undo log and the loader re-runs it.  With
``deadlock_check_interval`` the target behaves like a server whose deadlock
detector runs periodically (DB2's ``DLCHKTIME``, Luo et al.'s system): the
victim keeps its locks, and so every transaction of the cycle stays stuck,
until the next tick of a global clock of that period; only then is it rolled
back.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, ClassVar

from txstream.errors import TransientError, TxStreamError
from txstream.loading.base import (
    DeadlockAbort,
    LoadTransaction,
    State,
    Target,
    TargetSession,
)
from txstream.loading.ops import Key, Modification, bulk_rows
from txstream.loading.oracle import base_from_rows, join_rows
from txstream.loading.schema import ResolvedView, Schema
from txstream.storage import Table
from txstream.txn import DeadlockError, Transaction, TransactionManager

Row = dict[str, Any]
# one step of a join plan: (relation, [(my column, bound relation, its column)], lookup)
Step = tuple[str, list[tuple[str, str, str]], tuple[str, ...] | None]


def _bfs_order(view: ResolvedView, start: str) -> list[str]:
    order = [start]
    while len(order) < len(view.relations):
        for rel in view.relations:
            if rel in order:
                continue
            if any(c.other(rel)[1] in order for c in view.conditions_of(rel)):
                order.append(rel)
                break
    return order


class _Index:
    """Join value -> candidate keys of one relation (a superset; checked under locks)."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self.entries: dict[tuple[Any, ...], set[Key]] = {}
        self.latch = threading.Lock()

    def add(self, row: Row, key: Key) -> None:
        value = tuple(row[c] for c in self.columns)
        if None in value:
            return
        with self.latch:
            self.entries.setdefault(value, set()).add(key)

    def candidates(self, value: tuple[Any, ...]) -> list[Key]:
        with self.latch:
            return sorted(self.entries.get(value, ()), key=repr)

    def discard(self, value: tuple[Any, ...], key: Key) -> None:
        with self.latch:
            keys = self.entries.get(value)
            if keys is not None:
                keys.discard(key)


class EmbeddedTarget(Target):
    """Relations and views as txstream tables; one ss2pl transaction per load transaction."""

    name: ClassVar[str] = "embedded"

    def __init__(
        self,
        schema: Schema,
        *,
        path: str | Path | None = None,
        statement_delay: float = 0.0,
        lock_timeout: float | None = None,
        deadlock_check_interval: float = 0.0,
    ) -> None:
        super().__init__(schema)
        for name, value in (
            ("statement_delay", statement_delay),
            ("deadlock_check_interval", deadlock_check_interval),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 <= value < math.inf
            ):
                raise TxStreamError(
                    f"{name} must be a finite number of seconds >= 0, not {value!r}"
                )
        self.path = path
        self.statement_delay = statement_delay
        self.lock_timeout = lock_timeout
        self.deadlock_check_interval = float(deadlock_check_interval)
        self.tm: TransactionManager | None = None
        self._uids = itertools.count(1)

    # -- setup ----------------------------------------------------------------------

    def setup(self) -> None:
        """A fresh transaction manager with every table, index and join plan."""
        if self.tm is not None:
            self.tm.close()
        self.tm = TransactionManager("ss2pl", path=self.path, lock_timeout=self.lock_timeout)
        tm = self.tm
        if self.deadlock_check_interval > 0:
            _detect_on_ticks(tm, self.deadlock_check_interval)
        schema = self.schema
        self.tables: dict[str, Table] = {r: tm.table(f"r-{r}") for r in schema.relations}
        self.view_tables: dict[str, Table] = {v: tm.table(f"v-{v}") for v in schema.views}
        self.ledger = tm.table("txstream-ledger")
        self.batches = tm.table("txstream-batches")
        self.indexes: dict[tuple[str, tuple[str, ...]], _Index] = {}
        self.plans: dict[tuple[str, str], list[Step]] = {}
        for view in schema.views.values():
            for start in view.relations:
                steps: list[Step] = []
                order = _bfs_order(view, start)
                for pos, rel in enumerate(order[1:], start=1):
                    bound = order[:pos]
                    conds = [
                        c.other(rel) for c in view.conditions_of(rel) if c.other(rel)[1] in bound
                    ]
                    cols = tuple(sorted(dict.fromkeys(mine for mine, _, _ in conds)))
                    key = schema.relations[rel].key
                    lookup: tuple[str, ...] | None
                    if set(key) <= set(cols):
                        lookup = None  # a point read through the key
                    else:
                        lookup = cols
                        self.indexes.setdefault((rel, cols), _Index(cols))
                    steps.append((rel, conds, lookup))
                self.plans[(view.name, start)] = steps
        self.rel_indexes: dict[str, list[_Index]] = {r: [] for r in schema.relations}
        for (rel, _cols), index in self.indexes.items():
            self.rel_indexes[rel].append(index)

    def _manager(self) -> TransactionManager:
        if self.tm is None:
            raise TxStreamError("embedded target: call setup() first")
        return self.tm

    def bulk_load(self, rows: dict[str, list[dict[str, Any]]]) -> None:
        """Load committed rows directly and compute every view from them."""
        self._manager()
        base = base_from_rows(self.schema, bulk_rows(self.schema, rows))
        for rel, rel_rows in base.items():
            if not rel_rows:
                continue
            self.tables[rel].load({k: v for k, v in rel_rows.items()})
            for index in self.rel_indexes[rel]:
                for key, row in rel_rows.items():
                    index.add(row, key)
        full: dict[str, dict[Key, Row]] = {
            r: {_key(k): v for k, v in self.tables[r].snapshot().items()}
            for r in self.schema.relations
        }
        for view in self.schema.views.values():
            combos = join_rows(view, full)
            vt = self.view_tables[view.name]
            if not view.is_aggregate:
                vt.load({self._combo_key(view, c): self._project(view, c) for c in combos})
            else:
                deltas = self._deltas(view, combos, +1)
                vt.load({(g, next(self._uids)): d for g, d in deltas.items()})

    # -- sessions -----------------------------------------------------------------------

    def connect(self, slot: int, slots: int) -> TargetSession:
        """A session; all sessions share the transaction manager."""
        self._manager()
        return _EmbeddedSession(self)

    # -- view helpers --------------------------------------------------------------------

    def _combo_key(self, view: ResolvedView, combo: dict[str, Row]) -> tuple[Key, ...]:
        rels = self.schema.relations
        return tuple(tuple(combo[r][c] for c in rels[r].key) for r in view.relations)

    @staticmethod
    def _project(view: ResolvedView, combo: dict[str, Row]) -> tuple[Any, ...]:
        return tuple(combo[c.relation][c.column] for c in view.columns)

    @staticmethod
    def _deltas(
        view: ResolvedView, combos: list[dict[str, Row]], sign: int
    ) -> dict[tuple[Any, ...], dict[str, Any]]:
        out: dict[tuple[Any, ...], dict[str, Any]] = {}
        for combo in combos:
            g = tuple(combo[c.relation][c.column] for c in view.columns)
            d = out.setdefault(g, {"_count": 0})
            d["_count"] += sign
            for _func, col, name in view.aggregates:
                if col is None:
                    continue
                x = combo[col.relation][col.column]
                if x is not None:
                    d[f"s_{name}"] = d.get(f"s_{name}", 0) + sign * x
                    d[f"n_{name}"] = d.get(f"n_{name}", 0) + sign
        return out

    # -- results -------------------------------------------------------------------------

    def state(self) -> State:
        """Committed rows of every relation and the contents of every view."""
        self._manager()
        base = {
            r: {_key(k): dict(v) for k, v in t.snapshot().items()} for r, t in self.tables.items()
        }
        views: dict[str, dict[tuple[Any, ...], Any]] = {}
        for view in self.schema.views.values():
            rows = self.view_tables[view.name].snapshot()
            if not view.is_aggregate:
                counts: dict[tuple[Any, ...], Any] = {}
                for value in rows.values():
                    t = tuple(value)
                    counts[t] = counts.get(t, 0) + 1
                views[view.name] = counts
                continue
            sums: dict[tuple[Any, ...], dict[str, Any]] = {}
            for vkey, d in rows.items():
                g = _key(_key(vkey)[0])
                acc = sums.setdefault(g, {})
                for name, value in d.items():
                    acc[name] = acc.get(name, 0) + value
            views[view.name] = {
                g: _aggregate_values(view, acc) for g, acc in sums.items() if acc["_count"] != 0
            }
        return State(base, views)

    def batch_done(self, batch_id: int) -> bool:
        """Whether ``batch_id`` was marked loaded."""
        self._manager()
        return batch_id in self.batches

    def mark_batch(self, batch_id: int) -> None:
        """Record ``batch_id`` as loaded (durable when the target has a path)."""
        tm = self._manager()
        with tm.begin() as t:
            t.put(self.batches, batch_id, True)

    def stats(self) -> dict[str, Any]:
        """The transaction manager's counters."""
        return dict(self._manager().stats())

    def close(self) -> None:
        """Close the write-ahead log."""
        if self.tm is not None:
            self.tm.close()


def _key(key: Hashable) -> Key:
    assert isinstance(key, tuple)
    return key


def _aggregate_values(view: ResolvedView, acc: dict[str, Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for func, col, name in view.aggregates:
        if col is None:
            out.append(acc["_count"])
            continue
        n = acc.get(f"n_{name}", 0)
        s = acc.get(f"s_{name}", 0)
        if func == "count":
            out.append(n)
        elif func == "sum":
            out.append(s if n else None)
        else:
            out.append(s / n if n else None)
    return tuple(out)


def _detect_on_ticks(
    tm: TransactionManager, interval: float, sleep: Callable[[float], None] = time.sleep
) -> None:
    """Make a deadlock victim wait, holding its locks, for the next detector tick.

    The lock manager finds the cycle at once; a server with a periodic detector
    would leave every transaction of the cycle blocked until its next run.  The
    victim's lock request has already failed in its own thread, before its
    transaction is rolled back, so sleeping there keeps its locks and its
    partners blocked, as they would be, until the tick.
    """
    protocol = tm.protocol

    def ticking(check: Callable[[Transaction, str], None]) -> Callable[[Transaction, str], None]:
        def call(txn: Transaction, item: str) -> None:
            try:
                check(txn, item)
            except DeadlockError:
                sleep(interval - time.monotonic() % interval)
                raise

        return call

    # Instance attributes shadow the protocol's methods for this manager only.
    protocol.before_read = ticking(protocol.before_read)  # type: ignore[method-assign,assignment]
    protocol.before_write = ticking(protocol.before_write)  # type: ignore[method-assign,assignment]


def _lock_for_update(t: Transaction, table: Table, key: Hashable) -> None:
    """Take the X lock on a row before reading it, as ``UPDATE`` does."""
    fn = getattr(t, "lock_for_update", None)
    if fn is not None:
        fn(table, key)
    else:
        t._write_item(table.item(key))


class _EmbeddedSession(TargetSession):
    def __init__(self, target: EmbeddedTarget) -> None:
        self.target = target
        self.schema = target.schema
        self.tm = target._manager()

    def execute(self, txn: LoadTransaction, statements: list[Modification]) -> bool:
        t = self.tm.begin()
        try:
            with t:
                if txn.ident is not None:
                    ident = list(txn.ident)
                    key = (ident[0], ident[1])
                    _lock_for_update(t, self.target.ledger, key)
                    if t.read(self.target.ledger, key) is not None:
                        t.abort()
                        return False
                    t.insert(self.target.ledger, key, True)
                delay = self.target.statement_delay
                for op in statements:
                    self._apply(t, op, delay)
            return True
        except DeadlockError as exc:
            raise DeadlockAbort(str(exc)) from None
        except TransientError:
            raise
        except BaseException:
            if t.status == "active":
                t.abort()
            raise

    # -- one modification and its view maintenance ----------------------------------------

    def _apply(self, t: Transaction, op: Modification, delay: float = 0.0) -> None:
        """Apply one modification and maintain its views.

        ``delay`` (the server's own work on the statement) is spent after the
        modified row is locked and before the views' rows are read, where a
        server does the statement's I/O: two statements on one part in
        different relations then overlap as they would in the server.
        """
        target = self.target
        rel = self.schema.relations[op.relation]
        tbl = target.tables[op.relation]
        _lock_for_update(t, tbl, op.key)
        if delay:
            time.sleep(delay)
        old: Row | None = t.read(tbl, op.key)
        new: Row | None
        kind = op.kind
        if kind == "insert":
            if old is not None:
                return
            new = dict(zip(rel.key, op.key, strict=True))
            new.update(op.values)
        elif kind == "delete":
            if old is None:
                return
            new = None
        elif old is None:
            if kind != "upsert":
                return
            new = dict(zip(rel.key, op.key, strict=True))
            new.update(op.values)
        else:
            new = dict(old)
            for col, val in op.values:
                if kind == "increment" or (kind == "upsert" and col in rel.aggregates):
                    new[col] = None if new[col] is None else new[col] + val
                else:
                    new[col] = val
        if new is not None:
            for index in target.rel_indexes[op.relation]:
                if old is None or any(old[c] != new[c] for c in index.columns):
                    index.add(new, op.key)
        if new is None:
            t.delete(tbl, op.key)
        elif old is None:
            t.insert(tbl, op.key, new)
        else:
            t.put(tbl, op.key, new)
        for view in self.schema.views_of(op.relation):
            self._maintain(t, view, op.relation, old, new)

    def _combos(
        self, t: Transaction, view: ResolvedView, rel: str, row: Row
    ) -> list[dict[str, Row]]:
        """The join rows of ``view`` that ``row`` of ``rel`` is in; S-locks what it reads."""
        target = self.target
        rels = self.schema.relations
        combos: list[dict[str, Row]] = [{rel: row}]
        for other, conds, lookup in target.plans[(view.name, rel)]:
            tbl = target.tables[other]
            nxt: list[dict[str, Row]] = []
            for combo in combos:
                want = {mine: combo[b][bc] for mine, b, bc in conds}
                if None in want.values():
                    continue
                if lookup is None:
                    key = tuple(want[c] for c in rels[other].key)
                    cand: list[Key] = [key]
                    index = None
                else:
                    index = target.indexes[(other, lookup)]
                    cand = index.candidates(tuple(want[c] for c in lookup))
                for key in cand:
                    found: Row | None = t.read(tbl, key)
                    if found is None or any(found[c] != v for c, v in want.items()):
                        if index is not None:
                            index.discard(tuple(want[c] for c in index.columns), key)
                        continue
                    nxt.append({**combo, other: found})
            combos = nxt
        return combos

    def _maintain(
        self, t: Transaction, view: ResolvedView, rel: str, old: Row | None, new: Row | None
    ) -> None:
        target = self.target
        vt = target.view_tables[view.name]
        join_cols = view.join_columns(rel)
        if not view.is_aggregate:
            if old is not None and new is not None and all(old[c] == new[c] for c in join_cols):
                for combo in self._combos(t, view, rel, new):
                    t.update(vt, target._combo_key(view, combo), target._project(view, combo))
                return
            if old is not None:
                for combo in self._combos(t, view, rel, old):
                    t.delete(vt, target._combo_key(view, combo))
            if new is not None:
                for combo in self._combos(t, view, rel, new):
                    t.insert(vt, target._combo_key(view, combo), target._project(view, combo))
            return
        deltas: dict[tuple[Any, ...], dict[str, Any]] = {}
        for row, sign in ((old, -1), (new, +1)):
            if row is None:
                continue
            for g, d in target._deltas(view, self._combos(t, view, rel, row), sign).items():
                acc = deltas.setdefault(g, {})
                for name, value in d.items():
                    acc[name] = acc.get(name, 0) + value
        for g, d in deltas.items():
            if any(v != 0 for v in d.values()):
                t.insert(vt, (g, next(target._uids)), d)
