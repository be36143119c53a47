"""Loading sessions that run apart: each of Luo et al.'s k sessions on its own, in any process.

:class:`~txstream.loading.Loader` runs its k sessions as threads of one
process around one :class:`~txstream.loading.LoadingMethod` object.  Here a
session is a self-contained worker (a Spark task in
:class:`txstream.jobs.loading.ExecutorLoadingSink`) that is handed only its own
operations, in arrival order, and its own connection to the target:

* :func:`route` is the method's assignment (Section 2.3) as a pure function
  of an operation, the same in every process: ``partition`` and ``reorder``
  hash the relation and the partitioning attributes (so every operation on
  one tuple reaches one session), ``naive`` hashes ``(seed, batch, position)``
  (a reproducible random session).
* :func:`form` groups a session's operations as the loader does (Section
  2.2): every ``n`` operations on one relation form a load transaction, the
  leftovers close the batch; its queue ``Q_m`` is the formation order.  Each
  transaction's ident is ``(batch, m * 2**32 + i)``, the same on a re-run.
* :func:`run_session` runs the queue through one target session.  For
  ``naive`` and ``partition`` it runs the queue in order and re-runs deadlock
  victims.  For ``reorder`` the array J lives in the database, as locks
  (:func:`gate_keys`): a transaction on relation R holds, for its whole
  database transaction, an exclusive lock on ``(R, m)`` and shared locks on
  ``(S, 0..k-1)`` for every relation S that shares a view with R.  A free
  session scans its queue front to back and starts the first transaction
  whose locks it gets at once (*desirable*: no running transaction on a
  conflicting relation, Action 3); when a lock is released the transactions
  waiting for it are desirable again (Action 2, seen at the next scan).  A
  head of the queue that has waited more than ``starvation_ts`` seconds
  becomes a header transaction: the session then *waits* for its locks, and
  the server's lock queue admits no new conflicting transaction before it.
"""

from __future__ import annotations

import hashlib
import pickle
import time
import zlib
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from txstream.errors import TransientError, TxStreamError
from txstream.loading.base import DeadlockAbort, LoadTransaction, Target, TargetSession, stable_hash
from txstream.loading.methods import METHODS
from txstream.loading.ops import Modification, partition_values
from txstream.loading.preagg import preaggregate
from txstream.loading.schema import Schema

SEQ_STRIDE = 1 << 32
"""Ledger sequence numbers of session m are ``m * SEQ_STRIDE + i``: unique in a batch."""
MAX_SESSIONS = 1024
"""Session numbers fit in the low bits of a gate key (:func:`gate_keys`)."""
POLL_S = (0.001, 0.02)
"""First and longest sleep of a session whose queue holds no desirable transaction."""

Gate = tuple[int, tuple[int, ...]]
"""(the exclusive lock key, the shared lock keys) a transaction holds while it runs."""


def check_method(method: str) -> None:
    """Refuse an unknown method name in one line."""
    if method not in METHODS:
        from txstream.errors import UnknownNameError

        raise UnknownNameError("loading method", method, list(METHODS))


