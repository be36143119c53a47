"""The three task bodies of a batch and the driver's loop around them, without pyspark.

:func:`phase1`, :func:`phase2` and :func:`phase3` are what Spark tasks run (and
what the in-process runner runs); each reads and writes the job's
:class:`~txstream.spark.runtime.state.RuntimeStore` itself, so the driver only
moves counters.  :func:`run_batch` is the driver's loop: run phase 1, the
deferred phases when anything was deferred, re-run with a transaction aborted
everywhere when a transaction that may span partitions failed, commit (or refuse
the batch when the ``by`` boundary's runs interleave across partitions).
"""

from __future__ import annotations

import gc
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from txstream.errors import TxStreamError
from txstream.spark.runtime.base import JobSpec, Row
from txstream.spark.runtime.boundaries import Boundary, Event, check_runs
from txstream.spark.runtime.deferred import run_deferred
from txstream.spark.runtime.executor import PartitionExecutor
from txstream.spark.runtime.failures import log_failures, log_late
from txstream.spark.runtime.forward import ForwardScheduler, SocketTransport
from txstream.spark.runtime.merge import Bound
from txstream.spark.runtime.outcome import Outcome, latencies
from txstream.spark.runtime.recorded import history_line
from txstream.spark.runtime.results import one_per_transaction
from txstream.spark.runtime.rows import owned_row
from txstream.spark.runtime.state import RuntimeStore

MAX_ATTEMPTS = 64
"""Re-runs of one batch for aborted multi-partition transactions before giving up."""


@dataclass
class BatchContext:
    """What every task of a batch needs to know besides its rows."""

    store: str
    batch: int
    prev: int
    """The last batch that ran before this one (-1 for none): the state tasks start from."""
    abort: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Transactions to abort everywhere in this attempt, each with its first attempt's failure."""
    release_upto: Bound | None = None
    """Event-time merge: events after this bound wait (held) for a later batch (see
    :func:`release`)."""
    frontier: dict[str, Any] = field(default_factory=dict)
    """The merge's durable bookkeeping, stored with the commit (see :mod:`.merge`)."""
    gather: dict[str, Any] | None = None
    """Event-time merge with the frontier found by the phase-1 tasks themselves:
    ``{"frontier": the bookkeeping after the previous batch, "idle": idleBatches,
    "nonce": the batch's exchange folder}`` (see ``query._gathered_release``);
    None when the driver found it."""
    snapshot: bool = False
    arrival: Callable[[Row], float | None] | None = None
    tokens: dict[int, str] = field(default_factory=dict)
    """Each partition's committed version (see ``PartitionState.token``)."""
    phase1_tokens: dict[int, str] = field(default_factory=dict)
    partitions: int = 0
    """The job's number of partitions (keyless fragments check their rows' placement)."""
    exchange: dict[str, Any] | None = None
    """Forwarded multi-partition transactions: ``{"secret", "tasks", "nonce"}`` of the
    batch's barrier stage (see :mod:`.forward`); None when phase 1 exchanges nothing."""


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run a task's batch without Python's cyclic garbage collector, then freeze the survivors.

    A partition's state is hundreds of thousands of long-lived row dicts; every
    full collection walked all of them (a fifth of Linear Road's task time, and
    pauses that grow with the state).  Rows, events and outputs hold no
    reference cycles, so reference counting frees them during the batch.  At the
    end one collection finds any cyclic garbage the batch did make (a user's
    row that refers to itself); it walks only what earlier batches did not
    freeze, i.e. this batch's survivors, not the state.  Then what survives
    moves to the permanent generation, which later collections skip; frozen
    objects are still freed by reference counting when the state drops them.
    Nested blocks collect only at the outermost end, when the batch's events
    (a third of a million objects, garbage by then) are gone.
    """
    global _paused
    if _paused:  # nested (a Spark task around a phase): the outer one collects once, at its end
        yield
        return
    was_enabled = gc.isenabled()
    gc.disable()
    _paused = True
    try:
        yield
    finally:
        _paused = False
        gc.collect()  # before freezing: frozen cyclic garbage would never be freed
        gc.freeze()
        if was_enabled:
            gc.enable()


_paused = False
"""Whether a :func:`collector_paused` block is running in this process (tasks are serial)."""


def _write(
    store: RuntimeStore, ctx: BatchContext, role: str, outcome: Outcome, job: JobSpec
) -> dict[str, list[int]]:
    """Write a task's outputs, history and failure records; their marker entries."""
    files: dict[str, list[int]] = {}
    for name, lines in outcome.outputs.items():
        files.update(store.write_lines("outputs", name, ctx.batch, role, lines))
    if job.record_history and (outcome.txns or outcome.history):
        # The aborted transactions' lines, then every operation and commit in the
        # compact form the executor recorded (see recorded.py).
        lines = outcome.txns
        if outcome.history:
            lines = [*lines, history_line(job, outcome.history, outcome.orders)]
        files.update(store.write_lines("history", "", ctx.batch, role, lines))
    if outcome.failures:
        lines = [json.dumps(f, default=str) for f in outcome.failures]
        files.update(store.write_lines("errors", "", ctx.batch, role, lines))
    return files


