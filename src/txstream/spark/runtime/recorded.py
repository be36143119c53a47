"""The compact form of a task's recorded history, and its file line.

A task records its operations as it runs (``recordHistory``).  Spelling each
one as text (``r<txn>(<table>:<key>)``) on the hot path cost about a sixth
of the phase-1 CPU per event, so the executor appends plain objects instead,
to one list per task, in the order the operations happened:

- an operation on a row whose key is an ``int``: one int,
  ``key * stride + code``, where ``stride`` is ``4 * T + 1`` for a job of
  ``T`` tables and ``code`` is ``4 * i`` for a read of its ``i``-th table,
  ``4 * i + 1`` for a write; a write of the set of rows of an ``int``
  partition value (an insert or a delete: ``table:v<value>``), the same
  with ``4 * i + 3`` and the value;
- any other operation: its text, with the transaction's id (as before);
- a committed transaction: its *commit mark*, after its operations: the int
  ``4 * T`` (code ``4 * T``, key 0) for one event's transaction (the
  ``event`` boundary's id, ``b<batch>_<mid>``, at an order whose value is a
  float), whose order ``(order value, input, mid)`` goes to a second list,
  one per mark; ``[order value, input, mid, id]`` for any other.  An
  aborted transaction's operations are cut back, and it is recorded as a
  ``T <id> a ...`` line, as before.

The task writes both lists as one line ``@`` + JSON after its ``T`` lines,
with no Python step per entry: the entries as the bytes of int32s (or int64s)
when they are all such ints (the common case), else as a JSON list (by the C
encoder);
the marks' orders column by column, the order values as float64s, the inputs
as int32s and the ids as int64s (as JSON lists in files of earlier versions).  :func:`expand`
turns it back into the text operations and commits that earlier versions
wrote, which is what :func:`~txstream.spark.runtime.results.history_text`
reads.  Files of earlier versions have no ``@`` line and read as before.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
import sys
from array import array
from itertools import compress, count, repeat
from operator import is_not, itemgetter
from typing import Any

from txstream.spark.runtime.base import JobSpec
from txstream.spark.runtime.errors import StoreError

MARK = "@"
"""The first character of the compact operations' line in a history file."""


def history_codes(job: JobSpec) -> tuple[dict[str, int], int]:
    """Per table of ``job``, the code of a read of one of its rows (see the module).

    And the stride that an operation's int multiplies its key by (see the module);
    the plain commit mark is ``stride - 1``.
    """
    return {table: 4 * i for i, table in enumerate(job.tables)}, 4 * len(job.tables) + 1


def commit_mark(order: tuple[Any, ...], gid: str) -> list[Any]:
    """The commit mark of transaction ``gid`` at ``order`` when its id must be written."""
    return [float(order[0]), int(order[1]), int(order[2]), gid]


def history_line(job: JobSpec, entries: list[Any], orders: list[tuple[float, int, int]]) -> str:
    """A task's recorded entries and its plain marks' orders (see the module) as its line."""
    head = json.dumps(list(job.tables), separators=(",", ":"))
    ops: str | None
    try:
        ops = f'"ops32":"{_base64_of("i", entries)}"'
    except struct.error:  # (a text, a mark's list, a key past 32 bits: see _mixed)
        ops = _mixed(entries)
    if ops is None:
        ops = '"ops":' + json.dumps(entries, separators=(",", ":"))
    at = _base64_of("d", list(map(itemgetter(0), orders)))  # (in C: no step per order)
    # The inputs and ids as int32s and int64s too (cheaper than JSON's digits per
    # int); a value past them (never seen) as JSON, as before.
    inputs, mids = list(map(itemgetter(1), orders)), list(map(itemgetter(2), orders))
    try:
        columns = f'"input32":"{_base64_of("i", inputs)}","mid64":"{_base64_of("q", mids)}"'
    except struct.error:
        compact = (",", ":")
        columns = (
            f'"input":{json.dumps(inputs, separators=compact)},'
            f'"mid":{json.dumps(mids, separators=compact)}'
        )
    # (base64 needs no escaping: the big strings are not passed through the encoder)
    return f'{MARK}{{"tables":{head},{ops},"at":"{at}",{columns}}}'


def _packed(entries: list[int]) -> str | None:
    """The ``"ops32"``/``"ops64"`` member of all-int ``entries``; None: not all such ints."""
    for code, name in (("i", "ops32"), ("q", "ops64")):
        try:
            return f'"{name}":"{_base64_of(code, entries)}"'
        except struct.error:  # (a key past 32 bits, then past 64; a text, a mark's list)
            continue
    return None


