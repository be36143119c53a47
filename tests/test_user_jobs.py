"""Small jobs a data engineer would write, each checked against a serial oracle.

Every job runs three ways: a brute-force oracle in this file (the events one by
one in arrival order over plain dicts, a transaction's writes undone when it
raises), ``run_local`` and a real Spark query on the shared ``local[2]``
session (file sources handed over one file per micro-batch, ``availableNow``).
The outputs, the failures and the final tables must agree.  Then the mistakes a
user makes must each give one readable ``TxStreamError`` line.
"""

from __future__ import annotations

import copy
import json
import os
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

import txstream as tx
from txstream.spark.runtime.state import RuntimeStore

pytestmark = pytest.mark.spark
# The transaction functions below live in this test module, which Spark's Python
# workers cannot import: ship them by value, as a job script's own functions are.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

Row = dict[str, Any]
Batches = list[list[tuple[str, Row]]]


# -- the serial oracle ------------------------------------------------------------------
class SerialTx:
    """The transaction API over plain dicts, one transaction at a time (no partitions)."""

    def __init__(self, keys: dict[str, str], tables: dict[str, dict[Any, Row]]) -> None:
        self.keys = keys
        self.tables = tables
        self.emitted: list[tuple[str, Row]] = []
        self.home: int | None = None

    def read(self, table: str, key: Any, default: Any = None) -> Any:
        row = self.tables[table].get(key)
        return default if row is None else dict(row)

    def values(self, table: str) -> list[Any]:
        return sorted(self.tables[table], key=str)

    def insert(self, table: str, row: Row) -> None:
        key = row[self.keys[table]]
        if key in self.tables[table]:
            raise tx.DuplicateKeyError(f"{table}: key {key!r} exists")
        self.tables[table][key] = dict(row)

    def upsert(self, table: str, row: Row) -> None:
        self.tables[table][row[self.keys[table]]] = dict(row)

    def update(self, table: str, key: Any, **columns: Any) -> Row:
        if key not in self.tables[table]:
            raise tx.MissingRowError(f"update of {table}: no row {key!r}")
        self.tables[table][key] = {**self.tables[table][key], **columns}
        return dict(self.tables[table][key])

    def increment(self, table: str, key: Any, column: str, by: float = 1) -> Any:
        if key not in self.tables[table]:
            raise tx.MissingRowError(f"increment of {table}: no row {key!r}")
        self.tables[table][key][column] += by
        return self.tables[table][key][column]

    def delete(self, table: str, key: Any) -> None:
        if key not in self.tables[table]:
            raise tx.MissingRowError(f"delete from {table}: no row {key!r}")
        del self.tables[table][key]

    def emit(self, output: str, row: Row) -> None:
        self.emitted.append((output, dict(row)))

    def abort(self, reason: str = "aborted") -> None:
        raise tx.TransactionAborted(reason)


def serial(
    transactions: list[list[tuple[str, Row]]],
    handlers: dict[str, Callable[[Any, Row], None]],
    keys: dict[str, str],
    initial: dict[str, list[Row]] | None = None,
) -> tuple[dict[str, list[Row]], dict[str, dict[Any, Row]], int]:
    """Run ``transactions`` (each a list of events) one after the other.

    Returns the emitted rows per output, the final tables and the number of
    transactions rolled back.
    """
    tables: dict[str, dict[Any, Row]] = {name: {} for name in keys}
    for name, rows in (initial or {}).items():
        tables[name] = {r[keys[name]]: dict(r) for r in rows}
    outputs: dict[str, list[Row]] = {}
    failed = 0
    for events in transactions:
        before = copy.deepcopy(tables)
        t = SerialTx(keys, tables)
        try:
            for name, row in events:
                handlers[name](t, row)
        except Exception:
            tables.clear()
            tables.update(before)
            failed += 1
            continue
        for output, row in t.emitted:
            outputs.setdefault(output, []).append(row)
    return outputs, tables, failed