def release(
    state: Any,
    events: list[Event],
    upto: Bound | Sequence[float],
    boundary: Boundary | None = None,
    meta: dict[str, Any] | None = None,
    counts: dict[str, int] | None = None,
    delivered: float | None = None,
) -> list[Event]:
    """The events to run now: those held before and the new ones up to ``upto``, in order.

    ``upto`` is the batch's bound (:func:`~txstream.spark.runtime.merge.advance`):
    an event runs when its ``(order value, input index)`` is at most it, and the
    ``boundary`` releases no part of a transaction that later events may still
    join (``meta``: its durable state, default the partition's).  The rest wait
    in the partition's state (``meta["held"]``, saved with the batch) until a
    later batch's bound passes them.  A new event that comes before one this
    partition already ran (``meta["ran"]``: the largest ``(order value, input)``
    released) is *late*: it runs now, out of the declared order, and
    ``counts["late"]`` counts it (the runtime reports it: raise the input's
    watermark or ``idleBatches``).  ``delivered``: the largest order value any
    input has delivered so far (see :func:`largest_delivered`); when every input is
    quiet, every partition ran all up to it, so its group is closed here too,
    though this partition ran nothing of it.
    """
    ran = state.meta.get("ran")
    # (the boundary's groups below "closed" ran whole on every partition, see
    # Boundary.closed; an event below it that its partition's order missed was
    # a silent difference from the serial answer)
    closed = state.meta.get("closed")
    if (ran is not None or closed is not None) and counts is not None and events:
        mark = (ran[0], ran[1]) if ran is not None else (-math.inf, 0)
        below = -math.inf if closed is None else closed
        late = sum(
            1
            for e in events
            if e.counted and ((e.order[0], e.order[1]) < mark or e.order[0] < below)
        )
        counts["late"] = counts.get("late", 0) + late
    ready = _release(state, events, upto, boundary, meta)
    cut = None
    if boundary is not None:
        if math.isfinite(upto[0]):
            cut = boundary.closed(upto[0])
        elif upto[0] == math.inf:
            # Every input quiet or ended: what was held ran, the last group too,
            # though a later event could have joined it (uncounted, it ran as a
            # transaction of its own with no warning), on every partition: one
            # that ran nothing of it would not count such an event as late
            top = max((e.order[0] for e in ready), default=-math.inf)
            if delivered is not None:
                top = max(top, delivered)
            if math.isfinite(top):
                cut = boundary.closed_by(top)
    if cut is not None and (closed is None or cut > closed):
        state.meta["closed"] = cut
    if ready:
        last = max((e.order[0], e.order[1]) for e in ready)
        if ran is None or last > (ran[0], ran[1]):
            state.meta["ran"] = [last[0], last[1]]
    return ready


def largest_delivered(ctx: BatchContext) -> float | None:
    """The largest order value any input has delivered up to this batch (None: none yet)."""
    high = ctx.frontier.get("high") or {}
    return max(high.values()) if high else None


def own_rows(events: Iterable[Event]) -> list[Event]:
    """``events``, each with a copy of its row that shares nothing mutable with the original."""
    return [event._replace(row=owned_row(event.row)) for event in events]


def _release(
    state: Any,
    events: list[Event],
    upto: Bound | Sequence[float],
    boundary: Boundary | None,
    meta: dict[str, Any] | None,
) -> list[Event]:
    # A held event's row of its own: a function that changes its event's row must
    # not change what a re-run of the batch (from the same cached state) gives it.
    pool = own_rows(state.meta.get("held", ())) + events
    value, first = upto[0], upto[1]
    if value == math.inf:  # every input is quiet: everything runs
        pool.sort(key=_order)
        state.meta["held"] = []
        return pool
    if value == -math.inf:  # an input that may deliver the first events has not yet
        state.meta["held"] = pool
        return []
    ready, wait = [], []
    for event in pool:
        order = event.order
        if order[0] < value or (order[0] == value and order[1] <= first):
            ready.append(event)
        else:
            wait.append(event)
    ready.sort(key=_order)
    if boundary is not None:
        cut = boundary.complete(ready, value, state.meta if meta is None else meta)
        ready, wait = ready[:cut], ready[cut:] + wait
    state.meta["held"] = wait
    return ready


