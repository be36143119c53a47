"""Test users' jobs for exactly once: crash and resume ``run_local`` at chosen points.

A job's outputs and tables must not depend on where its driver died: a batch
that was running when it died runs again from its input after the restart (as
Spark's source replays the offsets of a batch that did not commit), and a batch
that committed never runs twice.  :func:`run_with_crashes` plays that out in
this process: it feeds ``run_local`` the batches, raises :class:`SimulatedCrash`
(a ``BaseException``: nothing in the runtime catches it, as nothing survives a
SIGKILL) at each chosen point, and resumes on the same store from the batches
that did not commit.  :func:`serial_run` runs the same batches on one partition
without crashes, and :func:`assert_same_results` compares two stores' outputs
and tables, so a user's exactly-once test is a few lines:

>>> import txstream as tx
>>> from txstream.spark.testing import assert_same_results, run_with_crashes, serial_run
>>> def add(t, e):
...     row = t.read("sums", e["k"], default={"total": 0})
...     t.upsert("sums", {"k": e["k"], "total": row["total"] + e["v"]})
...     t.emit("seen", {"k": e["k"], "v": e["v"]})
>>> job = (tx.Job().table("sums", key="k").input("ev", None, keys="k").output("seen")
...        .on("ev", add))
>>> batches = [[("ev", {"k": k, "v": v}) for k in "abc"] for v in range(1, 5)]
>>> crashes = run_with_crashes(job, batches, "ckpt/kit", [(1, 0), (2, 2), (3, 1)], partitions=3)
>>> crashes
3
>>> serial_run(job, batches, "ckpt/kit-serial")
>>> assert_same_results(job, "ckpt/kit", "ckpt/kit-serial")

On Spark itself, :func:`sigkill_after_commits` kills a real driver (a script that
runs the job, and its JVM) at a random moment after its ``k``-th committed
batch; the test then runs the script to the input's end and compares.

Called on the test's thread; each store is the kit's alone while it runs.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txstream.errors import TxStreamError
from txstream.spark.runtime.results import read_failures, read_output, read_table
from txstream.spark.runtime.state import RuntimeStore

if TYPE_CHECKING:
    from txstream.spark.runtime.job import Job

Batch = Sequence[tuple[str, dict[str, Any]]]


class SimulatedCrash(BaseException):
    """The driver's death at a chosen point (a ``BaseException``, as a SIGKILL is uncatchable)."""


def _committed(store: str | Path) -> int:
    root = Path(store)
    return len(RuntimeStore(root).committed()) if (root / "job.json").exists() else 0


class _Feed:
    """The batches of one run, raising :class:`SimulatedCrash` at its crash point.

    ``at = (b, n)``: before the ``n``-th event of batch ``b`` is read (``n = 0``:
    before batch ``b`` starts, after batch ``b - 1`` committed).
    """

    def __init__(self, batches: Sequence[Batch], at: tuple[int, int] | None) -> None:
        self.batches = batches
        self.at = at

    def __iter__(self) -> Iterator[Iterable[tuple[str, dict[str, Any]]]]:
        for index, batch in enumerate(self.batches):
            if self.at is not None and self.at[0] == index:
                if self.at[1] == 0:
                    raise SimulatedCrash(f"before batch {index}")
                yield self._cut(batch, self.at[1], index)
            else:
                yield batch

    @staticmethod
    def _cut(batch: Batch, n: int, index: int) -> Iterator[tuple[str, dict[str, Any]]]:
        for i, event in enumerate(batch):
            if i == n:
                raise SimulatedCrash(f"inside batch {index}, after {n} events")
            yield event
        raise SimulatedCrash(f"inside batch {index}, after its {len(batch)} events")


def run_with_crashes(
    job: Job,
    batches: Sequence[Batch],
    store: str | Path,
    crashes: Iterable[tuple[int, int]],
    **run_local: Any,
) -> int:
    """Run ``job`` over ``batches`` with ``run_local``, dying at each crash point; resume each time.

    A crash point ``(b, n)`` names batch ``b`` of ``batches`` and how many of its
    events were read when the driver died (``0``: between batches ``b - 1``
    and ``b``); each point fires once, in batch order.  After a crash the run
    resumes on ``store`` with the batches that did not commit, as a restarted
    query replays its source.  ``run_local``'s keyword arguments
    (``partitions``, ``tasks``, ...) go to every run.  Returns how many crashes
    happened (a point past the input's end never fires).
    """
    base = _committed(store)
    points = sorted(crashes)
    for b, n in points:
        if not 0 <= b < len(batches) or n < 0:
            raise TxStreamError(
                f"crash point {(b, n)}: batch must be within 0..{len(batches) - 1} and "
                "events at least 0"
            )
    crashed = 0
    while True:
        done = _committed(store) - base
        todo = list(batches[done:])
        at = None
        while points and at is None:
            b, n = points.pop(0)
            if b >= done:
                at = (b - done, n)
        try:
            job.run_local(_Feed(todo, at), store, **run_local)  # type: ignore[arg-type]
        except SimulatedCrash:
            crashed += 1
            continue
        return crashed


