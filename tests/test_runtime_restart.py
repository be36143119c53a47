"""Restarting a job on its store with a changed declaration: it works, or it is refused.

A restart that reads the store differently (another key, inputs in another
place, order values in other terms) would run on silently wrong state, so it
is refused in one line naming the change; the rest (functions, outputs, new
tables) works.  Run with ``run_local``, which checks a store as ``start``
checks a checkpoint (``test_a_restart_on_spark_...`` in test_runtime_spark.py
runs the Spark side).
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

import pytest

import txstream as tx


def add(t: tx.Tx, e: dict[str, Any]) -> None:
    if t.read("counts", e["k"]) is None:
        t.insert("counts", {"k": e["k"], "j": e.get("j", 0), "n": 0})
    t.emit("seen", {"k": e["k"], "n": t.increment("counts", e["k"], "n", 1)})


def counting(
    key: Any = "k",
    partition_by: Any = None,
    inputs: tuple[str, ...] = ("ev", "tick"),
    order: str = "ts",
    merge: str = "batch",
    boundary: tuple[str, dict[str, Any]] = ("event", {}),
    outputs: tuple[str, ...] = ("seen",),
    fn: Any = add,
) -> tx.Job:
    """Counts events per key; ``tick`` (no keys) is the timeslice's input."""
    job = tx.Job("counting").table("counts", key=key, partition_by=partition_by)
    for name in inputs:
        keyed = name != "tick"
        job.input(name, None, keys="k" if keyed else (), order=order if keyed else "ts")
        job.on(name, fn if keyed else (lambda t, e: None))
    for name in outputs:
        job.output(name)
    return job.boundary(boundary[0], **boundary[1]).option("merge", merge)


def ev(k: int, ts: float, name: str = "ev") -> tuple[str, dict[str, Any]]:
    return (name, {"k": k, "j": 0, "ts": ts, "at": ts})


FIRST = [[ev(1, 1), ev(2, 2), ("tick", {"ts": 2.5})]]


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        (
            counting(key=["k", "j"], partition_by="k"),
            r"^table 'counts' was declared in store \S+ with key \['k'\] \(partition_by \['k'\]\);"
            r" the job declares key \['k', 'j'\] \(partition_by \['k'\]\): its rows are stored "
            r"by that key and placed by that partition value; declare it as before, or start "
            r"on a new store$",
        ),
        (
            counting(inputs=("tick", "ev")),
            r"^store \S+ was started with inputs \['ev', 'tick'\]; the job declares \['tick', "
            r"'ev'\]: a restart keeps the inputs, their names and their order",
        ),
        (counting(inputs=("events", "tick")), r"the job declares \['events', 'tick'\]"),
        (counting(inputs=("ev", "tick", "more")), r"the job declares \['ev', 'tick', 'more'\]"),
        (
            counting().table("limits", key="k", initial=[{"k": 1, "max": 3}]),
            r"^table 'limits' is new in store \S+ and declares initial rows, which load only "
            r"before the first batch commits; leave initial out",
        ),
    ],
    ids=["key", "inputs-reordered", "input-renamed", "input-added", "new-table-with-initial"],
)
def test_a_restart_that_reads_the_store_differently_is_refused_in_one_line(
    tmp_path: Path, changed: tx.Job, message: str
) -> None:
    counting().run_local(FIRST, tmp_path)
    with pytest.raises(tx.RuntimeJobError, match=message):
        changed.run_local([[ev(1, 3)]], tmp_path)
    counting().run_local([[ev(1, 3)]], tmp_path)  # the store is as it was
    assert [r["n"] for r in tx.read_output(tmp_path, "seen")] == [1, 1, 2]


def test_a_restart_with_other_functions_outputs_and_tables_works(tmp_path: Path) -> None:
    counting().run_local(FIRST, tmp_path)

    def twice(t: tx.Tx, e: dict[str, Any]) -> None:  # a new version of the function
        add(t, e)
        add(t, e)
        t.emit("audit", {"k": e["k"]})
        t.upsert("notes", {"k": e["k"], "text": "seen"})

    upgraded = counting(fn=twice, outputs=("seen", "audit")).table("notes", key="k")
    upgraded.run_local([[ev(1, 3)]], tmp_path)
    assert [r["n"] for r in tx.read_output(tmp_path, "seen")] == [1, 1, 2, 3]
    # The output added at the restart reads like the first ones (it was refused
    # as "the job declared no output 'audit'").
    assert tx.read_output(tmp_path, "audit") == [{"k": 1}]
    counting().run_local([[ev(2, 4)]], tmp_path)  # "notes" and "audit" left out: fine
    assert tx.read_output(tmp_path, "audit") == [{"k": 1}]
    with pytest.raises(tx.RuntimeJobError, match=r"^table 'notes' was declared in store .* with"):
        counting().table("notes", key="text").run_local([[ev(2, 5)]], tmp_path)


