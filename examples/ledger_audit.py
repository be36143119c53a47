"""A ledger with an auditor: transfers between any accounts, audits over every balance.

Accounts hold a balance, what was ever deposited into them, and an overdraft
limit.  *Deposits* add to one account; *transfers* move money between any two
accounts (usually on different partitions: a multi-partition transaction) and
are refused when the source would go below minus its overdraft limit; a second
system changes overdraft limits on its own input; an *auditor* reads every
balance inside one transaction (a global read) and checks that the money in
the ledger equals the money deposited so far, emitting one row per audit.
Transfers only move money, so every audit is ok in a correct run, whatever the
number of partitions, the interleaving, or the crashes.

Every input's file ``n`` holds the events with ids in the same range, and
each micro-batch takes one file of each (``maxFilesPerTrigger`` 1, the
``batch`` merge), so arrival order is id order.

    python examples/ledger_audit.py generate --out /tmp/ledger
    python examples/ledger_audit.py run --data /tmp/ledger --checkpoint /tmp/ledger/ckpt
    python examples/ledger_audit.py show --data /tmp/ledger --checkpoint /tmp/ledger/ckpt
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import txstream as tx

INPUTS = {
    "deposits": "acct long, amount long, id long",
    "transfers": "src long, dst long, amount long, id long",
    "limits": "acct long, overdraft long, id long",
    "audits": "id long",
}


# ---- the job: what a user writes --------------------------------------------------
def deposit(t: tx.Tx, e: dict[str, Any]) -> None:
    """Add ``amount`` to ``acct`` (opening it) and to what it was ever deposited."""
    row = t.read("accounts", e["acct"]) or {"balance": 0, "deposited": 0, "overdraft": 0}
    row["balance"] += e["amount"]
    row["deposited"] += e["amount"]
    t.upsert("accounts", {**row, "acct": e["acct"]})


def set_limit(t: tx.Tx, e: dict[str, Any]) -> None:
    """Set ``acct``'s overdraft limit (opening it empty)."""
    row = t.read("accounts", e["acct"]) or {"balance": 0, "deposited": 0}
    t.upsert("accounts", {**row, "acct": e["acct"], "overdraft": e["overdraft"]})


def transfer(t: tx.Tx, e: dict[str, Any]) -> None:
    """Move ``amount`` from ``src`` to ``dst`` unless ``src`` would pass its limit."""
    src, dst = t.read("accounts", e["src"]), t.read("accounts", e["dst"])
    ok = src is not None and dst is not None and src["balance"] - e["amount"] >= -src["overdraft"]
    if ok:
        t.increment("accounts", e["src"], "balance", -e["amount"])
        t.increment("accounts", e["dst"], "balance", e["amount"])
    t.emit("transfers_done", {"id": e["id"], "ok": ok})


def audit(t: tx.Tx, e: dict[str, Any]) -> None:
    """Total every balance and deposit, over all partitions, at this place in the order."""
    total, deposited = t.sum("accounts", "balance"), t.sum("accounts", "deposited")
    t.emit("audits", {"id": e["id"], "total": total, "deposited": deposited,
                      "accounts": t.count("accounts"), "ok": total == deposited})


def job(accounts: Any, deposits: Any, transfers: Any, limits: Any, audits: Any) -> tx.Job:
    """The job over its inputs (DataFrames, or None for ``run_local``)."""
    return (
        tx.Job("ledger_audit")
        .table("accounts", key="acct", initial=accounts,
               schema="acct long, balance long, deposited long, overdraft long")
        .input("deposits", deposits, keys="acct", order="id")
        .input("transfers", transfers, keys=["src", "dst"], order="id")
        .input("limits", limits, keys="acct", order="id")
        .input("audits", audits, order="id",
               global_reads=["accounts.balance", "accounts.deposited"])
        .output("transfers_done", schema="id long, ok boolean")
        .output("audits", schema="id long, total long, deposited long, accounts long, ok boolean")
        .option("merge", "batch")  # file n of every input holds the same ids
        .on("deposits", deposit).on("transfers", transfer)
        .on("limits", set_limit).on("audits", audit)
    )


def start(spark: Any, data: Path, checkpoint: Path, once: bool, partitions: int = 4) -> Any:
    """Start the job on the files under ``data`` (one file of each input per batch)."""
    streams = [spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
               .json(str(data / name)) for name, schema in INPUTS.items()]
    return (
        job(str(data / "accounts.json"), *streams)
        .option("recordHistory", True)
        .trigger(**({"availableNow": True} if once else {"processingTime": "200 milliseconds"}))
        .start(checkpoint=checkpoint, spark=spark, partitions=partitions)
    )
# ---- end of the job ------------------------------------------------------------------


Event = tuple[str, dict[str, Any]]


def opening(accounts: int, seed: int) -> list[dict[str, Any]]:
    """The accounts' opening rows (an opening balance counts as deposited)."""
    rng = random.Random(seed)
    rows = []
    for a in range(accounts):
        balance = rng.randrange(0, 300)
        rows.append({"acct": a, "balance": balance, "deposited": balance,
                     "overdraft": rng.choice([0, 0, 100])})
    return rows


