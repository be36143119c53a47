"""Kills a Spark driver JVM, and every process under it, when its Python driver dies.

PySpark's JVM ends by itself when the pipe on its standard input reaches EOF,
that is when every process holding the pipe's other end is gone: a process the
Python driver forked (a ``multiprocessing`` worker, say) keeps it open, and the
JVM, its Python workers and a ``local-cluster``'s executor JVMs then live on
after a SIGKILL of the driver.  And even on EOF the JVM runs its shutdown hooks
first, with its tasks still running.

:func:`txstream.spark.session.local_session` starts this file as a small
detached process (its own session, so that a Ctrl-C in the driver's terminal
does not reach it) with ``python -I jvmwatchdog.py DRIVER JVM``, its standard
input a pipe from the driver.  It waits (through pidfds on Linux, so that a
recycled pid cannot fool it) for the driver or the JVM to end.  When the JVM
ends first it exits.  When the driver ends, it freezes the JVM and all its
descendants (``SIGSTOP``, so that none forks or writes any more) and kills
them (``SIGKILL``) at once, unless the driver wrote :data:`CLEAN_EXIT` to the
pipe before it ended (a normal interpreter exit, see
``session._watch_jvm``): Spark's own shutdown then gets :data:`GRACE_S` to
end the JVM before the same kill.

It imports only the standard library and is run by path with ``-I``, so it
starts fast and does not depend on the driver's ``PYTHONPATH``.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from pathlib import Path

POLL_S = 0.2
"""How often to look at the processes where pidfds are not available."""

GRACE_S = 30.0
"""After a normal exit of the driver: how long the JVM gets to end on its own."""

CLEAN_EXIT = b"x"
"""Written by the driver to the watchdog's standard input when it exits normally."""


def start_time(pid: int) -> str | None:
    """Process ``pid``'s start time (clock ticks since boot); ``None`` if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; it ends at the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def children() -> dict[int, list[int]]:
    """Every process's children, from ``/proc``."""
    found: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        found.setdefault(parent, []).append(int(entry.name))
    return found


def tree(pid: int) -> list[int]:
    """``pid`` and its descendants, parents before children."""
    kids = children()
    found, i = [pid], 0
    while i < len(found):
        found.extend(kids.get(found[i], ()))
        i += 1
    return found


def kill_tree(pid: int) -> list[int]:
    """Freeze ``pid`` and its descendants, then kill them all; returns their pids.

    Frozen top-down and looked at again until no new process appears, so that
    none forks a child (a Python worker) that escapes, or is re-parented
    (lost from the tree) because its parent died first.
    """
    frozen: list[int] = []
    while True:
        new = [p for p in tree(pid) if p not in frozen]
        if not new:
            break
        for p in new:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGSTOP)
            frozen.append(p)
    for p in frozen:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
    return frozen


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def wait(driver: int, driver_start: str, jvm: int, jvm_start: str) -> str:
    """Block until the driver ends (``"driver"``) or the JVM does (``"jvm"``)."""
    fds = {name: _pidfd(pid) for name, pid in (("driver", driver), ("jvm", jvm))}
    try:
        while True:
            if start_time(jvm) != jvm_start:
                return "jvm"
            if start_time(driver) != driver_start:
                return "driver"
            ready = [fd for fd in fds.values() if fd is not None]
            if len(ready) == 2:
                select.select(ready, [], [])
            else:
                time.sleep(POLL_S)
    finally:
        for fd in fds.values():
            if fd is not None:
                os.close(fd)


def main(argv: list[str]) -> int:
    """``DRIVER JVM`` pids; see the module docstring."""
    driver, jvm = int(argv[0]), int(argv[1])
    driver_start, jvm_start = start_time(driver), start_time(jvm)
    if jvm_start is None:
        return 0
    if driver_start is None or wait(driver, driver_start, jvm, jvm_start) == "driver":
        clean = False
        # Without waiting: a process the driver forked may hold the pipe open.
        with contextlib.suppress(OSError, ValueError):
            if select.select([0], [], [], 0)[0]:
                clean = CLEAN_EXIT in os.read(0, 64)
        if clean:
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline and start_time(jvm) == jvm_start:
                time.sleep(POLL_S)
        if start_time(jvm) == jvm_start:
            kill_tree(jvm)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
