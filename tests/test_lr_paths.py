"""Linear Road's not-serializable variant on the executor runtime, without a JVM.

The variant is two jobs with no order in common: the minute path (statistics,
accidents, tolls, published to the TOLLS store when its batches commit) and the
notification path (entries, charges, alerts, queries, reading the published
tolls).  In this process they take turns batch by batch, which makes a run
deterministic: the tests choose the turns and check that the wrong answers come
from them (the paths' relative order) and from nothing else.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from txstream.errors import TxStreamError
from txstream.linearroad.generate import generate
from txstream.linearroad.runtime_job import run_local
from txstream.linearroad.tollstore import TollsPublisher
from txstream.linearroad.txns import LinearRoadTxns, tolls_path
from txstream.linearroad.validate import validate


@pytest.fixture(scope="module")
def lr_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("lr")
    generate(folder, L=1.5, minutes=12, seed=11)
    return folder


def _run(folder: Path, out: Path, **kw: Any) -> tuple[Any, list[str]]:
    txns = LinearRoadTxns(tolls_path=tolls_path(folder / "tolls.dat"))
    answers, _ = run_local(folder / "input.dat", out, txns, **kw)
    report = validate(folder / "input.dat", answers, tolls_path=folder / "tolls.dat")
    return report, sorted(_without_emit(line) for line in answers.read_text().splitlines())


def _without_emit(line: str) -> str:
    f = line.split(",")
    at = 3 if f[0] == "0" else 2
    return ",".join(f[:at] + f[at + 1 :])


def _keys(lines: list[str], kind: str) -> list[str]:
    """Toll alerts by (VID, Time), balances without the balance, expenditures whole."""
    if kind == "0":
        return sorted(",".join(x.split(",")[1:3]) for x in lines if x.startswith("0,"))
    if kind == "2":
        return sorted(x.rsplit(",", 1)[0] for x in lines if x.startswith("2,"))
    return [x for x in lines if x.startswith(kind + ",")]


def test_the_not_serializable_errors_come_from_the_order_of_the_two_paths(
    lr_input: Path, tmp_path: Path
) -> None:
    serial, want = _run(lr_input, tmp_path / "ser")
    assert all(c.wrong == c.missing == c.duplicates == 0 for c in serial.by_type.values())
    # One minute of input per batch, the minute path first: every notification
    # reads the tolls of its own minute, as the serializable job does.
    _, got = _run(
        lr_input, tmp_path / "min", variant="not-serializable", first="minute", by_minute=True
    )
    assert got == want
    # The notification path first: its notifications read the previous minute's
    # tolls and accidents (the minute path has not published them yet).
    report, behind = _run(
        lr_input, tmp_path / "ntf", variant="not-serializable", first="notify", by_minute=True
    )
    toll, accident = report.by_type["toll"], report.by_type["accident"]
    assert toll.wrong > toll.expected // 4 and accident.missing > 0
    assert (toll.missing, toll.duplicates, accident.duplicates) == (0, 0, 0)
    # The same notifications and queries, answered once each; only values differ.
    # (expenditures read a static relation: equal whole)
    for kind in "023":
        assert _keys(behind, kind) == _keys(want, kind), kind


def test_a_crash_between_a_minute_commit_and_its_publication_repeats_and_loses_nothing(
    lr_input: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, whole = _run(lr_input, tmp_path / "whole", variant="not-serializable", batch_lines=997)
    out = tmp_path / "crash"
    publish = TollsPublisher.__call__
    crashed: list[int] = []

    def crash(self: TollsPublisher, batch: int, rows: Any) -> None:
        if batch >= 3 and rows and not crashed:  # a batch that brings new tolls
            crashed.append(batch)
            raise RuntimeError(f"killed after batch {batch} of the minute path committed")
        publish(self, batch, rows)

    monkeypatch.setattr(TollsPublisher, "__call__", crash)
    with pytest.raises(TxStreamError, match="killed after batch"):
        _run(lr_input, out, variant="not-serializable", batch_lines=997)

    def late(self: TollsPublisher, batch: int, rows: Any) -> None:
        if batch == crashed[0]:
            time.sleep(1.0)  # a slow redelivery: the notification path must wait for it
        publish(self, batch, rows)

    monkeypatch.setattr(TollsPublisher, "__call__", late)
    report, resumed = _run(lr_input, out, variant="not-serializable", batch_lines=997)
    # Taking the same turns, the resumed run answers exactly as the uninterrupted one:
    # the crashed batch's tolls were published before the notification path went on.
    assert resumed == whole
    assert all(c.duplicates == 0 for c in report.by_type.values())


def test_the_record_option_is_refused_for_the_two_jobs(tmp_path: Path) -> None:
    from txstream.linearroad.run_job import RunOptions, check_engine

    check_engine(RunOptions(out=tmp_path, variant="not-serializable"))
    with pytest.raises(TxStreamError, match="--engine driver"):
        check_engine(RunOptions(out=tmp_path, variant="not-serializable", record=tmp_path / "h"))


def test_linear_road_run_puts_the_not_serializable_variant_on_the_executor_runtime(
    tmp_path: Path,
) -> None:
    # Before issue 31 the variant ran on the driver engine unless told otherwise.
    from txstream.linearroad.run_job import RunOptions, run_job

    o = RunOptions(out=tmp_path / "o", L=1.0, minutes=6, seed=3, spark=False, quiet=True,
                   variant="not-serializable")  # fmt: skip
    summary = run_job(o)
    assert summary["execution"] == "runtime" and summary["paths"] == "two jobs: minute, notify"
    out = tmp_path / "o"
    assert (out / "ckpt-minute").is_dir() and (out / "tolls-store.json").exists()
    by_type = summary["by_type"]
    assert by_type["toll"]["missing"] == by_type["toll"]["duplicates"] == 0
    assert by_type["toll"]["wrong"] > 0  # counted by the validator, not hidden
