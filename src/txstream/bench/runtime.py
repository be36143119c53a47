"""``txstream bench runtime``: Streaming Ledger on the executor runtime and on the driver engine.

Each point runs in a fresh Python process with its own Spark application (a
master cannot change inside one): a feeder thread writes the ledger's events
as JSON files at ``rate`` events per second (rendered beforehand, so it costs the
job's cores almost nothing), each stamped with the time its file was written
(``sent``); the job commits micro-batch after micro-batch until every event is
in.  A warm-up of :data:`WARMUP` events runs first and is committed before the
clock starts (the first batches compile Spark's code and load each worker's
partition state); it is checked like every other event but not timed.  Offered
loads: :data:`LOAD` (the latency goal's), :data:`SWEEP` (others, for latency
against load) and :data:`FLOOD` (more than any engine here takes: the point
measures capacity).  Measured, after the warm-up:

* ``txn_per_s``: events / (last commit - first file written);
* ``steady_txn_per_s``: the commit rate in the steady state (see :func:`_steady`):
  the offered rate when the job keeps up, its capacity when it does not;
* ``p99_latency_s``, ``max_latency_s``: batch commit time - ``sent``;
* ``errors``: transfer outcomes that differ from serial execution in arrival
  order (lost, duplicated or wrong), plus final balances that differ, plus 1
  when the total balance is not the sum of the deposits (warm-up included).

Each run's store (with its recorded history) stays in ``DIR/runtime/<point>``,
so ``txstream check --criterion csao DIR/runtime`` judges every run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from txstream.bench.harness import Experiment, Figure
from txstream.bench.ledger import OPENING_BALANCE, events, ledger_job, serial_oracle
from txstream.errors import TxStreamError

POINT_TIMEOUT = 900
ACCOUNTS = 100_000
"""Accounts in the ledger (TStream's Streaming Ledger uses a large key space too)."""
WARMUP = 24_000
"""Events fed and committed before the clock starts (not in ``events``; checked all the same)."""
MASTERS = {"local[1]": 1, "local[2]": 2, "local-cluster[2,1,1024]": 2}


def _point(engine: str, master: str, cross: int, n: int, rate: int) -> dict[str, Any]:
    return {
        "engine": engine,
        "master": master,
        "cores": MASTERS[master],
        "cross_partition_pct": cross,
        "events": n,
        "rate": rate,
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

GRID = [
    *(_point("executors", m, c, 600_000, FLOOD) for m in MASTERS for c in (0, 1, 10)),
    *(_point("executors", "local[2]", c, LONG, LOAD) for c in (0, 10)),
    *(_point("executors", "local[2]", 0, LONG, rate) for rate in SWEEP),
    *(_point("driver", "local[2]", c, 200_000, FLOOD) for c in (0, 10)),
]
QUICK = [
    *(_point("executors", m, 0, 300_000, FLOOD) for m in ("local[1]", "local[2]")),
    _point("executors", "local[2]", 0, 300_000, LOAD),
    _point("executors", "local[2]", 10, 300_000, FLOOD),
    _point("executors", "local-cluster[2,1,1024]", 10, 300_000, FLOOD),
    _point("driver", "local[2]", 10, 100_000, FLOOD),
]


def run_point(point: dict[str, Any], seed: int) -> dict[str, Any]:
    """Run one point in a child process; returns its metrics."""
    out = Path(point.pop("_out", "bench-out")) / "runtime"
    name = (
        f"{point['engine']}-{point['master'].replace('[', '').replace(']', '')}"
        f"-x{point['cross_partition_pct']}-r{point['rate']}-s{seed}"
    ).replace(",", "_")
    folder = out / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    cmd = [
        sys.executable,
        "-m",
        "txstream.bench.runtime",
        json.dumps({**point, "seed": seed}),
        str(folder),
    ]
    try:
        result = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=POINT_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        return {
            "txn_per_s": 0.0,
            "p99_latency_s": None,
            "max_latency_s": None,
            "errors": -1,
            "note": f"timed out after {POINT_TIMEOUT} s",
        }
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("{")]
    if result.returncode != 0 or not lines:
        tail = result.stderr.strip().splitlines()[-1:] or ["no output"]
        raise TxStreamError(f"bench runtime point {name} failed: {tail[0]}")
    metrics: dict[str, Any] = json.loads(lines[-1])
    return metrics


def _render(stream: list[tuple[str, dict[str, Any]]], chunk: int) -> list[dict[str, list[str]]]:
    """Each file's lines per input, JSON up to the ``sent`` value (stamped when sent).

    Rendered before the clock starts: the feeder stands for another system and
    shares this machine's two cores with the job, so it must cost next to nothing
    while the job runs.
    """
    files = []
    for start in range(0, len(stream), chunk):
        lines: dict[str, list[str]] = {"deposits": [], "transfers": []}
        for name, event in stream[start : start + chunk]:
            lines[name].append(json.dumps(event)[:-1] + ', "sent": ')
        files.append(lines)
    return files


def _feed(
    folder: Path,
    files: list[dict[str, list[str]]],
    rate: int,
    chunk: int,
    started: list[float],
    first: int = 0,
) -> None:
    """Write ``files`` (see :func:`_render`), numbered from ``first``, at ``rate`` events/s."""
    staging = folder / "staging"
    staging.mkdir(exist_ok=True)
    begin = time.time()
    for n, lines in enumerate(files):
        due = begin + n * chunk / rate
        time.sleep(max(0.0, due - time.time()))
        sent = time.time()
        if not started:
            started.append(sent)
        end = f"{sent!r}}}\n"
        for name, prefixes in lines.items():
            tmp = staging / f"{name}-{first + n:06d}.json"
            tmp.write_text(end.join(prefixes) + end if prefixes else "")
            os.replace(tmp, folder / name / f"part-{first + n:06d}.json")


def child(point: dict[str, Any], folder: Path) -> dict[str, Any]:
    """One point, in this process: feed, run, check against the oracle."""
    from txstream.spark import local_session

    spark = local_session("bench-runtime", cores=point["cores"], master=point["master"])
    accounts = int(point.get("accounts", ACCOUNTS))
    warmup = int(point.get("warmup", WARMUP))
    stream = [
        (name, {**e, "id": e["id"] * SPACING})
        for name, e in events(
            warmup + point["events"], accounts, point["cross_partition_pct"], point["seed"]
        )
    ]
    chunk = CHUNK
    files = _render(stream, chunk)
    warm_files = -(-warmup // chunk)
    feed_dir = folder.parent.parent / "runtime-input" / folder.name
    if feed_dir.exists():
        shutil.rmtree(feed_dir)
    feed_dir.mkdir(parents=True)
    for name in ("deposits", "transfers"):
        (feed_dir / name).mkdir()
    per_batch = int(point.get("files_per_batch", FILES_PER_BATCH))
    reader = spark.readStream.option("maxFilesPerTrigger", per_batch)
    deposits = reader.schema("acct long, amount long, id long, sent double").json(
        str(feed_dir / "deposits")
    )
    transfers = reader.schema("src long, dst long, amount long, id long, sent double").json(
        str(feed_dir / "transfers")
    )
    job = (
        ledger_job(
            deposits,
            transfers,
            name="ledger_bench",
            initial=spark.range(accounts).selectExpr(
                "id as acct", f"cast({OPENING_BALANCE} as bigint) as balance"
            ),
        )
        .option("arrivalTime", "sent")
        .option("recordHistory", True)
        # The two inputs are two file sources: one may hand a file over a batch
        # before the other's file of the same events, and the oracle is serial
        # execution by id.
        .option("merge", "event-time")
    )
    partitions = 1 if point["master"] == "local[1]" else 2
    query = job.start(folder, spark=spark, partitions=partitions, engine=point["engine"])
    seen: dict[int, dict[str, Any]] = {}  # batch id -> progress (recentProgress is capped)
    deadline = time.time() + POINT_TIMEOUT - 60

    def committed() -> int:
        seen.update((p["batchId"], p) for p in query.recentProgress)
        return sum(p["numInputRows"] for p in seen.values())

    beats = 0

    def wait_for(count: int, after: int) -> None:
        """Wait until ``count`` events are committed, sending heartbeats after id ``after``.

        The event-time merge holds an input's events until the other input has
        passed them; at the end of a feed only a later event releases them: a
        heartbeat (a deposit of 0 to account 0, ids between the events').
        """
        nonlocal beats
        sent = 0
        last = time.time()
        while committed() < count + beats and query.isActive and time.time() < deadline:
            latest = seen[max(seen)] if seen else {}
            inside = committed() + latest.get("held", 0) >= count + beats  # all fed, some held
            if inside and time.time() - last > HEARTBEAT_S and sent < SPACING - 1:
                sent += 1
                _heartbeat(feed_dir, after + sent, f"{after}-{sent}")
                beats += 1
                last = time.time()
            time.sleep(0.05)

    started: list[float] = []
    try:
        # Warm-up, not timed: the first batches compile Spark's code and load each
        # worker's partition state.  The clock starts with the first file after.
        _feed(feed_dir, files[:warm_files], point["rate"], chunk, [])
        warm_count = min(len(stream), warm_files * chunk)
        wait_for(warm_count, stream[warm_count - 1][1]["id"])
        warm_beats = beats
        timed_from = max(seen, default=-1) + 1
        feeder = threading.Thread(
            target=_feed,
            args=(feed_dir, files[warm_files:], point["rate"], chunk, started, warm_files),
        )
        feeder.start()
        feeder.join()
        wait_for(len(stream), stream[-1][1]["id"])
        committed()
        final_balances = _balances(query, job, folder, partitions)
        if query.engine == "driver":
            # The driver engine records in the transaction manager; its history
            # goes beside the executor runs' stores.
            from txstream.model import format_history

            (folder.parent / f"{folder.name}.txt").write_text(
                format_history(query.driver.tm.history()) + "\n"
            )
    finally:
        query.stop()
    progress = [seen[b] for b in sorted(seen)]
    timed = [p for p in progress if p["batchId"] >= timed_from]
    histogram: dict[int, int] = {}
    for p in timed:
        for ms, count in p["latencyHistogramMs"].items():
            histogram[int(ms)] = histogram.get(int(ms), 0) + count
    total = sum(p["numInputRows"] for p in progress)
    balance, outcomes = serial_oracle(stream, accounts)
    got = [(r["id"], r["ok"]) for r in query.output("transfers_done")]
    errors = sum(1 for a, b in zip(got, outcomes, strict=False) if a != b)
    errors += abs(len(got) - len(outcomes))
    errors += sum(1 for k in balance if final_balances.get(k) != balance[k])
    deposited = sum(e["amount"] for n, e in stream if n == "deposits")
    if sum(final_balances.values()) != accounts * OPENING_BALANCE + deposited:
        errors += 1
    # the batch that committed the last event (heartbeats are released after it, or with it)
    total_events = len(stream) + warm_beats
    done_at, cum = None, 0
    for p in progress:
        cum += p["numInputRows"]
        if cum >= total_events:
            done_at = p["batchId"]
            break
    elapsed = max(1e-9, _commit_time(folder, done_at) - started[0]) if started else 0.0
    measured = len(stream) - warm_count if done_at is not None else 0
    return {
        "txn_per_s": round(measured / elapsed) if elapsed else 0.0,
        "p99_latency_s": _percentile(histogram, 0.99),
        "max_latency_s": _percentile(histogram, 1.0),
        "errors": errors,
        "batches": len(progress),
        "committed_events": total - beats,
        "warmup_events": warm_count,
        "heartbeats": beats,
        "deferred": sum(p["deferred"] for p in timed),
        "phase1_s": round(sum(p.get("phase1Ms", 0) for p in timed) / 1000, 1),
        "deferred_phases_s": round(sum(p.get("deferredPhasesMs", 0) for p in timed) / 1000, 1),
        "batch_s": round(sum(p["durationMs"] for p in timed) / 1000, 1),
        "steady_txn_per_s": _steady(folder, timed),
    }


def _steady(folder: Path, timed: list[dict[str, Any]]) -> float | None:
    """Transactions committed per second in the steady state.

    The slope (least squares) of committed events against commit time over the
    timed batches, the last one left out: it drains the feed and waits for a
    heartbeat.  Below capacity it is the offered rate (the job keeps up), above
    it the capacity.  ``txn_per_s`` divides by the whole span instead, so the
    drain at the end lowers it, the more the shorter the run.
    """
    points, cum = [], 0
    for p in timed:
        if p["numInputRows"]:
            cum += p["numInputRows"]
            marker = _marker(folder, p["batchId"])
            if not marker.exists():
                return None  # the driver engine keeps no commit markers
            points.append((marker.stat().st_mtime, cum))
    points = points[:-1]
    if len(points) < 3:
        return None
    mt = sum(t for t, _ in points) / len(points)
    mc = sum(c for _, c in points) / len(points)
    var = sum((t - mt) ** 2 for t, _ in points)
    return round(sum((t - mt) * (c - mc) for t, c in points) / var) if var else None


def _commit_time(folder: Path, batch: int | None) -> float:
    """When batch ``batch`` committed (its commit marker's time); now when it did not."""
    path = _marker(folder, batch) if batch is not None else None
    return path.stat().st_mtime if path is not None and path.exists() else time.time()


def _marker(folder: Path, batch: int) -> Path:
    """Batch ``batch``'s commit marker in the executor runtime's store."""
    return folder / "txstream" / "commits" / f"{batch:012d}.json"


def _heartbeat(folder: Path, event_id: int, tag: str) -> None:
    """A deposit of 0 to account 0 with id ``event_id``: releases what the merge holds."""
    line = json.dumps({"acct": 0, "amount": 0, "id": event_id, "sent": None}) + "\n"
    tmp = folder / "staging" / f"beat-{tag}.json"
    tmp.write_text(line)
    os.replace(tmp, folder / "deposits" / f"beat-{tag}.json")


def _balances(query: Any, job: Any, folder: Path, partitions: int) -> dict[int, int]:
    if query.engine == "driver":
        tm = query.driver.tm
        with tm.begin(read_only=True) as txn:
            table = tm.table("accounts")
            return {
                k: txn.read(table, k)["balance"]
                for k in range(2 * ACCOUNTS)
                if txn.read(table, k) is not None
            }
    from txstream.spark.runtime.state import RuntimeStore

    store = RuntimeStore(folder / "txstream")
    last = store.committed()[-1]
    out: dict[int, int] = {}
    for pid in range(partitions):
        for rows in store.load(pid, last).data.get("accounts", {}).values():
            out.update({k: r["balance"] for k, r in rows.items()})
    return out


def _percentile(histogram: dict[int, int], q: float) -> float | None:
    total = sum(histogram.values())
    if not total:
        return None
    seen = 0
    for ms in sorted(histogram):
        seen += histogram[ms]
        if seen >= q * total:
            return (ms + 1) / 1000
    return None


def _count(value: float | None) -> str:
    return "–" if value is None or value != value else f"{value:,.0f}"  # None, NaN: no value


def summarize(rows: list[dict[str, Any]]) -> str:
    """The goals of the runtime issue, checked on this run's rows."""

    def best(**where: Any) -> float:
        vals = [r["txn_per_s"] for r in rows if all(r.get(k) == v for k, v in where.items())]
        return max(vals, default=0.0)

    lines = [
        "| engine | master | cross % | offered events/s | txn/s | steady txn/s | p99 s | max s "
        "| errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['engine']} | {r['master']} | {r['cross_partition_pct']} | {r['rate']:,} | "
            f"{r['txn_per_s']:,} | {_count(r.get('steady_txn_per_s'))} | "
            f"{r['p99_latency_s']} | {r['max_latency_s']} | {r['errors']} |"
        )
    one, two = (
        best(engine="executors", master="local[1]", cross_partition_pct=0, rate=FLOOD),
        best(engine="executors", master="local[2]", cross_partition_pct=0, rate=FLOOD),
    )
    drv = best(engine="driver", cross_partition_pct=10, rate=FLOOD)
    exe = best(engine="executors", master="local[2]", cross_partition_pct=10, rate=FLOOD)
    lines.append("")
    if one:
        lines.append(f"- capacity, local[2] / local[1] at 0% cross: {two / one:.2f}x (goal 1.4x)")
    if drv:
        lines.append(
            f"- capacity, executors / driver engine at 10% cross: {exe / drv:.2f}x (goal 5x)"
        )
    for r in sorted(rows, key=lambda r: (r["cross_partition_pct"], r["rate"])):
        if r["engine"] == "executors" and r["master"] == "local[2]" and r["rate"] < FLOOD:
            steady, p99 = r.get("steady_txn_per_s"), r["p99_latency_s"]
            met = steady is not None and steady >= 50_000 and p99 is not None and p99 < 2
            lines.append(
                f"- local[2] at {r['rate']:,} events/s offered, {r['cross_partition_pct']}% "
                f"cross: {_count(steady)} txn/s steady ({r['txn_per_s']:,} overall), "
                f"p99 {p99} s: goal 50,000 txn/s with p99 under 2 s "
                + ("met" if met else "not met")
            )
    lines.append(f"- errors in all runs: {sum(abs(r['errors']) for r in rows)} (goal 0)")
    return "\n".join(lines)


EXPERIMENT = Experiment(
    name="runtime",
    description="Streaming Ledger on the executor runtime (local[1], local[2], local-cluster) "
    "and on the SS2PL driver engine",
    grid=GRID,
    quick_grid=QUICK,
    run=run_point,
    repetitions=1,
    quick_repetitions=1,
    wants_out=True,
    figures=[
        Figure(
            name="runtime",
            x="cross_partition_pct",
            y="txn_per_s",
            series="master",
            facet="engine",
            title="capacity, txn/s (dashed: 50k)",
            ylabel="transactions / s",
            hline=50_000.0,
            where=(("rate", FLOOD),),
        ),
        Figure(
            name="runtime_latency",
            x="cross_partition_pct",
            y="p99_latency_s",
            series="master",
            facet="engine",
            title=f"p99 s at {LOAD // 1000}k/s offered (dashed: 2 s)",
            ylabel="seconds",
            hline=2.0,
            where=(("rate", LOAD),),
        ),
        Figure(
            name="runtime_latency_load",
            x="steady_txn_per_s",
            y="p99_latency_s",
            title="p99 against steady txn/s, local[2], 0% cross (dashed: 2 s)",
            ylabel="p99 latency, seconds",
            logy=True,
            hline=2.0,
            where=(("engine", "executors"), ("master", "local[2]"), ("cross_partition_pct", 0)),
        ),
    ],
    summarize=summarize,
)


if __name__ == "__main__":
    print(json.dumps(child(json.loads(sys.argv[1]), Path(sys.argv[2]))), flush=True)
