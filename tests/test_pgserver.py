"""The throwaway PostgreSQL server: only its own user gets in, and it dies with its owner.

Uses a real server (``initdb`` from the ``postgresql`` package, as in
``tests/test_loading_postgres.py``).  Checked: no TCP listener, a private
socket folder, a password (scram-sha-256) required and the random one accepted;
a SIGKILLed owner's server is stopped by the watchdog within seconds; when the
watchdog died too, the next start reaps the orphan.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from txstream.loading.pgserver import PostgresServer, find_bindir, reap_stale

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
SRC = Path(__file__).resolve().parent.parent / "src"

OWNER = """
import sys, time
from txstream.loading.pgserver import PostgresServer
server = PostgresServer().start()
print(server.dir, server.watchdog_pid, flush=True)
time.sleep(300)
"""


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    if find_bindir() is None:
        proc = subprocess.run(
            [str(SCRIPTS / "pg-install.sh")], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0 or find_bindir() is None:
            pytest.fail(f"PostgreSQL server not available: {proc.stderr.strip()[-200:]}")
    srv = PostgresServer().start()
    yield srv
    srv.stop()


@pytest.fixture(autouse=True)
def no_password_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """libpq must not find a password anywhere but in the connection string."""
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))


def test_the_right_password_gets_in_and_nothing_listens_on_tcp(server: PostgresServer) -> None:
    with psycopg.connect(server.conninfo) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
        assert conn.execute("SHOW password_encryption").fetchone() == ("scram-sha-256",)
        rules = conn.execute("SELECT type, user_name, auth_method FROM pg_hba_file_rules")
        assert rules.fetchall() == [("local", ["postgres"], "scram-sha-256")]
    assert server.dir is not None
    mode = stat.S_IMODE(server.dir.stat().st_mode)
    assert mode == 0o700, oct(mode)  # other local users cannot reach the socket at all
    assert "password=" in server.conninfo and len(server.password) >= 24


@pytest.mark.parametrize("password", [None, "", "wrong", "postgres"])
def test_a_connection_without_the_password_is_refused(
    server: PostgresServer, password: str | None
) -> None:
    conninfo = f"host={server.dir} port={server.port} user=postgres dbname=postgres"
    if password is not None:
        conninfo += f" password='{password}'"
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(conninfo, connect_timeout=5)


def test_other_users_and_tcp_are_refused(server: PostgresServer) -> None:
    with psycopg.connect(server.conninfo) as conn:
        conn.execute("DROP ROLE IF EXISTS intruder")
        conn.execute("CREATE ROLE intruder LOGIN PASSWORD 'x'")
    try:
        with pytest.raises(psycopg.OperationalError, match=r"no pg_hba\.conf entry"):
            psycopg.connect(
                f"host={server.dir} port={server.port} user=intruder password=x dbname=postgres"
            )
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(
                f"host=127.0.0.1 port={server.port} user=postgres "
                f"password={server.password} dbname=postgres",
                connect_timeout=3,
            )
    finally:
        with psycopg.connect(server.conninfo) as conn:
            conn.execute("DROP ROLE intruder")


def test_two_servers_get_different_passwords(server: PostgresServer) -> None:
    other = PostgresServer().start()
    try:
        assert other.password != server.password and other.dir != server.dir
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(other.conninfo.replace(other.password, server.password))
    finally:
        other.stop()


def _start_owner() -> tuple[subprocess.Popen[str], Path, int, int]:
    """A process that starts a server and sleeps: (process, folder, postmaster, watchdog)."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line, "the owner process did not start a server"
    folder, watchdog = Path(line[0]), int(line[1])
    postmaster = int((folder / "data" / "postmaster.pid").read_text().split()[0])
    return proc, folder, postmaster, watchdog


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pid: int, folder: Path, seconds: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if not _running(pid) and not folder.exists():
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"server {pid} in {folder} still there after {seconds} s")


def test_sigkill_of_the_owner_stops_the_server_within_seconds(server: PostgresServer) -> None:
    proc, folder, postmaster, watchdog = _start_owner()
    assert _running(postmaster) and _running(watchdog)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    _wait_gone(postmaster, folder, 60.0)  # (it fails beyond that; a loaded machine is slow)
    # The watchdog removes the folder, then exits: it may still be on its way out.
    deadline = time.monotonic() + 60.0
    while _running(watchdog) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(watchdog)


def test_an_orphan_whose_watchdog_died_too_is_reaped_on_the_next_start(
    server: PostgresServer,
) -> None:
    proc, folder, postmaster, watchdog = _start_owner()
    os.kill(watchdog, signal.SIGKILL)  # the watchdog is in its own session: kill it first
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(1.0)
    assert _running(postmaster) and folder.exists()  # nobody left to stop it ...
    assert folder in reap_stale()  # ... until the next start looks (start() calls this)
    _wait_gone(postmaster, folder, 60.0)
    assert server.dir is not None and server.dir.exists()  # a live owner's server is kept
    with psycopg.connect(server.conninfo) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_sigkill_of_a_real_loading_run_stops_its_server() -> None:
    # The command users run, not a stand-in: `txstream loading run --target postgres`
    # starts its throwaway server; killing the command mid-run must not leave it behind.
    # Its own temporary folder, short enough for the server's Unix socket path.
    import shutil
    import tempfile

    from txstream.loading.pgserver import PREFIX

    tmp_path = Path(tempfile.mkdtemp(prefix="txpg"))
    tmp_path.chmod(0o755)  # run as root, the server's own user must reach its folder
    env = {**os.environ, "PYTHONPATH": str(SRC), "TMPDIR": str(tmp_path)}
    # The input is made before the server starts; 100,000 operations take the
    # loaders many seconds, so the run is still going at the kill (asserted below).
    proc = subprocess.Popen(
        [sys.executable, "-c", "from txstream.cli import entry; entry()", "loading", "run",
         "--target", "postgres", "--operations", "100000", "--sessions", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        pidfile, postmaster = None, 0
        while time.monotonic() < deadline and proc.poll() is None:
            for found in tmp_path.glob(f"{PREFIX}*/data/postmaster.pid"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    pid = int(found.read_text().split()[0])
                    if pid > 0 and _running(pid):  # negative: initdb's single-user phase
                        pidfile, postmaster = found, pid
            if pidfile is not None:
                break
            time.sleep(0.2)
        assert pidfile is not None, "the loading run did not start a server"
        time.sleep(1.0)  # well into the run
        assert proc.poll() is None, "the run ended before it could be killed"
        assert _running(postmaster)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        _wait_gone(postmaster, pidfile.parent.parent, 60.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp_path, ignore_errors=True)