def events(count: int, accounts: int, seed: int, audit_every: int = 20) -> list[Event]:
    """``count`` events in arrival (id) order; an audit after every ``audit_every``."""
    rng = random.Random(seed)
    some = accounts + accounts // 10 + 1  # a few accounts that do not exist (yet)
    out: list[Event] = []
    for n in range(count):
        if n % audit_every == audit_every - 1:
            out.append(("audits", {"id": n}))
            continue
        draw = rng.random()
        if draw < 0.25:
            out.append(("deposits", {"acct": rng.randrange(some), "amount": rng.randrange(1, 100),
                                     "id": n}))
        elif draw < 0.35:
            out.append(("limits", {"acct": rng.randrange(some),
                                   "overdraft": rng.randrange(0, 300), "id": n}))
        else:
            out.append(("transfers", {"src": rng.randrange(some), "dst": rng.randrange(some),
                                      "amount": rng.randrange(1, 250), "id": n}))
    return out


def serial_oracle(accounts: list[dict[str, Any]], stream: list[Event]) -> dict[str, Any]:
    """What serial execution in id order gives: transfer outcomes, audit rows, final rows."""
    rows = {r["acct"]: dict(r) for r in accounts}
    done, audits = [], []
    for name, e in sorted(stream, key=lambda x: x[1]["id"]):
        if name in ("deposits", "limits"):
            row = rows.setdefault(e["acct"], {"acct": e["acct"], "balance": 0, "deposited": 0,
                                              "overdraft": 0})
            if name == "deposits":
                row["balance"] += e["amount"]
                row["deposited"] += e["amount"]
            else:
                row["overdraft"] = e["overdraft"]
        elif name == "transfers":
            src, dst = rows.get(e["src"]), rows.get(e["dst"])
            ok = src is not None and dst is not None and (
                src["balance"] - e["amount"] >= -src["overdraft"])
            if ok and src is not None and dst is not None:
                src["balance"] -= e["amount"]
                dst["balance"] += e["amount"]
            done.append({"id": e["id"], "ok": ok})
        else:
            total = sum(r["balance"] for r in rows.values())
            deposited = sum(r["deposited"] for r in rows.values())
            audits.append({"id": e["id"], "total": total, "deposited": deposited,
                           "accounts": len(rows), "ok": total == deposited})
    return {"transfers_done": done, "audits": audits,
            "accounts": [rows[a] for a in sorted(rows)]}


def generate(out: Path, accounts: int, files: int, per_file: int, seed: int) -> dict[str, Any]:
    """Write the opening rows and every input's files; return what a correct run gives."""
    rows = opening(accounts, seed)
    stream = events(files * per_file, accounts, seed)
    (out / "accounts.json").parent.mkdir(parents=True, exist_ok=True)
    (out / "accounts.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in INPUTS:
        (out / name).mkdir(parents=True, exist_ok=True)
        for n in range(files):
            part = stream[n * per_file : (n + 1) * per_file]
            path = out / name / f"part-{n:04d}.json"
            path.write_text("".join(json.dumps(e) + "\n" for i, e in part if i == name))
            os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))  # the order it is read in
    expected = serial_oracle(rows, stream)
    (out / "expected.json").write_text(json.dumps(expected))
    return expected


def main(argv: list[str] | None = None) -> int:
    """The command line: generate, run, show."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("generate", help="write an input")
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--accounts", type=int, default=200)
    gen.add_argument("--files", type=int, default=30)
    gen.add_argument("--per-file", type=int, default=200)
    gen.add_argument("--seed", type=int, default=1)
    run = sub.add_parser("run", help="run the job until the input is consumed")
    run.add_argument("--data", type=Path, required=True)
    run.add_argument("--checkpoint", type=Path, required=True)
    run.add_argument("--partitions", type=int, default=4)
    run.add_argument("--continuous", action="store_true", help="keep running (processingTime)")
    show = sub.add_parser("show", help="print the committed results and compare with expected")
    show.add_argument("--checkpoint", type=Path, required=True)
    show.add_argument("--data", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "generate":
            expected = generate(args.out, args.accounts, args.files, args.per_file, args.seed)
            print(f"wrote {args.out}: {len(expected['transfers_done'])} transfers, "
                  f"{len(expected['audits'])} audits")
        elif args.cmd == "run":
            from txstream.spark import local_session

            query = start(local_session("ledger-audit"), args.data, args.checkpoint,
                          once=not args.continuous, partitions=args.partitions)
            try:
                query.awaitTermination()
            finally:
                query.stop()
            print(json.dumps(query.lastProgress))
        else:
            got = {name: tx.read_output(args.checkpoint, name)
                   for name in ("transfers_done", "audits")}
            got["accounts"] = tx.read_table(args.checkpoint, "accounts")
            failed = sum(not a["ok"] for a in got["audits"])
            print(json.dumps({"transfers": len(got["transfers_done"]),
                              "audits": len(got["audits"]), "audits_failed": failed}))
            if args.data is not None:
                expected = json.loads((args.data / "expected.json").read_text())
                ok = got == expected and failed == 0
                print(json.dumps({"exactly_as_expected": ok}))
                return 0 if ok else 1
    except tx.TxStreamError as exc:
        print(f"ledger_audit: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
