"""A throwaway PostgreSQL server for tests and benchmarks.

:class:`PostgresServer` makes a cluster with ``initdb`` in a temporary
directory and starts it with ``pg_ctl`` on a free loopback port; :meth:`stop`
shuts it down and deletes the directory.  ``initdb`` refuses to run as root, so
as root the server runs as the ``postgres`` system user (through ``runuser``).
The server binaries come from the Debian ``postgresql`` package
(``scripts/pg-install.sh`` installs it); :func:`find_bindir` looks on ``PATH``
and under ``/usr/lib/postgresql/*/bin``.

The cluster is tuned for loading experiments, not for durability: no fsync, a
lowered ``deadlock_timeout`` (the wait before a blocked backend checks for a
deadlock) and room in the lock table for the loader's value locks.

Access is locked down all the same, since the server runs as a superuser:

* no TCP listener (``listen_addresses = ''``): the only way in is the Unix
  socket in the server's own directory, which is mode 0700 (owned by the
  server's user), so other local users cannot even reach the socket;
* ``pg_hba.conf`` has one line, ``local all postgres scram-sha-256``: only the
  user ``postgres`` with the password, a random one made for each server
  (:attr:`PostgresServer.password`, part of :attr:`PostgresServer.conninfo`),
  never ``trust``.

The server must not outlive the process that started it, however that process
ends.  :meth:`PostgresServer.stop` stops it on a normal exit; for the rest
(SIGKILL, a crash) a watchdog (:mod:`txstream.loading.pgwatchdog`, a tiny
detached process) waits for the parent to end and stops the server with
``pg_ctl``.  As a last line, each :meth:`PostgresServer.start` first stops and
deletes the servers of earlier runs whose owner (recorded in ``owner.json`` in
the server directory) is no longer running, in case the watchdog was killed too.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from txstream.errors import TxStreamError

INSTALL_HINT = "install it with scripts/pg-install.sh (apt-get install postgresql)"
PREFIX = "txstream-pg-"
"""Name prefix of the server directories in the temporary folder."""
OWNER_FILE = "owner.json"
"""In a server directory: the pid and start time of the process that owns it."""
SOCKET_PORT = 5432
"""Names the socket file (``.s.PGSQL.5432``); there is no TCP port."""


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


def _start_time(pid: int) -> str | None:
    from txstream.loading.pgwatchdog import start_time

    return start_time(pid)


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def reap_stale(parent: Path | None = None) -> list[Path]:
    """Stop and delete the servers whose owning process is gone; return their folders.

    Looks at ``PREFIX*`` folders in ``parent`` (default: the temporary folder)
    with an :data:`OWNER_FILE`; a folder without one is skipped (an older
    version's, or one being created right now).
    """
    from txstream.loading.pgwatchdog import alive, stop_server

    root = Path(parent or tempfile.gettempdir())
    reaped: list[Path] = []
    for folder in sorted(root.glob(f"{PREFIX}*")):
        try:
            owner = json.loads((folder / OWNER_FILE).read_text())
            pid, started, pg_ctl = int(owner["pid"]), str(owner["start"]), str(owner["pg_ctl"])
            runas = [str(a) for a in owner.get("runas", [])]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if owner.get("pidns") != _pid_namespace() or alive(pid, started):
            # A pid from another pid namespace (a container sharing /tmp) says nothing here.
            continue
        stop_server(folder, pg_ctl, runas, grace_s=0.0)
        reaped.append(folder)
    return reaped


class PostgresServer:
    """A PostgreSQL cluster in a private temporary directory, reached by Unix socket only."""

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
        self.port = SOCKET_PORT
        self.user = "postgres"
        self.password = ""
        self._runas: list[str] = []
        self._watchdog: subprocess.Popen[bytes] | None = None

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> PostgresServer:
        """Run initdb and pg_ctl start; :class:`TxStreamError` with the reason on failure."""
        bindir = find_bindir()
        if bindir is None:
            raise TxStreamError(f"PostgreSQL server binaries (initdb) not found; {INSTALL_HINT}")
        self.bindir = bindir
        reap_stale()
        # mkdtemp makes the folder mode 0700: the socket inside is reachable only
        # by the folder's owner (and root).
        self.dir = Path(tempfile.mkdtemp(prefix=PREFIX))
        if len(str(self.dir / f".s.PGSQL.{self.port}")) > 100:
            self.dir.rmdir()
            self.dir = None
            raise TxStreamError(
                "the temporary folder's path is too long for a Unix socket; "
                "set TMPDIR to a short path such as /tmp"
            )
        owner_ids: tuple[int, int] | None = None
        if os.geteuid() == 0:
            import pwd

            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                self.stop()
                raise TxStreamError(
                    f"running as root needs the 'postgres' system user; {INSTALL_HINT}"
                ) from None
            owner_ids = (pw.pw_uid, pw.pw_gid)
            os.chown(self.dir, *owner_ids)
            self._runas = ["runuser", "-u", "postgres", "--"]
        self._write_owner()
        self._start_watchdog()
        self.password = secrets.token_urlsafe(24)
        pwfile = self.dir / "pwfile"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(self.password + "\n")
        if owner_ids is not None:
            os.chown(pwfile, *owner_ids)
        data = self.dir / "data"
        try:
            self._run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    self.user,
                    f"--pwfile={pwfile}",
                    "--auth-local=scram-sha-256",
                    "--auth-host=reject",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
                "initdb",
            )
        except TxStreamError:
            self.stop()
            raise
        finally:
            pwfile.unlink(missing_ok=True)
        # Only the server's own user, with its password, over the socket; nothing else.
        (data / "pg_hba.conf").write_text(f"local all {self.user} scram-sha-256\n")
        if owner_ids is not None:
            os.chown(data / "pg_hba.conf", *owner_ids)
        conf = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{self.dir}'",
            "unix_socket_permissions": "0700",
            "password_encryption": "'scram-sha-256'",
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
        except TxStreamError as exc:
            self.stop()
            raise TxStreamError(f"PostgreSQL did not start: {exc}") from None
        return self

    def _write_owner(self) -> None:
        """Record who owns this server, for :func:`reap_stale` in a later run."""
        assert self.dir is not None
        owner = {
            "pid": os.getpid(),
            "start": _start_time(os.getpid()),
            "pg_ctl": str(self.bindir / "pg_ctl"),
            "runas": self._runas,
            "pidns": _pid_namespace(),
        }
        (self.dir / OWNER_FILE).write_text(json.dumps(owner) + "\n")

    def _start_watchdog(self) -> None:
        """Start the detached process that stops the server if this process dies."""
        assert self.dir is not None
        script = Path(__file__).with_name("pgwatchdog.py")
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-I",
                str(script),
                str(os.getpid()),
                str(_start_time(os.getpid())),
                str(self.dir),
                str(self.bindir / "pg_ctl"),
                *self._runas,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,  # a Ctrl-C for the parent's terminal must not reach it
        )

    @property
    def watchdog_pid(self) -> int | None:
        """The watchdog process's pid while the server runs."""
        return self._watchdog.pid if self._watchdog is not None else None

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
        """Stop the server (fast shutdown), delete its directory, end the watchdog."""
        if self.dir is not None:
            data = self.dir / "data"
            if (data / "postmaster.pid").exists():
                with contextlib.suppress(TxStreamError):
                    self._run(
                        [str(self.bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                        "stop",
                    )
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        if self._watchdog is not None:
            # It would notice the directory is gone within a second; no need to wait.
            with contextlib.suppress(ProcessLookupError):
                self._watchdog.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(timeout=5)
            self._watchdog = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def conninfo(self) -> str:
        """A libpq connection string for the ``postgres`` database (with the password)."""
        return (
            f"host={self.dir} port={self.port} user={self.user} "
            f"password={self.password} dbname=postgres"
        )
