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
  when the total balance is not the sum of the deposits (warm-up included),
  plus ``audit_violations`` (see :func:`audit_violations`);
* ``serial_share``, ``hot_floor``, ``cross_share``: counted from the timed input
  (:func:`schedule_metrics`, :mod:`txstream.bench.schedule`), not timed;
* ``msgs_per_mp_txn``, ``bytes_per_mp_txn``: what the runtime sent between
  tasks per multi-partition transaction (:func:`multi_partition`).

Parameters of a point (issue 28; ``--set`` changes them in every point):
``pattern`` (``cross`` with ``cross_partition_pct``, ``uniform``, ``zipf`` with
``skew``: see :func:`~txstream.bench.ledger.events`), ``accounts``,
``audit_every`` (an audit reading every balance after every N ledger events,
0: none), ``partitions`` (the master's cores unless set) and ``cross_mode``
(the job's ``crossPartition`` option, ``forward`` or ``defer``) and ``history`` (1:
the job records its history, the default here; 0: it does not, a job's own
default, so the run's history cannot be checked) and ``sink`` (``delta``: every
output also goes to a :class:`~txstream.spark.runtime.sinks.DeltaSink` beside the
run's store; ``none``, the default: the store's JSON outputs only).

Each run's store (with its recorded history) stays in ``DIR/runtime/<point>``,
so ``txstream check --criterion csao DIR/runtime`` judges every run.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from txstream.bench.harness import Experiment, Param
from txstream.bench.ledger import (
    OPENING_BALANCE,
    PATTERNS,
    audit_totals,
    events,
    ledger_job,
    serial_oracle,
)
from txstream.bench.runtime_points import (
    ACCOUNTS,
    CHUNK,
    DEFAULTS,
    FILES_PER_BATCH,
    FLOOD,
    GRID,
    HEARTBEAT_S,
    INPUT_SEED,
    LOAD,
    LONG,
    MASTERS,
    ONE_K,
    POINT_TIMEOUT,
    QUICK,
    SPACING,
    SWEEP,
    WARMUP,
    WORKLOAD_EVENTS,
    _point,
    run_name,
    setup,
    workload,
)
from txstream.bench.runtime_report import CROSS_ONLY, FIGURES, summarize
from txstream.bench.schedule import batched, keys_of
from txstream.errors import TxStreamError
from txstream.spark.runtime import Job
from txstream.spark.runtime.base import RuntimeJobError
from txstream.spark.runtime.job import NEVER_QUIET
from txstream.spark.runtime.partitioning import partition_of

# The points and the report moved to runtime_points and runtime_report; their
# names are still imported from here.
__all__ = [
    "ACCOUNTS",
    "CHUNK",
    "CROSS_ONLY",
    "DEFAULTS",
    "EXPERIMENT",
    "FIGURES",
    "FILES_PER_BATCH",
    "FLOOD",
    "GRID",
    "HEARTBEAT_S",
    "INPUT_SEED",
    "LOAD",
    "LONG",
    "MASTERS",
    "ONE_K",
    "POINT_TIMEOUT",
    "QUICK",
    "SPACING",
    "SWEEP",
    "WARMUP",
    "WORKLOAD_EVENTS",
    "_point",
    "audit_violations",
    "bench_job",
    "child",
    "multi_partition",
    "run_name",
    "run_point",
    "schedule_metrics",
    "setup",
    "summarize",
    "workload",
]


def run_point(point: dict[str, Any], seed: int) -> dict[str, Any]:
    """Run one point in a child process; returns its metrics."""
    out = Path(point.pop("_out", "bench-out")) / "runtime"
    labels = {"workload": workload(point), "setup": setup(point)}
    name = run_name(point, seed)
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
            **labels,
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
    metrics: dict[str, Any] = {**labels, **json.loads(lines[-1])}
    return metrics


def _render(
    stream: list[tuple[str, dict[str, Any]]],
    chunk: int,
    inputs: tuple[str, ...] = ("deposits", "transfers"),
) -> list[dict[str, list[str]]]:
    """Each file's lines per input of ``inputs``, JSON up to the ``sent`` value (stamped when sent).

    Rendered before the clock starts: the feeder stands for another system and
    shares this machine's two cores with the job, so it must cost next to nothing
    while the job runs.
    """
    files = []
    for start in range(0, len(stream), chunk):
        lines: dict[str, list[str]] = {name: [] for name in inputs}
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


def _stream(point: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The point's events, warm-up first, ids spaced by :data:`SPACING` (room for heartbeats)."""
    partitions = int(point.get("partitions", MASTERS[point["master"]]))
    return [
        (name, {**e, "id": e["id"] * SPACING})
        for name, e in events(
            int(point.get("warmup", WARMUP)) + point["events"],
            int(point.get("accounts", ACCOUNTS)),
            point.get("cross_partition_pct", 0),
            int(point.get("input_seed", point["seed"])),
            pattern=point.get("pattern", "cross"),
            skew=float(point.get("skew", 0.0)),
            audit_every=int(point.get("audit_every", 0)),
            # cross: against at least 2 partitions, so local[1] runs local[2]'s input
            partitions=max(2, partitions),
        )
    ]


def schedule_metrics(
    stream: list[tuple[str, dict[str, Any]]], partitions: int, batch: int
) -> dict[str, float]:
    """Counted from the input (no timing): serial share, hot floor, cross share at ``partitions``.

    Over ``stream`` (the timed events) in batches of ``batch`` events, the
    micro-batch size the source is capped at (the runtime schedules each
    micro-batch on its own); the same numbers in every run of the point.
    ``cross_share``: the transfers whose two accounts are on different partitions.
    """
    txns = keys_of(stream)
    share, floor = batched(txns, partitions, batch)
    pairs = [t for t in txns if len(t) == 2]
    crossing = sum(
        1 for a, b in pairs if partition_of(a, partitions) != partition_of(b, partitions)
    )
    return {
        "serial_share": round(share, 4),
        "hot_floor": round(floor, 4),
        "cross_share": round(crossing / len(pairs), 4) if pairs else 0.0,
    }


def _missing_feature(point: dict[str, Any]) -> str | None:
    """What the runtime on the path lacks for ``point`` (audits need global reads), if anything."""
    if point.get("audit_every") and "global_reads" not in inspect.signature(Job.input).parameters:
        return "this runtime has no global reads (Job.input(..., global_reads=...)): no audits"
    return None


def bench_job(deposits: Any, transfers: Any, audits: Any, initial: Any) -> Job:
    """The benchmark's ledger job (``audits`` None: no audits), with the options of a point."""
    return (
        ledger_job(deposits, transfers, name="ledger_bench", initial=initial, audits=audits)
        .option("arrivalTime", "sent")
        .option("recordHistory", True)
        # The inputs are separate file sources: one may hand a file over a batch
        # before another's file of the same events, and the oracle is serial
        # execution by id.
        .option("merge", "event-time")
        # No input stops holding the others back for being quiet: Spark lists
        # the sources one after another, so in a batch that starts while the
        # feeder writes one may see a file that another does not yet, and a
        # quiet input would let the other's later events run first.  Heartbeats
        # into every input end the feed instead (see wait_for in child).
        .option("idleBatches", NEVER_QUIET)
    )


def child(point: dict[str, Any], folder: Path) -> dict[str, Any]:
    """One point, in this process: feed, run, check against the oracle."""
    missing = _missing_feature(point)
    if missing is not None:
        return {
            "txn_per_s": 0.0,
            "p99_latency_s": None,
            "max_latency_s": None,
            "errors": -1,
            "note": missing,
        }
    from txstream.spark import local_session

    spark = local_session("bench-runtime", cores=point["cores"], master=point["master"])
    accounts = int(point.get("accounts", ACCOUNTS))
    warmup = int(point.get("warmup", WARMUP))
    audited = bool(point.get("audit_every"))
    inputs = ("deposits", "transfers", "audits") if audited else ("deposits", "transfers")
    stream = _stream(point)
    chunk = int(point.get("chunk", CHUNK))
    files = _render(stream, chunk, inputs)
    warm_files = -(-warmup // chunk)
    feed_dir = folder.parent.parent / "runtime-input" / folder.name
    if feed_dir.exists():
        shutil.rmtree(feed_dir)
    feed_dir.mkdir(parents=True)
    for name in inputs:
        (feed_dir / name).mkdir()
    per_batch = int(point.get("files_per_batch", FILES_PER_BATCH))
    reader = spark.readStream.option("maxFilesPerTrigger", per_batch)
    deposits = reader.schema("acct long, amount long, id long, sent double").json(
        str(feed_dir / "deposits")
    )
    transfers = reader.schema("src long, dst long, amount long, id long, sent double").json(
        str(feed_dir / "transfers")
    )
    audits = (
        reader.schema("id long, expected long, sent double").json(str(feed_dir / "audits"))
        if audited
        else None
    )
    job = bench_job(
        deposits,
        transfers,
        audits,
        spark.range(accounts).selectExpr(
            "id as acct", f"cast({OPENING_BALANCE} as bigint) as balance"
        ),
    )
    # history 0: no recorded history (a job's default), so no CSAO check of the run;
    # the outcomes, balances and audits are still checked against the serial oracle.
    job.option("recordHistory", bool(int(point.get("history", 1))))
    notes = []
    try:
        job.option("crossPartition", point.get("cross_mode", "forward"))
    except RuntimeJobError:
        # a runtime before issue 28: multi-partition transactions in phases 2/3
        notes.append("this runtime has no option crossPartition: ran its phases 2/3 (defer)")
    if point.get("sink", "none") == "delta":
        # issue 30's sink cost: every output also appended to a Delta table, exactly once
        from txstream.spark.runtime.sinks import DeltaSink

        lake = folder.parent.parent / "runtime-delta" / folder.name
        if lake.exists():
            shutil.rmtree(lake)  # a table from an earlier run would skip this run's batch ids
        for output in ("transfers_done", *(("audits_done",) if audited else ())):
            job.sink(output, DeltaSink(lake / output))
    partitions = int(point.get("partitions", MASTERS[point["master"]]))
    query = job.start(folder, spark=spark, partitions=partitions, engine=point["engine"])
    seen: dict[int, dict[str, Any]] = {}  # batch id -> progress (recentProgress is capped)
    deadline = time.time() + POINT_TIMEOUT - 60

    def committed() -> int:
        seen.update((p["batchId"], p) for p in query.recentProgress)
        return sum(p["numInputRows"] for p in seen.values())

    beats = 0  # heartbeat rows sent
    held_beats = 0  # of which the merge still holds (see wait_for)

    def wait_for(count: int, after: int) -> None:
        """Wait until ``count`` events are committed, sending heartbeats after id ``after``.

        The event-time merge holds an input's events until every input has
        passed them; at the end of a feed only later events release them: a
        heartbeat round, one row of id ``after + n`` into every input (a deposit
        of 0 to account 0, a transfer of 0 from account 0 to itself, an audit
        that expects nothing; ids between the events', their output rows left
        out of the checks).  A round releases everything before it and its
        first input's row; the other inputs' rows (``len(inputs) - 1``) stay
        held until the next round or the next events.
        """
        nonlocal beats, held_beats
        rounds = 0
        last = time.time()

        def done() -> bool:
            return committed() >= count + beats - (len(inputs) - 1 if rounds else 0)

        while not done() and query.isActive and time.time() < deadline:
            latest = seen[max(seen)] if seen else {}
            inside = committed() + latest.get("held", 0) >= count + beats  # all fed, some held
            if inside and time.time() - last > HEARTBEAT_S and rounds < SPACING - 1:
                rounds += 1
                _heartbeat(feed_dir, after + rounds, f"{after}-{rounds}", inputs)
                beats += len(inputs)
                last = time.time()
            time.sleep(0.05)
        held_beats = len(inputs) - 1 if rounds else 0

    started: list[float] = []
    read_all = False
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
        final_balances = _balances(query, job, folder, partitions, accounts)
        if query.engine == "driver":
            # The driver engine records in the transaction manager; its history
            # goes beside the executor runs' stores.
            from txstream.model import format_history

            (folder.parent / f"{folder.name}.txt").write_text(
                format_history(query.driver.tm.history()) + "\n"
            )
        read_all = True
    finally:
        # Every timed event has committed, but the event-time merge may still
        # hold the last heartbeat (it waits for a later event on every input):
        # end the inputs so the run leaves nothing held, as a bounded job would.
        query.stop(end_inputs=read_all or None)
    progress = [seen[b] for b in sorted(seen)]
    timed = [p for p in progress if p["batchId"] >= timed_from]
    histogram: dict[int, int] = {}
    for p in timed:
        for ms, count in p["latencyHistogramMs"].items():
            histogram[int(ms)] = histogram.get(int(ms), 0) + count
    total = sum(p["numInputRows"] for p in progress)
    balance, outcomes = serial_oracle(stream, accounts)
    # (heartbeats' rows have ids between the events', which are multiples of SPACING)
    got = [(r["id"], r["ok"]) for r in query.output("transfers_done") if r["id"] % SPACING == 0]
    errors = sum(1 for a, b in zip(got, outcomes, strict=False) if a != b)
    errors += abs(len(got) - len(outcomes))
    errors += sum(1 for k in balance if final_balances.get(k) != balance[k])
    deposited = sum(e["amount"] for n, e in stream if n == "deposits")
    if sum(final_balances.values()) != accounts * OPENING_BALANCE + deposited:
        errors += 1
    audit_rows = (
        [r for r in query.output("audits_done") if r["id"] % SPACING == 0] if audited else []
    )
    violations = audit_violations(audit_rows, audit_totals(stream, accounts))
    errors += violations
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
    model = schedule_metrics(stream[warm_count:], partitions, chunk * per_batch)
    return {
        "txn_per_s": round(measured / elapsed) if elapsed else 0.0,
        "p99_latency_s": _percentile(histogram, 0.99),
        "max_latency_s": _percentile(histogram, 1.0),
        "errors": errors,
        "batches": len(progress),
        "committed_events": total - (beats - held_beats),
        "warmup_events": warm_count,
        "heartbeats": beats,
        **model,
        **multi_partition(timed),
        "audits": len(audit_rows),
        "audit_violations": violations,
        "deferred": sum(p.get("deferred", 0) for p in timed),
        "phase1_s": round(sum(p.get("phase1Ms", 0) for p in timed) / 1000, 1),
        "deferred_phases_s": round(sum(p.get("deferredPhasesMs", 0) for p in timed) / 1000, 1),
        "batch_s": round(sum(p["durationMs"] for p in timed) / 1000, 1),
        "steady_txn_per_s": _steady(folder, timed),
        **({"note": "; ".join(notes)} if notes else {}),
    }


def audit_violations(rows: list[dict[str, Any]], expected: list[tuple[int, int]]) -> int:
    """Audits whose total is not the serial one, missing, repeated, unknown or not ``ok``.

    ``rows``: the ``audits_done`` rows (``id``, ``total``, ``ok``); ``expected``:
    :func:`~txstream.bench.ledger.audit_totals` of the input.
    """
    want = dict(expected)
    got: dict[int, dict[str, Any]] = {}
    bad = 0
    for row in rows:
        if row["id"] in got or row["id"] not in want:
            bad += 1  # an audit twice, or one that the input has not
        else:
            got[row["id"]] = row
    for i, total in want.items():
        found = got.get(i)
        if found is None or found["total"] != total or not found["ok"]:
            bad += 1
    return bad


def multi_partition(timed: list[dict[str, Any]]) -> dict[str, Any]:
    """Multi-partition transactions and what they sent between tasks, over the timed batches.

    From each batch's progress ``multiPartition`` (``transactions``, ``messages``,
    ``bytes``); None where the runtime reports none (before issue 28).
    """
    parts = [p["multiPartition"] for p in timed if p.get("multiPartition") is not None]
    if not parts:
        return {"mp_txns": None, "msgs_per_mp_txn": None, "bytes_per_mp_txn": None}
    txns = sum(int(p.get("transactions", 0)) for p in parts)
    msgs = sum(int(p.get("messages", 0)) for p in parts)
    size = sum(int(p.get("bytes", 0)) for p in parts)
    return {
        "mp_txns": txns,
        "msgs_per_mp_txn": round(msgs / txns, 3) if txns else None,
        "bytes_per_mp_txn": round(size / txns, 1) if txns else None,
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


BEATS: dict[str, dict[str, Any]] = {
    "deposits": {"acct": 0, "amount": 0},
    "transfers": {"src": 0, "dst": 0, "amount": 0},
    "audits": {"expected": None},
}
"""A heartbeat row of each input: it changes no balance."""


def _heartbeat(folder: Path, event_id: int, tag: str, inputs: tuple[str, ...]) -> None:
    """A row of id ``event_id`` into each of ``inputs`` (:data:`BEATS`): releases held events."""
    for name in inputs:
        line = json.dumps({**BEATS[name], "id": event_id, "sent": None}) + "\n"
        tmp = folder / "staging" / f"beat-{name}-{tag}.json"
        tmp.write_text(line)
        os.replace(tmp, folder / name / f"beat-{tag}.json")


def _balances(query: Any, job: Any, folder: Path, partitions: int, accounts: int) -> dict[int, int]:
    if query.engine == "driver":
        tm = query.driver.tm
        with tm.begin(read_only=True) as txn:
            table = tm.table("accounts")
            return {
                k: txn.read(table, k)["balance"]
                for k in range(2 * accounts)
                if txn.read(table, k) is not None
            }
    from txstream.spark.runtime.state import RuntimeStore

    store = RuntimeStore(folder / "txstream")
    last = store.committed()[-1]
    out: dict[int, int] = {}
    for pid in range(partitions):
        for k, r in store.load(pid, last).all_rows("accounts"):
            out[k] = r["balance"]
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


EXPERIMENT = Experiment(
    name="runtime",
    description="Streaming Ledger on the executor runtime (local[1], local[2], local-cluster) "
    "and on the SS2PL driver engine: cross-partition, uniform and Zipf transfers, audits",
    grid=GRID,
    quick_grid=QUICK,
    run=run_point,
    repetitions=1,
    quick_repetitions=1,
    wants_out=True,
    params={
        "pattern": Param(str, choices=PATTERNS),
        "skew": Param(float, lo=0, hi=10),
        "accounts": Param(int, lo=2, hi=100_000_000),
        "audit_every": Param(int, lo=0, hi=100_000_000),
        "partitions": Param(int, lo=1, hi=1024),
        "cross_mode": Param(str, choices=("forward", "defer")),
        "cross_partition_pct": Param(int, lo=0, hi=100),
        "input_seed": Param(int, lo=0, hi=2**63 - 1),
        "history": Param(int, lo=0, hi=1),
        "sink": Param(str, choices=("none", "delta")),
    },
    figures=FIGURES,
    summarize=summarize,
)


if __name__ == "__main__":
    print(json.dumps(child(json.loads(sys.argv[1]), Path(sys.argv[2]))), flush=True)
