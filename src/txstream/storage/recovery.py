"""Recovery of a durable :class:`~txstream.storage.store.Store`: its checkpoint, its log replayed.

:func:`recover` runs once, when a store with a ``path`` is opened (after it took
the directory's owner lock, see :class:`~txstream.storage.store.Store`): it loads
the newest good checkpoint (falling back to the older one and both logs when the
newest is damaged), replays the log's definitions and committed transactions,
and leaves a :class:`RecoveryReport` on the store.  It runs before the store is
shared with any other thread; nothing here writes a record.
"""

from __future__ import annotations

import json
import logging
import re
import zlib
from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from txstream.storage.base import ABSENT, CheckpointCorruptError, StorageError
from txstream.storage.stream import GRANULARITIES, Stream
from txstream.storage.table import Table
from txstream.storage.wal import LogScan, WriteAheadLog, read_log, save_tail

if TYPE_CHECKING:
    from txstream.storage.store import Store

log = logging.getLogger("txstream.storage")

CHECKPOINT_VERSION: Final = 2
_CHECKPOINT_HEAD: Final = re.compile(
    rb'\{"format":"txstream-checkpoint","version":(\d{1,9}),"length":(\d{1,15}),'
    rb'"crc32":(\d{1,10}),"state":'
)
# Replaying event ids with gaps creates holes (aborted appends); a damaged or
# crafted id far beyond the stream's end would allocate a hole per missing id.
# Recovery allows this many holes plus 8 per event it places.
HOLE_ALLOWANCE: Final = 1 << 20


@dataclass
class RecoveryReport:
    """What recovery found in the log when a durable store was opened."""

    path: str
    records: int = 0
    transactions: int = 0
    last_ts: int = 0
    problem: str | None = None
    corrupt: bool = False
    checkpoint: str | None = None
    checkpoint_problem: str | None = None

    @property
    def clean(self) -> bool:
        """True when every byte of the log was a good record and the checkpoint was good."""
        return self.problem is None and self.checkpoint_problem is None

    def __str__(self) -> str:
        text = (
            f"recovered {self.transactions} committed transactions from {self.records} "
            f"records of {self.path}"
        )
        if self.checkpoint:
            text += f" after {self.checkpoint}"
        if self.checkpoint_problem:
            text += f"; {self.checkpoint_problem}"
        if self.problem:
            text += f"; stopped at the last good record: {self.problem}"
        return text


def _key(value: Any) -> Hashable:
    """Turn a key read back from JSON into a hashable key (lists become tuples)."""
    if isinstance(value, list):
        return tuple(_key(v) for v in value)
    if isinstance(value, dict):
        raise StorageError(f"log holds an unhashable key {value!r}")
    result: Hashable = value
    return result


def recover(store: Store, path: Path, sync: str, group_delay: float, on_damage: str) -> None:
    """Load ``store``'s checkpoint, replay its log, open the log for new records (see above)."""
    checkpoint_ts, note, older = _recover_checkpoint(store, path)
    # A checkpoint cut short by a crash never replaced the real one.
    (path / "checkpoint.json.tmp").unlink(missing_ok=True)
    wal, scan = WriteAheadLog.open(path / "wal.log", sync, group_delay, on_damage)
    report = RecoveryReport(
        str(path / "wal.log"),
        records=len(scan.records),
        problem=scan.problem,
        corrupt=scan.corrupt,
        checkpoint=note,
    )
    if store._checkpoint_damaged:
        report.corrupt = True
        report.checkpoint = "checkpoint.prev.json and wal.prev.log"
        report.checkpoint_problem = note
    records = scan.records
    if older is not None:
        records = older.records + records
        report.records += len(older.records)
        try:
            _check_contiguous(records, checkpoint_ts)
        except CheckpointCorruptError as exc:
            wal.close()
            raise CheckpointCorruptError(f"{store._fallback_reason}, and {exc}") from None
    try:
        for record in records:
            if "def" in record:
                _replay_definition(store, record)
            elif int(record["ts"]) > checkpoint_ts:
                _replay_commit(store, record)
                report.transactions += 1
    except (
        StorageError,
        KeyError,
        TypeError,
        IndexError,
        ValueError,
        AttributeError,
        RecursionError,
    ) as exc:
        wal.close()
        raise StorageError(f"cannot recover {path}: bad log record ({exc})") from None
    report.last_ts = store.last_ts
    store.recovery = report
    store.wal = wal
    if not report.clean:
        log.warning("%s", report)


