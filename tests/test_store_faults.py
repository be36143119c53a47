"""The store under faults: a second owner, a full disk, damaged logs and checkpoints, fsync errors.

Each test reproduces one failure of issue 15 (items 1-5) against the public
API; faults are injected through ``txstream.storage.wal._write`` and
``_fsync`` (the log's only calls to ``os.write`` and ``os.fsync``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.storage import (
    CheckpointCorruptError,
    LogCorruptError,
    LogWriteError,
    StorageError,
    Store,
    StoreFailedError,
    StoreLockedError,
)
from txstream.storage import wal as walmod
from txstream.txn import TransactionManager

CHILD_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def _commit_many(tm: TransactionManager, n: int, start: int = 0) -> None:
    acct = tm.table("acct")
    for i in range(start, start + n):
        with tm.begin() as t:
            t.put(acct, i, i)
            t.commit_offset("src", i + 1)


def _rows(path: Path) -> dict[object, object]:
    tm = TransactionManager(path=path)
    try:
        return dict(tm.table("acct").rows())
    finally:
        tm.close()


# -- 1. one owner per store directory -------------------------------------------------------


OPENER = """
import sys
from txstream.txn import TransactionManager
from txstream.errors import TxStreamError
try:
    tm = TransactionManager(path=sys.argv[1])
except TxStreamError as exc:
    print(type(exc).__name__, exc, sep="|")
    sys.exit(3)
with tm.begin() as t:
    t.put(tm.table("acct"), "child", 1)
