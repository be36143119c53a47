"""Broadcast clients: read-only transactions off the air, update transactions by upload.

A read-only transaction never talks to the server: before each read it checks
the read-condition of the server's algorithm against the control information
broadcast with the value, and aborts (:class:`ReadConditionFailed`) when it
fails; the caller restarts it.  An update transaction also reads off the air,
writes locally, and sends its reads (with their cycles) and writes to the server
at commit.

The optional cache gives *weak currency*: a value (with the control column sent
with it) may be reused while it is younger than ``currency`` cycles, set per
client and, through a mapping, per object.  A cached value is read as of the
cycle it was cached in; when it fails the read-condition the client tries the
value on the air before giving up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from txstream.broadcast.base import BroadcastError, Read, ReadConditionFailed
from txstream.broadcast.server import Broadcast, Server


class Client:
    """One client of a :class:`Server`; ``currency`` enables the cache (in cycles)."""

    def __init__(self, server: Server, currency: float | Mapping[str, float] | None = None) -> None:
        self.server = server
        if currency is not None and not server.algorithm.supports_cache:
            raise BroadcastError(
                f"the {server.algorithm.name} algorithm cannot validate cached values; "
                "use a matrix algorithm (f-matrix, grouped, datacycle) or no cache"
            )
        self.currency = currency
        self.cache: dict[int, tuple[Any, int, Any]] = {}
        self.cache_hits = 0

    def begin(self, read_only: bool = True) -> ClientTransaction:
        """Start a transaction (read-only unless ``read_only=False``)."""
        return ClientTransaction(self, self.server.new_txn_id(), read_only)

    def _limit(self, obj: int) -> float | None:
        cur = self.currency
        if cur is None or isinstance(cur, (int, float)):
            return cur
        return cur.get(self.server.objects[obj])

    def cached(self, obj: int, cycle: int) -> tuple[Any, int, Any] | None:
        """The cache entry for ``obj`` if it is still current enough in ``cycle``."""
        entry = self.cache.get(obj)
        if entry is None:
            return None
        limit = self._limit(obj)
        if limit is None or cycle - entry[1] >= limit:
            del self.cache[obj]
            return None
        return entry


class ClientTransaction:
    """A client transaction; see the module docstring for the protocol."""

    def __init__(self, client: Client, txn_id: str, read_only: bool) -> None:
        self.client = client
        self.id = txn_id
        self.read_only = read_only
        self.reads: list[Read] = []
        self.writes: dict[str, Any] = {}
        self.done = False

    def read(self, name: str, air: Broadcast | None = None, use_cache: bool = True) -> Any:
        """Read ``name`` off the air (or from the cache), checking the read-condition.

        ``air`` defaults to the cycle now on the air.  Raises
        :class:`ReadConditionFailed` (and ends the transaction) when the read
        would be inconsistent.
        """
        self._active()
        if name in self.writes:
            return self.writes[name]
        if use_cache:
            hit, value = self.read_cached(name, air)
            if hit:
                return value
        client = self.client
        server = client.server
        j = server.obj(name)
        air = air or server.air()
        read = Read(j, air.cycle, air.column(j))
        if not server.algorithm.read_condition(self.reads, read):
            self._finish(False, air.cycle)
            raise ReadConditionFailed(
                f"transaction {self.id}: reading {name} in cycle {air.cycle} would be "
                "inconsistent with its earlier reads; restart it"
            )
        value = air.values[j]
        if client.currency is not None:
            client.cache[j] = (value, air.cycle, read.column)
        return self._accept(read, name, value)

    def read_cached(self, name: str, air: Broadcast | None = None) -> tuple[bool, Any]:
        """Try the cache only: ``(True, value)`` on a current, consistent entry.

        ``(False, None)`` when there is no cache, no entry young enough, or the
        entry fails the read-condition (the transaction stays active).
        """
        self._active()
        client = self.client
        if client.currency is None:
            return False, None
        server = client.server
        j = server.obj(name)
        air = air or server.air()
        entry = client.cached(j, air.cycle)
        if entry is None:
            return False, None
        value, cycle, column = entry
        read = Read(j, cycle, column)
        if not server.algorithm.read_condition(self.reads, read):
            return False, None
        client.cache_hits += 1
        return True, self._accept(read, name, value)

    def _accept(self, read: Read, name: str, value: Any) -> Any:
        self.reads.append(read)
        rec = self.client.server.recorder
        if rec is not None:
            rec.air_read(self.id, name, read.cycle)
        return value

    def write(self, name: str, value: Any) -> None:
        """Write a local copy (update transactions only)."""
        self._active()
        if self.read_only:
            raise BroadcastError(f"transaction {self.id} is read-only; begin(read_only=False)")
        self.client.server.obj(name)
        self.writes[name] = value

    def commit(self) -> None:
        """Commit: nothing to send for a read-only transaction, else submit to the server."""
        self._active()
        server = self.client.server
        if not self.writes:
            self._finish(True, server.cycle)
            return
        self.done = True
        reads = [(server.objects[r.obj], r.cycle) for r in self.reads]
        server.submit(self.id, reads, self.writes)

    def abort(self) -> None:
        """Abort: drop local writes."""
        self._active()
        self._finish(False, self.client.server.cycle)

    def _finish(self, committed: bool, cycle: int) -> None:
        self.done = True
        rec = self.client.server.recorder
        if rec is None:
            return
        if self.writes and not committed:
            rec.client_end(self.id, False, cycle)
        elif not self.writes:
            rec.client_end(self.id, committed, cycle)

    def _active(self) -> None:
        if self.done:
            raise BroadcastError(f"transaction {self.id} has already ended")