# -- running a job on run_local and on Spark --------------------------------------------
def local_tables(store: Path, partitions: int) -> dict[str, dict[Any, Row]]:
    """Every table's rows at the last committed batch, by key (all partitions)."""
    rs = RuntimeStore(store)
    last = rs.committed()[-1]
    out: dict[str, dict[Any, Row]] = {}
    for pid in range(partitions):
        for table, values in rs.load(pid, last).data.items():
            for rows in values.values():
                out.setdefault(table, {}).update(rows)
    return out


def write_inputs(folder: Path, batches: Batches, inputs: list[str]) -> None:
    """One JSON file per input and micro-batch, with rising times (one file per trigger).

    An input without rows in a batch gets an empty file, so that Spark's
    micro-batches hold what ``run_local``'s batches hold.
    """
    for name in inputs:
        (folder / name).mkdir(parents=True, exist_ok=True)
    for n, batch in enumerate(batches):
        for name in inputs:
            rows = [row for i, row in batch if i == name]
            path = folder / name / f"part-{n:04d}.json"
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))


def run_both(
    spark: Any,
    tmp_path: Path,
    make_job: Callable[[dict[str, Any]], Any],
    schemas: dict[str, str],
    batches: Batches,
    partitions: int = 2,
) -> dict[str, Any]:
    """Run the job on ``run_local`` and on Spark; returns what each committed."""
    results: dict[str, Any] = {}
    # Both end their inputs at the end (run_local's last batch, Spark's availableNow run).
    runner = make_job({name: None for name in schemas}).run_local(
        batches, tmp_path / "local", partitions=partitions
    )
    results["local_progress"] = runner.stats
    results["local"] = tmp_path / "local"
    write_inputs(tmp_path / "in", batches, list(schemas))
    dfs = {
        name: spark.readStream.schema(schema)
        .option("maxFilesPerTrigger", 1)
        .json(str(tmp_path / "in" / name))
        for name, schema in schemas.items()
    }
    query = (
        make_job(dfs)
        .trigger(availableNow=True)
        .start(tmp_path / "ckpt", spark=spark, partitions=partitions)
    )
    try:
        query.awaitTermination()
    finally:
        query.stop()
    results["spark"] = tmp_path / "ckpt"
    results["spark_progress"] = query.recentProgress
    return results


def committed(path: Path, outputs: list[str], partitions: int) -> dict[str, Any]:
    store = path / "txstream" if (path / "txstream").is_dir() else path
    return {
        "outputs": {name: tx.read_output(path, name) for name in outputs},
        "tables": local_tables(store, partitions),
        "failed": len(tx.read_failures(path)),
    }


# -- job 1: an inventory with deletes, re-inserts, kits over three keys, two outputs ----
def stock_op(t: Any, e: Row) -> None:
    sku, n = e["sku"], e["n"]
    t.emit("audit", {"seq": e["seq"], "what": e["op"], "sku": sku})  # dropped if it raises
    row = t.read("stock", sku)
    if e["op"] == "put":
        if row is None:  # a new sku, or one deleted before: inserted again
            t.insert("stock", {"sku": sku, "qty": n})
        else:
            t.increment("stock", sku, "qty", n)
    elif e["op"] == "take":
        if row is None or row["qty"] < n:
            raise ValueError(f"cannot take {n} of {sku}")
        left = t.increment("stock", sku, "qty", -n)
        if left == 0:
            t.delete("stock", sku)
        elif left < 3:
            t.emit("low", {"sku": sku, "qty": left, "seq": e["seq"]})
    else:  # drop: MissingRowError when there is nothing to drop
        t.delete("stock", sku)


def assemble(t: Any, e: Row) -> None:
    """A kit takes one of part a and one of part b: three keys, often three partitions."""
    for part in (e["a"], e["b"]):
        row = t.read("stock", part)
        if row is None or row["qty"] < 1:
            t.abort(f"no {part} for {e['kit']}")
    for part in (e["a"], e["b"]):
        if t.increment("stock", part, "qty", -1) == 0:
            t.delete("stock", part)
    if t.read("stock", e["kit"]) is None:
        t.insert("stock", {"sku": e["kit"], "qty": 1})
    else:
        t.increment("stock", e["kit"], "qty", 1)
    t.emit("audit", {"seq": e["seq"], "what": "kit", "sku": e["kit"]})


