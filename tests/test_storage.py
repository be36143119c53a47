"""Storage: tables, streams, the write-ahead log and recovery."""

import pytest

from txstream.errors import TxStreamError, UnknownNameError
from txstream.storage import (
    ABSENT,
    DuplicateKeyError,
    LogCorruptError,
    MissingKeyError,
    OrderError,
    StorageError,
    Store,
    Stream,
    Table,
    item_name,
    read_log,
)


def test_table_mutators_return_inverse_operations() -> None:
    t = Table("acct")
    t.load({"a": 100, "b": {"bal": 5}})
    before = t.rows()
    undo = [
        t.increment("a", 10),
        t.increment("b", 3, field="bal"),
        t.insert("c", 1),
        t.update("a", 7),
        t.delete("c"),
        t.put("d", 4),
    ]
    assert t.read("a") == 7 and t.read("b") == {"bal": 8} and t.read("d") == 4
    for record in reversed(undo):
        t.undo(record)
    assert t.rows() == before
    assert undo[0] == ("increment", "a", -10, None)


def test_table_errors() -> None:
    t = Table("acct")
    t.insert(1, 1)
    with pytest.raises(DuplicateKeyError, match="already exists"):
        t.insert(1, 2)
    with pytest.raises(MissingKeyError, match="no row"):
        t.update(2, 1)
    with pytest.raises(MissingKeyError):
        t.delete(2)
    with pytest.raises(MissingKeyError):
        t.increment(2, 1)
    with pytest.raises(StorageError, match="cannot increment"):
        tt = Table("s")
        tt.load({1: "text"})
        tt.increment(1, 5)
    with pytest.raises(StorageError, match="bad table name"):
        Table("a.b")


def test_table_versions_and_snapshots() -> None:
    t = Table("x")
    t.put("k", 1)
    t.install("k", 1, keep_since=0)
    t.put("k", 2)  # uncommitted: invisible to snapshots
    assert t.read_at("k", 1) == 1 and t.read("k") == 2
    t.install("k", 3, keep_since=0)
    t.delete("k")
    t.install("k", 5, keep_since=0)
    assert [t.read_at("k", ts, "none") for ts in range(7)] == ["none", 1, 1, 2, 2, "none", "none"]
    assert t.latest("k") == (5, ABSENT)
    assert t.snapshot(2) == {"k": 1} and t.snapshot() == {}
    t.put("k", 9)
    t.install("k", 6)  # no snapshot open: old versions are dropped
    assert t.versions("k") == [(6, 9)]


def test_stream_order_granularity_and_removal() -> None:
    s = Stream("s", order_by="ts", require_order=True, granularity="event")
    ids = [s.append({"ts": i}) for i in (1, 2, 2)]
    assert ids == [0, 1, 2]
    with pytest.raises(OrderError, match="requires order"):
        s.append({"ts": 1})
    assert s.items_for_read(0, 3) == ["s.0", "s.1", "s.2"]
    s.install(0, 1)
    assert s.read_at(1) == [{"ts": 1}] and len(s.read()) == 3
    s.remove(1)  # not the tail: a hole
    assert s.read_with_ids() == [(0, {"ts": 1}), (2, {"ts": 2})] and len(s) == 3
    s.remove(2)  # the tail: truncated, and the hole before it too
    assert len(s) == 1 and s.live == 1
    r = Stream("r", granularity="range", range_size=10)
    assert r.items_for_read(5, 25) == ["r.r0", "r.r1", "r.r2"] and r.item_of(31) == "r.r3"
    assert Stream("w").items_for_read(0, 99) == ["w"]
    with pytest.raises(StorageError, match="granularity"):
        Stream("z", granularity="page")
    with pytest.raises(StorageError, match="ordering attribute"):
        Stream("z", require_order=True)
    with pytest.raises(StorageError, match="no ordering attribute"):
        s.append({"time": 3})


def test_item_names_are_notation_safe() -> None:
    assert item_name("t", "a b/c") == "t.a_b_c"
    assert item_name("t", (1, 2)) == "t._1__2_"


def test_store_catalog_and_unknown_names() -> None:
    st = Store()
    st.table("a")
    with pytest.raises(UnknownNameError, match="unknown table 'b'"):
        st.get_table("b")
    with pytest.raises(UnknownNameError, match="unknown stream"):
        st.get_stream("a")
    with pytest.raises(StorageError, match="already a table"):
        st.stream("a")


