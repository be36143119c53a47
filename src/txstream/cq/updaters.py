"""Other systems updating a referenced table while a continuous query runs (the load)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from txstream.cq.base import CQError, Row
from txstream.txn import Transaction, TransactionManager


class Updaters:
    """Other systems updating a referenced table through the transaction manager.

    ``threads`` threads together run ``rate`` update transactions per second
    (as fast as they can when the rate is above what they reach); each
    rewrites one random row with ``new_row(rng)``.
    """

    def __init__(
        self,
        tm: TransactionManager,
        table: str,
        keys: Sequence[Any],
        rate: float,
        new_row: Callable[[Any], Row],
        *,
        threads: int = 2,
        seed: int = 0,
    ) -> None:
        if rate <= 0:
            raise CQError(f"update rate must be > 0 transactions per second, got {rate}")
        # else a thread died on its first update and stop() raised it (no keys), or
        # nothing ran at all and stop() reported 0/s (no threads)
        if not keys:
            raise CQError(f"updaters of {table!r} need at least one key to update")
        if not isinstance(threads, int) or threads < 1:
            raise CQError(f"updaters need at least one thread, got threads={threads!r}")
        self.tm = tm
        self.table = table
        self.keys = list(keys)
        self.rate = rate
        self.new_row = new_row
        self.threads = threads
        self.seed = seed
        self.committed = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self.started = 0.0
        self.stopped = 0.0

    def _work(self, k: int) -> None:
        import random

        rng = random.Random(self.seed * 1000 + k)
        period = self.threads / self.rate
        # staggered start, so that a short run at a low rate does not count a burst
        due = time.monotonic() + rng.uniform(0, period)
        if self._stop.wait(due - time.monotonic()):
            return
        done = 0
        try:
            while not self._stop.is_set():
                key = rng.choice(self.keys)
                row = self.new_row(rng)

                def update(t: Transaction, key: Any = key, row: Row = row) -> None:
                    t.put(self.table, key, row)

                self.tm.run(update, retries=1000)
                done += 1
                due += period
                delay = due - time.monotonic()
                if delay > 0.002:
                    # Sleep only when well ahead: a sleeping thread gives up the
                    # GIL and may wait a whole switch interval (5 ms) to get it
                    # back, which would cap the rate far below what it can do.
                    self._stop.wait(delay)
                elif delay < -1.0:
                    due = time.monotonic()  # far behind: do not burst to catch up
        except BaseException as exc:  # surfaced by stop()
            self._errors.append(exc)
        finally:
            with self._lock:
                self.committed += done

    def start(self) -> Updaters:
        """Start the threads."""
        self.started = time.monotonic()
        for k in range(self.threads):
            t = threading.Thread(target=self._work, args=(k,), daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def stop(self) -> float:
        """Stop the threads; the committed update transactions per second."""
        self._stop.set()
        for t in self._workers:
            t.join(timeout=30)
        self.stopped = time.monotonic()
        if self._errors:
            raise self._errors[0]
        return self.committed / max(1e-9, self.stopped - self.started)


__all__ = ["Updaters"]
