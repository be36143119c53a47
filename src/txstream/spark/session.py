"""A local SparkSession tuned for this project's small, latency-bound jobs.

The settings follow measurements on this kind of machine (2 cores): the web UI
off, two shuffle partitions, Arrow for conversions to Python, Python workers on
Unix sockets, no per-row size check of the Arrow batches sent to them, a
checkpoint file manager that does not fork a ``chmod`` per checkpoint file
(that alone cuts an empty micro-batch from ~135 ms to ~35 ms), and JVMs that
compile with C1 only (see :data:`JVM_OPTIONS`).  Spark logs errors only, and
not the stack traces of failures that reach the caller anyway (see
:data:`QUIET_LOGGERS`) unless ``spark.log.level`` is set.

A JVM that the session launches does not outlive the Python process: a
watchdog process (:mod:`txstream.spark.jvmwatchdog`) kills it, with its Python
workers and executor JVMs, as soon as the driver dies, however it dies.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import re
import shlex
import subprocess
import sys
from typing import TYPE_CHECKING, Any

from txstream.errors import TxStreamError
from txstream.spark import jvmwatchdog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_FAST_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
"""Java options of the driver and executor JVMs, unless the caller sets its own.

Spark's planner runs for every micro-batch, and the JVM's optimizing compiler
(C2) kept compiling it for the whole of a 40 s benchmark run: its threads took
0.2-0.7 CPU seconds per second, about twice the Spark tasks, on a machine with
two cores (``-Xlog:jit+compilation``).  C1 alone compiles quickly and once;
its code is slower, but a micro-batch's fixed cost fell from about 260-300 ms
to 205-220 ms (``scripts/runtime-batch-overhead.py``, docs/benchmarks-history.md).
"""


DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.checkpointFileManagerClass": _FAST_CHECKPOINTS,
    "spark.sql.session.timeZone": "UTC",
    # Python workers talk to their JVM over a Unix socket instead of TCP on
    # localhost, where Nagle and delayed ACKs held every task's first Arrow
    # batch for ~40 ms (see scripts/runtime-batch-overhead.py).
    "spark.python.unix.domain.socket.enabled": "true",
    "spark.driver.memory": "2g",
    # With a byte limit set (Spark's default is 64 MiB), every row sent to a
    # Python worker first asks each Arrow vector of the batch being built for
    # its size (ArrowWriter.sizeInBytes); Int.MaxValue turns the check off. A
    # Flight Recorder profile of `txstream bench runtime` found it in ~5% of
    # the JVM's task samples. Batches stay bounded by maxRecordsPerBatch.
    "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
    **{f"spark.{role}.extraJavaOptions": JVM_OPTIONS for role in ("driver", "executor")},
}
"""Settings of :func:`local_session` that a caller's own settings override."""


QUIET_LOGGERS = (
    # Spark 4.1 and later; 4.0 had the class one package up.
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
    "org.apache.spark.sql.execution.streaming.MicroBatchExecution",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.executor.Executor",
)
"""Spark loggers that :func:`quiet_spark_logs` turns off.

Each logs, at ERROR and with a stack trace of 50 to 300 lines, a failure that
also reaches the caller as an exception: a streaming query that terminated
(raised again by ``awaitTermination`` and ``processAllAvailable``, which
txstream's ``TxQuery`` turns into one line), a failed task and the job it
aborts (raised by the action that ran the job).  Printed as well, they buried
txstream's one-line error under Spark's copy of it.
"""


_MASTER = re.compile(
    r"local(\[(\*|[1-9][0-9]*)(\s*,\s*[0-9]+)?\])?"
    r"|local-cluster\[\s*[1-9][0-9]*\s*,\s*[1-9][0-9]*\s*,\s*[1-9][0-9]*\s*\]"
    r"|(spark|k8s)://\S+|yarn"
)


def check_master(master: str) -> str:
    """``master`` if Spark can start on it (the forms its SparkSubmit and SparkContext take).

    A master Spark refuses is a :class:`~txstream.errors.TxStreamError` here, in
    one line, instead of the JVM's exit and PySpark's traceback about its gateway.
    """
    if not _MASTER.fullmatch(master):
        raise TxStreamError(
            f"{master!r} is not a Spark master; e.g. local[2], local[*], "
            "local-cluster[2,1,1024], spark://HOST:7077, yarn or k8s://HOST:PORT"
        )
    return master


def local_session(
    app_name: str = "txstream", cores: int = 2, master: str | None = None, **conf: Any
) -> SparkSession:
    """Start (or return the running) local SparkSession.

    Extra keyword arguments are Spark settings with ``_`` standing for ``.``
    after the ``spark_`` prefix is dropped, e.g. ``sql_shuffle_partitions=4``;
    or pass a dict of full keys as ``conf``.  ``master`` overrides ``local[cores]``
    (e.g. ``local-cluster[2,1,1024]``: two executor JVMs, or ``spark://host:7077``).
    Without ``master``, a master given at launch (``spark-submit --master ...``
    or ``PYSPARK_SUBMIT_ARGS``) is used, and ``local[cores]`` otherwise; settings
    given at launch (``--conf``) win over this module's :data:`DEFAULTS`.

    Spark then logs errors only, without the failures listed in
    :data:`QUIET_LOGGERS`, unless Spark's own ``spark.log.level`` is set
    (``log_level="WARN"``, or ``--conf spark.log.level=WARN`` in
    ``PYSPARK_SUBMIT_ARGS`` or ``spark-submit``): Spark then logs at that level,
    everything included.
    """
    if master is not None:
        check_master(master)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", _python())
    from pyspark.sql import SparkSession

    launched = _launch_settings()
    if master is None:
        given = launched.get("spark.master", _DEFAULT_MASTER)
        master = f"local[{cores}]" if given == _DEFAULT_MASTER else given
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in _settings(conf, launched).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    watch_jvm(session)
    if session.sparkContext.getConf().get("spark.log.level", None) is None:
        quiet_spark_logs(session)
    # else Spark has set the level the user asked for, for every logger.
    return session


