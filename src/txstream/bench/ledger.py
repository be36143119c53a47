"""Streaming Ledger (TStream/MorphStream's benchmark) as a txstream job, with its oracle.

Accounts hold balances.  A *deposit* adds to one account; a *transfer* moves
``amount`` from ``src`` to ``dst`` only if ``src`` holds at least that much (a
read that decides a write on another account: with the two accounts on
different partitions it is a multi-partition transaction).  Invariant: the
total balance equals the sum of the deposits, whatever the interleaving; and
the outcome (which transfers went through, every final balance) equals serial
execution in arrival order, which :func:`serial_oracle` computes.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Callable, Iterator
from typing import Any

from txstream.spark.runtime import Job, Tx
from txstream.spark.runtime.partitioning import partition_of

Event = tuple[str, dict[str, Any]]


def deposit(tx: Tx, event: dict[str, Any]) -> None:
    """Add ``amount`` to ``acct`` (opening it with that balance)."""
    if tx.read("accounts", event["acct"]) is None:
        tx.insert("accounts", {"acct": event["acct"], "balance": event["amount"]})
    else:
        tx.increment("accounts", event["acct"], "balance", event["amount"])


def transfer(tx: Tx, event: dict[str, Any]) -> None:
    """Move ``amount`` from ``src`` to ``dst`` when ``src`` can pay; emit the outcome."""
    src = tx.read("accounts", event["src"])
    dst = tx.read("accounts", event["dst"])
    ok = src is not None and dst is not None and src["balance"] >= event["amount"]
    if ok:
        tx.increment("accounts", event["src"], "balance", -event["amount"])
        tx.increment("accounts", event["dst"], "balance", event["amount"])
    tx.emit("transfers_done", {"id": event["id"], "ok": ok})


OPENING_BALANCE = 1000


def opening(accounts: int) -> list[dict[str, int]]:
    """Every account's opening row."""
    return [{"acct": a, "balance": OPENING_BALANCE} for a in range(accounts)]


def ledger_job(
    deposits: Any = None,
    transfers: Any = None,
    name: str = "ledger",
    initial: Any = None,
    merge: str | None = "batch",
    audits: Any = None,
) -> Job:
    """The job; ``deposits``/``transfers`` are streaming DataFrames (None to run locally).

    ``audits``: a third input (a list for ``run_local``), without keys, whose
    :func:`audit` reads every balance across all partitions (a global read) and
    emits to ``audits_done``; None: no audits (the job then needs no global reads).
    ``initial``: the opening rows of ``accounts`` (a list, a DataFrame or a file).
    ``merge``: ``batch`` by default, a choice made explicitly: the benchmark and
    the tests hand both inputs over in id order, batch after batch, where it is
    the serial order without holding events; None leaves the job's default
    (``event-time``, see ``Job.merge_for``).
    """
    job = (
        Job(name)
        .table("accounts", key="acct", schema="acct long, balance long", initial=initial)
        .input("deposits", deposits, keys="acct", order="id")
        .input("transfers", transfers, keys=["src", "dst"], order="id")
        .output("transfers_done", schema="id long, ok boolean")
        .on("deposits", deposit)
        .on("transfers", transfer)
    )
    if audits is not None:
        job.input(
            "audits",
            audits,
            order="id",
            global_reads=["accounts.balance"],  # type: ignore[call-arg, unused-ignore]
        )
        job.output("audits_done", schema="id long, total long, ok boolean").on("audits", audit)
    if merge is not None:
        job.option("merge", merge)
    return job


PATTERNS = ("cross", "uniform", "zipf")
"""How transfers pick their accounts (see :func:`events`)."""


