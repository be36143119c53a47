"""One transaction type: every engine's transaction object is a ``tx.Tx``.

``tx.Tx`` is a :class:`typing.Protocol`; the executors' and ``run_local``'s
``ExecutorTx`` and the driver engine's ``DriverTx`` implement it.  ``mypy``
checks that structurally (``driver._as_tx``, and every handler call through
``TxnFunction``); the tests here compare every verb's parameters exactly (mypy
accepts an extra optional one), so the engines cannot drift apart again.
"""

from __future__ import annotations

import inspect
import json
import pydoc
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from txstream.spark.runtime.driver import DriverTx
from txstream.spark.runtime.executor import ExecutorTx

IMPLEMENTATIONS = [ExecutorTx, DriverTx]


def _verbs() -> list[str]:
    """The public members the Protocol declares (its verbs and ``home``)."""
    return sorted(name for name in vars(tx.Tx) if not name.startswith("_") and name not in {"mro"})


def test_the_protocol_has_every_verb_the_issue_names() -> None:
    expected = {"read", "scan", "values", "insert", "upsert", "update", "increment", "delete"}
    expected |= {"emit", "abort", "home", "sum", "count"}
    assert set(_verbs()) == expected


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda c: c.__name__)
def test_the_engines_have_each_verb_with_the_protocols_parameters(cls: type) -> None:
    for name in _verbs():
        declared = inspect.getattr_static(tx.Tx, name)
        implemented = inspect.getattr_static(cls, name, None)
        assert implemented is not None, f"{cls.__name__} lacks {name}"
        if isinstance(declared, property):
            assert isinstance(implemented, property), f"{cls.__name__}.{name} is no property"
            continue
        want = inspect.signature(declared)
        got = inspect.signature(implemented)
        assert list(got.parameters.values()) == list(want.parameters.values()), (
            f"{cls.__name__}.{name}{got} differs from Tx.{name}{want}"
        )


def test_help_shows_every_verb_with_its_contract() -> None:
    text = pydoc.render_doc(tx.Tx, renderer=pydoc.plaintext)
    for name in _verbs():
        assert f"{name}(" in text or f"{name}\n" in text, name
        assert (inspect.getdoc(getattr(tx.Tx, name)) or "").strip(), f"Tx.{name} has no docstring"
    assert "DuplicateKeyError" in text and "MissingRowError" in text and "SchemaError" in text


def _ledger() -> tx.Job:
    def deposit(t: tx.Tx, e: dict[str, Any]) -> None:
        t.upsert("accounts", {"acct": e["acct"], "balance": e["amount"]})

    def audit(t: tx.Tx, e: dict[str, Any]) -> None:
        t.emit("audits", {"total": t.sum("accounts", "balance"), "n": t.count("accounts")})

    return (
        tx.Job("ledger")
        .table("accounts", key="acct")
        .input("deposits", None, keys="acct")
        .input("audits", None, global_reads=["accounts.balance"])
        .output("audits")
        .on("deposits", deposit)
        .on("audits", audit)
    )


def _on_the_driver(job: tx.Job, batches: list[list[tuple[str, dict[str, Any]]]]) -> list[Any]:
    """The driver engine's outcome per batch (one partition: one copy of each event)."""
    from txstream.spark.runtime.boundaries import MID_BITS
    from txstream.spark.runtime.driver import DriverEngine
    from txstream.spark.runtime.local import event_copies

    engine = DriverEngine(job.spec)
    outcomes = []
    for b, batch in enumerate(batches):
        mids = [(b << MID_BITS) + i for i in range(len(batch))]
        events = [
            event_copies(job.spec, 1, name, row, mid)[0][1]
            for (name, row), mid in zip(batch, mids, strict=True)
        ]
        outcomes.append(engine.run_batch(b, events))
    return outcomes


def test_global_reads_give_the_same_totals_on_the_driver_engine_as_run_local(
    tmp_path: Path,
) -> None:
    batches = [
        [("deposits", {"acct": 1, "amount": 5}), ("deposits", {"acct": 2, "amount": 7})],
        [("audits", {}), ("deposits", {"acct": 3, "amount": 1.5})],  # (inputs in declared order)
        [("audits", {})],
    ]
    job = _ledger()
    job.run_local(batches, tmp_path)
    local = tx.read_output(tmp_path, "audits")
    assert local == [{"total": 13.5, "n": 3}, {"total": 13.5, "n": 3}]
    outcomes = _on_the_driver(job, batches)
    assert [o.failures for o in outcomes] == [[], [], []]
    driver = [json.loads(line) for o in outcomes for line in o.outputs.get("audits", [])]
    assert [{k: v for k, v in row.items() if k != "__order"} for row in driver] == local


@pytest.mark.parametrize("partitions", [1, 3])
def test_a_global_read_runs_once_at_home_0_on_both_engines(tmp_path: Path, partitions: int) -> None:
    # The documented idiom for a keyless event, "emit once where t.home == 0", must
    # not drop a global read's rows: it runs once, at partition 0 (home was None).
    def audit(t: tx.Tx, e: dict[str, Any]) -> None:
        if t.home == 0:
            t.emit("audits", {"total": t.sum("accounts", "balance"), "n": t.count("accounts")})

    job = _ledger().on("audits", audit)
    batches = [[("deposits", {"acct": 1, "amount": 5}), ("audits", {})], [("audits", {})]]
    job.run_local(batches, tmp_path, partitions=partitions)
    assert tx.read_output(tmp_path, "audits") == [{"total": 5, "n": 1}] * 2
    driver = [
        json.loads(line) for o in _on_the_driver(job, batches) for line in o.outputs["audits"]
    ]
    assert [{k: v for k, v in row.items() if k != "__order"} for row in driver] == [
        {"total": 5, "n": 1}
    ] * 2


def test_a_global_read_on_the_driver_engine_must_be_declared_as_on_the_executors(
    tmp_path: Path,
) -> None:
    def sneaky(t: tx.Tx, e: dict[str, Any]) -> None:
        t.emit("audits", {"total": t.sum("accounts", "acct"), "n": 0})

    job = _ledger().on("audits", sneaky)
    batch = [("deposits", {"acct": 1, "amount": 5}), ("audits", {})]
    job.run_local([batch], tmp_path)
    local = [f["error"] for f in tx.read_failures(tmp_path)]
    driver = [f["error"] for f in _on_the_driver(job, [batch])[0].failures]
    assert driver == local
    assert local[0].startswith("UndeclaredKeyError: a read of accounts.acct across all")


def test_the_concurrency_control_base_class_is_no_longer_called_protocol() -> None:
    import ast

    from txstream import txn

    assert txn.ConcurrencyControl.__name__ == "ConcurrencyControl"
    assert txn.Protocol is txn.ConcurrencyControl  # the old name, kept for imports
    assert all(issubclass(cls, txn.ConcurrencyControl) for cls in txn.PROTOCOLS.values())
    src = Path(txn.__file__).resolve().parent.parent
    named = [
        str(path.relative_to(src))
        for path in src.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "Protocol"
    ]
    assert named == []  # only typing.Protocol is a Protocol
