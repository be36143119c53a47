"""A partition's global reads: partial totals, taken at the read's place or admitted past.

Part of :class:`~.partition._Partition`: a global read's part takes this
partition's totals (:meth:`_Reads._totals`); partition 0 runs the read over
every partition's (:meth:`_Reads._execute_global`).  Up to
:data:`~.base.READS_PAST` reads are admitted past at a time
(:meth:`_Reads._read_past`): what runs after them keeps its changes apart
until the items before them finished.
"""

from __future__ import annotations

from typing import Any

from txstream.spark.runtime.boundaries import Event, Group, event_gid
from txstream.spark.runtime.executor import table_item
from txstream.spark.runtime.forward import base
from txstream.spark.runtime.forward.base import MAIN, _Item, _Shared
from txstream.spark.runtime.totals import add_totals, keep, not_a_number, partial_totals


class _Reads(_Shared):
    """Global reads' totals, their execution, and reads admitted past (a part of ``_Partition``)."""

    def _totals(self, item: _Item) -> Any:
        """A global read's reads on this partition: its partial totals, read now."""
        reads = self.global_reads[item.event.input]
        if self.record:  # (the reads happen now; dropped if it aborts)
            self._record_global_read(item.event, event_gid(self.batch, item.event))
        state = self.state
        try:
            return partial_totals(state.data, reads, state.tracked, state.flat)
        except TypeError:
            # A value that is not a number: the read fails in its transaction at
            # partition 0, as where every row is read at once (raised here, outside
            # any transaction, it ended the whole run with a traceback).
            return {what: not_a_number(state, what) for what in reads}

    def _execute_global(self, item: _Item) -> None:
        """At partition 0: a global read over this partition's totals and everyone's."""
        event, runner = item.event, self.runner
        ups = item.ups
        assert ups is not None
        aggregates = item.totals  # (taken at its place: see _start)
        for message in ups.values():
            add_totals(aggregates, message[1])
        runner.aggregates = aggregates
        try:
            runner.run(Group(event_gid(self.batch, event), [event]), self.sched.abort)
        finally:
            runner.aggregates = None
        self.outcome.forwarded += 1
        # (its parts finished when they sent their totals: nothing goes back)
        self.finish(item)

    def _record_global_read(self, event: Event, gid: str) -> None:
        """A committed global read's reads here: one operation per table (see table_item)."""
        tables = dict.fromkeys(table for table, _ in self.global_reads[event.input])
        self.outcome.history.extend(f"r{gid}({table_item(table)})" for table in tables)

    def _read_past(self, item: _Item) -> bool:
        """Admit past global read ``item`` while the items before it run; whether it can.

        Its reads are totals, so nothing after it needs to wait for it: what runs
        after it keeps its changes to the partials the read takes apart (and its
        history apart: recorded after the read), until the items before it
        finished; then the read takes the partials (:meth:`_read_now`) and the
        changes after it are added in.  Per value the queues keep the declared
        order, so the items after it that ran meanwhile touched values none before
        it was still to touch: the history, the read recorded between the two,
        is the one of an execution in the declared order.  Up to
        :data:`READS_PAST` reads wait at a time, each with the changes between it
        and the next apart; they read in their order.
        """
        if len(self.readings) >= base.READS_PAST or self.barrier is not None:
            return False
        state = self.state
        reads = self.global_reads[item.event.input]
        if not keep(state.data, reads, state.tracked, state.flat):
            return False  # (a value that is not a number: it reads at its place)
        main, tracked = self.main, state.tracked
        for table in dict.fromkeys(table for table, _ in reads):
            if table not in main:  # (not split yet: tracked holds its main partials)
                main[table] = tracked[table]
        self.epoch += 1
        item.epoch = self.epoch
        self.segments[self.epoch] = {
            table: [(column, [0] * len(p)) for column, p in partials]
            for table, partials in main.items()
        }
        self.logs[self.epoch] = ([], [])
        self.readings.append(item)
        self.earlier.append(self.inflight)
        self._side(self.epoch)
        return True

    def _side(self, epoch: int) -> None:
        """Send changes of the partials and history where what runs at ``epoch`` belongs."""
        self._route(epoch if epoch >= self.readings[0].epoch else MAIN)

    def _route(self, side: int) -> None:
        if side == self.side:
            return
        outcome = self.outcome
        self.logs[self.side] = (outcome.history, outcome.orders)
        outcome.history, outcome.orders = self.logs.pop(side)
        self.side = side
        tracked, segment = self.state.tracked, self.segments.get(side)
        for table, partials in self.main.items():
            tracked[table] = partials if segment is None else segment.get(table, partials)

    def _finished_before(self, epoch: int) -> None:
        """An item of ``epoch`` finished: the reads after it wait for one item less."""
        earlier = self.earlier
        for i, read in enumerate(self.readings):
            if read.epoch > epoch:
                earlier[i] -= 1
        if earlier[0] == 0:
            self._read_now()

    def _read_now(self) -> None:
        """Every item before the oldest read finished: it reads; what ran after it comes in.

        The next read then waits only for what ran between the two (it may read at once).
        Only an item before the oldest read brings this about as it finishes, and
        such an item runs on :data:`MAIN`: what runs next is routed there too.
        """
        readings, earlier, outcome = self.readings, self.earlier, self.outcome
        while readings and earlier[0] == 0:
            item = readings.popleft()
            del earlier[0]
            self._route(MAIN)
            self._start(item)  # (its totals and history, at its place)
            main = self.main
            for table, after in self.segments.pop(item.epoch).items():
                for (_, partial), (_, more) in zip(main[table], after, strict=True):
                    for i, x in enumerate(more):
                        partial[i] += x
            history, orders = self.logs.pop(item.epoch)
            outcome.history.extend(history)
            outcome.orders.extend(orders)
        if not readings:
            self.main = {}
