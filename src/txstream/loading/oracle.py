"""The brute-force oracle: operations applied one by one, views computed from scratch.

Used by the tests (the loader's final state must equal the serial one) and by
every run's verification (a target's stored views must equal their definitions
evaluated on its base relations).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from txstream.loading.base import State, Target
from txstream.loading.ops import Key, Modification
from txstream.loading.schema import ResolvedView, Schema

Base = dict[str, dict[Key, dict[str, Any]]]


def empty_base(schema: Schema) -> Base:
    """Every relation empty."""
    return {name: {} for name in schema.relations}


def base_from_rows(schema: Schema, rows: dict[str, list[dict[str, Any]]]) -> Base:
    """Base relations from initial rows (as :meth:`Target.bulk_load` takes them)."""
    base = empty_base(schema)
    for name, rel_rows in rows.items():
        rel = schema.relation(name)
        for row in rel_rows:
            full = {c: row.get(c) for c in rel.columns}
            base[name][tuple(full[c] for c in rel.key)] = full
    return base


def apply(schema: Schema, base: Base, op: Modification) -> None:
    """Apply one operation to ``base`` in place, with the semantics of :mod:`.ops`."""
    rel = schema.relations[op.relation]
    rows = base[op.relation]
    row = rows.get(op.key)
    if op.kind == "insert":
        if row is None:
            new = dict(zip(rel.key, op.key, strict=True))
            new.update(op.values)
            rows[op.key] = new
    elif op.kind == "delete":
        rows.pop(op.key, None)
    elif op.kind == "update":
        if row is not None:
            row.update(op.values)
    elif op.kind == "increment":
        if row is not None:
            for col, amount in op.values:
                row[col] = None if row[col] is None else row[col] + amount
    else:  # upsert
        if row is None:
            new = dict(zip(rel.key, op.key, strict=True))
            new.update(op.values)
            rows[op.key] = new
        else:
            for col, val in op.values:
                if col in rel.aggregates:
                    row[col] = None if row[col] is None else row[col] + val
                else:
                    row[col] = val


def apply_serial(schema: Schema, ops: Iterable[Modification], initial: Base | None = None) -> Base:
    """The base relations after applying ``ops`` in order to ``initial`` (default: empty)."""
    base = {r: {k: dict(v) for k, v in rows.items()} for r, rows in (initial or {}).items()}
    for name in schema.relations:
        base.setdefault(name, {})
    for op in ops:
        apply(schema, base, op)
    return base


def join_rows(view: ResolvedView, base: Base) -> list[dict[str, dict[str, Any]]]:
    """Every combination of one tuple per relation satisfying the join conditions (hash join)."""
    combos: list[dict[str, dict[str, Any]]] = [{}]
    bound: list[str] = []
    for rel in view.relations:
        conds = [
            c.other(rel)
            for c in view.conditions
            if (c.left == rel and c.right in bound) or (c.right == rel and c.left in bound)
        ]
        index: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for row in base[rel].values():
            probe = tuple(row[mine] for mine, _, _ in conds)
            if None not in probe:
                index.setdefault(probe, []).append(row)
        nxt = []
        for combo in combos:
            probe = tuple(combo[other][other_col] for _, other, other_col in conds)
            for row in index.get(probe, ()):
                nxt.append({**combo, rel: row})
        combos = nxt
        bound.append(rel)
    return combos


def view_contents(view: ResolvedView, base: Base) -> dict[tuple[Any, ...], Any]:
    """The view evaluated on ``base``: row -> multiplicity, or group -> aggregates."""
    combos = join_rows(view, base)
    if not view.is_aggregate:
        counts = Counter(
            tuple(combo[c.relation][c.column] for c in view.columns) for combo in combos
        )
        return dict(counts)
    groups: dict[tuple[Any, ...], list[dict[str, dict[str, Any]]]] = {}
    for combo in combos:
        g = tuple(combo[c.relation][c.column] for c in view.columns)
        groups.setdefault(g, []).append(combo)
    out: dict[tuple[Any, ...], Any] = {}
    for g, members in groups.items():
        values: list[Any] = []
        for func, col, _name in view.aggregates:
            if func == "count" and col is None:
                values.append(len(members))
                continue
            assert col is not None
            xs = [m[col.relation][col.column] for m in members]
            xs = [x for x in xs if x is not None]
            if func == "count":
                values.append(len(xs))
            elif func == "sum":
                values.append(sum(xs) if xs else None)
            else:
                values.append(sum(xs) / len(xs) if xs else None)
        out[g] = tuple(values)
    return out


def expected_state(schema: Schema, base: Base) -> State:
    """The state a target should hold with these base relations."""
    return State(
        base={r: {k: dict(v) for k, v in rows.items()} for r, rows in base.items()},
        views={name: view_contents(v, base) for name, v in schema.views.items()},
    )


def normalize(value: Any) -> Any:
    """Numbers compared with a tolerance: floats rounded to 9 significant digits."""
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, tuple):
        return tuple(normalize(v) for v in value)
    if hasattr(value, "as_integer_ratio") and not isinstance(value, int):  # Decimal
        return normalize(float(value))
    return value


def _norm_view(contents: dict[tuple[Any, ...], Any]) -> dict[Any, Any]:
    return {normalize(k): normalize(v) for k, v in contents.items()}


def differences(schema: Schema, actual: State, expected: State, limit: int = 5) -> list[str]:
    """Human-readable differences between two states (empty: equal)."""
    problems: list[str] = []
    for name in schema.relations:
        a = {k: _norm_row(r) for k, r in actual.base.get(name, {}).items()}
        e = {k: _norm_row(r) for k, r in expected.base.get(name, {}).items()}
        if a != e:
            extra = [k for k in a if k not in e][:limit]
            missing = [k for k in e if k not in a][:limit]
            changed = [k for k in a if k in e and a[k] != e[k]][:limit]
            problems.append(
                f"relation {name}: extra {extra}, missing {missing}, "
                f"changed {[(k, a[k], e[k]) for k in changed]}"
            )
    for name in schema.views:
        a = _norm_view(actual.views.get(name, {}))
        e = _norm_view(expected.views.get(name, {}))
        if a != e:
            wrong = [(k, v) for k, v in a.items() if e.get(k) != v][:limit]
            absent = [(k, v) for k, v in e.items() if a.get(k) != v][:limit]
            problems.append(f"view {name}: stored-but-not-expected {wrong}, expected {absent}")
    return problems


def _norm_row(row: dict[str, Any]) -> dict[str, Any]:
    return {c: normalize(v) for c, v in row.items()}


def verify(schema: Schema, state: State) -> list[str]:
    """Differences between the stored views and the views recomputed from the base rows."""
    expected = expected_state(schema, state.base)
    return differences(schema, state, expected)


def check_loaded(
    target: Target, initial: dict[str, list[dict[str, Any]]], ops: Iterable[Modification]
) -> list[str]:
    """Problems with ``target`` after loading ``ops`` onto ``initial`` (empty: all good).

    The stored views must equal their definitions on the stored base rows, and
    the base rows must equal the serial application of ``ops`` (every operation
    applied exactly once; exact only when operations on one tuple kept their
    order, or commute).
    """
    schema = target.schema
    state = target.state()
    problems = verify(schema, state)
    expected = expected_state(schema, apply_serial(schema, ops, base_from_rows(schema, initial)))
    return problems + differences(schema, state, expected)
