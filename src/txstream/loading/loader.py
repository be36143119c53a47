"""The continuous loader: k sessions, grouping factor n, a loading method, a target.

::

    target = EmbeddedTarget(schema)          # or PostgresTarget(schema, server)
    target.setup()
    with Loader(target, method="reorder", sessions=8, grouping=16) as loader:
        report = loader.load(operations)     # blocks until every operation is applied
    print(report.summary())

:meth:`Loader.load` validates each operation (bad ones are reported in
``report.rejected`` and the rest still load), sends it to the session the
method assigns, and groups the operations of each session by relation: every
``n`` operations on one relation of one session form a load transaction
(Section 2.2); leftovers are flushed at the end of the call.  One thread per
session takes transactions from the method and runs them on its own target
session; a transaction the target aborts as a deadlock victim is re-run until
it commits.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from txstream.errors import TransientError, TxStreamError
from txstream.loading.base import (
    DeadlockAbort,
    LoadingMethod,
    LoadTransaction,
    Target,
    TargetSession,
    stable_hash,
)
from txstream.loading.methods import get_method
from txstream.loading.ops import InvalidOperation, Modification, partition_values, validate
from txstream.loading.preagg import preaggregate


@dataclass
class LoadReport:
    """What one :meth:`Loader.load` call did."""

    method: str
    target: str
    sessions: int
    grouping: int
    preaggregate: bool
    operations: int = 0
    rejected: list[tuple[int, str]] = field(default_factory=list)
    transactions: int = 0
    skipped: int = 0
    deadlocks: int = 0
    retries: int = 0
    statements: int = 0
    statements_attempted: int = 0
    elapsed: float = 0.0
    method_stats: dict[str, int] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        """Operations applied per second."""
        return self.operations / self.elapsed if self.elapsed > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly summary."""
        return {
            "target": self.target,
            "method": self.method,
            "k": self.sessions,
            "n": self.grouping,
            "preaggregate": self.preaggregate,
            "operations": self.operations,
            "rejected": len(self.rejected),
            "transactions": self.transactions,
            "skipped_transactions": self.skipped,
            "deadlocks": self.deadlocks,
            "retries": self.retries,
            "statements": self.statements,
            "elapsed_s": round(self.elapsed, 4),
            "throughput": round(self.throughput, 1),
            **{f"method_{k}": v for k, v in self.method_stats.items()},
        }