def inventory_job(sources: dict[str, Any]) -> Any:
    return (
        tx.Job("inventory")
        .table("stock", key="sku", schema="sku string, qty long")
        .input("ops", sources["ops"], keys="sku", order="seq")
        .input("kits", sources["kits"], keys=["a", "b", "kit"], order="seq")
        .output("audit", schema="seq long, what string, sku string")
        .output("low", schema="sku string, qty long, seq long")
        .on("ops", stock_op)
        .on("kits", assemble)
        .option("merge", "batch")  # (the tests hand both inputs over in order, batch by batch)
    )


def inventory_events(n: int, seed: int) -> list[tuple[str, Row]]:
    rng = random.Random(seed)
    parts = [f"p{i}" for i in range(6)]
    out: list[tuple[str, Row]] = []
    for seq in range(n):
        if rng.random() < 0.2:
            a, b = rng.sample(parts, 2)
            out.append(("kits", {"a": a, "b": b, "kit": rng.choice(["K1", "K2"]), "seq": seq}))
        else:
            op = rng.choice(["put", "put", "take", "take", "drop"])
            sku = rng.choice([*parts, "K1"])
            out.append(("ops", {"op": op, "sku": sku, "n": rng.randint(1, 4), "seq": seq}))
    return out


def test_inventory_with_deletes_reinserts_and_kits_equals_serial_execution(
    spark: Any, tmp_path: Path
) -> None:
    stream = inventory_events(160, seed=5)
    batches = [stream[i : i + 40] for i in range(0, len(stream), 40)]
    handlers = {"ops": stock_op, "kits": assemble}
    outputs, tables, failed = serial([[e] for e in stream], handlers, {"stock": "sku"})
    assert failed > 5 and outputs["low"] and any(e[1].get("op") == "drop" for e in stream)
    schemas = {
        "ops": "op string, sku string, n long, seq long",
        "kits": "a string, b string, kit string, seq long",
    }
    runs = run_both(spark, tmp_path, inventory_job, schemas, batches, partitions=3)
    for where in ("local", "spark"):
        got = committed(runs[where], ["audit", "low"], 3)
        assert got["outputs"] == outputs, where
        assert got["tables"].get("stock", {}) == tables["stock"], where
        assert got["failed"] == failed, where
    assert len(runs["spark_progress"]) == 4


# -- job 2: payments priced by a rate table that another system updates -----------------
def change_rate(t: Any, c: Row) -> None:
    if c["rate"] is None:  # the other system retired the currency
        t.delete("rates", c["cur"])
    else:
        t.upsert("rates", {"cur": c["cur"], "rate": c["rate"]})


def price(t: Any, p: Row) -> None:
    rate = t.read("rates", p["cur"])
    if rate is None:
        raise LookupError(f"no rate for {p['cur']}")
    t.emit("priced", {"id": p["id"], "usd": round(p["amount"] * rate["rate"], 6), "ts": p["ts"]})


def rates_job(sources: dict[str, Any]) -> Any:
    return (
        tx.Job("rates")
        .table("rates", key="cur", schema="cur string, rate double", initial=list(RATES))
        .input("changes", sources["changes"], keys="cur", order="ts")
        .input("payments", sources["payments"], keys="cur", order="ts")
        .output("priced", schema="id long, usd double, ts long")
        .boundary("timestamp")
        .option("merge", "event-time")
        .on("changes", change_rate)
        .on("payments", price)
    )


def by_ts_id(row: Row) -> tuple[Any, ...]:
    return (row["ts"], row["id"])


RATES = ({"cur": "EUR", "rate": 1.1}, {"cur": "GBP", "rate": 1.3}, {"cur": "JPY", "rate": 0.007})


