"""The ``postgres`` target: a real PostgreSQL server reached with psycopg 3.

Every base relation is a table with its primary key; every join view is a
table maintained *immediately* by row triggers on its base relations, in the
transaction that changes them.  A trigger reads the matching tuples of the
view's other relations with ``SELECT ... FOR SHARE`` (tuple S locks) while the
change itself holds the tuple's X lock, so concurrent loading into two base
relations of one view deadlocks as in Luo et al. Section 3.1; the server
detects it after ``deadlock_timeout`` and rolls one transaction back
(``DeadlockAbort``), and the loader re-runs it.

Two additions make the triggers correct under concurrency:

* *Value locks.*  PostgreSQL row locks do not cover tuples another transaction
  has inserted but not committed (they are invisible, not locked), so two
  concurrent inserts of matching tuples into two relations of a view would
  each miss the other.  The paper's DBMS prevents that with key-range locks.
  Here a trigger takes a transaction-scoped advisory lock on the join value
  before it reads the other relation (shared, one per loader session slot)
  and, when it inserts a tuple or changes its join columns, on its own join
  value (exclusive, in its session's slot).  Readers and writers of one join
  value conflict; two writers never do, nor two readers - the compatibility
  of tuple S and X locks plus range protection.  Lookups that pass through a
  third relation (views over three or more relations) are not value-locked.
* *Delta rows for aggregate views.*  An aggregate join view is a table of
  delta rows (changes of COUNT and SUM per group, inserted, never updated) and
  a SQL view that sums them per group.  Concurrent maintenance of one group
  then takes no conflicting locks - the paper's Rule 3 (a high-concurrency
  locking protocol such as V locks on join views).

Load transactions run at READ COMMITTED.  With a ledger (exactly-once
streams), each load transaction first inserts its ``(batch, seq)`` into
``txstream_ledger``; if that row exists the transaction was committed before
and is rolled back unapplied.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, ClassVar

from txstream.errors import TransientError, TxStreamError
from txstream.loading.base import DeadlockAbort, LoadTransaction, State, Target, TargetSession
from txstream.loading.ops import Modification, bulk_rows
from txstream.loading.pgserver import PostgresServer
from txstream.loading.schema import Relation, ResolvedView, Schema

try:  # psycopg is needed only by this target
    import psycopg
    from psycopg import errors as pg_errors
except ImportError:  # pragma: no cover - reported when the target is used
    psycopg = None  # type: ignore[assignment]

SQL_TYPES = {"int": "bigint", "float": "double precision", "text": "text"}


class SerializationRetry(TransientError):
    """PostgreSQL refused a transaction for a serialization failure; retry it."""


def _q(name: str) -> str:
    return f'"{name}"'


def _need_psycopg() -> None:
    if psycopg is None:
        raise TxStreamError("the postgres target needs psycopg: pip install 'psycopg[binary]>=3.2'")


class PostgresTarget(Target):
    """Relations and trigger-maintained join views in one PostgreSQL schema."""

    name: ClassVar[str] = "postgres"

    def __init__(
        self,
        schema: Schema,
        server: PostgresServer | str,
        *,
        namespace: str = "txload",
        deadlock_timeout_ms: int | None = None,
        value_locks: bool = True,
        pipeline: bool = True,
        statement_delay: float = 0.0,
    ) -> None:
        super().__init__(schema)
        _need_psycopg()
        if (
            isinstance(statement_delay, bool)
            or not isinstance(statement_delay, int | float)
            or not 0 <= statement_delay < math.inf
        ):
            raise TxStreamError(
                f"statement_delay must be a finite number of seconds >= 0, not {statement_delay!r}"
            )
        self.statement_delay = float(statement_delay)
        self.conninfo = server if isinstance(server, str) else server.conninfo
        if not namespace.replace("_", "a").isalnum():
            raise TxStreamError(f"bad PostgreSQL schema name {namespace!r}")
        self.namespace = namespace
        self.deadlock_timeout_ms = deadlock_timeout_ms
        self.value_locks = value_locks
        self.pipeline = pipeline
        self._sql: dict[tuple[str, str, tuple[str, ...]], str] = {}

    # -- connections ---------------------------------------------------------------------

    def _connect(self, slot: int = 0, slots: int = 1, autocommit: bool = False) -> Any:
        options = f"-c search_path={self.namespace} -c txstream.slot={slot} "
        options += f"-c txstream.slots={slots}"
        if self.deadlock_timeout_ms is not None:
            options += f" -c deadlock_timeout={self.deadlock_timeout_ms}ms"
        try:
            return psycopg.connect(self.conninfo, autocommit=autocommit, options=options)
        except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
            # ProgrammingError: a connection string libpq cannot parse (--conninfo).
            msg = str(exc).strip().replace("\n", " ")
            raise TxStreamError(f"cannot connect to PostgreSQL: {msg}") from None

    # -- DDL ---------------------------------------------------------------------------------

    def setup(self) -> None:
        """Drop and re-create the namespace: tables, view tables, triggers, ledger."""
        ddl = self.ddl()
        with self._connect(autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {_q(self.namespace)} CASCADE")
            conn.execute(f"CREATE SCHEMA {_q(self.namespace)}")
            for stmt in ddl:
                conn.execute(stmt)

    def ddl(self) -> list[str]:
        """Every statement that creates the relations, views and their triggers."""
        out: list[str] = []
        for rel in self.schema.relations.values():
            cols = ", ".join(f"{_q(c)} {SQL_TYPES[t]}" for c, t in rel.columns.items())
            out.append(f"CREATE TABLE {_q(rel.name)} ({cols}, PRIMARY KEY ({_cols(rel.key)}))")
        out.append(
            "CREATE TABLE txstream_ledger (batch bigint, seq bigint, PRIMARY KEY (batch, seq))"
        )
        out.append("CREATE TABLE txstream_batches (batch bigint PRIMARY KEY)")
        out.append("CREATE TABLE txstream_plans (batch bigint PRIMARY KEY, plan text NOT NULL)")
        indexed: set[tuple[str, tuple[str, ...]]] = set()
        for view in self.schema.views.values():
            for rname in view.relations:
                jcols = view.join_columns(rname)
                key = self.schema.relations[rname].key
                if tuple(jcols[: len(key)]) == key or (rname, jcols) in indexed:
                    continue  # the primary key's index serves the join
                indexed.add((rname, jcols))
                name = f"{rname}__join_{len(indexed)}"
                out.append(f"CREATE INDEX {_q(name)} ON {_q(rname)} ({_cols(jcols)})")
        for view in self.schema.views.values():
            out.extend(self._view_ddl(view))
        return out

    def _keys(self, view: ResolvedView) -> list[tuple[str, str, str]]:
        """Hidden key columns of an ordinary view table: (relation, column, name)."""
        rels = self.schema.relations
        return [(r, c, f"_k_{r}_{c}") for r in view.relations for c in rels[r].key]

    def _view_ddl(self, view: ResolvedView) -> list[str]:
        rels = self.schema.relations
        out: list[str] = []
        if not view.is_aggregate:
            cols = [
                f"{_q(c.name)} {SQL_TYPES[rels[c.relation].columns[c.column]]}"
                for c in view.columns
            ]
            cols += [f"{_q(n)} {SQL_TYPES[rels[r].columns[c]]}" for r, c, n in self._keys(view)]
            out.append(f"CREATE TABLE {_q(view.name)} ({', '.join(cols)})")
            for r in view.relations:
                names = [n for rr, _c, n in self._keys(view) if rr == r]
                out.append(
                    f"CREATE INDEX {_q(f'{view.name}__k_{r}')} ON {_q(view.name)} ({_cols(names)})"
                )
        else:
            delta = f"{view.name}__delta"
            cols = [
                f"{_q(c.name)} {SQL_TYPES[rels[c.relation].columns[c.column]]}"
                for c in view.columns
            ]
            cols.append("_count bigint")
            selects = [_q(c.name) for c in view.columns]
            for func, col, name in view.aggregates:
                if col is None:
                    selects.append(f"SUM(_count)::bigint AS {_q(name)}")
                    continue
                typ = (
                    "numeric"
                    if rels[col.relation].columns[col.column] == "int"
                    else "double precision"
                )
                cols += [f"{_q('s_' + name)} {typ}", f"{_q('n_' + name)} bigint"]
                s, n = _q("s_" + name), _q("n_" + name)
                if func == "count":
                    selects.append(f"SUM({n})::bigint AS {_q(name)}")
                elif func == "sum":
                    selects.append(
                        f"CASE WHEN SUM({n}) = 0 THEN NULL ELSE SUM({s}) END AS {_q(name)}"
                    )
                else:
                    selects.append(f"SUM({s}) / NULLIF(SUM({n}), 0) AS {_q(name)}")
            out.append(f"CREATE TABLE {_q(delta)} ({', '.join(cols)})")
            group = f" GROUP BY {_cols([c.name for c in view.columns])}" if view.columns else ""
            out.append(
                f"CREATE VIEW {_q(view.name)} AS SELECT {', '.join(selects)} FROM {_q(delta)}"
                f"{group} HAVING SUM(_count) <> 0"
            )
        for rel in view.relations:
            fn = f"{view.name}__{rel}"
            out.append(
                f"CREATE FUNCTION {_q(fn)}() RETURNS trigger LANGUAGE plpgsql AS $body$\n"
                f"{self._trigger_body(view, rel)}\n$body$"
            )
            out.append(
                f"CREATE TRIGGER {_q(fn)} AFTER INSERT OR UPDATE OR DELETE ON {_q(rel)} "
                f"FOR EACH ROW EXECUTE FUNCTION {_q(fn)}()"
            )
        return out

    # -- trigger bodies --------------------------------------------------------------------

    def _from_where(self, view: ResolvedView, rel: str, var: str) -> tuple[str, str]:
        others = [r for r in view.relations if r != rel]
        conds = []
        for c in view.conditions:
            left = f"{var}.{_q(c.left_col)}" if c.left == rel else f"{_q(c.left)}.{_q(c.left_col)}"
            right = (
                f"{var}.{_q(c.right_col)}" if c.right == rel else f"{_q(c.right)}.{_q(c.right_col)}"
            )
            conds.append(f"{left} = {right}")
        return ", ".join(_q(o) for o in others), " AND ".join(conds)

    @staticmethod
    def _expr(rel: str, var: str, relation: str, column: str) -> str:
        return f"{var}.{_q(column)}" if relation == rel else f"{_q(relation)}.{_q(column)}"

    def _edges(self, view: ResolvedView, rel: str) -> list[tuple[str, list[tuple[str, str]]]]:
        """Direct neighbours of ``rel`` in ``view``: (other, [(my column, its column)])."""
        edges: dict[str, list[tuple[str, str]]] = {}
        for c in view.conditions_of(rel):
            mine, other, theirs = c.other(rel)
            edges.setdefault(other, []).append((mine, theirs))
        return [(o, sorted(pairs)) for o, pairs in edges.items()]

    @staticmethod
    def _gate(view: str, rel: str, cols: list[str], exprs: list[str]) -> str:
        parts = " || '|' || ".join(f"coalesce(({e})::text, '')" for e in exprs)
        return f"hashtext('{view}:{rel}:{','.join(cols)}:' || {parts})"

    def _far(self, view: ResolvedView, rel: str) -> list[str]:
        """The relations of ``view`` that ``rel`` reaches only through a third one."""
        near = {other for other, _ in self._edges(view, rel)}
        return [r for r in view.relations if r != rel and r not in near]

    @staticmethod
    def _relation_gate(view: str, rel: str) -> str:
        """The lock on every change of ``rel`` that a reader two joins away must wait for."""
        return f"hashtext('{view}:{rel}:*')"

    def _reader_locks(self, view: ResolvedView, rel: str, var: str) -> str:
        if not self.value_locks:
            return ""
        out = []
        for other, pairs in self._edges(view, rel):
            gate = self._gate(
                view.name, other, [t for _, t in pairs], [f"{var}.{_q(m)}" for m, _ in pairs]
            )
            out.append(
                f"PERFORM pg_advisory_xact_lock_shared({gate}, s) "
                "FROM generate_series(0, nslots) s;"
            )
        # A relation reached through a third one: the values to wait for are only
        # known after that join, so the whole relation's writers are waited for.
        for other in self._far(view, rel):
            out.append(
                f"PERFORM pg_advisory_xact_lock_shared({self._relation_gate(view.name, other)}, s)"
                " FROM generate_series(0, nslots) s;"
            )
        return "\n    ".join(out)

    def _writer_locks(self, view: ResolvedView, rel: str) -> str:
        if not self.value_locks:
            return ""
        out = []
        if self._far(view, rel):  # some relation of the view reaches rel through a third
            out.append(
                f"PERFORM pg_advisory_xact_lock({self._relation_gate(view.name, rel)}, slot);"
            )
        seen = set()
        for _other, pairs in self._edges(view, rel):
            cols = sorted({m for m, _ in pairs})
            if tuple(cols) in seen:
                continue
            seen.add(tuple(cols))
            gate = self._gate(view.name, rel, cols, [f"NEW.{_q(c)}" for c in cols])
            out.append(f"PERFORM pg_advisory_xact_lock({gate}, slot);")
        return "\n    ".join(out)

    def _trigger_body(self, view: ResolvedView, rel: str) -> str:
        join_cols = view.join_columns(rel)
        same = " AND ".join(f"OLD.{_q(c)} IS NOT DISTINCT FROM NEW.{_q(c)}" for c in join_cols)
        frm_new, where_new = self._from_where(view, rel, "NEW")
        frm_old, where_old = self._from_where(view, rel, "OLD")
        lock_new = f"PERFORM 1 FROM {frm_new} WHERE {where_new} FOR SHARE;"
        lock_old = f"PERFORM 1 FROM {frm_old} WHERE {where_old} FOR SHARE;"
        head = (
            "DECLARE\n  slot int := "
            "coalesce(nullif(current_setting('txstream.slot', true), ''), '0')::int;\n"
            "  nslots int := "
            "coalesce(nullif(current_setting('txstream.slots', true), ''), '1')::int - 1;\n"
            "BEGIN\n"
        )
        wlocks = self._writer_locks(view, rel)
        if not view.is_aggregate:
            key_match = " AND ".join(
                f"{_q(n)} = OLD.{_q(c)}" for r, c, n in self._keys(view) if r == rel
            )
            own = [c for c in view.columns if c.relation == rel]
            sets = ", ".join(f"{_q(c.name)} = NEW.{_q(c.column)}" for c in own)
            update_in_place = f"UPDATE {_q(view.name)} SET {sets} WHERE {key_match};" if own else ""
            targets = [c.name for c in view.columns] + [n for _r, _c, n in self._keys(view)]
            exprs = [self._expr(rel, "NEW", c.relation, c.column) for c in view.columns]
            exprs += [self._expr(rel, "NEW", r, c) for r, c, _n in self._keys(view)]
            insert = (
                f"INSERT INTO {_q(view.name)} ({_cols(targets)}) SELECT {', '.join(exprs)} "
                f"FROM {frm_new} WHERE {where_new} FOR SHARE;"
            )
            return (
                head + f"  IF TG_OP = 'UPDATE' AND {same} THEN\n"
                f"    {self._reader_locks(view, rel, 'NEW')}\n"
                f"    {lock_new}\n"
                f"    {update_in_place}\n"
                "    RETURN NULL;\n  END IF;\n"
                "  IF TG_OP IN ('UPDATE', 'DELETE') THEN\n"
                f"    {self._reader_locks(view, rel, 'OLD')}\n"
                f"    {lock_old}\n"
                f"    DELETE FROM {_q(view.name)} WHERE {key_match};\n  END IF;\n"
                "  IF TG_OP IN ('UPDATE', 'INSERT') THEN\n"
                f"    {wlocks}\n"
                f"    {self._reader_locks(view, rel, 'NEW')}\n"
                f"    {insert}\n  END IF;\n"
                "  RETURN NULL;\nEND;"
            )
        # aggregate view: delta rows
        delta = _q(f"{view.name}__delta")
        targets = [c.name for c in view.columns] + ["_count"]
        for _func, col, name in view.aggregates:
            if col is not None:
                targets += [f"s_{name}", f"n_{name}"]

        def contrib(var: str, sign: str) -> str:
            frm, where = self._from_where(view, rel, var)
            exprs = [self._expr(rel, var, c.relation, c.column) for c in view.columns]
            exprs.append(f"{sign}1")
            for _func, col, _name in view.aggregates:
                if col is not None:
                    x = self._expr(rel, var, col.relation, col.column)
                    exprs += [
                        f"{sign}coalesce({x}, 0)",
                        f"CASE WHEN {x} IS NULL THEN 0 ELSE {sign}1 END",
                    ]
            cols = [f"{e} AS {_q(t)}" for e, t in zip(exprs, targets, strict=True)]
            return f"SELECT {', '.join(cols)} FROM {frm} WHERE {where}"

        sums = [_q(c.name) for c in view.columns]
        nonzero = []
        for t in targets[len(view.columns) :]:
            sums.append(f"SUM({_q(t)})")
            nonzero.append(f"SUM({_q(t)}) <> 0")
        group = f" GROUP BY {_cols([c.name for c in view.columns])}" if view.columns else ""

        def add_deltas(source: str) -> str:
            return (
                f"INSERT INTO {delta} ({_cols(targets)}) SELECT {', '.join(sums)} FROM ({source}) d"
                f"{group} HAVING {' OR '.join(nonzero)};"
            )

        return (
            head + "  IF TG_OP IN ('UPDATE', 'DELETE') THEN\n"
            f"    {self._reader_locks(view, rel, 'OLD')}\n"
            f"    {lock_old}\n  END IF;\n"
            "  IF TG_OP IN ('UPDATE', 'INSERT') THEN\n"
            + (f"    IF TG_OP = 'INSERT' OR NOT ({same}) THEN {wlocks} END IF;\n" if wlocks else "")
            + f"    {self._reader_locks(view, rel, 'NEW')}\n"
            f"    {lock_new}\n  END IF;\n"
            f"  IF TG_OP = 'INSERT' THEN\n    {add_deltas(contrib('NEW', '+'))}\n"
            f"  ELSIF TG_OP = 'DELETE' THEN\n    {add_deltas(contrib('OLD', '-'))}\n"
            f"  ELSE\n    {add_deltas(contrib('OLD', '-') + ' UNION ALL ' + contrib('NEW', '+'))}\n"
            "  END IF;\n  RETURN NULL;\nEND;"
        )

    # -- data ---------------------------------------------------------------------------------

    def bulk_load(self, rows: dict[str, list[dict[str, Any]]]) -> None:
        """COPY the rows in with triggers off, then compute every view with one query each."""
        rows = bulk_rows(self.schema, rows)
        with self._connect() as conn:
            conn.execute("SET session_replication_role = replica")
            for name, rel_rows in rows.items():
                rel = self.schema.relation(name)
                cols = rel.column_names
                with conn.cursor().copy(f"COPY {_q(name)} ({_cols(cols)}) FROM STDIN") as copy:
                    for row in rel_rows:
                        copy.write_row([row.get(c) for c in cols])
            for view in self.schema.views.values():
                first = view.relations[0]
                if not view.is_aggregate:
                    conn.execute(f"DELETE FROM {_q(view.name)}")
                    frm, where = self._from_where(view, first, _q(first))
                    targets = [c.name for c in view.columns] + [n for _r, _c, n in self._keys(view)]
                    exprs = [f"{_q(c.relation)}.{_q(c.column)}" for c in view.columns]
                    exprs += [f"{_q(r)}.{_q(c)}" for r, c, _n in self._keys(view)]
                    conn.execute(
                        f"INSERT INTO {_q(view.name)} ({_cols(targets)}) SELECT {', '.join(exprs)} "
                        f"FROM {_q(first)}, {frm} WHERE {where}"
                    )
                else:
                    delta = _q(f"{view.name}__delta")
                    conn.execute(f"DELETE FROM {delta}")
                    frm, where = self._from_where(view, first, _q(first))
                    targets = [c.name for c in view.columns] + ["_count"]
                    exprs = [f"{_q(c.relation)}.{_q(c.column)}" for c in view.columns] + [
                        "count(*)"
                    ]
                    for _func, col, name in view.aggregates:
                        if col is not None:
                            x = f"{_q(col.relation)}.{_q(col.column)}"
                            targets += [f"s_{name}", f"n_{name}"]
                            exprs += [f"coalesce(sum({x}), 0)", f"count({x})"]
                    group = (
                        " GROUP BY "
                        + ", ".join(f"{_q(c.relation)}.{_q(c.column)}" for c in view.columns)
                        if view.columns
                        else ""
                    )
                    conn.execute(
                        f"INSERT INTO {delta} ({_cols(targets)}) SELECT {', '.join(exprs)} "
                        f"FROM {_q(first)}, {frm} WHERE {where}{group}"
                    )
            conn.commit()
            conn.execute("RESET session_replication_role")
            for name in self.schema.relations:
                conn.execute(f"ANALYZE {_q(name)}")
            conn.commit()

    def connect(self, slot: int, slots: int) -> TargetSession:
        """A psycopg connection for loading session ``slot``."""
        return _PostgresSession(self, self._connect(slot, slots))

    def statement(self, op: Modification) -> tuple[str, list[Any]]:
        """The SQL statement and parameters that apply ``op``."""
        rel = self.schema.relations[op.relation]
        cols = tuple(c for c, _ in op.values)
        key = (op.relation, op.kind, cols)
        sql = self._sql.get(key)
        if sql is None:
            sql = self._sql[key] = _statement_sql(rel, op.kind, cols)
        params = [v for _, v in op.values] + list(op.key)
        if op.kind in ("insert", "upsert", "delete"):
            params = list(op.key) + [v for _, v in op.values]
        return sql, params

    def state(self) -> State:
        """Committed rows and view contents, read in one snapshot."""
        base: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {}
        views: dict[str, dict[tuple[Any, ...], Any]] = {}
        with self._connect() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            for rel in self.schema.relations.values():
                cols = rel.column_names
                rows = conn.execute(f"SELECT {_cols(cols)} FROM {_q(rel.name)}").fetchall()
                base[rel.name] = {}
                for r in rows:
                    d = dict(zip(cols, r, strict=True))
                    base[rel.name][tuple(d[c] for c in rel.key)] = d
            for view in self.schema.views.values():
                names = [c.name for c in view.columns]
                if not view.is_aggregate:
                    counts: dict[tuple[Any, ...], Any] = {}
                    for r in conn.execute(f"SELECT {_cols(names)} FROM {_q(view.name)}"):
                        counts[tuple(r)] = counts.get(tuple(r), 0) + 1
                    views[view.name] = counts
                else:
                    aggs = [a[2] for a in view.aggregates]
                    got = {}
                    for r in conn.execute(f"SELECT {_cols(names + aggs)} FROM {_q(view.name)}"):
                        got[tuple(r[: len(names)])] = tuple(r[len(names) :])
                    views[view.name] = got
            conn.rollback()
        return State(base, views)

    def batch_done(self, batch_id: int) -> bool:
        """Whether ``batch_id`` is in ``txstream_batches``."""
        with self._connect(autocommit=True) as conn:
            row = conn.execute(
                "SELECT 1 FROM txstream_batches WHERE batch = %s", (batch_id,)
            ).fetchone()
        return row is not None

    def mark_batch(self, batch_id: int) -> None:
        """Insert ``batch_id`` into ``txstream_batches``."""
        with self._connect(autocommit=True) as conn:
            conn.execute(
                "INSERT INTO txstream_batches VALUES (%s) ON CONFLICT DO NOTHING", (batch_id,)
            )

    def batch_plan(self, batch_id: int) -> str | None:
        """How sessions apart began ``batch_id`` (:meth:`begin_batch`), or None."""
        with self._connect(autocommit=True) as conn:
            row = conn.execute(
                "SELECT plan FROM txstream_plans WHERE batch = %s", (batch_id,)
            ).fetchone()
        return None if row is None else str(row[0])

    def begin_batch(self, batch_id: int, plan: str) -> None:
        """Record that ``batch_id`` is loaded by sessions apart as ``plan`` says.

        A load transaction's ledger row names it by ``(batch, seq)``; the
        same ``seq`` is another transaction under another method, k, n or
        seed, or for the driver's loader.  So a batch begun one way and
        resumed another could skip transactions that never ran: refused
        here, in one line, before anything runs.
        """
        with self._connect(autocommit=True) as conn:
            conn.execute(
                "INSERT INTO txstream_plans SELECT %s, %s WHERE NOT EXISTS "
                "(SELECT 1 FROM txstream_ledger WHERE batch = %s) ON CONFLICT DO NOTHING",
                (batch_id, plan, batch_id),
            )
            row = conn.execute(
                "SELECT plan FROM txstream_plans WHERE batch = %s", (batch_id,)
            ).fetchone()
        if row is None:
            raise TxStreamError(
                f"batch {batch_id} was begun by the driver's loader: finish it that way "
                "(LoadingSink), then switch"
            )
        if row[0] != plan:
            raise TxStreamError(
                f"batch {batch_id} was begun as {row[0]}, not {plan}: resume it with the "
                "same settings, then switch"
            )

    def stats(self) -> dict[str, Any]:
        """Deadlocks the server counted in this database."""
        with self._connect(autocommit=True) as conn:
            row = conn.execute(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
        return {"server_deadlocks": int(row[0]) if row else 0}


def _cols(names: Any) -> str:
    return ", ".join(_q(n) for n in names)


def _statement_sql(rel: Relation, kind: str, cols: tuple[str, ...]) -> str:
    table = _q(rel.name)
    where = " AND ".join(f"{_q(k)} = %s" for k in rel.key)
    if kind in ("insert", "upsert"):
        allc = list(rel.key) + list(cols)
        ph = ", ".join(["%s"] * len(allc))
        sql = f"INSERT INTO {table} ({_cols(allc)}) VALUES ({ph}) ON CONFLICT ({_cols(rel.key)}) "
        if kind == "insert":
            return sql + "DO NOTHING"
        sets: list[str] = []
        for c in cols:
            if c in rel.aggregates:
                sets.append(f"{_q(c)} = {table}.{_q(c)} + EXCLUDED.{_q(c)}")
            else:
                sets.append(f"{_q(c)} = EXCLUDED.{_q(c)}")
        return sql + ("DO UPDATE SET " + ", ".join(sets) if sets else "DO NOTHING")
    if kind == "delete":
        return f"DELETE FROM {table} WHERE {where}"
    if kind == "update":
        assign = ", ".join(f"{_q(c)} = %s" for c in cols)
        return f"UPDATE {table} SET {assign} WHERE {where}"
    adds = ", ".join(f"{_q(c)} = {_q(c)} + %s" for c in cols)
    return f"UPDATE {table} SET {adds} WHERE {where}"


_TRY_GATE = (
    "pg_try_advisory_xact_lock(%s) AND coalesce((SELECT "
    "bool_and(pg_try_advisory_xact_lock_shared(s)) FROM unnest(%s::bigint[]) s), true)"
)
_GATE_AND_LEDGER = (
    f"WITH g AS (SELECT {_TRY_GATE} AS ok), "
    "ins AS (INSERT INTO txstream_ledger SELECT %s, %s FROM g WHERE g.ok "
    "ON CONFLICT DO NOTHING RETURNING 1) "
    "SELECT (SELECT ok FROM g), (SELECT count(*) FROM ins)"
)
"""Whether the gate's locks were free (and are now held), and whether the ledger row is new."""


