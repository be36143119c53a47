"""The compact form of a task's recorded history, and its file line.

A task records its operations as it runs (``recordHistory``).  Spelling each
one as text (``r<txn>(<table>:<key>)``) on the hot path cost about a sixth
of the phase-1 CPU per event, so the executor appends plain objects instead,
to one list per task, in the order the operations happened:

- an operation on a row whose key is an ``int``, by a transaction whose id
  is not yet known: two entries, its table's *code* (``2 * i`` for a read of
  the job's ``i``-th table, ``2 * i + 1`` for a write) and the key;
- any other operation: its text, with the transaction's id (as before);
- a committed transaction: its *commit mark*, ``(order value, input, mid)``
  when its id is ``b<batch>_<mid>`` (an ``event`` boundary's), or
  ``[order value, input, mid, id]``.  It follows its compact operations (an
  aborted transaction's operations are cut back, and it is recorded as a
  ``T <id> a ...`` line, as before).

The task writes the list as one line ``@`` + JSON (written by the C encoder:
no Python step per entry) after its ``T`` lines; :func:`expand` turns it back
into the text operations and commits that earlier versions wrote, which is
what :func:`~txstream.spark.runtime.results.history_text` reads.  Files of
earlier versions have no ``@`` line and read as before.
"""

from __future__ import annotations

import json
from typing import Any

from txstream.spark.runtime.base import JobSpec
from txstream.spark.runtime.errors import StoreError

MARK = "@"
"""The first character of the compact operations' line in a history file."""


def history_codes(job: JobSpec) -> dict[str, int]:
    """Per table of ``job``, the code of a read of one of its rows (a write: the code + 1)."""
    return {table: 2 * i for i, table in enumerate(job.tables)}


def commit_mark(order: tuple[Any, ...], gid: str) -> list[Any]:
    """The commit mark of transaction ``gid`` at ``order`` when its id must be written."""
    return [float(order[0]), int(order[1]), int(order[2]), gid]


def history_line(job: JobSpec, entries: list[Any]) -> str:
    """A task's recorded entries (see the module docstring) as its history file's line."""
    body = {"tables": list(job.tables), "ops": entries}
    return MARK + json.dumps(body, separators=(",", ":"))


def expand(line: str, batch: int, where: str) -> tuple[list[str], list[tuple[str, list[Any]]]]:
    """The operations (text) and committed transactions ``(id, order)`` of an ``@`` line.

    ``batch``: the batch whose file it is (a mark without an id names
    ``b<batch>_<mid>``); ``where`` names the file in errors.  A line that is not
    such a list (or leaves operations without their commit) is a
    :class:`StoreError`: a history is never read half.
    """
    try:
        body = json.loads(line[len(MARK) :])
        tables, entries = body["tables"], body["ops"]
        if type(tables) is not list or not all(type(t) is str for t in tables):
            raise ValueError("no list of tables")
        operations: list[str] = []
        commits: list[tuple[str, list[Any]]] = []
        pending: list[tuple[int, int, int]] = []  # (place in operations, code, key)
        it = iter(entries)
        for entry in it:
            kind = type(entry)
            if kind is str:
                operations.append(entry)
            elif kind is int:
                key = next(it)
                if type(key) is not int or not 0 <= entry < 2 * len(tables):
                    raise ValueError(f"operation {entry}, {key!r}")
                pending.append((len(operations), entry, key))
                operations.append("")
            elif kind is list and len(entry) in (3, 4):
                at, index, mid = float(entry[0]), int(entry[1]), int(entry[2])
                gid = entry[3] if len(entry) == 4 else f"b{batch}_{mid}"
                if type(gid) is not str:
                    raise ValueError(f"transaction id {gid!r}")
                for place, code, key in pending:
                    operations[place] = f"{'rw'[code & 1]}{gid}({tables[code >> 1]}:{key})"
                pending.clear()
                commits.append((gid, [at, index, mid]))
            else:
                raise ValueError(f"entry {entry!r}")
        if pending:
            raise ValueError("operations without their transaction's commit")
    except (ValueError, TypeError, KeyError, IndexError, StopIteration) as exc:
        raise StoreError(f"{where}: damaged history ({exc})") from None
    return operations, commits
