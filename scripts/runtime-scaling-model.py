"""A throughput model of the executor runtime on N cores, checked against local[1] and local[2].

The Streaming Ledger (100,000 accounts, 30% deposits) runs on 2 partitions,
once on ``local[1]`` (one core: both partitions in one task, messages in
memory) and once on ``local[2]``, with transfers inside a partition only
(``cross 0``) and between any two accounts (``uniform``), under availableNow
over the same files (4 micro-batches).  The model:

    batch time T(N) = F + n * c(N) / (N * (1 - s(N)))
    c(N)            = c_local + x(N) * c_mp

``F`` is a micro-batch's fixed cost (driver, planning, commit), measured on a
run of tiny batches; ``c_local`` (core time per event without multi-partition
transactions) and ``c_mp`` (extra core time per multi-partition transaction)
are fitted on ``local[1]`` alone; ``x(N)`` is the share of events that are
multi-partition transactions on N partitions (uniform: transfers times
1 - 1/N) and ``s(N)`` the counted serial share (``txstream.bench.schedule``).
The prediction for ``local[2]`` is then compared with its measurement, and
N = 4 .. 32 are predicted (one partition per core).

The structure above gives the tasks the whole machine, but the driver and
Spark's JVM (reading the input, the shuffle, Arrow, the garbage collector)
work beside them: ``local[1]`` keeps more than one core busy.  So the run
also counts the CPU of the whole process tree per workload (``/proc``: the
Python workers, the JVM and the driver), and the model's second form bounds a
batch by the machine's ``M`` cores as well:

    T(N) = max(F + n * c(N) / (N * (1 - s(N))), n * q(N) / M)
    q(N) = q_local + x(N) * q_mp

``q_local`` and ``q_mp``: the process tree's CPU per event and per crossing
transaction, fitted on ``local[1]`` like ``c_local`` and ``c_mp`` (CPU time,
which a loaded host disturbs far less than the wall time ``c`` comes from).

    PYTHONPATH=src .venv/bin/python scripts/runtime-scaling-model.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from txstream.bench.ledger import events
from txstream.bench.schedule import keys_of, serial_share

FILES = 4
DEPOSITS = 0.30


def write_input(folder: Path, stream: list[Any], files: int) -> None:
    """The stream as ``files`` JSON files per input (file n of each input: the same ids)."""
    size = -(-len(stream) // files)
    for name in ("deposits", "transfers"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    for n in range(files):
        part = stream[n * size : (n + 1) * size]
        for name in ("deposits", "transfers"):
            lines = "".join(json.dumps(e) + "\n" for kind, e in part if kind == name)
            (folder / name / f"part-{n:04d}.json").write_text(lines)


def tree_cpu() -> dict[str, float]:
    """CPU seconds of this process and its descendants: Spark's Python workers, the rest.

    Read from ``/proc`` (Linux): each live process's own time and that of its
    children it reaped (pyspark's daemon reaps the workers it forked).
    """
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    spent: dict[int, float] = {}
    worker: dict[int, bool] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:  # (gone meanwhile)
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry)
        parent[pid] = int(fields[1])
        spent[pid] = sum(int(f) for f in fields[11:15]) / tick
        worker[pid] = b"pyspark.daemon" in cmd or b"pyspark.worker" in cmd
    me = os.getpid()
    out = {"workers": 0.0, "jvm and driver": 0.0}
    for pid in spent:
        p = pid
        while p not in (me, 0, 1) and p in parent:
            p = parent[p]
        if p == me:
            out["workers" if worker[pid] else "jvm and driver"] += spent[pid]
    return out


def run_master(master: str, n: int) -> dict[str, Any]:
    """In a child process: every workload on ``master``; per-batch seconds (warm batches)."""
    from txstream.bench.ledger import ledger_job
    from txstream.spark import local_session

    spark = local_session("scaling-model", master=master)
    out: dict[str, Any] = {}
    root = Path(tempfile.mkdtemp(prefix="scaling-"))
    try:
        workloads = (
            ("tiny", 0, 400, "forward"),
            ("cross 0", 0, n, "forward"),
            ("uniform", 50, n, "forward"),
            ("uniform defer", 50, n, "defer"),
        )
        for label, cross, count, mode in workloads:
            stream = list(events(count, 100_000, cross, seed=7))
            for rep in range(2):  # the first warms the session up; the second counts
                folder = root / f"{label}-{rep}"
                write_input(folder / "in", stream, FILES)
                schemas = {
                    "deposits": "acct long, amount long, id long",
                    "transfers": "src long, dst long, amount long, id long",
                }
                streams = [
                    spark.readStream.schema(schemas[name])
                    .option("maxFilesPerTrigger", 1)
                    .json(str(folder / "in" / name))
                    for name in ("deposits", "transfers")
                ]
                job = ledger_job(*streams).option("merge", "batch")
                job.option("crossPartition", mode)
                query = job.trigger(availableNow=True).start(
                    folder / "ckpt", spark=spark, partitions=2
                )
                began = tree_cpu()
                try:
                    query.awaitTermination()
                finally:
                    query.stop()
                ended = tree_cpu()
                batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
                out[label] = {
                    "seconds": [p["durationMs"] / 1000 for p in batches],
                    "events": [p["numInputRows"] for p in batches],
                    "cpu": {k: ended[k] - began[k] for k in began},
                }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def measure(master: str, n: int) -> dict[str, Any]:
    """Run :func:`run_master` in a child process (one Spark application per master)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    cmd = [sys.executable, __file__, "--child", master, "--events", str(n)]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("{")]
    if result.returncode != 0 or not lines:
        raise SystemExit(f"{master}: {result.stderr.strip().splitlines()[-1:]}")
    data: dict[str, Any] = json.loads(lines[-1])
    return data


