"""Phase 2: the deferred multi-partition transactions, over their values' shipped rows.

:func:`run_deferred` runs them in the declared order in one place;
:func:`deferred_chains` cuts them into chains with disjoint rows that tasks run
at the same time.  See :mod:`.executor` for phase 1, which defers them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from txstream.spark.runtime.base import JobSpec, Row
from txstream.spark.runtime.boundaries import Event, Group
from txstream.spark.runtime.executor import GroupRunner
from txstream.spark.runtime.executor_tx import flat_tables
from txstream.spark.runtime.outcome import Outcome
from txstream.spark.runtime.partitioning import canonical
from txstream.spark.runtime.state import PartitionState


def run_deferred(
    job: JobSpec,
    batch: int,
    shipped_rows: Iterable[tuple[Any, dict[str, dict[Any, Row]]]],
    shipped_events: Iterable[tuple[str, Event]],
    abort: Mapping[str, Mapping[str, Any]],
    arrival: Callable[[Row], float | None] | None = None,
    partitions: int = 0,
) -> tuple[Outcome, list[tuple[Any, dict[str, dict[Any, Row]]]]]:
    """Phase 2: run every deferred transaction in the declared order over the shipped rows.

    Returns the outcome and, per shipped value, its rows afterwards (for phase 3).
    """
    state = PartitionState()
    state.use_flat(flat_tables(job))
    values = []
    for value, tables in shipped_rows:
        values.append(value)
        for table, rows in tables.items():
            if rows:
                state.set_rows(table, value, rows)
    state.begin(batch, pre_images=False)  # (a re-run starts again from the shipped rows)
    groups: dict[str, Group] = {}
    for gid, event in shipped_events:
        groups.setdefault(gid, Group(gid)).events.append(event)
    outcome = Outcome()
    runner = GroupRunner(job, state, outcome, arrival, partitions)
    for group in sorted(groups.values(), key=lambda g: min(e.order for e in g.events)):
        group.events.sort(key=lambda e: e.order)
        runner.run(group, abort)
    # A fragment may have created rows of values nobody shipped: they go back too.
    values += sorted(
        {v for t in job.tables for v in state.data.get(t, {})} - set(values), key=canonical
    )
    back = [(v, {t: dict(state.rows_of(t, v)) for t in job.tables}) for v in values]
    return outcome, back


def deferred_chains(
    shipped_rows: list[tuple[Any, dict[str, dict[Any, Row]]]],
    shipped_events: list[tuple[str, Event]],
    tasks: int,
) -> list[tuple[list[Any], list[tuple[str, Event]]]]:
    """Phase 2's work cut into ``tasks`` shares that can run at the same time.

    Deferred transactions that share a partition value are one *chain* (a
    connected component: union-find over each transaction's values); chains have
    disjoint rows, so running each in the declared order, in any task, keeps the
    history conflict-serializable in arrival order (the TStream/MorphStream idea
    of per-state operation chains).  Chains go to the least loaded share in the
    order of their first event, so every task computes the same cut.  A keyless
    fragment may touch any row of its partition: then everything is one chain.
    """
    shares: list[tuple[list[Any], list[tuple[str, Event]]]] = [([], []) for _ in range(tasks)]
    if tasks <= 1 or any(not e.values for _, e in shipped_events):
        return [(list(shipped_rows), list(shipped_events)), *shares[1:]]
    parent: dict[Any, Any] = {}

    def root(v: Any) -> Any:
        while parent.setdefault(v, v) != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    first: dict[str, Any] = {}  # transaction -> one of its values
    for gid, event in shipped_events:
        for value in event.values:
            if gid in first:
                a, b = root(first[gid]), root(value)
                if a != b:
                    parent[b] = a
            else:
                first[gid] = root(value)
    chains: dict[Any, list[tuple[str, Event]]] = {}
    for gid, event in sorted(shipped_events, key=lambda ge: ge[1].order):
        chains.setdefault(root(first[gid]), []).append((gid, event))
    load = [0] * tasks
    where: dict[Any, int] = {}
    for chain_root, events in chains.items():  # in the order of their first event
        k = load.index(min(load))
        where[chain_root] = k
        load[k] += len(events)
        shares[k][1].extend(events)
    for item in shipped_rows:
        value = item[0]
        shares[where.get(root(value), 0)][0].append(item)
    return shares
