"""CPU per event of phase 1 with multi-partition transactions forwarded, without Spark.

The Streaming Ledger on two partitions hosted by one task (as on ``local[1]``:
messages stay in memory), with transfers inside a partition only (``cross0``)
or between any two accounts (``uniform``: half of them cross).  Builds the Arrow
batch the shuffle hands the task (each keyed row at its home only) and runs
``query._phase1_outputs`` with forwarding, batch after batch.  Prints CPU
microseconds per event (per event of the input, not per Arrow row) of each
batch after the first, and the means; ``--profile`` adds where the CPU went.

    PYTHONPATH=src .venv/bin/python scripts/runtime-mp-cpu.py [--batches 6] [--profile]
"""

from __future__ import annotations

import argparse
import collections
import pickle
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from txstream.bench.ledger import OPENING_BALANCE, events, ledger_job
from txstream.spark.runtime import spark_tasks as q
from txstream.spark.runtime.forward import new_exchange
from txstream.spark.runtime.partitioning import partition_of
from txstream.spark.runtime.state import RuntimeStore
from txstream.spark.runtime.tasks import BatchContext, phase1_forward

P, ACCOUNTS = 2, 100_000
DEPOSIT = pa.struct([(c, pa.int64()) for c in ("acct", "amount", "id")] + [("sent", pa.float64())])
TRANSFER = pa.struct(
    [(c, pa.int64()) for c in ("src", "dst", "amount", "id")] + [("sent", pa.float64())]
)
AUDIT = pa.struct([(c, pa.int64()) for c in ("id", "expected")] + [("sent", pa.float64())])
COLUMNS = [
    ("__input", pa.int32()),
    ("__ordv", pa.float64()),
    ("__in0", DEPOSIT),
    ("__in1", TRANSFER),
    ("__in2", AUDIT),
    ("__pids", pa.list_(pa.int32())),
    ("__mid", pa.int64()),
    ("__pid", pa.int32()),
    ("__copy", pa.bool_()),
    ("__route", pa.int64()),
]


def arrow_batch(stream: list[tuple[str, dict[str, Any]]], now: float) -> Any:
    """Every partition's rows (a transfer at its home, an audit everywhere), as a task gets them."""
    cols: dict[str, list[Any]] = {name: [] for name, _ in COLUMNS}
    index = {"deposits": 0, "transfers": 1, "audits": 2}
    for mid, (name, event) in enumerate(stream):
        event = {**event, "sent": now}
        if name == "audits":
            keys = []
        else:
            keys = [event["acct"]] if name == "deposits" else [event["src"], event["dst"]]
        pids = [partition_of(k, P) for k in keys]
        # (as the plan routes it when forwarding: to its home only; the home
        # announces a crossing transaction to the other partitions)
        for pid in pids[:1] if pids else range(P):
            cols["__input"].append(index[name])
            for name_, i in index.items():
                cols[f"__in{i}"].append(event if name_ == name else None)
            cols["__ordv"].append(float(event["id"]))
            cols["__pids"].append(pids)
            cols["__mid"].append(mid)
            cols["__pid"].append(pid)
            cols["__copy"].append(not pids or pid == pids[0])
            cols["__route"].append(0)
    arrays = [pa.array(cols[name], type=kind) for name, kind in COLUMNS]
    return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in COLUMNS])


def one_task(job: Any, ctx: Any, partitions: int, events: Any) -> Any:
    """Every partition in this task: no transport (``local[1]``); homes announce copies."""
    return phase1_forward(job, ctx, events, announce=True)


class Sampler:
    """Counts the innermost txstream function under a SIGPROF timer (0.5 ms of CPU)."""

    def __init__(self) -> None:
        self.functions: collections.Counter[tuple[str, str]] = collections.Counter()
        self.lines: collections.Counter[tuple[str, int, str]] = collections.Counter()

    def sample(self, signum: int, frame: Any) -> None:
        """Count the running line and its innermost txstream function."""
        code = frame.f_code
        path = Path(code.co_filename)
        name = f"forward/{path.name}" if path.parent.name == "forward" else path.name
        self.lines[(name, frame.f_lineno, code.co_name)] += 1
        while frame is not None:
            if "txstream" in frame.f_code.co_filename:
                key = (Path(frame.f_code.co_filename).name, frame.f_code.co_name)
                self.functions[key] += 1
                return
            frame = frame.f_back

    def on(self) -> None:
        """Start sampling."""
        signal.signal(signal.SIGPROF, self.sample)
        signal.setitimer(signal.ITIMER_PROF, 0.0005, 0.0005)

    def off(self) -> None:
        """Stop sampling."""
        signal.setitimer(signal.ITIMER_PROF, 0, 0)


