"""Merging several inputs into one declared order across micro-batches.

``merge="batch"``: the order is (micro-batch, order value, input, position): an
event that a source hands over in a later micro-batch comes after every event
of the earlier ones, whatever its order value.  It is the default for a job
with at most one input with an order column, where it is the serial order
(see :meth:`~txstream.spark.runtime.job.Job.merge_for`).

``merge="event-time"`` (the default for several ordered inputs, see ``Job.merge_for``):
the order is the order value across micro-batches. A source may hand one
input's events over ahead of another's (a file source that groups files
differently after a restart, a change stream that runs ahead of the readings);
so an event is *held* until every input that is still delivering has reached
its order value. The *frontier* of a batch is the smallest, over the inputs
that delivered rows in the last ``idle_batches`` batches, of the largest order
value each has delivered so far; an input that has been quiet that long does
not hold the others back (when every input is quiet, everything is released);
an input that has delivered nothing yet holds them back for as long.
``run_local`` (a bounded run) counts no quiet batches unless ``idleBatches``
is set: its inputs hold each other back until they deliver or end, so its
answer is the serial one whatever the hand-over.  Held events live in their
partition's state, saved with each batch. An event whose order value is below
a frontier already passed (late) runs in the batch it arrives in, after the
events released before it (no report: its place in the order is lost).

An input may declare a *watermark* delay (``.input(..., watermark=10.0)``,
or ``withWatermark`` on its order column on Spark, see :func:`watermark_delay`
and :func:`plan_watermarks`): it may deliver events up to that delay below the
largest order value it has delivered, so its contribution to the frontier is
``max_seen - delay`` rather than ``max_seen``.  The others are held only that
far, its own events above the frontier wait as usual, and its events further
than ``delay`` behind are late, as above.

An input can be *ended* (:func:`ended`): ``run_local`` ends its inputs after
its last batch with one more committed batch, which releases everything held
(see :meth:`~txstream.spark.runtime.local.LocalRunner.end_inputs`); so does a
Spark query at the end of a bounded run (see ``TxQuery.end_inputs``).

NaN and infinite order values have no place in the order: such events are
reported as failures with their input position and not run (see
:func:`~txstream.spark.runtime.base.bad_event`); they never move a frontier.

An event *at* the frontier is released only when no input still delivering
can hand over an event that comes before it: at equal order values the
inputs' declaration order decides, so an input declared earlier that has
reached the frontier may still deliver events of that value
(:func:`advance` returns the frontier with the smallest index of such an
input).  The boundary then holds the events of a transaction that is still
open (:meth:`~txstream.spark.runtime.boundaries.Boundary.complete`): a
timestamp, slice or punctuation run is released whole, whatever the
micro-batches the sources cut it into.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from txstream.spark.runtime.base import RuntimeJobError

MERGES = ("batch", "event-time")


Bound = tuple[float, int]
"""What a batch releases: events whose ``(order value, input index)`` is at most this."""


def advance(
    frontier: dict[str, Any],
    seen: dict[str, float],
    idle_batches: int,
    index: Mapping[str, int],
    delays: Mapping[str, float] | None = None,
) -> tuple[Bound, dict[str, Any]]:
    """The release bound of a batch that delivered ``seen`` (input -> max order value).

    ``frontier`` is the bookkeeping after the previous batch (``{}`` at first);
    ``index`` gives each input's declaration index.  Returns the bound (the
    frontier, and the smallest index of an input still delivering that has
    reached it: it may deliver more events of that value, which come before
    those of later inputs) and the bookkeeping after this batch.  ``delays``:
    each input's watermark delay (none: 0): its contribution is its largest
    order value less the delay (the bookkeeping keeps the largest values, so a
    restart with another delay moves the frontier from the same values).
    """
    high: dict[str, float] = dict(frontier.get("high", {}))
    quiet: dict[str, int] = dict(frontier.get("quiet", {}))
    # A declared input that has delivered nothing yet holds the others back too
    # while it is not quiet (its events may be the first): it has no ``high``.
    for name in set(high) | set(seen) | set(index):
        if name in seen:
            high[name] = max(high.get(name, -math.inf), seen[name])
            quiet[name] = 0
        else:
            quiet[name] = quiet.get(name, 0) + 1
    active = [n for n in quiet if quiet[n] < idle_batches]
    if not active:
        return (math.inf, 0), {"high": high, "quiet": quiet}
    if any(n not in high for n in active):
        return (-math.inf, 0), {"high": high, "quiet": quiet}  # releases nothing
    delays = delays or {}
    reach = {n: high[n] - delays.get(n, 0.0) for n in active}
    upto = min(reach.values())
    first = min(index.get(n, 0) for n in active if reach[n] == upto)
    return (upto, first), {"high": high, "quiet": quiet}


def ended(frontier: dict[str, Any], idle_batches: int) -> tuple[Bound, dict[str, Any]]:
    """The release bound and bookkeeping of a batch that ends every input (releases all).

    Every input counts as quiet afterwards (an input that delivers again is
    active again; its events below the old frontier are late).  The bookkeeping
    says ``"ended": True`` (stored with the batch's commit marker, where a
    restart recognises the batch that ended a Spark query's inputs); the next
    :func:`advance` drops it.
    """
    high: dict[str, float] = dict(frontier.get("high", {}))
    quiet = {name: max(idle_batches, n) for name, n in frontier.get("quiet", {}).items()}
    return (math.inf, 0), {"high": high, "quiet": quiet, "ended": True}


_UNITS = {
    "microsecond": 1e-6,
    "millisecond": 1e-3,
    "second": 1.0,
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "week": 604800.0,
    "us": 1e-6,
    "ms": 1e-3,
    "sec": 1.0,
    "s": 1.0,
    "min": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)\s*")


def watermark_delay(value: Any, what: str) -> float:
    """A watermark delay in order-value units (seconds for a timestamp column).

    ``value``: a number >= 0, a :class:`~datetime.timedelta`, or Spark's
    interval text (``"10 seconds"``, ``"interval 2 minutes"``, ``"1 hours 30
    seconds"``; months and years have no fixed length and are refused).
    Anything else: a one-line :class:`RuntimeJobError` naming ``what``.
    """
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        delay = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        text = text[len("interval") :] if text.startswith("interval") else text
        delay, end = 0.0, 0
        for match in _PART.finditer(text):
            unit = match.group(2)
            unit = unit if unit in _UNITS else unit[:-1]  # seconds, mins
            if match.start() != end or unit not in _UNITS:
                break
            delay += float(match.group(1)) * _UNITS[unit]
            end = match.end()
        if not text.strip() or end != len(text):
            raise RuntimeJobError(
                f"{what}: watermark {value!r} is not a delay; give a number of order-value "
                "units (seconds for a timestamp) or an interval such as '10 seconds'"
            )
    else:
        raise RuntimeJobError(
            f"{what}: watermark is a number >= 0 or an interval such as '10 seconds', not {value!r}"
        )
    if not math.isfinite(delay) or delay < 0:
        raise RuntimeJobError(f"{what}: watermark must be a finite delay >= 0, not {value!r}")
    return delay


_WATERMARK = re.compile(
    r"EventTimeWatermark\s+(?:[0-9a-fA-F-]{36},\s*)?`?([^#`]+?)`?#\d+:\s*[^,]*,\s*(.+?)\s*$"
)


def plan_watermarks(plan: str) -> list[tuple[str, str]]:
    """The ``(column, delay text)`` of each ``withWatermark`` in a logical plan's text.

    Spark prints the node as ``EventTimeWatermark [<id>, ]<col>#<n>: <type>,
    <interval>`` (the id since Spark 4).
    """
    return [(m.group(1), m.group(2)) for m in map(_WATERMARK.search, plan.splitlines()) if m]
