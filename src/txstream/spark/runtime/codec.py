"""The data format of the runtime store's ``.bin`` files: tagged JSON, never pickle.

A store file must never run code when it is read (whoever can write into a
checkpoint could otherwise run code in the job), so the state, the held
events and the hand-over files between phases are JSON.  JSON alone would
lose what the state relies on (tuples as keys, ``int`` vs ``float``, NaN,
dicts with non-string keys), so values JSON cannot say exactly are wrapped
in a one-key object whose key starts with ``$``:

- ``{"$t": [...]}``: a tuple;
- ``{"$d": [[k, v], ...]}``: a dict whose keys are not all strings (or one starts with ``$``);
- ``{"$b": "..."}``: bytes (base64);
- ``{"$s": [...]}``, ``{"$fs": [...]}``: a set, a frozenset;
- ``{"$dt": iso}``, ``{"$date": iso}``, ``{"$time": iso}``, ``{"$td": [d, s, us]}``:
  date and time values;
- ``{"$dec": "1.50"}``: a Decimal;
- ``{"$dz": [local iso, zone, fold]}``: a datetime in a ``zoneinfo`` zone (kept by
  name: its offset depends on the zone's rules);
- ``{"$pts": [iso, zone]}``, ``{"$np": [dtype, value]}``: a pandas ``Timestamp`` (to the
  nanosecond) and a numpy number, as rows handed to ``run_local`` from pandas hold them;
- ``{"$e": [...]}``: an input event (held by the event-time merge, or shipped between phases).

Long lists, the bulk of the state, are written column by column so that the
C encoder and decoder do the work (no Python code per item when the items
are plain):

- ``{"$lt": [[...], ...]}``: a list of tuples of plain values (composite keys);
- ``{"$lr": [names, absent, column, ...]}``: a list of dicts (rows) that all
  have the columns ``names`` in that order, one list per column (each itself
  encoded), and ``None`` at the positions ``absent`` (a delta's deleted rows);
- ``{"$le": [orders, inputs, rows, values, pids, copies]}``: a list of events.

Every other value (``None``, ``bool``, ``int``, ``float``, ``str``, lists,
dicts with string keys) is itself; NaN and the infinities are written as
``NaN``, ``Infinity`` and ``-Infinity`` (Python's JSON reads them back).  A
value of any other type is a :class:`~txstream.spark.runtime.errors.StoreError`
when it is written.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import secrets
from collections.abc import Callable
from contextvars import ContextVar
from decimal import Decimal
from itertools import chain, repeat
from operator import attrgetter, itemgetter
from typing import Any
from zoneinfo import ZoneInfo

from txstream.spark.runtime.boundaries import Event
from txstream.spark.runtime.errors import (
    UnstorableValueError as UnstorableValueError,  # (re-exported)
)

_PLAIN = frozenset({str, int, float, bool, type(None)})
"""Types JSON itself keeps exactly (floats with Python's NaN/Infinity literals)."""


def encode(obj: Any) -> Any:
    """``obj`` as JSON values (see the module docstring); unsupported types raise."""
    t = type(obj)
    if t in _PLAIN:
        return obj
    if t is dict:
        if obj and type(next(iter(obj))) is not str:  # (a table's values or keys: no str keys)
            return {
                "$d": [
                    [k if type(k) in _PLAIN else encode(k), v if type(v) in _PLAIN else encode(v)]
                    for k, v in obj.items()
                ]
            }
        plain = True
        for k, v in obj.items():
            if type(k) is not str or k[:1] == "$":
                return {"$d": [[encode(k), encode(v)] for k, v in obj.items()]}
            if plain and type(v) not in _PLAIN:
                plain = False
        # A row of plain values (most of the state) goes to the C encoder as it is.
        return obj if plain else {k: encode(v) for k, v in obj.items()}
    if t is list:
        return _encode_list(obj)
    if t is tuple:
        return {"$t": [encode(v) for v in obj]}
    if t is Event:
        return {
            "$e": [
                encode(obj.order),
                obj.input,
                encode(obj.row),
                encode(obj.values),
                encode(obj.pids),
                obj.copy,
            ]
        }
    if t is bytes:
        return {"$b": base64.b64encode(obj).decode("ascii")}
    if t is set:
        return {"$s": [encode(v) for v in obj]}
    if t is frozenset:
        return {"$fs": [encode(v) for v in obj]}
    if t is dt.datetime and isinstance(obj.tzinfo, ZoneInfo):
        return {"$dz": [obj.replace(tzinfo=None).isoformat(), obj.tzinfo.key, obj.fold]}
    if t is dt.datetime:
        return {"$dt": obj.isoformat()}
    if t is dt.date:
        return {"$date": obj.isoformat()}
    if t is dt.time:
        return {"$time": obj.isoformat()}
    if t is dt.timedelta:
        return {"$td": [obj.days, obj.seconds, obj.microseconds]}
    if t is Decimal:
        return {"$dec": str(obj)}
    if t.__module__.startswith("pandas") and t.__name__ == "Timestamp":
        zone = None if obj.tz is None else str(obj.tz)
        if zone is not None and _pandas_timestamp(obj.isoformat(), zone).tz != obj.tz:
            zone = None  # a zone pandas cannot name again: its fixed offset (same instant)
        return {"$pts": [obj.isoformat(), zone]}
    if t.__module__ == "numpy" and getattr(obj, "shape", None) == () and obj.dtype.kind in "biuf":
        return {"$np": [obj.dtype.str, obj.item()]}
    raise UnstorableValueError(
        f"a value of type {t.__module__}.{t.__qualname__} ({obj!r:.60}) cannot be stored in "
        "the job's state; use None, bool, int, float, str, bytes, Decimal, date/time values, "
        "and lists, tuples, sets or dicts of them"
    )


_COLUMNS_FROM = 8
"""Lists at least this long are censused for a column layout; shorter ones are walked."""


def _encode_list(items: list[Any]) -> Any:
    """A list as JSON values: whole when its items are plain, column by column when it can be.

    What a list holds is found by a census of types that runs in C (``map``,
    ``chain``, ``set``: no Python code per item), so a delta's or snapshot's
    columns of plain values and rows of plain values are never walked one by one.
    """
    if not items:
        return items
    spliced = _SPLICED.get()
    if len(items) >= _COLUMNS_FROM and type(items[0]) in _ROWS_OR_NONE:
        # Rows (a delta's, a snapshot's): straight to the column layout, whose
        # passes also take the census of the rows' types (see _rows_block).
        block = _rows_block(items)
        if block is not None:
            return block
    if spliced is not None and len(items) > _BLOCK:
        mark = _plain_text(items, spliced)
        if mark is not None:
            return mark
    kinds = set(map(type, items))
    if kinds <= _PLAIN:
        return items  # (to the C encoder whole)
    if len(items) >= _COLUMNS_FROM:
        if kinds == {list} or kinds == {tuple}:
            if set(map(type, chain.from_iterable(items))) <= _PLAIN:
                return items if kinds == {list} else {"$lt": items}
        elif kinds == {Event}:
            return {"$le": [encode(list(map(get, items))) for get in _EVENT_FIELDS]}
    return [encode(v) for v in items]


NoneType = type(None)
_ROWS_OR_NONE = frozenset({dict, NoneType})
_EVENT_FIELDS = [attrgetter(f) for f in ("order", "input", "row", "values", "pids", "copy")]

_BLOCK = 2048
"""Rows per block of :func:`_rows_block`'s passes.  A delta's rows lie scattered over
the state's memory, far larger than the CPU's caches: one pass over all of them
per question (their types, their columns, each column's types) missed the
cache on every row each time (the delta's save was a sixth of phase 1's CPU).  Block by
block, only the first pass over a block's rows misses; the next find them in
the cache (2,048 rows of a few columns: a few hundred KiB)."""


def _rows_block(rows: list[Any]) -> dict[str, Any] | None:
    """``rows`` (dicts, ``None`` for an absent row) column by column, or None.

    None when they are not all dicts and ``None`` or when the dicts do not all
    have the same string keys in the same order (or there is none).
    """
    first = next((row for row in rows if row is not None), None)
    if type(first) is not dict:
        return None
    names = tuple(first)
    if not names or set(map(type, names)) != {str}:
        return None
    stand_in = dict.fromkeys(names)  # where a row is absent, so that the columns stay aligned
    gone: list[int] = []
    spliced = _SPLICED.get()
    columns: list[list[Any]] = [[] for _ in names]  # (without spliced text)
    texts: list[list[str]] = [[] for _ in names]  # (with: each block's JSON)
    plain = [True] * len(names)
    getters = [itemgetter(name) for name in names]
    for start in range(0, len(rows), _BLOCK):
        block = rows[start : start + _BLOCK]
        if set(map(type, block)) != {dict}:
            if not set(map(type, block)) <= _ROWS_OR_NONE:
                return None
            gone.extend(start + i for i, row in enumerate(block) if row is None)
            block = [stand_in if row is None else row for row in block]
        if set(map(tuple, block)) != {names}:
            return None
        for i, get in enumerate(getters):
            part = list(map(get, block))
            if plain[i] and not set(map(type, part)) <= _PLAIN:
                plain[i] = False
            if spliced is None:
                columns[i].extend(part)
            elif plain[i]:  # (its values are cached now: written now, not in a pass of its own)
                texts[i].append(_JSON(part)[1:-1])
    encoded: list[Any] = []
    for i, get in enumerate(getters):
        if spliced is None:
            encoded.append(columns[i] if plain[i] else encode(columns[i]))
        elif plain[i]:
            encoded.append(spliced.put(texts[i]))
        else:  # (a column with values that are not plain: made again, encoded item by item)
            full = [stand_in if row is None else row for row in rows]
            encoded.append(encode(list(map(get, full))))
    return {"$lr": [list(names), gone, *encoded]}


def _plain_text(items: list[Any], spliced: _Spliced) -> str | None:
    """A long list of plain values as spliced JSON text (see :func:`dumps`), or None."""
    parts = []
    for start in range(0, len(items), _BLOCK):
        block = items[start : start + _BLOCK]
        if not set(map(type, block)) <= _PLAIN:
            return None
        parts.append(_JSON(block)[1:-1])
    return spliced.put(parts)


_JSON: Callable[[Any], str] = json.JSONEncoder(separators=(",", ":")).encode
"""``json.dumps(value, separators=(",", ":"))``, the store's JSON (one encoder for all)."""


class _Spliced:
    """Long lists written as JSON text block by block, while their values were cached.

    :func:`encode` leaves a *mark* (a string) in their place; :func:`dumps`
    puts the text there.  A block's values are then read once after they were
    last cached, instead of again in a pass of the C encoder over the whole
    list (from cold memory, for a delta's rows scattered over the state).
    """

    def __init__(self) -> None:
        self.nonce = secrets.token_hex(16)
        self.texts: dict[str, str] = {}

    def put(self, parts: list[str]) -> str:
        """A mark for the list whose items' JSON text, block by block, is ``parts``."""
        mark = f"\x00{self.nonce}:{len(self.texts)}"
        self.texts[mark] = f"[{','.join(parts)}]"
        return mark


_SPLICED: ContextVar[_Spliced | None] = ContextVar("_SPLICED", default=None)
"""While :func:`dumps` encodes: where long lists' text goes (None: lists stay lists)."""


def _decode_rows(value: list[Any]) -> list[Any]:
    names, gone, *columns = value
    rows: list[Any] = list(map(dict, map(zip, repeat(names), zip(*columns, strict=True))))
    for i in gone:
        rows[i] = None
    return rows


def _decode_tagged(obj: dict[str, Any]) -> Any:
    if len(obj) != 1:
        return obj
    tag, value = next(iter(obj.items()))
    if not tag.startswith("$"):
        return obj
    if tag == "$t":
        return tuple(value)
    if tag == "$lr":
        return _decode_rows(value)
    if tag == "$lt":
        return list(map(tuple, value))
    if tag == "$le":
        return list(map(Event, *value))
    if tag == "$d":
        return {k: v for k, v in value}
    if tag == "$e":
        order, name, row, values, pids, copy = value
        return Event(order, name, row, values, pids, copy)
    if tag == "$b":
        return base64.b64decode(value)
    if tag == "$s":
        return set(value)
    if tag == "$fs":
        return frozenset(value)
    if tag == "$dt":
        return dt.datetime.fromisoformat(value)
    if tag == "$date":
        return dt.date.fromisoformat(value)
    if tag == "$time":
        return dt.time.fromisoformat(value)
    if tag == "$td":
        return dt.timedelta(days=value[0], seconds=value[1], microseconds=value[2])
    if tag == "$dz":
        local, zone, fold = value
        return dt.datetime.fromisoformat(local).replace(tzinfo=ZoneInfo(zone), fold=fold)
    if tag == "$pts":
        return _pandas_timestamp(*value)
    if tag == "$np":
        import numpy as np

        return np.dtype(value[0]).type(value[1])
    if tag == "$dec":
        return Decimal(value)
    raise ValueError(f"unknown tag {tag!r}")


def _pandas_timestamp(text: str, zone: str | None) -> Any:
    import pandas as pd  # type: ignore[import-untyped]

    stamp = pd.Timestamp(text)
    return stamp if zone is None else stamp.tz_convert(zone)


def dumps(obj: Any) -> bytes:
    """``obj`` as UTF-8 tagged JSON.

    The same text as ``json.dumps(encode(obj), separators=(",", ":"))``; long
    lists are written block by block meanwhile (see :class:`_Spliced`).
    """
    spliced = _Spliced()
    reset = _SPLICED.set(spliced)
    try:
        tree = encode(obj)
    finally:
        _SPLICED.reset(reset)
    text = _JSON(tree)
    texts = spliced.texts
    for mark, part in texts.items():
        quoted = _JSON(mark)
        if text.count(quoted) != 1 or any(quoted in t for t in texts.values()):
            # A string of the data that reads like a mark (its nonce is random and
            # made for this call: never met): the whole list in one pass instead.
            return _JSON(encode(obj)).encode()
        text = text.replace(quoted, part, 1)
    return text.encode()


def loads(body: bytes) -> Any:
    """The value :func:`dumps` wrote (``ValueError`` when the text is not one)."""
    return json.loads(body, object_hook=_decode_tagged)