def test_a_rate_table_updated_by_a_change_stream_prices_payments_as_serial_execution_by_time(
    spark: Any, tmp_path: Path
) -> None:
    rng = random.Random(3)
    currencies = ["EUR", "GBP", "JPY", "CHF"]
    changes = []
    for ts in sorted(rng.sample(range(0, 200), 25)):
        rate = None if rng.random() < 0.15 else round(rng.uniform(0.5, 2), 3)
        changes.append({"cur": rng.choice(currencies), "rate": rate, "ts": ts})
    payments = [
        {"id": i, "cur": rng.choice(currencies), "amount": rng.randint(1, 500), "ts": ts}
        for i, ts in enumerate(sorted(rng.choices(range(0, 200), k=90)))
    ]
    # The change stream runs ahead: all of it in the first micro-batch, the payments
    # over three; the inputs end after them (once a payment a tick after the end
    # had to be sent to release the last ones on Spark).
    batches: Batches = [
        [("changes", c) for c in changes] + [("payments", p) for p in payments[:30]],
        [("payments", p) for p in payments[30:60]],
        [("payments", p) for p in payments[60:]],
    ]
    arrival = sorted(
        [(c["ts"], 0, n, ("changes", c)) for n, c in enumerate(changes)]
        + [(p["ts"], 1, n, ("payments", p)) for n, p in enumerate(payments)]
    )
    by_ts: dict[int, list[tuple[str, Row]]] = {}
    for ts, _, _, event in arrival:
        by_ts.setdefault(ts, []).append(event)
    outputs, tables, failed = serial(
        list(by_ts.values()),
        {"changes": change_rate, "payments": price},
        {"rates": "cur"},
        {"rates": list(RATES)},
    )
    assert failed and outputs["priced"]
    schemas = {
        "changes": "cur string, rate double, ts long",
        "payments": "id long, cur string, amount long, ts long",
    }
    with pytest.warns(tx.TransactionFailuresWarning):
        runs = run_both(spark, tmp_path, rates_job, schemas, batches)
    for where in ("local", "spark"):
        got = committed(runs[where], ["priced"], 2)
        # One timestamp is one transaction; the rows its parts on two partitions
        # emit come partition by partition (docs/spark.md), so compare within it sorted.
        priced = got["outputs"]["priced"]
        assert [r["ts"] for r in priced] == [r["ts"] for r in outputs["priced"]], where
        assert sorted(priced, key=by_ts_id) == sorted(outputs["priced"], key=by_ts_id), where
        assert got["tables"]["rates"] == tables["rates"], where
        assert got["failed"] == failed, where
    assert runs["spark_progress"][-1]["held"] == 0  # the inputs ended


# -- job 3: per-timeslice averages, late clock ticks, a slice that fails -----------------
def add_reading(t: Any, r: Row) -> None:
    if r["value"] < 0:
        raise ValueError(f"sensor {r['sensor']}: negative reading {r['value']}")
    if t.read("acc", r["sensor"]) is None:
        t.insert("acc", {"sensor": r["sensor"], "n": 0, "total": 0.0})
    t.increment("acc", r["sensor"], "n", 1)
    t.increment("acc", r["sensor"], "total", r["value"])


def close_slice(t: Any, c: Row) -> None:
    """A tick opens a slice: report what the slices since the last report gathered."""
    for sensor in t.values("acc"):
        row = t.read("acc", sensor)
        t.emit("averages", {"sensor": sensor, "avg": row["total"] / row["n"], "tick": c["ts"]})
        t.delete("acc", sensor)
    if t.home in (0, None):
        t.emit("ticks", {"ts": c["ts"]})


def slices_job(sources: dict[str, Any]) -> Any:
    return (
        tx.Job("slices")
        .table("acc", key="sensor", schema="sensor string, n long, total double")
        .input("clock", sources["clock"], keys=(), order="ts")
        .input("readings", sources["readings"], keys="sensor", order="ts")
        .output("averages", schema="sensor string, avg double, tick double")
        .output("ticks", schema="ts double")
        .boundary("timeslice", seconds=10, of="clock")
        .on("clock", close_slice)
        .on("readings", add_reading)
        .option("merge", "batch")  # (the tests hand both inputs over in order, batch by batch)
    )


