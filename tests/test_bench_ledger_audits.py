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
