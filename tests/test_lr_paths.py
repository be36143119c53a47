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
    # --sync was accepted on the runtime engine and did nothing.
    check_engine(RunOptions(out=tmp_path, engine="driver", sync="commit"))
    with pytest.raises(TxStreamError, match="--sync commit sets the driver engine's"):
        check_engine(RunOptions(out=tmp_path, sync="commit"))


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


def test_adhoc_answers_as_the_serializable_job_where_not_serializable_goes_wrong(
    lr_input: Path, tmp_path: Path
) -> None:
    # Batches of 997 lines, the minute path's first: within a batch the minute
    # path runs ahead into the next minute before the notifications read.
    _, want = _run(lr_input, tmp_path / "ser")
    report, latest = _run(
        lr_input, tmp_path / "ns", variant="not-serializable", first="minute", batch_lines=997
    )
    assert report.by_type["toll"].wrong > 0 and latest != want
    # The adhoc store keeps each minute apart: every notification reads its own
    # minute, and the answers are the serializable job's, line for line.
    report, got = _run(lr_input, tmp_path / "adhoc", variant="adhoc", batch_lines=997)
    assert got == want
    assert all(c.wrong == c.missing == c.duplicates == 0 for c in report.by_type.values())


def test_an_adhoc_read_of_an_unpublished_minute_fails_loudly(tmp_path: Path) -> None:
    from txstream.linearroad.tollstore import NO_TOLL, toll_at

    store = tmp_path / "tolls-store.json"
    pub = TollsPublisher(store, versions=True)
    row = {"xway": 0, "dir": 1, "minute": 3, "lav": 0, "toll": 0, "near": -1}
    pub(0, [{**row, "seg": 7, "lav": 42, "toll": 8}, {**row, "seg": -1}])
    pub(1, [{**row, "minute": 4, "seg": 7, "lav": 30, "toll": 2}, {**row, "minute": 4, "seg": -1}])
    assert pub.reached == {(0, 1): 4}
    # Minute 3's row stays readable after minute 4 was published (no latest-wins).
    assert toll_at(str(store), (0, 1, 7), 3) == (42, 8, -1)
    assert toll_at(str(store), (0, 1, 7), 4) == (30, 2, -1)
    assert toll_at(str(store), (0, 1, 9), 4) == NO_TOLL  # nothing computed there: no toll
    with pytest.raises(TxStreamError, match="before the minute path published"):
        toll_at(str(store), (0, 1, 7), 5)
    with pytest.raises(TxStreamError, match="before the minute path published"):
        toll_at(str(store), (0, 0, 7), 4)  # the other direction has not reached it
    restarted = TollsPublisher(store, versions=True)
    assert restarted.reached == {(0, 1): 4}  # survives a restart
    # The other direction reaches minute 4 in a later batch: the minute's file
    # gains that partition and keeps the first one's rows.
    other = {**row, "dir": 0, "minute": 4}
    restarted(2, [{**other, "seg": 3, "lav": 20, "toll": 5}, {**other, "seg": -1}])
    assert toll_at(str(store), (0, 0, 3), 4) == (20, 5, -1)
    assert toll_at(str(store), (0, 1, 7), 4) == (30, 2, -1)
    restarted(2, [{**other, "seg": 3, "lav": 99, "toll": 99}])  # delivered again: skipped
    assert toll_at(str(store), (0, 0, 3), 4) == (20, 5, -1)


