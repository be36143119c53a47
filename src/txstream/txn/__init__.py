"""The transaction manager: protocols, lock manager, orderings, rollback, histories.

Start here: :class:`TransactionManager` (``tm.begin()``, ``with tm.begin() as
t:``, ``tm.run(fn)``), the protocols by name (:func:`protocols`) and
the stress run in :mod:`txstream.txn.stress` (``txstream stress``).  Which
events form one transaction is the caller's choice; the project's vocabulary
of boundaries is the runtime's (``tx.boundary``, ``docs/spark.md``).
"""

from txstream.txn.base import (
    ConcurrencyControl,
    DeadlockError,
    LockTimeoutError,
    Protocol,
    TransactionError,
    ValidationError,
    WoundedError,
    WriteConflictError,
)
from txstream.txn.locks import LockManager
from txstream.txn.manager import Transaction, TransactionManager
from txstream.txn.protocols import PROTOCOLS, get_protocol, protocols
from txstream.txn.recorder import HistoryRecorder

__all__ = [
    "PROTOCOLS",
    "ConcurrencyControl",
    "DeadlockError",
    "HistoryRecorder",
    "LockManager",
    "LockTimeoutError",
    "Protocol",
    "Transaction",
    "TransactionError",
    "TransactionManager",
    "ValidationError",
    "WoundedError",
    "WriteConflictError",
    "get_protocol",
    "protocols",
]