_order: Callable[[Event], tuple[float, int, int]] = attrgetter("order")
"""An event's declared order (a sort key that runs in C)."""


def phase1(
    job: JobSpec, ctx: BatchContext, pid: int, events: list[Event], ordered: bool = False
) -> dict[str, Any]:
    """Run partition ``pid``'s events of the batch; returns stats and what it ships.

    ``events`` is given away: the run empties it (see ``PartitionExecutor.consume``).
    ``ordered``: they are in their declared order already (not sorted again).
    """
    with collector_paused():
        return _phase1(job, ctx, pid, events, ordered)


def _phase1(
    job: JobSpec, ctx: BatchContext, pid: int, events: list[Event], ordered: bool
) -> dict[str, Any]:
    store = RuntimeStore(ctx.store)
    # A batch of transactions that may span events runs again when one fails
    # (run_batch): its pre-images roll it back in memory.  Otherwise only a
    # failed task runs it again, and that attempt loads the state.
    spans = job.boundary.may_span
    state = store.state_for(pid, ctx.batch, ctx.prev, ctx.tokens.get(pid), pre_images=spans)
    counts: dict[str, int] = {}
    if ctx.release_upto is not None:
        events = release(
            state,
            events,
            ctx.release_upto,
            job.boundary,
            counts=counts,
            delivered=largest_delivered(ctx),
        )
        ordered = False
    if not ordered:
        events.sort(key=_order)
    executor = PartitionExecutor(job, pid, state, ctx.arrival, ctx.partitions)
    executor.consume = True  # (events: this function's own, see above)
    executor.run(ctx.batch, events, ctx.abort)
    token = store.save(pid, state, ctx.batch, ctx.snapshot)
    files = _write(store, ctx, f"p{pid:05d}", executor.outcome, job)
    stats = executor.outcome.stats()
    stats["files"] = files  # (for the commit marker: the driver reads no file back)
    stats["held"] = sum(1 for e in state.meta.get("held", ()) if e.counted)
    stats["late"] = counts.get("late", 0)
    if executor.runs is not None:
        stats["runs"] = executor.runs
    return {
        "token": token,
        "stats": stats,
        "rows": executor.shipped_rows(),
        "events": executor.shipped_events,
    }


def phase1_forward(
    job: JobSpec,
    ctx: BatchContext,
    events: dict[int, list[Event]],
    transport: SocketTransport | None = None,
    task_of: Callable[[int], int] | None = None,
    announce: bool = False,
) -> dict[int, dict[str, Any]]:
    """Phase 1 of the partitions in ``events`` with multi-partition transactions forwarded.

    The partitions run together in one :class:`~txstream.spark.runtime.forward.
    ForwardScheduler` (the rest of the batch's partitions through ``transport``);
    nothing is deferred.  Returns, per partition, what :func:`phase1` returns.
    ``announce``: ``events`` hold no copies of transactions homed elsewhere; their
    homes announce them (every partition of the batch runs in some task).
    """
    with collector_paused():
        store = RuntimeStore(ctx.store)
        hosted: dict[int, tuple[Any, Any]] = {}
        counted: dict[int, int] = {}
        late: dict[int, dict[str, int]] = {}
        # (forwarding runs under the event boundary only: no pre-images, see _phase1)
        spans = job.boundary.may_span
        for pid, evs in sorted(events.items()):
            state = store.state_for(pid, ctx.batch, ctx.prev, ctx.tokens.get(pid), spans)
            late[pid] = {}
            if ctx.release_upto is not None:
                evs = release(
                    state,
                    evs,
                    ctx.release_upto,
                    job.boundary,
                    counts=late[pid],
                    delivered=largest_delivered(ctx),
                )
            if not announce:  # (else sorted with the copies: see _Partition.announce)
                evs.sort(key=_order)
            counted[pid] = sum(1 for e in evs if e.counted)
            hosted[pid] = (state, evs)  # (the per-event boundary: see forwarding)
        scheduler = ForwardScheduler(
            job,
            ctx.batch,
            ctx.partitions,
            hosted,
            ctx.abort,
            ctx.arrival,
            transport,
            task_of,
            announce,
        )
        outcomes = scheduler.run()
        results: dict[int, dict[str, Any]] = {}
        for pid, outcome in outcomes.items():
            state = hosted[pid][0]
            outcome.events = counted[pid]
            last = scheduler.hosted[pid].copies_ran
            if last is not None:  # (announced copies it took part in count as run here)
                ran = state.meta.get("ran")
                if ran is None or last > (ran[0], ran[1]):
                    state.meta["ran"] = [last[0], last[1]]
            token = store.save(pid, state, ctx.batch, ctx.snapshot)
            files = _write(store, ctx, f"p{pid:05d}", outcome, job)
            stats = outcome.stats()
            stats["files"] = files
            stats["held"] = sum(1 for e in state.meta.get("held", ()) if e.counted)
            stats["late"] = late[pid].get("late", 0)
            results[pid] = {"token": token, "stats": stats, "rows": [], "events": []}
        return results


