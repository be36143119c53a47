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

Every other value (``None``, ``bool``, ``int``, ``float``, ``str``, lists,
dicts with string keys) is itself; NaN and the infinities are written as
``NaN``, ``Infinity`` and ``-Infinity`` (Python's JSON reads them back).  A
value of any other type is a :class:`~txstream.spark.runtime.state.StoreError`
when it is written.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from itertools import chain
from typing import Any
from zoneinfo import ZoneInfo

from txstream.errors import TxStreamError
from txstream.spark.runtime.boundaries import Event


class UnstorableValueError(TxStreamError):
    """A value of a type the store's data format does not hold."""


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
        # A delta's rows (lists of plain values and plain rows) go to the C encoder whole.
        return obj if _plain_records(obj) else [encode(v) for v in obj]
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


def _plain_records(items: list[Any]) -> bool:
    """Whether ``items`` is a list of lists of plain values and rows of plain values.

    Decided by a census of types that runs in C (``map``, ``chain``, ``set``: no
    Python code per item), so a delta's rows (``[table, value, key, row]``) are
    not walked one by one.  A key with a ``$`` anywhere (a tag's mark) sends the
    list the slow way.
    """
    if not items or set(map(type, items)) != {list}:
        return False
    flat = list(chain.from_iterable(items))
    kinds = set(map(type, flat))
    if not kinds <= _ROW_ITEMS:
        return False
    if dict not in kinds:
        return True
    rows = [item for item in flat if type(item) is dict]
    if set(map(type, chain.from_iterable(rows))) - {str}:
        return False
    if "$" in "".join(chain.from_iterable(rows)):
        return False
    return set(map(type, chain.from_iterable(map(dict.values, rows)))) <= _PLAIN


_ROW_ITEMS = _PLAIN | {dict}


def _decode_tagged(obj: dict[str, Any]) -> Any:
    if len(obj) != 1:
        return obj
    tag, value = next(iter(obj.items()))
    if not tag.startswith("$"):
        return obj
    if tag == "$t":
        return tuple(value)
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
    """``obj`` as UTF-8 tagged JSON."""
    return json.dumps(encode(obj), separators=(",", ":")).encode()


def loads(body: bytes) -> Any:
    """The value :func:`dumps` wrote (``ValueError`` when the text is not one)."""
    return json.loads(body, object_hook=_decode_tagged)
