"""The TOLLS store between the not-serializable variant's two processing paths.

In the not-serializable variant on the executor runtime, the minute path (a
job of its own: statistics, stopped cars, each minute's accidents and tolls)
and the notification path (another job: segment entries, charges, toll and
accident alerts, queries) run as two streaming queries with no common order,
like the queries of Botan et al.'s Figure 3 connected by stores.  This module
is the store that connects them:

* :class:`TollsPublisher` is the minute path's sink: when a batch of the
  minute path commits, the driver merges the toll rows it computed into the
  store file (one JSON file, replaced atomically), exactly once per batch id
  (a batch delivered again after a crash is skipped);
* :func:`published_toll` is what a notification reads on an executor: the
  segment's row as the file holds it *when the notification runs*, whatever
  minute the minute path has reached by then (``(0, 0, -1)`` for a segment
  without one).  That read is not ordered with the minute path's writes:
  it may see the previous minute's toll, miss an accident or see one that has
  cleared, which is where the variant's wrong answers come from.

The ``adhoc`` variant (the paper's ADHOC SERIALIZABLE, Section 5.2: the
synchronization is built into the stores, a read blocks until a predicate
holds) uses the same store with two additions:

* the publisher also keeps every minute's rows apart (``PATH.mMINUTE``, each
  with the partitions that have reached that minute) and the latest minute
  each partition has reached (:attr:`TollsPublisher.reached`);
* :class:`Gate` holds the notification path's input back until the minute
  path has published the minute of every report in it (the blocking read,
  per input chunk rather than per read: a task blocked on an executor would
  hold the slot the minute path needs, and two queries on two slots would
  wait for each other forever), and :func:`toll_at` reads the row of the
  report's own minute, so a minute path that has run ahead does not change
  what a notification reads (the order ADHOC SERIALIZABLE imposes on the
  store's operations, kept here by versions instead of by holding the writer).

On a cluster the files must be on storage every executor reads at the same
path (as the historical tolls).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from txstream.errors import TxStreamError
from txstream.storage.files import write_whole

Key = tuple[int, int, int]
"""``(xway, dir, seg)``."""
Toll = tuple[int, int, int]
"""``(LAV, toll, nearest accident segment or -1)``."""

NO_TOLL: Toll = (0, 0, -1)


class TollsPublisher:
    """The minute path's sink: merge each committed batch's toll rows into ``path``.

    Rows are ``{"xway", "dir", "seg", "minute", "lav", "toll", "near"}`` as the
    minute path emits them; a later minute's row replaces an earlier one.  A
    row with ``seg`` -1 marks that partition ``(xway, dir)`` reached ``minute``
    (its accidents and tolls for that minute are in the same batch).

    ``versions``: also keep each minute's rows in ``PATH.mMINUTE`` (the
    ``adhoc`` variant, read with :func:`toll_at`).
    """

    def __init__(self, path: Path, versions: bool = False) -> None:
        self.path = path
        self.versions = versions
        self.batch = -1
        self.rows: dict[Key, list[int]] = {}
        self.reached: dict[tuple[int, int], int] = {}
        """The latest minute each partition ``(xway, dir)`` has published."""
        self.published = 0
        """Batches this process published (skipped re-deliveries not counted)."""
        if path.exists():
            try:
                data = json.loads(path.read_text())
                self.batch = int(data["batch"])
                self.rows = {(r[0], r[1], r[2]): list(r[3:]) for r in data["rows"]}
                self.reached = {(r[0], r[1]): r[2] for r in data.get("reached", [])}
            except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
                raise TxStreamError(
                    f"cannot read {path}: {exc}; delete the run's --out to start over"
                ) from None

    def __call__(self, batch: int, rows: Iterable[dict[str, Any]]) -> None:
        """Publish one committed batch's tolls (a batch already published is skipped)."""
        if batch <= self.batch:
            return
        changed = False
        reached = dict(self.reached)
        minutes: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            part = (r["xway"], r["dir"])
            if self.versions:
                minutes.setdefault(r["minute"], []).append(r)
            if r["seg"] < 0:  # the partition's minute marker
                if reached.get(part, 0) < r["minute"]:
                    reached[part] = r["minute"]
                    changed = True
                continue
            key = (*part, r["seg"])
            old = self.rows.get(key)
            if old is None or old[0] <= r["minute"]:
                self.rows[key] = [r["minute"], r["lav"], r["toll"], r["near"]]
                changed = True
        # Each minute's version before the file that says the minute was reached:
        # a reader that sees the partition reached finds its rows.
        for minute, found in minutes.items():
            _merge_minute(minute_path(str(self.path), minute), found)
        self.batch = batch
        if changed or not self.path.exists():
            data = {
                "batch": batch,
                "rows": [[*k, *v] for k, v in sorted(self.rows.items())],
                "reached": [[*k, v] for k, v in sorted(reached.items())],
            }
            write_whole(self.path, json.dumps(data, separators=(",", ":")), "tolls store ")
            self.published += 1
        self.reached = reached  # (the gate reads it: only once the files say so)


