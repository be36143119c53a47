"""Merging several inputs into one declared order across micro-batches.

``merge="batch"`` (the default): the order is (micro-batch, order value, input,
position): an event that a source hands over in a later micro-batch comes after
every event of the earlier ones, whatever its order value.

``merge="event-time"``: the order is the order value across micro-batches. A
source may hand one input's events over ahead of another's (a file source that
groups files differently after a restart, a change stream that runs ahead of
the readings); so an event is *held* until every input that is still delivering
has reached its order value. The *frontier* of a batch is the smallest, over
the inputs that delivered rows in the last ``idle_batches`` batches, of the
largest order value each has delivered so far; an input that has been quiet
that long does not hold the others back (when every input is quiet, everything
is released). Held events live in their partition's state, saved with each
batch. An event whose order value is below a frontier already passed (late)
runs in the batch it arrives in.
"""

from __future__ import annotations

import math
from typing import Any

MERGES = ("batch", "event-time")


def advance(
    frontier: dict[str, Any], seen: dict[str, float], idle_batches: int
) -> tuple[float, dict[str, Any]]:
    """The release frontier of a batch that delivered ``seen`` (input -> max order value).

    ``frontier`` is the bookkeeping after the previous batch (``{}`` at first);
    returns the frontier and the bookkeeping after this batch.
    """
    high: dict[str, float] = dict(frontier.get("high", {}))
    quiet: dict[str, int] = dict(frontier.get("quiet", {}))
    for name in set(high) | set(seen):
        if name in seen:
            high[name] = max(high.get(name, -math.inf), seen[name])
            quiet[name] = 0
        else:
            quiet[name] = quiet.get(name, 0) + 1
    active = [high[n] for n in high if quiet[n] < idle_batches]
    upto = min(active) if active else math.inf
    return upto, {"high": high, "quiet": quiet}