def timeslices(batches: Batches, seconds: float, of: str, inputs: list[str]) -> list[Any]:
    """Coral8's cut, batch by batch: a slice of ``of`` per transaction, late ``of`` events alone.

    A late event's transaction is None (aborted without running).
    """
    out: list[Any] = []
    newest = None
    for batch in batches:
        ordered = sorted(
            enumerate(batch), key=lambda x: (x[1][1]["ts"], inputs.index(x[1][0]), x[0])
        )
        current: list[Any] | None = None
        for _, (name, row) in ordered:
            if name == of:
                slice_ = row["ts"] // seconds
                if newest is not None and slice_ < newest:
                    out.append(None)
                    continue
                if current is None or slice_ != newest:
                    current = []
                    out.append(current)
                newest = slice_
            elif current is None:
                current = []
                out.append(current)
            current.append((name, row))
    return out


def test_timeslice_averages_with_late_ticks_and_a_failing_slice_equal_serial_execution(
    spark: Any, tmp_path: Path
) -> None:
    rng = random.Random(8)
    sensors = [f"s{i}" for i in range(5)]

    def readings(lo: int, hi: int, n: int) -> list[tuple[str, Row]]:
        return [
            ("readings", {"sensor": rng.choice(sensors), "value": rng.randint(0, 50), "ts": ts})
            for ts in sorted(rng.choices(range(lo, hi), k=n))
        ]

    batches: Batches = [
        [("clock", {"ts": float(ts)}) for ts in (0, 10, 20, 30, 40)] + readings(0, 45, 30),
        # a late tick (slice 2 after slice 4 opened), a late reading, and a bad one at 63
        [("clock", {"ts": 25.0})]
        + [("clock", {"ts": float(ts)}) for ts in (50, 60, 70)]
        + readings(45, 75, 25)
        + [("readings", {"sensor": "s1", "value": 7, "ts": 12})]
        + [("readings", {"sensor": "s2", "value": -1, "ts": 63})],
        [("clock", {"ts": float(ts)}) for ts in (80, 90, 100)] + readings(75, 105, 20),
    ]
    inputs = ["clock", "readings"]
    transactions = timeslices(batches, 10, "clock", inputs)
    late = transactions.count(None)
    handlers = {"clock": close_slice, "readings": add_reading}
    outputs, tables, failed = serial(
        [t for t in transactions if t is not None], handlers, {"acc": "sensor"}
    )
    assert late == 1 and failed == 1
    schemas = {"clock": "ts double", "readings": "sensor string, value double, ts double"}
    runs = run_both(spark, tmp_path, slices_job, schemas, batches)
    for where in ("local", "spark"):
        got = committed(runs[where], ["averages", "ticks"], 2)
        assert got["outputs"]["ticks"] == outputs["ticks"], where
        key = lambda r: (r["tick"], r["sensor"])  # noqa: E731 - parts' rows come by partition
        assert sorted(got["outputs"]["averages"], key=key) == sorted(outputs["averages"], key=key)
        assert got["tables"]["acc"] == tables["acc"], where
        assert got["failed"] == late + failed, where
    # A tick reaches both partitions but is one input row (it counted once per partition)
    assert [p["numInputRows"] for p in runs["spark_progress"]] == [len(b) for b in batches]
    assert [p["events"] for p in runs["local_progress"]] == [len(b) for b in batches]


# -- job 4: positions snapshotted at punctuations, runs spanning micro-batches ----------
def trade(t: Any, e: Row) -> None:
    if t.read("pos", e["acct"]) is None:
        t.insert("pos", {"acct": e["acct"], "qty": 0})
    if t.increment("pos", e["acct"], "qty", e["qty"]) < 0:
        raise ValueError(f"account {e['acct']} would go short")


def snapshot(t: Any, c: Row) -> None:
    for acct in t.values("pos"):
        t.emit("snapshots", {"acct": acct, "qty": t.read("pos", acct)["qty"], "at": c["ts"]})