def route(
    schema: Schema, method: str, op: Modification, k: int, seed: int, batch: int, pos: int
) -> int:
    """The session (0-based, below ``k``) that loads ``op``, the ``pos``-th of batch ``batch``."""
    if method == "naive":
        # (crc32, stable_hash's function, is linear: its low bits cycle with the digits of pos)
        digest = hashlib.blake2b(repr((seed, batch, pos)).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % k
    return stable_hash((op.relation, *partition_values(schema, op))) % k


def form(ops: Iterable[Modification], m: int, n: int, batch: int) -> list[LoadTransaction]:
    """Session ``m``'s load transactions, in formation order (its queue ``Q_m``)."""
    groups: dict[str, list[Modification]] = {}
    out: list[LoadTransaction] = []

    def close(rel: str, group: list[Modification]) -> None:
        i = len(out)
        out.append(LoadTransaction(i, m, rel, group, (batch, m * SEQ_STRIDE + i)))

    for op in ops:
        group = groups.get(op.relation)
        if group is None:
            group = groups[op.relation] = []
        group.append(op)
        if len(group) >= n:
            del groups[op.relation]
            close(op.relation, group)
    for rel, group in groups.items():
        close(rel, group)
    return out


def _relation_key(relation: str) -> int:
    return zlib.crc32(f"txstream-J:{relation}".encode()) * MAX_SESSIONS


def gate_keys(schema: Schema, relation: str, m: int, k: int) -> Gate | None:
    """The locks that stand for J while a transaction on ``relation`` runs in session ``m``.

    None when ``relation`` shares no view with another: nothing can conflict.
    """
    others = sorted(schema.conflicts(relation))
    if not others:
        return None
    shared = tuple(_relation_key(s) + g for s in others for g in range(k))
    return _relation_key(relation) + m, shared


def encode(op: Modification) -> bytes:
    """``op`` as bytes, for a shuffle between processes."""
    return pickle.dumps((op.relation, op.kind, op.key, op.values), protocol=5)


def decode(data: bytes) -> Modification:
    """The operation :func:`encode` wrote."""
    relation, kind, key, values = pickle.loads(data)
    return Modification(relation, kind, tuple(key), tuple(tuple(v) for v in values))


@dataclass
class SessionReport:
    """What one session did with its queue in one batch."""

    session: int
    operations: int = 0
    transactions: int = 0
    skipped: int = 0
    deadlocks: int = 0
    retries: int = 0
    statements: int = 0
    statements_attempted: int = 0
    reordered: int = 0
    headers: int = 0
    gate_busy: int = 0
    elapsed: float = 0.0
    cpu: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """The counters by name."""
        return asdict(self)


def run_session(
    target: Target,
    schema: Schema,
    method: str,
    m: int,
    k: int,
    txns: Sequence[LoadTransaction],
    *,
    preaggregate_ops: bool = False,
    starvation_ts: float = 1.0,
    max_attempts: int = 10_000,
) -> SessionReport:
    """Run session ``m``'s queue ``txns`` to the end through a connection of its own."""
    check_method(method)
    report = SessionReport(m, operations=sum(len(t.ops) for t in txns))
    if not txns:
        return report
    start, cpu = time.perf_counter(), time.process_time()
    session = target.connect(m, k)
    try:
        runner = _Runner(session, schema, report, preaggregate_ops, max_attempts)
        if method == "reorder":
            _reorder(runner, schema, m, k, txns, starvation_ts)
        else:
            for txn in txns:
                runner.attempt(txn, None, wait=False)
    finally:
        session.close()
    report.elapsed = time.perf_counter() - start
    report.cpu = time.process_time() - cpu
    return report


class _Runner:
    """One session's transactions to commit, with retries and counters."""

    def __init__(
        self,
        session: TargetSession,
        schema: Schema,
        report: SessionReport,
        preaggregate_ops: bool,
        max_attempts: int,
    ) -> None:
        self.session = session
        self.schema = schema
        self.report = report
        self.preaggregate = preaggregate_ops
        self.max_attempts = max_attempts

    def attempt(self, txn: LoadTransaction, gate: Gate | None, wait: bool) -> bool:
        """Run ``txn`` to commit (or to a ledger skip); False if its gate was busy (not waited)."""
        ops = list(txn.ops)
        statements = preaggregate(self.schema, ops) if self.preaggregate else ops
        report = self.report
        while True:
            txn.attempts += 1
            report.statements_attempted += len(statements)
            try:
                if gate is None:
                    applied: bool | None = self.session.execute(txn, statements)
                else:
                    applied = self.session.execute_gated(txn, statements, gate, wait)
            except DeadlockAbort:
                report.deadlocks += 1
                report.retries += 1
            except TransientError:
                report.retries += 1
            else:
                if applied is None:  # the gate was busy: nothing was run
                    report.statements_attempted -= len(statements)
                    txn.attempts -= 1
                    report.gate_busy += 1
                    return False
                if applied:
                    report.transactions += 1
                    report.statements += len(statements)
                else:
                    report.skipped += 1
                return True
            if txn.attempts >= self.max_attempts:
                raise TxStreamError(
                    f"load transaction {txn.ident} on {txn.relation} failed "
                    f"{txn.attempts} times; giving up"
                )


def _reorder(
    runner: _Runner,
    schema: Schema,
    m: int,
    k: int,
    txns: Sequence[LoadTransaction],
    starvation_ts: float,
) -> None:
    """Actions 2 and 3 and the header transaction, with J as the server's locks."""
    gates = {rel: gate_keys(schema, rel, m, k) for rel in {t.relation for t in txns}}
    queue = deque(txns)
    head_since = time.monotonic()
    sleep = POLL_S[0]
    while queue:
        started = -1
        busy: set[str] = set()
        for i, txn in enumerate(queue):
            if txn.relation in busy:
                continue  # same answer as an earlier transaction on this relation
            if runner.attempt(txn, gates[txn.relation], wait=False):
                started = i
                break
            busy.add(txn.relation)
        if started < 0 and time.monotonic() - head_since > starvation_ts:
            runner.report.headers += 1
            runner.attempt(queue[0], gates[queue[0].relation], wait=True)
            started = 0
        if started < 0:
            time.sleep(sleep)
            sleep = min(sleep * 2, POLL_S[1])
            continue
        sleep = POLL_S[0]
        del queue[started]
        if started == 0:
            head_since = time.monotonic()
        else:
            runner.report.reordered += 1