def quiet_spark_logs(spark: SparkSession) -> None:
    """Log Spark's errors only, and not those of :data:`QUIET_LOGGERS`, in this JVM.

    :func:`local_session` calls it; call it on a session of your own for the
    same quiet.  ``spark.sparkContext.setLogLevel(level)`` sets the level of
    the other loggers afterwards; Spark's ``spark.log.level`` setting, given
    when the session starts, makes :func:`local_session` leave logging alone.
    """
    spark.sparkContext.setLogLevel("ERROR")
    jvm: Any = spark.sparkContext._jvm  # (py4j's view of the JVM: untyped)
    off = jvm.org.apache.logging.log4j.Level.OFF
    for name in QUIET_LOGGERS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, off)


_DEFAULT_MASTER = "local[*]"
"""The master Spark's launcher sets when it is given none (and ``spark-submit`` too)."""


def _launch_settings() -> dict[str, str]:
    """The Spark settings given at launch: ``spark-submit``'s or ``PYSPARK_SUBMIT_ARGS``'.

    A job started with ``spark-submit --master spark://HOST:7077 job.py`` must
    run on that cluster, with the ``--conf`` settings given there, although
    :func:`local_session` names a master and settings of its own.  Under
    ``spark-submit`` the JVM runs already (its gateway's port is in the
    environment): its settings are read from it.  Otherwise the session
    launches the JVM itself, with this module's settings (driver memory and
    Java options only take effect then), and ``--master``/``--conf`` of
    ``PYSPARK_SUBMIT_ARGS`` are what it adds.
    """
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()
        return dict(SparkConf().getAll())
    args = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    found: dict[str, str] = {}
    for flag, value in itertools.pairwise(args):
        if flag == "--master":
            found["spark.master"] = value
        elif flag == "--conf" and "=" in value:
            key, _, setting = value.partition("=")
            found[key] = setting
    return found


def _settings(conf: dict[str, Any], launched: dict[str, str] | None = None) -> dict[str, str]:
    """The settings to start with: this module's defaults under the launch's and the caller's.

    ``launched``: those the JVM was started with (:func:`_launch_settings`);
    the caller's keyword arguments win over both.
    """
    settings = {k: v for k, v in DEFAULTS.items() if k not in (launched or {})}
    settings.update(
        ("spark." + k.replace("_", "."), str(v)) for k, v in conf.items() if k != "conf"
    )
    settings.update((key, str(v)) for key, v in conf.get("conf", {}).items())
    return settings


_WATCHDOGS: dict[int, subprocess.Popen[bytes]] = {}
"""The watchdog of each JVM this process launched, by the JVM's pid."""


def watch_jvm(spark: SparkSession) -> int | None:
    """Have the session's JVM killed when this process dies; returns the watchdog's pid.

    :func:`local_session` calls it.  Only for a JVM this process launched (not
    under ``spark-submit``, whose JVM is this process's parent and ends when it
    ends), once per JVM.  The watchdog (:mod:`txstream.spark.jvmwatchdog`)
    kills the JVM and everything under it (Python workers, a ``local-cluster``'s
    executor JVMs) at once when this process ends without a normal interpreter
    exit (SIGKILL, a crash); after a normal exit Spark's own shutdown has
    :data:`~txstream.spark.jvmwatchdog.GRACE_S` first.  None: not watched.
    """
    from pyspark import SparkContext

    launched = getattr(SparkContext._gateway, "proc", None)
    if launched is None:
        return None
    try:
        gateway: Any = spark.sparkContext._jvm  # (py4j: untyped)
        jvm = int(gateway.ProcessHandle.current().pid())
    except Exception:  # a JVM without ProcessHandle (Java 8): spark-submit execs java
        jvm = int(launched.pid)
    running = _WATCHDOGS.get(jvm)
    if running is not None and running.poll() is None:
        return running.pid
    read, write = os.pipe()
    try:
        watchdog = subprocess.Popen(
            [_python(), "-I", jvmwatchdog.__file__, str(os.getpid()), str(jvm)],
            stdin=read,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            start_new_session=True,  # a Ctrl-C in the driver's terminal is not for it
        )
    finally:
        os.close(read)
    _WATCHDOGS[jvm] = watchdog
    atexit.register(_clean_exit, write, os.getpid())
    return watchdog.pid


def _clean_exit(pipe: int, owner: int) -> None:
    """Tell the watchdog that the driver exits normally (Spark ends the JVM itself)."""
    if os.getpid() != owner:  # a forked child exiting: the driver still runs
        return
    with contextlib.suppress(OSError):  # (the watchdog is gone)
        os.write(pipe, jvmwatchdog.CLEAN_EXIT)


def _python() -> str:
    return sys.executable
