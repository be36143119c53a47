"""The executor's compact history (``recorded.py``) reads back as the text histories did.

A ledger with int and string keys, transfers between partitions (forwarded, or
deferred to phases 2 and 3), a keyless sweep, audits that read every balance,
aborts and errors runs on three partitions; the history the checker gets from
its store must equal, character for character, the one that txstream wrote
before the compact form (one text line per operation and per transaction),
which ``tests/data/history/`` keeps: ``<case>.txt`` was written by the code
before the change, from this scenario, and ``old-store-<case>/`` is such a
store as it wrote it (its files must still read the same).
"""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from txstream.model import check
from txstream.spark.runtime.errors import StoreError
from txstream.spark.runtime.results import history_text

DATA = Path(__file__).parent / "data" / "history"
CASES = ("forward", "defer", "timestamp")


def deposit(t: Any, e: dict[str, Any]) -> None:
    if t.read("accounts", e["acct"]) is None:
        t.insert("accounts", {"acct": e["acct"], "balance": 0})
    t.increment("accounts", e["acct"], "balance", e["amount"])
    # A row keyed by a string (text operations, with the item's escaped name).
    row = t.read("owners", e["owner"])
    t.upsert("owners", {"name": e["owner"], "n": (row["n"] if row else 0) + 1})


def transfer(t: Any, e: dict[str, Any]) -> None:
    src, dst = t.read("accounts", e["src"]), t.read("accounts", e["dst"])
    ok = src is not None and dst is not None and src["balance"] >= e["amount"]
    if ok:
        t.increment("accounts", e["src"], "balance", -e["amount"])
        t.increment("accounts", e["dst"], "balance", e["amount"])
    if e["amount"] == 13:
        raise ValueError("unlucky amount")  # rolled back after its operations
    if e["amount"] == 7:
        t.abort("seven")
    t.emit("done", {"id": e["id"], "ok": ok})


def sweep(t: Any, e: dict[str, Any]) -> None:
    for value in t.values("accounts"):  # a keyless fragment on every partition
        row = t.read("accounts", value)
        if row["balance"] > 100:
            t.update("accounts", value, balance=row["balance"] - 1)


def audit(t: Any, e: dict[str, Any]) -> None:
    t.emit("audits", {"id": e["id"], "total": t.sum("accounts", "balance")})


def job(case: str) -> tx.Job:
    """The scenario's job; ``case``: forward (the default), defer, or the timestamp boundary."""
    keys = {"order": "ts"} if case == "timestamp" else {}
    out = (
        tx.Job("compact")
        .table("accounts", key="acct", schema="acct long, balance long")
        .table("owners", key="name", schema="name string, n long")
        .input("deposits", None, keys=["acct", "owner"], **keys)
        .input("transfers", None, keys=["src", "dst"], **keys)
        .input("sweeps", None, **keys)
        .output("done")
        .on("deposits", deposit)
        .on("transfers", transfer)
        .on("sweeps", sweep)
        .option("recordHistory", True)
    )
    if case == "timestamp":
        out.boundary("timestamp")
    else:
        out.input("audits", None, global_reads=["accounts.balance"]).output("audits")
        out.on("audits", audit)
    if case == "defer":
        out.option("crossPartition", "defer")
    return out


def batches(case: str) -> list[list[tuple[str, dict[str, Any]]]]:
    """Three batches of deposits (some to new accounts), transfers across partitions,
    failing and aborting transfers, sweeps and audits."""
    owners = ["ann", "Bob Ray", "zoë", "a.b"]
    out: list[list[tuple[str, dict[str, Any]]]] = []
    k = 0
    for b in range(3):
        batch: list[tuple[str, dict[str, Any]]] = []
        for i in range(14):
            k += 1
            if i % 4 == 0:
                batch.append(("deposits", {"acct": (k * 5) % 9, "amount": 60 + k,
                                           "owner": owners[k % 4]}))  # fmt: skip
            elif i % 7 == 3:
                batch.append(("sweeps", {}))
            elif i == 9 and case != "timestamp":
                batch.append(("audits", {}))
            else:
                amount = 13 if k % 11 == 0 else 7 if k % 13 == 0 else 5 + k % 40
                batch.append(
                    ("transfers", {"src": (k * 7) % 9, "dst": (k * 3) % 9, "amount": amount})
                )
            batch[-1][1]["id"] = k
            batch[-1][1]["ts"] = k // 2 + b * 100
        out.append(batch)
    return out


