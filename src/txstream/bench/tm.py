"""``txstream bench tm``: transaction-manager throughput per protocol and thread count.

Each point runs a fixed number of four-operation transactions (two reads, an
increment and a blind write on table rows) from ``threads`` threads:

* ``low`` contention - keys drawn uniformly from 100,000 rows;
* ``high`` contention - keys drawn from 16 rows.

Keys are drawn before the clock starts; history recording is off (it is a
debugging aid, not part of the protocols' cost).  ``sync`` is ``memory`` (no
log, the default) or a durable store's sync setting (``off``, ``group``,
``commit``): then the manager writes its write-ahead log to a fresh temporary
directory, so ``--set sync=commit`` measures durable commit throughput.  A
transaction that fails with a retryable error is retried until it commits.  Metrics: ``txn_per_s``
(committed transactions per wall-clock second) and ``abort_rate`` (aborted
attempts per attempt).

Goals from issue 3: single-threaded uncontended ``ss2pl`` at least 50,000
transactions per second, and ``ss2pl`` at least 70% of ``none`` on the
low-contention workload in the same run.
"""

from __future__ import annotations

import random
import tempfile
import threading
import time
from typing import Any

from txstream.bench.harness import Experiment, Figure
from txstream.errors import TransientError, TxStreamError
from txstream.txn import TransactionManager

PROTOCOLS = ("ss2pl", "none", "optimistic", "snapshot")
ROWS = {"low": 100_000, "high": 16}
TRANSACTIONS = 12_000
QUICK_TRANSACTIONS = 3_000


SYNCS = ("memory", "off", "group", "commit")


def measure(
    protocol: str,
    threads: int,
    contention: str,
    transactions: int,
    seed: int,
    sync: str = "memory",
) -> dict[str, Any]:
    """Run one point in this process; return its metrics."""
    if sync not in SYNCS:
        raise TxStreamError(f"unknown sync {sync!r}; choose one of: {', '.join(SYNCS)}")
    if sync == "memory":
        return _measure(protocol, threads, contention, transactions, seed, None, "commit")
    with tempfile.TemporaryDirectory(prefix="txstream-bench-tm-") as tmp:
        return _measure(protocol, threads, contention, transactions, seed, tmp, sync)


def _measure(
    protocol: str,
    threads: int,
    contention: str,
    transactions: int,
    seed: int,
    path: str | None,
    sync: str,
) -> dict[str, Any]:
    rows = ROWS[contention]
    tm = TransactionManager(protocol, path=path, sync=sync)
    table = tm.table("t")
    table.load(dict.fromkeys(range(rows), 0))
    rng = random.Random(seed)
    per_thread = [transactions // threads + (i < transactions % threads) for i in range(threads)]
    plans = [[tuple(rng.randrange(rows) for _ in range(4)) for _ in range(n)] for n in per_thread]
    aborts = [0] * threads
    start_gate = threading.Barrier(threads + 1)

    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            body(i)
        except BaseException as exc:
            errors.append(exc)

    def body(i: int) -> None:
        begin = tm.begin
        failed = 0
        start_gate.wait()
        for a, b, c, d in plans[i]:
            previous = None
            while True:
                t = begin(retry_of=previous)
                try:
                    t.read(table, a)
                    t.read(table, b)
                    t.increment(table, c, 1)
                    t.put(table, d, 1)
                    t.commit()
                    break
                except TransientError:
                    failed += 1
                    previous = t
        aborts[i] = failed

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for th in pool:
        th.start()
    start_gate.wait()
    t0 = time.perf_counter()
    for th in pool:
        th.join()
    seconds = time.perf_counter() - t0
    tm.close()
    if errors:
        raise errors[0]
    failed = sum(aborts)
    return {
        "txn_per_s": round(transactions / seconds, 1),
        "abort_rate": round(failed / (transactions + failed), 4),
        "seconds": round(seconds, 4),
        "deadlocks": tm.stats()["deadlocks"],
    }


def run_point(point: dict[str, Any], seed: int) -> dict[str, Any]:
    """The harness entry: one grid point."""
    return measure(
        point["protocol"],
        point["threads"],
        point["contention"],
        point.get("transactions", TRANSACTIONS),
        seed,
        str(point.get("sync", "memory")),
    )


EXPERIMENT = Experiment(
    name="tm",
    description="transaction-manager throughput: protocols x threads x contention",
    grid=[
        {"protocol": p, "threads": t, "contention": c, "sync": "memory"}
        for c in ("low", "high")
        for t in (1, 2, 4, 8)
        for p in PROTOCOLS
    ],
    quick_grid=[
        {
            "protocol": p,
            "threads": t,
            "contention": c,
            "sync": "memory",
            "transactions": QUICK_TRANSACTIONS,
        }
        for c in ("low", "high")
        for t in (1, 4)
        for p in PROTOCOLS
    ],
    run=run_point,
    repetitions=3,
    quick_repetitions=1,
    figures=[
        Figure(
            name="tm",
            x="threads",
            y="txn_per_s",
            series="protocol",
            facet="contention",
            title="TM throughput (dashed: 50,000/s goal)",
            ylabel="committed transactions / s",
            hline=50_000.0,
        ),
        Figure(
            name="tm_aborts",
            x="threads",
            y="abort_rate",
            series="protocol",
            facet="contention",
            title="TM abort rate",
            ylabel="aborted attempts / attempts",
        ),
    ],
)