def _recover_checkpoint(store: Store, path: Path) -> tuple[int, str | None, LogScan | None]:
    """Load the newest good checkpoint: (its ts, a note, the older log to replay too).

    Normally that is ``checkpoint.json``, and only ``wal.log`` follows it.
    If it is damaged - or missing while ``checkpoint.prev.json`` exists (a
    crash inside :meth:`Store.checkpoint`) - the older checkpoint is loaded and
    ``wal.prev.log`` is replayed before ``wal.log``; a copy of the damaged
    file is kept and the report says so.  With no good checkpoint to use,
    :class:`CheckpointCorruptError`.
    """
    current, prev = path / "checkpoint.json", path / "checkpoint.prev.json"
    try:
        ts, note = _load_checkpoint(store, current)
    except CheckpointCorruptError as exc:
        if not prev.exists():
            raise CheckpointCorruptError(
                f"{exc}: recovery stopped and loaded nothing (there is no older "
                "checkpoint, and the log no longer holds what it covered); restore the "
                "store directory from a backup"
            ) from None
        damage: str | None = str(exc)
    else:
        if note is not None or not prev.exists():
            return ts, note, None
        damage = None
    store._fallback_reason = damage or f"{current} is missing"
    store.tables, store.streams, store.offsets = {}, {}, {}
    store.last_ts, store._holes = 0, store._hole_allowance
    try:
        ts, _ = _load_checkpoint(store, prev)
    except CheckpointCorruptError as exc:
        raise CheckpointCorruptError(
            f"{damage or f'{current} is missing'}, and the older one is no better ({exc}); "
            "recovery stopped and loaded nothing: restore the store directory from a backup"
        ) from None
    older_log = path / "wal.prev.log"
    older = read_log(older_log) if older_log.exists() else LogScan()
    if older.problem is not None:
        raise CheckpointCorruptError(
            f"{damage or f'{current} is missing'}, and {older_log} needed to replace it "
            f"is damaged too ({older.problem}); recovery stopped and loaded nothing"
        )
    if damage is None:
        return ts, f"{prev.name} and {older_log.name} ({current.name} was never written)", older
    store._checkpoint_damaged = True
    copy = save_tail(current, current.read_bytes(), 0)
    note = (
        f"{damage}; recovered from the older {prev.name} and {older_log.name} instead "
        f"(a copy of the damaged file is in {copy.name})"
    )
    return ts, note, older


def _check_contiguous(records: list[dict[str, Any]], since: int) -> None:
    """Refuse a fallback whose logs miss a commit (timestamps go up by one per commit)."""
    expected = since + 1
    for record in records:
        if "def" in record:
            continue
        ts = record.get("ts")
        if type(ts) is not int or ts <= since:
            continue
        if ts != expected:
            raise CheckpointCorruptError(
                f"the older checkpoint plus the logs miss the commits {expected}..{ts - 1}; "
                "recovery stopped and loaded nothing: restore the store directory from a "
                "backup"
            )
        expected += 1


def _load_checkpoint(store: Store, file: Path) -> tuple[int, str | None]:
    """Load ``checkpoint.json`` if there is one: (its timestamp, a note for the report).

    The checksum is verified and the structure validated before anything is
    loaded; any damage raises :class:`CheckpointCorruptError`.
    """
    if not file.exists():
        return 0, None
    data = file.read_bytes()
    head = _CHECKPOINT_HEAD.match(data)
    try:
        if head is not None:
            version, length, crc = (int(g) for g in head.groups())
            if version != CHECKPOINT_VERSION:
                raise CheckpointCorruptError(f"unknown checkpoint version {version}")
            body = data[head.end() : head.end() + length]
            if len(body) != length or data[head.end() + length :] != b"}\n":
                raise CheckpointCorruptError(
                    f"its length says {length} bytes of state, the file disagrees"
                )
            if zlib.crc32(body) != crc:
                raise CheckpointCorruptError("checksum mismatch")
            note = f"checkpoint {file.name} (checksum verified)"
        elif data.startswith(b'{"ts":'):
            # Written before checkpoints had a checksum: nothing to verify.
            body = data
            note = f"checkpoint {file.name} (old format without a checksum, not verified)"
        else:
            raise CheckpointCorruptError("not a txstream checkpoint (bad header)")
        try:
            state = json.loads(body)
        except ValueError as exc:
            raise CheckpointCorruptError(f"contents are not JSON ({exc})") from None
        ts = _load_state(store, state)
    except RecursionError:
        error = "nested too deeply"
    except CheckpointCorruptError as exc:
        error = str(exc)
    except (StorageError, ValueError, KeyError, TypeError, IndexError) as exc:
        error = f"impossible contents ({exc})"
    else:
        store.last_ts = max(store.last_ts, ts)
        return ts, note
    raise CheckpointCorruptError(f"checkpoint {file} is damaged: {error}")


