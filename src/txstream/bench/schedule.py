"""The serial share of a batch of transactions, counted on a model of the runtime's schedule.

The share of a batch's events executed while other partitions sit idle waiting
for them says whether a design scales past the cores at hand, and it can be
*counted* on any machine (it needs no timing, so two cores can show what 32
partitions would do).  The model (issue 28):

* each partition executes one event per step; a transaction is one event;
* a transaction runs at its *home* partition, the partition of its first key
  (partition 0 for a keyless global read such as an audit), and costs its event
  there; the other participants do no work for it; but a partition with at
  least ``P`` more transactions than another hands it some of those whose two
  values live on the two (:func:`rehome`, the runtime's
  :func:`~txstream.spark.runtime.forward.announce.handed`): the peer is their home;
* each partition *admits* its transactions (those with a value there, and
  every global read) in the declared order, ``chunk`` at a time (the runtime's
  admission round, 128) whenever nothing of its own is ready; a transaction
  may run once every participant admitted it and, for each of its values,
  every earlier transaction touching that value finished (in an earlier step);
* a global read is not a barrier (the runtime's rule since session 21,
  :meth:`~txstream.spark.runtime.forward.reads._Reads._read_past`): each
  partition takes its part (its partial totals) once the transactions it
  admitted before the read finished, and admits and runs later ones meanwhile;
  the read runs at partition 0 once every part is taken, and nothing waits for
  it.  Up to ``reads`` (the runtime's ``READS_PAST``) at a time per partition:
  a read admitted while that many earlier ones' parts still wait there is a
  barrier of that partition (admission stops until
  everything admitted there finished; then its part is taken);
* from :data:`~txstream.spark.runtime.forward.base.LEND_FROM` partitions on, a
  partition also *lends ahead* every step (the runtime's
  :meth:`~txstream.spark.runtime.forward.admission._Admission.lend_ahead`, once a round
  there): up to ``lend`` transactions past its admission point, a transaction
  whose home is elsewhere and whose values there no earlier transaction not
  admitted yet touches is admitted there at once; nothing is lent past a global
  read not admitted yet;
* per step each partition runs its earliest ready transaction, looking past
  blocked ones;
* a partition *idle-waits* in a step when it has unfinished transactions but
  none is ready (and it can admit nothing that is).

``serial_share`` = events executed in steps in which at least one other
partition idle-waits / all events.  ``hot_floor`` = the largest, over
partitions, of the transactions touching the partition's hottest value over
the partition's events: the share that the hottest keys alone force (their
transactions run one after another, whatever the design).

Partitions are those of the runtime (:func:`~txstream.spark.runtime.partitioning.partition_of`).
Keyless fragments (barriers of their partition in the runtime) are not
modelled: a transaction without keys is a global read.  Which read parts the
rule makes barriers agrees with the runtime's partitions on the same input
(``scripts/schedule-vs-runtime.py``).
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from txstream.spark.runtime.base import Key
from txstream.spark.runtime.forward import (
    ADMIT_CHUNK,
    LEND_AHEAD,
    LEND_FROM,
    READS_PAST,
    handed,
)
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


def rehome(txns: Sequence[Txn], homes: list[int], partitions: int) -> int:
    """Hand transactions to their other participant as the runtime does; how many moved.

    Per pair of partitions (a, b), the transactions of two values homed at ``a``
    whose other value lives on ``b`` are ``a``'s candidates for ``b``, in the
    declared order; :func:`~txstream.spark.runtime.forward.announce.handed` picks those
    that ``b`` runs instead, from the two partitions' counts of transactions
    homed there (by their first key: the runtime's rows before they are
    announced).  ``homes`` is changed in place.
    """
    rows = [0] * partitions
    for i, keys in enumerate(txns):
        if keys:
            rows[homes[i]] += 1
    cache: dict[Key, int] = {}
    candidates: dict[tuple[int, int], list[int]] = {}
    for i, keys in enumerate(txns):
        if len(keys) != 2:  # (the runtime hands transactions of two values only)
            continue
        ps = []
        for k in keys:
            p = cache.get(k)
            if p is None:
                p = cache[k] = partition_of(k, partitions)
            ps.append(p)
        a = homes[i]
        others = set(ps) - {a}
        if len(others) == 1:
            candidates.setdefault((a, others.pop()), []).append(i)
    moved = 0
    for (a, b), mine in candidates.items():
        for j in handed(rows[a], rows[b], partitions, len(mine)):
            homes[mine[j]] = b
            moved += 1
    return moved


@dataclass
class Counts:
    """What :func:`count` found in one batch's schedule (see the module)."""

    serial: int = 0
    """Events executed in steps in which another partition idle-waited."""
    past: int = 0
    """Global reads' parts admitted past: later transactions went on (per partition)."""
    at_once: int = 0
    """Parts that met nothing unfinished: taken when admitted (per partition)."""
    barriers: int = 0
    """Parts that met an earlier read still waiting: admission stopped (per partition)."""
    lent: int = 0
    """Crossing transactions' parts admitted ahead of their place (per participant)."""
    handed: int = 0
    """Crossing transactions run by their other participant instead of their first key's."""


