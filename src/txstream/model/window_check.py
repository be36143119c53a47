"""Window-serializability (ws) and latest-window-serializability (lws) checkers.

The model is the one of Golab, Bijay and Özsu, *On Concurrency Control in
Sliding Window Queries over Data Streams* (University of Waterloo technical
report CS-2005-28, 2005), Sections 2.3 and 3.
A sliding window is split into ``n`` sub-windows ``0 .. n-1``.  Two kinds of
transaction run over it:

* a *window slide* ``T_j`` has a numeric id ``j`` and consists of the single
  write ``w_j[j mod n]``: it replaces the oldest sub-window with new data and so
  moves the window forward by one sub-window;
* a *query* ``T_Qk`` is any other transaction; it only reads sub-windows.

As in the paper, the slides that filled the window before the history starts are
left out: the window starts in the state left by ``T_(j0-1)``, ``j0`` being the
smallest slide id in the history (``n`` when there is no slide, the window then
being the one ``T_0 .. T_(n-1)`` filled).  A *version* of a sub-window is named
by the id of the slide that wrote it, so sub-window ``i`` of that initial state
has version ``j0-1 - ((j0-1-i) mod n)``: the id of the omitted slide that last
wrote it (negative when the window was not full yet).  The window state after
``T_k`` then holds, in sub-window ``i``, the newest committed slide ``j <= k``
with ``j mod n = i``.

Only the committed projection counts: an aborted slide did not move the window
(whether or not it wrote first) and an aborted or unfinished query returned
nothing.  A committed slide writes its sub-window once, and committed slides must
write in subscript order, as the paper's streams generate them (Section 2.3).

Definition 1 (ws): every committed query reads a true state of the window as of
some point in the past or present, i.e. the versions it read are those of the
state after some ``T_k`` (or the initial state).  Sub-windows a query does not
read are unconstrained, so a query over part of the window only has to agree
with some state on the sub-windows it reads.  The paper asks for a serializable
history as well; that follows here, since queries only read and slides only
write one sub-window each in subscript order (a cycle in the conflict graph would
make some query read a newer version of one sub-window and an older version of
another than any state holds).

Definition 2 (lws): the history is ws and every committed query reads the state
of the window that reflects all the slides that committed before the query
committed: a state ``T_k`` its reads agree with must have ``k`` at least the
newest slide id committed before the query's commit.

Both checks are linear in the history.  Versions are unique integers, so for each
version we record the id of the committed slide that replaced it; a query with
read versions ``V`` agrees with the state after ``T_k`` iff ``max V <= k <
min next(V)`` (Theorem 1: slides serialized before it precede those serialized
after it), so ws holds for it iff ``max V < min next(V)``, and lws iff moreover
``min next(V)`` exceeds the newest slide committed before it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from txstream.errors import TxStreamError
from txstream.model.check import CheckOptions, Verdict, register
from txstream.model.history import History

_NUMBER = re.compile(r"[0-9]+")


class WindowHistoryError(TxStreamError, ValueError):
    """A history that does not fit the sliding-window model of ws/lws."""


@dataclass
class _Query:
    """One committed query: its reads and the newest slide committed before it."""

    txn: str
    reads: list[tuple[int, int]] = field(default_factory=list)
    """``(sub-window, version)`` per read, in history order."""
    latest: int = 0
    """Id of the newest slide committed before the query committed (or the initial state)."""


@dataclass
class _Window:
    """What the checkers need to know about a window history."""

    subwindows: int
    initial: int
    """Label of the initial state: ``j0 - 1``."""
    replaced_by: dict[int, int]
    """Version -> id of the committed slide that overwrote it."""
    queries: list[_Query]
    slides: int
    """Number of committed slides."""


def _is_slide(txn: str) -> bool:
    return _NUMBER.fullmatch(txn) is not None


def _number(digits: str, what: str) -> int:
    """``int(digits)``, or a :class:`WindowHistoryError` past int()'s 4,300-digit limit."""
    try:
        return int(digits)
    except ValueError:
        raise WindowHistoryError(f"a {what} of {len(digits):,} digits is too large") from None


