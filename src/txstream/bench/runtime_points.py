"""The points of ``txstream bench runtime``: its workload's parameters, the grids, their labels.

A point is a dict of parameters (engine, master, pattern, accounts, offered
rate ...) that :func:`~txstream.bench.runtime.run_point` runs in a process of
its own; :data:`GRID` and :data:`QUICK` are the full and the quick grids, and
:func:`workload`, :func:`setup` and :func:`run_name` label a point in the
report, the figures and the run's folder.  Data only: nothing here runs Spark.
"""

from __future__ import annotations

from typing import Any

POINT_TIMEOUT = 900
ACCOUNTS = 100_000
"""Accounts in the ledger (TStream's Streaming Ledger uses a large key space too)."""
WARMUP = 24_000
"""Events fed and committed before the clock starts (not in ``events``; checked all the same)."""
MASTERS = {"local[1]": 1, "local[2]": 2, "local-cluster[2,1,1024]": 2}


INPUT_SEED = 1
"""The seed of every point's events (``--set input_seed=N`` for others)."""


def _point(
    engine: str,
    master: str,
    cross: int,
    n: int,
    rate: int,
    pattern: str = "cross",
    skew: float = 0.0,
    accounts: int = ACCOUNTS,
    audit_every: int = 0,
    partitions: int | None = None,
    cross_mode: str = "forward",
) -> dict[str, Any]:
    return {
        "engine": engine,
        "master": master,
        "cores": MASTERS[master],
        "pattern": pattern,
        "cross_partition_pct": cross,
        "skew": skew,
        "accounts": accounts,
        "audit_every": audit_every,
        "partitions": MASTERS[master] if partitions is None else partitions,
        "cross_mode": cross_mode,
        "events": n,
        "rate": rate,
        # The input's seed, the same in every point: local[1] and local[2] (or 2
        # and 32 partitions) of a workload then run the same events.
        "input_seed": INPUT_SEED,
    }


SPACING = 1000
"""Event ids are multiplied by this: the heartbeats take ids between them."""
HEARTBEAT_S = 0.5
"""Quiet seconds before the feeder sends a heartbeat while it waits for the last events."""
CHUNK = 12_000
"""Events per file (each file holds its events of one input)."""
FILES_PER_BATCH = 6
"""Spark's ``maxFilesPerTrigger`` per input: a micro-batch takes at most 72,000 events,
so a backlog is worked off in steady batches rather than one giant one."""
LOAD = 52_000
"""The offered load (events/s) of the latency goal, 50,000 txn/s with p99 under 2 s: just
above 50,000 and below local[2]'s capacity at 0% cross (54,000-61,000 here), so the job
can keep up and its latency stays put however long the run (above capacity a backlog
builds up and the p99 grows with the run's length)."""
FLOOD = 250_000
"""An offered load above what any engine here can take: the point then measures capacity."""
SWEEP = (40_000, 50_000, 60_000)
"""More offered loads (local[2], 0% cross) beside :data:`LOAD`: latency against load, where
the knee lies (60,000 is above capacity)."""

LONG = 1_200_000
"""Events of an offered-load point: about 23 s of feed at :data:`LOAD`, so that the steady
state outweighs the ramp-up (the first batches after the warm-up are small) and the drain."""

WORKLOAD_EVENTS = 300_000
"""Timed events of a workload point (pattern, accounts, audits, partitions), as in issue 28."""
ONE_K = 1_000


def _workloads(master: str) -> list[dict[str, Any]]:
    """Issue 28's workload points on ``master``: cross 0, uniform, zipf 0.8 and 1.2, audits."""
    n = WORKLOAD_EVENTS
    patterns = (("cross", 0.0), ("uniform", 0.0), ("zipf", 0.8), ("zipf", 1.2))
    return [
        *(_point("executors", master, 0, n, FLOOD, pat, skew) for pat, skew in patterns),
        _point("executors", master, 0, n, FLOOD, pattern="uniform", audit_every=1000),
        *(
            _point("executors", master, 0, n, FLOOD, pat, skew, accounts=ONE_K)
            for pat, skew in patterns
        ),
    ]


def _partitioned(parts: int) -> list[dict[str, Any]]:
    """local[2] points at ``parts`` partitions, for the serial-share columns."""
    n = WORKLOAD_EVENTS
    return [
        _point("executors", "local[2]", 0, n, FLOOD, pattern="uniform", partitions=parts),
        _point("executors", "local[2]", 0, n, FLOOD, "zipf", 0.8, partitions=parts),
        _point("executors", "local[2]", 0, n, FLOOD, "zipf", 1.2, partitions=parts),
        _point("executors", "local[2]", 0, n, FLOOD, "uniform", audit_every=1000, partitions=parts),
    ]


