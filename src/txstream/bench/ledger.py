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

import random
from collections.abc import Iterator
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
) -> Job:
    """The job; ``deposits``/``transfers`` are streaming DataFrames (None to run locally).

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
    if merge is not None:
        job.option("merge", merge)
    return job


def events(
    count: int, accounts: int, cross_pct: float, seed: int, deposit_pct: float = 30.0
) -> Iterator[Event]:
    """``count`` events: deposits and transfers, ``cross_pct`` % of transfers across 2 partitions.

    Event ``id`` is the arrival order.  Accounts open with :data:`OPENING_BALANCE`
    (see :func:`opening`); a deposit may also go to an account that does not exist
    yet (ids up to ``accounts * 1.1``), which opens it.
    """
    rng = random.Random(seed)
    by_part: dict[int, list[int]] = {0: [], 1: []}
    for acct in range(accounts):
        by_part[partition_of(acct, 2)].append(acct)
    for n in range(count):
        if rng.random() * 100 < deposit_pct:
            acct = rng.randrange(accounts + accounts // 10 + 1)
            yield "deposits", {"acct": acct, "amount": rng.randrange(1, 100), "id": n}
        else:
            src = rng.randrange(accounts)
            home = partition_of(src, 2)
            other = 1 - home if rng.random() * 100 < cross_pct else home
            dst = rng.choice(by_part[other] or by_part[home])
            yield "transfers", {"src": src, "dst": dst, "amount": rng.randrange(1, 200), "id": n}


def serial_oracle(
    stream: list[Event], accounts: int = 0
) -> tuple[dict[int, int], list[tuple[int, bool]]]:
    """Final balances and transfer outcomes of serial execution in arrival (id) order.

    The accounts ``0 .. accounts-1`` open as :func:`opening` says.
    """
    balance = {a: OPENING_BALANCE for a in range(accounts)}
    outcomes = []
    for name, event in sorted(stream, key=lambda e: e[1]["id"]):
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
