"""The runtime store's file format: checksummed blobs, atomic writes, JSON records.

Every ``.bin`` file of a store (:mod:`~txstream.spark.runtime.state`) is
``MAGIC | crc32 | length | tagged JSON`` (:mod:`.codec`, never pickle) and is
written to a temporary name, fsynced and renamed, so a reader sees a whole file
or none; a damaged file is reported with its path (a one-line
:class:`~txstream.spark.runtime.errors.StoreError`) and never loaded.  Called
by the driver and by the tasks alike; these functions keep no state.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

from txstream.spark.runtime import codec
from txstream.spark.runtime.errors import StoreError

MAGIC = b"TXRT2\n"
OLD_MAGIC = b"TXRT1\n"
"""The pickle files of versions before the data format (refused, never loaded)."""
_HEADER = struct.Struct(">IQ")


def json_record(path: Path, what: str, line: str | None = None) -> dict[str, Any]:
    """The JSON object in ``path`` (or its ``line``); damaged, a :class:`StoreError` naming it."""
    try:
        record = json.loads(path.read_text() if line is None else line)
    except ValueError as exc:
        raise StoreError(f"{path}: damaged {what} ({exc})") from None
    if not isinstance(record, dict):
        raise StoreError(f"{path}: damaged {what} (not a JSON object)")
    return record


def usable_directory(path: Path, what: str) -> Path:
    """Create directory ``path`` (and its parents) unless it exists.

    A path that is a file, lies under a file, cannot be created or is not
    writable is a :class:`StoreError` naming it (``what``: "checkpoint", "store").
    """
    for folder in (path, *path.parents):
        if folder.exists() and not folder.is_dir():
            where = "is a file" if folder == path else f"is under {folder}, which is a file"
            raise StoreError(f"{what} {path} {where}; give a directory (a new one or the job's)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(
            f"{what} {path} cannot be created ({exc.strerror or exc}); "
            "give a directory you can write to"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise StoreError(f"{what} {path} is not writable; give a directory you can write to")
    return path


def write_atomic(path: Path, payload: bytes, durable: bool = True) -> None:
    """Write ``payload`` to ``path`` via a temporary file, fsync and rename.

    ``durable=False`` skips the fsyncs, for files that only live until the batch
    commits (a crash before the commit re-runs the batch, which rewrites them).
    A write the file system refuses (a full disk, a read-only or vanished
    directory) is a one-line :class:`StoreError` naming the file, and leaves no
    temporary file; what it belonged to did not commit, and runs again at the
    restart.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as handle:
            handle.write(payload)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
        if not durable:
            return
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        # (an OSError reached a new user as a traceback that named no file:
        # "[Errno 28] No space left on device")
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise StoreError(
            f"cannot write {path}: {exc.strerror or exc}; free space or make it writable, "
            "then restart (what did not commit runs again)"
        ) from None


def dump_blob(obj: Any) -> bytes:
    """``obj`` in the store's data format (:mod:`.codec`), behind a magic, a CRC-32, the length.

    A value the format does not hold is a :class:`StoreError`.
    """
    try:
        body = codec.dumps(obj)
    except codec.UnstorableValueError as exc:
        raise StoreError(str(exc)) from None
    return MAGIC + _HEADER.pack(zlib.crc32(body), len(body)) + body


def load_blob(path: Path) -> Any:
    """The object in ``path``; :class:`StoreError` when the file is damaged.

    A file of the pickle format of earlier versions is refused, never unpickled
    (unpickling runs whatever code the file names).
    """
    raw = path.read_bytes()
    head = len(MAGIC) + _HEADER.size
    if raw.startswith(OLD_MAGIC):
        raise StoreError(
            f"{path}: written by an older version of txstream (a pickle file, which this "
            "version never loads); start the job on a new checkpoint (or finish it with the "
            "older version first)"
        )
    if len(raw) < head or not raw.startswith(MAGIC):
        raise StoreError(f"{path}: not a txstream runtime file (damaged header)")
    crc, length = _HEADER.unpack_from(raw, len(MAGIC))
    body = raw[head:]
    if len(body) != length or zlib.crc32(body) != crc:
        raise StoreError(
            f"{path}: checksum mismatch (damaged file); restore it from a backup or "
            "remove the store to start over"
        )
    try:
        return codec.loads(body)
    except (ValueError, TypeError, KeyError) as exc:  # (a checksummed body: a writer's bug)
        raise StoreError(f"{path}: damaged file ({exc})") from None