def test_a_restart_may_not_leave_the_event_time_merge_while_it_holds_events(
    tmp_path: Path,
) -> None:
    # "more" has reached 1 only: ev's event at 5 is held for it.  Under batch
    # order nothing would ever release it: its count was silently lost.
    two = ("ev", "more")
    counting(inputs=two, merge="event-time").run_local(
        [[ev(1, 5), ev(2, 1, "more")]], tmp_path, end_inputs=False
    )
    with pytest.raises(
        tx.RuntimeJobError,
        match=r"^store \S+ holds 1 event\(s\) for the event-time merge, which merge='batch' "
        r"would never run; restart with merge='event-time' until they are released",
    ):
        counting(inputs=two).run_local([[ev(1, 6)]], tmp_path)
    counting(inputs=two, merge="event-time").run_local(
        [[ev(2, 9, "more")]], tmp_path, end_inputs=False
    )
    counting(inputs=two).run_local([[ev(1, 6)]], tmp_path)  # nothing held: fine
    seen = [(r["k"], r["n"]) for r in tx.read_output(tmp_path, "seen")]
    assert seen == [(2, 1), (1, 1), (2, 2), (1, 2)]


def test_a_restart_may_not_read_kept_order_values_in_other_terms(tmp_path: Path) -> None:
    # The timeslice clock is kept in slices of the first start's seconds: with
    # slices of 1 s, every tick of slice 2 was aborted as late against slice 20.
    ticks = [[("tick", {"ts": 25.0}), ev(1, 26)]]
    tenths = counting(boundary=("timeslice", {"seconds": 10, "of": "tick"}))
    tenths.run_local(ticks, tmp_path / "slices")
    with pytest.raises(
        tx.RuntimeJobError,
        match=r"^the partitions of store \S+ keep the timeslice clock in slices of 10 s; the job "
        r"declares slices of 1 s, against which events would be judged late; keep seconds=10",
    ):
        counting(boundary=("timeslice", {"seconds": 1, "of": "tick"})).run_local(
            [[("tick", {"ts": 27.0})]], tmp_path / "slices"
        )
    tenths.run_local([[("tick", {"ts": 31.0})]], tmp_path / "slices")
    assert tx.read_failures(tmp_path / "slices") == []
    # The event-time merge keeps each input's order values (its frontier, held
    # events): another order column is refused; under batch order it is fine.
    counting(merge="event-time").run_local(FIRST, tmp_path / "merge")
    with pytest.raises(tx.RuntimeJobError, match=r"^input 'ev' was ordered by 'ts' in store \S+, "):
        counting(merge="event-time", order="at").run_local([[ev(1, 3)]], tmp_path / "merge")
    counting().run_local(FIRST, tmp_path / "batch")
    counting(order="at").run_local([[ev(1, 3)]], tmp_path / "batch")
    assert [r["n"] for r in tx.read_output(tmp_path / "batch", "seen")] == [1, 1, 2]


# -- a table's declared columns ---------------------------------------------------------
def balances(schema: str | None, output_schema: str | None = None) -> tx.Job:
    """Deposits into accounts of a table declared with ``schema``."""

    def deposit(t: tx.Tx, e: dict[str, Any]) -> None:
        if t.read("accounts", e["acct"]) is None:
            t.insert("accounts", {"acct": e["acct"], "balance": 0})
        t.emit("balances", {"balance": t.increment("accounts", e["acct"], "balance", e["n"])})

    return (
        tx.Job("bank")
        .table("accounts", key="acct", schema=schema)
        .input("deposits", None, keys="acct", order="ts")
        .on("deposits", deposit)
        .output("balances", schema=output_schema)
    )


SCHEMA = "acct long, balance long"
DEPOSITS = [[("deposits", {"acct": 1, "n": 5, "ts": 1})]]


@pytest.mark.parametrize(
    ("schema", "change"),
    [
        ("acct string, balance long", "column 'acct': long -> string"),
        ("acct long, balance double", "column 'balance': long -> double"),
        ("acct long, balance long, owner string", "column 'owner' added"),
        ("acct long", "column 'balance' removed"),
        (None, "the schema left out"),
    ],
    ids=["key-type", "column-type", "column-added", "column-removed", "schema-left-out"],
)
def test_a_restart_with_other_table_columns_is_refused_in_one_line(
    tmp_path: Path, schema: str | None, change: str
) -> None:
    balances(SCHEMA).run_local(DEPOSITS, tmp_path)
    with pytest.raises(tx.RuntimeJobError) as refused:
        balances(schema).run_local(DEPOSITS, tmp_path)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"table 'accounts' was declared in store {tmp_path} with schema 'acct long, balance "
        f"long'; the job declares "
    )
    assert f"({change}): its stored rows were written and keyed under the old declaration" in (
        message
    )
    assert message.endswith("declare it as before, or start on a new store")
    balances(SCHEMA).run_local(DEPOSITS, tmp_path)  # the store is as it was
    assert tx.read_output(tmp_path, "balances") == [{"balance": 5}, {"balance": 10}]