def punctuated_job(sources: dict[str, Any]) -> Any:
    return (
        tx.Job("positions")
        .table("pos", key="acct", schema="acct long, qty long")
        .input("trades", sources["trades"], keys="acct", order="ts")
        .input("cti", sources["cti"], keys=(), order="ts")
        .output("snapshots", schema="acct long, qty long, at long")
        .boundary("punctuation", of="cti")
        .option("merge", "event-time")
        .on("trades", trade)
        .on("cti", snapshot)
    )


def test_punctuated_runs_across_micro_batches_equal_serial_execution_by_time(
    spark: Any, tmp_path: Path
) -> None:
    rng = random.Random(4)
    trades = [
        {"acct": rng.randint(1, 6), "qty": rng.choice([5, 3, -2, -4]), "ts": ts}
        for ts in sorted(rng.choices(range(100), k=80))
    ]
    ctis = [{"ts": ts} for ts in (9, 20, 35, 50, 51, 70, 99)]
    # CTIs run ahead of the trades in the first two micro-batches, behind in the last
    batches: Batches = [
        [("trades", e) for e in trades[:20]] + [("cti", c) for c in ctis[:4]],
        [("trades", e) for e in trades[20:50]] + [("cti", c) for c in ctis[4:6]],
        [("trades", e) for e in trades[50:]],
        [("cti", c) for c in ctis[6:]] + [("cti", {"ts": 200})],
    ]
    inputs = ["trades", "cti"]
    arrival = sorted(
        (row["ts"], inputs.index(name), b, i, (name, row))
        for b, batch in enumerate(batches)
        for i, (name, row) in enumerate(batch)
    )
    runs_: list[list[tuple[str, Row]]] = [[]]
    for *_, event in arrival:
        runs_[-1].append(event)
        if event[0] == "cti":
            runs_.append([])
    assert runs_[-1] == []
    outputs, tables, failed = serial(
        runs_[:-1], {"trades": trade, "cti": snapshot}, {"pos": "acct"}
    )
    assert failed >= 1 and outputs["snapshots"]
    schemas = {"trades": "acct long, qty long, ts long", "cti": "ts long"}
    runs = run_both(spark, tmp_path, punctuated_job, schemas, batches)
    key = lambda r: (r["at"], r["acct"])  # noqa: E731
    for where in ("local", "spark"):
        got = committed(runs[where], ["snapshots"], 2)
        assert sorted(got["outputs"]["snapshots"], key=key) == sorted(outputs["snapshots"], key=key)
        assert got["tables"]["pos"] == tables["pos"], where
        assert got["failed"] == failed, where
    rows = sum(len(b) for b in batches)  # each runs once, held or not; none is held at the end
    assert sum(p["numInputRows"] for p in runs["spark_progress"]) == rows
    assert runs["spark_progress"][-1]["held"] == 0


# -- the mistakes a user makes: one readable line each ---------------------------------
def take(t: Any, e: Row) -> None:
    t.insert("stock", {"sku": e["sku"], "qty": e["n"] + 0})


def shop(source: Any = None, **table: Any) -> Any:
    return (
        tx.Job("shop")
        .table("stock", key="sku", schema="sku string, qty long", **table)
        .input("ops", source, keys="sku", order="seq")
        .output("seen", schema="sku string, found boolean")
        .on("ops", take)
    )


def lookup(t: Any, e: Row) -> None:
    t.emit("seen", {"sku": str(e["sku"]), "found": t.read("stock", e["sku"]) is not None})


def test_a_read_by_a_key_of_another_type_than_the_tables_is_an_error_not_a_miss(
    tmp_path: Path,
) -> None:
    # The events carry sku 5 (a number) where the table's key column is a string:
    # the read never finds "5", and used to answer "no row" for every event.
    job = shop(initial=[{"sku": "5", "qty": 1}]).on("ops", lookup)
    job.run_local(
        [[("ops", {"sku": 5, "n": 1, "seq": 1}), ("ops", {"sku": "5", "seq": 2})]], tmp_path / "s"
    )
    assert [(f["position"], f["error"]) for f in tx.read_failures(tmp_path / "s")] == [
        ("ops#0", "SchemaError: read of stock by key: column 'sku' is string, got 5")
    ]
    assert tx.read_output(tmp_path / "s", "seen") == [{"sku": "5", "found": True}]
    # a table without a schema cannot tell: a miss is a miss
    tx.Job("loose").table("t", key="k").input("e", None, keys="k").output("o").on(
        "e", lambda t, e: t.emit("o", {"found": t.read("t", e["k"]) is not None})
    ).run_local([[("e", {"k": 5})]], tmp_path / "l")
    assert tx.read_output(tmp_path / "l", "o") == [{"found": False}]


