"""Boundaries by name against a serial oracle written from docs/spark.md.

Random small jobs mix keyed, multi-partition, keyless and ``broadcast`` events
that insert, upsert, update, increment, delete, scan, emit, abort and raise.
The oracle runs the whole stream serially in the declared order (order value,
then input declaration order, then source position), cut into transactions by
the boundary's definition, each transaction applied whole or not at all.
``run_local`` must give the same table, the same outputs exactly once in
order and the same aborts on 1, 2 or 3 partitions, however the inputs are cut
into micro-batches (the event-time merge: each source hands its events over in
order, at its own random points).
"""

from __future__ import annotations

import json
import math
import random
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import txstream as tx
from txstream.model import check
from txstream.spark.runtime.state import RuntimeStore

INPUTS = ("A", "B", "C", "D")
"""A: keyed; B: two keys (multi-partition); C: keyless (the CTI/slice input); D: keyed
with a ``broadcast`` column."""
KEYS = range(6)
SLICE = 2
BOUNDARIES = ["event", "timestamp", "seconds", "punctuation", "timeslice", "batch", "by"]


class Boom(Exception):
    """A transaction function's own failure."""


# -- the job --------------------------------------------------------------------------------


def keyed(t: Any, e: dict[str, Any], k: int) -> None:
    op, n = e["op"], e["n"]
    if op == "ins":
        t.insert("acc", {"k": k, "v": n})
    elif op == "ups":
        t.upsert("acc", {"k": k, "v": n})
    elif op == "del":
        t.delete("acc", k)
    elif op == "inc":
        t.increment("acc", k, "v", n)
    elif op == "upd":
        t.update("acc", k, v=n)
    elif op == "read":
        row = t.read("acc", k)
        t.emit("out", {"id": e["id"], "what": "read", "v": -1 if row is None else row["v"]})
    elif op == "scan":
        t.emit("out", {"id": e["id"], "what": "scan", "v": len(t.scan("acc", k))})
    elif op == "abort":
        t.abort("asked to")
    elif op == "raise":
        raise Boom(f"event {e['id']}")


def everywhere(t: Any, e: dict[str, Any]) -> None:
    """An event that reaches every partition: one fragment per partition."""
    op = e["op"]
    if op == "bump":
        for value in t.values("acc"):
            for row in t.scan("acc", value):
                t.increment("acc", row["k"], "v", 1)
    elif op == "emit" and t.home == 0:
        t.emit("out", {"id": e["id"], "what": "all", "v": 0})
    elif op == "raise" and t.home == 0:
        raise Boom(f"event {e['id']}")
    elif op == "abort":
        t.abort("asked to")


def on_a(t: Any, e: dict[str, Any]) -> None:
    keyed(t, e, e["k"])


def on_b(t: Any, e: dict[str, Any]) -> None:
    if e["op"] == "move":
        src, dst = t.read("acc", e["k"]), t.read("acc", e["k2"])
        ok = src is not None and dst is not None and e["k"] != e["k2"]
        if ok:
            t.increment("acc", e["k"], "v", -e["n"])
            t.increment("acc", e["k2"], "v", e["n"])
        t.emit("out", {"id": e["id"], "what": "move", "v": int(ok)})
    else:
        keyed(t, e, e["k"])
        if e["op"] in ("inc", "ups", "upd"):
            keyed(t, e, e["k2"])


def on_d(t: Any, e: dict[str, Any]) -> None:
    if e["all"]:
        everywhere(t, e)
    else:
        keyed(t, e, e["k"])