@pytest.mark.parametrize(
    ("first", "then", "change"),
    [
        ("balance long", "balance double", "column 'balance': long -> double"),
        ("balance long", None, "the schema left out"),
        (None, "balance long", "a schema added"),
    ],
)
def test_a_restart_with_other_output_columns_is_refused_in_one_line(
    tmp_path: Path, first: str | None, then: str | None, change: str
) -> None:
    # The output's committed rows keep the old columns: one output, two shapes
    # (read_output_arrow refused it, pandas made an object column), without a word.
    def job(schema: str | None) -> tx.Job:
        return balances(SCHEMA, output_schema=schema)

    job(first).run_local(DEPOSITS, tmp_path)
    with pytest.raises(tx.RuntimeJobError) as refused:
        job(then).run_local(DEPOSITS, tmp_path)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("output 'balances' was declared in store")
    assert f"({change}): its committed rows have the old columns" in message
    job(first).run_local(DEPOSITS, tmp_path)  # as before: fine
    job(first).output("other", schema="x long").run_local(DEPOSITS, tmp_path)  # a new output: fine
    assert [r["balance"] for r in tx.read_output(tmp_path, "balances")] == [5, 10, 15]


def test_a_schema_added_to_a_table_without_one_is_refused(tmp_path: Path) -> None:
    balances(None).run_local(DEPOSITS, tmp_path)
    with pytest.raises(tx.RuntimeJobError, match=r"with no schema; .* \(a schema added\)"):
        balances(SCHEMA).run_local(DEPOSITS, tmp_path)


def test_type_synonyms_and_column_order_are_the_same_columns(tmp_path: Path) -> None:
    balances(SCHEMA).run_local(DEPOSITS, tmp_path)
    balances("balance int, acct bigint").run_local(DEPOSITS, tmp_path)
    assert tx.read_output(tmp_path, "balances") == [{"balance": 5}, {"balance": 10}]


def test_a_store_that_recorded_no_columns_records_them_at_its_restart(tmp_path: Path) -> None:
    balances(SCHEMA).run_local(DEPOSITS, tmp_path)
    meta_path = tmp_path / "job.json"
    meta = json.loads(meta_path.read_text())
    del meta["tables"]["accounts"]["columns"]  # as a store of an older version wrote it
    del meta["crc"], meta["placement"]  # (which wrote neither a checksum nor a placement)
    meta_path.write_text(json.dumps(meta))
    balances("acct long, balance long").run_local(DEPOSITS, tmp_path)  # loads, records
    assert json.loads(meta_path.read_text())["tables"]["accounts"]["columns"] == {
        "acct": "long",
        "balance": "long",
    }
    with pytest.raises(tx.RuntimeJobError, match=r"column 'acct': long -> string"):
        balances("acct string, balance long").run_local(DEPOSITS, tmp_path)


def _stock(initial: Any = None) -> tx.Job:
    def put(t: tx.Tx, e: dict[str, Any]) -> None:
        t.upsert("stock", {"sku": e["sku"], "qty": e["qty"]})

    return (
        tx.Job("stock")
        .table("stock", key="sku", schema="sku string, qty long", initial=initial)
        .input("ev", None, keys="sku")
        .on("ev", put)
    )


START = [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 2}]


@pytest.mark.parametrize(
    ("first", "later", "message"),
    [
        (None, START, r"declares initial rows, but had none when the first batch committed"),
        (START, START[:1], r"declares other initial rows than those loaded before the first"),
        (START, [{**START[0], "qty": 5}, START[1]], r"declares other initial rows than"),
    ],
    ids=["added", "row-removed", "row-changed"],
)
def test_initial_rows_added_or_changed_after_the_first_batch_are_refused_not_ignored(
    tmp_path: Path, first: Any, later: Any, message: str
) -> None:
    # They load only before the first batch commits: before the fix a restart
    # that added or changed them went on without them, silently.
    _stock(first).run_local([[("ev", {"sku": "c", "qty": 3})]], tmp_path)
    with pytest.raises(tx.RuntimeJobError, match=rf"^table 'stock' {message}.*new store$"):
        _stock(later).run_local([[("ev", {"sku": "d", "qty": 4})]], tmp_path)
    _stock(first).run_local([[("ev", {"sku": "d", "qty": 4})]], tmp_path)  # as before: fine
    _stock().run_local([[("ev", {"sku": "e", "qty": 5})]], tmp_path)  # left out: fine
    _stock(first).run_local([[]], tmp_path)  # and declared again as loaded: fine
    assert [r["sku"] for r in tx.read_table(tmp_path, "stock")] == [
        *(r["sku"] for r in first or ()),
        "c",
        "d",
        "e",
    ]


