"""Every damaged or missing file of a runtime store is detected, and no store file is code.

Fault injection against ``run_local``'s store (the same files a Spark query
writes under ``<checkpoint>/txstream``): a changed digit, a deleted file or
folder gives a one-line :class:`StoreError` naming it, at read or at restart,
or a recovery from what is intact; never fewer or other rows without a word.
The Spark side (a lost last marker run again) is in test_runtime_spark.py.
"""

from __future__ import annotations

import datetime as dt
import doctest
import itertools
import math
import pickle
import shutil
import struct
import zlib
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import txstream as tx
from store_checks import assert_markers_name_their_files
from txstream.spark.runtime import codec, results
from txstream.spark.runtime import state as state_module
from txstream.spark.runtime.boundaries import Event
from txstream.spark.runtime.state import (
    OLD_MAGIC,
    RuntimeStore,
    StoreError,
    dump_blob,
    load_blob,
)


def count(t: tx.Tx, e: dict[str, Any]) -> None:
    if e["k"] == 13:
        raise ValueError("unlucky key")
    if t.read("counts", e["k"]) is None:
        t.insert("counts", {"k": e["k"], "n": 0, "total": 0.0})
    t.increment("counts", e["k"], "total", e["x"])
    t.emit("seen", {"k": e["k"], "n": t.increment("counts", e["k"], "n", 1)})


def counting(snapshot_every: int = 20, history: bool = False) -> tx.Job:
    job = (
        tx.Job("counting")
        .table("counts", key="k")
        .input("ev", None, keys="k", order="ts")
        .on("ev", count)
        .output("seen")
        .option("snapshotEvery", snapshot_every)
    )
    return job.option("recordHistory", True) if history else job


def batches(n: int, per: int = 12, start: int = 0) -> list[list[tuple[str, dict[str, Any]]]]:
    out = []
    for b in range(start, start + n):
        out.append(
            [
                ("ev", {"k": (b * per + i) % 7, "x": 0.5 * i, "ts": float(b * per + i)})
                for i in range(per)
            ]
        )
    return out


def restart() -> None:
    """A new process: the workers' cached states are gone."""
    state_module._CACHE.clear()


def run(store: Path, n: int, start: int = 0, **kw: Any) -> None:
    restart()
    with pytest.warns(tx.TransactionFailuresWarning) if _fails(n, start) else _nothing():
        counting(**kw).run_local(batches(n, start=start), store, 2)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _fails(n: int, start: int) -> bool:
    return any(e["k"] == 13 for b in batches(n, start=start) for _, e in b)


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def table(store: Path) -> dict[Any, Any]:
    return {r["k"]: (r["n"], r["total"]) for r in tx.read_table(store, "counts")}


# -- 1. a changed byte in an output, history or failure file --------------------------------


def _change_a_digit(path: Path) -> None:
    text = path.read_text()
    at = next(i for i, c in enumerate(text) if c in "123456789" and text[i - 1] == " ")
    path.write_text(text[:at] + str(int(text[at]) % 9 + 1) + text[at + 1 :])


def test_a_changed_digit_in_an_output_file_is_detected(tmp_path: Path) -> None:
    run(tmp_path, 3)
    part = tmp_path / "outputs" / "seen" / f"batch-{1:012d}" / "p00000.jsonl"
    _change_a_digit(part)
    with pytest.raises(StoreError) as exc:
        tx.read_output(tmp_path, "seen")
    assert one_line(exc).startswith(f"{part}: checksum mismatch")


