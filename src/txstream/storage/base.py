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
    """An insert named a key that already has a row."""

    def __str__(self) -> str:
        return str(self.args[0])


class MissingKeyError(StorageError, KeyError):
    """An update, delete or increment named a key that has no row."""

    def __str__(self) -> str:
        return str(self.args[0])


class OrderError(StorageError):
    """An event arrived out of order on a stream that requires its order."""


class LogCorruptError(StorageError):
    """A write-ahead-log record failed its checksum or is malformed."""


class CheckpointCorruptError(StorageError):
    """A checkpoint failed its checksum, has an unknown format or impossible contents."""


class StoreLockedError(StorageError):
    """Another process (or another open store in this one) owns the store directory."""


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