def make_job(boundary: str, merge: str) -> tx.Job:
    job = (
        tx.Job("boundaries")
        .table("acc", key="k", schema="k long, v long")
        .input("A", None, keys="k", order="ts")
        .input("B", None, keys=["k", "k2"], order="ts")
        .input("C", None, keys=(), order="ts")
        .input("D", None, keys="k", order="ts", broadcast="all")
        .output("out", schema="id long, what string, v long")
        .on("A", on_a)
        .on("B", on_b)
        .on("C", everywhere)
        .on("D", on_d)
        .option("merge", merge)
        .option("recordHistory", True)
    )
    options: dict[str, dict[str, Any]] = {
        "seconds": {"seconds": SLICE},
        "punctuation": {"of": "C"},
        "timeslice": {"seconds": SLICE, "of": "C"},
        "by": {"group": lambda r: r["ts"] // 3},
    }
    return job.boundary(boundary, **options.get(boundary, {}))


# -- the oracle -----------------------------------------------------------------------------

Item = tuple[str, dict[str, Any]]


def serial_event(table: dict[int, int], name: str, e: dict[str, Any], emits: list[Any]) -> None:
    """One event on ``table`` (the transaction's working copy), as the functions above do."""

    def one(k: int) -> None:
        op, n = e["op"], e["n"]
        if op in ("del", "inc", "upd") and k not in table:
            raise Boom("no row")
        if op == "ins":
            if k in table:
                raise Boom("duplicate")
            table[k] = n
        elif op in ("ups", "upd"):
            table[k] = n
        elif op == "del":
            del table[k]
        elif op == "inc":
            table[k] += n
        elif op == "read":
            emits.append({"id": e["id"], "what": "read", "v": table.get(k, -1)})
        elif op == "scan":
            emits.append({"id": e["id"], "what": "scan", "v": int(k in table)})
        elif op in ("abort", "raise"):
            raise Boom(op)

    def every() -> None:
        if e["op"] == "bump":
            for k in table:
                table[k] += 1
        elif e["op"] == "emit":
            emits.append({"id": e["id"], "what": "all", "v": 0})
        elif e["op"] in ("raise", "abort"):
            raise Boom(e["op"])

    if name == "A" or (name == "D" and not e["all"]):
        one(e["k"])
    elif name == "B" and e["op"] == "move":
        ok = e["k"] in table and e["k2"] in table and e["k"] != e["k2"]
        if ok:
            table[e["k"]] -= e["n"]
            table[e["k2"]] += e["n"]
        emits.append({"id": e["id"], "what": "move", "v": int(ok)})
    elif name == "B":
        one(e["k"])
        if e["op"] in ("inc", "ups", "upd"):
            one(e["k2"])
    else:
        every()


def by_value(items: list[Item], value: Callable[[dict[str, Any]], Any]) -> list[list[Item]]:
    groups: list[list[Item]] = []
    last: Any = object()
    for item in items:
        v = value(item[1])
        if not groups or v != last:
            groups.append([])
            last = v
        groups[-1].append(item)
    return groups


def transactions(
    boundary: str, items: list[Item], clock: list[Any] | None = None
) -> list[list[Item]]:
    """The docs' definitions (Table 3): the stream, in the declared order, cut into transactions.

    A late event of the timeslice input is a transaction of its own, marked
    ``LATE``; ``clock`` holds the newest slice across calls (one per micro-batch).
    """
    clock = [None] if clock is None else clock
    if boundary == "event":
        return [[item] for item in items]
    if boundary == "timestamp":
        return by_value(items, lambda e: e["ts"])
    if boundary == "seconds":
        return by_value(items, lambda e: math.floor(e["ts"] / SLICE))
    if boundary == "by":
        return by_value(items, lambda e: e["ts"] // 3)
    if boundary == "batch":
        return [items] if items else []
    groups: list[list[Item]] = []
    current: list[Item] = []
    if boundary == "punctuation":  # a run of events closed by a CTI
        for item in items:
            current.append(item)
            if item[0] == "C":
                groups.append(current)
                current = []
    else:  # timeslice: a slice of C opens with its first C event; others join the open one
        newest = clock[0]
        for item in items:
            if item[0] == "C":
                slice_ = math.floor(item[1]["ts"] / SLICE)
                if newest is not None and slice_ < newest:
                    groups.append([("LATE", item[1])])
                    continue
                if slice_ != newest and current:
                    groups.append(current)
                    current = []
                newest = slice_
            current.append(item)
        clock[0] = newest
    if current:  # the stream's end closes the last run or slice
        groups.append(current)
    return groups


def serial(
    groups: list[list[Item]], table: dict[int, int] | None = None
) -> tuple[dict[int, int], list[list[dict[str, Any]]], int]:
    """Run ``groups`` one after the other: (table, each committed transaction's rows, aborts)."""
    table = dict(table or {})
    outputs: list[list[dict[str, Any]]] = []
    aborted = 0
    for group in groups:
        work: dict[int, int] = dict(table)
        emits: list[dict[str, Any]] = []
        try:
            for name, e in group:
                if name == "LATE":
                    raise Boom("late")
                serial_event(work, name, e, emits)
        except Boom:
            aborted += 1
            continue
        table = work
        outputs.append(emits)
    return table, outputs, aborted


def declared(per: dict[str, list[dict[str, Any]]]) -> list[Item]:
    """Every source's events merged by (order value, input declaration, source position)."""
    flat = [(e["ts"], INPUTS.index(n), i, n, e) for n in INPUTS for i, e in enumerate(per[n])]
    flat.sort(key=lambda x: x[:3])
    return [(x[3], x[4]) for x in flat]


# -- random streams -------------------------------------------------------------------------

OPS_KEYED = ["ins", "ins", "ups", "del", "inc", "inc", "upd", "read", "scan", "abort", "raise"]
OPS_MULTI = ["move", "move", "move", "inc", "ups", "read", "raise", "abort"]
OPS_ALL = ["bump", "emit", "emit", "raise", "abort", "cti", "cti"]


def streams(rng: random.Random, n: int, span: int) -> dict[str, list[dict[str, Any]]]:
    """``n`` random events over ``span`` seconds; each source's in order of time."""
    per: dict[str, list[dict[str, Any]]] = {name: [] for name in INPUTS}
    for i in range(n):
        name = rng.choice("AAAABBCD")
        e: dict[str, Any] = {"id": i, "ts": rng.randrange(span)}
        if name == "A" or (name == "D" and rng.random() < 0.7):
            e.update(k=rng.choice(KEYS), op=rng.choice(OPS_KEYED), n=rng.randrange(1, 9))
        elif name == "B":
            e.update(k=rng.choice(KEYS), k2=rng.choice(KEYS), op=rng.choice(OPS_MULTI))
            e["n"] = rng.randrange(1, 9)
        else:
            e["op"] = rng.choice(OPS_ALL)
        if name == "D":
            e.setdefault("k", 0)
            e.setdefault("n", 0)
            e["all"] = e["op"] in OPS_ALL
        per[name].append(e)
    for events in per.values():
        events.sort(key=lambda e: e["ts"])
    return per


def cut_per_source(rng: random.Random, per: dict[str, list[dict[str, Any]]]) -> list[list[Item]]:
    """Micro-batches: each source cut at its own random points, the inputs shuffled together.

    A source delivers in every batch until it has nothing left (the premise of
    ``idleBatches=1``); one quiet batch at the end releases what is held.
    """
    chunks: dict[str, list[list[dict[str, Any]]]] = {}
    for name, events in per.items():
        k = rng.randint(1, min(5, len(events))) if events else 0
        points = sorted(rng.sample(range(1, len(events)), k - 1)) if k > 1 else []
        ends = zip([0, *points], [*points, len(events)], strict=True)
        chunks[name] = [events[x:y] for x, y in ends][:k]
    batches = []
    for b in range(max(len(c) for c in chunks.values())):
        slots = [n for n in INPUTS if b < len(chunks[n]) for _ in chunks[n][b]]
        rng.shuffle(slots)  # inputs interleave at random; each keeps its own order
        queues = {n: iter(chunks[n][b]) for n in INPUTS if b < len(chunks[n])}
        batches.append([(n, next(queues[n])) for n in slots])
    return [*batches, []]


# -- comparing ------------------------------------------------------------------------------


def table_of(store: Path) -> dict[int, int]:
    rs = RuntimeStore(store)
    last = rs.committed()[-1]
    partitions = len(list((store / "state").glob("p*")))
    out: dict[int, int] = {}
    for pid in range(partitions):
        for rows in rs.load(pid, last).data.get("acc", {}).values():
            out.update({k: r["v"] for k, r in rows.items()})
    return out


def assert_outputs(got: list[dict[str, Any]], want: list[list[dict[str, Any]]]) -> None:
    """``got`` is ``want``'s transactions in order; one transaction's rows in any order
    (its parts on several partitions emit apart, docs/spark.md)."""

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return r["id"], r["what"], r["v"]

    at = 0
    for rows in want:
        assert sorted(got[at : at + len(rows)], key=key) == sorted(rows, key=key), (at, got)
        at += len(rows)
    assert got[at:] == []


def assert_run(store: Path, want: tuple[dict[int, int], list[Any], int]) -> None:
    table, outputs, aborted = want
    assert_outputs(tx.read_output(store, "out"), outputs)
    assert table_of(store) == table
    assert len(tx.read_failures(store)) == aborted
    verdict = check(tx.read_history(store), "csao")
    assert verdict.holds, verdict.evidence


# -- tests ----------------------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    boundary=st.sampled_from(["event", "timestamp", "seconds", "punctuation", "timeslice"]),
)
def test_event_time_merge_equals_the_serial_oracle_on_any_partitions_and_cuts(
    tmp_path_factory: pytest.TempPathFactory, seed: int, boundary: str
) -> None:
    rng = random.Random(seed)
    per = streams(rng, rng.randint(1, 25), rng.choice([4, 8, 20]))
    want = serial(transactions(boundary, declared(per)))
    for partitions in (1, 2, 3):
        store = tmp_path_factory.mktemp("et")
        batches = cut_per_source(rng, per)
        make_job(boundary, "event-time").run_local(batches, store, partitions=partitions)
        assert_run(store, want)


def test_a_keyless_fragment_in_a_deferred_transaction_sees_every_row_of_its_partition(
    tmp_path: Path,
) -> None:
    # Keys 0, 1 live on partition 1 and 4, 5 on partition 0 (of 2).  At ts 1 a
    # transfer 0 -> 4 spans both partitions, so the timestamp's transaction is
    # deferred to phase 2 with its keyless "bump" fragments; they must still
    # bump rows 1 and 5, which no keyed event of the transaction names.
    setup = [
        ("A", {"id": i, "ts": 0, "k": k, "op": "ups", "n": 10}) for i, k in enumerate([0, 1, 4, 5])
    ]
    batch = [
        *setup,
        ("B", {"id": 4, "ts": 1, "k": 0, "k2": 4, "op": "move", "n": 3}),
        ("C", {"id": 5, "ts": 1, "op": "bump"}),
    ]
    make_job("timestamp", "batch").run_local([batch], tmp_path, partitions=2)
    assert table_of(tmp_path) == {0: 8, 1: 11, 4: 14, 5: 11}
    assert tx.read_output(tmp_path, "out") == [{"id": 4, "what": "move", "v": 1}]


def batch_merge_case(
    seed: int, boundary: str
) -> tuple[list[list[Item]], tuple[dict[int, int], list[Any], int]]:
    """Random micro-batches in source order, and what the oracle makes of them (batch merge)."""
    rng = random.Random(seed)
    stream = declared(streams(rng, rng.randint(1, 25), rng.choice([4, 8, 20])))
    rng.shuffle(stream)
    cuts = sorted(rng.choices(range(len(stream) + 1), k=rng.randint(0, 3)))
    batches = [stream[x:y] for x, y in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    groups: list[list[Item]] = []
    clock: list[Any] = [None]
    for batch in batches:
        place = {id(item[1]): i for i, item in enumerate(batch)}
        ordered = sorted(batch, key=lambda it: (it[1]["ts"], INPUTS.index(it[0]), place[id(it[1])]))
        groups += transactions(boundary, ordered, clock)
    return batches, serial(groups)


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    boundary=st.sampled_from(BOUNDARIES),
)
def test_batch_merge_equals_the_serial_oracle_per_micro_batch_on_any_partitions(
    tmp_path_factory: pytest.TempPathFactory, seed: int, boundary: str
) -> None:
    # Batch order: each micro-batch in (order value, input, position) order and cut
    # on its own; its order values may be older than the last batch's (a late
    # timeslice event is aborted).
    batches, want = batch_merge_case(seed, boundary)
    for partitions in (1, 2, 3):
        store = tmp_path_factory.mktemp("bm")
        make_job(boundary, "batch").run_local(batches, store, partitions=partitions)
        assert_run(store, want)


def simple_job(initial: Any = None) -> tx.Job:
    return (
        tx.Job("bad")
        .table("acc", key="k", schema="k long, v long", initial=initial)
        .input("A", None, keys="k", order="ts")
        .on("A", lambda t, e: t.upsert("acc", {"k": e["k"], "v": e["v"]}))
    )


@pytest.mark.parametrize(
    ("batches", "partitions", "initial", "message"),
    [
        ([[("A", [1, 2])]], 2, None, "A#0: a row is a dict of columns, not list"),
        ([[{"k": 1}]], 2, None, "batch 0, item 0: not an (input, row) pair"),
        ([("A", {"k": 1, "v": 1, "ts": 0})], 2, None, "a micro-batch is a list of (input, row)"),
        ([[]], 0, None, "run_local partitions must be an integer 1..4096, not 0"),
        ([[]], "2", None, "run_local partitions must be an integer 1..4096, not '2'"),
        ([[]], 2, [{"v": 1}], "table 'acc': initial row 0: missing columns ['k']"),
        ([[]], 2, [{"k": "x", "v": 1}], "table 'acc': initial row 0: column 'k' is long, got 'x'"),
        ([[]], 2, [7], "table 'acc': initial row 0 is a int, not a dict of columns"),
        ([[]], 2, [{"k": 1, "v": 1}, {"k": 1, "v": 2}], "initial row 1 repeats the key 1"),
    ],
)
def test_run_local_refuses_bad_input_in_one_line_naming_it(
    tmp_path: Path, batches: Any, partitions: Any, initial: Any, message: str
) -> None:
    with pytest.raises(tx.RuntimeJobError) as info:
        simple_job(initial).run_local(batches, tmp_path, partitions=partitions)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not RuntimeStore(tmp_path).committed()  # nothing of it took effect


@pytest.mark.parametrize(
    ("fn", "error"),
    [
        (lambda t, e: t.increment("acc", 1, "v", 0.5), "SchemaError: increment of acc: column 'v'"),
        (lambda t, e: t.increment("acc", 1, "v", "x"), "SchemaError: increment of acc.v: cannot"),
        (lambda t, e: t.scan("nope", 1), "SchemaError: unknown table 'nope'"),
    ],
)
def test_a_write_that_breaks_the_schema_or_names_no_table_is_rolled_back(
    tmp_path: Path, fn: Callable[[Any, Any], None], error: str
) -> None:
    def both(t: Any, e: dict[str, Any]) -> None:
        t.increment("acc", 1, "v", 1)  # applied first, then rolled back with the rest
        fn(t, e)

    job = simple_job([{"k": 1, "v": 10}]).on("A", both)
    job.run_local([[("A", {"k": 1, "v": 0, "ts": 0})]], tmp_path, partitions=2)
    [failure] = tx.read_failures(tmp_path)
    assert failure["error"].startswith(error) and failure["position"] == "A#0"
    assert table_of(tmp_path) == {1: 10}


def test_a_by_group_function_that_raises_and_a_non_boolean_option_are_one_line(
    tmp_path: Path,
) -> None:
    job = simple_job().boundary("by", group=lambda r: r["nope"])
    with pytest.raises(tx.RuntimeJobError, match=r"^A#0: boundary 'by': group\(row\) raised Key"):
        job.run_local([[("A", {"k": 1, "v": 1, "ts": 0})]], tmp_path)
    assert not RuntimeStore(tmp_path).committed()
    with pytest.raises(tx.RuntimeJobError, match="recordHistory is True or False, not 'false'"):
        simple_job().option("recordHistory", "false")


def _generator_txn(t: Any, e: Any) -> Any:
    yield t.upsert("acc", {"k": e["k"], "v": e["v"]})


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (lambda j: j.table("t", key=5), "table 't': key: a column name or a list of column"),
        (lambda j: j.table("t", key="k", schema=5), "a schema is a string like"),
        (lambda j: j.input("B", None, keys=5), "input 'B': keys is a column name or a list"),
        (lambda j: j.input("B", None, keys=[["k", 5]]), "input 'B': keys: a column name or"),
        (lambda j: j.input("B", None, keys="k", order=1), "input 'B': order is a column name"),
        (lambda j: j.on("A", _generator_txn), "is a plain function (this one yields or is async"),
    ],
)
def test_a_declaration_of_the_wrong_kind_is_one_line_naming_it(
    declare: Callable[[tx.Job], Any], message: str
) -> None:
    with pytest.raises(tx.RuntimeJobError) as info:
        declare(simple_job())
    assert message in str(info.value) and "\n" not in str(info.value)