def _load_state(store: Store, state: Any) -> int:
    """Validate a checkpoint's decoded state, then load it; return its timestamp."""
    bad = CheckpointCorruptError
    if not isinstance(state, dict) or set(state) != {"ts", "tables", "streams", "offsets"}:
        raise bad("its state is not an object with ts, tables, streams and offsets")
    ts = state["ts"]
    if type(ts) is not int or ts < 0:
        raise bad(f"timestamp {ts!r} is not a non-negative integer")
    tables, streams, offsets = state["tables"], state["streams"], state["offsets"]
    if not isinstance(tables, dict) or not isinstance(streams, dict):
        raise bad("tables and streams must be objects")
    if not isinstance(offsets, dict):
        raise bad("offsets must be an object")
    for name, rows in tables.items():
        if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == 2 for r in rows):
            raise bad(f"table {name}: rows must be [key, row] pairs")
    for name, spec in streams.items():
        if not isinstance(spec, dict) or not isinstance(spec.get("events"), list):
            raise bad(f"stream {name}: settings without an event list")
        if spec.get("granularity", "stream") not in GRANULARITIES:
            raise bad(f"stream {name}: unknown granularity")
        last = -1
        for pair in spec["events"]:
            if not isinstance(pair, list) or len(pair) != 2 or type(pair[0]) is not int:
                raise bad(f"stream {name}: events must be [id, event] pairs")
            if pair[0] <= last:
                raise bad(f"stream {name}: event ids are not increasing")
            last = pair[0]
        first = spec.get("first", 0)
        events = spec["events"]
        if type(first) is not int or first < 0 or (events and events[0][0] < first):
            raise bad(f"stream {name}: bad first id {first!r}")
    for name, rows in tables.items():
        table = store.tables.setdefault(name, Table(name))
        for key, row in rows:
            table.apply(_key(key), row, ts)
    for name, spec in streams.items():
        settings = {k: v for k, v in spec.items() if k not in ("events", "first")}
        _replay_definition(store, {"def": "stream", "name": name, **settings})
        stream = store.streams[name]
        # A trimmed stream starts at its first kept id (optional: older
        # checkpoints have none), so its trimmed ids are no holes to allocate.
        stream.start_at(spec.get("first", 0))
        for event_id, event in spec["events"]:
            _place(store, stream, event_id, event, ts)
    store.offsets.update(offsets)
    return ts


def _place(store: Store, stream: Stream, event_id: Any, event: Any, ts: int) -> None:
    """Replay one committed event, refusing ids that would allocate absurd gaps."""
    if type(event_id) is not int or event_id < 0:
        raise StorageError(f"stream {stream.name}: bad event id {event_id!r}")
    first, end = stream.first, len(stream)
    # Replay follows commit order: an id below the first one leaves holes before it.
    gap = first - event_id if event_id < first and end > first else event_id - end
    if gap > 0:
        store._holes -= gap
        if store._holes < 0:
            raise StorageError(
                f"stream {stream.name}: event id {event_id} leaves more holes than recovery "
                "allows (a damaged record?)"
            )
    store._holes += 8
    stream.place(event_id, event, ts)


def _replay_definition(store: Store, record: dict[str, Any]) -> None:
    name = record["name"]
    if record["def"] == "table":
        store.tables.setdefault(name, Table(name))
    elif record["def"] == "stream":
        if name not in store.streams:
            order_by = record.get("order_by")
            if order_by is not None and type(order_by) not in (str, int):
                raise StorageError(f"stream {name}: bad ordering attribute {order_by!r}")
            store.streams[name] = Stream(
                name,
                order_by,
                bool(record.get("require_order")),
                record.get("granularity", "stream"),
                record.get("range_size", 64),
            )
    else:
        raise StorageError(f"unknown definition {record['def']!r}")


def _replay_commit(store: Store, record: dict[str, Any]) -> None:
    ts = int(record["ts"])
    for row in record.get("rows", ()):
        table = store.get_table(row[0])
        table.apply(_key(row[1]), row[2] if len(row) > 2 else ABSENT, ts)
    for name, event_id, event in record.get("events", ()):
        _place(store, store.get_stream(name), event_id, event, ts)
    store.offsets.update(record.get("offsets", {}))
    store.last_ts = max(store.last_ts, ts)