def test_user_mistakes_on_spark_give_one_line_each(spark: Any, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.json").write_text(
        '{"sku": "a", "n": 1, "seq": 1}\n'
        '{"sku": "b", "n": "many", "seq": 2}\n'  # not a long: the JSON source reads null
        '{"n": 1, "seq": 3}\n'  # no key
        '{"sku": "c", "n": 2, "seq": 4}\n'
    )
    df = spark.readStream.schema("sku string, n long, seq long").json(str(folder))

    def one_line(error: pytest.ExceptionInfo[BaseException], pattern: str) -> None:
        assert isinstance(error.value, tx.TxStreamError)
        assert "\n" not in str(error.value)
        assert pattern in str(error.value), str(error.value)

    with pytest.raises(tx.RuntimeJobError) as error:
        shop(df).option("partition", 2)
    one_line(error, "unknown option 'partition'; choose one of")
    with pytest.raises(tx.RuntimeJobError) as error:
        shop(df).boundary("timeslice", second=10, of="ops")
    one_line(error, "boundary 'timeslice': unknown option 'second'")
    with pytest.raises(tx.RuntimeJobError) as error:  # 0 used to mean "Spark's default"
        shop(df).start(tmp_path / "c0", spark=spark, partitions=0)
    one_line(error, "start partitions must be an integer 1..4096, not 0")
    with pytest.raises(tx.RuntimeJobError) as error:
        shop(spark.readStream.schema("sku string, n long").json(str(folder))).start(
            tmp_path / "c1", spark=spark
        )
    one_line(error, "order column 'seq' is not in its schema (sku, n)")
    # Two initial rows with one key: run_local refuses them, Spark kept one of them.
    with pytest.raises(tx.TxStreamError) as error:
        shop(df, initial=[{"sku": "x", "qty": 1}, {"sku": "x", "qty": 2}]).start(
            tmp_path / "c2", spark=spark
        )
    one_line(error, "table 'stock': initial rows repeat the key 'x'")
    assert not spark.streams.active

    # Rows with a null key or a value of the wrong type are reported, the others commit.
    query = shop(df).start(tmp_path / "ck", spark=spark)
    try:
        with pytest.raises(tx.StoreLockedError) as error:  # start twice
            shop(df).start(tmp_path / "ck", spark=spark)
        one_line(error, "is in use by pid")
        # The same job on another checkpoint: refused before Spark is asked (Spark's own
        # refusal came after the job's first Spark jobs, and made the running query's
        # thread die of a StackOverflowError when it stopped).
        with pytest.raises(tx.RuntimeJobError) as error:
            shop(df).start(tmp_path / "ck2", spark=spark)
        one_line(error, "job 'shop' is already running in this Spark session")
        query.processAllAvailable()
        with pytest.raises(tx.RuntimeJobError) as error:
            query.output("sold")
        one_line(error, "declared no output 'sold'; outputs: seen")
    finally:
        query.stop()
    assert [f["error"] for f in tx.read_failures(tmp_path / "ck")] == [
        "TypeError: unsupported operand type(s) for +: 'NoneType' and 'int'",
        "SchemaError: the event has a null key; it was not run",
    ]
    assert local_tables(tmp_path / "ck" / "txstream", 2)["stock"] == {
        "a": {"sku": "a", "qty": 1},
        "c": {"sku": "c", "qty": 2},
    }
    with pytest.raises(tx.TxStreamError) as error:
        tx.read_output(tmp_path / "ck", "sold")
    one_line(error, "the job declared no output 'sold'; outputs: seen")
    with pytest.raises(tx.TxStreamError) as error:
        tx.read_output(tmp_path / "ckk", "seen")
    one_line(error, "not a txstream checkpoint or store")


