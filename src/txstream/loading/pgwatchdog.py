"""Stops a throwaway PostgreSQL server when the process that started it is gone.

:class:`txstream.loading.pgserver.PostgresServer` starts this file as a small
detached process (its own session, so a Ctrl-C to the parent's terminal does
not reach it) with ``python -I pgwatchdog.py PID START DIR PG_CTL [RUNAS...]``.
It waits for process ``PID`` to end (through a pidfd on Linux, so a recycled
pid cannot fool it; ``START`` is the process's start time from
``/proc/PID/stat``, checked in case the pid was already reused before the
watchdog looked), then stops the server in ``DIR/data`` with ``pg_ctl -m
immediate`` (run through ``RUNAS``, e.g. ``runuser -u postgres --``) and
deletes ``DIR``.  It exits quietly when ``DIR`` disappears first, which is what
a normal :meth:`PostgresServer.stop` does.

It imports only the standard library and is run by path with ``-I``, so it
starts fast and does not depend on the parent's ``PYTHONPATH``.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.5
"""How often the watchdog looks whether the server directory is still there."""

GRACE_S = 3.0
"""After the parent died: how long to keep stopping a server that is still starting."""


def start_time(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), ``None`` if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; it ends at the last ')'.
    return stat[stat.rindex(")") + 2 :].split()[19]


def alive(pid: int, started: str) -> bool:
    """Whether the very process ``pid`` that started at ``started`` still runs."""
    return start_time(pid) == started


def wait_for_exit(pid: int, started: str, folder: Path) -> bool:
    """Block until the parent ends (True) or ``folder`` is deleted (False)."""
    fd = None
    with contextlib.suppress(OSError, AttributeError):
        fd = os.pidfd_open(pid)
    try:
        if not alive(pid, started):
            return True
        while folder.is_dir():
            if fd is not None:
                ready, _, _ = select.select([fd], [], [], POLL_S)
                if ready:
                    return True
            else:
                time.sleep(POLL_S)
                if not alive(pid, started):
                    return True
        return False
    finally:
        if fd is not None:
            os.close(fd)


def stop_server(folder: Path, pg_ctl: str, runas: list[str], grace_s: float = GRACE_S) -> None:
    """Stop the server in ``folder/data`` (immediate mode) and delete ``folder``."""
    data = folder / "data"
    deadline = time.monotonic() + grace_s
    while True:
        if (data / "postmaster.pid").exists():
            subprocess.run(
                [*runas, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "-t", "30", "stop"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                check=False,
            )
        # A `pg_ctl start` the parent left running may bring a server up a moment
        # later: keep looking for a few seconds before deleting the folder.
        if time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    """``PID START DIR PG_CTL [RUNAS...]``; see the module docstring."""
    pid, started, folder, pg_ctl, runas = int(argv[0]), argv[1], Path(argv[2]), argv[3], argv[4:]
    if wait_for_exit(pid, started, folder):
        stop_server(folder, pg_ctl, runas)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
