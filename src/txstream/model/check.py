"""Correctness criteria as checkers, and the registry that names them.

A checker takes a :class:`History` and returns a :class:`Verdict`: whether the
criterion holds, and evidence either way (a serial order when it holds, a cycle
or the violating transactions when it does not).  Checkers are selected by the
names users type: ``cs``, ``csao``, ``ws``, ``lws``, ``uc``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from txstream.errors import UnknownNameError
from txstream.model.conflict import ConflictGraph, Witness, conflict_graph, no_gc
from txstream.model.graph import find_cycle, topological_order
from txstream.model.history import History


@dataclass(frozen=True)
class CheckOptions:
    """Settings a criterion may need; ``subwindows`` is n for ``ws``/``lws``."""

    subwindows: int | None = None


@dataclass
class Verdict:
    """The outcome of checking one history against one criterion.

    ``evidence`` is JSON-ready: a ``serial_order`` when the criterion holds, and
    e.g. a ``cycle`` (edges with their reasons) or ``violations`` when it does not.
    """

    criterion: str
    holds: bool
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The JSON object printed by ``txstream check``."""
        return {"criterion": self.criterion, "holds": self.holds, **self.evidence}


Checker = Callable[[History, CheckOptions], Verdict]

_CHECKERS: dict[str, tuple[Checker, str]] = {}


def register(name: str, summary: str) -> Callable[[Checker], Checker]:
    """Class the decorated function as the checker called ``name``."""

    def deco(fn: Checker) -> Checker:
        _CHECKERS[name] = (fn, summary)
        return fn

    return deco


def criteria() -> dict[str, str]:
    """Every criterion name with a one-line summary, in registration order."""
    _load_all()
    return {name: summary for name, (_, summary) in _CHECKERS.items()}


def get_checker(name: str) -> Checker:
    """The checker called ``name``; :class:`UnknownNameError` otherwise."""
    _load_all()
    try:
        return _CHECKERS[name][0]
    except KeyError:
        raise UnknownNameError("criterion", name, list(_CHECKERS)) from None


def check(history: History, criterion: str = "cs", options: CheckOptions | None = None) -> Verdict:
    """Check ``history`` against ``criterion``."""
    checker = get_checker(criterion)
    with no_gc():
        return checker(history, options or CheckOptions())


def _load_all() -> None:
    # The window and broadcast criteria live in their own modules; importing them
    # registers them.  Done lazily to keep the import graph one-way.
    from txstream.model import uc_check, window_check  # noqa: F401


def edge_evidence(
    a: str, b: str, witness: Witness | None, stream: str | None = None
) -> dict[str, Any]:
    """One edge of a cycle, as JSON: a conflict with its operations, or an arrival order."""
    if witness is not None:
        return {
            "from": a,
            "to": b,
            "reason": "conflict",
            "item": witness.item,
            "operations": [str(witness.first), str(witness.second)],
        }
    return {"from": a, "to": b, "reason": "arrival", "stream": stream}


def cycle_evidence(graph: ConflictGraph) -> list[dict[str, Any]]:
    """The edges of a cycle of ``graph`` (which has one: it has no serial order), with why."""
    cycle = graph.cycle()
    assert cycle is not None  # no topological order means there is a cycle
    return [
        edge_evidence(a, b, graph.succ[a][b])
        for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True)
    ]


def _summary(history: History, graph: ConflictGraph) -> dict[str, Any]:
    outcomes = history.outcomes()
    return {
        "operations": len(history),
        "transactions": len(outcomes) + len(set(history.transactions()) - set(outcomes)),
        "committed": len(graph.nodes),
    }


@register("cs", "conflict-serializability of the committed projection")
def check_cs(history: History, options: CheckOptions) -> Verdict:
    """Conflict-serializability (EDBT 2012 Def. 7): the conflict graph is acyclic."""
    graph = conflict_graph(history)
    order = graph.serial_order()
    evidence = _summary(history, graph)
    if order is not None:
        return Verdict("cs", True, {**evidence, "serial_order": order})
    return Verdict("cs", False, {**evidence, "cycle": cycle_evidence(graph)})


@register("csao", "conflict-serializability with arrival ordering (EDBT 2012 Def. 9)")
def check_csao(history: History, options: CheckOptions) -> Verdict:
    """CSAO: a conflict-equivalent serial order that also follows every arrival order.

    Arrival orders become extra edges between consecutive committed transactions
    of each stream; the criterion holds iff conflicts plus those edges are acyclic.
    """
    graph = conflict_graph(history)
    arrival_edges: dict[tuple[str, str], str] = {}
    succ: dict[str, dict[str, Witness | None]] = {a: dict(out) for a, out in graph.succ.items()}
    committed = set(graph.nodes)
    for stream, txns in history.arrivals.items():
        kept = [t for t in txns if t in committed]
        for a, b in itertools.pairwise(kept):
            if b not in succ[a]:
                succ[a][b] = None
                arrival_edges[(a, b)] = stream
    evidence = _summary(history, graph)
    order = topological_order(graph.nodes, succ)
    if order is not None:
        return Verdict("csao", True, {**evidence, "serial_order": order})
    cycle = find_cycle(graph.nodes, succ)
    assert cycle is not None
    edges = [
        edge_evidence(a, b, succ[a][b], arrival_edges.get((a, b)))
        for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True)
    ]
    return Verdict("csao", False, {**evidence, "cycle": edges})
