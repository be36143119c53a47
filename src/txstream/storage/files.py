"""Files a run leaves for the user: written whole or not at all, checked before the run.

A history, a summary or an answers file is written at the end of a run that may
have taken minutes; a full disk, Ctrl-C or a path that cannot be written must
neither leave a file cut short (a history cut between two operations still
parses, and ``txstream check`` would judge the prefix) nor be found only after
the run.  :func:`write_whole` writes through a temporary file and a rename,
:func:`writing` turns an ``OSError`` into one line naming the file, and
:func:`check_writable` / :func:`check_folder` refuse an impossible output
before the work starts.  Every failure is a one-line
:class:`~txstream.errors.TxStreamError`.

Every layer above the storage (the transaction manager's stress run, the
engines, the jobs, the command line) writes its files through these.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from txstream.errors import TxStreamError


def write_whole(path: Path, text: str, what: str = "") -> None:
    """Write ``text`` to ``path`` whole or not at all (a temporary file beside it, renamed).

    A full disk or Ctrl-C leaves no file cut short: a history cut between two
    operations still parses, and ``txstream check`` would judge the prefix.  A
    failure is one line, ``cannot write {what}{path}: reason``.
    """
    _refuse_special(path, what)
    tmp = _temp_beside(path)
    try:
        with writing(path, what):
            tmp.write_text(text)
            os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):  # (a folder we cannot write into holds none)
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def writing(path: Path, what: str = "") -> Iterator[None]:
    """Inside, an OSError becomes one line naming ``path``: ``cannot write {what}{path}: reason``.

    A write on a full disk raises an OSError that names no file (``write()``
    knows none), so the command line's last resort could only print ``cannot
    access: No space left on device``; wrap the writing of every file a command
    leaves for the user.
    """
    try:
        yield
    except OSError as exc:
        raise TxStreamError(f"cannot write {what}{path}: {exc.strerror or exc}") from None


def check_writable(path: Path, what: str = "") -> None:
    """Fail now, in one line, where :func:`write_whole` would fail later on ``path``.

    For a file written at the end of a long run: a missing folder, a folder we
    cannot write into, a folder, a link, a device, a pipe or a socket at ``path``
    is refused before the run.  It
    creates and removes the temporary file :func:`write_whole` uses and leaves
    ``path`` alone: opening ``path`` itself to check would create an empty file
    (left behind if the run or the final write fails) or empty an earlier one.
    """
    if path.is_dir():
        raise TxStreamError(f"cannot write {what}{path}: it is a folder")
    _refuse_special(path, what)
    tmp = _temp_beside(path)
    try:
        with writing(path, what):
            tmp.open("w").close()
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def check_folder(path: Path, what: str = "output folder ") -> None:
    """Make the output folder ``path`` now, and fail in one line if it cannot be written into.

    For a folder filled during or at the end of a long run: a regular file at
    ``path`` or above it, or a folder the user cannot write into, is refused
    before the run (``cannot create output folder P: P is a file``).
    It creates and removes a file in the folder to make sure.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
        reason = (
            exc.strerror or str(exc)
            if blocker is None
            else "it is a file"
            if blocker == path
            else f"{blocker} is a file"
        )
        raise TxStreamError(f"cannot create {what}{path}: {reason}") from None
    probe = path / f".txstream-probe-{os.getpid()}"
    try:
        try:
            probe.open("w").close()
        except OSError as exc:
            raise TxStreamError(f"cannot write into {what}{path}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)


def _refuse_special(path: Path, what: str) -> None:
    """Refuse a ``path`` that is a symbolic link, or exists and is not a regular file.

    The rename of :func:`write_whole` replaces what is at ``path``: given
    ``/dev/full`` or ``/dev/stdout`` (a link to ``/proc/self/fd/1``) as root, it
    put a regular file in place of the device or of the link for every later
    process; a named pipe's reader got nothing.
    """
    if path.is_symlink():
        raise TxStreamError(
            f"cannot write {what}{path}: it is a symbolic link (the file would replace the "
            "link); name a regular file"
        )
    if path.exists() and not path.is_file():
        raise TxStreamError(
            f"cannot write {what}{path}: it is not a regular file (a device, pipe or socket); "
            "name a regular file"
        )


def _temp_beside(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")