def _mixed(entries: list[Any]) -> str | None:
    """Ints packed as :func:`_packed` packs them, and the few other entries by place.

    A global read's operation is text (``r<id>(<table>:*)``, see
    ``executor.table_item``): one in a batch's thousands of ints sent them all
    through JSON, a sixteenth of the task's CPU with an audit every 1,000 events.
    The members are ``"mixed32"``/``"mixed64"`` (an earlier reader fails on them
    rather than take the places' stand-in ints for operations) and ``"others"``:
    ``[[place, entry], ...]``.  None: mostly other entries, or ints past 64 bits.
    All ints (one past 32 bits): :func:`_packed`'s ``"ops64"``.

    The other entries' places are found in C (``compress``, ``map``), not by a
    Python step per entry, and the 64-bit packing is not tried first on entries
    that hold a text: :func:`history_line` of 120,000 entries with a text every
    4,000 took 84-88 ns per entry instead of 92-97 (CPU, alternated, loaded host).
    """
    places = list(compress(count(), map(is_not, map(type, entries), repeat(int))))
    if not places:
        return _packed(entries)
    if 8 * len(places) > len(entries):
        return None
    ints = entries.copy()
    for i in places:
        ints[i] = 0
    packed = _packed(ints)
    if packed is None:
        return None
    others = [(i, entries[i]) for i in places]
    return packed.replace('"ops', '"mixed', 1) + ',"others":' + json.dumps(others)


def _base64_of(code: str, numbers: list[Any]) -> str:
    """``numbers`` as little-endian int32s, int64s or float64s (``code`` i, q, d) in base64.

    :class:`struct.error` when one is not such a number.  (``struct`` converts
    each item in a few dozen instructions; ``array`` parses a format string per
    item: several hundred.)
    """
    return base64.b64encode(struct.pack(f"<{len(numbers)}{code}", *numbers)).decode()


def _unpack(text: Any, code: str) -> list[Any]:
    """The items of an array that :func:`_base64_of` wrote."""
    if type(text) is not str:
        raise ValueError("no base64 text")
    numbers = array(code)
    numbers.frombytes(base64.b64decode(text, validate=True))
    if sys.byteorder != "little":
        numbers.byteswap()
    return numbers.tolist()


def expand(line: str, batch: int, where: str) -> tuple[list[str], list[tuple[str, list[Any]]]]:
    """The operations (text) and committed transactions ``(id, order)`` of an ``@`` line.

    ``batch``: the batch whose file it is (a plain mark names ``b<batch>_<mid>``);
    ``where`` names the file in errors.  A line that does not hold together
    (operations without their commit, marks without their orders) is a
    :class:`StoreError`: a history is never read half.
    """
    try:
        body = json.loads(line[len(MARK) :])
        tables = body["tables"]
        if type(tables) is not list or not tables or not all(type(t) is str for t in tables):
            raise ValueError("no list of tables")
        if "ops32" in body or "ops64" in body:
            wide = "ops64" in body
            entries: list[Any] = _unpack(body["ops64" if wide else "ops32"], "q" if wide else "i")
        elif "mixed32" in body or "mixed64" in body:  # (see _mixed)
            wide = "mixed64" in body
            entries = _unpack(body["mixed64" if wide else "mixed32"], "q" if wide else "i")
            for place, entry in body["others"]:
                if type(place) is not int or place < 0 or type(entry) not in (str, list):
                    raise ValueError(f"other entry {place!r:.20} {entry!r:.40}")
                entries[place] = entry
        else:
            entries = body["ops"]
            if type(entries) is not list:
                raise ValueError("no list of operations")
        at = _unpack(body["at"], "d")
        if "mid64" in body:
            inputs, mids = _unpack(body["input32"], "i"), _unpack(body["mid64"], "q")
        else:  # (as JSON lists: earlier versions, or a value past 32 / 64 bits)
            inputs, mids = body["input"], body["mid"]
        if not len(at) == len(inputs) == len(mids):
            raise ValueError("orders of unequal lengths")
        stride = 4 * len(tables) + 1
        plain_mark = stride - 1
        operations: list[str] = []
        commits: list[tuple[str, list[Any]]] = []
        pending: list[tuple[int, int, int]] = []  # (place in operations, code, key)
        plain = 0
        for entry in entries:
            kind = type(entry)
            if kind is int and entry != plain_mark:
                key, code = divmod(entry, stride)
                if code == plain_mark:
                    raise ValueError(f"entry {entry}")
                pending.append((len(operations), code, key))
                operations.append("")
                continue
            if kind is str:
                operations.append(entry)
                continue
            if kind is int:
                order = [at[plain], int(inputs[plain]), int(mids[plain])]
                plain += 1
                gid = f"b{batch}_{order[2]}"
            elif kind is list and len(entry) == 4 and type(entry[3]) is str:
                order, gid = [float(entry[0]), int(entry[1]), int(entry[2])], entry[3]
            else:
                raise ValueError(f"entry {entry!r:.40}")
            for place, code, key in pending:
                what = code & 3
                item = f"{tables[code >> 2]}:{'v' if what > 1 else ''}{key}"
                operations[place] = f"{'rwrw'[what]}{gid}({item})"
            pending.clear()
            commits.append((gid, order))
        if pending:
            raise ValueError("operations without their transaction's commit")
        if plain != len(at):
            raise ValueError("orders without their commits")
    except (ValueError, TypeError, KeyError, IndexError, binascii.Error) as exc:
        raise StoreError(f"{where}: damaged history ({exc})") from None
    return operations, commits
