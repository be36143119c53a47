"""Static analysis of an operator tree: validation, the commit operator, redo queues.

* :func:`commit_operator` - Definition 3.2: the topmost operator among the
  window-based and reference operators; a result leaving it commits its
  CQ-derived transaction.
* :func:`setup_redo_queues` - Algorithm 1 (SETUP-REDO-QUEUES): the input streams
  whose events must be backed up so that, with overlapping windows, the next
  transaction re-evaluates its reference operators instead of reusing results
  of the previous transaction held in a synopsis.
* :func:`validate` - unknown tables or columns and malformed trees fail before
  anything runs.
* :func:`shape` - the tree as the engine runs it: the branches (a source and
  the single-input operators above it) that feed the window-based operator,
  the window, and the operators above it; trees the engine cannot run are
  refused here with one line.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from txstream.cq.base import (
    CQError,
    Operator,
    Project,
    Reference,
    RefJoin,
    Select,
    Source,
    WindowAgg,
    WindowJoin,
)


def commit_operator(root: Operator) -> Operator | None:
    """The topmost window-based or reference operator (breadth first from the root)."""
    queue: deque[Operator] = deque([root])
    while queue:
        op = queue.popleft()
        if op.is_window or op.is_reference:
            return op
        queue.extend(op.children)
    return None


def setup_redo_queues(root: Operator) -> set[tuple[str, str]]:
    """Algorithm 1: the (operator, input child) pairs that get a redo queue.

    An input stream is named by the operator it feeds and the child it comes
    from.  (1) Every input of a reference operator that has a window-based
    operator downstream and no reference operator upstream; (2) every input of
    a window-based operator that has a reference operator upstream, when that
    input itself has none upstream.
    """
    queues: set[tuple[str, str]] = set()

    def visit(op: Operator, has_win_down: bool) -> bool:
        if isinstance(op, Source):
            return False
        has_win_down = op.is_window or has_win_down
        has_ref_up = False
        with_ref: set[str] = set()
        for child in op.children:
            child_has_ref = visit(child, has_win_down)
            has_ref_up = has_ref_up or child_has_ref
            if child_has_ref:
                with_ref.add(child.name)
        if op.is_reference and has_win_down and not has_ref_up:
            queues.update((op.name, c.name) for c in op.children)
        elif op.is_window:
            queues.update(
                (op.name, c.name) for c in op.children if has_ref_up and c.name not in with_ref
            )
        return has_ref_up or op.is_reference

    visit(root, False)
    return queues


def validate(root: Operator, tables: Mapping[str, tuple[str, ...]]) -> None:
    """Check names, tables and columns through the tree; :class:`CQError` otherwise.

    ``tables`` maps each table the query may reference to its columns.
    """
    if not isinstance(tables, Mapping):
        raise CQError(
            f"tables must map each table's name to its columns, e.g. {{'parts': ('price',)}}; "
            f"got {type(tables).__name__} {tables!r:.40}"
        )
    for table, cols in tables.items():
        if isinstance(cols, str):  # else its letters pass for its columns
            raise CQError(
                f"table {table!r}: give its columns as a tuple of names, e.g. ({cols!r},)"
            )
        if not isinstance(cols, tuple | list) or not all(isinstance(c, str) for c in cols):
            raise CQError(
                f"table {table!r}: give its columns as a tuple of names, e.g. ('price',); "
                f"got {cols!r:.40}"
            )
    names = [op.name for op in root.walk()]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise CQError(f"operator names must be unique; repeated: {', '.join(dupes)}")
    _columns(root, tables)


def _columns(op: Operator, tables: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The columns of ``op``'s output stream (validating on the way)."""
    if isinstance(op, Source):
        return op.columns
    if isinstance(op, WindowJoin):
        if len(op.children) != 2:
            raise CQError(f"window join {op.name!r} needs exactly two inputs")
        left, right = (_columns(c, tables) for c in op.children)
        for key, side, cols in ((op.left_key, "left", left), (op.right_key, "right", right)):
            if key not in cols:
                raise CQError(
                    f"window join {op.name!r}: unknown {side} key {key!r}; that input has {cols}"
                )
        out = left + tuple(op.prefix + c for c in right)
        clash = sorted({c for c in out if out.count(c) > 1})
        if clash:
            raise CQError(
                f"window join {op.name!r}: columns {clash} on both sides; give a prefix= "
                "that makes the right input's columns distinct"
            )
        if op.time_column is not None:
            for src in _sources(op):
                if op.time_column not in src.columns:
                    raise CQError(
                        f"window join {op.name!r}: time column {op.time_column!r} is not a "
                        f"column of the source {src.name!r} ({src.columns})"
                    )
        return out
    if len(op.children) != 1:
        raise CQError(f"operator {op.name!r} needs exactly one input")
    cols = _columns(op.children[0], tables)
    if isinstance(op, RefJoin | Reference) and op.table not in tables:
        known = ", ".join(sorted(tables)) or "none"
        raise CQError(
            f"operator {op.name!r} references unknown table {op.table!r} (known: {known})"
        )
    if isinstance(op, RefJoin):
        if op.key not in cols:
            raise CQError(f"join {op.name!r}: unknown column {op.key!r}; the stream has {cols}")
        added = tuple(op.prefix + c for c in tables[op.table])
        clash = sorted(set(cols) & set(added))
        if clash:  # else the row's value silently replaced the event's in every event
            raise CQError(
                f"join {op.name!r}: columns {clash} on both sides (the stream and table "
                f"{op.table!r}); give a prefix= that makes the table's columns distinct"
            )
        return cols + added
    if isinstance(op, Reference):
        return cols + op.columns
    if isinstance(op, Project):
        return op.columns
    if isinstance(op, WindowAgg):
        if op.column not in cols and op.aggregate != "count":
            raise CQError(
                f"window {op.name!r}: unknown column {op.column!r}; the stream has {cols}"
            )
        if op.time_column is not None and op.time_column not in _source(op).columns:
            raise CQError(
                f"window {op.name!r}: time column {op.time_column!r} is not a column of the "
                f"source {_source(op).name!r} ({_source(op).columns})"
            )
        return ("window", "value")
    if isinstance(op, Select):
        return cols
    raise CQError(f"unknown operator type {type(op).__name__}")