GRID = [
    *_workloads("local[1]"),
    *_workloads("local[2]"),
    _point("executors", "local-cluster[2,1,1024]", 0, WORKLOAD_EVENTS, FLOOD),
    _point("executors", "local-cluster[2,1,1024]", 0, WORKLOAD_EVENTS, FLOOD, "uniform"),
    *(_point("executors", m, c, WORKLOAD_EVENTS, FLOOD) for m in MASTERS for c in (1, 10)),
    *_partitioned(8),
    *_partitioned(32),
    # the same input through today's phases 2 and 3: forward against defer in one run
    _point("executors", "local[2]", 0, WORKLOAD_EVENTS, FLOOD, "uniform", cross_mode="defer"),
    _point("executors", "local[2]", 0, WORKLOAD_EVENTS, FLOOD, "zipf", 0.8, cross_mode="defer"),
    *(_point("executors", "local[2]", c, LONG, LOAD) for c in (0, 10)),
    *(_point("executors", "local[2]", 0, LONG, rate) for rate in SWEEP),
    *(_point("driver", "local[2]", c, 200_000, FLOOD) for c in (0, 10)),
]
QUICK = [
    *(_point("executors", m, 0, WORKLOAD_EVENTS, FLOOD) for m in ("local[1]", "local[2]")),
    *(
        _point("executors", m, 0, WORKLOAD_EVENTS, FLOOD, "uniform")
        for m in ("local[1]", "local[2]")
    ),
    _point("executors", "local[2]", 0, WORKLOAD_EVENTS, FLOOD, "uniform", accounts=ONE_K),
    _point("executors", "local[2]", 0, WORKLOAD_EVENTS, FLOOD, "zipf", 0.8),
    _point("executors", "local[2]", 0, WORKLOAD_EVENTS, FLOOD, "uniform", audit_every=1000),
    _point("executors", "local[2]", 0, WORKLOAD_EVENTS, FLOOD, "uniform", partitions=8),
    _point("executors", "local[2]", 0, WORKLOAD_EVENTS, FLOOD, "uniform", partitions=32),
    _point("executors", "local[2]", 0, WORKLOAD_EVENTS, FLOOD, "uniform", cross_mode="defer"),
    # issue 13's latency goal, and the cluster's results equal the others'
    _point("executors", "local[2]", 0, WORKLOAD_EVENTS, LOAD),
    _point("executors", "local-cluster[2,1,1024]", 0, WORKLOAD_EVENTS, FLOOD, "uniform"),
]


def workload(point: dict[str, Any]) -> str:
    """A short label of the point's input: pattern, accounts, audits (``uniform 100k +audit/1000``).

    (Partitions and the cross-partition mode are the point's :func:`setup`.)
    """
    pattern = point.get("pattern", "cross")
    if pattern == "cross":
        label = f"cross {point.get('cross_partition_pct', 0)}%"
    elif pattern == "zipf":
        label = f"zipf {point.get('skew', 0.0):g}"
    else:
        label = str(pattern)
    accounts = int(point.get("accounts", ACCOUNTS))
    label += f" {accounts // 1000}k" if accounts % 1000 == 0 else f" {accounts}"
    if point.get("audit_every"):
        label += f" +audit/{point['audit_every']}"
    return label


def setup(point: dict[str, Any]) -> str:
    """Where the point ran: master, partitions and the cross-partition mode (``local[2] P=8``)."""
    label = f"{point['master']} P={point.get('partitions', MASTERS[point['master']])}"
    return label + (" defer" if point.get("cross_mode") == "defer" else "")


def run_name(point: dict[str, Any], seed: int) -> str:
    """The folder name of ``point``'s run with ``seed``: every parameter that varies, readable."""
    slug = "".join(c if c.isalnum() or c in ".-" else "_" for c in workload(point))
    return (
        f"{point['engine']}-{point['master'].replace('[', '').replace(']', '')}"
        f"-{slug}-P{_get(point, 'partitions')}-{_get(point, 'cross_mode')}"
        f"-e{point['events']}-r{point['rate']}-s{seed}"
    ).replace(",", "_")


DEFAULTS: dict[str, Any] = {
    "pattern": "cross",
    "skew": 0.0,
    "accounts": ACCOUNTS,
    "audit_every": 0,
    "cross_mode": "forward",
    "cross_partition_pct": 0,
}
"""A row's parameter values where it has none (rows of runs before these parameters)."""


def _get(row: dict[str, Any], key: str) -> Any:
    if key == "partitions":
        return row.get("partitions", MASTERS.get(row.get("master", ""), 2))
    return row.get(key, DEFAULTS.get(key))
