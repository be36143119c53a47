"""Base relations, join views over them, and the conflict relation (Luo et al. Section 3).

A :class:`Relation` has typed columns, a primary key that every modification
operation must specify, the attributes operations are partitioned on (a subset
of the key, Section 2.3) and its "aggregate" attributes, the ones increments
may change (Section 4).

A :class:`JoinView` is an ordinary join view ``π(R1 ⋈ ... ⋈ Rh)`` or an
aggregate join view ``γ(π(R1 ⋈ ... ⋈ Rh))`` with COUNT, SUM and AVG; the join
conditions are equalities between columns, and they must connect all the view's
relations (no cross products).  A selection σ is not supported.

Two different base relations *conflict* when some join view covers both
(:meth:`Schema.conflicts`); the reordering method never loads two conflicting
relations at the same time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from txstream.errors import TxStreamError, UnknownNameError

COLUMN_TYPES = ("int", "float", "text")
AGGREGATE_FUNCTIONS = ("count", "sum", "avg")


class SchemaError(TxStreamError):
    """A relation or view definition is wrong (unknown column, bad key, ...)."""

    condition = "TXSTREAM_RELATION_SCHEMA"


def _ident(kind: str, name: str) -> str:
    if not isinstance(name, str):
        raise SchemaError(f"{kind} name {name!r} must be a string")
    if not name or not name.replace("_", "a").isalnum() or not name[0].isalpha():
        raise SchemaError(f"{kind} name {name!r} must be letters, digits and _ (a letter first)")
    if name.startswith("txstream_") or "__" in name:
        raise SchemaError(f"{kind} name {name!r} is reserved (no 'txstream_' prefix or '__')")
    return name.lower()


def _names(what: str, value: Any) -> tuple[str, ...]:
    """Column names as a tuple; a bare string is one name."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Iterable):
        raise SchemaError(f"{what} lists column names, not {value!r}")
    names = tuple(value)
    for name in names:
        if not isinstance(name, str):
            raise SchemaError(f"{what} lists column names, not {name!r}")
    return names


@dataclass(frozen=True)
class Relation:
    """A base relation: ``columns`` maps name -> ``int``/``float``/``text``."""

    name: str
    columns: Mapping[str, str]
    key: tuple[str, ...]
    partition: tuple[str, ...] = ()
    aggregates: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _ident("relation", self.name)
        if not self.columns:
            raise SchemaError(f"relation {self.name}: no columns")
        if not isinstance(self.columns, Mapping):
            raise SchemaError(
                f"relation {self.name}: columns maps each column name to its type "
                f"(int, float or text), not {self.columns!r}"
            )
        for what in ("key", "partition", "aggregates"):
            object.__setattr__(
                self, what, _names(f"relation {self.name}: {what}", getattr(self, what))
            )
        for col, typ in self.columns.items():
            _ident(f"relation {self.name}: column", col)
            if typ not in COLUMN_TYPES:
                raise SchemaError(
                    f"relation {self.name}: column {col} has type {typ!r}; "
                    f"choose one of: {', '.join(COLUMN_TYPES)}"
                )
        object.__setattr__(self, "columns", dict(self.columns))
        object.__setattr__(self, "key", tuple(self.key))
        if not self.key:
            raise SchemaError(f"relation {self.name}: the key must name at least one column")
        for col in self.key:
            self._known(col, "key")
        if len(set(self.key)) != len(self.key):
            raise SchemaError(f"relation {self.name}: key repeats a column")
        part = tuple(self.partition) or self.key
        for col in part:
            if col not in self.key:
                raise SchemaError(
                    f"relation {self.name}: partitioning attribute {col} is not part of the key "
                    "(operations only specify the key)"
                )
        object.__setattr__(self, "partition", part)
        object.__setattr__(self, "aggregates", tuple(self.aggregates))
        for col in self.aggregates:
            self._known(col, "aggregate attribute")
            if col in self.key:
                raise SchemaError(f"relation {self.name}: key column {col} cannot be an aggregate")
            if self.columns[col] == "text":
                raise SchemaError(f"relation {self.name}: aggregate attribute {col} is text")

    def _known(self, col: str, what: str) -> None:
        if col not in self.columns:
            raise SchemaError(
                f"relation {self.name}: {what} {col!r} is not a column; "
                f"columns: {', '.join(self.columns)}"
            )

    @property
    def column_names(self) -> tuple[str, ...]:
        """The columns in declaration order."""
        return tuple(self.columns)

    @property
    def non_key(self) -> tuple[str, ...]:
        """The columns outside the key."""
        return tuple(c for c in self.columns if c not in self.key)


@dataclass(frozen=True)
class Aggregate:
    """``func`` (count/sum/avg) of ``column`` (``rel.col``; None for COUNT(*)) named ``name``."""

    func: str
    column: str | None
    name: str


