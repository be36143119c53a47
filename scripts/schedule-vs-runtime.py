"""The schedule model's rule for global reads against the runtime's partitions, same input.

``txstream.bench.schedule`` says, per partition and global read, whether the
read's part is taken at once (nothing before it unfinished there), admitted
past (later transactions go on while the earlier ones finish) or a barrier (an
earlier read there still waits: admission stops).  This runs the same batches
(the Streaming Ledger, uniform transfers, an audit every ``--audit-every``
events) through the runtime's real partition logic (``forward.partition._Partition``,
every partition in one process, messages in memory: ``runtime-mp-cpu.py``'s
harness, its admission rounds of 128) and counts the same three outcomes where
``_Partition._enter`` meets a read, then prints both, the crossing
transactions' parts lent ahead of admission (``_Partition.lend_ahead``, from
``LEND_FROM`` partitions on) and the transactions handed to their other
participant (``_Partition._hand_over``, ``forward.announce.handed``) both ways, and
the model's serial share, per P.
``--two-tasks``: the partitions in two forked tasks over
sockets instead (``runtime-mp-tasks.py``'s harness, as two ``local[2]`` tasks
host them), where a round trip takes a round or more.

    PYTHONPATH=src .venv/bin/python scripts/schedule-vs-runtime.py [--two-tasks] [--events 36000]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import shutil
import tempfile
from pathlib import Path
from typing import Any

from txstream.bench.ledger import events
from txstream.bench.schedule import count, keys_of, rehome
from txstream.spark.runtime.forward import base as forward_base
from txstream.spark.runtime.forward import partition as forward_partition
from txstream.spark.runtime.forward import scheduler as forward_scheduler
from txstream.spark.runtime.partitioning import partition_of

_path = Path(__file__).with_name("runtime-mp-cpu.py")
_spec = importlib.util.spec_from_file_location("mp_cpu", _path)
assert _spec is not None and _spec.loader is not None
mp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mp)
_spec = importlib.util.spec_from_file_location("mp_tasks", _path.with_name("runtime-mp-tasks.py"))
assert _spec is not None and _spec.loader is not None
tasks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tasks)


def runtime_reads(
    partitions: int, per: int, batches: int, every: int, homes: list[list[int]], two: bool
) -> collections.Counter[str]:
    """Run the batches through the runtime's partitions; how each read's part was admitted.

    Also ``serial`` and ``events`` (in one process only): the serial share's
    count on the runtime's admission rounds (a round: from one exchange of
    messages to the next, the partitions' admitting and running between them):
    the events the partitions ran in rounds in which a partition with events of
    its own still to run (``homes``: per batch, each transaction's home) ran none.
    ``two``: in two forked tasks over sockets instead (``runtime-mp-tasks.py``),
    which report each read part through a file.
    """
    seen: collections.Counter[str] = collections.Counter()
    log = Path(tempfile.mkdtemp(prefix="reads-")) / "parts"
    log.write_text("")
    enter, lend = forward_partition._Partition._enter, forward_partition._Partition.lend_ahead
    hand = forward_partition._Partition.handed_here
    run, pump = forward_scheduler.ForwardScheduler.run, forward_scheduler.ForwardScheduler._pump
    state: dict[str, Any] = {}

    def ran(sched: Any) -> list[int]:
        return [sched.hosted[p].outcome.committed + sched.hosted[p].outcome.aborted
                for p in range(partitions)]  # fmt: skip

    def counted_run(sched: Any) -> Any:
        left = collections.Counter(homes[sched.batch])
        state.update(left=[left[p] for p in range(partitions)], before=ran(sched))
        return run(sched)

    def counted_pump(sched: Any, block: bool) -> bool:
        got = pump(sched, block)
        now = ran(sched)
        did = [a - b for a, b in zip(now, state["before"], strict=True)]
        left = state["left"]
        if any(d == 0 and n > 0 for d, n in zip(did, left, strict=True)):
            seen["serial"] += sum(did)
        seen["events"] += sum(did)
        state.update(left=[n - d for n, d in zip(left, did, strict=True)], before=now)
        return got

    def note(kind: str) -> None:
        with log.open("a") as f:  # (one short append per part: the forked tasks' lines stay whole)
            f.write(kind + "\n")

    def counted(self: Any, item: Any) -> None:
        if item.barrier and item.kind is not forward_base.FRAGMENT:
            if self.barrier is not None:
                note("behind")
            elif self.inflight == 0:
                note("at once")
            else:
                enter(self, item)
                note("past" if self.readings and self.readings[-1] is item else "barrier")
                return
        enter(self, item)

    def counted_lend(self: Any) -> None:
        before = self.unfinished  # (each transaction lent enters: one more unfinished)
        lend(self)
        if self.unfinished > before:
            note(f"lent {self.unfinished - before}")

    def counted_hand(self: Any, src: int, got: list[Any]) -> None:
        note(f"handed {len(got)}")
        hand(self, src, got)

    harness = tasks.mp if two else mp
    harness.P = partitions
    harness.q._forwarded_phase1 = tasks.two_tasks if two else mp.one_task
    forward_partition._Partition._enter = counted  # type: ignore[method-assign]
    forward_partition._Partition.lend_ahead = counted_lend  # type: ignore[method-assign]
    forward_partition._Partition.handed_here = counted_hand  # type: ignore[method-assign]
    if not two:  # (a forked task hosts some partitions only, and its counts stay there)
        forward_scheduler.ForwardScheduler.run = counted_run  # type: ignore[method-assign]
        forward_scheduler.ForwardScheduler._pump = counted_pump  # type: ignore[method-assign]
    try:
        args = argparse.Namespace(per=per, batches=batches, no_history=True, audit_every=every)
        harness.run("audits" if every else "uniform", args, None)
    finally:
        forward_partition._Partition._enter = enter  # type: ignore[method-assign]
        forward_partition._Partition.lend_ahead = lend  # type: ignore[method-assign]
        forward_partition._Partition.handed_here = hand  # type: ignore[method-assign]
        forward_scheduler.ForwardScheduler.run = run  # type: ignore[method-assign]
        forward_scheduler.ForwardScheduler._pump = pump  # type: ignore[method-assign]
        tasks.MEASURES.clear()
    for line in log.read_text().splitlines():
        if line.startswith("lent "):
            seen["lent"] += int(line[5:])
        elif line.startswith("handed "):
            seen["handed"] += int(line[7:])
        else:
            seen[line] += 1
    shutil.rmtree(log.parent, ignore_errors=True)
    return seen


def main() -> None:
    """Per input and P: read parts at once / past / barriers, and the serial share, both ways."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=36_000, help="events per batch")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--audit-every", type=int, default=1000)
    parser.add_argument("--partitions", default="2,8,32")
    parser.add_argument(
        "--two-tasks", action="store_true", help="two forked tasks over sockets (no rounds' share)"
    )
    args = parser.parse_args()
    print("| input | P | runtime: at once / past / barrier | model | lent ahead: runtime | model | "
          "handed: runtime | model | serial share: runtime's rounds | model |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    kinds = ("at once", "past", "barrier")
    for every in (0, args.audit_every):
        for p in (int(x) for x in args.partitions.split(",")):
            per = args.events // p
            size = per * p
            stream = events(size * args.batches, mp.ACCOUNTS, 0, 1, pattern="uniform",
                            audit_every=every)  # fmt: skip
            txns = keys_of(stream)
            batches = [txns[b * size : (b + 1) * size] for b in range(args.batches)]
            homes = [[partition_of(t[0], p) if t else 0 for t in b] for b in batches]
            for batch, its in zip(batches, homes, strict=True):
                rehome(batch, its, p)  # (the homes partitions hand transactions to)
            real = runtime_reads(p, per, args.batches, every, homes, args.two_tasks)
            model: collections.Counter[str] = collections.Counter()
            for batch in batches:
                found = count(batch, p)
                model.update({"at once": found.at_once, "past": found.past,
                              "barrier": found.barriers, "serial": found.serial,
                              "lent": found.lent, "handed": found.handed})  # fmt: skip
            cells = [" / ".join(str(c[k]) for k in kinds) for c in (real, model)]
            if real["behind"]:
                cells[0] += f" ({real['behind']} behind a barrier)"
            label = f"an audit every {every:,}" if every else "uniform"
            rounds = f"{100 * real['serial'] / real['events']:.1f}%" if real["events"] else "-"
            print(f"| {label} | {p} | {cells[0]} | {cells[1]} | "
                  f"{real['lent']:,} | {model['lent']:,} | "
                  f"{real['handed']:,} | {model['handed']:,} | {rounds} | "
                  f"{100 * model['serial'] / len(txns):.1f}% |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