def test_store_recovers_committed_records(tmp_path) -> None:
    st = Store(tmp_path)
    a = st.table("a")
    s = st.stream("s", order_by="ts", require_order=True, granularity="event")
    st.sync(st.log_commit(1, [(a, (1, "x"), {"v": 1}), (a, 2, 5)], [(s, 0, {"ts": 3})], {"src": 1}))
    st.sync(st.log_commit(2, [(a, 2, ABSENT)], [(s, 2, {"ts": 4})], {"src": 3}))
    st.close()
    again = Store(tmp_path)
    assert again.recovery is not None and again.recovery.clean
    assert again.recovery.transactions == 2 and again.last_ts == 2
    assert again.tables["a"].rows() == {(1, "x"): {"v": 1}}
    stream = again.streams["s"]
    assert stream.require_order and stream.granularity == "event"
    assert stream.committed() == [{"ts": 3}, {"ts": 4}] and len(stream) == 3
    assert again.offset("src") == 3


def test_corrupt_record_stops_recovery_and_says_so(tmp_path, caplog) -> None:
    st = Store(tmp_path)
    a = st.table("a")
    for ts in range(1, 6):
        st.sync(st.log_commit(ts, [(a, ts, ts)], [], None))
    st.close()
    log = tmp_path / "wal.log"
    data = bytearray(log.read_bytes())
    scan = read_log(log)
    assert len(scan.records) == 6 and scan.problem is None
    data[-3] ^= 0xFF  # damage the last record's payload
    log.write_bytes(bytes(data))
    with caplog.at_level("WARNING"):
        again = Store(tmp_path)
    report = again.recovery
    assert report is not None and report.corrupt and "checksum mismatch" in str(report)
    assert "stopped at the last good record" in caplog.text
    assert again.tables["a"].rows() == {1: 1, 2: 2, 3: 3, 4: 4}
    assert list(tmp_path.glob("wal.log.corrupt-*"))
    # New commits go after the last good record and survive the next recovery.
    again.sync(again.log_commit(6, [(again.tables["a"], 6, 6)], [], None))
    again.close()
    third = Store(tmp_path)
    assert third.recovery is not None and third.recovery.clean
    assert third.tables["a"].rows() == {1: 1, 2: 2, 3: 3, 4: 4, 6: 6}


def test_torn_tail_is_cut(tmp_path) -> None:
    st = Store(tmp_path, sync="group")
    a = st.table("a")
    st.sync(st.log_commit(1, [(a, 1, 1)], [], None))
    st.close()
    log = tmp_path / "wal.log"
    log.write_bytes(log.read_bytes() + b"\x40\x00\x00\x00\x01\x02")
    again = Store(tmp_path)
    assert again.recovery is not None and "torn record" in (again.recovery.problem or "")
    assert not again.recovery.corrupt and again.tables["a"].rows() == {1: 1}


def test_bad_log_file_and_values(tmp_path) -> None:
    (tmp_path / "wal.log").write_bytes(b"not a log at all")
    with pytest.raises(LogCorruptError, match="not a txstream log"):
        Store(tmp_path)
    other = tmp_path / "other"
    st = Store(other)
    a = st.table("a")
    with pytest.raises(StorageError, match="JSON"):
        st.log_commit(1, [(a, 1, object())], [], None)
    with pytest.raises(TxStreamError, match="unknown sync"):
        Store(tmp_path / "third", sync="sometimes")


def test_a_table_watcher_records_each_changed_key_once_with_its_first_commit() -> None:
    """``Table.watch`` learns which keys committed since it was last cleared, and when
    each changed first, without walking the table; ``unwatch`` stops it."""
    from txstream.txn import TransactionManager

    tm = TransactionManager(protocol="ss2pl")
    tbl = tm.table("t")
    with tm.begin() as t:
        t.put("t", 1, "a")
        t.put("t", 2, "b")
    changes = tbl.watch()
    with tm.begin() as t:
        t.put("t", 1, "a2")
    first = tm.clock
    with tm.begin() as t:
        t.put("t", 1, "a3")
        t.delete("t", 2)
    assert changes == {1: first, 2: tm.clock}
    changes.clear()
    tbl.unwatch(changes)
    with tm.begin() as t:
        t.put("t", 3, "c")
    assert changes == {}
    deleted = tm.clock - 1
    assert sorted(tbl.committed()) == [(1, deleted, "a3"), (3, tm.clock, "c")]
    assert (2, deleted, ABSENT) in set(tbl.committed(deleted=True))