def _analyse(history: History, options: CheckOptions) -> _Window:
    """Validate ``history`` against the window model and compute every read version.

    Raises :class:`WindowHistoryError` naming the first thing that does not fit.
    """
    slide_item: dict[str, int] = {}
    top = -1
    for op in history.operations:
        if op.item is None:
            continue
        slide = _is_slide(op.txn)
        if slide and op.kind == "r":
            raise WindowHistoryError(
                f"transaction {op.txn} has a numeric id, so it is a window slide, but {op} "
                "reads; slides are write-only (give queries ids with a letter, e.g. Q1)"
            )
        if not slide and op.kind == "w":
            raise WindowHistoryError(
                f"query {op.txn} writes ({op}); only window slides (transactions with "
                "numeric ids) may write, queries are read-only"
            )
        if _NUMBER.fullmatch(op.item) is None:
            raise WindowHistoryError(
                f"{op} accesses item {op.item!r}, which is not a sub-window index (a number 0..n-1)"
            )
        index = _number(op.item, "sub-window index")
        if slide:
            if op.txn in slide_item:
                raise WindowHistoryError(
                    f"window slide {op.txn} writes more than once ({op}); a slide writes "
                    "exactly one sub-window"
                )
            slide_item[op.txn] = index
        top = max(top, index)

    n = options.subwindows
    if n is not None:
        if n < 1:
            raise WindowHistoryError(f"the number of sub-windows must be at least 1, not {n}")
        if top >= n:
            raise WindowHistoryError(
                f"sub-window {top} appears in the history, but the window has only {n} "
                f"sub-windows (0..{n - 1}); pass a larger --subwindows"
            )
    else:
        n = top + 1 if top >= 0 else 1

    committed = history.committed()
    slide_ids: dict[str, int] = {}
    seen: dict[int, str] = {}
    for txn in history.transactions():
        if not _is_slide(txn):
            continue
        j = _number(txn, "window slide id")
        if j in seen:
            raise WindowHistoryError(
                f"transactions {seen[j]} and {txn} both name window slide {j}; use one spelling"
            )
        seen[j] = txn
        if txn not in slide_item:
            if txn not in committed:  # aborted before its write: it did nothing
                continue
            raise WindowHistoryError(
                f"window slide {txn} writes no sub-window; a slide T_j writes sub-window j mod n"
            )
        if slide_item[txn] != j % n:
            hint = (
                ""
                if options.subwindows is not None
                else f" (n = {n} was inferred from the largest sub-window index; "
                "pass --subwindows if the window has more sub-windows)"
            )
            raise WindowHistoryError(
                f"window slide {txn} writes sub-window {slide_item[txn]}, but slide {j} "
                f"must write sub-window {j} mod {n} = {j % n}{hint}"
            )
        slide_ids[txn] = j

    initial = (min(seen) if seen else n) - 1
    # Sub-window -> its current version, filled in on first access: a list of all n
    # sub-windows cost memory in n, and n can be anything (an index 10^12 ran out).
    current: dict[int, int] = {}
    replaced_by: dict[int, int] = {}
    queries: dict[str, _Query] = {}
    last_write: int | None = None
    latest = initial
    slides = 0
    for op in history.operations:
        if op.txn not in committed:
            continue
        slide_id = slide_ids.get(op.txn)
        if slide_id is not None:
            j = slide_id
            if op.kind == "w":
                if last_write is not None and j < last_write:
                    raise WindowHistoryError(
                        f"window slide {op.txn} writes after slide {last_write}; committed "
                        "slides must run in subscript order (Golab et al., Section 2.3)"
                    )
                last_write = j
                index = j % n
                old = current.get(index)
                replaced_by[initial - (initial - index) % n if old is None else old] = j
                current[index] = j
            elif op.kind == "c":
                slides += 1
                latest = max(latest, j)
            continue
        query = queries.get(op.txn)
        if query is None:
            query = queries[op.txn] = _Query(op.txn)
        if op.kind == "r":
            assert op.item is not None
            index = int(op.item)
            v = current.get(index)
            query.reads.append((index, initial - (initial - index) % n if v is None else v))
        elif op.kind == "c":
            query.latest = latest
    return _Window(n, initial, replaced_by, list(queries.values()), slides)


def _version(v: int, window: _Window) -> str:
    if v > window.initial:
        return f"the version written by T{v}"
    return f"its initial version ({v})"


