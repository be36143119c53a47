"""The serial share of a batch of transactions, counted on a model of the runtime's schedule.

The share of a batch's events executed while other partitions sit idle waiting
for them says whether a design scales past the cores at hand, and it can be
*counted* on any machine (it needs no timing, so two cores can show what 32
partitions would do).  The model (issue 28):

* each partition executes one event per step; a transaction is one event;
* a transaction runs at its *home* partition, the partition of its first key
  (partition 0 for a keyless global read such as an audit), and costs its event
  there; the other participants do no work for it;
* it may run only when, for each of its values, every earlier transaction
  (declared order) touching that value has finished (in an earlier step); a
  global read touches every value of every partition, so it waits for every
  earlier transaction and every later one waits for it (a barrier);
* per step each partition runs its earliest ready transaction, looking past
  blocked ones;
* a partition *idle-waits* in a step when it has unfinished transactions but
  none is ready.

``serial_share`` = events executed in steps in which at least one other
partition idle-waits / all events.  ``hot_floor`` = the largest, over
partitions, of the transactions touching the partition's hottest value over
the partition's events: the share that the hottest keys alone force (their
transactions run one after another, whatever the design).

Partitions are those of the runtime (:func:`~txstream.spark.runtime.partitioning.partition_of`).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from txstream.spark.runtime.base import Key
from txstream.spark.runtime.partitioning import partition_of

Txn = Sequence[Key]
"""A transaction's partition values in order (the first is its home's); empty: a global read."""


def _homes(txns: Sequence[Txn], partitions: int) -> list[int]:
    cache: dict[Key, int] = {}
    homes = []
    for keys in txns:
        if not keys:
            homes.append(0)
            continue
        first = keys[0]
        home = cache.get(first)
        if home is None:
            home = cache[first] = partition_of(first, partitions)
        homes.append(home)
    return homes


def serial_events(txns: Sequence[Txn], partitions: int) -> int:
    """Events of ``txns`` executed while another partition idle-waits (see the module)."""
    n = len(txns)
    homes = _homes(txns, partitions)
    waiting = [0] * n  # earlier transactions each one still waits for
    dependents: list[list[int]] = [[] for _ in range(n)]
    last: dict[Key, int] = {}  # the latest transaction touching each value
    barrier = -1  # the latest global read
    since: list[int] = []  # transactions after it
    for i, keys in enumerate(txns):
        deps: set[int]
        if not keys:
            # Transactions on one value run in order, so waiting for the last
            # one on each value waits for all; a barrier waits for everything.
            deps = set(since)
            if barrier >= 0:
                deps.add(barrier)
            last.clear()
            barrier, since = i, []
        else:
            deps = set()
            for k in keys:
                j = last.get(k, barrier)
                if j >= 0:
                    deps.add(j)
                last[k] = i
            deps.discard(i)
            since.append(i)
        waiting[i] = len(deps)
        for j in deps:
            dependents[j].append(i)
    ready: list[list[int]] = [[] for _ in range(partitions)]
    unfinished = [0] * partitions
    for i in range(n):
        unfinished[homes[i]] += 1
        if not waiting[i]:
            ready[homes[i]].append(i)  # in index order: already a heap
    serial = done = 0
    active = [p for p in range(partitions) if unfinished[p]]
    while done < n:
        ran = []
        idle = False
        for p in active:
            if ready[p]:
                ran.append(heapq.heappop(ready[p]))
            else:
                idle = True
        if not ran:
            raise AssertionError("no transaction ready: the dependencies form a cycle")
        if idle:
            serial += len(ran)
        for i in ran:
            unfinished[homes[i]] -= 1
            for k in dependents[i]:
                waiting[k] -= 1
                if not waiting[k]:
                    heapq.heappush(ready[homes[k]], k)
        done += len(ran)
        active = [p for p in active if unfinished[p]]
    return serial


def hot_floor(txns: Sequence[Txn], partitions: int) -> float:
    """The largest, over partitions, of (transactions touching its hottest value / its events).

    The serial share that the hottest values alone force.  A partition's events
    are the transactions whose home it is; a value's transactions are those with
    it among their keys, wherever their home (global reads are barriers, not hot
    values, and are not counted).  Capped at 1: a hot value's transactions may
    outnumber its partition's events.  A partition without events is left out.
    """
    homes = _homes(txns, partitions)
    events = Counter(homes)
    touches: Counter[Key] = Counter()
    for keys in txns:
        touches.update(set(keys))
    hottest: dict[int, int] = {}
    for value, count in touches.items():
        p = partition_of(value, partitions)
        if count > hottest.get(p, 0):
            hottest[p] = count
    shares = [min(1.0, c / events[p]) for p, c in hottest.items() if events[p]]
    return max(shares, default=0.0)


def serial_share(txns: Sequence[Txn], partitions: int) -> float:
    """``serial_events / len(txns)`` (0 for no transactions): see the module."""
    return serial_events(txns, partitions) / len(txns) if txns else 0.0


def batched(txns: Sequence[Txn], partitions: int, batch: int) -> tuple[float, float]:
    """``(serial_share, hot_floor)`` over batches of ``batch`` transactions, weighted by size.

    The runtime schedules each micro-batch on its own, so the model runs per batch.
    """
    if batch < 1:
        raise ValueError(f"batch must be at least 1, not {batch}")
    serial = 0
    floor = 0.0
    for start in range(0, len(txns), batch):
        part = txns[start : start + batch]
        serial += serial_events(part, partitions)
        floor += hot_floor(part, partitions) * len(part)
    n = len(txns)
    return (serial / n, floor / n) if n else (0.0, 0.0)


def keys_of(stream: Iterable[tuple[str, dict[str, Any]]]) -> list[Txn]:
    """A ledger stream's transactions as keys (deposit: acct; transfer: src, dst; audit: none)."""
    out: list[Txn] = []
    for name, event in stream:
        if name == "deposits":
            out.append((event["acct"],))
        elif name == "transfers":
            out.append((event["src"], event["dst"]))
        else:
            out.append(())
    return out