def test_the_adhoc_gate_holds_a_chunk_until_its_minutes_are_published(tmp_path: Path) -> None:
    from txstream.linearroad.runtime_job import gate_needs
    from txstream.linearroad.tollstore import Gate

    source, target = tmp_path / "source", tmp_path / "notify"
    source.mkdir()
    reached: dict[tuple[int, int], int] = {(0, 0): 1}
    report = "0,{t},1,60,0,1,{d},10,52800,-1,-1,-1,-1,-1,-1"
    (source / "chunk-0000000.txt").write_text(f"1|5.0|{report.format(t=59, d=0)}\n")
    (source / "chunk-0000001.txt").write_text(
        f"2|6.0|{report.format(t=60, d=0)}\n3|6.0|2,60,1,7,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1\n"
    )
    assert gate_needs(f"2|6.0|{report.format(t=60, d=0)}") == (0, 0, 2)
    assert gate_needs("3|6.0|2,60,1,7,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1") is None  # a query
    assert gate_needs("4|6.0|not a tuple") is None
    gate = Gate(source, target, lambda: reached, gate_needs, poll_s=0.005)
    gate.start()
    try:
        for _ in range(2000):  # the first chunk needs minute 1 only: it passes
            if gate.passed:
                break
            time.sleep(0.005)
        assert sorted(p.name for p in target.iterdir()) == ["chunk-0000000.txt"]
        time.sleep(0.05)
        assert gate.passed == 1  # minute 2 not published: still held
        reached[(0, 0)] = 2
        gate.done.set()
        gate.join(timeout=10)
        assert not gate.is_alive() and gate.error is None
    finally:
        gate.stopping.set()
    second = (target / "chunk-0000001.txt").read_text()
    assert second == (source / "chunk-0000001.txt").read_text()  # handoff stamps kept

    # A minute that never comes: the gate gives up with a one-line error (the run
    # reports it) instead of holding the notification path back forever.
    stuck = Gate(source, tmp_path / "stuck", lambda: {}, gate_needs, give_up_s=0.05, poll_s=0.01)
    stuck.start()
    stuck.join(timeout=30)
    assert isinstance(stuck.error, TxStreamError) and "waited" in str(stuck.error)


def test_the_adhoc_variant_is_the_runtimes_only(tmp_path: Path, monkeypatch: Any) -> None:
    from test_cli_badinput import assert_rejected

    monkeypatch.chdir(tmp_path)
    argv = ["linear-road", "run", "--L", "0.5", "--minutes", "1", "--no-spark", "--out", "o"]
    assert_rejected([*argv, "--variant", "adhoc", "--engine", "driver"], "--engine runtime")
    assert_rejected([*argv, "--variant", "bogus"], "adhoc")


def test_adhoc_resumes_after_a_crash_between_a_minute_commit_and_its_publication(
    lr_input: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, want = _run(lr_input, tmp_path / "ser")
    out = tmp_path / "crash"
    publish = TollsPublisher.__call__
    crashed: list[int] = []

    def crash(self: TollsPublisher, batch: int, rows: Any) -> None:
        if batch >= 3 and rows and not crashed:
            crashed.append(batch)
            raise RuntimeError(f"killed after batch {batch} of the minute path committed")
        publish(self, batch, rows)

    monkeypatch.setattr(TollsPublisher, "__call__", crash)
    with pytest.raises(TxStreamError, match="killed after batch"):
        _run(lr_input, out, variant="adhoc", batch_lines=997)
    monkeypatch.setattr(TollsPublisher, "__call__", publish)
    # The restarted publisher knows the minutes reached so far (its file) and gets
    # the crashed batch again; every notification still reads its own minute.
    report, resumed = _run(lr_input, out, variant="adhoc", batch_lines=997)
    assert resumed == want
    assert all(c.wrong == c.missing == c.duplicates == 0 for c in report.by_type.values())


def test_adhoc_cannot_roll_back_a_duplicated_segment_entry(lr_input: Path, tmp_path: Path) -> None:
    # Table 2: a segment-entering report delivered twice every 2 s.  The
    # transaction manager's variants undo the duplicate's query; the paper's ADHOC
    # cannot, so it alerts twice and charges the toll twice.
    from collections import Counter

    from txstream.spark.runtime import read_table

    ser, _ = _run(lr_input, tmp_path / "ser", duplicate_every=2)
    assert all(c.wrong == c.missing == c.duplicates == 0 for c in ser.by_type.values())
    adhoc, lines = _run(lr_input, tmp_path / "adhoc", variant="adhoc", duplicate_every=2)
    toll = adhoc.by_type["toll"]
    assert toll.duplicates > 0 and toll.wrong == toll.missing == 0
    alerts = [x.split(",") for x in lines if x.startswith("0,")]  # (without Emit)
    seen = Counter((f[1], f[2]) for f in alerts)
    again = sum(int(f[4]) for f in alerts if seen[(f[1], f[2])] > 1) // 2
    assert again > 0  # some duplicated entries carried a toll

    def assessed(run: str) -> int:
        rows = read_table(tmp_path / run / "ckpt", "balance")
        return sum(r["charged"] + r["pending"] for r in rows)

    # Every duplicated toll was assessed a second time (this input's 417 balance
    # queries happen to ask about none of those cars, so no balance is wrong here).
    assert assessed("adhoc") - assessed("ser") == again
