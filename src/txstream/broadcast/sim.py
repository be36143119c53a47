"""A discrete-event simulation of one broadcast server and one client (Section 4).

Time is counted in bit-units (the time to broadcast one bit).  A cycle sends the
n objects in a fixed order, each followed by its share of control information,
so a cycle lasts ``n * (object_bits + entries * timestamp_bits)`` bit-units,
``entries`` being what the algorithm sends per object (n for F-Matrix, 1 for the
vector algorithms, 0 for F-Matrix-No).  A client may read object j of cycle k
only if it is listening when j's slot begins; it has the value at the end of the
slot.

The server runs update transactions that arrive as a Poisson process; each
updates ``server_txn_length`` distinct, uniformly chosen objects, reading each
one first with probability ``server_read_prob`` (``server_ops="update"``; with
``"read-or-write"`` each operation is a read with that probability and a write
otherwise), and runs alone at its arrival instant.  The client runs
transactions one after another: after an exponential inter-transaction delay
it submits one reading ``client_txn_length`` distinct, uniformly chosen
objects, with an exponential inter-operation delay after every read; a failed
read-condition restarts it (the same objects) after ``restart_delay``.
Response time runs from submission to commit, restarts included.  The server
and the client draw from separate random streams, so runs with the same seed
see the same workload under every algorithm.

Events are kept in time order by hand rather than in a heap: there are only
two sources (the next server arrival and the client's next step), and the
cycle boundaries, where the server freezes what goes on the air.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from txstream.broadcast.base import BroadcastError, ReadConditionFailed, ValidationFailed
from txstream.broadcast.client import Client, ClientTransaction
from txstream.broadcast.params import SimParams
from txstream.broadcast.recorder import HistoryRecorder
from txstream.broadcast.server import Server
from txstream.model import History

__all__ = ["SimParams", "SimResult", "SimTrace", "simulate"]


@dataclass
class SimTrace:
    """What a run did, event by event, for checking it against an independent model.

    ``commits``: one ``(time, cycle, txn, ops)`` per server transaction, ``ops``
    its operations in order as ``("r" | "w", object number)``.  ``reads``: one
    ``(attempt, position, obj, issued, cycle, ok, value)`` per read off the air:
    the client's attempt number (a restart starts a new attempt), the read's
    position in the transaction, when the client asked for the object, the cycle
    whose broadcast it read, whether the read-condition let it proceed, and the
    value it got (``None`` when refused).  ``commit_attempts``: the attempts that
    committed.  Pass one to :func:`simulate`; recording costs time, so it is off
    by default.
    """

    cycle_length: int = 0
    slot: int = 0
    commits: list[tuple[float, int, str, list[tuple[str, int]]]] = field(default_factory=list)
    reads: list[tuple[int, int, int, float, int, bool, Any]] = field(default_factory=list)
    commit_attempts: list[int] = field(default_factory=list)


@dataclass
class SimResult:
    """What one run measured.

    ``response_time`` and ``restarts`` are means over the last ``measured``
    transactions; the lists hold every completed transaction.
    """

    params: SimParams
    response_time: float
    restarts: float
    completed: int
    cycles: int
    cycle_length: int
    server_commits: int
    client_aborts: int
    cache_hits: int
    truncated: bool
    response_times: list[float] = field(default_factory=list, repr=False)
    restart_counts: list[int] = field(default_factory=list, repr=False)
    history: History | None = field(default=None, repr=False)

    def summary(self) -> dict[str, Any]:
        """JSON-ready summary (parameters and metrics, no per-transaction lists)."""
        return {
            "params": asdict(self.params),
            "response_time": self.response_time,
            "restarts": self.restarts,
            "completed": self.completed,
            "cycles": self.cycles,
            "cycle_length": self.cycle_length,
            "server_commits": self.server_commits,
            "client_aborts": self.client_aborts,
            "cache_hits": self.cache_hits,
            "truncated": self.truncated,
        }


_START, _ISSUE, _READ = 0, 1, 2


def simulate(params: SimParams, seed: int = 0, trace: SimTrace | None = None) -> SimResult:
    """Run one simulation; deterministic for a given ``params`` and ``seed``.

    ``trace``, if given, is filled with every server transaction and client read
    (see :class:`SimTrace`); it does not change the run.
    """
    params.validate()
    p = params
    server_rng = random.Random(seed * 2 + 1)
    client_rng = random.Random(seed * 2 + 2)
    recorder = HistoryRecorder() if p.record else None
    server = Server(p.objects, p.algorithm, groups=p.groups, recorder=recorder)
    client = Client(server, currency=p.cache_cycles)
    n = p.objects
    names = server.objects
    slot = p.object_bits + p.timestamp_bits * server.algorithm.control_entries()
    length = n * slot
    if trace is not None:
        trace.cycle_length = length
        trace.slot = slot

    server.begin_cycle()  # cycle 1 starts at time 0
    cycle_end = float(length)
    next_server = server_rng.expovariate(1.0 / p.server_interarrival)

    response: list[float] = []
    restarts: list[int] = []
    aborts = 0
    # The client's state.
    submitted = client_rng.expovariate(1.0 / p.txn_delay) if p.txn_delay > 0 else 0.0
    objs = client_rng.sample(range(n), p.client_txn_length)
    is_update = client_rng.random() < p.client_update_prob
    txn: ClientTransaction | None = None
    op = 0
    tries = 0
    ev_time = submitted
    ev_kind = _START
    ev_cycle = 0
    truncated = False
    steps = 0
    attempt = -1
    issued = 0.0

    while len(response) < p.transactions:
        steps += 1
        if p.max_steps is not None and steps > p.max_steps:
            # Parameters such as a tiny server inter-arrival time or enormous delays
            # make a run that would take hours; stop and say so rather than hang.
            raise BroadcastError(
                f"the simulation did not finish within {p.max_steps:,} steps "
                f"({len(response)} of {p.transactions} client transactions done, "
                f"{server.cycle:,} cycles, {server.commits:,} server transactions); "
                "the parameters make it run for hours: use smaller delays, sizes or "
                "transaction counts, a larger server inter-arrival time, or --max-steps"
            )
        client_due = ev_time < cycle_end or (ev_kind == _READ and ev_cycle == server.cycle)
        if next_server < cycle_end and (next_server <= ev_time or not client_due):
            if trace is None:
                _server_txn(server, server_rng, p, names)
            else:
                ops: list[tuple[str, int]] = []
                tid = _server_txn(server, server_rng, p, names, ops)
                trace.commits.append((next_server, server.cycle, tid, ops))
            next_server += server_rng.expovariate(1.0 / p.server_interarrival)
            continue
        if not client_due:
            if p.max_cycles is not None and server.cycle >= p.max_cycles:
                truncated = True
                break
            server.begin_cycle()
            cycle_end += length
            continue
        now = ev_time
        if ev_kind == _START:
            txn = client.begin(read_only=not is_update)
            op = 0
            attempt += 1
            ev_kind = _ISSUE
            continue
        assert txn is not None
        if ev_kind == _ISSUE:
            if op == len(objs):
                try:
                    if is_update:
                        for j in objs[: max(1, len(objs) // 2)]:
                            txn.write(names[j], txn.id)
                    txn.commit()
                except ValidationFailed:
                    aborts += 1
                    tries += 1
                    ev_time = now + p.restart_delay
                    ev_kind = _START
                    continue
                if trace is not None:
                    trace.commit_attempts.append(attempt)
                response.append(now - submitted)
                restarts.append(tries)
                tries = 0
                submitted = now + (
                    client_rng.expovariate(1.0 / p.txn_delay) if p.txn_delay > 0 else 0.0
                )
                objs = client_rng.sample(range(n), p.client_txn_length)
                is_update = client_rng.random() < p.client_update_prob
                ev_time = submitted
                ev_kind = _START
                continue
            j = objs[op]
            hit, _ = txn.read_cached(names[j])
            if hit:
                op += 1
                ev_time = now + _delay(client_rng, p.op_delay, op, len(objs))
                continue
            issued = now
            start = (server.cycle - 1) * length + j * slot
            ev_cycle = server.cycle
            if start < now:
                start += length
                ev_cycle += 1
            ev_time = start + slot
            ev_kind = _READ
            continue
        # _READ: the slot of objs[op] in cycle ev_cycle is over; that cycle is on the air.
        try:
            value = txn.read(names[objs[op]], use_cache=False)
        except ReadConditionFailed:
            if trace is not None:
                trace.reads.append((attempt, op, objs[op], issued, ev_cycle, False, None))
            aborts += 1
            tries += 1
            ev_time = now + p.restart_delay
            ev_kind = _START
            continue
        if trace is not None:
            trace.reads.append((attempt, op, objs[op], issued, ev_cycle, True, value))
        op += 1
        ev_time = now + _delay(client_rng, p.op_delay, op, len(objs))
        ev_kind = _ISSUE

    tail_rt = response[-p.measured :]
    tail_rs = restarts[-p.measured :]
    return SimResult(
        params=p,
        response_time=statistics.fmean(tail_rt) if tail_rt else float("nan"),
        restarts=statistics.fmean(tail_rs) if tail_rs else float("nan"),
        completed=len(response),
        cycles=server.cycle,
        cycle_length=length,
        server_commits=server.commits,
        client_aborts=aborts,
        cache_hits=client.cache_hits,
        truncated=truncated,
        response_times=response,
        restart_counts=restarts,
        history=recorder.history() if recorder is not None else None,
    )


def _delay(rng: random.Random, mean: float, done: int, total: int) -> float:
    """The inter-operation delay after a read; none after the last one (commit follows)."""
    if done >= total or mean <= 0:
        return 0.0
    return rng.expovariate(1.0 / mean)


def _server_txn(
    server: Server,
    rng: random.Random,
    p: SimParams,
    names: list[str],
    log: list[tuple[str, int]] | None = None,
) -> str:
    """One server update transaction, run alone (so it always commits); its id.

    ``log``, if given, gets the operations in order as ``(kind, object number)``.
    """
    txn = server.begin()
    n = len(names)
    if p.server_ops == "update":
        for j in rng.sample(range(n), min(p.server_txn_length, n)):
            if rng.random() < p.server_read_prob:
                txn.read(names[j])
                if log is not None:
                    log.append(("r", j))
            txn.write(names[j], txn.id)
            if log is not None:
                log.append(("w", j))
        txn.commit()
        return str(txn.id)
    for _ in range(p.server_txn_length):
        j = rng.randrange(n)
        if rng.random() < p.server_read_prob:
            txn.read(names[j])
            kind = "r"
        else:
            txn.write(names[j], txn.id)
            kind = "w"
        if log is not None:
            log.append((kind, j))
    txn.commit()
    return str(txn.id)
