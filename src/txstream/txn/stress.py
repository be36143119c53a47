"""``txstream stress``: many threads run random transactions; the history is checked.

Each of ``--transactions`` logical transactions is drawn from a random mix
(seeded per transaction, so a retry repeats the same work):

* 20% are read-only: 2-6 reads (under ``snapshot`` these use snapshots);
* the rest do 2-6 operations: reads, increments and read-then-write updates
  (the read takes a shared lock that the write must upgrade - the classic
  source of deadlocks).

Items are rows ``x.0`` ... ``x.K-1`` of table ``x``; half the accesses go to a
hot tenth of them, so there is contention.  A transaction that fails with a
retryable error (deadlock victim, failed validation, write conflict, wound) is
retried as a new transaction (a new id in the history) until it commits.

At the end the committed history goes to ``--history`` (with its ``arrival``
line, the begin order), is checked for ``cs`` (``csao`` when ordered), and the
table is checked against the workload: the sum of all rows must equal the
number of committed increments and updates.  A JSON summary goes to stdout; the
exit status is 0 only if the run finished and both checks pass.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from txstream.cli_types import (
    check_writable,
    json_safe,
    path_arg,
    positive_float,
    positive_int,
    seed,
    write_whole,
)
from txstream.errors import TransientError, TxStreamError
from txstream.model import check, format_history
from txstream.txn.manager import Transaction, TransactionManager
from txstream.txn.protocols import PROTOCOLS

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


def command(args: argparse.Namespace) -> int:
    """Execute ``txstream stress``."""
    path = Path(args.history)
    check_writable(path, "history file ")  # before the run, not after it
    summary, tm = run_stress(
        args.protocol,
        args.threads,
        args.transactions,
        args.items,
        args.ordered,
        args.seed,
        args.snapshot_updates,
        args.lock_timeout,
    )
    history = tm.history(committed_only=True)
    criterion = "csao" if args.ordered else "cs"
    verdict = check(history, criterion)
    text = format_history(history)
    write_whole(path, text + ("\n" if not text.endswith("\n") else ""), "history file ")
    summary["history"] = str(path)
    summary["operations"] = len(history)
    summary["check"] = {"criterion": criterion, "holds": verdict.holds}
    if not verdict.holds:
        cycle = verdict.evidence.get("cycle", [])
        summary["check"]["cycle"] = cycle[:6]  # the whole cycle: `txstream check FILE`
        summary["check"]["cycle_length"] = len(cycle)
        summary["check"]["cycle_shown"] = min(6, len(cycle))
    json.dump(json_safe(summary), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")
    return 0 if verdict.holds and summary["sum_ok"] else 1


def register_cli(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``stress`` subcommand."""
    p = subparsers.add_parser(
        "stress",
        help="run random concurrent transactions and check the recorded history",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--protocol", "-p", default="ss2pl", choices=sorted(PROTOCOLS))
    p.add_argument("--threads", "-n", type=positive_int(256), default=4, help="threads (default 4)")
    p.add_argument(
        "--transactions",
        "-m",
        type=positive_int(1_000_000),
        default=10_000,
        help="transactions (default 10000)",
    )
    p.add_argument(
        "--items", "-k", type=positive_int(1_000_000), default=100, help="data items (default 100)"
    )
    p.add_argument(
        "--ordered",
        action="store_true",
        help="enforce arrival order (ss2pl, optimistic); the history is checked for csao",
    )
    p.add_argument("--seed", type=seed, default=0, help="workload seed (default 0)")
    p.add_argument(
        "--snapshot-updates",
        choices=("locking", "si"),
        default="locking",
        help="under snapshot: update transactions lock (default; serializable) or use "
        "snapshot isolation (si; write skew possible)",
    )
    p.add_argument(
        "--lock-timeout",
        type=positive_float(86_400),
        default=None,
        help="lock-wait timeout, seconds",
    )
    p.add_argument(
        "--history", type=path_arg, required=True, metavar="FILE", help="write the history here"
    )
    p.set_defaults(func=command)