def test_a_damaged_history_file_is_detected(tmp_path: Path) -> None:
    run(tmp_path, 3, history=True)
    part = next((tmp_path / "history" / f"batch-{2:012d}").glob("*.txt"))
    raw = bytearray(part.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    part.write_bytes(bytes(raw))
    with pytest.raises(StoreError) as exc:
        tx.read_history(tmp_path)
    assert one_line(exc).startswith(f"{part}: checksum mismatch")


def test_a_damaged_failure_record_is_detected(tmp_path: Path) -> None:
    def failing(t: tx.Tx, e: dict[str, Any]) -> None:
        raise ValueError(f"no {e['k']}")

    job = tx.Job("f").table("counts", key="k").input("ev", None, keys="k").on("ev", failing)
    with pytest.warns(tx.TransactionFailuresWarning):
        job.run_local([[("ev", {"k": 12})], [("ev", {"k": 34})]], tmp_path, 1)
    part = next((tmp_path / "errors" / f"batch-{1:012d}").glob("*.jsonl"))
    part.write_text(part.read_text().replace("no 34", "no 35"))
    with pytest.raises(StoreError) as exc:
        tx.read_failures(tmp_path)
    assert one_line(exc).startswith(f"{part}: checksum mismatch")


def test_tasks_checksum_their_files_and_the_driver_reads_none_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The driver does no per-event work: the marker's CRCs of outputs, histories
    # and failure records come from the tasks that wrote them (before: the
    # driver read every file of the batch back at its commit).
    from txstream.spark.runtime import local

    reported: list[dict[str, list[int]]] = []
    real_phase1, real_commit = local.phase1, RuntimeStore.commit

    def phase1(*args: Any) -> dict[str, Any]:
        result = real_phase1(*args)
        reported.append(dict(result["stats"]["files"]))
        return result

    def commit(self: RuntimeStore, *args: Any) -> None:
        real_read = Path.read_bytes

        def read_bytes(path: Path) -> bytes:
            if {"outputs", "history", "errors"} & set(path.relative_to(self.root).parts):
                raise AssertionError(f"the driver read {path} back at the commit")
            return real_read(path)

        with monkeypatch.context() as m:
            m.setattr(Path, "read_bytes", read_bytes)
            real_commit(self, *args)

    monkeypatch.setattr(local, "phase1", phase1)
    monkeypatch.setattr(RuntimeStore, "commit", commit)
    data = batches(3)  # outputs and histories; a failure (key 13) and an event without a key
    data[2] += [("ev", {"k": 13, "x": 1.0, "ts": 99.0}), ("ev", {"k": None, "x": 1, "ts": 98.0})]
    restart()
    with pytest.warns(tx.TransactionFailuresWarning):
        counting(history=True).run_local(data, tmp_path, 2)
    assert assert_markers_name_their_files(tmp_path) == 3 * 2 * 2 + 2
    markers = {}
    for _, info in RuntimeStore(tmp_path).chain():
        markers.update(info["files"])
    tasks = {rel: entry for files in reported for rel, entry in files.items()}
    assert tasks and all(markers[rel] == entry for rel, entry in tasks.items())
    assert [rel for rel in markers if rel not in tasks] == [f"errors/batch-{2:012d}/input.jsonl"]


def test_a_file_a_task_reported_and_is_not_there_is_never_committed(tmp_path: Path) -> None:
    store = RuntimeStore(tmp_path)
    files = store.write_lines("outputs", "seen", 0, "p00000", ['{"k": 1}'])
    [(rel, (crc, size))] = files.items()
    assert (crc, size) == (zlib.crc32(b'{"k": 1}\n'), 9)
    (tmp_path / rel).write_text('{"k": 12}\n')  # (another writer, after the task)
    with pytest.raises(StoreError) as exc:
        store.commit(0, {"prev": -1}, files)
    assert one_line(exc) == (
        f"{tmp_path / rel} has 10 bytes, not 9 (its task wrote it in batch 0); the batch is "
        "not committed and runs again"
    )
    (tmp_path / rel).unlink()
    with pytest.raises(StoreError, match=r"is missing \(its task wrote it in batch 0\)"):
        store.commit(0, {"prev": -1}, files)
    assert not store.committed()


# -- 2. files that must exist -----------------------------------------------------------------


def test_a_deleted_output_part_is_named_not_left_out(tmp_path: Path) -> None:
    run(tmp_path, 3)
    part = tmp_path / "outputs" / "seen" / f"batch-{1:012d}" / "p00001.jsonl"
    part.unlink()
    with pytest.raises(StoreError) as exc:
        tx.read_output(tmp_path, "seen")
    assert one_line(exc).startswith(f"{part} is missing (batch 1 committed it)")


def test_a_deleted_marker_in_the_middle_is_named(tmp_path: Path) -> None:
    run(tmp_path, 4)
    marker = tmp_path / "commits" / f"{1:012d}.json"
    marker.unlink()
    for read in (lambda: tx.read_output(tmp_path, "seen"), lambda: tx.read_failures(tmp_path)):
        with pytest.raises(StoreError) as exc:
            read()
        assert one_line(exc).startswith(f"{marker} is missing: the commit marker of batch 1")
    with pytest.raises(StoreError, match="commit marker of batch 1"):
        run(tmp_path, 1, start=4)


def test_a_deleted_first_marker_is_named(tmp_path: Path) -> None:
    run(tmp_path, 2)
    (tmp_path / "commits" / f"{0:012d}.json").unlink()
    with pytest.raises(StoreError, match="commit marker of batch 0"):
        tx.read_output(tmp_path, "seen")


def test_a_marker_copied_over_another_names_that_marker(tmp_path: Path) -> None:
    # (the message said that batch 3's marker, which is there, was missing)
    run(tmp_path, 5)
    marker = tmp_path / "commits" / f"{4:012d}.json"
    marker.write_bytes((tmp_path / "commits" / f"{3:012d}.json").read_bytes())
    with pytest.raises(StoreError) as exc:
        tx.read_output(tmp_path, "seen")
    assert one_line(exc).startswith(
        f"{marker}: the commit marker names batch 2 as the batch before it, but batch 3 is"
    )


# -- 2b. job.json ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"partitions"', '"partitionr"'),  # a key: was a KeyError traceback
        ('"runner": "local"', '"runner": "locam"'),  # was "the store of locam"
        ('"key": ["k"]', '"key": ["j"]'),  # was "declared with key ['j']": not the job
        ('"outputs": ["seen"]', '"outputs": ["seem"]'),  # read_output: "no output 'seen'"
        ('"crc"', '"crd"'),  # its checksum's own key: was read as an older, unchecked record
    ],
)
def test_a_changed_job_record_is_named(tmp_path: Path, old: str, new: str) -> None:
    run(tmp_path, 2)
    path = tmp_path / "job.json"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    expected = f"{path}: damaged job record (checksum mismatch)"
    for call in (lambda: run(tmp_path, 1, start=2), lambda: tx.read_output(tmp_path, "seen")):
        with pytest.raises(StoreError) as exc:
            call()
        assert one_line(exc).startswith(expected)
    with pytest.raises(StoreError, match="checksum mismatch"):
        tx.read_table(tmp_path, "counts")


