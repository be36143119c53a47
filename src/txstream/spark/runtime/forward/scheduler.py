"""The driver loop of forwarded phase 1: one task's partitions, rounds, messages.

:class:`ForwardScheduler` runs the batch on the partitions its task hosts:
admission rounds, then what arrived from the other tasks, until every
partition finished (see :mod:`.base` for the call order).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from txstream.spark.runtime.base import JobSpec, Row
from txstream.spark.runtime.boundaries import Event
from txstream.spark.runtime.errors import ExchangeError
from txstream.spark.runtime.forward import base
from txstream.spark.runtime.forward.partition import _Partition
from txstream.spark.runtime.outcome import Outcome
from txstream.spark.runtime.state import PartitionState
from txstream.spark.runtime.transport import Message, SocketTransport


class ForwardScheduler:
    """Runs the batch on the partitions one task hosts, exchanging messages with the rest.

    ``hosted``: partition -> (its state, begun for the batch; its events in the
    declared order, one transaction each: the per-event boundary).  ``transport``
    carries messages to partitions hosted by other tasks (``task_of`` says
    which); None when every partition is here.
    """

    def __init__(
        self,
        job: JobSpec,
        batch: int,
        partitions: int,
        hosted: Mapping[int, tuple[PartitionState, Iterable[Event]]],
        abort: Mapping[str, Mapping[str, Any]],
        arrival: Callable[[Row], float | None] | None = None,
        transport: SocketTransport | None = None,
        task_of: Callable[[int], int] | None = None,
        announce: bool = False,
    ) -> None:
        self.job = job
        self.batch = batch
        self.partitions = partitions
        self.abort = abort
        self.arrival = arrival
        self.transport = transport
        self.task_of = task_of
        self.hosted = {
            pid: _Partition(self, pid, state, iter(() if announce else events))
            for pid, (state, events) in sorted(hosted.items())
        }
        self.announced = (
            {pid: list(events) for pid, (_, events) in hosted.items()} if announce else None
        )
        """(``announce``) Each hosted partition's own events, without the copies of
        transactions homed elsewhere: their homes announce them (see
        :meth:`_Partition.announce`); every partition must be hosted by some task."""
        self.mailbox: deque[Message] = deque()
        self.hurry = False
        """Whether rounds are short and answers go out at once (:data:`.ADMIT_CHUNK_WAITING`)."""
        self.hurried_by_peer = 0
        """Rounds left that another task's hurry keeps this one hurried."""
        self.silent = 0
        """Polls in a row that brought no message from another task (see :data:`.SILENT_ROUNDS`)."""
        self.rounds = 0
        """Admission rounds run (a measure: see scripts/runtime-mp-tasks.py)."""
        self.waits = 0
        """Times the task blocked for another task's message with nothing to run."""
        self.waited = 0.0
        """Seconds it spent so (wall time)."""

    def _names(self, mids: Iterable[int]) -> list[str]:
        """The ids of the transactions of these events (for an error: the first three)."""
        return [f"b{self.batch}_{mid}" for mid in sorted(mids)[:3]]

    def run(self) -> dict[int, Outcome]:
        """Run every hosted partition's transactions to the end; their outcomes."""
        parts = list(self.hosted.values())
        if self.announced is not None:
            for part in parts:
                part.announce(self.announced.pop(part.pid))
        timeout, silent_rounds = base.EXCHANGE_TIMEOUT_S, base.SILENT_ROUNDS
        chunk, chunk_waiting = base.ADMIT_CHUNK, base.ADMIT_CHUNK_WAITING
        deadline = time.monotonic() + timeout
        waited = 0.0
        while not all(p.done() for p in parts):
            admitted = False
            hurry = self.hurried_by_peer > 0
            if hurry:
                self.hurried_by_peer -= 1
            if self.silent < silent_rounds:
                for part in parts:
                    if part.hurried():
                        hurry = True
            self.hurry = hurry
            for part in parts:
                if part.admitting():
                    part.admit(chunk_waiting if hurry and part.waiting else chunk)
                    if part.lends:
                        part.lend_ahead()
                    part.drain()
                    admitted = True
            if admitted:
                self.rounds += 1
                self._pump(block=False)
                continue
            # Nothing to admit here: wait for what the other tasks send.
            began = time.monotonic()
            got = self._pump(block=True)
            now = time.monotonic()
            waited += now - began
            self.waits += 1
            if got:
                deadline = now + timeout
            elif now > deadline:
                waiting = self._names(m for p in parts for m in p.waiting)
                raise ExchangeError(
                    f"no message from the other tasks in {timeout:.0f} s; "
                    f"waiting for transactions {waiting}"
                )
        for part in parts:
            if part.early:
                raise ExchangeError(
                    f"partition {part.pid} got messages for transactions it never ran: "
                    f"{self._names(part.early)} (the partitions disagree on the batch)"
                )
        first = parts[0].outcome if parts else None
        if first is not None:
            # The time the task spent waiting for other tasks with nothing to admit.
            first.wait_ms += round(waited * 1000)
        self.waited = waited
        if self.transport is not None:
            self._collect()  # (the last answers to other tasks)
            self.transport.flush(wait=True)
            if first is not None:
                first.message_bytes += self.transport.bytes_sent
        return {pid: p.outcome for pid, p in self.hosted.items()}

    def _collect(self) -> None:
        """Hand over what the hosted partitions sent: here to the mailbox, else to the transport."""
        hosted, mailbox = self.hosted, self.mailbox
        for src, part in hosted.items():
            if not part.out:
                continue
            out, part.out = part.out, {}
            # A hurried partition says so to the other tasks (its source as ~src):
            # they answer at once and keep their rounds short for a while.
            sender = ~src if part.hurried() else src
            for dest, box in out.items():
                part.outcome.messages += len(box)
                if dest in hosted:
                    mailbox.append((dest, src, box))
                elif self.transport is None or self.task_of is None:
                    raise ExchangeError(
                        f"partition {dest} is not hosted here and there is no transport"
                    )
                else:
                    self.transport.send(self.task_of(dest), (dest, sender, box))

    def _deliver(self, messages: Iterable[Message]) -> bool:
        """Give each partition its messages, then run what they freed; whether there were any."""
        got = False
        hosted = self.hosted
        touched = set()
        for dest, src, box in messages:
            if src < 0:  # (from a hurried partition: see _collect)
                src = ~src
                self.hurried_by_peer = base.HURRY_ROUNDS
                self.hurry = True
            hosted[dest].receive_all(src, box)
            touched.add(dest)
            got = True
        for dest in touched:
            hosted[dest].drain()
        return got

    def _pump(self, block: bool) -> bool:
        """Send what is queued; deliver what arrived (``block``: wait for something).

        Returns whether anything arrived.
        """
        got = False
        self._collect()
        mailbox = self.mailbox
        while mailbox:
            messages = list(mailbox)
            mailbox.clear()
            got = self._deliver(messages) or got
            self._collect()  # (the answers, to partitions here: delivered in this loop)
        if self.transport is None:
            if block and not got:
                raise ExchangeError(
                    "the batch's partitions wait for each other with nothing in flight "
                    "(a transaction's participants disagree on it)"
                )
            return got
        self.transport.flush()
        arrived = self.transport.poll(0.0 if (got or not block) else 0.05)
        self.silent = 0 if arrived else self.silent + 1
        if not self._deliver(arrived):
            return got
        if self.hurry or block:
            # The answers to what arrived go out now, not after the next round (which,
            # unhurried, is long: they then go with its messages, in one frame).
            self._collect()
            self.transport.flush()
        return True
