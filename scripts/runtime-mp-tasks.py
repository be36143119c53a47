"""Phase 1 with forwarding in two processes over real sockets: where a second task's time goes.

The Streaming Ledger's batches (as ``runtime-mp-cpu.py`` builds them) run once
with both partitions in one process (``one``: messages in memory, the CPU
that the crossing path costs) and once in two forked processes, one partition
each, exchanging messages through :class:`~txstream.spark.runtime.transport.
SocketTransport` over loopback (``two``: as two ``local[2]`` tasks do, without
Spark).  Per task it prints CPU (user and system) and wall seconds of the
scheduler's run (the batch's transactions, not loading or saving the state),
the time and number of times the task blocked for a message with nothing to
run, admission rounds, messages, frames and bytes, the transport's CPU by
method; and the ideal (``one``'s CPU over two) against the slower task's wall time.
Runs alternate ``one`` and ``two`` (and the patterns) so that a loaded host
shifts both alike.

    PYTHONPATH=src .venv/bin/python scripts/runtime-mp-tasks.py [--batches 4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from txstream.spark.runtime import tasks
from txstream.spark.runtime.forward import new_exchange
from txstream.spark.runtime.forward import partition as forward_partition
from txstream.spark.runtime.forward import scheduler as forward_scheduler
from txstream.spark.runtime.transport import SocketTransport

_path = Path(__file__).with_name("runtime-mp-cpu.py")
_spec = importlib.util.spec_from_file_location("mp_cpu", _path)
assert _spec is not None and _spec.loader is not None
mp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mp)

PROFILE: Any = None
"""With ``--profile``: a sampler (``runtime-mp-cpu.py``'s) of the scheduler's run."""

MEASURES: list[dict[str, Any]] = []
"""Per batch (after the first): the tasks' measures."""


def _measured(job: Any, ctx: Any, events: Any, transport: Any = None, task_of: Any = None) -> Any:
    """``phase1_forward`` with its scheduler's counters, CPU and wall time kept."""
    seen: list[Any] = []
    run = forward_scheduler.ForwardScheduler.run

    def kept(self: Any) -> Any:
        seen.append(self)
        if PROFILE is not None and ctx.batch > 0:
            PROFILE.on()
        times, wall = os.times(), time.monotonic()
        try:
            return run(self)
        finally:
            after = os.times()
            if PROFILE is not None:
                PROFILE.off()
            self.measured = (
                after.user - times.user,
                after.system - times.system,
                time.monotonic() - wall,
            )

    forward_scheduler.ForwardScheduler.run = kept  # type: ignore[method-assign]
    # Global reads a partition admitted past (a checkout without it: 0).
    read_past = getattr(forward_partition._Partition, "_read_past", None)
    past = [0]

    def counted(self: Any, item: Any) -> bool:
        admitted: bool = read_past(self, item)  # type: ignore[misc]
        past[0] += admitted
        return admitted

    if read_past is not None:
        forward_partition._Partition._read_past = counted  # type: ignore[attr-defined]
    try:
        out = tasks.phase1_forward(job, ctx, events, transport, task_of, announce=True)
    finally:
        forward_scheduler.ForwardScheduler.run = run  # type: ignore[method-assign]
        if read_past is not None:
            forward_partition._Partition._read_past = read_past  # type: ignore[attr-defined]
    sched = seen[0]
    user, system, wall = sched.measured
    stats = [r["stats"] for r in out.values()]
    measure = {
        "cpu": user + system,
        "sys": system,
        "wall": wall,
        "waited": sched.waited,
        "waits": sched.waits,
        "rounds": sched.rounds,
        "messages": sum(s["messages"] for s in stats),
        "forwarded": sum(s["forwarded"] for s in stats),
        "frames": transport.frames_sent if transport else 0,
        "reads past": past[0],
        "bytes": transport.bytes_sent if transport else 0,
    }
    if PROFILE is not None and ctx.batch > 0:
        measure["profile"] = dict(PROFILE.functions)
        PROFILE.functions.clear()
    return out, measure


TIMED = ("_frame", "_write", "_select", "_unpack")
"""SocketTransport methods whose CPU and calls the two-task run counts."""


def _timed_transport() -> dict[str, list[float]]:
    """Wrap :data:`TIMED` of SocketTransport (in a forked task): name -> [cpu s, calls]."""
    spent: dict[str, list[float]] = {name: [0.0, 0] for name in TIMED}
    for name in TIMED:
        method = getattr(SocketTransport, name)

        def timed(*args: Any, _m: Any = method, _t: list[float] = spent[name]) -> Any:
            began = time.thread_time()
            try:
                return _m(*args)
            finally:
                _t[0] += time.thread_time() - began
                _t[1] += 1

        setattr(SocketTransport, name, timed)
    return spent


def one_task(job: Any, ctx: Any, partitions: int, events: Any) -> Any:
    """Every partition in this process (no transport)."""
    out, measure = _measured(job, ctx, events)
    if ctx.batch > 0:
        MEASURES.append({"tasks": [measure]})
    return out


def two_tasks(job: Any, ctx: Any, partitions: int, events: Any) -> Any:
    """Task ``q`` of two, forked, hosts partitions ``q, q + 2, ...``; results come back piped."""
    exchange = new_exchange(2)
    folder = Path(tempfile.mkdtemp(prefix="mp-rdv-"))
    children = []
    for q in range(2):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            code = 0
            try:
                spent = _timed_transport()
                transport = SocketTransport(q, 2, folder, exchange["secret"], "127.0.0.1")
                mine = {p: evs for p, evs in events.items() if p % 2 == q}
                result = _measured(job, ctx, mine, transport, lambda p: p % 2)
                for name, (cpu, calls) in spent.items():
                    result[1][f"{name} cpu"] = cpu
                    result[1][f"{name} calls"] = calls
                transport.close()
                data = pickle.dumps(result)
            except BaseException as exc:  # (reported by the parent)
                data, code = pickle.dumps(exc), 1
            with os.fdopen(write, "wb") as f:
                f.write(data)
            os._exit(code)
        os.close(write)
        children.append((pid, read))
    results: dict[int, Any] = {}
    measures = []
    for pid, read in children:
        with os.fdopen(read, "rb") as f:
            got = pickle.loads(f.read())
        os.waitpid(pid, 0)
        if isinstance(got, BaseException):
            raise got
        out, measure = got
        results.update(out)
        measures.append(measure)
    shutil.rmtree(folder, ignore_errors=True)
    if ctx.batch > 0:
        MEASURES.append({"tasks": measures})
    return results


def summary(label: str, events: int) -> dict[str, float]:
    """Print and return the mean measures of the batches run since the last call."""
    rows = MEASURES[:]
    MEASURES.clear()
    n = len(rows)
    ntasks = len(rows[0]["tasks"])
    out: dict[str, float] = {}
    for k in range(ntasks):
        profile: collections.Counter[Any] = collections.Counter()
        for r in rows:
            profile.update(r["tasks"][k].pop("profile", {}))
        if profile:
            total = sum(profile.values())
            cpu = sum(r["tasks"][k]["cpu"] for r in rows) / n
            print(f"  {label} task {k} profile (us/event):")
            for (f, fn), c in profile.most_common(25):
                print(f"    {1e6 * cpu * c / total / events:6.2f}  {f}:{fn}")
        t = {key: sum(r["tasks"][k][key] for r in rows) / n for key in rows[0]["tasks"][k]}
        out.update({f"{key}{k}": v for key, v in t.items()})
        print(
            f"  {label} task {k}: cpu {1e6 * t['cpu'] / events:6.2f} us/event "
            f"(sys {1e6 * t['sys'] / events:5.2f}), "
            f"wall {1e6 * t['wall'] / events:6.2f}, blocked {1e6 * t['waited'] / events:5.2f} "
            f"in {t['waits']:.0f} waits, {t['rounds']:.0f} rounds, {t['messages']:.0f} msgs, "
            f"{t['frames']:.0f} frames, {t['bytes'] / 1e6:.2f} MB, "
            f"{t['reads past']:.0f} reads admitted past",
            flush=True,
        )
        timed = [
            f"{name} {1e6 * t[name + ' cpu'] / events:.2f} us/event in {t[name + ' calls']:.0f}"
            for name in TIMED
            if name + " cpu" in t
        ]
        if timed:
            print("    transport: " + ", ".join(timed), flush=True)
    out["wall"] = max(out[f"wall{k}"] for k in range(ntasks))
    out["cpu"] = sum(out[f"cpu{k}"] for k in range(ntasks))
    return out


def main() -> None:
    """Alternate one and two tasks for each pattern; print the measures and the efficiency."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per", type=int, default=30_000, help="events per partition and batch")
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--patterns", default="cross0,uniform")
    parser.add_argument("--variants", default="one,two", help="of one, two")
    parser.add_argument("--profile", action="store_true", help="sample where the CPU goes")
    args = parser.parse_args()
    if args.profile:
        global PROFILE
        PROFILE = mp.Sampler()
        PROFILE.off()
    args.no_history = False
    args.audit_every = 1000
    events = args.per * mp.P
    for r in range(args.rounds):
        for pattern in args.patterns.split(","):
            got = {}
            for label, fn in (("one", one_task), ("two", two_tasks)):
                if label not in args.variants.split(","):
                    continue
                mp.q._forwarded_phase1 = fn
                mp.run(pattern, args, None)
                got[label] = summary(f"{pattern} {label}", events)
            if len(got) < 2:
                continue
            ideal = got["one"]["cpu"] / 2
            print(
                f"round {r} {pattern}: one-task cpu "
                f"{1e6 * got['one']['cpu'] / events:.2f} us/event;"
                f" two tasks: cpu {1e6 * got['two']['cpu'] / events:.2f} (sum), slower task's wall "
                f"{1e6 * got['two']['wall'] / events:.2f}; efficiency (one's cpu / 2) / wall "
                f"{ideal / got['two']['wall']:.2f}",
                flush=True,
            )
    sys.exit(0)


if __name__ == "__main__":
    main()
