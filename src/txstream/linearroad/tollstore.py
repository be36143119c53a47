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

On a cluster the file must be on storage every executor reads at the same
path (as the historical tolls).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
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
    minute path emits them; a later minute's row replaces an earlier one.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.batch = -1
        self.rows: dict[Key, list[int]] = {}
        self.published = 0
        """Batches this process published (skipped re-deliveries not counted)."""
        if path.exists():
            try:
                data = json.loads(path.read_text())
                self.batch = int(data["batch"])
                self.rows = {(r[0], r[1], r[2]): list(r[3:]) for r in data["rows"]}
            except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
                raise TxStreamError(
                    f"cannot read {path}: {exc}; delete the run's --out to start over"
                ) from None

    def __call__(self, batch: int, rows: Iterable[dict[str, Any]]) -> None:
        """Publish one committed batch's tolls (a batch already published is skipped)."""
        if batch <= self.batch:
            return
        changed = False
        for r in rows:
            key = (r["xway"], r["dir"], r["seg"])
            old = self.rows.get(key)
            if old is None or old[0] <= r["minute"]:
                self.rows[key] = [r["minute"], r["lav"], r["toll"], r["near"]]
                changed = True
        self.batch = batch
        if changed or not self.path.exists():
            data = {"batch": batch, "rows": [[*k, *v] for k, v in sorted(self.rows.items())]}
            write_whole(self.path, json.dumps(data, separators=(",", ":")), "tolls store ")
            self.published += 1


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