def test_a_deleted_job_record_is_named_at_restart(tmp_path: Path) -> None:
    # (run_local said the store held "batches that no run_local committed (a Spark
    # query's)", and a query's start took the job as a first start's, unchecked)
    run(tmp_path, 2)
    path = tmp_path / "job.json"
    path.unlink()
    for call in (
        lambda: run(tmp_path, 1, start=2),
        lambda: RuntimeStore(tmp_path).job_meta("spark"),
    ):
        with pytest.raises(StoreError) as exc:
            call()
        assert one_line(exc).startswith(f"{path} is missing, and the store holds committed batches")


def test_a_delivery_record_of_an_uncommitted_batch_does_not_skip_its_delivery(
    tmp_path: Path,
) -> None:
    # A record left from elsewhere (a lost marker, a copied store) kept the batch from
    # its sink without a word.
    got: dict[int, list[dict[str, Any]]] = {}
    job = counting().sink("seen", lambda b, rows: got.__setitem__(b, list(rows)))
    with pytest.warns(tx.TransactionFailuresWarning) if _fails(2, 0) else _nothing():
        job.run_local(batches(2), tmp_path, 2)
    (tmp_path / "sinks" / "seen" / f"{3:012d}.done").write_bytes(b"")
    with pytest.warns(tx.TransactionFailuresWarning) if _fails(3, 2) else _nothing():
        job.run_local(batches(3, start=2), tmp_path, 2)
    assert sorted(got) == [0, 1, 2, 3, 4]
    assert got[3] == results.read_batch_output(RuntimeStore(tmp_path), "seen", 3) != []


# -- 3. the state's chain at restart and load -----------------------------------------------


def test_a_deleted_latest_delta_is_named_at_restart(tmp_path: Path) -> None:
    run(tmp_path, 5, snapshot_every=3)
    delta = tmp_path / "state" / "p00000" / f"delta-{4:012d}.bin"
    delta.unlink()
    with pytest.raises(StoreError) as exc:
        run(tmp_path, 1, start=5, snapshot_every=3)
    assert one_line(exc).startswith(f"{delta} is missing: partition 0's state after batch 4")


def test_a_worker_never_loads_a_broken_chain(tmp_path: Path) -> None:
    # The executors' own check (a worker with no cached state loads from disk).
    run(tmp_path, 5, snapshot_every=3)
    (tmp_path / "state" / "p00001" / f"delta-{4:012d}.bin").unlink()
    store = RuntimeStore(tmp_path)
    token = store.commit_info(4)["tokens"]["1"]
    with pytest.raises(StoreError, match=r"delta-000000000004\.bin is missing"):
        store.load(1, 4, token)
    restart()
    with pytest.raises(StoreError, match=r"delta-000000000004\.bin is missing"):
        store.state_for(1, 5, 4, token)


def test_a_delta_replaced_by_another_attempt_is_refused(tmp_path: Path) -> None:
    run(tmp_path, 5, snapshot_every=3)
    pdir = tmp_path / "state" / "p00000"
    # batch 4's delta, swapped for one that continues another version
    delta = load_blob(pdir / f"delta-{4:012d}.bin")
    delta["parent"] = "another-version"
    (pdir / f"delta-{4:012d}.bin").write_bytes(dump_blob(delta))
    store = RuntimeStore(tmp_path)
    with pytest.raises(StoreError, match="partition 0's state after batch 3 does not lead"):
        store.load(0, 4, store.commit_info(4)["tokens"]["0"])


def test_a_damaged_latest_snapshot_recovers_from_the_older_one(tmp_path: Path) -> None:
    run(tmp_path, 8, snapshot_every=3)  # snapshots at 3 and 6, deltas from 3 on
    expected = table(tmp_path)
    snap = tmp_path / "state" / "p00000" / f"snap-{6:012d}.bin"
    raw = bytearray(snap.read_bytes())
    raw[-2] ^= 0x10
    snap.write_bytes(bytes(raw))
    assert table(tmp_path) == expected  # snapshot 3 and deltas 4-7
    run(tmp_path, 2, start=8, snapshot_every=3)
    reference = tmp_path.parent / "reference"
    run(reference, 10, snapshot_every=3)
    assert table(tmp_path) == table(reference)
    assert tx.read_output(tmp_path, "seen") == tx.read_output(reference, "seen")


def test_a_deleted_partition_folder_is_named_not_started_empty(tmp_path: Path) -> None:
    run(tmp_path, 3)
    folder = tmp_path / "state" / "p00001"
    shutil.rmtree(folder)
    with pytest.raises(StoreError) as exc:
        run(tmp_path, 1, start=3)
    assert one_line(exc).startswith(f"{folder} is missing: batch 2 committed state of partition 1")
    with pytest.raises(StoreError, match=f"{folder} is missing"):
        tx.read_table(tmp_path, "counts")