def run(case: str, store: Path) -> str:
    """The scenario's history text, its store's path replaced by ``STORE``."""
    with pytest.warns(tx.TransactionFailuresWarning):
        job(case).run_local(batches(case), store, partitions=3)
    return history_text(store).replace(str(store), "STORE")


@pytest.mark.parametrize("case", CASES)
def test_the_compact_history_reads_as_the_text_history_did(tmp_path: Path, case: str) -> None:
    text = run(case, tmp_path / "store")
    assert text == (DATA / f"{case}.txt").read_text()
    # (the scenario has what it must: a history in the compact form, string keys,
    # forwarded or deferred transactions, aborts, global reads)
    files = list((tmp_path / "store" / "history").glob("*/*.txt"))
    assert any(line.startswith("@") for f in files for line in f.read_text().splitlines())
    assert "owners:s" in text and "\na" in text
    assert check(tx.read_history(tmp_path / "store"), "csao").holds
    if case != "timestamp":
        assert "rb0_9(accounts:" in text and ":*)" not in text  # an audit, expanded


@pytest.mark.parametrize("case", CASES)
def test_a_store_of_the_text_form_still_reads(tmp_path: Path, case: str) -> None:
    store = tmp_path / "old"
    shutil.copytree(DATA / f"old-store-{case}", store)
    files = list((store / "history").glob("*/*.txt"))
    assert files and not any(
        line.startswith("@") for f in files for line in f.read_text().splitlines()
    )
    text = history_text(store).replace(str(store), "STORE")
    assert text == (DATA / f"{case}.txt").read_text()


def _damage_compact_line(store: Path, change: Any) -> Path:
    """Rewrite one history file's compact line with ``change`` (its marker's checksum too)."""
    for part in sorted((store / "history").glob("*/*.txt")):
        lines = part.read_text().splitlines()
        at = next((i for i, line in enumerate(lines) if line.startswith("@")), None)
        if at is None:
            continue
        body = json.loads(lines[at][1:])
        change(body)
        lines[at] = "@" + json.dumps(body)
        raw = ("\n".join(lines) + "\n").encode()
        part.write_bytes(raw)
        batch = int(part.parent.name.split("-")[1])
        marker = store / "commits" / f"{batch:012d}.json"
        record = json.loads(marker.read_text())
        info = record["info"]
        info["files"][str(part.relative_to(store))] = [zlib.crc32(raw), len(raw)]
        record["crc"] = zlib.crc32(json.dumps(info, sort_keys=True).encode())
        marker.write_text(json.dumps(record, sort_keys=True))
        return part
    raise AssertionError("no compact line")


@pytest.mark.parametrize(
    "change",
    [
        lambda body: body["ops"].append(4),  # an operation without its commit
        lambda body: body["ops"].append(None),  # a commit without its order
        lambda body: body.update(tables=7),
        lambda body: body["ops"].append({"x": 1}),
    ],
)
def test_a_compact_line_that_does_not_hold_together_is_refused_in_one_line(
    tmp_path: Path, change: Any
) -> None:
    store = tmp_path / "store"
    run("forward", store)
    part = _damage_compact_line(store, change)
    with pytest.raises(StoreError) as exc:
        history_text(store)
    message = str(exc.value)
    assert "\n" not in message and message.startswith(f"{part}: damaged history")