def minute_path(path: str, minute: int) -> str:
    """The file holding minute ``minute``'s rows of the store ``path`` (``versions``)."""
    return f"{path}.m{minute}"


def _merge_minute(path: str, rows: list[dict[str, Any]]) -> None:
    """Add a batch's rows of one minute to that minute's file (other partitions may be there)."""
    target = Path(path)
    data: dict[str, Any] = {"reached": [], "rows": []}
    if target.exists():
        data = json.loads(target.read_text())
    parts = {(p[0], p[1]) for p in data["reached"]}
    kept = {(r[0], r[1], r[2]): r[3:] for r in data["rows"]}
    for r in rows:
        if r["seg"] < 0:
            parts.add((r["xway"], r["dir"]))
        else:
            kept[(r["xway"], r["dir"], r["seg"])] = [r["lav"], r["toll"], r["near"]]
    data = {
        "reached": [list(p) for p in sorted(parts)],
        "rows": [[*k, *v] for k, v in sorted(kept.items())],
    }
    write_whole(target, json.dumps(data, separators=(",", ":")), "tolls store ")


_CACHE: dict[str, tuple[tuple[int, int, int], dict[Key, Toll]]] = {}
"""Per Python worker: the store file's identity (inode, mtime, size) and its rows."""


def published_toll(path: str, key: Key) -> Toll:
    """The row of segment ``key`` as the store holds it now; :data:`NO_TOLL` if none.

    The file is re-read only when it has been replaced since the last read
    (one ``stat`` per call otherwise).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return NO_TOLL  # nothing published yet: the minute path has not reached a minute
    ident = (st.st_ino, st.st_mtime_ns, st.st_size)
    cached = _CACHE.get(path)
    if cached is None or cached[0] != ident:
        try:
            with open(path, encoding="ascii") as f:
                data = json.load(f)
        except FileNotFoundError:
            return NO_TOLL
        rows = {(r[0], r[1], r[2]): (r[4], r[5], r[6]) for r in data["rows"]}
        cached = _CACHE[path] = (ident, rows)
    return cached[1].get(key, NO_TOLL)


_MINUTES: dict[str, tuple[tuple[int, int, int], set[tuple[int, int]], dict[Key, Toll]]] = {}
"""Per Python worker: each minute file's identity, its partitions and its rows."""