class _PostgresSession(TargetSession):
    def __init__(self, target: PostgresTarget, conn: Any) -> None:
        self.target = target
        self.conn = conn

    def execute(self, txn: LoadTransaction, statements: list[Modification]) -> bool:
        applied = self._run(txn, statements, None, False)
        assert applied is not None  # (only a gate can be busy)
        return applied

    def execute_gated(
        self,
        txn: LoadTransaction,
        statements: list[Modification],
        gate: tuple[int, tuple[int, ...]],
        wait: bool,
    ) -> bool | None:
        return self._run(txn, statements, gate, wait)

    def _run(
        self,
        txn: LoadTransaction,
        statements: list[Modification],
        gate: tuple[int, tuple[int, ...]] | None,
        wait: bool,
    ) -> bool | None:
        conn = self.conn
        target = self.target
        try:
            with conn.cursor() as cur:
                logged = False
                if gate is not None and not wait and txn.ident is not None:
                    # The gate and the ledger row in one round trip.
                    cur.execute(
                        _GATE_AND_LEDGER, (gate[0], list(gate[1]), *txn.ident), prepare=True
                    )
                    row = cur.fetchone()
                    if not (row and row[0]):
                        conn.rollback()  # releases the locks it did get
                        return None
                    if not row[1]:
                        conn.rollback()
                        return False
                    logged = True
                elif gate is not None and not self._gate(cur, gate, wait):
                    conn.rollback()  # releases the locks it did get
                    return None
                if txn.ident is not None and not logged:
                    cur.execute(
                        "INSERT INTO txstream_ledger VALUES (%s, %s) ON CONFLICT DO NOTHING",
                        txn.ident,
                    )
                    if cur.rowcount == 0:
                        conn.rollback()
                        return False
                if target.pipeline and len(statements) > 1:
                    with conn.pipeline():
                        for op in statements:
                            self._statement(cur, op)
                else:
                    for op in statements:
                        self._statement(cur, op)
            conn.commit()
            return True
        except pg_errors.DeadlockDetected as exc:
            self._rollback()
            raise DeadlockAbort(str(exc).splitlines()[0]) from None
        except (pg_errors.SerializationFailure, pg_errors.LockNotAvailable) as exc:
            self._rollback()
            raise SerializationRetry(str(exc).splitlines()[0]) from None
        except BaseException:
            self._rollback()
            raise

    @staticmethod
    def _gate(cur: Any, gate: tuple[int, tuple[int, ...]], wait: bool) -> bool:
        """Take the gate's advisory locks (transaction-scoped); False if one is taken."""
        exclusive, shared = gate
        if not wait:
            cur.execute(f"SELECT {_TRY_GATE}", (exclusive, list(shared)), prepare=True)
            row = cur.fetchone()
            return bool(row and row[0])
        # Waiting sessions take their locks in one global order: two of them never
        # wait for each other in a cycle.
        for key, mode in sorted([(exclusive, "")] + [(s, "_shared") for s in shared]):
            cur.execute(f"SELECT pg_advisory_xact_lock{mode}(%s)", (key,), prepare=True)
        return True

    def _statement(self, cur: Any, op: Modification) -> None:
        sql, params = self.target.statement(op)
        cur.execute(sql, params, prepare=True)
        delay = self.target.statement_delay
        if delay:
            # The server's own cost of the statement (a disk-bound server), spent
            # in the server while the statement's locks are held; see
            # EmbeddedTarget's statement_delay and docs/loading.md.
            cur.execute("SELECT pg_sleep(%s)", (delay,), prepare=True)

    def _rollback(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.rollback()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
