"""Hypothesis strategies for small random histories, shared by the model tests."""

from __future__ import annotations

from hypothesis import strategies as st

from txstream.model import History, Operation


@st.composite
def histories(
    draw: st.DrawFn,
    max_txns: int = 4,
    items: tuple[str, ...] = ("x", "y", "z"),
    with_arrivals: bool = True,
) -> History:
    """A random interleaving of up to ``max_txns`` small transactions.

    Each transaction does 1-3 reads/writes and then commits, aborts, or stays
    active; some streams declare arrival orders over a subset of them.
    """
    n = draw(st.integers(1, max_txns))
    programs: list[list[Operation]] = []
    for t in range(1, n + 1):
        ops = [
            Operation(draw(st.sampled_from("rw")), str(t), draw(st.sampled_from(items)))
            for _ in range(draw(st.integers(1, 3)))
        ]
        end = draw(st.sampled_from(["c", "c", "c", "a", None]))
        if end is not None:
            ops.append(Operation(end, str(t)))
        programs.append(ops)
    # Interleave: repeatedly pick a transaction that still has operations.
    cursors = [0] * n
    merged: list[Operation] = []
    while any(cursors[i] < len(programs[i]) for i in range(n)):
        live = [i for i in range(n) if cursors[i] < len(programs[i])]
        i = draw(st.sampled_from(live))
        merged.append(programs[i][cursors[i]])
        cursors[i] += 1
    arrivals: dict[str, list[str]] = {}
    if with_arrivals:
        for stream in draw(st.lists(st.sampled_from(["S", "U"]), unique=True, max_size=2)):
            order = draw(st.permutations([str(t) for t in range(1, n + 1)]))
            size = draw(st.integers(0, n))
            arrivals[stream] = list(order[:size])
    return History(merged, arrivals)