def _read_versions(query: _Query) -> dict[str, Any]:
    """Sub-window -> version read, as JSON (a list if one sub-window was read in several)."""
    out: dict[str, Any] = {}
    for index, v in query.reads:
        key = str(index)
        old = out.get(key)
        if old is None:
            out[key] = v
        elif isinstance(old, list):
            if v not in old:
                old.append(v)
        elif old != v:
            out[key] = [old, v]
    return out


def _judge(query: _Query, window: _Window, latest: bool) -> tuple[int, str | None]:
    """The state ``query`` read, and why it breaks the criterion (``None`` if it does not).

    For ws the state is the oldest one its reads agree with; for lws, the newest of
    that and the state after the slides committed before it.
    """
    state = window.initial
    newest_read: int | None = None
    for index, v in query.reads:
        if v > state:
            state, newest_read = v, index
    # The read whose version was overwritten first bounds the states it agrees with.
    first_replaced: tuple[int, int, int] | None = None
    for index, v in query.reads:
        nxt = window.replaced_by.get(v)
        if nxt is not None and (first_replaced is None or nxt < first_replaced[2]):
            first_replaced = (index, v, nxt)
    q = query.txn
    if first_replaced is not None and first_replaced[2] <= state:
        index, v, nxt = first_replaced
        if index == newest_read:
            why = (
                f"{q} read sub-window {index} in two versions, {v} and {state}: no state "
                "of the window holds both (Definition 1)"
            )
        else:
            why = (
                f"{q} read sub-window {newest_read} in the version written by T{state}, but "
                f"sub-window {index} in {_version(v, window)}, which T{nxt} had already "
                f"overwritten; no state of the window holds both (Definition 1)"
            )
        return state, why
    if not latest:
        return state, None
    if first_replaced is not None and first_replaced[2] <= query.latest:
        index, v, nxt = first_replaced
        if nxt == query.latest:
            cause = f"T{nxt} overwrote it and committed before {q} committed"
        else:
            cause = (
                f"T{nxt} overwrote it and T{query.latest} committed before {q} committed, "
                f"so the latest state (after T{query.latest}) holds T{nxt}'s version"
            )
        why = (
            f"{q} read sub-window {index} in {_version(v, window)}, but {cause}; it did not "
            "read the latest window state (Definition 2)"
        )
        return state, why
    return max(state, query.latest), None


def _verdict(criterion: str, history: History, options: CheckOptions) -> Verdict:
    window = _analyse(history, options)
    latest = criterion == "lws"
    states: dict[str, int] = {}
    violations: list[dict[str, Any]] = []
    for query in window.queries:
        state, why = _judge(query, window, latest)
        if why is None:
            states[query.txn] = state
            continue
        violation: dict[str, Any] = {"txn": query.txn, "read_versions": _read_versions(query)}
        if latest:
            violation["latest_state"] = query.latest
        violation["why"] = why
        violations.append(violation)
    evidence: dict[str, Any] = {
        "operations": len(history),
        "transactions": len(history.transactions()),
        "committed": window.slides + len(window.queries),
        "subwindows": window.subwindows,
        "slides": window.slides,
        "queries": len(window.queries),
        "initial_state": window.initial,
        "reads_state_after": states,
    }
    if violations:
        evidence["violations"] = violations
    return Verdict(criterion, not violations, evidence)


@register("ws", "window-serializability: every query reads a true window state (Golab et al.)")
def check_ws(history: History, options: CheckOptions) -> Verdict:
    """Window-serializability (Golab et al., Definition 1).

    Holds iff every committed query read the sub-windows in the versions of one
    window state, the initial one or the one after some committed slide.
    ``reads_state_after`` maps each such query to the oldest such state (the id of
    the slide after which it held; ``initial_state`` is ``j0 - 1``); otherwise
    ``violations`` lists the queries that did not, with the versions they read.
    """
    return _verdict("ws", history, options)


@register("lws", "latest-window-serializability: every query reads the latest window state")
def check_lws(history: History, options: CheckOptions) -> Verdict:
    """Latest-window-serializability (Golab et al., Definition 2).

    Holds iff the history is window-serializable and every committed query read a
    state that reflects every slide that committed before the query did.
    ``reads_state_after`` maps each such query to that state; a violation gives
    the query's read versions and ``latest_state``, the newest slide committed
    before it.
    """
    return _verdict("lws", history, options)
