"""Random transaction programs on the runtime, against a brute-force serial interpreter.

The other runtime tests use jobs of a known shape (ledgers, audits).  A new user's
job is none of them, so here every event carries a small *program*: a list of
steps over three tables (one keyed by integers, one by non-ASCII strings, one by
an integer and a string, placed by the integer: rows kept per partition value,
not flat), each a
read, an increment, an insert, an upsert, an update, a delete, an
insert-or-increment, a data-dependent failure or an abort, on one of the event's
three keys (which land on different partitions or on the same one); keyless
events total both tables through global reads.  The same programs run on 1 to 5
partitions, in one scheduler or in tasks that forward rows over local sockets,
in one run or stopped and restarted on the same store, and must give what one
dict-based interpreter gives running the events one after another in arrival
order: the same outputs, the same failures, the same final tables, and a
history the CSAO checker accepts.
"""

from __future__ import annotations

import copy
import json
import random
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import txstream as tx
from txstream.model import check
from txstream.spark.runtime import state as state_module
from txstream.spark.runtime.forward import base as forward_base

TABLES = {"a": (("k",), "v"), "b": (("s",), "w"), "c": (("k", "j"), "u")}
"""Each table's key columns and its one value column."""
SLOTS = {0: ("a", ("k0",)), 1: ("a", ("k1",)), 2: ("b", ("s0",)), 3: ("c", ("k1", "j"))}
"""A step's slot: the table it touches and the event columns that hold the key."""

Read = Callable[[str, Any], "dict[str, Any] | None"]
Write = Callable[[str, str, Any, int], Any]


class ProgramFailed(Exception):
    """The interpreter's stand-in for any error that rolls a transaction back."""


def interpret(event: dict[str, Any], read: Read, write: Write) -> list[Any]:
    """Run ``event``'s program on ``read``/``write``; what each step saw or wrote."""
    seen: list[Any] = []
    for op, slot, amount in json.loads(event["prog"]):
        table, columns = SLOTS[slot]
        key = event[columns[0]] if len(columns) == 1 else tuple(event[c] for c in columns)
        if op == "read":
            row = read(table, key)
            seen.append(None if row is None else row[TABLES[table][1]])
        else:
            seen.append(write(op, table, key, amount))
        if op == "fail" and sum(x for x in seen if isinstance(x, int)) % 3 == 0:
            raise ValueError("a failure that depends on what was read")
    return seen


def key_columns(table: str, key: Any) -> dict[str, Any]:
    """A row's key columns for ``key`` (a tuple for a key of several columns)."""
    names = TABLES[table][0]
    return dict(zip(names, key if len(names) > 1 else (key,), strict=True))


def on_runtime(t: Any, op: str, table: str, key: Any, amount: int) -> Any:
    """A write step through the job's ``tx.Tx``."""
    column = TABLES[table][1]
    if op == "increment":
        return t.increment(table, key, column, amount)
    if op == "insert":
        t.insert(table, {**key_columns(table, key), column: amount})
    elif op == "upsert":
        t.upsert(table, {**key_columns(table, key), column: amount})
    elif op == "update":
        return t.update(table, key, **{column: amount})[column]
    elif op == "delete":
        t.delete(table, key)
        return -1
    elif op == "add":  # insert or increment: the usual counter
        if t.read(table, key) is None:
            t.insert(table, {**key_columns(table, key), column: amount})
        else:
            return t.increment(table, key, column, amount)
    elif op == "abort":
        t.abort("the program said so")
    return amount if op != "fail" else 0


def on_dicts(
    rows: dict[str, dict[Any, dict[str, Any]]], op: str, table: str, key: Any, amount: int
) -> Any:
    """The same write step on plain dicts (the oracle)."""
    column = TABLES[table][1]
    here = rows[table]
    exists = key in here
    if op in ("increment", "update", "delete") and not exists:
        raise ProgramFailed(f"no row {key!r}")
    if (op == "insert" and exists) or op == "abort":
        raise ProgramFailed(op)
    if op in ("increment", "add") and exists:
        here[key][column] += amount
        return here[key][column]
    if op == "delete":
        del here[key]
        return -1
    if op in ("insert", "upsert", "add"):
        here[key] = {**key_columns(table, key), column: amount}
    elif op == "update":
        here[key][column] = amount
    return amount if op != "fail" else 0