INPUTS: tuple[tuple[str, str, float, int, int], ...] = (
    ("uniform, 100,000 accounts", "uniform", 0.0, 100_000, 0),
    ("uniform, 1,000 accounts", "uniform", 0.0, 1_000, 0),
    ("zipf 0.8, 100,000 (hot floor)", "zipf", 0.8, 100_000, 0),
    ("zipf 1.2, 100,000 (hot floor)", "zipf", 1.2, 100_000, 0),
    ("uniform + an audit every 1,000", "uniform", 0.0, 100_000, 1_000),
)
"""The benchmark's inputs that :func:`table` counts: label, pattern, skew, accounts, audits."""


def table(events: int = 300_000, seed: int = 1, batch: int = 72_000) -> str:
    """Serial share (and hot floor for zipf) of the benchmark's inputs at 2, 8 and 32 partitions.

    A Markdown table, as in docs/benchmarks.md: ``python -m txstream.bench.schedule``.
    """
    from txstream.bench.ledger import events as ledger_events

    parts = (2, 8, 32)
    lines = ["| input | " + " | ".join(f"P = {p}" for p in parts) + " |"]
    lines.append("|---|" + "---|" * len(parts))
    for label, pattern, skew, accounts, audit_every in INPUTS:
        stream = ledger_events(
            events, accounts, 0, seed, pattern=pattern, skew=skew, audit_every=audit_every
        )
        txns = keys_of(stream)
        cells = []
        for p in parts:
            share, floor = batched(txns, p, batch)
            cell = f"{100 * share:.1f}%"
            cells.append(cell + (f" ({100 * floor:.1f}%)" if pattern == "zipf" else ""))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