def count(
    txns: Sequence[Txn],
    partitions: int,
    chunk: int = ADMIT_CHUNK,
    reads: int = READS_PAST,
    lend: int | None = None,
    hand: bool = True,
) -> Counts:
    """Schedule one batch of ``txns`` on ``partitions`` as the module says; what it counted.

    ``chunk``: transactions a partition admits at a time when nothing of its own
    is ready (the runtime's admission round, :data:`~txstream.spark.runtime.forward.ADMIT_CHUNK`).
    ``reads``: global reads a partition admits past at a time (the runtime's
    :data:`~txstream.spark.runtime.forward.base.READS_PAST`; 1 until session 22).
    ``lend``: how far past its admission point a partition lends ahead (0: not
    at all, as until session 23; None: the runtime's,
    :data:`~txstream.spark.runtime.forward.base.LEND_AHEAD` from
    :data:`~txstream.spark.runtime.forward.base.LEND_FROM` partitions on).
    ``hand``: whether partitions hand crossing transactions over as the runtime
    does (:func:`rehome`; False: every transaction runs at its first key's
    partition, as until session 24).
    """
    if lend is None:
        lend = LEND_AHEAD if partitions >= LEND_FROM else 0
    if lend < 0:
        raise ValueError(f"lend must be at least 0, not {lend}")
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, not {chunk}")
    if reads < 1:
        raise ValueError(f"reads must be at least 1, not {reads}")
    n = len(txns)
    found = Counts()
    homes = _homes(txns, partitions)
    if hand:
        found.handed = rehome(txns, homes, partitions)
    cache: dict[Key, int] = {}
    # Per partition, its transactions in the declared order: those with a value
    # there, and every global read.
    lists: list[list[int]] = [[] for _ in range(partitions)]
    spans: list[tuple[int, ...]] = []
    every = tuple(range(partitions))
    for i, keys in enumerate(txns):
        if not keys:
            spans.append(every)
        else:
            ps = []
            for k in keys:
                p = cache.get(k)
                if p is None:
                    p = cache[k] = partition_of(k, partitions)
                ps.append(p)
            spans.append(tuple(sorted(set(ps))))
        for p in spans[i]:
            lists[p].append(i)
    admitted = [0] * partitions  # the next position to admit in each list
    unadmitted = [len(s) for s in spans]  # partitions that have not admitted it yet
    need = [0] * n  # values on which an earlier transaction still holds it
    parts_left = [0] * n  # a global read's parts not taken yet
    queues: dict[Key, deque[int]] = {}
    inflight = [0] * partitions  # admitted there, not finished (global reads aside)
    epoch = [0] * partitions
    since: dict[tuple[int, int], int] = {}  # (transaction, partition) -> epoch when admitted
    # Per partition, the reads admitted past whose parts wait: [read, its epoch,
    # the items admitted before it not finished].
    reading: list[deque[list[int]]] = [deque() for _ in range(partitions)]
    barrier: list[int] = [-1] * partitions
    ready: list[list[int]] = [[] for _ in range(partitions)]
    unfinished = [0] * partitions
    for i in range(n):
        unfinished[homes[i]] += 1
        if not txns[i]:
            parts_left[i] = partitions

    def enqueue(i: int) -> None:
        if not unadmitted[i] and not need[i] and not parts_left[i]:
            heapq.heappush(ready[homes[i]], i)

    def take(i: int) -> None:  # a global read's part is taken
        parts_left[i] -= 1
        enqueue(i)

    def admit(p: int) -> None:
        """Admit up to ``chunk`` more of partition ``p``'s transactions."""
        mine = lists[p]
        for _ in range(chunk):
            if barrier[p] >= 0 or admitted[p] == len(mine):
                return
            i = mine[admitted[p]]
            admitted[p] += 1
            if lent and (i, p) in lent:
                lent.discard((i, p))  # (it entered when lent)
                continue
            keys = txns[i]
            if not keys:
                unadmitted[i] -= 1
                if inflight[p] == 0:
                    found.at_once += 1
                    take(i)
                elif len(reading[p]) < reads:
                    found.past += 1
                    epoch[p] += 1
                    reading[p].append([i, epoch[p], inflight[p]])
                else:
                    found.barriers += 1
                    barrier[p] = i
                continue
            enter(i, p)

    def enter(i: int, p: int) -> None:
        """Partition ``p`` admits keyed transaction ``i``: it queues on its values there."""
        unadmitted[i] -= 1
        since[i, p] = epoch[p]
        inflight[p] += 1
        for k in dict.fromkeys(txns[i]):
            if cache[k] != p:
                continue
            queue = queues.get(k)
            if queue is None:
                queues[k] = deque((i,))
            else:
                queue.append(i)
                need[i] += 1
        enqueue(i)

    lent: set[tuple[int, int]] = set()  # (transaction, partition) lent ahead, not reached
    scan = [0] * partitions  # where each partition's look-ahead stopped
    seen: list[set[Key]] = [set() for _ in range(partitions)]  # values there not lent
    stopped = [False] * partitions  # the look-ahead met a global read

    def lend_ahead(p: int) -> None:
        """Partition ``p`` lends ahead (see the module), up to ``lend`` past its admission."""
        mine = lists[p]
        if scan[p] <= admitted[p]:
            scan[p] = admitted[p]
            seen[p].clear()
            stopped[p] = False
        if stopped[p] or barrier[p] >= 0:
            return
        end = min(len(mine), admitted[p] + lend)
        values = seen[p]
        while scan[p] < end:
            i = mine[scan[p]]
            keys = txns[i]
            if not keys:
                stopped[p] = True
                return
            scan[p] += 1
            here = [k for k in keys if cache[k] == p]
            if homes[i] != p and values.isdisjoint(here):
                lent.add((i, p))
                found.lent += 1
                enter(i, p)
            else:
                values.update(here)

    def finish(i: int) -> None:
        keys = txns[i]
        unfinished[homes[i]] -= 1
        if not keys:
            return
        for k in dict.fromkeys(keys):
            queue = queues[k]
            queue.popleft()
            if queue:
                j = queue[0]
                need[j] -= 1
                enqueue(j)
            else:
                del queues[k]
        for p in spans[i]:
            inflight[p] -= 1
            admitted_in = since.pop((i, p))
            waits = reading[p]
            if waits and admitted_in < waits[-1][1]:
                for entry in list(waits):
                    if admitted_in < entry[1]:
                        entry[2] -= 1
                        if entry[2] == 0:
                            waits.remove(entry)
                            take(entry[0])
            b = barrier[p]
            if b >= 0 and inflight[p] == 0:
                barrier[p] = -1
                take(b)

    done = 0
    active = [p for p in range(partitions) if unfinished[p]]
    while done < n:
        # A runtime round admits a chunk and then runs all that is ready before the
        # next: so a partition looks further ahead only once it ran out of work,
        # which also bounds how far it gets past a read before its part is taken.
        for p in range(partitions):
            while not ready[p] and barrier[p] < 0 and admitted[p] < len(lists[p]):
                admit(p)
            if lend:
                lend_ahead(p)
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
            found.serial += len(ran)
        for i in ran:
            finish(i)
        done += len(ran)
        active = [p for p in active if unfinished[p]]
    return found