def events(
    count: int,
    accounts: int,
    cross_pct: float,
    seed: int,
    deposit_pct: float = 30.0,
    pattern: str = "cross",
    skew: float = 1.0,
    audit_every: int = 0,
    partitions: int = 2,
) -> Iterator[Event]:
    """``count`` ledger events (deposits and transfers), plus an audit every ``audit_every``.

    ``pattern`` chooses a transfer's accounts:

    * ``cross``: ``src`` uniform; ``dst`` on another of ``partitions`` partitions
      than ``src`` for ``cross_pct`` % of the transfers (which other one: uniform),
      on ``src``'s own partition otherwise.  With ``partitions=2`` this is the
      stream the benchmark has always used (the same draws, the same events).
    * ``uniform``: ``src`` and ``dst`` uniform over all accounts (``dst != src``),
      so on ``P`` partitions a share ``1 - 1/P`` of the transfers crosses.
    * ``zipf``: ``src``, ``dst`` and a deposit's account Zipf-distributed with
      exponent ``skew`` (rank ``r`` drawn with weight ``r ** -skew``; the ranks are
      shuffled onto the accounts by ``seed``, so the hot accounts are not the
      smallest ids); ``dst != src``.

    Event ``id`` is the arrival order.  Accounts open with :data:`OPENING_BALANCE`
    (see :func:`opening`); under ``cross`` and ``uniform`` a deposit may also go to
    an account that does not exist yet (ids up to ``accounts * 1.1``), which opens
    it.  An *audit* (input ``audits``) follows every ``audit_every`` ledger events
    (0: none); it carries ``expected``, the total of every balance after serial
    execution of the events before it (opening balances plus the deposits so far),
    and draws nothing from the random stream, so the ledger events are the same
    with or without audits.
    """
    if pattern not in PATTERNS:
        raise ValueError(f"pattern is one of {PATTERNS}, not {pattern!r}")
    if pattern != "cross" and accounts < 2:
        raise ValueError(f"pattern {pattern} needs at least 2 accounts (dst != src)")
    rng = random.Random(seed)
    spread = max(1, partitions)
    by_part: dict[int, list[int]] = {p: [] for p in range(spread)}
    if pattern == "cross":
        for acct in range(accounts):
            by_part[partition_of(acct, spread)].append(acct)
    draw = _zipf(accounts, skew, seed) if pattern == "zipf" else None
    total = accounts * OPENING_BALANCE
    n = 0
    for made in range(count):
        if audit_every and made and made % audit_every == 0:
            yield "audits", {"id": n, "expected": total}
            n += 1
        if rng.random() * 100 < deposit_pct:
            opened = accounts + accounts // 10 + 1  # a tenth more: deposits open accounts
            acct = draw(rng) if draw is not None else rng.randrange(opened)
            amount = rng.randrange(1, 100)
            total += amount
            yield "deposits", {"acct": acct, "amount": amount, "id": n}
        elif pattern == "cross":
            src = rng.randrange(accounts)
            home = partition_of(src, spread)
            if rng.random() * 100 < cross_pct:
                others = [q for q in range(spread) if q != home and by_part[q]]
                # one other partition (P = 2): no draw, so the stream stays today's
                other = (others[0] if len(others) == 1 else rng.choice(others)) if others else home
            else:
                other = home
            dst = rng.choice(by_part[other] or by_part[home])
            yield "transfers", {"src": src, "dst": dst, "amount": rng.randrange(1, 200), "id": n}
        else:
            pick = draw if draw is not None else (lambda r: r.randrange(accounts))
            src = pick(rng)
            dst = pick(rng)
            while dst == src:
                dst = pick(rng)
            yield "transfers", {"src": src, "dst": dst, "amount": rng.randrange(1, 200), "id": n}
        n += 1
    if audit_every and count and count % audit_every == 0:
        yield "audits", {"id": n, "expected": total}


def _zipf(accounts: int, skew: float, seed: int) -> Callable[[random.Random], int]:
    """A draw of an account with Zipf weights ``rank ** -skew``, ranks shuffled by ``seed``."""
    cumulative = list(itertools.accumulate((r + 1) ** -skew for r in range(accounts)))
    ranked = list(range(accounts))
    random.Random(f"zipf-{seed}").shuffle(ranked)
    top = cumulative[-1]
    last = accounts - 1

    def draw(rng: random.Random) -> int:
        return ranked[min(last, bisect.bisect_right(cumulative, rng.random() * top))]

    return draw


def audit(tx: Tx, event: dict[str, Any]) -> None:
    """Total every balance (a read across all partitions); emit it beside the expected total."""
    # (Tx.sum comes with the runtime's global reads, issue 28)
    total = tx.sum("accounts", "balance")  # type: ignore[attr-defined, unused-ignore]
    tx.emit(
        "audits_done",
        {"id": event["id"], "total": total, "ok": total == event["expected"]},
    )


def serial_oracle(
    stream: list[Event], accounts: int = 0
) -> tuple[dict[int, int], list[tuple[int, bool]]]:
    """Final balances and transfer outcomes of serial execution in arrival (id) order.

    The accounts ``0 .. accounts-1`` open as :func:`opening` says.
    """
    balance = {a: OPENING_BALANCE for a in range(accounts)}
    outcomes = []
    for name, event in sorted(stream, key=lambda e: e[1]["id"]):
        if name == "audits":
            continue  # reads only (see audit_totals)
        if name == "deposits":
            balance[event["acct"]] = balance.get(event["acct"], 0) + event["amount"]
        else:
            src, dst, amount = event["src"], event["dst"], event["amount"]
            ok = src in balance and dst in balance and balance[src] >= amount
            if ok:
                balance[src] -= amount
                balance[dst] += amount
            outcomes.append((event["id"], ok))
    return balance, outcomes


def audit_totals(stream: list[Event], accounts: int = 0) -> list[tuple[int, int]]:
    """``(id, total of every balance)`` of each audit under serial execution in id order.

    Transfers move money without creating any, so the total is the opening
    balances of ``0 .. accounts-1`` plus the deposits before the audit.
    """
    total = accounts * OPENING_BALANCE
    out = []
    for name, event in sorted(stream, key=lambda e: e[1]["id"]):
        if name == "deposits":
            total += event["amount"]
        elif name == "audits":
            out.append((event["id"], total))
    return out