print("ready", flush=True)
sys.stdin.readline()
tm.close()
"""


def test_a_second_process_cannot_open_an_owned_store(tmp_path: Path) -> None:
    tm = TransactionManager(path=tmp_path)
    _commit_many(tm, 5)
    log = tmp_path / "wal.log"
    before = log.read_bytes()
    child = subprocess.run(
        [sys.executable, "-c", OPENER, str(tmp_path)],
        capture_output=True,
        text=True,
        env=CHILD_ENV,
        timeout=60,
    )
    assert child.returncode == 3, child.stderr
    kind, message = child.stdout.strip().split("|")
    assert kind == "StoreLockedError"
    assert f"process {os.getpid()}" in message and "\n" not in message
    assert log.read_bytes() == before  # the refused opener wrote nothing
    # A second opener in this very process is refused too.
    with pytest.raises(StoreLockedError, match="another open store of this process"):
        TransactionManager(path=tmp_path)
    tm.close()
    # Closed: the directory can be owned again, here or elsewhere.
    assert _rows(tmp_path) == {i: i for i in range(5)}


def test_a_store_owned_by_another_process_names_it(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", OPENER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=CHILD_ENV,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(StoreLockedError, match=f"in use by process {child.pid} on host"):
            Store(tmp_path)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=60) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert _rows(tmp_path) == {"child": 1}


def test_the_lock_dies_with_its_process(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", OPENER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=CHILD_ENV,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.kill()
    child.wait()
    assert _rows(tmp_path) == {"child": 1}


# -- 2. a failed write (disk full) ----------------------------------------------------------


class DiskFull:
    """Writes part of the ``fail_at``-th record, then raises ENOSPC until ``space()``."""

    def __init__(self, fail_at: int) -> None:
        self.calls = 0
        self.fail_at = fail_at
        self.full = False

    def __call__(self, fd: int, data: memoryview) -> int:
        self.calls += 1
        if self.calls == self.fail_at:
            self.full = True
            return os.write(fd, data[: max(1, len(data) // 2)])
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    def space(self) -> None:
        self.full = False


@pytest.mark.parametrize("protocol", ["ss2pl", "optimistic"])
def test_disk_full_cuts_the_log_back_and_later_commits_survive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    tm = TransactionManager(protocol, path=tmp_path, sync="group")
    acct = tm.table("acct")
    out = tm.stream("out")
    _commit_many(tm, 3)
    size = (tmp_path / "wal.log").stat().st_size
    disk = DiskFull(fail_at=1)
    monkeypatch.setattr(walmod, "_write", disk)
    t = tm.begin()
    t.put(acct, 1, "changed")
    t.append(out, "lost")
    t.commit_offset("src", 99)
    with pytest.raises(LogWriteError, match=r"No space left on device.*cut back"):
        t.commit()
    assert t.status == "aborted"
    # Memory is unchanged and the log ends at its last good record.
    assert acct.read(1) == 1 and out.committed() == [] and tm.offset("src") == 3
    assert (tmp_path / "wal.log").stat().st_size == size
    with pytest.raises(LogWriteError):  # still full
        _commit_many(tm, 1, start=50)
    disk.space()
    _commit_many(tm, 20, start=3)
    tm.close()
    again = TransactionManager(protocol, path=tmp_path)
    assert again.recovery.clean
    assert again.table("acct").rows() == {i: i for i in range(23)}
    assert again.offset("src") == 23 and again.stream("out").committed() == []
    again.close()


def test_a_write_that_cannot_be_cut_back_fails_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tm = TransactionManager(path=tmp_path)
    _commit_many(tm, 2)
    monkeypatch.setattr(walmod, "_write", DiskFull(fail_at=1))

    def no_truncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(walmod.os, "ftruncate", no_truncate)
    with pytest.raises(StoreFailedError, match="cutting the partial record off"):
        _commit_many(tm, 1, start=2)
    monkeypatch.undo()
    with pytest.raises(StoreFailedError, match="refuses commits"):
        _commit_many(tm, 1, start=3)
    tm.close()


# -- 3. damage in the middle of the log is not a torn tail ----------------------------------


def _record_offsets(log: Path) -> list[int]:
    data = log.read_bytes()
    pos, offsets = len(walmod.MAGIC), []
    while pos < len(data):
        offsets.append(pos)
        length = int.from_bytes(data[pos : pos + 4], "little")
        pos += 8 + length
    return offsets


def test_a_flipped_length_bit_stops_recovery_and_keeps_a_copy(tmp_path: Path) -> None:
    tm = TransactionManager(path=tmp_path)
    _commit_many(tm, 300)
    tm.close()
    log = tmp_path / "wal.log"
    offsets = _record_offsets(log)
    damaged_at = offsets[10]
    data = bytearray(log.read_bytes())
    data[damaged_at + 2] ^= 0x04  # the length now runs far past the end of the file
    log.write_bytes(bytes(data))
    with pytest.raises(LogCorruptError) as err:
        TransactionManager(path=tmp_path)
    message = str(err.value)
    assert f"torn record at byte {damaged_at}" in message
    assert f"{len(offsets) - 11} good records follow" in message and "\n" not in message
    assert log.read_bytes() == bytes(data)  # nothing was cut
    copies = list(tmp_path.glob(f"wal.log.corrupt-*-from-{damaged_at}"))
    assert len(copies) == 1 and copies[0].name in message
    assert copies[0].read_bytes() == bytes(data[damaged_at:])
    # Opening again does not pile up copies.
    with pytest.raises(LogCorruptError):
        Store(tmp_path)
    assert len(list(tmp_path.glob("wal.log.corrupt-*"))) == 1
    # Asked to, recovery keeps the records before the damage and says what it cut.
    kept = TransactionManager(path=tmp_path, on_damage="truncate")
    assert kept.recovery.corrupt and "copied to" in kept.recovery.problem
    assert kept.table("acct").rows() == {i: i for i in range(9)}  # record 0 defines the table
    kept.close()


@settings(max_examples=60)
@given(st.data())
def test_any_bit_flip_in_the_log_loses_nothing_silently(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp)
        tm = TransactionManager(path=path, sync="off")
        _commit_many(tm, 30)
        tm.close()
        log = path / "wal.log"
        original = log.read_bytes()
        offsets = _record_offsets(log)
        bit = data.draw(st.integers(len(walmod.MAGIC) * 8, len(original) * 8 - 1))
        damaged = bytearray(original)
        damaged[bit // 8] ^= 1 << (bit % 8)
        log.write_bytes(bytes(damaged))
        hit = max(i for i, off in enumerate(offsets) if off <= bit // 8)
        if hit < len(offsets) - 1:
            # Good records follow the damaged one: stop, change nothing.
            with pytest.raises(LogCorruptError, match="good records follow"):
                Store(path)
            assert log.read_bytes() == bytes(damaged)
        else:
            # The last record: cut off like a torn tail, with a copy.
            store = Store(path)
            assert store.recovery is not None and store.recovery.problem
            assert store.recovery.records == len(offsets) - 1
            assert list(path.glob("wal.log.corrupt-*"))
            store.close()


# -- 4. checkpoints are checksummed and validated -------------------------------------------


def _checkpointed(path: Path) -> Path:
    tm = TransactionManager(path=path)
    acct = tm.table("acct")
    with tm.begin() as t:
        t.put(acct, "total", 10000)
        t.commit_offset("src", 200)
    tm.checkpoint()
    tm.close()
    return path / "checkpoint.json"


def test_a_changed_digit_in_a_checkpoint_is_detected(tmp_path: Path) -> None:
    file = _checkpointed(tmp_path)
    good = file.read_bytes()
    assert json.loads(good)["version"] == 2  # still a JSON document
    for old, new in ((b"10000", b"18000"), (b'"src":200', b'"src":100')):
        file.write_bytes(good.replace(old, new))
        with pytest.raises(CheckpointCorruptError, match=r"checksum mismatch.*loaded nothing"):
            TransactionManager(path=tmp_path)
    file.write_bytes(good)
    tm = TransactionManager(path=tmp_path)
    assert tm.table("acct").rows() == {"total": 10000} and tm.offset("src") == 200
    assert "checksum verified" in str(tm.recovery)
    tm.close()


@settings(max_examples=80)
@given(st.data())
def test_any_bit_flip_in_a_checkpoint_is_detected(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        file = _checkpointed(Path(tmp))
        good = file.read_bytes()
        bit = data.draw(st.integers(0, len(good) * 8 - 1))
        damaged = bytearray(good)
        damaged[bit // 8] ^= 1 << (bit % 8)
        file.write_bytes(bytes(damaged))
        with pytest.raises(CheckpointCorruptError):
            Store(tmp)


def _crafted(path: Path, body: bytes) -> None:
    """A checkpoint with a *valid* checksum around arbitrary contents."""
    head = b'{"format":"txstream-checkpoint","version":2,"length":%d,"crc32":%d,"state":' % (
        len(body),
        zlib.crc32(body),
    )
    path.mkdir(exist_ok=True)
    (path / "checkpoint.json").write_bytes(head + body + b"}\n")


NASTY = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"ts":1,"tables":{"a":[[' + b"[" * 50_000 + b"]" * 50_000 + b',1]]},"streams":{},'
    b'"offsets":{}}',
    b'{"ts":1,"tables":{},"streams":{"s":{"events":[[1000000000000,1]]}},"offsets":{}}',
    b'{"ts":1,"tables":{},"streams":{"s":{"events":[[-5,1]]}},"offsets":{}}',
    b'{"ts":1,"tables":{},"streams":{"s":{"events":[[3,1],[2,1]]}},"offsets":{}}',
    b'{"ts":1,"tables":{},"streams":{"s":{"events":[[1]]}},"offsets":{}}',
    b'{"ts":1,"tables":{"a":[[1]]},"streams":{},"offsets":{}}',
    b'{"ts":1,"tables":{"a":[[{"k":1},1]]},"streams":{},"offsets":{}}',
    b'{"ts":1,"tables":{"a b":[]},"streams":{},"offsets":{}}',
    b'{"ts":1,"tables":[],"streams":{},"offsets":{}}',
    b'{"ts":"1","tables":{},"streams":{},"offsets":{}}',
    b'{"ts":1,"tables":{},"streams":{"s":{"events":[],"range_size":-1}},"offsets":{}}',
    b'{"ts":1,"tables":{},"streams":{"s":{"events":[],"order_by":[1]}},"offsets":{}}',
    b'{"ts":1,"tables":{},"streams":{},"offsets":[]}',
]


@pytest.mark.parametrize("body", NASTY, ids=range(len(NASTY)))
def test_crafted_checkpoints_are_refused_without_crashing(tmp_path: Path, body: bytes) -> None:
    _crafted(tmp_path, body)
    with pytest.raises(CheckpointCorruptError):
        Store(tmp_path)
    Store(tmp_path / "other").close()  # and the failed open left no lock behind
    (tmp_path / "checkpoint.json").unlink()
    Store(tmp_path).close()


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=20,
)
STATES = st.fixed_dictionaries(
    {"ts": JSON, "tables": JSON, "streams": JSON, "offsets": JSON}
) | st.fixed_dictionaries(
    {
        "ts": st.integers(0, 10),
        "tables": st.dictionaries(st.sampled_from(["a", "b"]), JSON),
        "streams": st.dictionaries(
            st.sampled_from(["s"]), st.fixed_dictionaries({"events": JSON}, optional={"x": JSON})
        ),
        "offsets": st.dictionaries(st.text(max_size=3), JSON),
    }
)


@settings(max_examples=100)
@given(STATES)
def test_random_crafted_checkpoints_load_or_are_refused(state: object) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _crafted(Path(tmp), json.dumps(state).encode())
        with contextlib.suppress(CheckpointCorruptError):
            Store(tmp).close()


def test_old_checkpoints_without_a_checksum_still_load(tmp_path: Path) -> None:
    state = {"ts": 3, "tables": {"acct": [["a", 1]]}, "streams": {}, "offsets": {"src": 3}}
    (tmp_path / "checkpoint.json").write_text(json.dumps(state, separators=(",", ":")))
    tm = TransactionManager(path=tmp_path)
    assert tm.table("acct").rows() == {"a": 1} and tm.offset("src") == 3
    assert "without a checksum" in str(tm.recovery)
    tm.close()


def _two_checkpoints(path: Path) -> None:
    """Commits 0-4, checkpoint, 5-9, checkpoint, 10-12 (then closed)."""
    tm = TransactionManager(path=path)
    _commit_many(tm, 5)
    tm.checkpoint()
    _commit_many(tm, 5, start=5)
    tm.checkpoint()
    _commit_many(tm, 3, start=10)
    tm.close()


def test_a_damaged_checkpoint_falls_back_to_the_older_one_and_the_logs(tmp_path: Path) -> None:
    _two_checkpoints(tmp_path)
    assert (tmp_path / "checkpoint.prev.json").exists() and (tmp_path / "wal.prev.log").exists()
    file = tmp_path / "checkpoint.json"
    file.write_bytes(file.read_bytes().replace(b'"src":10', b'"src":90'))
    tm = TransactionManager(path=tmp_path)
    assert tm.table("acct").rows() == {i: i for i in range(13)} and tm.offset("src") == 13
    report = tm.recovery
    assert not report.clean and report.corrupt
    assert "checksum mismatch" in report.checkpoint_problem
    assert "checkpoint.prev.json" in str(report)
    copies = list(tmp_path.glob("checkpoint.json.corrupt-*"))
    assert len(copies) == 1 and copies[0].name in str(report)
    # The next checkpoint replaces the damaged one; recovery is clean again.
    _commit_many(tm, 2, start=13)
    tm.checkpoint()
    _commit_many(tm, 1, start=15)
    tm.close()
    again = TransactionManager(path=tmp_path)
    assert again.recovery.clean and again.table("acct").rows() == {i: i for i in range(16)}
    again.close()


def test_a_fallback_with_a_gap_in_the_logs_is_refused(tmp_path: Path) -> None:
    _two_checkpoints(tmp_path)
    (tmp_path / "wal.prev.log").unlink()
    file = tmp_path / "checkpoint.json"
    file.write_bytes(file.read_bytes().replace(b'"src":10', b'"src":90'))
    with pytest.raises(
        CheckpointCorruptError, match=r"checksum mismatch.*miss the commits 6\.\.10"
    ):
        TransactionManager(path=tmp_path)


def test_a_crash_inside_a_checkpoint_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tm = TransactionManager(path=tmp_path)
    _commit_many(tm, 5)
    tm.checkpoint()
    _commit_many(tm, 5, start=5)
    real_replace = os.replace

    def crash_before_the_new_checkpoint(src: object, dst: object) -> None:
        if str(src).endswith("checkpoint.json.tmp"):
            raise OSError(errno.EIO, "Input/output error")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", crash_before_the_new_checkpoint)
    with pytest.raises(StorageError, match="recovery still finds every commit"):
        tm.checkpoint()
    monkeypatch.undo()
    assert not (tmp_path / "checkpoint.json").exists()  # moved to checkpoint.prev.json
    _commit_many(tm, 2, start=10)
    tm.close()
    again = TransactionManager(path=tmp_path)
    assert again.table("acct").rows() == {i: i for i in range(12)}
    assert "was never written" in str(again.recovery)
    again.checkpoint()
    again.close()
    third = TransactionManager(path=tmp_path)
    assert third.recovery.clean and third.table("acct").rows() == {i: i for i in range(12)}
    third.close()


# -- 5. fsync fails ---------------------------------------------------------------------------


class FsyncFails:
    """``os.fsync`` for the log that raises EIO from the ``fail_at``-th call on.

    ``hold``: the failing call first waits for this event (so that followers
    pile up behind a group-commit leader).
    """

    def __init__(self, fail_at: int, hold: threading.Event | None = None) -> None:
        self.calls = 0
        self.fail_at = fail_at
        self.hold = hold
        self.entered = threading.Event()

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.calls < self.fail_at:
            os.fsync(fd)
            return
        self.entered.set()
        if self.hold is not None:
            self.hold.wait(600)  # (a bound on a hang: the test sets it)
        raise OSError(errno.EIO, "Input/output error")


def _in_thread(fn, timeout: float = 120.0) -> BaseException | None:  # type: ignore[no-untyped-def]
    """Run ``fn`` in a daemon thread; return what it raised; fail if it hangs."""
    box: list[BaseException | None] = [None]

    def body() -> None:
        try:
            fn()
        except BaseException as exc:
            box[0] = exc

    th = threading.Thread(target=body, daemon=True)
    th.start()
    th.join(timeout)
    assert not th.is_alive(), "hung"
    return box[0]


def test_fsync_failure_with_sync_commit_fails_the_store_without_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tm = TransactionManager(path=tmp_path, sync="commit")
    acct = tm.table("acct")
    _commit_many(tm, 3)
    monkeypatch.setattr(walmod, "_fsync", FsyncFails(fail_at=1))
    t = tm.begin()
    t.put(acct, 1, "doomed")
    error = _in_thread(t.commit)
    assert isinstance(error, StoreFailedError)
    assert "Input/output error" in str(error) and "not made durable" in str(error)
    assert t.status == "aborted" and not t.locks

    def next_on_same_row() -> None:
        with tm.begin() as u:
            u.put(acct, 1, "later")

    error = _in_thread(next_on_same_row)
    assert isinstance(error, StoreFailedError) and "refuses commits" in str(error)
    assert "refuses" in str(_in_thread(lambda: _commit_many(tm, 1, start=7)))
    with pytest.raises(StoreFailedError):
        tm.checkpoint()
    tm.close()
    monkeypatch.undo()
    # Reopened: exactly the acknowledged commits, not the one whose commit raised.
    assert _rows(tmp_path) == {0: 0, 1: 1, 2: 2}


@pytest.mark.parametrize("protocol", ["ss2pl", "optimistic"])
def test_fsync_failure_in_group_commit_wakes_every_follower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    tm = TransactionManager(protocol, path=tmp_path, sync="group")
    acct = tm.table("acct")
    _commit_many(tm, 2)
    hold = threading.Event()
    fault = FsyncFails(fail_at=1, hold=hold)
    monkeypatch.setattr(walmod, "_fsync", fault)
    results: dict[int, BaseException | None] = {}

    def worker(i: int) -> None:
        try:
            with tm.begin() as t:
                t.put(acct, 100 + i, i)
            results[i] = None
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(6)]
    threads[0].start()
    assert fault.entered.wait(120)  # the leader is inside the failing fsync
    for th in threads[1:]:
        th.start()
    # The followers have written their records and wait for the leader's fsync
    # (the log's condition variable: CPython's list of the threads waiting on it).
    deadline = time.monotonic() + 600  # (a bound on a hang, not a speed requirement)
    while len(tm.store.wal._cv._waiters) < 5:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the followers never queued behind the leader"
        time.sleep(0.001)
    hold.set()
    for th in threads:
        th.join(120)
        assert not th.is_alive(), "a group-commit follower was never woken"
    assert all(isinstance(results[i], StoreFailedError) for i in range(6)), results
    tm.close()
    monkeypatch.undo()
    assert _rows(tmp_path) == {0: 0, 1: 1}


def test_disk_full_after_a_checkpoint_cuts_at_the_right_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After a checkpoint the log's positions (LSNs) no longer equal file offsets.
    tm = TransactionManager(path=tmp_path)
    _commit_many(tm, 5)
    tm.checkpoint()
    _commit_many(tm, 2, start=5)
    size = (tmp_path / "wal.log").stat().st_size
    disk = DiskFull(fail_at=1)
    monkeypatch.setattr(walmod, "_write", disk)
    with pytest.raises(LogWriteError):
        _commit_many(tm, 1, start=7)
    assert (tmp_path / "wal.log").stat().st_size == size
    disk.space()
    _commit_many(tm, 3, start=7)
    tm.close()
    again = TransactionManager(path=tmp_path)
    assert again.recovery.clean and again.table("acct").rows() == {i: i for i in range(10)}
    again.close()


@pytest.mark.parametrize("sync", ["commit", "group"])
def test_after_an_fsync_failure_exactly_the_acknowledged_commits_survive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: str
) -> None:
    tm = TransactionManager(path=tmp_path, sync=sync)
    acct = tm.table("acct")
    fault = FsyncFails(fail_at=40)
    monkeypatch.setattr(walmod, "_fsync", fault)
    acknowledged: list[str] = []
    refused: list[BaseException] = []

    def worker(i: int) -> None:
        for j in range(200):
            key = f"{i}-{j}"
            try:
                with tm.begin() as t:
                    t.put(acct, key, j)
            except StoreFailedError as exc:
                refused.append(exc)
                return
            acknowledged.append(key)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(20)
        assert not th.is_alive(), "a committer hung after the fsync failure"
    assert len(refused) == 6 and fault.calls >= 40
    assert all("Input/output error" in str(e) for e in refused)
    tm.close()
    monkeypatch.undo()
    assert set(_rows(tmp_path)) == set(acknowledged)


@pytest.mark.parametrize("step", [1, 2, 3, 4])
def test_a_failure_at_any_rename_of_a_checkpoint_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: int
) -> None:
    # The renames of a checkpoint: checkpoint.json -> .prev, the new file into
    # place, wal.log -> wal.prev.log, the new log into place.
    tm = TransactionManager(path=tmp_path)
    _commit_many(tm, 4)
    tm.checkpoint()
    _commit_many(tm, 4, start=4)
    real_replace = os.replace
    calls = [0]

    def failing_replace(src: object, dst: object) -> None:
        calls[0] += 1
        if calls[0] == step:
            raise OSError(errno.EIO, "Input/output error")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(StorageError):
        tm.checkpoint()
    monkeypatch.undo()
    if step <= 2:  # the checkpoint failed, the store goes on
        _commit_many(tm, 2, start=8)
        expected = 10
    else:  # the log could not be rotated: the store failed
        assert tm.store.failed
        expected = 8
    tm.close()
    again = TransactionManager(path=tmp_path)
    assert again.table("acct").rows() == {i: i for i in range(expected)}
    again.checkpoint()
    again.close()
    third = TransactionManager(path=tmp_path)
    assert third.recovery.clean and third.table("acct").rows() == {i: i for i in range(expected)}
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("*.new"))
    third.close()


CRAFTED_RECORDS = [
    b'{"ts":1,"events":[["s",1000000000000,1]]}',
    b'{"ts":1,"events":[["s",-3,1]]}',
    b'{"ts":1,"rows":[["a",' + b"[" * 900 + b"]" * 900 + b",1]]}",
    b'{"ts":1,"rows":[["a",' + b"[" * 50_000 + b"]" * 50_000 + b",1]]}",
    b'{"ts":1,"rows":[["a"]]}',
    b'{"ts":1,"offsets":[1,2]}',
]


@pytest.mark.parametrize("body", CRAFTED_RECORDS, ids=range(len(CRAFTED_RECORDS)))
def test_crafted_log_records_are_refused_without_crashing(tmp_path: Path, body: bytes) -> None:
    # Records with a valid checksum but impossible contents.
    store = Store(tmp_path)
    store.table("a")
    store.stream("s")
    store.close()
    with (tmp_path / "wal.log").open("ab") as fh:
        fh.write(walmod.HEADER.pack(len(body), zlib.crc32(body)) + body)
    try:
        again = Store(tmp_path)
    except StorageError as exc:
        assert "bad log record" in str(exc)
    else:  # too deep to decode: a corrupt last record, cut off with a copy and reported
        assert again.recovery is not None and again.recovery.corrupt
        again.close()
