"""Modification operations: the unit of continuous loading (Luo et al. Section 2.1).

Each :class:`Modification` changes one tuple of one base relation, identified
by its full primary key:

* ``insert`` - add the tuple (all columns; missing non-key columns are NULL);
  a no-op if a tuple with that key exists (``ON CONFLICT DO NOTHING``);
* ``delete`` - remove the tuple; a no-op if there is none;
* ``update`` - set non-key columns; a no-op if there is no such tuple;
* ``increment`` - add amounts to "aggregate" attributes; a no-op if there is
  no such tuple;
* ``upsert`` - insert the tuple if it is missing, else add its aggregate
  attributes to the stored ones and set its other columns (``MERGE``).

These are the semantics of SQL statements that affect no rows, so a stream of
operations never makes a load transaction fail.  :func:`validate` turns loose
input (dicts, JSON) into checked operations and raises
:class:`InvalidOperation` with a one-line reason for bad ones.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from txstream.errors import TxStreamError
from txstream.loading.schema import Relation, Schema

KINDS = ("insert", "delete", "update", "increment", "upsert")

Key = tuple[Hashable, ...]


class InvalidOperation(TxStreamError):
    """A modification operation is malformed (unknown relation, missing key, ...)."""


@dataclass(frozen=True, slots=True)
class Modification:
    """One modification operation on ``relation``; ``values`` holds the key columns too."""

    relation: str
    kind: str
    key: Key
    values: tuple[tuple[str, Any], ...]

    def fields(self) -> dict[str, Any]:
        """The non-key values as a dict."""
        return dict(self.values)

    def to_json(self, schema: Schema) -> dict[str, Any]:
        """The operation as a JSON object (the input format of :func:`validate`)."""
        rel = schema.relation(self.relation)
        values = dict(zip(rel.key, self.key, strict=True))
        values.update(self.values)
        return {"relation": self.relation, "op": self.kind, "values": values}


INT_LIMIT = 1 << 63
"""An ``int`` column holds 64-bit integers (``bigint`` in PostgreSQL) on every target."""


def _shown(value: Any) -> str:
    """``repr(value)`` cut to 40 characters (an int too long to print is named by size)."""
    try:
        text = repr(value)
    except ValueError:  # int() text conversion limit
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    return text if len(text) <= 40 else f"{text[:37]}..."


def _coerce(rel: Relation, col: str, value: Any) -> Any:
    if value is None:
        return None
    typ = rel.columns[col]
    if isinstance(value, bool):
        raise InvalidOperation(f"{rel.name}.{col}: {_shown(value)} is not a {typ}")
    if typ == "int":
        number: Any = None
        if isinstance(value, float) and value.is_integer():
            number = int(value)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = int(value)
        elif isinstance(value, int):
            number = value
        if number is None:
            raise InvalidOperation(f"{rel.name}.{col}: {_shown(value)} is not an int")
        if not -INT_LIMIT <= number < INT_LIMIT:
            raise InvalidOperation(
                f"{rel.name}.{col}: {_shown(value)} does not fit in a 64-bit int column"
            )
        return number
    if typ == "float":
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise InvalidOperation(
                    f"{rel.name}.{col}: {_shown(value)} is not a float"
                ) from None
        if isinstance(value, int | float):
            try:
                number = float(value)  # an int beyond float range raises OverflowError
            except OverflowError:
                number = math.inf
            if math.isfinite(number):
                return number
        raise InvalidOperation(f"{rel.name}.{col}: {_shown(value)} is not a finite float")
    if isinstance(value, str):
        return value
    raise InvalidOperation(f"{rel.name}.{col}: {_shown(value)} is not text")


def make(schema: Schema, relation: str, kind: str, values: Mapping[str, Any]) -> Modification:
    """A checked operation; :class:`InvalidOperation` says what is wrong."""
    if relation not in schema.relations:
        raise InvalidOperation(
            f"unknown relation {relation!r}; relations: {', '.join(sorted(schema.relations))}"
        )
    rel = schema.relations[relation]
    if kind not in KINDS:
        raise InvalidOperation(f"unknown operation {kind!r}; choose one of: {', '.join(KINDS)}")
    if not isinstance(values, Mapping):
        raise InvalidOperation(f"{relation} {kind}: values must be an object")
    for col in values:
        if col not in rel.columns:
            raise InvalidOperation(
                f"{relation} {kind}: unknown column {col!r}; columns: {', '.join(rel.columns)}"
            )
    missing = [c for c in rel.key if values.get(c) is None]
    if missing:
        raise InvalidOperation(f"{relation} {kind}: missing key column(s) {', '.join(missing)}")
    key = tuple(_coerce(rel, c, values[c]) for c in rel.key)
    rest = {c: _coerce(rel, c, v) for c, v in values.items() if c not in rel.key}
    if kind == "insert":
        rest = {c: rest.get(c) for c in rel.non_key}
    elif kind == "delete":
        if rest:
            raise InvalidOperation(f"{relation} delete: give only the key columns")
    elif kind == "update":
        if not rest:
            raise InvalidOperation(f"{relation} update: no column to set")
    elif kind == "increment":
        if not rest:
            raise InvalidOperation(f"{relation} increment: no amount given")
        for c, v in rest.items():
            if c not in rel.aggregates:
                raise InvalidOperation(
                    f"{relation} increment: {c} is not an aggregate attribute "
                    f"(aggregates: {', '.join(rel.aggregates) or 'none'})"
                )
            if v is None:
                raise InvalidOperation(f"{relation} increment: amount of {c} is null")
    else:  # upsert
        rest = {c: rest.get(c) for c in rel.non_key}
        for c in rel.aggregates:
            if rest[c] is None:
                raise InvalidOperation(f"{relation} upsert: aggregate attribute {c} is missing")
    return Modification(relation, kind, key, tuple(sorted(rest.items())))


def validate(schema: Schema, raw: Any) -> Modification:
    """Turn one input item into a :class:`Modification`.

    Accepts a :class:`Modification` (re-checked against ``schema``), a mapping
    ``{"relation": ..., "op": ..., "values": {...}}``, or a JSON text of one.
    """
    if isinstance(raw, Modification):
        rel = schema.relations.get(raw.relation)
        if rel is None:
            raise InvalidOperation(
                f"unknown relation {raw.relation!r}; "
                f"relations: {', '.join(sorted(schema.relations))}"
            )
        if len(raw.key) != len(rel.key):
            raise InvalidOperation(f"{raw.relation} {raw.kind}: key has the wrong length")
        values = dict(zip(rel.key, raw.key, strict=True))
        values.update(raw.values)
        return make(schema, raw.relation, raw.kind, values)
    if isinstance(raw, str | bytes):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise InvalidOperation(f"not JSON: {exc}") from None
        except RecursionError:  # json's decoder recurses once per nested [ or {
            raise InvalidOperation("not JSON that can be read: nested too deeply") from None
    if not isinstance(raw, Mapping):
        raise InvalidOperation(f"an operation is an object, not {type(raw).__name__}")
    relation = raw.get("relation")
    kind = raw.get("op", raw.get("kind"))
    if not isinstance(relation, str) or not isinstance(kind, str):
        raise InvalidOperation("an operation needs string fields 'relation' and 'op'")
    values = raw.get("values", {})
    if not isinstance(values, Mapping):
        raise InvalidOperation(f"{relation} {kind}: 'values' must be an object")
    return make(schema, relation, kind, values)


def bulk_rows(schema: Schema, rows: Any) -> dict[str, list[dict[str, Any]]]:
    """Initial rows (relation -> list of row dicts) checked and coerced as inserts are.

    For :meth:`Target.bulk_load`: an unknown relation or column, a missing key,
    a value of the wrong type or a key given twice raises
    :class:`InvalidOperation` before anything is loaded.  Missing non-key
    columns are NULL.
    """
    if not isinstance(rows, Mapping):
        raise InvalidOperation(
            f"initial rows map each relation's name to a list of rows, not {type(rows).__name__}"
        )
    out: dict[str, list[dict[str, Any]]] = {}
    for name, rel_rows in rows.items():
        rel = schema.relation(name)
        if isinstance(rel_rows, Mapping | str) or not isinstance(rel_rows, Iterable):
            raise InvalidOperation(f"{name}: the initial rows are a list of rows (dicts)")
        checked: dict[Key, dict[str, Any]] = {}
        for k, row in enumerate(rel_rows):
            if not isinstance(row, Mapping):
                raise InvalidOperation(f"{name} row {k}: a row is a dict, not {_shown(row)}")
            try:
                op = make(schema, name, "insert", row)
            except InvalidOperation as exc:
                raise InvalidOperation(f"{name} row {k}: {exc}") from None
            if op.key in checked:
                raise InvalidOperation(f"{name} row {k}: key {op.key!r} is given twice")
            checked[op.key] = {**dict(zip(rel.key, op.key, strict=True)), **dict(op.values)}
        out[name] = list(checked.values())
    return out


def partition_values(schema: Schema, op: Modification) -> Key:
    """The values of the relation's partitioning attributes in ``op``."""
    rel = schema.relations[op.relation]
    if rel.partition == rel.key:
        return op.key
    return tuple(op.key[rel.key.index(c)] for c in rel.partition)