def test_event_time_merge_needs_every_input_ordered(tmp_path: Path) -> None:
    job = simple_job().input("B", None, keys="k").on("B", lambda t, e: None)
    job.option("merge", "event-time")
    with pytest.raises(tx.RuntimeJobError, match=r"input\(s\) B declare none \(add order=...\)"):
        job.run_local([[("A", {"k": 1, "v": 1, "ts": 0})]], tmp_path)


def test_read_output_refuses_a_path_without_a_job_in_one_line(tmp_path: Path) -> None:
    simple_job().output("out").run_local([[("A", {"k": 1, "v": 1, "ts": 0})]], tmp_path / "s")
    assert tx.read_output(tmp_path / "s", "out") == []  # declared, nothing emitted
    with pytest.raises(tx.TxStreamError, match="not a txstream checkpoint or store"):
        tx.read_output(tmp_path / "typo", "out")


WRITES: list[Callable[[Any, Any], Any]] = [
    lambda t, e: t.increment("acc", 1, "v", 0.5),  # a double into a long column
    lambda t, e: t.increment("acc", 1, "nope", 1),
    lambda t, e: t.update("acc", 1, v="x"),
    lambda t, e: t.update("acc", 1, k=2),  # a key column
    lambda t, e: t.upsert("acc", {"k": 3}),  # a column missing
    lambda t, e: t.insert("acc", {"k": 4, "v": 1, "w": 2}),  # a column too many
    lambda t, e: t.read("nope", 1),
    lambda t, e: t.emit("nope", {}),
    lambda t, e: t.abort("no"),
    lambda t, e: t.upsert("acc", {"k": 5, "v": 5}),  # fine: commits
    lambda t, e: t.insert("acc", {"k": 1, "v": 2}),  # the key exists
    lambda t, e: t.delete("acc", 1) or t.delete("acc", 1),  # the second finds no row
    lambda t, e: t.delete("acc", 1) or t.read("acc", 1.0),  # a miss by a key of another type
]


