"""Continuous loading into relations with materialized join views, without deadlocks.

After Luo, Naughton, Ellmann and Watzke, "Transaction Reordering and Grouping
for Continuous Data Loading" (BIRTE 2006).  Start with :class:`Loader`, a
:class:`Schema` of :class:`Relation` and :class:`JoinView`, and a target:
:class:`EmbeddedTarget` (txstream's own tables under SS2PL) or
:class:`PostgresTarget` (a PostgreSQL server with trigger-maintained views).
"""

from txstream.loading.base import (
    DeadlockAbort,
    LoadingMethod,
    LoadTransaction,
    State,
    Target,
    TargetSession,
)
from txstream.loading.embedded import EmbeddedTarget
from txstream.loading.loader import Loader, LoadReport
from txstream.loading.methods import METHODS, Naive, Partition, Reorder, get_method
from txstream.loading.ops import KINDS, InvalidOperation, Modification, validate
from txstream.loading.oracle import apply_serial, expected_state, verify
from txstream.loading.preagg import preaggregate
from txstream.loading.schema import Aggregate, JoinView, Relation, Schema, SchemaError

TARGETS = ("embedded", "postgres")

__all__ = [
    "KINDS",
    "METHODS",
    "TARGETS",
    "Aggregate",
    "DeadlockAbort",
    "EmbeddedTarget",
    "InvalidOperation",
    "JoinView",
    "LoadReport",
    "LoadTransaction",
    "Loader",
    "LoadingMethod",
    "Modification",
    "Naive",
    "Partition",
    "Relation",
    "Reorder",
    "Schema",
    "SchemaError",
    "State",
    "Target",
    "TargetSession",
    "apply_serial",
    "expected_state",
    "get_method",
    "preaggregate",
    "validate",
    "verify",
]
