"""Consistent reads off the air: broadcast disks with F-Matrix, R-Matrix and Datacycle.

After Shanmugasundaram et al., *Efficient Concurrency Control for Broadcast
Environments* (SIGMOD 1999).  A :class:`Server` broadcasts its objects in cycles
with control information computed by a named algorithm; a :class:`Client`'s
read-only transactions check a read-condition before every read and so read
update-consistent data without ever contacting the server.  Runs record their
history (``c1@3``) for ``txstream check --criterion uc``.
"""

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
from txstream.broadcast.recorder import HistoryRecorder
from txstream.broadcast.server import Broadcast, Server, ServerTransaction

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
    "UnknownObjectError",
    "ValidationFailed",
    "c_matrix",
    "make_algorithm",
]
