"""Parameters of the broadcast simulation (Table 1), kept apart so the CLI loads fast."""

from __future__ import annotations

import math
from dataclasses import dataclass

from txstream.broadcast.base import BroadcastError

MAX_OBJECTS = 5_000
"""The F-Matrix keeps objects x objects entries: 5,000 objects are 25 million."""


SERVER_OPS = ("update", "read-or-write")
"""The two readings of a server transaction's operations (:attr:`SimParams.server_ops`)."""


def step_budget(transactions: int) -> int:
    """The default ``max_steps`` of the command line and the benchmark.

    A Table 1 run takes about 50 steps per client transaction (some 20,000 steps
    a second); 1,000 per transaction plus 100,000 leaves room for slow settings
    and stops hopeless ones (a server transaction every bit-unit) within about a
    minute.
    """
    return 1_000 * transactions + 100_000


@dataclass(frozen=True)
class SimParams:
    """Simulation parameters; the defaults are Table 1 of the paper."""

    algorithm: str = "f-matrix"
    groups: int | None = None
    client_txn_length: int = 4
    server_txn_length: int = 8
    server_interarrival: float = 250_000.0
    objects: int = 300
    object_bits: int = 8 * 1024
    server_read_prob: float = 0.5
    server_ops: str = "update"
    """How a server transaction uses its ``server_txn_length`` operations.

    ``"update"`` (the default): each operation updates one of
    ``server_txn_length`` distinct objects, reading it first with probability
    ``server_read_prob``; a transaction of length 8 writes 8 objects.  Table 1
    calls the length the number of "read/write operations" of a server *update*
    transaction, and Section 4.3 says longer server transactions mean more
    updates per cycle.  ``"read-or-write"``: each operation is a read with
    ``server_read_prob`` and a write otherwise, on objects drawn with
    replacement (about 4 writes per transaction of length 8); the paper's
    R-Matrix and Datacycle response times are out of reach with it (see
    docs/broadcast.md)."""
    op_delay: float = 65_536.0
    txn_delay: float = 131_072.0
    restart_delay: float = 0.0
    timestamp_bits: int = 8
    transactions: int = 1000
    measured: int = 500
    cache_cycles: float | None = None
    client_update_prob: float = 0.0
    max_cycles: int | None = None
    max_steps: int | None = None
    """Give up with :class:`BroadcastError` after this many simulation events
    (server transactions, client steps and cycle starts); ``None``: no limit."""
    record: bool = False

    def validate(self) -> None:
        """Raise :class:`BroadcastError` on a parameter that makes no sense."""
        # NaN passes every comparison below and infinity turns into a division by
        # zero (or a simulation that never ends), so non-finite numbers go first.
        for name in ("server_interarrival", "op_delay", "txn_delay", "restart_delay"):
            if not math.isfinite(getattr(self, name)):
                raise BroadcastError(f"{name} must be a finite number, got {getattr(self, name)}")
        for name in ("server_read_prob", "client_update_prob"):
            if not math.isfinite(getattr(self, name)):
                raise BroadcastError(f"{name} must be a probability, got {getattr(self, name)}")
        if self.cache_cycles is not None and not math.isfinite(self.cache_cycles):
            raise BroadcastError(f"cache currency must be a finite number, got {self.cache_cycles}")
        if not 1 <= self.objects <= MAX_OBJECTS:
            raise BroadcastError(
                f"objects must be between 1 and {MAX_OBJECTS:,}, got {self.objects:,}"
            )
        if not 1 <= self.client_txn_length <= self.objects:
            raise BroadcastError(
                f"client transaction length must be between 1 and the number of objects "
                f"({self.objects}), got {self.client_txn_length}"
            )
        if self.server_txn_length < 0:
            raise BroadcastError("server transaction length must not be negative")
        if self.server_interarrival <= 0 or self.op_delay < 0 or self.txn_delay < 0:
            raise BroadcastError("delays must be positive (the server inter-arrival time > 0)")
        if self.object_bits < 1 or self.timestamp_bits < 0:
            raise BroadcastError("object size must be positive and timestamp size >= 0")
        if self.server_ops not in SERVER_OPS:
            raise BroadcastError(
                f"server_ops must be one of: {', '.join(SERVER_OPS)}; got {self.server_ops!r}"
            )
        if not 0 <= self.server_read_prob <= 1 or not 0 <= self.client_update_prob <= 1:
            raise BroadcastError("probabilities must lie between 0 and 1")
        if not 1 <= self.measured <= self.transactions:
            raise BroadcastError("measured must be between 1 and the number of transactions")
        if self.cache_cycles is not None and self.cache_cycles < 0:
            raise BroadcastError(f"cache currency must be >= 0 cycles, got {self.cache_cycles}")
