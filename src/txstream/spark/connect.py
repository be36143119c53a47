"""Spark Connect: start the server the PySpark wheel ships, and tell Connect sessions apart.

A Connect session (``SparkSession.builder.remote("sc://HOST:PORT")``) talks to a
Spark driver in another process over gRPC: it has no ``sparkContext``, no RDDs
and no py4j gateway, and a streaming query's ``foreachBatch`` function runs in
a Python process that the *server* starts (see docs/spark.md, "Spark Connect").
:func:`connect_server` starts that server on loopback, with
:func:`~txstream.spark.session.local_session`'s settings, for tests, benchmarks
and a laptop; :func:`is_connect`, :func:`default_parallelism` and
:func:`conf_get` are what the runtime asks of a session of either kind.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from txstream.errors import TxStreamError

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
"""The class ``sbin/start-connect-server.sh`` submits (in ``jars/spark-connect_*.jar``)."""
START_TIMEOUT_S = 180.0
"""How long :func:`connect_server` waits for the server to take connections."""
CLIENT_MODULES = ("grpc", "grpc_status", "google.rpc", "zstandard")
"""What PySpark's Connect client imports (``pip install 'txstream[connect]'``)."""


class ConnectUnavailableError(TxStreamError):
    """Spark Connect cannot be used here (client packages missing, server did not start)."""


def client_missing() -> list[str]:
    """The Connect client's Python modules that are not installed (empty: all are)."""
    import importlib.util

    missing = []
    for name in CLIENT_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # (a parent package missing)
            found = False
        if not found:
            missing.append(name)
    return missing


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, no RDDs)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def functions(spark: Any) -> Any:
    """``pyspark.sql.functions`` for ``spark``'s kind of session.

    PySpark picks the Column class of ``pyspark.sql.functions`` by the process
    (``SPARK_CONNECT_MODE_ENABLED``), not by the session: a process with a
    classic session beside a Connect one (a test suite) would hand a Connect
    DataFrame classic Columns.
    """
    if is_connect(spark):
        from pyspark.sql.connect import functions as connect_functions

        return connect_functions
    from pyspark.sql import functions as classic_functions

    return classic_functions


def conf_get(spark: Any, key: str, default: str) -> str:
    """Spark setting ``key`` of the session's driver (``default`` when it is not set)."""
    if is_connect(spark):
        return str(spark.conf.get(key, default))
    return str(spark.sparkContext.getConf().get(key, default))


def default_parallelism(spark: Any) -> int:
    """The session's ``defaultParallelism`` (the cluster's task slots, unless set).

    A Connect session cannot ask the SparkContext: ``spark.default.parallelism``
    when set, N on a ``local[N]`` master, otherwise a small job counts the
    partitions of ``spark.range``, which Spark cuts into ``defaultParallelism``
    slices (once, at a start).
    """
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    set_ = spark.conf.get("spark.default.parallelism", None)
    if set_:
        return int(set_)
    # local[N] (and local[N,F]) has N slots, as Spark's LocalSchedulerBackend says: a
    # setting read instead of a first Spark job (measured: 2.8 s of a start of 9 s).
    local = re.fullmatch(
        r"local(?:\[([1-9][0-9]*)(?:\s*,\s*[0-9]+)?\])?", spark.conf.get("spark.master", "")
    )
    if local:
        return int(local.group(1) or 1)
    F = functions(spark)
    return int(spark.range(4096).select(F.spark_partition_id()).distinct().count())


def free_port() -> int:
    """A TCP port on loopback that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spark_submit() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-submit"


@contextlib.contextmanager
def connect_server(
    master: str = "local[2]",
    port: int | None = None,
    log: str | os.PathLike[str] | None = None,
    **conf: str,
) -> Iterator[str]:
    """Run the PySpark wheel's Spark Connect server on loopback; yields its ``sc://`` URL.

    The server runs ``master`` with :data:`~txstream.spark.session.DEFAULTS`
    (``conf``: full Spark keys that override them) and this interpreter as the
    Python of its workers and of ``foreachBatch`` functions, so txstream is
    importable there; its output goes to ``log`` (default: discarded).  It is
    stopped (SIGTERM, then SIGKILL) when the block ends.

    >>> from txstream.spark.connect import connect_server         # doctest: +SKIP
    >>> with connect_server("local[2]") as url:                    # doctest: +SKIP
    ...     spark = SparkSession.builder.remote(url).getOrCreate()
    """
    from txstream.spark.session import DEFAULTS, check_master

    check_master(master)
    missing = client_missing()
    if missing:
        raise ConnectUnavailableError(
            f"Spark Connect's Python client needs {', '.join(missing)}: "
            "pip install 'txstream[connect]'"
        )
    port = port or free_port()
    settings = {**DEFAULTS, "spark.connect.grpc.binding.address": "127.0.0.1"}
    settings["spark.connect.grpc.binding.port"] = str(port)
    settings.update(conf)
    args = [str(_spark_submit()), "--master", master, "--class", SERVER_CLASS]
    args += ["--name", "txstream-connect"]
    if "spark.driver.memory" in settings:  # (only the launcher can size the driver's JVM)
        args += ["--driver-memory", settings.pop("spark.driver.memory")]
    for key, value in settings.items():
        args += ["--conf", f"{key}={value}"]
    env = dict(os.environ)
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # (the server's own java, like the one local_session launches)
    out = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    server = subprocess.Popen(
        [*args, "spark-internal"],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # its own process group: stopped with everything it started
    )
    try:
        _wait_listening(server, port, START_TIMEOUT_S)
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop(server)
        if out is not subprocess.DEVNULL:
            out.close()  # type: ignore[union-attr]


def _wait_listening(server: subprocess.Popen[bytes], port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise ConnectUnavailableError(
                f"the Spark Connect server exited ({server.returncode}) before it took "
                "connections; pass log=PATH to connect_server to see why"
            )
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise ConnectUnavailableError(
        f"the Spark Connect server took no connection on port {port} in {timeout:.0f} s"
    )


def _stop(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (JVM, Python workers), SIGKILL after 20 s."""
    if server.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