def per_batch(data: dict[str, Any], label: str) -> tuple[float, float]:
    """Mean seconds and events of a workload's batches."""
    seconds, counts = data[label]["seconds"], data[label]["events"]
    return sum(seconds) / len(seconds), sum(counts) / len(counts)


def main() -> None:
    """Measure local[1] and local[2], fit on local[1], predict local[2] and more cores."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=120_000)
    parser.add_argument("--child", default=None)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_master(args.child, args.events)))
        return
    one, two = measure("local[1]", args.events), measure("local[2]", args.events)
    fixed = per_batch(one, "tiny")[0]
    t_local, n = per_batch(one, "cross 0")
    t_uniform, _ = per_batch(one, "uniform")
    c_local = (t_local - fixed) / n
    transfers = 1 - DEPOSITS

    def mp_share(parts: int) -> float:
        return transfers * (1 - 1 / parts)

    c_mp = (t_uniform - fixed - n * c_local) / (n * mp_share(2))
    stream = list(events(72_000, 100_000, 50, seed=7))
    print(f"F = {fixed * 1000:.0f} ms per batch; c_local = {c_local * 1e6:.1f} us per event; ")
    print(f"c_mp = {c_mp * 1e6:.1f} us per multi-partition transaction (fitted on local[1])")

    def tree(data: dict[str, Any], label: str) -> float:
        """The process tree's CPU seconds per event of a workload."""
        return sum(data[label]["cpu"].values()) / sum(data[label]["events"])

    q_local = tree(one, "cross 0")
    q_mp = (tree(one, "uniform") - q_local) / mp_share(2)
    machine = os.cpu_count() or 1
    print(f"q_local = {q_local * 1e6:.1f} us of CPU per event (all processes; "
          f"{q_local / (t_local / n):.2f} cores busy on local[1]), q_mp = {q_mp * 1e6:.1f} us "
          f"per multi-partition transaction; M = {machine} cores")  # fmt: skip
    print()
    print("| CPU s per 1,000 events (process tree) | workload | Python workers | JVM and driver |")
    print("|---|---|---|---|")
    for master, data in (("local[1]", one), ("local[2]", two)):
        for label in ("cross 0", "uniform"):
            got, count = data[label]["cpu"], sum(data[label]["events"])
            print(f"| {master} | {label} | {1000 * got['workers'] / count:.3f} | "
                  f"{1000 * got['jvm and driver'] / count:.3f} |")  # fmt: skip

    def batch_time(count: float, cores: int, x: float, share: float, machine: int = 0) -> float:
        """The model's batch time; ``machine``: its cores (0: the tasks' form, no bound)."""
        tasks = count * (c_local + x * c_mp) / (cores * (1 - share))
        if not machine:
            return fixed + tasks
        # (q holds the batch's fixed CPU too: the bound is the batch's CPU over the cores)
        return max(fixed + tasks, count * (q_local + x * q_mp) / machine)

    print()
    print("| workload | local[2] txn/s | predicted | error | with the JVM's cores | error |")
    print("|---|---|---|---|---|---|")
    for label, x in (("cross 0", 0.0), ("uniform", mp_share(2))):
        seconds, count = per_batch(two, label)
        share = serial_share(keys_of(stream), 2) if x else 0.0
        cells = []
        for bound in (0, machine):
            predicted = batch_time(count, 2, x, share, bound)
            cells.append(f"{count / predicted:,.0f} | {seconds / predicted - 1:+.0%}")
        print(f"| {label} | {count / seconds:,.0f} | {' | '.join(cells)} |")
    print()
    print("| measured txn/s (4 batches) | cross 0 | uniform | uniform, defer |")
    print("|---|---|---|---|")
    for master, data in (("local[1]", one), ("local[2]", two)):
        rates = []
        for label in ("cross 0", "uniform", "uniform defer"):
            seconds, count = per_batch(data, label)
            rates.append(f"{count / seconds:,.0f}")
        print(f"| {master} | {' | '.join(rates)} |")
    print()
    print("| cores = partitions = M | serial share (uniform) | predicted uniform txn/s | cross 0 "
          "| with the JVM's cores: uniform | cross 0 |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for cores in (1, 2, 4, 8, 16, 32):
        share = serial_share(keys_of(stream), cores) if cores > 1 else 0.0
        x = mp_share(cores) if cores > 1 else 0.0
        rates = [
            n / batch_time(n, cores, xs, ss, bound)
            for bound in (0, cores)
            for xs, ss in ((x, share), (0.0, 0.0))
        ]
        print(f"| {cores} | {share:.1%} | " + " | ".join(f"{r:,.0f}" for r in rates) + " |")


if __name__ == "__main__":
    main()
