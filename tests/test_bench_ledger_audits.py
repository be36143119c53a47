"""The ledger's audits (global reads inside a transaction) against the serial oracle."""

from __future__ import annotations

from pathlib import Path

import pytest

import txstream.spark.runtime as tx
from txstream.bench.ledger import audit_totals, events, ledger_job, opening, serial_oracle
from txstream.bench.runtime import audit_violations
from txstream.model import check


@pytest.mark.parametrize(("partitions", "tasks"), [(1, 1), (2, 1), (5, 1), (5, 2)])
def test_ledger_audits_total_every_balance_at_their_place_in_the_order(
    tmp_path: Path, partitions: int, tasks: int
) -> None:
    stream = list(events(600, 40, 0, seed=3, pattern="uniform", audit_every=50))
    job = ledger_job(audits=[], initial=opening(40)).option("recordHistory", True)
    job.run_local([stream[:250], stream[250:]], tmp_path, partitions, tasks=tasks)
    rows = tx.read_output(tmp_path, "audits_done")
    assert len(rows) == 12
    assert audit_violations(rows, audit_totals(stream, 40)) == 0
    _, outcomes = serial_oracle(stream, 40)
    assert [(r["id"], r["ok"]) for r in tx.read_output(tmp_path, "transfers_done")] == outcomes
    verdict = check(tx.read_history(tmp_path), "csao")
    assert verdict.holds, verdict.evidence


def test_the_bench_job_keeps_the_order_when_one_input_runs_a_batch_ahead(tmp_path: Path) -> None:
    # As on Spark when a batch starts while the feeder writes: the audits'
    # files of later events come a batch before the deposits' and transfers'.
    from txstream.bench.runtime import bench_job

    stream = [
        (n, {**e, "sent": 0.0})
        for n, e in events(900, 40, 0, seed=4, pattern="uniform", audit_every=100)
    ]
    first = [x for x in stream if x[1]["id"] < 303]
    ahead = [x for x in stream if x[1]["id"] >= 303 and x[0] == "audits"]
    rest = [x for x in stream if x[1]["id"] >= 303 and x[0] != "audits"]
    want = audit_totals(stream, 40)
    job = bench_job([], [], [], opening(40))
    job.run_local([first, ahead, rest], tmp_path / "bench", 3)
    assert audit_violations(tx.read_output(tmp_path / "bench", "audits_done"), want) == 0
    # with an input taken as quiet after one batch without rows (the default),
    # the audits run ahead of the deposits before them, and a warning says so
    job = bench_job([], [], [], opening(40)).option("idleBatches", 1)
    with pytest.warns(tx.LateEventsWarning, match="600 event"):
        job.run_local([first, ahead, rest], tmp_path / "quiet", 3)
    assert audit_violations(tx.read_output(tmp_path / "quiet", "audits_done"), want) > 0


@pytest.mark.parametrize("tasks", [1, 2])
def test_audits_that_wait_past_each_other_take_each_its_own_totals(
    tmp_path: Path, tasks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An audit every 10 events on 8 partitions, one transaction per admission
    # round: a partition admits audits past others still waiting (up to
    # READS_PAST), each keeping the changes between it and the next apart.  Each
    # audit must total exactly the deposits before it.  (Fails when the changes
    # after a later read go to an earlier read's partials.)
    from txstream.spark.runtime.forward import base as forward_base
    from txstream.spark.runtime.forward import partition as forward_partition

    monkeypatch.setattr(forward_base, "ADMIT_CHUNK", 1)
    monkeypatch.setattr(forward_base, "ADMIT_CHUNK_WAITING", 1)
    deepest: list[int] = [0]
    read_past = forward_partition._Partition._read_past

    def counted(self: forward_partition._Partition, item: object) -> bool:
        ok = read_past(self, item)  # type: ignore[arg-type]
        deepest[0] = max(deepest[0], len(self.readings))
        return ok

    monkeypatch.setattr(forward_partition._Partition, "_read_past", counted)
    stream = list(events(400, 40, 0, seed=5, pattern="uniform", audit_every=10))
    job = ledger_job(audits=[], initial=opening(40)).option("recordHistory", True)
    job.run_local([stream[:200], stream[200:]], tmp_path, 8, tasks=tasks)
    assert deepest[0] > 1  # (reads did wait past each other)
    assert audit_violations(tx.read_output(tmp_path, "audits_done"), audit_totals(stream, 40)) == 0
    _, outcomes = serial_oracle(stream, 40)
    assert [(r["id"], r["ok"]) for r in tx.read_output(tmp_path, "transfers_done")] == outcomes
    verdict = check(tx.read_history(tmp_path), "csao")
    assert verdict.holds, verdict.evidence
