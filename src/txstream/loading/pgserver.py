"""A throwaway PostgreSQL server for tests and benchmarks.

:class:`PostgresServer` makes a cluster with ``initdb`` in a temporary
directory and starts it with ``pg_ctl`` on a free loopback port; :meth:`stop`
shuts it down and deletes the directory.  ``initdb`` refuses to run as root, so
as root the server runs as the ``postgres`` system user (through ``runuser``).
The server binaries come from the Debian ``postgresql`` package
(``scripts/pg-install.sh`` installs it); :func:`find_bindir` looks on ``PATH``
and under ``/usr/lib/postgresql/*/bin``.

The cluster is tuned for loading experiments, not for safety: no fsync, a
lowered ``deadlock_timeout`` (the wait before a blocked backend checks for a
deadlock) and room in the lock table for the loader's value locks.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from txstream.errors import TxStreamError

INSTALL_HINT = "install it with scripts/pg-install.sh (apt-get install postgresql)"


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or ``None``."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0,
        reverse=True,
    )
    for d in candidates:
        if os.access(os.path.join(d, "initdb"), os.X_OK):
            return Path(d)
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PostgresServer:
    """A PostgreSQL cluster in a temporary directory, started on 127.0.0.1."""

    def __init__(
        self,
        *,
        deadlock_timeout_ms: int = 50,
        durable: bool = False,
        max_connections: int = 40,
        max_locks_per_transaction: int = 2048,
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.deadlock_timeout_ms = deadlock_timeout_ms
        self.durable = durable
        self.max_connections = max_connections
        self.max_locks = max_locks_per_transaction
        self.settings = dict(settings or {})
        self.dir: Path | None = None
        self.port = 0
        self.user = "postgres"
        self._runas: list[str] = []

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> PostgresServer:
        """Run initdb and pg_ctl start; :class:`TxStreamError` with the reason on failure."""
        bindir = find_bindir()
        if bindir is None:
            raise TxStreamError(f"PostgreSQL server binaries (initdb) not found; {INSTALL_HINT}")
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="txstream-pg-"))
        if os.geteuid() == 0:
            import pwd

            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise TxStreamError(
                    f"running as root needs the 'postgres' system user; {INSTALL_HINT}"
                ) from None
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._runas = ["runuser", "-u", "postgres", "--"]
        data = self.dir / "data"
        self._run(
            [
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                self.user,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            "initdb",
        )
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.dir}'",
            "deadlock_timeout": f"'{self.deadlock_timeout_ms}ms'",
            "max_connections": str(self.max_connections),
            "max_locks_per_transaction": str(self.max_locks),
            "shared_buffers": "'256MB'",
            "fsync": "on" if self.durable else "off",
            "synchronous_commit": "on" if self.durable else "off",
            "full_page_writes": "on" if self.durable else "off",
            "log_min_messages": "'fatal'",
            "log_min_error_statement": "'panic'",
            "autovacuum_naptime": "'5s'",
        }
        conf.update({k: str(v) for k, v in self.settings.items()})
        with (data / "postgresql.auto.conf").open("a") as fh:
            for k, v in conf.items():
                fh.write(f"{k} = {v}\n")
        last = ""
        for _ in range(5):
            self.port = free_port()
            try:
                self._run(
                    [
                        str(bindir / "pg_ctl"),
                        "-D",
                        str(data),
                        "-l",
                        str(self.dir / "server.log"),
                        "-o",
                        f"-p {self.port}",
                        "-w",
                        "-t",
                        "60",
                        "start",
                    ],
                    "pg_ctl start",
                )
                return self
            except TxStreamError as exc:
                last = str(exc)
                time.sleep(0.2)
        self.stop()
        raise TxStreamError(f"PostgreSQL did not start: {last}")

    def _run(self, argv: list[str], what: str) -> None:
        proc = subprocess.run(
            [*self._runas, *argv], capture_output=True, text=True, check=False, cwd="/"
        )
        if proc.returncode != 0:
            log = ""
            if self.dir is not None and (self.dir / "server.log").exists():
                log = (self.dir / "server.log").read_text(errors="replace")[-300:]
            text = (proc.stderr or proc.stdout).strip().replace("\n", " ")[-300:]
            raise TxStreamError(f"{what} failed: {text} {log}".strip())

    def stop(self) -> None:
        """Stop the server (fast shutdown) and delete its directory."""
        if self.dir is None:
            return
        data = self.dir / "data"
        if (data / "postmaster.pid").exists():
            with contextlib.suppress(TxStreamError):
                self._run(
                    [str(self.bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                    "stop",
                )
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def conninfo(self) -> str:
        """A libpq connection string for the ``postgres`` database."""
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname=postgres"