def serial_run(job: Job, batches: Sequence[Batch], store: str | Path) -> None:
    """Run ``job`` over ``batches`` on one partition, without crashes: the oracle's store."""
    job.run_local(list(batches), store, partitions=1)


def assert_same_results(job: Job, store: str | Path, oracle: str | Path) -> None:
    """Raise ``AssertionError`` unless two stores of ``job`` hold the same results.

    Outputs compare row for row in ``read_output``'s order (the declared order
    of the transactions that emitted them); tables compare as sets of rows; the
    rolled-back transactions (``read_failures``) by input position, kind and
    error (their batch numbers may differ: a crashed run commits other batches).
    """
    for name in job.spec.outputs:
        got, want = read_output(store, name), read_output(oracle, name)
        if got != want:
            raise AssertionError(
                f"output {name!r}: {len(got)} rows against the oracle's {len(want)}; "
                f"first difference at row {_first_difference(got, want)}"
            )
    for name in job.spec.tables:
        got_rows = sorted(map(repr, read_table(store, name)))
        want_rows = sorted(map(repr, read_table(oracle, name)))
        if got_rows != want_rows:
            missing = sorted(set(want_rows) - set(got_rows))[:3]
            extra = sorted(set(got_rows) - set(want_rows))[:3]
            raise AssertionError(f"table {name!r}: missing {missing}, unexpected {extra}")
    got_failed, want_failed = _failed(store), _failed(oracle)
    if got_failed != want_failed:
        raise AssertionError(
            f"rolled-back transactions: {len(got_failed)} against the oracle's "
            f"{len(want_failed)}; missing {sorted(set(want_failed) - set(got_failed))[:3]}, "
            f"unexpected {sorted(set(got_failed) - set(want_failed))[:3]}"
        )


def _failed(store: str | Path) -> list[tuple[str, str, str]]:
    """A store's rolled-back transactions as (input position, kind, error), sorted."""
    return sorted((f["position"], f["kind"], f["error"]) for f in read_failures(store))


def _first_difference(got: list[Any], want: list[Any]) -> int:
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return i
    return min(len(got), len(want))


def sigkill_after_commits(
    argv: Sequence[str],
    checkpoint: str | Path,
    commits: int,
    *,
    rng: random.Random,
    jitter_s: float,
    stderr: str | Path,
    env: Mapping[str, str] | None = None,
    bound_s: float = 300.0,
) -> int:
    """Start a driver, SIGKILL it and its JVM a random moment after its ``commits``-th commit.

    ``argv`` runs a job on Spark with checkpoint ``checkpoint``, in a session
    of its own (so the kill takes its process group: the driver, its JVM and
    the JVM's Python workers die at once, as on a machine's crash).  Once the
    checkpoint holds ``commits`` commit markers, the kill waits
    ``rng.uniform(0, jitter_s)`` seconds more, so that it lands anywhere in the
    batches that follow.  ``stderr``: the file the driver's stderr goes to; an
    ``AssertionError`` shows its end when the driver ended before the kill
    (it failed, or the input was all committed).  ``bound_s`` only bounds a hang,
    never a speed.  Returns the commit markers there were at the kill.

    >>> from txstream.spark.testing import sigkill_after_commits
    >>> at = sigkill_after_commits([sys.executable, "job.py"], "ckpt", 4,   # doctest: +SKIP
    ...                            rng=random.Random(4), jitter_s=0.8, stderr="run.err")
    >>> at >= 4                                                           # doctest: +SKIP
    True
    """
    markers = Path(checkpoint) / "txstream" / "commits"

    def committed() -> int:
        return len(list(markers.glob("*.json"))) if markers.exists() else 0

    with Path(stderr).open("w") as err:
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=None if env is None else dict(env),
            start_new_session=True,
        )
        try:
            deadline = time.time() + bound_s
            while proc.poll() is None and time.time() < deadline:
                if committed() >= commits:
                    break
                time.sleep(0.05)
            time.sleep(rng.uniform(0, jitter_s))
            if proc.poll() is not None:  # (not an assert: python -O keeps this check)
                raise AssertionError(Path(stderr).read_text()[-3000:])
            return committed()
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM die at once
            proc.wait()