def phase2(
    job: JobSpec, ctx: BatchContext, rows: Iterable[Any], events: Iterable[Any], role: str = "coord"
) -> tuple[dict[str, Any], list[Any]]:
    """Run deferred transactions (all, or some whole chains); returns stats and rows to hand back.

    ``role`` names the task's files (``coord``, ``coord<k>`` when several tasks
    share phase 2; see :func:`~txstream.spark.runtime.deferred.deferred_chains`).
    """
    store = RuntimeStore(ctx.store)
    with collector_paused():
        outcome, back = run_deferred(
            job, ctx.batch, rows, events, ctx.abort, ctx.arrival, ctx.partitions
        )
    files = _write(store, ctx, role, outcome, job)
    stats = outcome.stats()
    stats["files"] = files
    return stats, back


def phase3(job: JobSpec, ctx: BatchContext, pid: int, back: Iterable[Any]) -> str:
    """Take the coordinator's rows back into partition ``pid``; returns the new version's token.

    The rows of each value the coordinator sends replace the value's rows, in
    every table.  They are written as a patch over the partition's phase-1
    version, which the next task of the partition applies wherever it runs (no
    worker needs the partition's whole state for this).
    """
    store = RuntimeStore(ctx.store)
    values = [(value, {t: tables.get(t, {}) for t in job.tables}) for value, tables in back]
    return store.write_patch(pid, ctx.batch, ctx.phase1_tokens[pid], values)


class Phases:
    """How a batch's phases run: in Spark tasks or in this process (see the runners)."""

    def phase1(self, ctx: BatchContext) -> tuple[list[dict[str, Any]], bool]:
        """Run phase 1 on every partition: (stats per partition, whether anything was deferred).

        Sets ``ctx.phase1_tokens`` to the versions the partitions saved.
        """
        raise NotImplementedError

    def deferred(self, ctx: BatchContext) -> tuple[dict[str, Any], dict[int, str]]:
        """Run phases 2 and 3 after :meth:`phase1`: phase 2's stats, phase 3's tokens."""
        raise NotImplementedError


