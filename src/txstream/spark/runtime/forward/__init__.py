"""Multi-partition transactions in phase 1, in parallel: rows forwarded to a home partition.

Calvin (Thomson et al., SIGMOD 2012) fixes the order of a batch's transactions
before executing them; every partition then executes its part of a
multi-partition transaction at the transaction's place in its own order and
forwards its local reads to the other participants: no locks across
partitions, no two-phase commit, no aborts for conflicts.  Here the order is the
declared one, fixed before the batch runs, and one participant executes the
transaction, its *home*: the partition of its first partition value (partition
0 for a global read).  Every other participant, when the transaction is first
in line for all of its values there, forwards those values' rows (an ``up``
message); the home runs the function once over its own rows and the forwarded
ones and sends each participant back what changed of its values (``back``),
with the operations on them when the history is recorded.  A transaction that
raises is rolled back at its home, the only place it ran.

Per partition a deterministic lock manager in the declared order (Calvin's):
each transaction waits in the queue of each of its values on this partition
and runs when it is first in all of them.  A transaction waiting for a message
holds only its own values, so the partition runs later transactions on other
values meanwhile and idles only when nothing of its own is ready.  Per value,
transactions therefore run in the declared order, and since a transaction
touches only rows of its declared values, the history is conflict-serializable
in arrival order.  A keyless fragment touches every row of the partition: it
waits until everything before it on the partition finished, and everything
after it waits for it (a barrier of that partition only).  A global read's
part reads every row but is no barrier (:meth:`_Partition._read_past`).

A global read (an input declared with ``global_reads``): every partition, at
the read's place, takes its partial totals (its reads) and forwards them to
partition 0, which runs the function over them.  The read writes no rows,
sees nothing but the totals and emits at partition 0 only, so every
partition, partition 0 included, goes on at once once it took its totals;
partition 0 runs the function when the others' totals are there.

How a participant learns of a crossing transaction: on Spark, each transaction's
row reaches its home partition only; at the start of phase 1 every partition
sends every other one its *copies*, the list of (order, input, values,
partitions) of the crossing transactions it homes that touch the other's values
(:meth:`_Partition.announce`), and a partition admits nothing before it heard
from every other one, then merges the copies into its order.  (Until session 23
Spark exploded each crossing transaction's whole row to every participant: the
copy rows went through the shuffle and were converted and made into events like
any other.)  With the lists go the partitions' counts of rows, from which each
pair of partitions moves some crossing transactions to the one with fewer
(:func:`handed`, :meth:`_Partition._hand_over`): their home is then the other
participant.  A caller that hands every partition its copies itself (the tests)
runs without the lists.

Messages go out once per admission round (:data:`ADMIT_CHUNK` transactions
per partition, :data:`ADMIT_CHUNK_WAITING` while a partition is hurried: a
transaction waits for a message with others behind it, see
:meth:`_Partition.hurried`), one list per pair of partitions, not one message
per transaction.  From :data:`LEND_FROM` partitions on, a participant also sends
a crossing transaction's rows ahead of its admission when nothing earlier not yet
admitted there touches its values (:meth:`_Partition.lend_ahead`).

This runs for the per-event boundary, whose transactions have the same id on
every partition; a boundary that groups events cuts each partition's events on
its own, so its multi-partition transactions are deferred (phases 2 and 3).

The modules: :mod:`.base` (the constants, the items, the call order and its
invariants), :mod:`.partition` (a partition's queues and execution), with its
:mod:`.admission`, :mod:`.announce` and :mod:`.reads` parts, :mod:`.messages`
(the crossing path's messages) and :mod:`.scheduler` (the driver loop).  The
code reads the constants from :mod:`.base` at call time; setting one on this
package sets it there too (:class:`_Forward`), so a patch of either reaches the
code.

Ownership: a :class:`ForwardScheduler` runs on its task's thread, owns the
partitions it hosts for the batch (exclusive access, not preempted), and is the
only user of its transport.
"""

import sys
import types
from typing import Any

from txstream.spark.runtime.errors import ExchangeError
from txstream.spark.runtime.forward import base as _base
from txstream.spark.runtime.forward.announce import handed
from txstream.spark.runtime.forward.base import (
    ADMIT_CHUNK,
    ADMIT_CHUNK_WAITING,
    EXCHANGE_TIMEOUT_S,
    HURRY_BLOCKED,
    HURRY_ROUNDS,
    LEND_AHEAD,
    LEND_FROM,
    READS_PAST,
    SILENT_ROUNDS,
    forwarding,
)
from txstream.spark.runtime.forward.scheduler import ForwardScheduler
from txstream.spark.runtime.transport import SocketTransport, new_exchange

__all__ = [
    "ADMIT_CHUNK",
    "ADMIT_CHUNK_WAITING",
    "EXCHANGE_TIMEOUT_S",
    "HURRY_BLOCKED",
    "HURRY_ROUNDS",
    "LEND_AHEAD",
    "LEND_FROM",
    "READS_PAST",
    "SILENT_ROUNDS",
    "ExchangeError",
    "ForwardScheduler",
    "SocketTransport",
    "forwarding",
    "handed",
    "new_exchange",
]


class _Forward(types.ModuleType):
    """The package's module type: a constant set on the package is set in :mod:`.base` too.

    The constants above are copies of :mod:`.base`'s, which the code reads; a
    tuning script or test setting ``forward.LEND_FROM`` would otherwise change
    nothing, without a word (review F6, session 24).
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name.isupper() and hasattr(_base, name):
            setattr(_base, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Forward
