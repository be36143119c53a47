"""``run_local`` says when a batch's list order is not the order its events run in.

Events of inputs without an ``order`` column run in the inputs' declaration
order within a micro-batch, as on Spark; a user who lists them interleaved
expects list order, so the runner warns (:class:`tx.SourceOrderWarning`).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import txstream as tx


def _job(ordered: bool) -> tx.Job:
    order = "id" if ordered else None
    log = lambda t, e: t.emit("log", {"id": e["id"]})  # noqa: E731
    return (
        tx.Job("shop")
        .input("orders", None, keys="k", order=order)
        .input("restocks", None, keys="k", order=order)
        .output("log")
        .on("orders", log)
        .on("restocks", log)
    )


def _run(job: tx.Job, batch: list[tuple[str, dict[str, Any]]], store: Path) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        job.run_local([batch], store)
    return [str(w.message) for w in caught if w.category is tx.SourceOrderWarning]


def test_an_interleaved_list_of_unordered_inputs_warns_once_naming_the_first_pair(
    tmp_path: Path,
) -> None:
    batch = [
        ("orders", {"k": 1, "id": 1}),
        ("restocks", {"k": 1, "id": 2}),
        ("orders", {"k": 1, "id": 3}),
        ("orders", {"k": 2, "id": 4}),
    ]
    messages = _run(_job(ordered=False), batch, tmp_path / "s")
    assert messages == [
        "batch 0: orders#2 runs before restocks#1, listed before it: without an order column "
        "a micro-batch runs its inputs in declaration order (orders, restocks), not in list "
        "order; declare order=... on the inputs to interleave them"
    ]
    assert [r["id"] for r in tx.read_output(tmp_path / "s", "log")] == [1, 3, 4, 2]


@pytest.mark.parametrize("ordered", [False, True], ids=["declaration-order", "order-column"])
def test_no_warning_when_the_list_is_the_run_order(tmp_path: Path, ordered: bool) -> None:
    # Ordered inputs interleave by their column: their list order is not a promise.
    batch = [
        ("orders", {"k": 1, "id": 1}),
        ("orders", {"k": 2, "id": 3}),
        ("restocks", {"k": 1, "id": 2}),
    ]
    assert _run(_job(ordered), batch, tmp_path / "s") == []
    ids = [r["id"] for r in tx.read_output(tmp_path / "s", "log")]
    assert ids == ([1, 2, 3] if ordered else [1, 3, 2])


def test_an_ordered_event_that_runs_before_an_unordered_one_listed_earlier_warns(
    tmp_path: Path,
) -> None:
    # An input without an order column runs at order value 0: an ordered event with a
    # negative value, listed after it (and after a larger ordered one), runs first.
    job = (
        tx.Job("mixed")
        .input("notes", None, keys="k")
        .input("readings", None, keys="k", order="t")
        .output("log")
        .on("notes", lambda t, e: t.emit("log", {"id": e["id"]}))
        .on("readings", lambda t, e: t.emit("log", {"id": e["id"]}))
    )
    batch = [
        ("notes", {"k": 1, "id": 1}),
        ("readings", {"k": 1, "id": 2, "t": 5}),
        ("readings", {"k": 1, "id": 3, "t": -1}),
    ]
    messages = _run(job, batch, tmp_path / "s")
    assert len(messages) == 1 and messages[0].startswith("batch 0: readings#2 runs before notes#0")
    assert [r["id"] for r in tx.read_output(tmp_path / "s", "log")] == [3, 1, 2]
