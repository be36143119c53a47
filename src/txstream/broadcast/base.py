"""Contracts of the broadcast engine: control-information algorithms and their errors.

A broadcast server sends every object of its database once per *cycle*, each
object followed by a slice of *control information*.  A client's read-only
transaction checks a *read-condition* against that information before every
read; the algorithms of Shanmugasundaram et al. (SIGMOD 1999) differ only in what
the control information is and how the condition reads it.  This module fixes
that interface; :mod:`txstream.broadcast.algorithms` implements it.

Cycles are numbered from 1.  A transaction ``t0`` is deemed to have written every
object in cycle 0, before the first broadcast.  An update transaction that
commits while cycle ``k`` is on the air has commit cycle ``k``; its writes are on
the air from cycle ``k + 1`` on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, NamedTuple

from txstream.errors import TransientError, TxStreamError

ALGORITHM_NAMES = ("f-matrix", "r-matrix", "datacycle", "grouped", "f-matrix-no")
"""The algorithms :func:`txstream.broadcast.make_algorithm` knows, by name."""

Column = Any
"""The control information a client keeps for one read object: a sequence indexed
by object number (an F-Matrix column ``C(., j)``, a grouped column ``MC(., s)``, or
the whole vector of last-write cycles).  Treat it as read-only."""


class BroadcastError(TxStreamError):
    """Bad input to the broadcast engine (an unknown object, cycles out of order ...)."""


class UnknownObjectError(BroadcastError, KeyError):
    """An object that the broadcast database does not hold."""

    def __init__(self, name: str, objects: Sequence[str]) -> None:
        self.name = name
        shown = ", ".join(objects[:5]) + (", ..." if len(objects) > 5 else "")
        count = f"{len(objects)} object" + ("s" if len(objects) != 1 else "")
        super().__init__(
            f"object {name!r} does not exist; the database holds {count} ({shown}): "
            "use only objects that the server broadcasts"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class ReadConditionFailed(TransientError):
    """A read-only transaction's read-condition failed: abort it and start it again."""


class ValidationFailed(TransientError):
    """The server refused an update transaction: something it read was overwritten."""


class Read(NamedTuple):
    """One read of a client transaction, as the read-condition sees it.

    ``obj`` is the object's number, ``cycle`` the broadcast cycle whose value was
    read (for a cached value: the cycle it was cached in), and ``column`` the
    control information broadcast with that value.
    """

    obj: int
    cycle: int
    column: Column


class ControlAlgorithm(ABC):
    """How a server computes, and a client checks, the control information.

    Call order and invariants:

    1. The server calls :meth:`on_commit` once per committed update
       transaction, in a serialization order of the update transactions (our
       server commits in validation order, which is one), with non-decreasing
       cycles.  ``reads`` holds only objects the transaction read from *another*
       transaction (not after writing them itself).
    2. At the start of every cycle the server calls :meth:`snapshot` (cycles
       strictly increase); the result is immutable and is what that cycle
       broadcasts.  It reflects every commit of earlier cycles and none of the
       current one.
    3. A client reading object ``j`` in a cycle takes :meth:`column` of that
       cycle's snapshot, then calls :meth:`read_condition` with the reads it
       already made; only when it returns ``True`` may the read proceed.

    ``control_entries`` says how many timestamps ride along with each object:
    it sets the broadcast cost of the control information.
    """

    name: str = ""
    supports_cache: bool = True

    def __init__(self, n: int) -> None:
        if n < 1:
            raise BroadcastError(f"the database needs at least one object, got {n}")
        self.n = n

    @abstractmethod
    def on_commit(self, reads: Sequence[int], writes: Sequence[int], cycle: int) -> None:
        """Account for an update transaction that committed in ``cycle``."""

    @abstractmethod
    def snapshot(self, cycle: int) -> Any:
        """The control information broadcast during ``cycle`` (immutable)."""

    @abstractmethod
    def column(self, snapshot: Any, obj: int) -> Column:
        """What the client keeps from ``snapshot`` when it reads object ``obj``."""

    @abstractmethod
    def read_condition(self, previous: Sequence[Read], read: Read) -> bool:
        """Whether ``read`` may follow ``previous`` (the transaction's reads so far)."""

    @abstractmethod
    def control_entries(self) -> int:
        """Timestamps broadcast with each object (0: control costs no air time)."""

    def cell(self, snapshot: Any, i: int, j: int) -> int:
        """Entry (i, j) of the matrix form, for inspection and tests."""
        return int(self.column(snapshot, j)[i])