@dataclass(frozen=True)
class JoinView:
    """A join view; ``on`` pairs columns as ``("rel.col", "rel.col")``.

    ``select`` lists ``"rel.col"`` or ``"rel.col as name"`` (an ordinary view);
    an aggregate view gives ``group_by`` (``"rel.col"`` or with ``as``) and
    ``aggregates`` instead, e.g. ``Aggregate("sum", "demand.quantity", "qty")``.
    """

    name: str
    relations: tuple[str, ...]
    on: tuple[tuple[str, str], ...]
    select: tuple[str, ...] = ()
    group_by: tuple[str, ...] = ()
    aggregates: tuple[Aggregate, ...] = ()

    @property
    def is_aggregate(self) -> bool:
        """True for an aggregate join view."""
        return bool(self.aggregates)


@dataclass(frozen=True)
class Column:
    """A resolved view output column: relation, source column and output name."""

    relation: str
    column: str
    name: str


@dataclass(frozen=True)
class Condition:
    """A resolved join equality ``left_rel.left_col = right_rel.right_col``."""

    left: str
    left_col: str
    right: str
    right_col: str

    def other(self, rel: str) -> tuple[str, str, str]:
        """For a condition touching ``rel``: (its column, other relation, other column)."""
        if rel == self.left:
            return self.left_col, self.right, self.right_col
        return self.right_col, self.left, self.left_col


@dataclass(frozen=True)
class ResolvedView:
    """A checked view: output columns, conditions and aggregates resolved against the schema."""

    name: str
    relations: tuple[str, ...]
    conditions: tuple[Condition, ...]
    columns: tuple[Column, ...]  # ordinary: projection; aggregate: the group-by columns
    aggregates: tuple[tuple[str, Column | None, str], ...]  # (func, column, output name)

    @property
    def is_aggregate(self) -> bool:
        """True for an aggregate join view."""
        return bool(self.aggregates)

    @property
    def output_names(self) -> tuple[str, ...]:
        """The view's output column names in order."""
        return tuple(c.name for c in self.columns) + tuple(a[2] for a in self.aggregates)

    def conditions_of(self, rel: str) -> list[Condition]:
        """The join conditions that involve ``rel``."""
        return [c for c in self.conditions if rel in (c.left, c.right)]

    def join_columns(self, rel: str) -> tuple[str, ...]:
        """The columns of ``rel`` that appear in the view's join conditions."""
        cols = [c.other(rel)[0] for c in self.conditions_of(rel)]
        return tuple(dict.fromkeys(cols))