class Loader:
    """Loads modification operations into a target through ``sessions`` sessions."""

    def __init__(
        self,
        target: Target,
        method: str | LoadingMethod = "reorder",
        *,
        sessions: int = 4,
        grouping: int = 8,
        preaggregate: bool = False,
        seed: int = 0,
        starvation_ts: float = 1.0,
        max_attempts: int = 10_000,
    ) -> None:
        if isinstance(sessions, bool) or not isinstance(sessions, int) or sessions < 1:
            raise TxStreamError(
                f"the number of sessions k must be an integer >= 1, not {sessions!r}"
            )
        if isinstance(grouping, bool) or not isinstance(grouping, int) or grouping < 1:
            raise TxStreamError(f"the grouping factor n must be an integer >= 1, not {grouping!r}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise TxStreamError(f"max_attempts must be an integer >= 1, not {max_attempts!r}")
        if not isinstance(target, Target):
            raise TxStreamError(
                f"a loader loads into a Target (EmbeddedTarget, PostgresTarget), not {target!r}"
            )
        if (
            isinstance(starvation_ts, bool)
            or not isinstance(starvation_ts, int | float)
            or not 0 < starvation_ts < math.inf
        ):
            raise TxStreamError(
                "the starvation threshold TS must be a positive, finite number of seconds, not "
                f"{starvation_ts!r}"
            )
        if not isinstance(method, str | LoadingMethod):
            raise TxStreamError(
                f"method is a loading method's name (naive, partition, reorder) or a "
                f"LoadingMethod, not {method!r}"
            )
        self.target = target
        self.schema = target.schema
        self._method_spec = method
        self.method_name = method if isinstance(method, str) else method.name
        if isinstance(method, str):
            get_method(method, starvation_ts)  # fail early on a bad name
        self.starvation_ts = starvation_ts
        self.k = sessions
        self.n = grouping
        self.preaggregate = preaggregate
        self.seed = seed
        self.max_attempts = max_attempts
        self._sessions: list[TargetSession] = []

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the target sessions (the target itself stays open)."""
        for s in self._sessions:
            s.close()
        self._sessions = []

    def _method(self, batch_id: int | None) -> LoadingMethod:
        spec = self._method_spec
        method = get_method(spec, self.starvation_ts) if isinstance(spec, str) else spec
        method.bind(self.schema, self.k, stable_hash((self.seed, batch_id)))
        return method

    def validate(
        self, operations: Iterable[Any]
    ) -> tuple[list[Modification], list[tuple[int, str]]]:
        """Check every operation: (the good ones, (position, reason) of the bad ones)."""
        good: list[Modification] = []
        bad: list[tuple[int, str]] = []
        for i, raw in enumerate(operations):
            try:
                good.append(validate(self.schema, raw))
            except InvalidOperation as exc:
                bad.append((i, str(exc)))
        return good, bad

    def load(self, operations: Iterable[Any], batch_id: int | None = None) -> LoadReport:
        """Apply ``operations``; return when every valid one is committed.

        With ``batch_id``, each load transaction carries ``(batch_id, seq)`` and
        the target skips one it committed before, so loading the same batch
        again (after a crash) applies every operation exactly once, provided the
        batch has the same operations in the same order.
        """
        if isinstance(operations, str | bytes) or not isinstance(operations, Iterable):
            raise TxStreamError(
                "load takes an iterable of operations (Modification objects, dicts or JSON "
                f"texts, one per item), not {type(operations).__name__}"
            )
        report = LoadReport(self.method_name, self.target.name, self.k, self.n, self.preaggregate)
        while len(self._sessions) < self.k:
            self._sessions.append(self.target.connect(len(self._sessions), self.k))
        method = self._method(batch_id)
        errors: list[BaseException] = []
        stats_lock = threading.Lock()
        start = time.perf_counter()
        threads = [
            threading.Thread(
                target=self._session_loop,
                args=(m, method, report, stats_lock, errors),
                name=f"txstream-load-{m}",
                daemon=True,
            )
            for m in range(self.k)
        ]
        for t in threads:
            t.start()
        try:
            self._feed(operations, method, report, batch_id, errors)
        finally:
            method.close()
            for t in threads:
                t.join()
        report.elapsed = time.perf_counter() - start
        report.method_stats = method.stats()
        if errors:
            err = errors[0]
            if isinstance(err, TxStreamError):
                raise err
            raise TxStreamError(f"loading failed: {type(err).__name__}: {err}") from err
        return report

    # -- feeding: assignment and grouping (Action 1) ---------------------------------------

    def _feed(
        self,
        operations: Iterable[Any],
        method: LoadingMethod,
        report: LoadReport,
        batch_id: int | None,
        errors: list[BaseException],
    ) -> None:
        schema = self.schema
        n = self.n
        groups: dict[tuple[int, str], list[Modification]] = {}
        seq = 0
        for i, raw in enumerate(operations):
            if errors:
                return
            try:
                op = validate(schema, raw)
            except InvalidOperation as exc:
                report.rejected.append((i, str(exc)))
                continue
            report.operations += 1
            m = method.assign(op, partition_values(schema, op))
            slot = (m, op.relation)
            group = groups.get(slot)
            if group is None:
                group = groups[slot] = []
            group.append(op)
            if len(group) >= n:
                del groups[slot]
                method.enqueue(self._txn(seq, m, op.relation, group, batch_id))
                seq += 1
        for (m, rel), group in groups.items():
            method.enqueue(self._txn(seq, m, rel, group, batch_id))
            seq += 1

    @staticmethod
    def _txn(
        seq: int, m: int, rel: str, ops: list[Modification], batch_id: int | None
    ) -> LoadTransaction:
        ident = None if batch_id is None else (batch_id, seq)
        return LoadTransaction(seq, m, rel, ops, ident)

    # -- a session (Actions 2 and 3 happen in the method) -----------------------------------

    def _session_loop(
        self,
        m: int,
        method: LoadingMethod,
        report: LoadReport,
        stats_lock: threading.Lock,
        errors: list[BaseException],
    ) -> None:
        session = self._sessions[m]
        while True:
            txn = method.take(m, timeout=0.5)
            if errors:
                if txn is not None:
                    method.done(txn)
                return
            if txn is None:
                if method.drained(m):
                    return
                continue
            statements = preaggregate(self.schema, txn.ops) if self.preaggregate else list(txn.ops)
            deadlocks = retries = attempted = 0
            applied = False
            try:
                while True:
                    txn.attempts += 1
                    attempted += len(statements)
                    try:
                        applied = session.execute(txn, statements)
                        break
                    except DeadlockAbort:
                        deadlocks += 1
                        retries += 1
                    except TransientError:
                        retries += 1
                    if txn.attempts >= self.max_attempts:
                        raise TxStreamError(
                            f"load transaction {txn.seq} on {txn.relation} failed "
                            f"{txn.attempts} times; giving up"
                        )
            except BaseException as exc:
                errors.append(exc)
                method.close()
                return
            finally:
                method.done(txn)
                with stats_lock:
                    report.deadlocks += deadlocks
                    report.retries += retries
                    report.statements_attempted += attempted
                    if applied:
                        report.transactions += 1
                        report.statements += len(statements)
                    elif txn.attempts and not errors:
                        report.skipped += 1
