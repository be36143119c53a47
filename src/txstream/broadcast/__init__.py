"""Consistent reads off the air: broadcast disks with F-Matrix, R-Matrix and Datacycle.

After Shanmugasundaram et al., *Efficient Concurrency Control for Broadcast
Environments* (SIGMOD 1999).  A :class:`Server` broadcasts its objects in cycles
with control information computed by a named algorithm; a :class:`Client`'s
read-only transactions check a read-condition before every read and so read
update-consistent data without ever contacting the server.  Runs record their
history (``c1@3``) for ``txstream check --criterion uc``.

The names below are loaded on first use, so that ``txstream --help`` does not
pay for numpy (the C matrix's storage).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from txstream.broadcast.algorithms import ALGORITHMS, CMatrix, make_algorithm
    from txstream.broadcast.base import (
        BroadcastError,
        ControlAlgorithm,
        Read,
        ReadConditionFailed,
        UnknownObjectError,
        ValidationFailed,
    )
    from txstream.broadcast.client import Client, ClientTransaction
    from txstream.broadcast.cmatrix import CResult, c_matrix
    from txstream.broadcast.params import SimParams
    from txstream.broadcast.recorder import HistoryRecorder
    from txstream.broadcast.server import Broadcast, Server, ServerTransaction
    from txstream.broadcast.sim import SimResult, simulate

_WHERE = {
    "ALGORITHMS": "algorithms",
    "CMatrix": "algorithms",
    "make_algorithm": "algorithms",
    "BroadcastError": "base",
    "ControlAlgorithm": "base",
    "Read": "base",
    "ReadConditionFailed": "base",
    "UnknownObjectError": "base",
    "ValidationFailed": "base",
    "Client": "client",
    "ClientTransaction": "client",
    "CResult": "cmatrix",
    "c_matrix": "cmatrix",
    "SimParams": "params",
    "HistoryRecorder": "recorder",
    "Broadcast": "server",
    "Server": "server",
    "ServerTransaction": "server",
    "SimResult": "sim",
    "simulate": "sim",
}

__all__ = [
    "ALGORITHMS",
    "Broadcast",
    "BroadcastError",
    "CMatrix",
    "CResult",
    "Client",
    "ClientTransaction",
    "ControlAlgorithm",
    "HistoryRecorder",
    "Read",
    "ReadConditionFailed",
    "Server",
    "ServerTransaction",
    "SimParams",
    "SimResult",
    "UnknownObjectError",
    "ValidationFailed",
    "c_matrix",
    "make_algorithm",
    "simulate",
]


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` when it is first asked for."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'txstream.broadcast' has no attribute {name!r}")
    return getattr(importlib.import_module(f"txstream.broadcast.{module}"), name)
