"""Continuous queries that read updatable tables consistently (Oyamada et al., SAC 2013).

Start here: the operators in :mod:`txstream.cq.base` (``Source``, ``Select``,
``Project``, ``RefJoin``, ``Reference``, ``WindowAgg``, ``WindowJoin``), the analysis in
:mod:`txstream.cq.plan` (commit operator, SETUP-REDO-QUEUES), :class:`CQEngine`
with the strategies ``naive``, ``s2pl``, ``snapshot``, ``optimistic``
(:data:`STRATEGIES`), and :class:`Updaters`.  ``txstream cq run`` and
``txstream bench cq`` are the command lines; docs/cq.md is the guide.
"""

from txstream.cq.base import (
    AGGREGATES,
    DIRTY,
    CQError,
    Event,
    Operator,
    Project,
    Reference,
    RefJoin,
    Result,
    Select,
    Source,
    WindowAgg,
    WindowJoin,
)
from txstream.cq.engine import (
    STRATEGIES,
    VERSION_KEY,
    CQEngine,
    Strategy,
    Updaters,
    get_strategy,
    make_manager,
)
from txstream.cq.plan import commit_operator, setup_redo_queues, shape, validate

__all__ = [
    "AGGREGATES",
    "DIRTY",
    "STRATEGIES",
    "VERSION_KEY",
    "CQEngine",
    "CQError",
    "Event",
    "Operator",
    "Project",
    "RefJoin",
    "Reference",
    "Result",
    "Select",
    "Source",
    "Strategy",
    "Updaters",
    "WindowAgg",
    "WindowJoin",
    "commit_operator",
    "get_strategy",
    "make_manager",
    "setup_redo_queues",
    "shape",
    "validate",
]
