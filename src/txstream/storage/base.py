"""Errors and small helpers shared by the storage classes.

Every data source and sink is a set of *data items* in the page model: a table
row is the item ``<table>.<key>``, a stream is one item (``<stream>``), one item
per event (``<stream>.<id>``) or one per range of event ids
(``<stream>.r<n>``), depending on its lock granularity.  Item names use only the
characters the history notation allows, so recorded runs can be printed and
checked as they are.
"""

from __future__ import annotations

import re
from typing import Any, Final

from txstream.errors import TxStreamError


class StorageError(TxStreamError):
    """A storage operation was given something it cannot do."""


class DuplicateKeyError(StorageError, KeyError):
    """An insert named a key that already has a row.

    Raised by the storage tables, the transaction manager and every engine's
    ``insert`` (``tx.Tx.insert``), where the transaction is rolled back:

    >>> import txstream as tx
    >>> job = (tx.Job().table("users", key="name").input("signups", None, keys="name")
    ...        .on("signups", lambda t, e: t.insert("users", {"name": e["name"]})))
    >>> _ = job.run_local([[("signups", {"name": "ada"}), ("signups", {"name": "ada"})]],
    ...                   "ckpt/duplicate")
    >>> tx.read_table("ckpt/duplicate", "users")
    [{'name': 'ada'}]
    >>> print(tx.read_failures("ckpt/duplicate")[0]["error"])
    DuplicateKeyError: insert into users: key 'ada' exists
    """

    def __str__(self) -> str:
        return str(self.args[0])


class MissingRowError(StorageError, KeyError):
    """An update, delete or increment named a key that has no row.

    Raised by the storage tables, the transaction manager and every engine's
    ``update``/``increment``/``delete`` (``tx.Tx``), where the transaction is
    rolled back:

    >>> import txstream as tx
    >>> job = (tx.Job().table("stock", key="item").input("sales", None, keys="item")
    ...        .on("sales", lambda t, e: t.increment("stock", e["item"], "n", -1)))
    >>> _ = job.run_local([[("sales", {"item": "pen"})]], "ckpt/missing")
    >>> print(tx.read_failures("ckpt/missing")[0]["error"])
    MissingRowError: increment of stock.n: no row with key 'pen'
    """

    def __str__(self) -> str:
        return str(self.args[0])


MissingKeyError = MissingRowError
"""The old name of :class:`MissingRowError` (``txstream.storage.MissingKeyError``), kept
for code that imports it."""


class OrderError(StorageError):
    """An event arrived out of order on a stream that requires its order."""


class StoreError(StorageError):
    """A store's file is damaged or the store is in use; the message names it.

    Every store file carries a checksum, so damage is found when it is read,
    never loaded as wrong data (here the runtime's store, ``tx.StoreError``):

    >>> import pathlib, txstream as tx
    >>> job = (tx.Job().table("kv", key="k").input("puts", None, keys="k")
    ...        .on("puts", lambda t, e: t.upsert("kv", e)))
    >>> _ = job.run_local([[("puts", {"k": 1, "v": "one"})]], "ckpt/damaged", partitions=1)
    >>> snapshot = pathlib.Path("ckpt/damaged/state/p00000/snap-000000000000.bin")
    >>> _ = snapshot.write_bytes(snapshot.read_bytes()[:-1] + b"!")
    >>> tx.read_table("ckpt/damaged", "kv")
    Traceback (most recent call last):
    txstream.storage.base.StoreError: ckpt/damaged/state/p00000/snap-000000000000.bin:
    checksum mismatch (damaged file); restore it from a backup or remove the store to start over
    """


class LogCorruptError(StoreError):
    """A write-ahead-log record failed its checksum or is malformed."""


class CheckpointCorruptError(StoreError):
    """A checkpoint failed its checksum, has an unknown format or impossible contents."""


class StoreLockedError(StoreError):
    """Another process (or another open store in this one) owns the store directory.

    One job runs per store: a second one (here the lock taken by hand, as
    another process's job would hold it) is refused before it writes anything.

    >>> import fcntl, os, txstream as tx
    >>> job = tx.Job().input("ev", None, keys="k").on("ev", lambda t, e: None)
    >>> _ = job.run_local([[("ev", {"k": 1})]], "ckpt/locked")
    >>> fd = os.open("ckpt/locked/LOCK", os.O_RDWR)
    >>> fcntl.flock(fd, fcntl.LOCK_EX)
    >>> job.run_local([[("ev", {"k": 2})]], "ckpt/locked")
    Traceback (most recent call last):
    txstream.storage.base.StoreLockedError: store ckpt/locked is in use by pid ...;
    stop that job first (one job per store)
    >>> os.close(fd)
    """


class LogWriteError(StorageError):
    """Writing a log record failed (e.g. the disk is full); the record was cut off again."""


class StoreFailedError(StorageError):
    """The store hit an I/O error it cannot vouch for; it refuses commits until reopened."""


class _Absent:
    """The marker for "no row": a deleted or never-inserted key."""

    _instance: _Absent | None = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Final = _Absent()
"""Stands for a missing row in version chains and undo records."""

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:\-]")


def item_name(*parts: Any) -> str:
    """Join ``parts`` with dots into a notation-safe item name.

    Characters the notation does not allow in items become ``_``.  Two keys that
    differ only in such characters then share an item: that can add conflicts
    to a recorded history (never hide one), so a check stays sound.
    """
    text = ".".join(str(p) for p in parts)
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub("_", text)


def check_name(kind: str, name: str) -> str:
    """Return ``name`` if it is a usable table or stream name, else raise."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_\-]+", name):
        raise StorageError(f"bad {kind} name {name!r}: use letters, digits, '_' and '-' (no dots)")
    return name