def programs_job() -> tx.Job:
    """The job: one input of programs (three keys), one keyless input of audits (global
    reads), one keyless input of bumps (fragments that write every row of ``a``)."""

    def run(t: Any, e: dict[str, Any]) -> None:
        seen = interpret(e, t.read, lambda *step: on_runtime(t, *step))
        t.emit("seen", {"id": e["id"], "seen": json.dumps(seen)})

    def audit(t: Any, e: dict[str, Any]) -> None:
        if t.home == 0:  # (a keyless event runs on every partition: emit once)
            totals = {"sa": t.sum("a", "v"), "na": t.count("a")}
            more = {"sb": t.sum("b", "w"), "nb": t.count("b"), "sc": t.sum("c", "u")}
            t.emit("audits", {"id": e["id"], **totals, **more, "nc": t.count("c")})

    def bump(t: Any, e: dict[str, Any]) -> None:
        for key in list(t.values("a")):  # (this partition's rows: the fragments cover all)
            t.increment("a", key, "v", e["d"])

    return (
        tx.Job("programs")
        .table("a", key="k", schema="k long, v long")
        .table("b", key="s", schema="s string, w long")
        .table("c", key=["k", "j"], partition_by="k", schema="k long, j string, u long")
        .input("programs", None, keys=["k0", "k1", "s0"], order="id")
        .input("audits", None, order="id", global_reads=["a.v", "b.w", "c.u"])
        .input("bump", None, order="id")
        .output("seen")
        .output("audits")
        .on("programs", run)
        .on("audits", audit)
        .on("bump", bump)
        .option("recordHistory", True)
    )


def serial(batches: list[list[tuple[str, dict[str, Any]]]]) -> dict[str, Any]:
    """Outputs, failed ids and final tables of the events one after another, in id order."""
    rows: dict[str, dict[Any, dict[str, Any]]] = {"a": {}, "b": {}, "c": {}}
    seen, audits, failed = [], [], []
    for name, e in sorted((item for b in batches for item in b), key=lambda i: i[1]["id"]):
        if name == "audits":
            a, b, c = rows["a"].values(), rows["b"].values(), rows["c"].values()
            audits.append(
                {
                    "id": e["id"],
                    "sa": sum(r["v"] for r in a),
                    "na": len(a),
                    "sb": sum(r["w"] for r in b),
                    "nb": len(b),
                    "sc": sum(r["u"] for r in c),
                    "nc": len(c),
                }
            )
            continue
        if name == "bump":
            for row in rows["a"].values():
                row["v"] += e["d"]
            continue
        work = copy.deepcopy(rows)

        def read(table: str, key: Any, work: Any = work) -> dict[str, Any] | None:
            row = work[table].get(key)
            return None if row is None else dict(row)

        try:
            out = interpret(e, read, lambda *step, work=work: on_dicts(work, *step))
        except (ProgramFailed, ValueError):
            failed.append(e["id"])
            continue
        rows = work
        seen.append({"id": e["id"], "seen": json.dumps(out)})
    return {"seen": seen, "audits": audits, "failed": failed, **rows}


OPS = (
    "read",
    "read",
    "increment",
    "insert",
    "upsert",
    "update",
    "delete",
    "add",
    "add",
    "fail",
    "abort",
)


@st.composite
def runs(draw: Any) -> tuple[list[list[tuple[str, dict[str, Any]]]], int, int, int, int]:
    """Batches of programs and audits, partitions, tasks, where the run restarts, and
    the transactions a partition admits per round (the runtime's 128 hold a test's
    whole batch: 3 and 1 make reads admitted past wait across rounds)."""
    ints = st.integers(0, draw(st.integers(0, 9)))
    strs = st.integers(0, draw(st.integers(0, 4))).map(lambda n: f"kë{n}")
    step = st.tuples(st.sampled_from(OPS), st.integers(0, 3), st.integers(-5, 9)).filter(
        lambda s: s[0] != "abort" or s[2] > 7  # (rarely: most programs should commit)
    )
    program = st.builds(
        lambda k0, k1, s0, j, prog: (
            "programs",
            {"k0": k0, "k1": k1, "s0": s0, "j": j, "prog": json.dumps(prog)},
        ),
        ints,
        ints,
        strs,
        st.sampled_from(["x", "y"]),
        st.lists(step, min_size=1, max_size=5),
    )
    event = st.one_of(program, program, program, st.just(("audits", {})))
    batches = draw(st.lists(st.lists(event, max_size=25), min_size=1, max_size=4))
    batches = [[(n, dict(e)) for n, e in b] for b in batches]
    for i, (_, e) in enumerate(item for b in batches for item in b):
        e["id"] = i
    partitions = draw(st.integers(1, 5))
    tasks = min(draw(st.integers(1, 3)), partitions)
    restart = draw(st.integers(0, len(batches)))
    return (
        batches,
        partitions,
        tasks,
        restart,
        draw(st.sampled_from([forward_base.ADMIT_CHUNK, 3, 1])),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs())
def test_random_programs_equal_serial_execution(
    tmp_path_factory: pytest.TempPathFactory,
    run: tuple[list[list[tuple[str, dict[str, Any]]]], int, int, int, int],
) -> None:
    batches, partitions, tasks, restart, chunk = run
    assert_serial(batches, partitions, tasks, restart, chunk, tmp_path_factory.mktemp("programs"))


