"""Small directed-graph helpers shared by the checkers: ordering and cycle finding.

Nodes are kept in insertion order so that every answer (a serial order, a cycle)
is deterministic for a given history.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

N = TypeVar("N", bound=Hashable)


def topological_order(nodes: Iterable[N], succ: Mapping[N, Iterable[N]]) -> list[N] | None:
    """A topological order of the graph, or ``None`` when it has a cycle.

    Ties are broken by the position of a node in ``nodes``, so the order is the
    one "closest" to the input order (for a serial history: itself).
    """
    order = list(nodes)
    index = {n: i for i, n in enumerate(order)}
    indegree = dict.fromkeys(order, 0)
    for n in order:
        for m in succ.get(n, ()):
            indegree[m] += 1
    ready = [index[n] for n in order if indegree[n] == 0]
    heapq.heapify(ready)
    result: list[N] = []
    while ready:
        n = order[heapq.heappop(ready)]
        result.append(n)
        for m in succ.get(n, ()):
            indegree[m] -= 1
            if indegree[m] == 0:
                heapq.heappush(ready, index[m])
    return result if len(result) == len(order) else None


def find_cycle(nodes: Iterable[N], succ: Mapping[N, Iterable[N]]) -> list[N] | None:
    """One directed cycle as ``[n0, n1, ..., nk]`` with an edge nk -> n0, or ``None``.

    Iterative depth-first search, so million-node graphs do not hit the recursion limit.
    """
    white, grey, black = 0, 1, 2
    colour: dict[N, int] = {}
    for root in nodes:
        if colour.get(root, white) != white:
            continue
        colour[root] = grey
        path = [root]
        stack = [iter(succ.get(root, ()))]
        while stack:
            for m in stack[-1]:
                c = colour.get(m, white)
                if c == grey:
                    return path[path.index(m) :]
                if c == white:
                    colour[m] = grey
                    path.append(m)
                    stack.append(iter(succ.get(m, ())))
                    break
            else:
                colour[path.pop()] = black
                stack.pop()
    return None