def test_initial_rows_from_a_file_are_compared_by_content(tmp_path: Path) -> None:
    # (start takes a file; run_local only lists: the digest both record, compared alike)
    from txstream.spark.runtime.restart import initial_fingerprint

    rows = tmp_path / "stock.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in START))
    first = initial_fingerprint(str(rows))
    rows.write_text(rows.read_text())  # written again, the same rows
    assert initial_fingerprint(rows) == first
    rows.write_text(json.dumps(START[0]) + "\n")
    assert initial_fingerprint(str(rows)) not in (first, "unknown", None)
    assert initial_fingerprint(str(tmp_path / "missing.json")) == "unknown"


def test_the_same_initial_rows_in_another_order_are_the_same_rows(tmp_path: Path) -> None:
    # A list built from a set or a dict comes in another order in another process
    # (string hashing): a restart of the unchanged job was refused (review, session 20).
    _stock(START).run_local([[("ev", {"sku": "c", "qty": 3})]], tmp_path)
    _stock(START[::-1]).run_local([[("ev", {"sku": "d", "qty": 4})]], tmp_path)
    from txstream.spark.runtime.restart import initial_fingerprint

    tagged = [{**r, "tags": {"a", "b", "c"}} for r in START]
    assert initial_fingerprint(tagged) == initial_fingerprint(
        [{**r, "tags": {"c", "a", "b"}} for r in reversed(START)]
    )
    assert initial_fingerprint(START) != initial_fingerprint(START[:1])


def test_true_and_1_are_one_row_on_every_partition_count(tmp_path: Path) -> None:
    # Python makes True and 1 one dict key, so one partition kept one row; placed
    # by the texts "true" and "1" they met on 1, 2, 3, 6 partitions and were two
    # rows on 4, 5, 7, 8: an answer that depended on the partition count.
    events = [("ev", {"k": 1, "ts": 0}), ("ev", {"k": True, "ts": 1}), ("ev", {"k": 1, "ts": 2})]
    for partitions in range(1, 9):
        store = tmp_path / f"p{partitions}"
        counting(inputs=("ev",)).run_local([events], store, partitions=partitions)
        assert tx.read_table(store, "counts") == [{"k": 1, "j": 0, "n": 3}], partitions
        assert [r["n"] for r in tx.read_output(store, "seen")] == [1, 2, 3], partitions


def test_a_store_placed_by_the_old_rule_is_refused_only_if_a_bool_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from txstream.spark.runtime import partitioning

    new_rule = partitioning.canonical

    def old_rule(value: Any) -> str:  # (txstream before placement 2)
        if isinstance(value, bool):
            return "true" if value else "false"
        return new_rule(value)

    def old_store(path: Path, key: Any) -> None:
        with monkeypatch.context() as patched:
            patched.setattr(partitioning, "canonical", old_rule)
            counting(inputs=("ev",)).run_local([[("ev", {"k": key, "ts": 0})]], path, partitions=4)
        meta = json.loads((path / "job.json").read_text())
        del meta["placement"], meta["crc"]  # (neither written then)
        (path / "job.json").write_text(json.dumps(meta))

    old_store(tmp_path / "ints", 5)  # no bool: restarts, and records the new rule
    counting(inputs=("ev",)).run_local(
        [[("ev", {"k": 5, "ts": 1})]], tmp_path / "ints", partitions=4
    )
    assert tx.read_table(tmp_path / "ints", "counts") == [{"k": 5, "j": 0, "n": 2}]
    assert json.loads((tmp_path / "ints" / "job.json").read_text())["placement"] == 2
    # The old rule put True on another partition of 4 than the new one looks on.
    assert zlib.crc32(b"true") % 4 != partitioning.partition_of(True, 4)
    old_store(tmp_path / "bools", True)
    with pytest.raises(tx.TxStreamError, match=r"placed boolean partition values.*value True"):
        counting(inputs=("ev",)).run_local(
            [[("ev", {"k": 1, "ts": 1})]], tmp_path / "bools", partitions=4
        )
