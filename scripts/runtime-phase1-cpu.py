"""CPU per event of the runtime's phase-1 task, without Spark (Streaming Ledger, 0% cross).

Builds the Arrow batches a Spark task receives (two partitions, 100,000
accounts, ``--per`` events per partition and batch, history recording on) and
runs ``query._phase1_task`` on them batch after batch, in this process, as a
Python worker would. Prints the CPU microseconds per event of each batch after
the first (which loads the state), their mean and the best batch. Compare two
checkouts by pointing ``PYTHONPATH`` at each, alternating runs.

    PYTHONPATH=src .venv/bin/python scripts/runtime-phase1-cpu.py [--batches 8] [--no-history]
        [--accounts 100000]

``--accounts`` sizes the state (the cost per event grows with it: cache misses
on the rows); the figures in docs/benchmarks.md use the default.
"""

from __future__ import annotations

import argparse
import inspect
import pickle
import shutil
import tempfile
import time
from typing import Any

import pyarrow as pa

from txstream.bench.ledger import OPENING_BALANCE, events, ledger_job
from txstream.spark.runtime.partitioning import partition_of
from txstream.spark.runtime.state import RuntimeStore
from txstream.spark.runtime.tasks import BatchContext

try:
    from txstream.spark.runtime import spark_tasks as q
except ImportError:  # (checkouts before 7e452ab, such as ef80880: the tasks lived in query.py)
    from txstream.spark.runtime import query as q  # type: ignore[no-redef]

P, ACCOUNTS = 2, 100_000
DEPOSIT = pa.struct([(c, pa.int64()) for c in ("acct", "amount", "id")] + [("sent", pa.float64())])
TRANSFER = pa.struct(
    [(c, pa.int64()) for c in ("src", "dst", "amount", "id")] + [("sent", pa.float64())]
)
COLUMNS = [
    ("__input", pa.int32()),
    ("__ordv", pa.float64()),
    ("__in0", DEPOSIT),
    ("__in1", TRANSFER),
    ("__pids", pa.list_(pa.int32())),
    ("__mid", pa.int64()),
    ("__pid", pa.int32()),
    ("__copy", pa.bool_()),
    ("__route", pa.int64()),
]


def arrow_batch(stream: list[tuple[str, dict[str, Any]]], pid: int, now: float) -> Any:
    """The rows of partition ``pid`` as the shuffle hands them to its task."""
    cols: dict[str, list[Any]] = {name: [] for name, _ in COLUMNS}
    for mid, (name, event) in enumerate(stream):
        event = {**event, "sent": now}
        keys = [event["acct"]] if name == "deposits" else [event["src"], event["dst"]]
        pids = [partition_of(k, P) for k in keys]
        if pids[0] != pid:
            continue
        deposit = name == "deposits"
        cols["__input"].append(0 if deposit else 1)
        cols["__in0"].append(event if deposit else None)
        cols["__in1"].append(None if deposit else event)
        cols["__ordv"].append(float(event["id"]))
        cols["__pids"].append(pids)
        cols["__mid"].append(mid)
        cols["__pid"].append(pid)
        cols["__copy"].append(True)
        cols["__route"].append(pid)
    arrays = [pa.array(cols[name], type=kind) for name, kind in COLUMNS]
    return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in COLUMNS])


def main() -> None:
    """Parse the options, run the batches and print CPU per event."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per", type=int, default=30_000, help="events per partition and batch")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument(
        "--no-history", action="store_true", help="without history recording (its cost)"
    )
    parser.add_argument("--accounts", type=int, default=ACCOUNTS, help="accounts (state size)")
    run(parser.parse_args())


def run(args: argparse.Namespace) -> None:
    """Run ``args.batches`` batches of ``args.per`` events per partition; print CPU per event."""
    root = tempfile.mkdtemp(prefix="phase1-cpu-")
    try:
        job = ledger_job(name="cpu").option("arrivalTime", "sent")
        job.option("recordHistory", not args.no_history)
        spec = job.spec.for_tasks()
        store = RuntimeStore(root)
        rows: dict[int, dict[int, dict[int, dict[str, int]]]] = {}
        for a in range(args.accounts):
            row = {"acct": a, "balance": OPENING_BALANCE}
            rows.setdefault(partition_of(a, P), {})[a] = {a: row}
        for pid, values in rows.items():
            store.write_init(pid, "accounts", values)
        size = args.per * P
        # Every batch's Arrow input is built before the first task runs, for at least
        # ``args.prepare`` batches: runtime-phase1-instructions.py counts the whole
        # process, so its runs of 2 and 3 batches must build the same inputs.
        built = max(args.batches, getattr(args, "prepare", 0))
        stream = list(events(size * built, args.accounts, 0, 1))
        inputs = [
            [arrow_batch(stream[b * size : (b + 1) * size], pid, time.time()) for pid in range(P)]
            for b in range(built)
        ]
        names = {0: "deposits", 1: "transfers"}
        tokens: dict[int, str] = {}
        prev, per_event = -1, []
        for b in range(args.batches):
            files: dict[str, list[int]] = {}
            for pid in range(P):
                batch = inputs[b][pid]
                ctx = BatchContext(
                    root, b, prev, snapshot=b == 0, arrival=job.arrival_fn(),
                    tokens=dict(tokens), partitions=P,
                )  # fmt: skip
                began = time.process_time()
                out = list(q._phase1_task(spec, ctx, P, names, iter([batch])))
                cpu = time.process_time() - began
                kinds = out[0].column("kind").to_pylist()
                payloads = out[0].column("payload").to_pylist()
                stats = pickle.loads(payloads[kinds.index("stats")])
                tokens[pid] = stats["token"]
                files.update(stats["stats"].get("files", {}))
                if b > 0:
                    per_event.append(1e6 * cpu / batch.num_rows)
                    print(f"batch {b} partition {pid}: {per_event[-1]:.1f} us/event")
            info = {"prev": prev, "tokens": {str(p): t for p, t in tokens.items()}}
            if "files" in inspect.signature(store.commit).parameters:
                store.commit(b, info, files)
            else:  # (versions before the tasks checksummed their files: the driver read them)
                store.commit(b, info)  # type: ignore[call-arg]
            prev = b
        mean = sum(per_event) / len(per_event)
        print(f"mean {mean:.2f} us/event, best batch {min(per_event):.2f} us/event")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