def test_an_intact_store_restarts_to_the_uninterrupted_answer(tmp_path: Path) -> None:
    for start in range(0, 9, 3):
        run(tmp_path / "a", 3, start=start, snapshot_every=2)
    run(tmp_path / "b", 9, snapshot_every=2)
    assert table(tmp_path / "a") == table(tmp_path / "b")
    assert tx.read_output(tmp_path / "a", "seen") == tx.read_output(tmp_path / "b", "seen")


# -- 5. no code in data files -------------------------------------------------------------------


class _Trap:
    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (Path(_TRAP),))


_TRAP = "/nonexistent"


def test_a_pickle_store_is_refused_and_never_unpickled(tmp_path: Path) -> None:
    global _TRAP
    run(tmp_path, 2)
    _TRAP = str(tmp_path / "ran")
    body = pickle.dumps({"data": _Trap(), "meta": {}, "token": None})
    old = OLD_MAGIC + struct.pack(">IQ", zlib.crc32(body), len(body)) + body
    snap = tmp_path / "state" / "p00000" / f"delta-{1:012d}.bin"
    snap.write_bytes(old)
    with pytest.raises(StoreError) as exc:
        load_blob(snap)
    assert one_line(exc) == (
        f"{snap}: written by an older version of txstream (a pickle file, which this version "
        "never loads); start the job on a new checkpoint (or finish it with the older version "
        "first)"
    )
    with pytest.raises(StoreError, match="older version"):
        tx.read_table(tmp_path, "counts")
    # A whole store of the old format is refused at the restart, before anything runs.
    for path in (tmp_path / "state").rglob("*.bin"):
        path.write_bytes(old)
    with pytest.raises(StoreError, match=r"p0000\d/\S+\.bin: written by an older version"):
        run(tmp_path, 1, start=2)
    assert not (tmp_path / "ran").exists()


def test_no_store_file_is_a_pickle(tmp_path: Path) -> None:
    run(tmp_path, 3, snapshot_every=2)
    blobs = list(tmp_path.rglob("*.bin"))
    assert blobs
    for path in blobs:
        raw = path.read_bytes()
        assert raw.startswith(b"TXRT2\n")
        assert b"\x80\x05" not in raw[:20]  # (a pickle's protocol header)


def test_a_value_the_format_cannot_hold_is_an_error_at_write(tmp_path: Path) -> None:
    class Money:
        pass

    def keep(t: tx.Tx, e: dict[str, Any]) -> None:
        t.upsert("counts", {"k": e["k"], "what": Money()})

    job = tx.Job("m").table("counts", key="k").input("ev", None, keys="k").on("ev", keep)
    with pytest.raises(StoreError) as exc:
        job.run_local([[("ev", {"k": 1})]], tmp_path, 1)
    assert "cannot be stored in the job's state" in one_line(exc)
    assert "Money" in str(exc.value)


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.binary(max_size=8)
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.datetimes()
    | st.datetimes(timezones=st.just(dt.UTC))
    | st.dates()
    | st.times()
    | st.timedeltas()
)
hashable = st.recursive(
    scalars.filter(lambda v: not (isinstance(v, float) and math.isnan(v))),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
        | st.dictionaries(hashable, inner, max_size=4)
        | st.sets(hashable, max_size=3)
        | st.builds(
            Event,
            st.tuples(st.floats(allow_nan=False), st.integers(), st.integers()),
            st.text(max_size=4),
            st.dictionaries(st.text(max_size=4), inner, max_size=3),
            st.lists(hashable, max_size=2),
            st.lists(st.integers(0, 8), max_size=2),
            st.booleans(),
        )
    ),
    max_leaves=20,
)


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types all the way down (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and str(a) == str(b))
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, Event):
        return all(
            same(getattr(a, f), getattr(b, f))
            for f in ("order", "input", "row", "values", "pids", "copy")
        )
    if isinstance(a, dt.datetime):
        return a == b and a.utcoffset() == b.utcoffset()
    if isinstance(a, Decimal):
        return str(a) == str(b)
    return bool(a == b)


@settings(max_examples=300, deadline=None)
@given(values)
def test_every_value_the_state_holds_round_trips_exactly(value: Any) -> None:
    assert same(codec.loads(codec.dumps(value)), value)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(max_size=3), values, max_size=3))
def test_blobs_round_trip_with_their_checksum(
    tmp_path_factory: pytest.TempPathFactory, value: Any
) -> None:
    # (tmp_path_factory: the run's folders, in memory where conftest puts them)
    path = tmp_path_factory.mktemp("blob") / "x.bin"
    path.write_bytes(dump_blob(value))
    assert same(load_blob(path), value)


def test_dicts_that_look_like_tags_round_trip() -> None:
    for value in ({"$t": [1, 2]}, {"$d": 1}, {"$": None, "a": 1}, {1: "a", "1": "b"}):
        assert same(codec.loads(codec.dumps(value)), value)


