"""examples/ledger_audit.py without Spark: the serial answer on any partitions and tasks.

Transfers between any two accounts (multi-partition transactions forwarded
between partitions, or deferred), overdraft limits from a second input, and
audits that total every balance inside one transaction (a global read), run
with ``run_local`` over 1, 3 and 8 partitions, in one task or in two tasks
exchanging messages over local sockets, against the example's brute-force
serial oracle; the recorded histories are checked CSAO.  Mutating the global
read (a partition's totals dropped) or the forwarding must fail these tests.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import txstream as tx
from txstream.model import check
from txstream.spark.runtime.forward import reads as forward_reads

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ledger_audit.py"


def ledger_audit() -> ModuleType:
    module_spec = importlib.util.spec_from_file_location("ledger_audit", EXAMPLE)
    assert module_spec is not None and module_spec.loader is not None
    example = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(example)
    return example


EX = ledger_audit()


def split(stream: list[Any], sizes: list[int]) -> list[list[Any]]:
    out, i = [], 0
    for size in sizes:
        out.append(stream[i : i + size])
        i += size
    out.append(stream[i:])
    return [b for b in out if b]


def results(store: Path) -> dict[str, Any]:
    got: dict[str, Any] = {n: tx.read_output(store, n) for n in ("transfers_done", "audits")}
    got["accounts"] = tx.read_table(store, "accounts")
    return got


def run(store: Path, rows: Any, batches: Any, partitions: int, tasks: int, mode: str) -> Any:
    job = EX.job(rows, None, None, None, None).option("recordHistory", True)
    return job.option("crossPartition", mode).run_local(batches, store, partitions, tasks=tasks)


@pytest.mark.parametrize("partitions", [1, 3, 8])
@pytest.mark.parametrize("tasks", [1, 2])
@settings(max_examples=max(10, settings.default.max_examples // 6))
@given(
    seed=st.integers(0, 10_000),
    accounts=st.integers(2, 16),
    count=st.integers(5, 120),
    audit_every=st.integers(2, 12),
    sizes=st.lists(st.integers(1, 50), max_size=4),
    mode=st.sampled_from(["forward", "forward", "defer"]),
)
def test_the_ledger_with_an_auditor_gives_the_serial_answer(
    tmp_path_factory: pytest.TempPathFactory,
    partitions: int,
    tasks: int,
    seed: int,
    accounts: int,
    count: int,
    audit_every: int,
    sizes: list[int],
    mode: str,
) -> None:
    rows = EX.opening(accounts, seed)
    stream = EX.events(count, accounts, seed, audit_every)
    expected = EX.serial_oracle(rows, stream)
    store = tmp_path_factory.mktemp("ledger_audit")
    run(store, rows, split(stream, sizes), partitions, tasks, mode)
    got = results(store)
    assert all(a["ok"] for a in got["audits"])
    assert got == expected  # outcomes, every audit's totals, every final row; each once
    verdict = check(tx.read_history(store), "csao")
    assert verdict.holds, verdict.evidence


def test_transfers_are_forwarded_and_audits_read_every_partition(tmp_path: Path) -> None:
    # The shape the Hypothesis test relies on: transfers really span partitions
    # (forwarded, none deferred), audits really total all of them.
    rows = EX.opening(40, 1)
    stream = EX.events(600, 40, 1, audit_every=25)
    runner = run(tmp_path, rows, split(stream, [200, 200]), 8, 2, "forward")
    assert sum(s["deferred"] for s in runner.stats) == 0
    assert sum(s["forwarded"] for s in runner.stats) > 100
    got = results(tmp_path)
    assert got == EX.serial_oracle(rows, stream)
    audits = got["audits"]
    assert len(audits) == 24 and all(a["ok"] for a in audits)
    assert len({a["total"] for a in audits}) > 1 and audits[-1]["accounts"] > 40
    assert any(not t["ok"] for t in got["transfers_done"])  # refused beyond an overdraft
    assert any(r["balance"] < 0 for r in got["accounts"])  # and used within one


@pytest.mark.parametrize("tasks", [1, 2])
def test_a_global_read_that_misses_a_partition_fails_the_audits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tasks: int
) -> None:
    # The audit is checked against the deposits so far: if partition 0 runs it
    # over its own totals only (the others' dropped), the audits must say so.
    monkeypatch.setattr(forward_reads, "add_totals", lambda into, more: None)
    rows = EX.opening(20, 2)
    stream = EX.events(200, 20, 2, audit_every=10)
    run(tmp_path, rows, [stream], 3, tasks, "forward")
    audits = results(tmp_path)["audits"]
    assert audits != EX.serial_oracle(rows, stream)["audits"]
    assert not all(a["ok"] for a in audits)


def test_the_example_generates_files_whose_batches_give_the_expected_answer(
    tmp_path: Path,
) -> None:
    # The files `generate` writes, one of each input per micro-batch (as its
    # file sources with maxFilesPerTrigger 1 hand them over), under run_local.
    data = tmp_path / "data"
    expected = EX.generate(data, accounts=30, files=5, per_file=60, seed=4)
    rows = [json.loads(line) for line in (data / "accounts.json").read_text().splitlines()]
    batches = [
        [
            (name, json.loads(line))
            for name in EX.INPUTS
            for line in (data / name / f"part-{n:04d}.json").read_text().splitlines()
        ]
        for n in range(5)
    ]
    run(tmp_path / "store", rows, batches, 4, 2, "forward")
    assert (
        results(tmp_path / "store") == expected == json.loads((data / "expected.json").read_text())
    )
    assert EX.main(["show", "--data", str(data), "--checkpoint", str(tmp_path / "store")]) == 0
