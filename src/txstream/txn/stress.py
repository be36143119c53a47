"""The stress run behind ``txstream stress``: many threads, random transactions, one history.

:func:`run_stress` runs ``transactions`` logical transactions on ``threads``
threads under a protocol; :func:`workload` draws each one's work (seeded per
transaction, so a retry repeats it) and a retryable failure is retried as a new
transaction until it commits.  The command (its options, the history file, the
checks and the summary; the workload in full) is :mod:`txstream.cli.stress`:
this layer imports nothing from the command line.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

from txstream.errors import TransientError, TxStreamError
from txstream.txn.manager import Transaction, TransactionManager

Work = list[tuple[str, int]]


def workload(seed: int, index: int, items: int) -> tuple[bool, Work]:
    """The read-only flag and operations of logical transaction ``index``."""
    rng = random.Random(seed * 1_000_003 + index)
    hot = max(1, items // 10)

    def pick() -> int:
        return rng.randrange(hot) if rng.random() < 0.5 else rng.randrange(items)

    count = rng.randint(2, 6)
    if rng.random() < 0.2:
        return True, [("r", pick()) for _ in range(count)]
    ops: Work = []
    for _ in range(count):
        roll = rng.random()
        ops.append(("r" if roll < 0.5 else "i" if roll < 0.75 else "u", pick()))
    return False, ops


def execute(txn: Transaction, ops: Work) -> None:
    """Perform the operations on table ``x`` in ``txn``."""
    for op, key in ops:
        if op == "r":
            txn.read("x", key)
        elif op == "i":
            txn.increment("x", key, 1)
        else:
            txn.put("x", key, txn.read("x", key) + 1)


def run_stress(
    protocol: str,
    threads: int,
    transactions: int,
    items: int = 100,
    ordered: bool = False,
    seed: int = 0,
    snapshot_updates: str = "locking",
    lock_timeout: float | None = None,
    record: bool = True,
) -> tuple[dict[str, Any], TransactionManager]:
    """Run the stress workload; return the summary (without checks) and the manager."""
    if threads < 1 or transactions < 0 or items < 1:
        raise TxStreamError("threads and items must be at least 1, transactions at least 0")
    tm = TransactionManager(
        protocol,
        ordered=ordered,
        record=record,
        snapshot_updates=snapshot_updates,
        lock_timeout=lock_timeout,
    )
    tm.table("x").load({k: 0 for k in range(items)})
    counter = iter(range(transactions))
    take = threading.Lock()
    totals = {"retries": 0, "writes": 0, "failed": 0}
    errors: list[BaseException] = []

    def worker() -> None:
        retries = writes = 0
        try:
            while True:
                with take:
                    index = next(counter, None)
                    if index is None:
                        break
                    if ordered:
                        # Begin in index order so the predefined order is the arrival order.
                        read_only, ops = workload(seed, index, items)
                        txn = tm.begin(read_only=read_only)
                if not ordered:
                    read_only, ops = workload(seed, index, items)
                    txn = tm.begin(read_only=read_only)
                attempt = 0
                while True:
                    try:
                        with txn:
                            execute(txn, ops)
                        break
                    except TransientError:
                        attempt += 1
                        retries += 1
                        if attempt % 8 == 0:
                            time.sleep(0.0002 * min(attempt, 64))
                        txn = tm.begin(read_only=read_only, retry_of=txn)
                writes += sum(1 for op, _ in ops if op != "r")
        except BaseException as exc:
            errors.append(exc)
        with take:
            totals["retries"] += retries
            totals["writes"] += writes

    pool = [threading.Thread(target=worker, name=f"stress-{i}") for i in range(threads)]
    start = time.perf_counter()
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    seconds = time.perf_counter() - start
    if errors:
        raise errors[0]
    stats = tm.stats()
    total = sum(tm.table("x").snapshot().values())
    summary: dict[str, Any] = {
        "protocol": protocol,
        "threads": threads,
        "transactions": transactions,
        "items": items,
        "ordered": ordered,
        "seed": seed,
        "committed": stats["committed"],
        "aborted": stats["aborted"],
        "deadlocks": stats["deadlocks"],
        "retries": totals["retries"],
        "seconds": round(seconds, 3),
        "txn_per_s": round(stats["committed"] / seconds, 1) if seconds > 0 else None,
        "sum_of_rows": total,
        "expected_sum": totals["writes"],
        "sum_ok": total == totals["writes"],
    }
    for name in ("wounds", "timeouts", "write_conflicts", "validation_failures"):
        if stats.get(name):
            summary[name] = stats[name]
    if protocol == "snapshot":
        summary["snapshot_updates"] = snapshot_updates
    return summary, tm
