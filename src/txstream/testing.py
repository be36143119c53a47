"""Helpers for tests of txstream and of code built on it.

* :func:`run_threads` - run a function in several threads and re-raise the
  first failure;
* :func:`assert_history` - check a manager's recorded history against a
  criterion, with the cycle in the failure message;
* :class:`FailAfter` - fault injection: raise inside a transaction after a
  given number of calls;
* :func:`counter_process` - the worker that the crash test kills with
  SIGKILL: it consumes a numbered source exactly once per event, committing
  the source offset in the same log record as the effects
  (``python -m txstream.testing DIR [SYNC [CHECKPOINT_EVERY]]``).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

from txstream.errors import TxStreamError
from txstream.txn.manager import TransactionManager


def run_threads(fn: Callable[[int], Any], n: int, timeout: float = 60.0) -> None:
    """Call ``fn(i)`` for ``i`` in ``range(n)``, each in its own thread; re-raise errors."""
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            fn(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout)
        if th.is_alive():
            raise TxStreamError(f"thread {th.name} did not finish within {timeout} s")
    if errors:
        raise errors[0]


def assert_history(tm: TransactionManager, criterion: str = "cs") -> None:
    """Fail with the evidence unless the recorded history satisfies ``criterion``."""
    from txstream.model import check

    verdict = check(tm.history(), criterion)
    if not verdict.holds:
        raise AssertionError(f"history is not {criterion}: {verdict.evidence.get('cycle')}")


class FailAfter:
    """Fault injection: the ``n``-th call (1-based) raises ``error``."""

    def __init__(self, n: int, error: BaseException | None = None) -> None:
        self.n = n
        self.calls = 0
        self.error = error or RuntimeError("injected fault")

    def __call__(self, *args: Any) -> None:
        """Count a call; raise on the ``n``-th."""
        self.calls += 1
        if self.calls == self.n:
            raise self.error


def counter_process(
    path: str, sync: str = "commit", limit: int | None = None, checkpoint_every: int = 0
) -> int:
    """Consume source ``gen`` (events 0, 1, 2, ...) exactly once, durably.

    Each event ``i`` is one transaction: add ``i`` to row ``i % 7`` of table
    ``sums``, append ``i`` to stream ``out`` and commit offset ``i + 1`` of
    ``gen``.  Starts from the committed offset; prints ``ready <offset>``.
    Returns the offset reached (only with ``limit``; else runs until killed).
    With ``checkpoint_every=n`` it checkpoints after every ``n`` events.
    """
    tm = TransactionManager("ss2pl", path=path, sync=sync)
    sums = tm.table("sums")
    out = tm.stream("out", granularity="event")
    i = int(tm.offset("gen", 0))
    print(f"ready {i}", flush=True)
    while limit is None or i < limit:
        with tm.begin() as t:
            key = i % 7
            current = t.read(sums, key)
            if current is None:
                t.insert(sums, key, i)
            else:
                t.put(sums, key, current + i)
            t.append(out, i)
            t.commit_offset("gen", i + 1)
        i += 1
        if checkpoint_every and i % checkpoint_every == 0:
            tm.checkpoint()
    tm.close()
    return i


if __name__ == "__main__":  # pragma: no cover - used by the crash test
    counter_process(
        sys.argv[1],
        sys.argv[2] if len(sys.argv) > 2 else "commit",
        checkpoint_every=int(sys.argv[3]) if len(sys.argv) > 3 else 0,
    )
