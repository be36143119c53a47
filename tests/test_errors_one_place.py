"""One class per error meaning, defined in one place (the lowest layer that raises it).

Higher layers re-export the class, so ``except tx.DuplicateKeyError`` catches
the storage tables', the transaction manager's and both engines' duplicate
keys alike, and the old import paths keep working.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
import txstream.storage as storage
from txstream.spark.runtime import base, boundaries, codec, errors, failures, forward, state
from txstream.storage import Store
from txstream.txn import TransactionManager

SRC = Path(__file__).resolve().parent.parent / "src" / "txstream"

SAME_NAME_OTHER_MEANING = {"SchemaError"}
"""``loading.schema.SchemaError`` (a relation's definition is wrong) and the runtime's
(a row does not fit its table's columns) share a name but not a meaning."""


def _error_classes() -> dict[str, list[str]]:
    """Every ``class XError(...)``/``XException`` defined in src, by name: where."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Exception")):
                found[node.name].append(str(path.relative_to(SRC)))
    return found


def test_no_error_class_is_defined_twice() -> None:
    twice = {
        name: where
        for name, where in _error_classes().items()
        if len(where) > 1 and name not in SAME_NAME_OTHER_MEANING
    }
    assert twice == {}


def test_the_runtime_raises_the_storage_layers_classes_and_re_exports_them() -> None:
    assert tx.DuplicateKeyError is storage.DuplicateKeyError is errors.DuplicateKeyError
    assert tx.MissingRowError is storage.MissingRowError is storage.MissingKeyError
    assert tx.StoreLockedError is storage.StoreLockedError
    assert tx.StoreError is storage.StoreError
    assert issubclass(tx.StoreLockedError, tx.StoreError)
    assert issubclass(storage.LogCorruptError, tx.StoreError)


def test_the_old_import_paths_name_the_same_classes() -> None:
    for name in ("RuntimeJobError", "UndeclaredKeyError", "SchemaError", "TransactionAborted"):
        assert getattr(base, name) is getattr(errors, name) is getattr(tx, name)
    assert base.DuplicateKeyError is tx.DuplicateKeyError
    assert base.MissingRowError is tx.MissingRowError
    assert boundaries.GroupOrderError is tx.GroupOrderError
    assert state.StoreError is tx.StoreError and state.StoreLockedError is tx.StoreLockedError
    assert failures.InputFailingError is tx.InputFailingError
    assert forward.ExchangeError is errors.ExchangeError
    assert codec.UnstorableValueError is errors.UnstorableValueError


def test_one_except_catches_a_duplicate_key_from_every_layer(tmp_path: Path) -> None:
    tm = TransactionManager("ss2pl", store=Store(tmp_path / "s"))
    table = tm.table("users")
    with tm.begin() as txn:
        txn.insert(table, "ada", {"name": "ada"})
    caught: list[Any] = []
    with pytest.raises(tx.DuplicateKeyError, match="already exists"), tm.begin() as txn:
        txn.insert(table, "ada", {"name": "ada"})
    with pytest.raises(tx.MissingRowError, match="no row"), tm.begin() as txn:
        txn.delete(table, "bob")

    def signup(t: tx.Tx, e: dict[str, Any]) -> None:
        try:
            t.insert("users", {"name": e["name"]})
        except tx.DuplicateKeyError as exc:
            caught.append(str(exc))

    job = tx.Job().table("users", key="name").input("signups", None, keys="name")
    job.on("signups", signup).run_local(
        [[("signups", {"name": "ada"}), ("signups", {"name": "ada"})]], tmp_path / "ckpt"
    )
    assert caught == ["insert into users: key 'ada' exists"]