# -- job 5: pairs of seats booked together, 5-second transactions by event time ---------
def book(t: Any, e: Row) -> None:
    if e["a"] < 0 or e["b"] < 0:
        raise ValueError(f"booking {e['id']}: no seat {min(e['a'], e['b'])}")
    free = all(t.read("seats", s) is None for s in (e["a"], e["b"]))
    if free:
        for s in (e["a"], e["b"]):
            t.insert("seats", {"seat": s, "booking": e["id"]})
    t.emit("answers", {"id": e["id"], "ok": free})


def cancel(t: Any, e: Row) -> None:
    row = t.read("seats", e["seat"])
    if row is not None:  # cancels the whole booking: its other seat is seat +- 1
        for s in (e["seat"] - 1, e["seat"], e["seat"] + 1):
            other = t.read("seats", s)
            if other is not None and other["booking"] == row["booking"]:
                t.delete("seats", s)
        t.emit("cancelled", {"booking": row["booking"]})


def seats_job(sources: dict[str, Any]) -> Any:
    return (
        tx.Job("seats")
        .table("seats", key="seat", schema="seat long, booking long")
        .input("bookings", sources["bookings"], keys=["a", "b"], order="ts")
        .input("cancels", sources["cancels"], keys=[("seat",), ("left",), ("right",)], order="ts")
        .output("answers", schema="id long, ok boolean")
        .output("cancelled", schema="booking long")
        .boundary("seconds", seconds=5)
        .option("merge", "event-time")
        .on("bookings", book)
        .on("cancels", cancel)
    )


def test_seat_pairs_in_five_second_transactions_equal_serial_execution_by_time(
    spark: Any, tmp_path: Path
) -> None:
    rng = random.Random(12)
    bookings = []
    for i, ts in enumerate(sorted(rng.choices(range(60), k=60))):
        a = rng.randrange(12)
        bookings.append({"id": i, "a": a, "b": a + 1, "ts": ts})
    bookings[40]["b"] = -1  # a bad booking: its whole 5-second transaction rolls back
    cancels = [
        {"seat": s, "left": s - 1, "right": s + 1, "ts": ts}
        for s, ts in zip(
            rng.choices(range(13), k=15), sorted(rng.choices(range(60), k=15)), strict=True
        )
    ]
    # (The inputs end after the last batch: no closing booking is needed to release
    # the last slice on Spark any more.)
    batches: Batches = [
        [("bookings", b) for b in bookings[:25]] + [("cancels", c) for c in cancels],
        [("bookings", b) for b in bookings[25:]],
    ]
    inputs = ["bookings", "cancels"]
    arrival = sorted(
        (row["ts"], inputs.index(name), n, i, (name, row))
        for n, batch in enumerate(batches)
        for i, (name, row) in enumerate(batch)
    )
    slices: dict[int, list[tuple[str, Row]]] = {}
    for ts, *_, event in arrival:
        slices.setdefault(ts // 5, []).append(event)
    outputs, tables, failed = serial(
        list(slices.values()), {"bookings": book, "cancels": cancel}, {"seats": "seat"}
    )
    assert failed == 1 and outputs["cancelled"] and not all(r["ok"] for r in outputs["answers"])
    schemas = {
        "bookings": "id long, a long, b long, ts long",
        "cancels": "seat long, left long, right long, ts long",
    }
    with pytest.warns(tx.TransactionFailuresWarning, match="1 transaction"):
        runs = run_both(spark, tmp_path, seats_job, schemas, batches)
    for where in ("local", "spark"):
        got = committed(runs[where], ["answers", "cancelled"], 2)
        for name in ("answers", "cancelled"):  # a slice's parts' rows come by partition
            assert sorted(map(str, got["outputs"][name])) == sorted(map(str, outputs[name]))
        assert got["tables"]["seats"] == tables["seats"], where
        assert got["failed"] == failed, where
    assert sum(p["deferred"] for p in runs["spark_progress"]) > 0
