"""Storage manager: streams, multi-version tables and the write-ahead log.

Data sources and sinks are sets of data items in the page model (EDBT 2012
Section 2.1).  :class:`Stream` is append-only with an ordering attribute and a
lock granularity; :class:`Table` holds keyed rows with a version chain per key
for snapshot reads; :class:`Store` is the catalog of both, with an optional
write-ahead log and recovery on open.  Concurrency control is the transaction
manager's job (:mod:`txstream.txn`), not this package's.
"""

from txstream.storage.base import (
    ABSENT,
    CheckpointCorruptError,
    DuplicateKeyError,
    LogCorruptError,
    LogWriteError,
    MissingKeyError,
    MissingRowError,
    OrderError,
    StorageError,
    StoreError,
    StoreFailedError,
    StoreLockedError,
    item_name,
)
from txstream.storage.recovery import RecoveryReport
from txstream.storage.store import Store
from txstream.storage.stream import GONE, GRANULARITIES, Stream
from txstream.storage.table import Table
from txstream.storage.wal import SYNC_MODES, LogScan, WriteAheadLog, read_log

__all__ = [
    "ABSENT",
    "GONE",
    "GRANULARITIES",
    "SYNC_MODES",
    "CheckpointCorruptError",
    "DuplicateKeyError",
    "LogCorruptError",
    "LogScan",
    "LogWriteError",
    "MissingKeyError",
    "MissingRowError",
    "OrderError",
    "RecoveryReport",
    "StorageError",
    "Store",
    "StoreError",
    "StoreFailedError",
    "StoreLockedError",
    "Stream",
    "Table",
    "WriteAheadLog",
    "item_name",
    "read_log",
]