@dataclass
class Schema:
    """Relations and join views, checked against each other."""

    relations: dict[str, Relation] = field(default_factory=dict)
    views: dict[str, ResolvedView] = field(default_factory=dict)

    def __init__(self, relations: Iterable[Relation], views: Iterable[JoinView] = ()) -> None:
        self.relations = {}
        if isinstance(relations, Relation | str) or not isinstance(relations, Iterable):
            raise SchemaError(f"a schema takes a list of Relation objects, not {relations!r}")
        if isinstance(views, JoinView | str) or not isinstance(views, Iterable):
            raise SchemaError(f"a schema takes a list of JoinView objects, not {views!r}")
        views = list(views)
        for item in views:
            if not isinstance(item, JoinView):
                raise SchemaError(f"a schema's views are JoinView objects, not {item!r}")
        for rel in relations:
            if not isinstance(rel, Relation):
                raise SchemaError(f"a schema's relations are Relation objects, not {rel!r}")
            if rel.name in self.relations:
                raise SchemaError(f"relation {rel.name} is defined twice")
            self.relations[rel.name] = rel
        if not self.relations:
            raise SchemaError("a schema needs at least one relation")
        self.views = {}
        for view in views:
            if view.name in self.views or view.name in self.relations:
                raise SchemaError(f"view {view.name}: the name is already used")
            self.views[view.name] = self._resolve(view)
        self._conflicts: dict[str, frozenset[str]] = {r: frozenset() for r in self.relations}
        for v in self.views.values():
            for r in v.relations:
                self._conflicts[r] = self._conflicts[r] | (set(v.relations) - {r})

    def relation(self, name: str) -> Relation:
        """The relation called ``name``; :class:`UnknownNameError` otherwise."""
        try:
            return self.relations[name]
        except KeyError:
            raise UnknownNameError("relation", name, list(self.relations)) from None

    def conflicts(self, rel: str) -> frozenset[str]:
        """The other base relations that share a join view with ``rel``."""
        return self._conflicts[rel]

    def views_of(self, rel: str) -> list[ResolvedView]:
        """The join views ``rel`` is a base relation of."""
        return [v for v in self.views.values() if rel in v.relations]

    # -- checking views ------------------------------------------------------------

    def _column(self, view: JoinView, ref: str) -> Column:
        if not isinstance(ref, str):
            raise SchemaError(f"view {view.name}: a column is written relation.column, not {ref!r}")
        text = ref.strip()
        name = None
        lowered = text.lower()
        if " as " in lowered:
            at = lowered.index(" as ")
            text, name = text[:at].strip(), text[at + 4 :].strip()
        rel, dot, col = text.partition(".")
        if not dot:
            raise SchemaError(f"view {view.name}: column {ref!r} must be written relation.column")
        if rel not in view.relations:
            raise SchemaError(f"view {view.name}: {ref!r} names relation {rel!r}, not in the view")
        relation = self.relations[rel]
        if col not in relation.columns:
            raise SchemaError(
                f"view {view.name}: unknown column {col!r} of relation {rel}; "
                f"columns: {', '.join(relation.columns)}"
            )
        out = name or f"{rel}_{col}"
        _ident(f"view {view.name}: output column", out)
        return Column(rel, col, out)

    def _resolve(self, view: JoinView) -> ResolvedView:
        _ident("view", view.name)
        if isinstance(view.relations, str) or not isinstance(view.relations, Iterable):
            raise SchemaError(
                f"view {view.name}: relations lists the joined relations' names, not "
                f"{view.relations!r}"
            )
        rels = tuple(view.relations)
        if len(rels) < 2:
            raise SchemaError(f"view {view.name}: a join view needs at least two relations")
        if len(set(rels)) != len(rels):
            raise SchemaError(
                f"view {view.name}: a relation appears twice (self-joins unsupported)"
            )
        for r in rels:
            if r not in self.relations:
                raise SchemaError(
                    f"view {view.name}: unknown relation {r!r}; "
                    f"relations: {', '.join(self.relations)}"
                )
        conds = []
        if isinstance(view.on, str) or not isinstance(view.on, Iterable):
            raise SchemaError(f"view {view.name}: on lists pairs of columns, not {view.on!r}")
        for pair in view.on:
            if isinstance(pair, str) or not isinstance(pair, Sequence) or len(pair) != 2:
                raise SchemaError(f"view {view.name}: a join condition pairs two columns")
            a, b = (self._column(view, p) for p in pair)
            if a.relation == b.relation:
                raise SchemaError(f"view {view.name}: condition {pair} joins a relation to itself")
            types = {self.relations[c.relation].columns[c.column] == "text" for c in (a, b)}
            if len(types) != 1:
                raise SchemaError(
                    f"view {view.name}: condition {pair} compares a text column with a number "
                    "(they are never equal; PostgreSQL refuses the comparison)"
                )
            conds.append(Condition(a.relation, a.column, b.relation, b.column))
        # Connectivity: every relation reachable from the first through conditions.
        reached = {rels[0]}
        changed = True
        while changed:
            changed = False
            for c in conds:
                if (c.left in reached) != (c.right in reached):
                    reached |= {c.left, c.right}
                    changed = True
        if reached != set(rels):
            missing = ", ".join(r for r in rels if r not in reached)
            raise SchemaError(
                f"view {view.name}: relation(s) {missing} not joined to the others "
                "(cross products are not supported)"
            )
        if view.aggregates:
            if view.select:
                raise SchemaError(f"view {view.name}: an aggregate view lists group_by, not select")
            columns = tuple(
                self._column(view, g) for g in _names(f"view {view.name}: group_by", view.group_by)
            )
            aggs = []
            for agg in view.aggregates:
                if not isinstance(agg, Aggregate) or not isinstance(agg.func, str):
                    raise SchemaError(
                        f"view {view.name}: aggregates are Aggregate(func, column, name), not "
                        f"{agg!r}"
                    )
                func = agg.func.lower()
                if func not in AGGREGATE_FUNCTIONS:
                    raise SchemaError(
                        f"view {view.name}: aggregate {agg.func!r} not supported; choose one of: "
                        f"{', '.join(AGGREGATE_FUNCTIONS)} (MIN/MAX cannot be maintained "
                        "incrementally)"
                    )
                col = None
                if agg.column is not None:
                    col = self._column(view, agg.column)
                    if self.relations[col.relation].columns[col.column] == "text":
                        raise SchemaError(f"view {view.name}: {func} of text column {agg.column}")
                elif func != "count":
                    raise SchemaError(f"view {view.name}: {func} needs a column")
                _ident(f"view {view.name}: aggregate", agg.name)
                aggs.append((func, col, agg.name))
            resolved = ResolvedView(view.name, rels, tuple(conds), columns, tuple(aggs))
        else:
            if view.group_by:
                raise SchemaError(f"view {view.name}: group_by needs aggregates")
            if not view.select:
                raise SchemaError(f"view {view.name}: select lists no columns")
            columns = tuple(
                self._column(view, c) for c in _names(f"view {view.name}: select", view.select)
            )
            resolved = ResolvedView(view.name, rels, tuple(conds), columns, ())
        names = resolved.output_names
        if len(set(names)) != len(names):
            raise SchemaError(f"view {view.name}: output column names repeat: {', '.join(names)}")
        return resolved


def describe(schema: Schema) -> dict[str, Any]:
    """A JSON-friendly summary of the schema (for the command line)."""
    return {
        "relations": {
            r.name: {"key": list(r.key), "partition": list(r.partition)}
            for r in schema.relations.values()
        },
        "views": {v.name: list(v.relations) for v in schema.views.values()},
        "conflicts": {r: sorted(schema.conflicts(r)) for r in schema.relations},
    }
