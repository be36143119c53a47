"""Where `bench cq-spark`'s CPU goes: the driver's Python process against the JVM and workers.

Runs the experiment's point (r = 5, slide 2, a 10,000-row table, two updater
threads at ``--rate`` transactions per second, ``--events`` in micro-batches
of 10,000) once per mode and repetition, the modes interleaved in one Spark
session (after the benchmark's own untimed warm-up), and reads the CPU time of
each process from ``/proc`` from each query's start (after the benchmark
loaded its table) to its end:

* ``driver``: this Python process (txstream's pins and decisions, py4j, the
  updater threads, each query's set-up: loading the table, checking it);
  ``in batches``: the CPU of the threads while they ran txstream's per-batch
  work (``_Runner.handle``, its py4j calls included);
* ``jvm+workers``: every process below it (on ``local[2]`` the one JVM, which
  runs Spark's driver and its executors, and any Python workers; with
  ``--master local-cluster[2,1,1024]`` the driver JVM and the two executor
  JVMs, given apart).

Per mode it prints the medians over the repetitions of windows per second,
the ratio to ``plain`` in the same repetition, the consistent share, and the
CPU microseconds per event of each side and their ratio.

    PYTHONPATH=src .venv/bin/python scripts/cq-spark-cpu.py [--reps 3] [--events 100000]
        [--rate 1] [--modes plain,snapshot,s2pl,optimistic] [--master local-cluster[2,1,1024]]
        [--profile 30]

``--profile N`` also runs cProfile in the batches' threads and prints, per
mode, the N functions with the most own time there (summed over the
repetitions; the profiler slows the driver, so read its ratios, not its
totals, and leave it off for the CPU table).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import tempfile
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, float, float]]:
    """Per process id: (parent, own CPU seconds, CPU seconds of its reaped children)."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        own = (int(fields[11]) + int(fields[12])) / TICK
        reaped = (int(fields[13]) + int(fields[14])) / TICK
        out[int(name)] = (int(fields[1]), own, reaped)
    return out


def cpu() -> dict[str, float]:
    """CPU seconds so far: this process, its child JVM, and the processes below that JVM."""
    procs = _processes()
    me = os.getpid()
    t = os.times()
    got = {"driver": t.user + t.system, "jvm": 0.0, "below": 0.0}
    kids: dict[int, list[int]] = {}
    for pid, (parent, _, _) in procs.items():
        kids.setdefault(parent, []).append(pid)
    for jvm in kids.get(me, []):
        got["jvm"] += procs[jvm][1] + procs[jvm][2]
        todo = list(kids.get(jvm, []))
        while todo:
            pid = todo.pop()
            got["below"] += procs[pid][1] + procs[pid][2]
            todo += kids.get(pid, [])
    return got


def main() -> None:
    """Run the points and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--modes", default="plain,snapshot,s2pl,optimistic")
    ap.add_argument("--master", default=None)
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    args = ap.parse_args()
    if args.master:
        os.environ["PYSPARK_SUBMIT_ARGS"] = f"--master {args.master} pyspark-shell"
    import time

    from txstream.bench import cq_spark
    from txstream.jobs import cq as cq_job

    in_batches = [0.0]  # CPU of the threads running txstream's per-batch work
    handle = cq_job._Runner.handle
    profiles: dict[str, cProfile.Profile] = {}

    def timed(self: Any, b: Any) -> None:
        prof = (
            profiles.setdefault(self.cq.strategy, cProfile.Profile(time.thread_time))
            if args.profile
            else None
        )
        start = time.thread_time()
        if prof is not None:
            prof.enable()
        try:
            handle(self, b)
        finally:
            if prof is not None:
                prof.disable()
            in_batches[0] += time.thread_time() - start

    cq_job._Runner.handle = timed  # type: ignore[method-assign]
    started: list[dict[str, float]] = []  # CPU when the query starts (after the table's load)
    start = cq_job.SparkCQ.start

    def starting(self: Any, *a: Any, **kw: Any) -> Any:
        started.append(cpu())
        return start(self, *a, **kw)

    cq_job.SparkCQ.start = starting  # type: ignore[method-assign]

    modes = args.modes.split(",")
    out = tempfile.mkdtemp(prefix="cq-spark-cpu-")
    point = {
        "update_rate": args.rate,
        "window_range": 5,
        "events": args.events,
        "batch": 10_000,
        "seconds": 600.0,
        "_out": out,
    }
    # untimed: the session's start and the benchmark's warm-up (its first call runs it)
    cq_spark.measure({**point, "mode": "plain", "update_rate": 0}, seed=0)
    rows: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for rep in range(args.reps):
        for mode in modes:
            batches = in_batches[0]
            got = cq_spark.measure({**point, "mode": mode}, seed=rep + 1)
            after, before = cpu(), started[-1]
            used = {k: after[k] - before[k] for k in after}
            used["batches"] = in_batches[0] - batches
            rows[mode].append({**got, **used, "rep": rep})
            print(
                f"rep {rep} {mode}: {got['results_per_s']:,.0f} windows/s, "
                f"consistent {got['consistent_ratio']}, driver {used['driver']:.2f} s "
                f"(in the batches' threads {used['batches']:.2f} s), "
                f"jvm {used['jvm']:.2f} s, below the jvm {used['below']:.2f} s",
                flush=True,
            )
    n = args.events
    print(f"\nmedians over {args.reps} repetitions, {n:,} events, {args.rate:g} updates/s")
    print(
        "| mode | windows/s | vs plain | consistent | driver µs/event | jvm+workers µs/event "
        "| driver / (jvm+workers) |"
    )
    print("|---|---|---|---|---|---|---|")
    for mode in modes:
        got = rows[mode]
        ratio = (
            [
                g["results_per_s"] / p["results_per_s"]
                for g, p in zip(got, rows["plain"], strict=True)
            ]
            if "plain" in rows
            else []
        )
        rest = [g["jvm"] + g["below"] for g in got]
        print(
            f"| {mode} | {statistics.median(g['results_per_s'] for g in got):,.0f} | "
            f"{f'{statistics.median(ratio):.2f}x' if ratio else '-'} | "
            f"{min(g['consistent_ratio'] or 0 for g in got):.4f} | "
            f"{statistics.median(g['driver'] for g in got) / n * 1e6:.1f} | "
            f"{statistics.median(rest) / n * 1e6:.1f} | "
            f"{statistics.median(g['driver'] / r for g, r in zip(got, rest, strict=True)):.3f} "
            f"({statistics.median(g['batches'] / r for g, r in zip(got, rest, strict=True)):.3f}"
            " in batches) |"
        )
    if args.master:
        print(
            "\nwith separate executors: jvm (the driver JVM) and below it (the executors), "
            "µs/event, medians"
        )
        for mode in modes:
            got = rows[mode]
            print(
                f"{mode}: driver JVM {statistics.median(g['jvm'] for g in got) / n * 1e6:.1f}, "
                f"executors {statistics.median(g['below'] for g in got) / n * 1e6:.1f}, "
                f"driver python / executors "
                f"{statistics.median(g['driver'] / g['below'] for g in got):.3f}"
            )

    for mode, prof in profiles.items():
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats("tottime").print_stats(args.profile)
        stats.sort_stats("cumulative").print_stats(args.profile)
        print(f"\nprofile of {mode}'s batches (own CPU time of the thread, all its runs)")
        print(text.getvalue())


if __name__ == "__main__":
    main()