def _source(op: Operator) -> Source:
    while not isinstance(op, Source):
        op = op.children[0]
    return op


def _sources(op: Operator) -> list[Source]:
    return [o for o in op.walk() if isinstance(o, Source)]


@dataclass
class Shape:
    """An operator tree as the engine runs it.

    ``branches``: one (source, operators above it, bottom-up) per input of the
    window (one for a :class:`WindowAgg` or no window, two for a
    :class:`WindowJoin`); ``window``: the window-based operator, if any;
    ``above``: the operators between the window and the root, bottom-up (with
    no window, empty: the branch goes up to the root).
    """

    branches: list[tuple[Source, list[Operator]]]
    window: WindowAgg | WindowJoin | None
    above: list[Operator]


def shape(root: Operator) -> Shape:
    """Decompose ``root``; :class:`CQError` for a tree the engine cannot run.

    The engine runs any number of sources, stateless and reference operators
    below and above one window-based operator (a window aggregate, or a
    window join of two inputs); a tree with two window-based operators on one
    path (a window over a window) is refused.
    """
    above: list[Operator] = []
    op = root
    while not (isinstance(op, Source) or op.is_window):
        if len(op.children) != 1:
            raise CQError(f"operator {op.name!r} has {len(op.children)} inputs; it needs one")
        above.append(op)
        op = op.children[0]
    above.reverse()
    if isinstance(op, Source):
        src, chain = _branch(root, None)
        return Shape([(src, chain)], None, [])
    if not isinstance(op, WindowAgg | WindowJoin):
        raise CQError(
            f"window-based operator {op.name!r} ({type(op).__name__}) cannot be run: the engine "
            "runs WindowAgg and WindowJoin"
        )
    branches = [_branch(child, op) for child in op.children]
    names = [src.name for src, _ in branches]
    if len(set(names)) != len(names):
        raise CQError(f"window join {op.name!r} joins the source {names[0]!r} with itself")
    return Shape(branches, op, above)


def _branch(top: Operator, window: Operator | None) -> tuple[Source, list[Operator]]:
    chain: list[Operator] = []
    op = top
    while not isinstance(op, Source):
        if op.is_window:
            raise CQError(
                f"window {op.name!r} lies below window {window.name if window else '?'!r}: the "
                "engine runs one window-based operator per path (no window over a window)"
            )
        if len(op.children) != 1:
            raise CQError(f"operator {op.name!r} has {len(op.children)} inputs; it needs one")
        chain.append(op)
        op = op.children[0]
    chain.reverse()
    return op, chain