def toll_at(path: str, key: Key, minute: int) -> Toll:
    """Segment ``key``'s row of minute ``minute`` (the ``adhoc`` variant's read).

    :data:`NO_TOLL` if the minute path computed nothing for the segment that
    minute; :class:`TxStreamError` if the partition has not reached the minute
    yet: the gate let the notification run too early, and a read of another
    minute would give a wrong answer without saying so.
    """
    name = minute_path(path, minute)
    cached = _MINUTES.get(name)
    try:
        st = os.stat(name)
    except FileNotFoundError:
        st = None
    if st is not None:
        ident = (st.st_ino, st.st_mtime_ns, st.st_size)
        if cached is None or cached[0] != ident:
            with open(name, encoding="ascii") as f:
                data = json.load(f)
            cached = _MINUTES[name] = (
                ident,
                {(p[0], p[1]) for p in data["reached"]},
                {(r[0], r[1], r[2]): (r[3], r[4], r[5]) for r in data["rows"]},
            )
    if st is None or cached is None or key[:2] not in cached[1]:
        raise TxStreamError(
            f"the notification of minute {minute} in expressway {key[0]} direction {key[1]} "
            "ran before the minute path published that minute (the adhoc variant's gate "
            "failed); report this as a bug"
        )
    return cached[2].get(key, NO_TOLL)


class Gate(threading.Thread):
    """Hands the input chunks of ``source`` on to ``target`` once their minutes are published.

    The ``adhoc`` variant's blocking read: a chunk waits until, for every
    position report in it, ``reached()`` says the report's partition has
    published the report's minute (the minute path computes a minute at the
    partition's first report of it, so it never waits for data that has not
    arrived).  Chunks pass in name order, each copied whole (its handoff
    stamps unchanged, so the wait counts in the response time); ``needs(line)``
    gives a chunk line's ``(xway, dir, minute)`` or None (queries and lines the
    minute path ignores wait for nothing).  A chunk still waiting after
    ``give_up_s`` sets :attr:`error`.
    """

    def __init__(
        self,
        source: Path,
        target: Path,
        reached: Callable[[], dict[tuple[int, int], int]],
        needs: Callable[[str], tuple[int, int, int] | None],
        give_up_s: float = 300.0,
        poll_s: float = 0.02,
    ) -> None:
        super().__init__(name="lr-adhoc-gate", daemon=True)
        self.source, self.target = source, target
        self.reached, self.needs = reached, needs
        self.give_up_s, self.poll_s = give_up_s, poll_s
        self.target.mkdir(parents=True, exist_ok=True)
        self.stopping = threading.Event()
        self.done = threading.Event()
        """Set by the caller once the source will get no more chunks."""
        self.error: BaseException | None = None
        self.passed = 0
        self.waited_s = 0.0
        """Total time chunks were held back."""

    def run(self) -> None:
        """Pass chunks until :attr:`done` and every chunk passed (or :attr:`stopping`)."""
        try:
            passed = {name for name in os.listdir(self.target) if not name.startswith(".")}
            while not self.stopping.is_set():
                last = self.done.is_set()
                # (names in memory: a stat per chunk and poll would grow with the run)
                pending = sorted(
                    name for name in os.listdir(self.source)
                    if not name.startswith(".") and name not in passed
                )  # fmt: skip
                for name in pending:
                    if not self._pass(self.source / name):
                        return
                    passed.add(name)
                if last and not pending:
                    return
                if not pending:
                    self.stopping.wait(self.poll_s)
        except BaseException as exc:  # reported by whoever watches the run
            self.error = exc

    def _pass(self, chunk: Path) -> bool:
        text = chunk.read_text(encoding="utf-8", errors="replace")
        need: dict[tuple[int, int], int] = {}
        for line in text.splitlines():
            got = self.needs(line)
            if got is not None and need.get(got[:2], 0) < got[2]:
                need[got[:2]] = got[2]
        start = time.time()
        while True:
            reached = self.reached()
            if all(reached.get(p, 0) >= m for p, m in need.items()):
                break
            if time.time() - start > self.give_up_s:
                raise TxStreamError(
                    f"{chunk.name} waited {self.give_up_s:.0f} s for the minute path to "
                    "publish its minutes; is the minute path's query running?"
                )
            if self.stopping.wait(self.poll_s):
                return False
        self.waited_s += time.time() - start
        tmp = self.target / f".{chunk.name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, self.target / chunk.name)
        self.passed += 1
        return True
