"""The users' testing kit: crashes and resumes of ``run_local``, compared with a serial run.

The Streaming Ledger (transfers across partitions, audits over every balance)
crashed at random points, between batches and inside them, ends with the
outputs and balances of one serial run; and the comparison is shown to fail on
a store that ran a batch twice (the check can fail).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from txstream.bench.ledger import events, ledger_job, opening
from txstream.errors import TxStreamError
from txstream.spark.testing import assert_same_results, run_with_crashes, serial_run


def _ledger(audits: bool = True) -> tuple[Any, list[list[tuple[str, dict[str, Any]]]]]:
    stream = list(
        events(600, 40, 50.0, seed=3, pattern="uniform", audit_every=100 if audits else 0)
    )
    job = ledger_job(initial=opening(40), audits=[] if audits else None)
    batches = [stream[i : i + 50] for i in range(0, len(stream), 50)]
    return job, batches


@pytest.mark.parametrize("seed", [1, 2])
def test_a_ledger_crashed_at_random_points_ends_as_the_serial_run(
    tmp_path: Path, seed: int
) -> None:
    job, batches = _ledger()
    rng = random.Random(seed)
    points = sorted({(rng.randrange(len(batches)), rng.choice([0, 1, 25, 49])) for _ in range(5)})
    crashes = run_with_crashes(job, batches, tmp_path / "crashed", points, partitions=2, tasks=2)
    assert crashes == len(points)  # (each point fires once, in batch order)
    serial_run(job, batches, tmp_path / "serial")
    assert_same_results(job, tmp_path / "crashed", tmp_path / "serial")


def test_the_comparison_fails_on_a_batch_run_twice(tmp_path: Path) -> None:
    job, batches = _ledger(audits=False)
    serial_run(job, batches, tmp_path / "serial")
    twice = [*batches[:3], batches[2], *batches[3:]]  # a replayed batch run again
    serial_run(job, twice, tmp_path / "twice")
    with pytest.raises(AssertionError, match=r"transfers_done|accounts"):
        assert_same_results(job, tmp_path / "twice", tmp_path / "serial")


def test_crash_points_outside_the_input_are_refused(tmp_path: Path) -> None:
    job, batches = _ledger(audits=False)
    with pytest.raises(TxStreamError, match="crash point"):
        run_with_crashes(job, batches, tmp_path / "s", [(len(batches), 0)])


def test_the_comparison_fails_on_other_rolled_back_transactions(tmp_path: Path) -> None:
    # Outputs and tables alike, failures not: it passed (read_failures was not compared).
    import txstream as tx

    def check(t: Any, e: dict[str, Any]) -> None:
        if e["k"] % 2:
            raise ValueError(f"odd {e['k']}")

    job = tx.Job("kit").table("t", key="k").input("ev", None, keys="k", order="id")
    job.on("ev", check)
    with pytest.warns(tx.TransactionFailuresWarning):
        serial_run(job, [[("ev", {"id": 0, "k": 1}), ("ev", {"id": 1, "k": 2})]], tmp_path / "a")
    with pytest.warns(tx.TransactionFailuresWarning):
        serial_run(job, [[("ev", {"id": 0, "k": 2}), ("ev", {"id": 1, "k": 1})]], tmp_path / "b")
    assert_same_results(job, tmp_path / "a", tmp_path / "a")
    with pytest.raises(AssertionError, match=r"rolled-back transactions: 1 .* missing \[\('ev#1'"):
        assert_same_results(job, tmp_path / "a", tmp_path / "b")
