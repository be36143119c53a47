"""Sliding windows that slide while queries read them (Golab, Bijay and Özsu, 2005).

Start here: :class:`SlidingWindow` (n sub-windows with summaries),
:class:`Query`/:class:`QueryGroup` (aggregates by summary or window scan),
:class:`WindowEngine` (the scheduler loop of Algorithms 1 and 2), the schedulers
by name (:data:`SCHEDULERS`: ``serial``, ``ws``, ``lws``, ``ttu``, ``lws-rescan``,
``ttu-rescan``) and :func:`txstream.windows.sim.run` (the Section 5 workload on a
simulated clock).  ``txstream windows run`` and ``txstream bench windows`` are
the command lines; docs/windows.md is the guide.
"""

from txstream.windows.base import PACKET_FIELDS, Scheduler, WindowError
from txstream.windows.engine import Costs, QueryTxn, Result, WindowEngine
from txstream.windows.queries import AGGREGATES, Query, QueryGroup, evaluate_directly
from txstream.windows.schedulers import SCHEDULERS, get_scheduler
from txstream.windows.window import SlidingWindow, SubWindow, Summary

__all__ = [
    "AGGREGATES",
    "PACKET_FIELDS",
    "SCHEDULERS",
    "Costs",
    "Query",
    "QueryGroup",
    "QueryTxn",
    "Result",
    "Scheduler",
    "SlidingWindow",
    "SubWindow",
    "Summary",
    "WindowEngine",
    "WindowError",
    "evaluate_directly",
    "get_scheduler",
]