def merge_stats(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Add up per-task stats; ``files`` gathers the files the tasks wrote (for the marker)."""
    total: dict[str, Any] = {
        "events": 0,
        "committed": 0,
        "aborted": 0,
        "deferred": 0,
        "forwarded": 0,
        "messages": 0,
        "message_bytes": 0,
        "wait_ms": 0,
        "failures": [],
        "latency": {},
        "committed_inputs": {},
        "files": {},
    }
    for part in parts:
        total["files"].update(part.get("files", {}))
        for key in ("events", "committed", "aborted", "deferred"):
            total[key] += part[key]
        for key in ("forwarded", "messages", "message_bytes", "wait_ms"):
            total[key] += part.get(key, 0)
        total["held"] = total.get("held", 0) + part.get("held", 0)
        total["late"] = total.get("late", 0) + part.get("late", 0)
        total["failures"].extend(part["failures"])
        if "everywhere" in part:
            total.setdefault("everywhere", []).extend(part["everywhere"])
        for index, count in part.get("committed_inputs", {}).items():
            total["committed_inputs"][index] = total["committed_inputs"].get(index, 0) + count
        for bucket, count in part["latency"].items():
            total["latency"][bucket] = total["latency"].get(bucket, 0) + count
    total["failures"] = one_per_transaction(total["failures"])
    return total


def stop_on_error(stats: dict[str, Any], on_error: str) -> None:
    """``onError=stop``: fail after a committed batch in which a transaction raised."""
    errors = [f for f in stats["failures"] if f["kind"] == "error"]
    if errors and on_error == "stop":
        first = errors[0]
        raise TxStreamError(
            f"transaction at {first['position']} failed: {first['error']} (onError=stop; "
            "the batch is committed with it rolled back)"
        )


def committed_frontier(store: RuntimeStore) -> dict[str, Any]:
    """The event-time merge's bookkeeping as of the last committed batch."""
    committed = store.committed()
    if not committed:
        return {}
    frontier: dict[str, Any] = store.commit_info(committed[-1]).get("frontier", {})
    return frontier


def committed_tokens(store: RuntimeStore) -> dict[int, str]:
    """The partitions' versions as of the last committed batch (empty before the first)."""
    committed = store.committed()
    if not committed:
        return {}
    info = store.commit_info(committed[-1])
    return {int(p): t for p, t in info.get("tokens", {}).items()}


def run_batch(
    job: JobSpec, phases: Phases, ctx: BatchContext, store: RuntimeStore
) -> dict[str, Any]:
    """Run batch ``ctx.batch`` to its commit marker; returns its merged stats."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        store.clear_uncommitted(ctx.batch)
        ctx.phase1_tokens = {}
        began = time.time()
        parts, deferred = phases.phase1(ctx)
        phase1_s = time.time() - began
        runs = [part.pop("runs") for part in parts if "runs" in part]
        if runs:  # before anything commits: a 'by' batch whose runs interleave is refused
            check_runs(ctx.batch, runs)
        tokens = dict(ctx.phase1_tokens)
        if deferred:
            stats2, tokens3 = phases.deferred(ctx)
            parts.append(stats2)
            tokens.update(tokens3)
        stats = merge_stats(parts)
        files = stats.pop("files")
        stats["phase1_s"] = round(phase1_s, 3)
        stats["deferred_s"] = round(time.time() - began - phase1_s, 3)
        # A keyless event's fragment that failed may leave its fragments on other
        # partitions committed (under any boundary): it spans them too, unless
        # every fragment failed (a bad event: nothing of it committed anywhere).
        fragments = Counter(stats.pop("everywhere", ()))
        partly = {txn for txn, n in fragments.items() if n < ctx.partitions}
        new = [
            f
            for f in stats["failures"]
            if f["txn"] not in ctx.abort
            and f["kind"] in ("abort", "error")
            and (job.boundary.may_span or f["txn"] in partly)
        ]
        if new:
            # A transaction with parts on several partitions failed: abort it
            # everywhere and run the batch again.  Only the earliest failure is
            # certain: a later one may have seen its effects, or those of a keyless
            # event that committed only because the earliest half-committed (review
            # F1, session 24: a rule that took later failures "for certain" on a
            # partition where every earlier one failed gave wrong balances, since
            # a keyless event committed everywhere in between changed that partition).
            # Its parts report the first attempt's failure (the function that
            # raised, its error and position), not the re-run's abort.
            first = new[0]
            ctx.abort[first["txn"]] = {k: first[k] for k in ("kind", "position", "error", "at")}
            continue
        ctx.tokens.update(tokens)
        store.commit(
            ctx.batch,
            {
                "prev": ctx.prev,
                "events": stats["events"],
                "committed": stats["committed"],
                "aborted": stats["aborted"],
                "tokens": {str(p): t for p, t in ctx.tokens.items()},
                "frontier": ctx.frontier,
                # Events the event-time merge holds: a restart may not leave the
                # merge while there are any (see restart.restarted_meta).
                "held": stats.get("held", 0),
                # (a job that records its history and ran no transaction has an empty one)
                **({"history": True} if job.record_history else {}),
            },
            files,
        )
        log_failures(job.name, ctx.batch, stats["failures"])  # (on the driver, once committed)
        log_late(job.name, ctx.batch, stats.get("late", 0))
        stats["latency"] = latencies(stats["latency"], time.time())
        stats["attempts"] = attempt
        return stats
    raise TxStreamError(
        f"batch {ctx.batch}: still finding failed transactions spanning partitions after "
        f"{MAX_ATTEMPTS} runs of the batch ({len(ctx.abort)} aborted everywhere); stopping "
        "(see the errors folder of the store)"
    )