def serial_events(
    txns: Sequence[Txn], partitions: int, chunk: int = ADMIT_CHUNK, reads: int = READS_PAST
) -> int:
    """Events of ``txns`` executed while another partition idle-waits (see :func:`count`)."""
    return count(txns, partitions, chunk, reads).serial


def hot_floor(txns: Sequence[Txn], partitions: int) -> float:
    """The largest, over partitions, of (transactions touching its hottest value / its events).

    The serial share that the hottest values alone force.  A partition's events
    are the transactions whose home it is; a value's transactions are those with
    it among their keys, wherever their home (global reads touch no value and
    are not counted).  Capped at 1: a hot value's transactions may
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


def batched(
    txns: Sequence[Txn], partitions: int, batch: int, reads: int = READS_PAST
) -> tuple[float, float]:
    """``(serial_share, hot_floor)`` over batches of ``batch`` transactions, weighted by size.

    The runtime schedules each micro-batch on its own, so the model runs per batch
    (``reads``: see :func:`count`).
    """
    if batch < 1:
        raise ValueError(f"batch must be at least 1, not {batch}")
    serial = 0
    floor = 0.0
    for start in range(0, len(txns), batch):
        part = txns[start : start + batch]
        serial += serial_events(part, partitions, reads=reads)
        floor += hot_floor(part, partitions) * len(part)
    n = len(txns)
    return (serial / n, floor / n) if n else (0.0, 0.0)


@dataclass(frozen=True)
class Placement:
    """What co-locating each connected group of a batch's transactions would leave crossing.

    Counted by :func:`placement`; shares are of the batch's transactions with keys.
    """

    crossing: float
    """Transactions whose values live on several partitions, values placed by hash (today)."""
    placed_crossing: float
    """The same after placement: those of groups too big for one partition, left by hash."""
    moved: float
    """Rows moved per transaction, one way (each goes back at the batch's end)."""
    load: float
    """The busiest partition's transactions over the mean, after placement."""


def _components(txns: Sequence[Txn]) -> dict[Key, Key]:
    """Each value of ``txns`` -> its group's root: values joined by sharing a transaction."""
    parent: dict[Key, Key] = {}

    def root(x: Key) -> Key:
        r = x
        while parent[r] != r:
            r = parent[r]
        while parent[x] != r:  # (path compression)
            parent[x], x = r, parent[x]
        return r

    for keys in txns:
        for k in keys:
            parent.setdefault(k, k)
        for a, b in pairwise(keys):
            ra, rb = root(a), root(b)
            if ra != rb:
                parent[ra] = rb
    return {k: root(k) for k in parent}


def placement(txns: Sequence[Txn], partitions: int, slack: float = 0.0) -> Placement:
    """Count what a per-batch placement of connected transactions would leave crossing.

    A design the runtime does not run yet (issue 28, docs/architecture.md): the
    values that one batch's transactions connect (a transfer joins its two
    accounts) form groups; a group placed whole on one partition for the batch
    (its rows moved there before the batch and back after it) runs there with
    no transaction crossing.  Greedy, deterministic: groups larger than
    ``(1 + slack)`` times a partition's fair share of transactions stay where
    hash placement puts their values (their crossing transactions remain, run
    as today); the others, largest first, go to the partition that holds most
    of their values and has room, else the least loaded one.  Global reads
    join no values.
    """
    keyed = [keys for keys in txns if keys]
    n = len(keyed)
    if n == 0 or partitions < 2:
        return Placement(0.0, 0.0, 0.0, 1.0)
    root_of = _components(keyed)
    cache: dict[Key, int] = {}

    def part(value: Key) -> int:
        p = cache.get(value)
        if p is None:
            p = cache[value] = partition_of(value, partitions)
        return p

    events: Counter[Key] = Counter(root_of[keys[0]] for keys in keyed)
    values: defaultdict[Key, list[Key]] = defaultdict(list)
    for value, r in root_of.items():
        values[r].append(value)
    capacity = (1 + slack) * n / partitions
    load = [0] * partitions
    big = {r for r, count in events.items() if count > capacity}
    for keys in keyed:  # (a big group's transactions run at their hash homes)
        if root_of[keys[0]] in big:
            load[part(keys[0])] += 1
    moved = 0
    for r, count in sorted(events.items(), key=lambda item: (-item[1], repr(item[0]))):
        if r in big:
            continue
        held = Counter(part(v) for v in values[r])
        ranked = sorted(held, key=lambda p: (-held[p], p))
        to = next((p for p in ranked if load[p] + count <= capacity), None)
        if to is None:
            to = min(range(partitions), key=lambda p: (load[p], p))
        load[to] += count
        moved += len(values[r]) - held[to]
    crossing = placed = 0
    for keys in keyed:
        if len({part(k) for k in keys}) > 1:
            crossing += 1
            if root_of[keys[0]] in big:
                placed += 1
    return Placement(crossing / n, placed / n, moved / n, max(load) / (n / partitions))


def batched_placement(txns: Sequence[Txn], partitions: int, batch: int) -> Placement:
    """:func:`placement` per batch of ``batch`` transactions, weighted by size."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, not {batch}")
    sums = [0.0, 0.0, 0.0, 0.0]
    n = 0
    for start in range(0, len(txns), batch):
        part = txns[start : start + batch]
        found = placement(part, partitions)
        for i, x in enumerate((found.crossing, found.placed_crossing, found.moved, found.load)):
            sums[i] += x * len(part)
        n += len(part)
    if n == 0:
        return Placement(0.0, 0.0, 0.0, 1.0)
    return Placement(*(x / n for x in sums))


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


PARTITIONS = (2, 8, 32)
"""The partition counts of the tables below."""


def _grid(
    events: int, seed: int, cell: Callable[[list[Txn], int, str], str], short: bool = False
) -> str:
    """A Markdown table: per input of :data:`INPUTS`, ``cell(txns, P, pattern)`` per P."""
    from txstream.bench.ledger import events as ledger_events

    lines = ["| input | " + " | ".join(f"P = {p}" for p in PARTITIONS) + " |"]
    lines.append("|---|" + "---|" * len(PARTITIONS))
    for label, pattern, skew, accounts, audit_every in INPUTS:
        stream = ledger_events(
            events, accounts, 0, seed, pattern=pattern, skew=skew, audit_every=audit_every
        )
        txns = keys_of(stream)
        cells = [cell(txns, p, pattern) for p in PARTITIONS]
        name = label.split(" (")[0] if short else label
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(events: int = 300_000, seed: int = 1, batch: int = 72_000) -> str:
    """Serial share (and hot floor for zipf) of the benchmark's inputs at 2, 8 and 32 partitions.

    A Markdown table, as in docs/benchmarks.md: ``python -m txstream.bench.schedule``.
    """

    def cell(txns: list[Txn], p: int, pattern: str) -> str:
        share, floor = batched(txns, p, batch)
        return f"{100 * share:.1f}%" + (f" ({100 * floor:.1f}%)" if pattern == "zipf" else "")

    return _grid(events, seed, cell)


def placement_table(events: int = 300_000, seed: int = 1, batch: int = 36_000) -> str:
    """:func:`placement` on the benchmark's inputs at 2, 8 and 32 partitions (Markdown).

    Per cell: transactions crossing by hash -> after placement, and rows moved
    per transaction.  ``batch``: the runtime benchmark's micro-batches hold
    about 36,000 events.
    """

    def cell(txns: list[Txn], p: int, pattern: str) -> str:
        found = batched_placement(txns, p, batch)
        return (
            f"{100 * found.crossing:.0f}% -> {100 * found.placed_crossing:.0f}%, "
            f"{found.moved:.2f} rows, load {found.load:.2f}"
        )

    return _grid(events, seed, cell, short=True)


if __name__ == "__main__":
    print(table())
    print()
    print(placement_table())