def on_the_driver(job: tx.Job, batches: list[list[Item]]) -> tuple[Any, list[Any]]:
    """The driver engine and its outcome per batch, for ``batches`` as ``run_local`` takes them."""
    from txstream.spark.runtime.boundaries import MID_BITS
    from txstream.spark.runtime.driver import DriverEngine
    from txstream.spark.runtime.local import event_copies

    engine = DriverEngine(job.spec)
    for name, table in job.spec.tables.items():
        if table.initial is not None:
            engine.load(name, table.initial)
    outcomes = []
    for b, batch in enumerate(batches):
        # One partition: one copy of every event (a keyless one's only fragment).
        mids = [(b << MID_BITS) + i for i in range(len(batch))]
        copies = [
            event_copies(job.spec, 1, n, row, m) for (n, row), m in zip(batch, mids, strict=True)
        ]
        outcomes.append(engine.run_batch(b, [event for [(_, event)] in copies]))
    return engine, outcomes


def fates(failures: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What both engines report alike of each failure, in order of position."""
    return sorted((f["position"], f["txn"], f["kind"], f["error"]) for f in failures)


@pytest.mark.parametrize("write", range(len(WRITES)))
def test_both_engines_accept_and_refuse_the_same_writes_alike(tmp_path: Path, write: int) -> None:
    def txn(t: Any, e: Any) -> None:
        t.increment("acc", 1, "v", 1)  # applied first: rolled back with the rest
        WRITES[write](t, e)

    job = simple_job([{"k": 1, "v": 10}]).on("A", txn)
    batches: list[list[Item]] = [[("A", {"k": 1, "v": 0, "ts": 0})]]
    job.run_local(batches, tmp_path, partitions=2)
    driver, [outcome] = on_the_driver(job, batches)
    assert fates(outcome.failures) == fates(tx.read_failures(tmp_path))
    rows = driver.tm.table("acc").rows()
    assert {k: r["v"] for k, r in rows.items()} == table_of(tmp_path)


KEYED_WRONG: list[tuple[str, Callable[[Any, Any], Any]]] = [
    # The event's key is the string "1" (its input column holds text); the table's
    # key column is a long: every verb says so, instead of "no row" or "undeclared".
    ("read of acc", lambda t, e: t.read("acc", e["k"])),
    ("update of acc", lambda t, e: t.update("acc", e["k"], v=2)),
    ("increment of acc", lambda t, e: t.increment("acc", e["k"], "v", 1)),
    ("delete from acc", lambda t, e: t.delete("acc", e["k"])),
    ("row of acc", lambda t, e: t.insert("acc", {"k": e["k"], "v": 1})),
    ("row of acc", lambda t, e: t.upsert("acc", {"k": e["k"], "v": 1})),
    ("scan of acc", lambda t, e: t.scan("acc", e["k"])),
    # A key outside the event's values, of another type: also the type's error.
    ("update of acc", lambda t, e: t.update("acc", "2", v=2)),
    ("increment of acc", lambda t, e: t.increment("acc", 2.5, "v", 1)),
    ("delete from acc", lambda t, e: t.delete("acc", True)),
    ("read of acc", lambda t, e: t.read("acc", "2")),
]


@pytest.mark.parametrize("case", range(len(KEYED_WRONG)))
def test_every_verb_refuses_a_key_of_another_type_with_a_schema_error_on_both_engines(
    tmp_path: Path, case: int
) -> None:
    what, verb = KEYED_WRONG[case]
    job = simple_job([{"k": 1, "v": 10}]).on("A", verb)
    key = 1 if case >= 7 else "1"
    batches: list[list[Item]] = [[("A", {"k": key, "v": 0, "ts": 0})]]
    job.run_local(batches, tmp_path, partitions=2)
    _, [outcome] = on_the_driver(job, batches)
    for failures in (tx.read_failures(tmp_path), outcome.failures):
        (failure,) = failures
        assert failure["error"].startswith(f"SchemaError: {what}"), failure
        assert "column 'k' is long" in failure["error"], failure
    assert table_of(tmp_path) == {1: 10}


@pytest.mark.parametrize(
    ("key", "error"),
    [
        (1, r"the key columns are \['g', 'k'\], a tuple of 2 values; got 1"),
        ((1,), r"a tuple of 2 values; got \(1,\)"),
        ((1, "2"), r"column 'k' is long, got '2'"),
    ],
)
def test_a_composite_key_of_another_shape_or_type_is_a_schema_error_on_both_engines(
    tmp_path: Path, key: Any, error: str
) -> None:
    job = (
        tx.Job("pairs")
        .table("t", key=["g", "k"], partition_by="g", schema="g long, k long, v long")
        .input("A", None, keys="g", order="ts")
        .on("A", lambda t, e: t.increment("t", key, "v", 1))
    )
    batches: list[list[Item]] = [[("A", {"g": 1, "ts": 0})]]
    job.run_local(batches, tmp_path, partitions=2)
    _, [outcome] = on_the_driver(job, batches)
    for failures in (tx.read_failures(tmp_path), outcome.failures):
        (failure,) = failures
        assert failure["error"].startswith("SchemaError: increment of t by key"), failure
        assert re.search(error, failure["error"]), failure


# -- scan and values on both engines -----------------------------------------------------------


def grouped_job(boundary: str = "event") -> tx.Job:
    """Rows keyed ``(g, k)`` and placed by ``g``: several rows per partition value.

    ``K`` events have the key ``g``; ``C`` events have none (one fragment per
    partition on the executors, one on the driver).  Emitted rows name the
    event and the value they describe, so both engines' rows compare as sets.
    """

    def listed(t: Any, e: dict[str, Any], g: Any) -> None:
        rows = [[r["k"], r["v"]] for r in t.scan("rows", g)]
        t.emit("out", {"id": e["id"], "value": g, "rows": rows})

    def on_k(t: Any, e: dict[str, Any]) -> None:
        g, op = e["g"], e["op"]
        if op in ("ins", "ins-raise"):
            t.insert("rows", {"g": g, "k": e["k"], "v": e["n"]})
            if op == "ins-raise":
                raise Boom("after an insert")
        elif op == "ups":
            t.upsert("rows", {"g": g, "k": e["k"], "v": e["n"]})
        elif op == "del":
            t.delete("rows", (g, e["k"]))
        elif op == "scan":
            listed(t, e, g)

    def on_c(t: Any, e: dict[str, Any]) -> None:
        for g in t.values("rows"):
            listed(t, e, g)
            if e["op"] == "bump":
                for r in t.scan("rows", g):
                    t.increment("rows", (g, r["k"]), "v", 1)
            # A value loses all its rows.  (Not "the first value listed": that is
            # each fragment's own first on the executors, a different row set.)
            elif e["op"] == "drop" and g % 3 == e["id"] % 3:
                for r in t.scan("rows", g):
                    t.delete("rows", (g, r["k"]))
        if t.home == 0:  # one fragment on either engine
            t.emit("out", {"id": e["id"], "value": None, "rows": []})

    initial = [{"g": g, "k": k, "v": 10 * g + k} for g in (1, 2, 5) for k in (0, 1, 2) if k <= g]
    options: dict[str, dict[str, Any]] = {"seconds": {"seconds": SLICE}}
    schema = "g long, k long, v long"
    return (
        tx.Job("grouped")
        .table("rows", key=["g", "k"], partition_by="g", schema=schema, initial=initial)
        .input("K", None, keys="g", order="ts")
        .input("C", None, keys=(), order="ts")
        .output("out")
        .on("K", on_k)
        .on("C", on_c)
        .boundary(boundary, **options.get(boundary, {}))
    )


def grouped_stream(rng: random.Random, n: int) -> list[list[Item]]:
    """``n`` random events over a few seconds, cut into one to three micro-batches."""
    items: list[Item] = []
    for i in range(n):
        e: dict[str, Any] = {"id": i, "ts": rng.randrange(8)}
        if rng.random() < 0.25:
            items.append(("C", {**e, "op": rng.choice(["list", "bump", "drop"])}))
        else:
            op = rng.choice(["ins", "ins", "ups", "del", "scan", "scan", "ins-raise"])
            e.update(g=rng.randrange(7), k=rng.randrange(4), n=rng.randrange(100), op=op)
            items.append(("K", e))
    items.sort(key=lambda item: item[1]["ts"])
    cuts = sorted(rng.sample(range(1, n), rng.randint(0, 2)))
    return [items[x:y] for x, y in zip([0, *cuts], [*cuts, n], strict=True)]


def both_engines(
    job: tx.Job, batches: list[list[Item]], store: Path, partitions: int
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(outputs as a sorted list, failures, table) of the executors and of the driver."""
    job.option("merge", "batch")  # (the driver engine here runs the batches in batch order)
    job.run_local(batches, store, partitions=partitions)
    executors = (
        sorted(json.dumps(r, sort_keys=True) for r in tx.read_output(store, "out")),
        fates(tx.read_failures(store)),
        rows_of(store, "rows"),
    )
    engine, outcomes = on_the_driver(job, batches)
    emitted = [json.loads(line) for o in outcomes for line in o.outputs.get("out", [])]
    driver = (
        sorted(
            json.dumps({k: v for k, v in r.items() if k != "__order"}, sort_keys=True)
            for r in emitted
        ),
        fates([f for o in outcomes for f in o.failures]),
        sorted(engine.tm.table("rows").rows().values(), key=lambda r: (r["g"], r["k"])),
    )
    return executors, driver


def rows_of(store: Path, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` as of the last committed batch, on every partition."""
    rs = RuntimeStore(store)
    last = rs.committed()[-1]
    found = []
    for folder in sorted((store / "state").glob("p*")):
        for rows in rs.load(int(folder.name[1:]), last).data.get(table, {}).values():
            found.extend(rows.values())
    return sorted(found, key=lambda r: (r["g"], r["k"]))


@pytest.mark.parametrize("boundary", ["event", "seconds"])
@pytest.mark.parametrize("seed", range(5))
def test_both_engines_scan_and_list_values_alike(
    tmp_path_factory: pytest.TempPathFactory, boundary: str, seed: int
) -> None:
    # The same job and input: the same scans (rows in key order), the same
    # values, the same table and failures.  A keyless event's fragments on the
    # executors list their partitions' values, the driver's one fragment lists
    # them all: together the same rows.  With "seconds", keyed and keyless events
    # share transactions, and an insert that raises must leave no trace in the
    # values and scans of the transactions after it.
    rng = random.Random(seed)
    batches = grouped_stream(rng, rng.randint(15, 30))
    job = grouped_job(boundary)
    for partitions in (1, 3):
        # A transaction that fails on several partitions is reported at its
        # earliest failing event, as serial execution (and the driver) fails it.
        executors, driver = both_engines(job, batches, tmp_path_factory.mktemp("g"), partitions)
        assert driver == executors


UNKNOWN = "SchemaError: unknown table 'nope'; tables: rows"
UNDECLARED = "UndeclaredKeyError: rows: partition value 2 is not a key of the transaction's"


@pytest.mark.parametrize(
    ("keyed", "fn", "error"),
    [
        pytest.param(True, lambda t, e: t.scan("nope", 1), UNKNOWN, id="scan-unknown"),
        pytest.param(False, lambda t, e: t.scan("nope", 1), UNKNOWN, id="keyless-scan-unknown"),
        pytest.param(True, lambda t, e: t.values("nope"), UNKNOWN, id="values-unknown"),
        pytest.param(False, lambda t, e: t.values("nope"), UNKNOWN, id="keyless-values-unknown"),
        pytest.param(True, lambda t, e: t.scan("rows", 2), UNDECLARED, id="scan-undeclared"),
        pytest.param(True, lambda t, e: t.read("rows", (2, 0)), UNDECLARED, id="read-undeclared"),
        pytest.param(
            True,
            lambda t, e: t.values("rows"),
            "UndeclaredKeyError: values('rows') is for events of an input declared without keys",
            id="values-keyed",
        ),
    ],
)
@pytest.mark.parametrize("mixed", [False, True], ids=["alone", "mixed"])
def test_both_engines_refuse_scan_and_values_alike(
    tmp_path: Path, keyed: bool, fn: Any, error: str, mixed: bool
) -> None:
    # ``fn`` runs in a keyed event on value 1 (or in a keyless one).  mixed: a keyed
    # and a keyless event share the transaction; the keyed one still may touch only
    # its transaction's values, and values() is still not for it: the rule is the
    # running event's, on both engines.
    noop = lambda t, e: None  # noqa: E731
    job = grouped_job("timestamp").on("K", fn if keyed else noop).on("C", noop if keyed else fn)
    batch: list[Item] = [("K", {"id": 0, "ts": 0, "g": 1}), ("C", {"id": 1, "ts": 0})]
    if not mixed:
        batch = batch[:1] if keyed else batch[1:]
    executors, driver = both_engines(job, [batch], tmp_path, 2)
    assert driver == executors
    [(_, _, kind, message)] = executors[1]
    assert kind == "error" and message.startswith(error) and "\n" not in message


def test_a_driver_history_with_scans_and_inserts_shows_their_set_item_conflicts() -> None:
    # Each scan comes before an insert into its value, each values() before an
    # insert of a new value or the delete of a value's last row: the history has
    # those conflicts on the set items (a row-level history has none: an insert
    # writes a row the scan never read) and is CSAO.
    job = grouped_job("event").option("recordHistory", True)
    batch: list[Item] = [
        ("K", {"id": 0, "ts": 0, "g": 1, "op": "scan"}),
        ("K", {"id": 1, "ts": 1, "g": 1, "k": 7, "n": 0, "op": "ins"}),
        ("C", {"id": 2, "ts": 2, "op": "list"}),
        ("K", {"id": 3, "ts": 3, "g": 4, "k": 0, "n": 0, "op": "ups"}),
        ("C", {"id": 4, "ts": 4, "op": "list"}),
        ("K", {"id": 5, "ts": 5, "g": 4, "k": 0, "op": "del"}),
    ]
    engine, [outcome] = on_the_driver(job, [batch])
    assert outcome.committed == 6 and not outcome.failures
    history = engine.tm.history()
    verdict = check(history, "csao")
    assert verdict.holds, verdict.evidence
    ops = list(history)
    conflicts = {
        (a.txn, b.txn, a.item)
        for i, a in enumerate(ops)
        for b in ops[i + 1 :]
        if a.conflicts_with(b)
    }
    t = history.arrivals["events"][1:]  # after the initial load
    assert (t[0], t[1], "rows-v.1") in conflicts  # scan of 1, then an insert into 1
    assert (t[2], t[3], "rows-values.all") in conflicts  # values(), then a new value 4
    assert (t[4], t[5], "rows-values.all") in conflicts  # values(), then 4 has no rows
    assert (t[4], t[5], "rows-v.4") in conflicts  # (and a scan of 4, then a delete from 4)


def test_a_driver_scan_holds_off_a_concurrent_insert_into_its_value_no_phantom() -> None:
    # Two transactions through the engine's SS2PL manager at once: T1 scans value 1,
    # T2 inserts into value 1.  T2 must wait for T1's commit, so T1's second scan
    # sees what its first saw, and the history is CSAO (T1 arrived first).
    import threading

    from txstream.spark.runtime.driver import DriverTx

    job = grouped_job("event").option("recordHistory", True)
    engine, _ = on_the_driver(job, [])
    t1 = engine.tm.begin()
    first = DriverTx(engine, t1, {1}).scan("rows", 1)
    inserted = threading.Event()

    def insert() -> None:
        with engine.tm.begin() as t2:
            DriverTx(engine, t2, {1}).insert("rows", {"g": 1, "k": 9, "v": 0})
        inserted.set()

    thread = threading.Thread(target=insert, daemon=True)
    thread.start()
    assert not inserted.wait(0.5), "the insert did not wait for the scan's set item"
    assert DriverTx(engine, t1, {1}).scan("rows", 1) == first
    t1.commit()
    thread.join(120)
    assert inserted.is_set()
    with engine.tm.begin() as t3:
        assert [r["k"] for r in DriverTx(engine, t3, {1}).scan("rows", 1)] == [0, 1, 9]
    verdict = check(engine.tm.history(), "csao")
    assert verdict.holds, verdict.evidence


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 100_000),
    boundary=st.sampled_from(BOUNDARIES),
)
def test_the_driver_engine_equals_the_serial_oracle_per_micro_batch(
    seed: int, boundary: str
) -> None:
    # The batch-merge oracle test, on the driver engine: its keyless events (bump:
    # scan every value's rows; emit once with home == 0) run as one fragment, a
    # late timeslice event is aborted, and its recorded history is CSAO.
    batches, (table, outputs, aborted) = batch_merge_case(seed, boundary)
    engine, outcomes = on_the_driver(make_job(boundary, "batch"), batches)
    emitted = [json.loads(line) for o in outcomes for line in o.outputs.get("out", [])]
    assert_outputs([{k: v for k, v in r.items() if k != "__order"} for r in emitted], outputs)
    assert {k: r["v"] for k, r in engine.tm.table("acc").rows().items()} == table
    assert sum(o.aborted for o in outcomes) == aborted
    verdict = check(engine.tm.history(), "csao")
    assert verdict.holds, verdict.evidence


def test_both_engines_abort_a_late_timeslice_event_without_running_it(tmp_path: Path) -> None:
    # Batch 1's tick is in slice 0, before batch 0's open slice 2: it is late.
    batches: list[list[Item]] = [
        [("C", {"id": 0, "ts": 5, "op": "emit"})],
        [("C", {"id": 1, "ts": 1, "op": "emit"})],
    ]
    job = make_job("timeslice", "batch")
    job.run_local(batches, tmp_path, partitions=2)
    _, outcomes = on_the_driver(job, batches)
    failures = [f for o in outcomes for f in o.failures]
    assert fates(failures) == fates(tx.read_failures(tmp_path))
    assert [(f["position"], f["kind"]) for f in failures] == [("C#b1+0", "late")]
    assert [json.loads(line)["id"] for o in outcomes for line in o.outputs.get("out", [])] == [0]


BEYOND_LONG: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("emit to out: column 'n'", lambda t, e: t.emit("out", {"n": 2**63})),
    ("emit to out: column 'n'", lambda t, e: t.emit("out", {"n": -(2**63) - 1})),
    ("row of acc: column 'v'", lambda t, e: t.upsert("acc", {"k": 1, "v": 2**64})),
    ("row of acc: column 'k'", lambda t, e: t.insert("acc", {"k": 2**63, "v": 1})),
    ("row of acc: column 'v'", lambda t, e: t.update("acc", 1, v=-(2**70))),
    ("increment of acc: column 'v'", lambda t, e: t.increment("acc", 1, "v", 2**63 - 10)),
]


@pytest.mark.parametrize("case", range(len(BEYOND_LONG)))
def test_a_long_beyond_64_bits_is_a_schema_error_on_both_engines(tmp_path: Path, case: int) -> None:
    # A Python int has no bound: before, 2**64 went into a long column and output,
    # which Spark's readers (FolderSink's stream) read as null and
    # read_output_arrow refused with an OverflowError traceback.
    what, verb = BEYOND_LONG[case]

    def txn(t: Any, e: Any) -> None:
        t.emit("out", {"n": 2**63 - 1})  # the bounds themselves fit
        t.emit("out", {"n": -(2**63)})
        verb(t, e)

    job = simple_job([{"k": 1, "v": 10}]).output("out", schema="n long").on("A", txn)
    batches: list[list[Item]] = [[("A", {"k": 1, "v": 0, "ts": 0})]]
    job.run_local(batches, tmp_path, partitions=2)
    _, [outcome] = on_the_driver(job, batches)
    for failures in (tx.read_failures(tmp_path), outcome.failures):
        (failure,) = failures
        assert failure["error"].startswith(f"SchemaError: {what} is long, a 64-bit integer; ")
        assert failure["error"].endswith("is beyond its range"), failure
    assert table_of(tmp_path) == {1: 10}
    assert tx.read_output(tmp_path, "out") == []


def _emit_v(store: Path, value: Any, tasks: int = 1) -> tuple[list[Any], list[str]]:
    """Emit ``{"v": value}`` to an output without a schema; its rows and failures."""
    job = (
        tx.Job("emit_v")
        .input("ev", None, keys="k")
        .output("o")
        .on("ev", lambda t, e: t.emit("o", {"v": e["v"], "k": e["k"]}))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        job.run_local(
            [[("ev", {"k": 1, "v": value}), ("ev", {"k": 2, "v": value})]], store, 2, tasks=tasks
        )
    rows = [r["v"] for r in tx.read_output(store, "o")]
    return rows, [f["error"] for f in tx.read_failures(store)]


def test_numpy_numbers_in_an_output_without_a_schema_stay_numbers(tmp_path: Path) -> None:
    # (the JSON encoder's default was str: np.int64(5), as rows from pandas hold
    # it, read back as the text "5" and np.True_ as "True")
    np = pytest.importorskip("numpy")
    for i, (value, expected) in enumerate(
        [(np.int64(5), 5), (np.int32(-3), -3), (np.bool_(True), True), (np.float32(0.5), 0.5)]
    ):
        rows, failures = _emit_v(tmp_path / str(i), value)
        assert failures == []
        assert rows == [expected, expected]
        assert [type(v) for v in rows] == [type(expected)] * 2


@pytest.mark.parametrize("value", [{1, 2}, b"x", bytearray(b"x"), frozenset(), object()])
def test_a_value_an_output_line_cannot_hold_is_a_schema_error(tmp_path: Path, value: Any) -> None:
    # (it was written as its str(): a set read back as the text "{1, 2}")
    for tasks in (1, 2):
        rows, failures = _emit_v(tmp_path / str(tasks), [1, {"in": value}], tasks)
        assert rows == []
        assert len(failures) == 2
        assert failures[0].startswith(f"SchemaError: emit to o: a {type(value).__name__} (")


def test_a_numpy_array_or_a_dict_key_that_is_no_string_is_a_schema_error(tmp_path: Path) -> None:
    # (an array passed as a numpy number, whose .item() then failed the whole run
    # with a traceback while the lines were written; a tuple key inside a dict
    # failed it in json's encoder)
    np = pytest.importorskip("numpy")
    for i, (value, kind) in enumerate(
        [(np.array([1, 2]), "ndarray"), (np.array(5), "ndarray"), ({(1, 2): 3}, "dict")]
    ):
        for tasks in (1, 2):
            rows, failures = _emit_v(tmp_path / f"{i}-{tasks}", [1, {"in": value}], tasks)
            assert rows == [] and len(failures) == 2, (value, tasks)
            assert failures[0].startswith(f"SchemaError: emit to o: a {kind}"), failures[0]


@pytest.mark.parametrize("history", [False, True])
def test_a_key_column_that_places_no_row_may_hold_decimals_floats_and_dates(
    tmp_path: Path, history: bool
) -> None:
    # (scan ordered keys by the partition values' canonical text, which refused a
    # Decimal: every scan of such a table failed, naming a "partition value"; with
    # recordHistory every write did, the history's item name using it too)
    import datetime as dt
    from decimal import Decimal

    def put(t: tx.Tx, e: dict[str, Any]) -> None:
        t.upsert("r", {"p": e["p"], "k": e["k"], "v": e["v"]})
        t.emit("o", {"keys": [str(r["k"]) for r in t.scan("r", e["p"])]})

    job = (
        tx.Job("keys")
        .option("recordHistory", history)
        .table("r", key=["p", "k"], partition_by=["p"])
        .input("ev", None, keys="p")
        .output("o")
        .on("ev", put)
    )
    ks = [Decimal("1.10"), 2.5, dt.date(2021, 1, 1), 1.0, Decimal("1.1"), 1, -0.5]
    job.run_local([[("ev", {"p": "x", "k": k, "v": i}) for i, k in enumerate(ks)]], tmp_path, 3)
    assert tx.read_failures(tmp_path) == []
    # one row per key that Python holds equal (Decimal("1.1") is Decimal("1.10"), 1 is 1.0)
    assert sorted(r["v"] for r in tx.read_table(tmp_path, "r")) == [1, 2, 4, 5, 6]
    assert tx.read_output(tmp_path, "o")[-1] == {"keys": ["-0.5", "1", "1.1", "2.5", "2021-01-01"]}
    if history:
        items = {op.item for op in tx.read_history(tmp_path).operations if op.kind == "w"}
        assert {"r:sx.x-312e31", "r:sx.1"} <= items  # 1.10 and 1.1 one item, 1.0 and 1 one
        assert not {i for i in items if i.endswith("312e3130")}


def test_key_text_orders_every_decimal_without_raising() -> None:
    # (math.isfinite raised on a signalling NaN Decimal: a scan of its table failed)
    from decimal import Decimal

    from txstream.spark.runtime.partitioning import key_text

    assert key_text(Decimal("sNaN")) == "Decimal('sNaN')"
    assert key_text(Decimal("1.10")) == key_text(Decimal("1.1")) == "1.1"
    assert key_text(Decimal("2E+3")) == key_text(2000.0) == key_text(2000) == "2000"