def run(pattern: str, args: argparse.Namespace, sampler: Sampler | None) -> float:
    """Mean CPU us per input event over the batches after the first."""
    root = tempfile.mkdtemp(prefix="mp-cpu-")
    try:
        audits = pattern == "audits"
        job = ledger_job(name="cpu", audits=[] if audits else None).option("arrivalTime", "sent")
        job.option("recordHistory", not args.no_history)
        spec = job.spec.for_tasks()
        store = RuntimeStore(root)
        rows: dict[int, dict[int, dict[int, dict[str, int]]]] = {}
        for a in range(ACCOUNTS):
            row = {"acct": a, "balance": OPENING_BALANCE}
            rows.setdefault(partition_of(a, P), {})[a] = {a: row}
        for pid, values in rows.items():
            store.write_init(pid, "accounts", values)
        size = args.per * P
        # Every batch's input is drawn and built before the first runs, for at least
        # ``args.prepare`` batches: runtime-mp-instructions.py counts the whole process,
        # so its runs of 2 and 3 batches must do the same (the draws cost more at
        # cross 0, which looks up each account's partition, and the Arrow building is
        # this script's, not the task's).
        built = max(args.batches, getattr(args, "prepare", 0))
        if pattern == "cross0":
            stream = list(events(size * built, ACCOUNTS, 0, 1))
        elif pattern.startswith("zipf"):  # zipf: skew 0.8; zipf12: skew 1.2
            skew = float(pattern[4] + "." + pattern[5:]) if len(pattern) > 4 else 0.8
            stream = list(events(size * built, ACCOUNTS, 0, 1, pattern="zipf", skew=skew))
        else:
            every = args.audit_every if audits else 0
            stream = list(
                events(size * built, ACCOUNTS, 0, 1, pattern="uniform", audit_every=every)
            )
        names = (
            {0: "deposits", 1: "transfers", 2: "audits"}
            if audits
            else {0: "deposits", 1: "transfers"}
        )
        parts = [stream[b * size : (b + 1) * size] for b in range(built)]
        inputs = [arrow_batch(part, time.time()) for part in parts]
        tokens: dict[int, str] = {}
        prev, per_event = -1, []
        for b in range(args.batches):
            part, batch = parts[b], inputs[b]
            ctx = BatchContext(
                root, b, prev, snapshot=b == 0, arrival=job.arrival_fn(),
                tokens=dict(tokens), partitions=P,
            )  # fmt: skip
            ctx.exchange = new_exchange(1)
            if sampler is not None and b > 0:
                sampler.on()
            began = time.process_time()
            out = q._phase1_outputs(spec, ctx, P, names, iter([batch]))
            cpu = time.process_time() - began
            if sampler is not None:
                sampler.off()
            files: dict[str, list[int]] = {}
            for o in out:
                summary = pickle.loads(o["payload"])
                tokens[summary["pid"]] = summary["token"]
                files.update(summary["stats"].get("files", {}))
                assert summary["stats"]["aborted"] == 0, summary["stats"]["failures"][:1]
            if b > 0:
                per_event.append(1e6 * cpu / len(part))
            store.commit(b, {"prev": prev, "tokens": {str(p): t for p, t in tokens.items()}}, files)
            prev = b
        return sum(per_event) / len(per_event)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    """Alternate cross0 and uniform; print CPU per event and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per", type=int, default=30_000, help="events per partition and batch")
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-history", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--audit-every", type=int, default=1000)
    parser.add_argument(
        "--patterns",
        default="cross0,uniform",
        help="of cross0, uniform, zipf (skew 0.8), zipf12, audits",
    )
    args = parser.parse_args()
    q._forwarded_phase1 = one_task  # type: ignore[assignment]
    means: dict[str, list[float]] = {p: [] for p in args.patterns.split(",")}
    samplers = {p: Sampler() for p in means} if args.profile else {}
    for _ in range(args.rounds):
        for pattern in means:
            means[pattern].append(run(pattern, args, samplers.get(pattern)))
            print(f"{pattern}: {means[pattern][-1]:.2f} us/event", flush=True)
    best = {p: min(m) for p, m in means.items()}
    first = next(iter(best))
    for p, b in best.items():
        print(f"best {p}: {b:.2f} us/event, {b / best[first]:.2f}x of {first}")
    if samplers:
        # Samples per function, scaled to us per event: where uniform's extra CPU goes.
        scale = {p: means[p][-1] / max(1, sum(s.functions.values())) for p, s in samplers.items()}
        a, b = list(samplers)[:2]
        keys = set(samplers[a].functions) | set(samplers[b].functions)
        rows = []
        for key in keys:
            c0 = samplers[a].functions[key] * scale[a]
            un = samplers[b].functions[key] * scale[b]
            rows.append((un - c0, c0, un, key))
        print(f"\nus/event by function: {a}, {b}, difference")
        for diff, c0, un, (f, fn) in sorted(rows, reverse=True)[:30]:
            print(f"{c0:6.2f} {un:6.2f} {diff:+6.2f}  {f}:{fn}")
        print(f"\nus/event by line of forward/*.py, {b}")
        lines = samplers[b].lines
        for (f, ln, fn), n in lines.most_common(400):
            if f.startswith("forward/") and n * scale[b] >= 0.08:
                print(f"{n * scale[b]:6.2f}  {f}:{ln} {fn}")


if __name__ == "__main__":
    main()
