"""A new user's own programs against the transaction manager: durable values, the
store's folder, bad input, concurrent transfers against a serial oracle.

Each test here failed before the fix it names; see the commit that added it (to
tests/test_users_7.py, which was split by subject into this file and two others).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.errors import TxStreamError
from txstream.storage import StorageError
from txstream.txn import TransactionManager

# -- durable values must come back as they were committed -----------------------------


def _reopen_rows(path, table: str, keys: list) -> dict:
    tm = TransactionManager(path=path, sync="off")
    try:
        t = tm.table(table)
        return {k: t.read(k) for k in keys}
    finally:
        tm.close()


@pytest.mark.parametrize(
    "row",
    [{3: "x"}, {"a": {None: 1}}, [{1.5: 2}], {"ok": [1, {True: 0}]}],
    ids=["int-key", "nested-none-key", "float-key-in-list", "bool-key-deep"],
)
def test_a_row_whose_mapping_keys_json_would_rename_is_refused_not_changed(tmp_path, row) -> None:
    # json.dumps turns the key 3 into "3": after a restart the row would read
    # back as {"3": "x"}, a silently different value.
    tm = TransactionManager(path=tmp_path, sync="off")
    rows = tm.table("rows")
    with tm.begin() as t:
        t.put(rows, "kept", {"a": 1})
    with pytest.raises(StorageError, match="not a string"), tm.begin() as t:
        t.put(rows, "bad", row)
    assert rows.read("bad") is None  # rolled back
    tm.close()
    assert _reopen_rows(tmp_path, "rows", ["kept", "bad"]) == {"kept": {"a": 1}, "bad": None}


def test_events_and_offsets_with_non_string_keys_are_refused(tmp_path) -> None:
    tm = TransactionManager(path=tmp_path, sync="off")
    s = tm.stream("s")
    with pytest.raises(StorageError, match="not a string"), tm.begin() as t:
        t.append(s, {7: "event"})
    with pytest.raises(TxStreamError, match="string"), tm.begin() as t:
        t.commit_offset(3, 10)  # would come back as offset("3"), offset(3) lost
    with pytest.raises(StorageError, match="not a string"), tm.begin() as t:
        t.commit_offset("src", {1: 2})
    with tm.begin() as t:
        t.append(s, {"7": "event"})
        t.commit_offset("src", 10)
    tm.close()
    tm = TransactionManager(path=tmp_path, sync="off")
    with tm.begin(read_only=True) as t:
        assert t.scan("s") == [{"7": "event"}]
    assert tm.offset("src") == 10
    tm.close()


@pytest.mark.parametrize("depth", [300, 985, 5000])
def test_a_value_nested_too_deeply_is_refused_at_commit_not_at_recovery(tmp_path, depth) -> None:
    # Before: 5000 levels raised RecursionError out of commit; 985 levels
    # committed, checkpointed, and then the store could not be opened again
    # ("checkpoint is damaged: nested too deeply").
    tm = TransactionManager(path=tmp_path, sync="off")
    rows = tm.table("rows")
    value: object = 1
    for _ in range(depth):
        value = [value]
    with pytest.raises(StorageError, match="nested"), tm.begin() as t:
        t.put(rows, "deep", value)
    with tm.begin() as t:
        t.put(rows, "flat", [[[1]]])
    tm.checkpoint()
    tm.close()
    assert _reopen_rows(tmp_path, "rows", ["deep", "flat"]) == {"deep": None, "flat": [[[1]]]}


json_keys = st.one_of(st.text(max_size=3), st.integers(-5, 5), st.none(), st.booleans())
json_values = st.recursive(
    st.one_of(st.integers(-(10**6), 10**6), st.text(max_size=4), st.booleans(), st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(json_keys, inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=40, deadline=None)
@given(value=json_values)
def test_a_durable_row_reads_back_equal_or_is_refused(tmp_path_factory, value) -> None:
    path = tmp_path_factory.mktemp("store")
    tm = TransactionManager(path=path, sync="off")
    rows = tm.table("rows")
    try:
        with tm.begin() as t:
            t.put(rows, "k", value)
    except StorageError:
        tm.close()
        assert _reopen_rows(path, "rows", ["k"]) == {"k": None}
        return
    tm.close()
    assert _reopen_rows(path, "rows", ["k"]) == {"k": value}


# -- the store's directory: an empty path, a wrong type, a closed store ------------------


@pytest.mark.parametrize("path", ["", 3, b"/tmp", ["x"]])
def test_a_store_path_that_names_no_directory_is_one_line(tmp_path, monkeypatch, path) -> None:
    # path="" used to make a durable store in the current folder (LOCK and
    # wal.log appeared there); path=3 raised TypeError.
    from txstream.loading import EmbeddedTarget
    from txstream.loading.workloads import demand_schema

    monkeypatch.chdir(tmp_path)
    with pytest.raises(TxStreamError, match="path"):
        TransactionManager(path=path)
    with pytest.raises(TxStreamError, match="path"):
        EmbeddedTarget(demand_schema(), path=path).setup()
    assert list(tmp_path.iterdir()) == []


def test_a_closed_durable_store_refuses_commits_instead_of_keeping_them_in_memory(
    tmp_path,
) -> None:
    tm = TransactionManager(path=tmp_path, sync="off")
    acct = tm.table("acct")
    with tm.begin() as t:
        t.put(acct, "a", 100)
    tm.close()
    # Before: this committed in memory only and vanished at the next open.
    with pytest.raises(StorageError, match="closed"), tm.begin() as t:
        t.put(acct, "a", 50)
    assert acct.read("a") == 100  # rolled back
    with pytest.raises(StorageError, match="closed"):
        tm.run(lambda t: t.commit_offset("src", 9))
    with pytest.raises(StorageError, match="closed"):
        tm.table("new_table")
    with pytest.raises(StorageError, match="closed"):
        tm.checkpoint()
    with tm.begin(read_only=True) as t:  # reading what it held still works
        assert t.read(acct, "a") == 100
    tm.close()  # twice is fine
    tm2 = TransactionManager(path=tmp_path, sync="off")
    assert tm2.table("acct").read("a") == 100
    assert tm2.offset("src") is None
    tm2.close()


# -- bad input to the transaction manager: one TxStreamError line ---------------------


def _txn_bad_inputs(tm: TransactionManager) -> list:
    acct = tm.table("acct")
    ev = tm.stream("ev", order_by="ts", require_order=True)
    with tm.begin() as t:
        t.put(acct, 1, 10)
        t.append(ev, {"ts": 5})

    def in_txn(fn):
        def run() -> None:
            t = tm.begin()
            try:
                fn(t)
            finally:
                if t.status == "active":
                    t.abort()

        return run

    return [
        lambda: tm.run(lambda t: 1, retries=-1),
        lambda: tm.run(lambda t: 1, retries="3"),
        lambda: tm.run(lambda t: 1, retries=None),
        lambda: tm.run(lambda t: 1, retries=True),
        lambda: tm.run(None),
        lambda: tm.begin(retry_of=3),
        lambda: tm.read(3, acct, 1),
        lambda: tm.write("t", acct, 1, 2),
        lambda: tm.commit(None),
        lambda: tm.abort(object()),
        lambda: tm.give_up(5),
        lambda: tm.commit_and_continue(tm.begin(read_only=True), None),
        lambda: tm.commit_and_continue(tm.begin(read_only=True), 3),
        lambda: TransactionManager(["ss2pl"]),
        lambda: TransactionManager({"p": 1}),
        lambda: TransactionManager(record=3),
        lambda: TransactionManager(record=[1]),
        in_txn(lambda t: t.read(acct, [1])),
        in_txn(lambda t: t.put(acct, {1: 2}, 3)),
        in_txn(lambda t: t.increment(acct, [1], 1)),
        in_txn(lambda t: t.append(ev, {"ts": "late"})),  # str vs int
        in_txn(lambda t: t.append(ev, {"ts": float("nan")})),
        in_txn(lambda t: t.append(ev, {"ts": None})),
        in_txn(lambda t: t.scan(ev, "a")),
        in_txn(lambda t: t.scan(ev, 1.5)),
        in_txn(lambda t: t.scan(ev, 0, "b")),
        in_txn(lambda t: t.scan(ev, True)),
        in_txn(lambda t: t.commit_offset(None, 1)),
    ]


@pytest.mark.parametrize("protocol", ["ss2pl", "optimistic", "snapshot", "none"])
def test_bad_input_to_the_transaction_manager_is_one_line(protocol) -> None:
    tm = TransactionManager(protocol)
    for k, bad in enumerate(_txn_bad_inputs(tm)):
        with pytest.raises(TxStreamError) as info:
            bad()
        assert "\n" not in str(info.value), k
    # and the manager still works: the events and rows are as they were
    with tm.begin() as t:
        t.increment("acct", 1, 5)
        t.append("ev", {"ts": 6})
    with tm.begin(read_only=True) as t:
        assert t.read("acct", 1) == 15
        assert t.scan("ev") == [{"ts": 5}, {"ts": 6}]


def test_nan_cannot_switch_off_a_streams_order_check() -> None:
    # Before: an event with ts=NaN was accepted, and after it every ts was
    # (x < nan is False), so the stream lost its order silently.
    from txstream.storage import OrderError

    tm = TransactionManager()
    ev = tm.stream("ev", order_by="ts", require_order=True)
    with tm.begin() as t:
        t.append(ev, {"ts": 5})
    with pytest.raises(OrderError), tm.begin() as t:
        t.append(ev, {"ts": float("nan")})
    with pytest.raises(OrderError), tm.begin() as t:
        t.append(ev, {"ts": 1})


# -- end to end: concurrent transfers against a serial oracle -------------------------


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    setup=st.sampled_from(
        [
            ("ss2pl", False),
            ("ss2pl", True),
            ("optimistic", False),
            ("optimistic", True),
            ("snapshot", False),
        ]
    ),
)
def test_concurrent_transfers_equal_the_serial_oracle(seed, setup) -> None:
    """Threads move money between accounts (read both, write both if covered).

    The recorded history must pass cs (csao when ordered), and replaying the
    transfers serially in the checker's serial order must give the final state.
    """
    import random
    import threading
    import time

    from txstream.model import check

    protocol, ordered = setup
    tm = TransactionManager(protocol, ordered=ordered, record=True)
    acct = tm.table("acct")
    with tm.begin() as t:
        for i in range(4):
            t.insert(acct, i, 50)
    work_of: dict[str, tuple[int, int, int]] = {}

    def worker(w: int) -> None:
        rng = random.Random(seed * 10 + w)
        for _ in range(25):
            a, b = rng.sample(range(4), 2)
            amount = rng.randint(1, 40)

            def transfer(t, a=a, b=b, amount=amount) -> None:
                work_of[t.hid] = (a, b, amount)
                x = t.read(acct, a)
                time.sleep(0)
                y = t.read(acct, b)
                if x >= amount:
                    t.update(acct, a, x - amount)
                    time.sleep(0)
                    t.update(acct, b, y + amount)

            tm.run(transfer, retries=10_000)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    verdict = check(tm.history(), "csao" if ordered else "cs")
    assert verdict.holds, verdict.evidence
    state = dict.fromkeys(range(4), 50)
    for hid in verdict.evidence["serial_order"]:
        if hid in work_of:
            a, b, amount = work_of[hid]
            if state[a] >= amount:
                state[a] -= amount
                state[b] += amount
    assert {i: acct.read(i) for i in range(4)} == state