def test_pandas_numpy_and_zoneinfo_values_round_trip_exactly() -> None:
    import zoneinfo

    import numpy as np
    import pandas as pd

    paris = zoneinfo.ZoneInfo("Europe/Paris")
    for value in (
        pd.Timestamp("2024-01-01 00:00:00.000000001"),  # nanoseconds kept
        pd.Timestamp("2024-07-01 02:00", tz="Europe/Paris"),
        pd.Timestamp("2024-07-01 02:00", tz=dt.timezone(dt.timedelta(hours=-3))),
        np.int64(-5),
        np.float32(1.5),
        np.bool_(True),
        dt.datetime(2024, 10, 27, 2, 30, tzinfo=paris, fold=1),  # the second 02:30 that night
    ):
        back = codec.loads(codec.dumps({"row": value}))["row"]
        assert type(back) is type(value) and back == value, (value, back)
        assert repr(back) == repr(value)


def _counting_encode(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the codec's Python steps (``encode`` calls, recursive ones included)."""
    calls = [0]
    real = codec.encode

    def counted(obj: Any) -> Any:
        calls[0] += 1
        return real(obj)

    monkeypatch.setattr(codec, "encode", counted)
    return calls


def test_the_state_is_written_without_a_python_step_per_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A delta's and a snapshot's plain rows go to the C encoder column by
    # column (before: the snapshot took two Python steps per row, 5x pickle).
    store = RuntimeStore(tmp_path)
    state = store.state_for(0, 0, -1, None)
    for k in range(1000):
        state.put("t", k % 300, (k, "x"), {"k": k, "v": k / 3, "s": "é", "n": None, "b": True})
        state.put("u", f"v{k}", k, {"k": k})
    state.put("t", 9, (9, "x"), state_module.ABSENT)
    expected = {t: {v: dict(rows) for v, rows in by.items()} for t, by in state.data.items()}
    calls = _counting_encode(monkeypatch)
    token = store.save(0, state, 0, snapshot=True)
    assert calls[0] < 60
    restart()
    from_snapshot = store.load(0, 0, token)
    assert same(from_snapshot.data, expected)
    (tmp_path / "state" / "p00000" / f"snap-{0:012d}.bin").unlink()
    assert same_state(store.load(0, 0, token).data, expected)


def same_state(a: Any, b: Any) -> bool:
    """The same rows (by :func:`same`) under the same tables, values and keys, in any order.

    A state rebuilt from deltas may list a table's partition values in another
    order than the worker that ran the batches (the executor sorts what it scans).
    """
    return a.keys() == b.keys() and all(
        a[t].keys() == b[t].keys()
        and all(
            a[t][v].keys() == b[t][v].keys() and all(same(a[t][v][k], b[t][v][k]) for k in a[t][v])
            for v in a[t]
        )
        for t in a
    )


def test_a_table_in_columns_round_trips() -> None:
    for table in (
        {},
        {1: {1: {"a": 1}}, "x": {(2, "y"): {"a": 2}}},
        {1: {}, 2: {"k": {"a": 1}, "l": {"b": 2}}},  # a value without rows is left out
        {1: {"k": {"a": 1}, "l": {"b": 2}}, 2: {"m": {}}, 3: {}},
    ):
        back = state_module.nested(*state_module.columns(table))
        assert same(back, {v: rows for v, rows in table.items() if rows})


def test_long_lists_in_column_layouts_round_trip() -> None:
    rows = [{"k": k, "v": float(k) / 3, "s": "x", "n": None, "b": True} for k in range(9)]
    for value in (
        rows,
        [*rows, None, {**rows[0], "k": 1}],  # a deleted row in a delta
        [{"$t": [1, 2]}] * 9,  # a user's row that looks like a tag
        [{"a$": 1, "b": 2}] * 9,
        [{"a": (1,)}] * 8 + [{"a": [1, {"b": 2}]}],  # a column that is not plain
        [{"b": 1, "a": 2}] + [{"a": 1, "b": 2}] * 8,  # keys in another order
        [{}] * 9,
        [{1: "a"}] * 9,
        [(1, "a")] * 8 + [(2, 2.5)],  # composite keys
        [(1, "a")] * 8 + [(2, (3,))],
        [[1, "a"]] * 8 + [[1, [2]]],
        [None] * 9,
        [{"x": float("nan")}] * 9 + [[], [[1]]],
        [Event((1.0, 0, k), "e", {"k": k}, [k], [0]) for k in range(9)],
    ):
        back = codec.loads(codec.dumps(value))
        assert same(back, value) and repr(back) == repr(value)
        assert not any(a is b for a, b in itertools.pairwise(back) if isinstance(a, dict))
    for odd in ([{"a": 1, "b": object()}] * 9, [(1, object())] * 9, [[object()]] * 9):
        with pytest.raises(codec.UnstorableValueError, match=r"type builtins\.object"):
            codec.dumps(odd)


def test_rows_and_deltas_in_blocks_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    # The rows' passes and the delta's run block by block (for the CPU's cache):
    # what a later block holds (another shape, an absent row, a value that is
    # not plain, not a row) decides as if the whole list were looked at once.
    from txstream.spark.runtime import partition_state

    monkeypatch.setattr(codec, "_BLOCK", 3)
    monkeypatch.setattr(partition_state, "_BLOCK", 3)
    rows = [{"k": k, "v": k * 2} for k in range(8)]
    for value in (
        rows,
        [*rows[:4], None, *rows[4:], None],  # absent rows in the second and third blocks
        [*rows[:7], {"v": 1, "k": 2}],  # keys in another order in the last block
        [*rows[:5], {"k": 1}, *rows[5:]],  # a missing column in a later block
        [*rows[:6], {"k": (1, 2), "v": 0}, rows[0]],  # a column not plain in a later block
        [*rows[:6], 5, rows[0]],  # not a row
        [None, None, None, *rows],  # a first block without a row
    ):
        back = codec.loads(codec.dumps(value))
        assert same(back, value) and repr(back) == repr(value)
    state = state_module.PartitionState()
    state.use_flat(frozenset({"flat"}))
    state.begin(0)
    writes = [("t", k % 2, k, {"k": k}) for k in range(7)] + [
        ("flat", k, k, {"f": k}) for k in range(5)
    ]
    writes += [("t", 1, 9, state_module.ABSENT), ("flat", 3, 3, state_module.ABSENT)] + [
        ("t", 0, k, {"k": -k}) for k in range(3)
    ]
    for table, value, key, row in writes[::2] + writes[1::2]:  # (the tables interleaved)
        state.put(table, value, key, row)
    order = list(state.undo)
    changes = state.delta()["changes"]
    for table in ("t", "flat"):
        mine = [(v, k) for t, v, k in order if t == table]
        now = [(state.part(table, v) or {}).get(k, state_module.ABSENT) for v, k in mine]
        keys = [k for _, k in mine]
        want = [keys, now] if table == "flat" else [[v for v, _ in mine], keys, now]
        assert changes[table] == want


def test_lists_written_block_by_block_are_the_same_text(monkeypatch: pytest.MonkeyPatch) -> None:
    # dumps writes long lists' JSON block by block while their values are cached
    # and splices it in: the bytes are json.dumps's of the encoded value, even
    # when a string of the data reads like the mark that stands for a list.
    import json

    monkeypatch.setattr(codec, "_BLOCK", 3)
    monkeypatch.setattr(codec.secrets, "token_hex", lambda n: "n")
    rows = [{"k": k, "v": k / 3, "s": "é\x00"} for k in range(8)]
    for value in (
        rows,
        {"changes": {"t": [list(range(10)), [*rows[:4], None, *rows[4:]]]}, "meta": {}},
        [*rows[:6], {"k": (1, 2), "v": 0.5, "s": "x"}, rows[0]],  # not plain in a later block
        [1, 2, 3, 4, "a", None, True, 2.5, float("nan"), -7],
        [1, 2, 3, 4, 5, (6,), 7],  # a value that is not plain in a later block
        [[*range(5)], [*range(7)], {"x": list(range(9))}],
        [*rows, {"k": 0, "v": 0.0, "s": "\x00n:0"}],  # a string like a mark
        {"a": "\x00n:0", "b": list(range(10))},  # before the list's mark
    ):
        want = json.dumps(codec.encode(value), separators=(",", ":")).encode()
        assert codec.dumps(value) == want
        back = codec.loads(codec.dumps(value))
        assert same(back, value) and repr(back) == repr(value)


names = st.lists(st.text(max_size=3), min_size=1, max_size=4, unique=True)
shaped_rows = names.flatmap(
    lambda cols: st.lists(
        st.none() | st.fixed_dictionaries({c: values for c in cols}),
        min_size=8,
        max_size=12,
    )
)
long_lists = (
    shaped_rows
    | st.lists(hashable, min_size=8, max_size=12)
    | st.lists(values, min_size=8, max_size=10)
    | st.lists(st.tuples(scalars, scalars), min_size=8, max_size=12)
    | st.lists(values.filter(lambda v: isinstance(v, Event)), min_size=8, max_size=9)
)


@settings(max_examples=200, deadline=None)
@given(long_lists)
def test_long_lists_round_trip_exactly(value: Any) -> None:
    assert same(codec.loads(codec.dumps(value)), value)


changes = st.lists(
    st.tuples(
        st.sampled_from(["t", "u"]),
        hashable,
        hashable,
        st.none() | st.dictionaries(st.text(max_size=3), values, max_size=3),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(changes, changes)
def test_a_saved_state_loads_back_exactly(
    tmp_path_factory: pytest.TempPathFactory, first: Any, second: Any
) -> None:
    # A snapshot after the first batch, a delta after the second: a new worker
    # loads what the worker that ran them holds.  The store in the run's folders
    # (in memory where conftest puts them: it fsyncs every file it writes).
    root = tmp_path_factory.mktemp("saved")
    store = RuntimeStore(root)
    token = None
    for batch, puts in enumerate((first, second)):
        state = store.state_for(0, batch, batch - 1, token)
        for table, value, key, row in puts:
            state.put(table, value, key, state_module.ABSENT if row is None else row)
        token = store.save(0, state, batch, snapshot=batch == 0)
    held = state.data
    restart()
    assert same_state(store.load(0, 1, token).data, held)
    shutil.rmtree(root)


def test_run_local_keeps_rows_built_from_pandas_in_the_state(tmp_path: Path) -> None:
    # Rows handed to run_local from pandas hold Timestamps and numpy numbers (the
    # docs take a Timestamp order column); before: the batch failed when the
    # state was written ("cannot be stored in the job's state").
    import numpy as np
    import pandas as pd

    def keep(t: tx.Tx, e: dict[str, Any]) -> None:
        t.upsert("last", {"k": e["k"], "ts": e["ts"], "n": e["n"]})

    job = (
        tx.Job("keep")
        .table("last", key="k")
        .input("e", None, keys="k", order="ts")
        .on("e", keep)
        .option("merge", "event-time")
    )
    stamps = [pd.Timestamp("2024-01-01 00:00:00.000000001"), pd.Timestamp("2024-01-01 00:00:01")]
    rows = [("e", {"k": k, "n": np.int64(k), "ts": ts}) for k, ts in enumerate(stamps)]
    job.run_local([rows, []], tmp_path, 2)
    state_module._CACHE.clear()  # read back from the files
    got = tx.read_table(tmp_path, "last")
    assert [(r["ts"], type(r["n"])) for r in got] == [(s, np.int64) for s in stamps]


# -- 6. read_table ------------------------------------------------------------------------------


def test_read_table_at_the_last_and_at_an_earlier_batch(tmp_path: Path) -> None:
    run(tmp_path, 4)
    last = tx.read_table(tmp_path, "counts")
    assert [r["k"] for r in last] == sorted({e["k"] for b in batches(4) for _, e in b})
    reference = tmp_path.parent / "two"
    run(reference, 2)
    assert tx.read_table(tmp_path, "counts", batch=1) == tx.read_table(reference, "counts")
    assert last != tx.read_table(tmp_path, "counts", batch=1)
    frame = tx.read_table(tmp_path, "counts", as_="pandas")
    assert frame.to_dict("records") == last
    assert tx.read_table(tmp_path, "counts", as_="arrow").to_pylist() == last


def test_read_table_names_the_batches_it_can_read(tmp_path: Path) -> None:
    run(tmp_path, 9, snapshot_every=3)  # snapshots at 0, 3 and 6
    for pid in (0, 1):  # as a query trims after snapshot 6: 0-2 go
        RuntimeStore(tmp_path).trim(pid, 3)
    with pytest.raises(tx.TxStreamError) as exc:
        tx.read_table(tmp_path, "counts", batch=1)
    assert one_line(exc).endswith(
        "the state of batch 1 is no longer kept (trimmed after later snapshots); "
        "batches that can be read: 3-8"
    )
    assert tx.read_table(tmp_path, "counts", batch=3)
    with pytest.raises(tx.TxStreamError, match="batch 12 is not a committed batch; committed: 0-8"):
        tx.read_table(tmp_path, "counts", batch=12)
    with pytest.raises(tx.TxStreamError, match="no table 'count'; tables: counts"):
        tx.read_table(tmp_path, "count")
    # True read batch 1, and "3" gave "batch 3 is not a committed batch" (session 20)
    import numpy as np

    for odd in (True, "3", 3.0):
        with pytest.raises(tx.TxStreamError, match=r"^read_table: batch is a committed batch"):
            tx.read_table(tmp_path, "counts", batch=odd)
    assert tx.read_table(tmp_path, "counts", batch=np.int64(3)) == tx.read_table(
        tmp_path, "counts", batch=3
    )


def test_read_table_rows_are_in_key_order_with_their_keys(tmp_path: Path) -> None:
    def put(t: tx.Tx, e: dict[str, Any]) -> None:
        t.upsert("cells", {"a": e["a"], "b": e["b"], "v": e["v"]})

    job = (
        tx.Job("cells")
        .table("cells", key=["a", "b"], partition_by="a")
        .input("ev", None, keys="a")
        .on("ev", put)
    )
    rows = [("ev", {"a": 2, "b": "y", "v": 4}), ("ev", {"a": 1, "b": "x", "v": 3})]
    job.run_local([rows], tmp_path)
    assert tx.read_table(tmp_path, "cells") == [
        {"a": 1, "b": "x", "v": 3},
        {"a": 2, "b": "y", "v": 4},
    ]


def test_the_read_table_example_runs() -> None:
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(results.read_table, "read_table", globs={}):
        runner.run(test)
    assert runner.summarize(verbose=False).attempted >= 5
    assert runner.summarize(verbose=False).failed == 0


# -- 4. Spark's commit log against the markers (the Spark run is in test_runtime_spark.py) ----


def _spark_log(folder: Path, batches: int) -> None:
    for kind in ("offsets", "commits"):
        (folder / kind).mkdir(parents=True)
        for n in range(batches):
            (folder / kind / str(n)).write_text("v1\n{}\n")
            (folder / kind / f".{n}.crc").write_bytes(b"crc")


def test_the_last_batch_spark_counts_done_without_a_marker_is_run_again(tmp_path: Path) -> None:
    from txstream.spark.runtime.commitlog import reconcile_commit_log

    run(tmp_path / "s", 4)
    _spark_log(tmp_path / "spark", 4)
    reconcile_commit_log(RuntimeStore(tmp_path / "s"), tmp_path / "spark")
    assert sorted(p.name for p in (tmp_path / "spark" / "commits").iterdir()) == sorted(
        [str(n) for n in range(4)] + [f".{n}.crc" for n in range(4)]
    )
    (tmp_path / "s" / "commits" / f"{3:012d}.json").unlink()
    reconcile_commit_log(RuntimeStore(tmp_path / "s"), tmp_path / "spark")
    assert sorted(p.name for p in (tmp_path / "spark" / "commits").iterdir()) == sorted(
        [str(n) for n in range(3)] + [f".{n}.crc" for n in range(3)]
    )
    assert sorted(
        p.name for p in (tmp_path / "spark" / "offsets").iterdir() if p.name.isdigit()
    ) == [
        "0",
        "1",
        "2",
        "3",
    ]


def test_earlier_batches_spark_counts_done_without_markers_are_refused(tmp_path: Path) -> None:
    from txstream.spark.runtime.commitlog import reconcile_commit_log

    run(tmp_path / "s", 4)
    _spark_log(tmp_path / "spark", 4)
    for n in (2, 3):
        (tmp_path / "s" / "commits" / f"{n:012d}.json").unlink()
    with pytest.raises(StoreError) as exc:
        reconcile_commit_log(RuntimeStore(tmp_path / "s"), tmp_path / "spark")
    assert one_line(exc).startswith(
        f"Spark's commit log in {tmp_path / 'spark'} counts batches [2, 3] as done but their "
        "txstream commit markers are missing"
    )
    assert (tmp_path / "spark" / "commits" / "3").exists()  # nothing changed


def test_initial_rows_are_not_taken_from_a_gone_file_once_a_snapshot_held_them(
    tmp_path: Path,
) -> None:
    job = (
        tx.Job("counting")
        .table("counts", key="k", initial=[{"k": 100, "n": 5, "total": 1.0}])
        .input("ev", None, keys="k", order="ts")
        .on("ev", count)
        .output("seen")
    )
    restart()
    job.run_local(batches(3), tmp_path, 2)
    assert {r["k"] for r in tx.read_table(tmp_path, "counts")} >= {100}
    for init in tmp_path.rglob("init-*.bin"):
        init.unlink()
    for snap in tmp_path.rglob(f"snap-{0:012d}.bin"):
        raw = bytearray(snap.read_bytes())
        raw[-2] ^= 0x10
        snap.write_bytes(bytes(raw))
    with pytest.raises(StoreError, match="checksum mismatch"):
        tx.read_table(tmp_path, "counts")


@pytest.mark.parametrize(
    "lines",
    [
        ['{"k": 1, "__order": [1]}', '{"k": 2, "__order"'],  # a cut line
        ['{"k": 1, "__order": [1]}', '{"k": 2}'],  # no order field
        ['{"k": 1, "__order": [1]}', "[2]"],  # not an object
        ['{"k": 1, "__order": [1]}', '{"k": 2, "__order": [2]}, {"k": 3, "__order": [3]}'],
        ['{"k": 1, "__order": [1]', "}"],  # one object over two lines
        ['{"k": 1, "__order": [1]}', ""],
    ],
)
def test_an_output_file_whose_lines_are_not_one_row_each_is_refused(
    tmp_path: Path, lines: list[str]
) -> None:
    # The rows of an output part are parsed in one call (a sink reads every batch on the
    # driver); a file whose lines are not one JSON object each must still be refused.
    from txstream.spark.runtime.results import _output_rows

    part = tmp_path / "p00000.jsonl"
    part.write_text("\n".join(lines) + "\n")
    with pytest.raises(StoreError, match=str(part)):
        _output_rows(part)
    part.write_text('{"k": 2, "__order": [2]}\n{"k": 1, "__order": [1]}\n')
    assert _output_rows(part) == [([2], {"k": 2}), ([1], {"k": 1})]


# -- a full disk mid-batch -------------------------------------------------------------------


@pytest.mark.parametrize("nth", [1, 4, 9])
def test_a_full_disk_mid_batch_is_one_line_and_the_restart_gives_the_same_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nth: int
) -> None:
    # A write the disk refused reached the user as a bare OSError traceback
    # ("[Errno 28] No space left on device") that named no file.
    import errno
    import os

    from txstream.spark.runtime import store_files

    whole = tmp_path / "whole"
    run(whole, 4)
    store = tmp_path / "full"
    run(store, 2)
    replace, calls = os.replace, []

    def refuse(src: Any, dst: Any) -> None:
        calls.append(dst)
        if len(calls) == nth:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        replace(src, dst)

    monkeypatch.setattr(store_files.os, "replace", refuse)
    with pytest.raises(StoreError) as err:
        run(store, 2, start=2)
    assert f"cannot write {calls[-1]}: No space left on device" in one_line(err)
    monkeypatch.setattr(store_files.os, "replace", replace)
    assert not [p for p in store.rglob("*") if ".tmp-" in p.name]
    done = len(RuntimeStore(store).committed())
    run(store, 4 - done, start=done)
    assert table(store) == table(whole)
    assert tx.read_output(store, "seen") == tx.read_output(whole, "seen")