@pytest.mark.parametrize("seed", range(8))
def test_reads_admitted_past_across_rounds_equal_serial_execution(
    tmp_path: Path, seed: int
) -> None:
    # Long batches over many keys, audits at up to 3 in 10 events, admission rounds
    # of 1 or 3: transactions are admitted in later rounds while a global read
    # admitted past still waits for earlier ones (the suite's other batches fit in
    # one round of 128: a mutant that let those later ones write into the read's
    # totals passed it).
    rng = random.Random(seed)
    batches = long_batches(rng)
    partitions = rng.randint(2, 5)
    tasks = min(rng.randint(1, 3), partitions)
    assert_serial(
        batches, partitions, tasks, rng.randint(0, len(batches)), rng.choice([1, 3]), tmp_path
    )


@pytest.mark.parametrize("seed", range(8))
def test_rows_lent_ahead_of_admission_equal_serial_execution(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Participants lend crossing transactions' rows ahead of admission (from
    # LEND_FROM = 8 partitions on; here from 2), a few events ahead, in rounds of 1
    # or 3: lending meets values that earlier events not admitted yet touch, and
    # global reads and keyless fragments not admitted yet, which nothing may be lent
    # past.  Fails against a mutant that lends whatever the earlier events touch,
    # one that lends past a global read, and one that lends past a keyless fragment.
    rng = random.Random(1000 + seed)
    batches = long_batches(rng, bumps=True)
    monkeypatch.setattr(forward_base, "LEND_FROM", 2)  # (tasks fork: they take it too)
    monkeypatch.setattr(forward_base, "LEND_AHEAD", rng.choice([2, 5, 12]))
    partitions = rng.randint(2, 5)
    tasks = min(rng.randint(1, 3), partitions)
    assert_serial(
        batches, partitions, tasks, rng.randint(0, len(batches)), rng.choice([1, 3]), tmp_path
    )


def long_batches(rng: random.Random, bumps: bool = False) -> list[list[tuple[str, dict[str, Any]]]]:
    """Batches of 40-90 events over 8-30 keys, an audit at up to 3 in 10 of them (and,
    with ``bumps``, a keyless bump at about 1 in 8)."""
    keys = rng.randint(8, 30)
    share = rng.choice([0.1, 0.3])
    batches: list[list[tuple[str, dict[str, Any]]]] = []
    for _ in range(rng.randint(1, 3)):
        batch: list[tuple[str, dict[str, Any]]] = []
        for _ in range(rng.randint(40, 90)):
            if rng.random() < share:
                batch.append(("audits", {}))
                continue
            if bumps and rng.random() < 0.125:
                batch.append(("bump", {"d": rng.randint(1, 3)}))
                continue
            steps = [
                (rng.choice(OPS[:-1]), rng.randint(0, 3), rng.randint(-5, 9))
                for _ in range(rng.randint(1, 4))
            ]
            row = {
                "k0": rng.randrange(keys),
                "k1": rng.randrange(keys),
                "s0": f"kë{rng.randrange(5)}",
            }
            batch.append(("programs", {**row, "j": rng.choice("xy"), "prog": json.dumps(steps)}))
        batches.append(batch)
    for i, (_, e) in enumerate(item for b in batches for item in b):
        e["id"] = i
    return batches


def assert_serial(
    batches: list[list[tuple[str, dict[str, Any]]]],
    partitions: int,
    tasks: int,
    restart: int,
    chunk: int,
    store: Path,
) -> None:
    """Run ``batches`` (restarting before batch ``restart``) and compare with :func:`serial`."""
    with warnings.catch_warnings(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(forward_base, "ADMIT_CHUNK", chunk)  # (tasks fork: they take it too)
        patch.setattr(forward_base, "ADMIT_CHUNK_WAITING", max(1, chunk // 4))
        warnings.simplefilter("ignore", tx.TransactionFailuresWarning)
        for part in (batches[:restart], batches[restart:]):  # (a restart in between)
            if part:
                state_module._CACHE.clear()  # (a new process: the states come from disk)
                programs_job().run_local(part, store, partitions=partitions, tasks=tasks)
    want = serial(batches)
    assert tx.read_output(store, "seen") == want["seen"]
    assert tx.read_output(store, "audits") == want["audits"]
    failures = tx.read_failures(store)
    assert [f["order"][0] for f in failures] == want["failed"]  # (order: id first)
    assert {r["k"]: r["v"] for r in tx.read_table(store, "a")} == {
        k: r["v"] for k, r in want["a"].items()
    }
    assert {r["s"]: r["w"] for r in tx.read_table(store, "b")} == {
        k: r["w"] for k, r in want["b"].items()
    }
    assert {(r["k"], r["j"]): r["u"] for r in tx.read_table(store, "c")} == {
        k: r["u"] for k, r in want["c"].items()
    }
    if any(name == "programs" for b in batches for name, _ in b):
        verdict = check(tx.read_history(store), "csao")
        assert verdict.holds, verdict.evidence
