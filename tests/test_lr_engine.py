"""The Linear Road engine without Spark: variants, transaction sizes, duplicates, crashes.

Every run is checked by the independent validator (a pandas batch computation)
on generated inputs; the crash test kills a real process with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.errors import TxStreamError, UnknownNameError
from txstream.linearroad.engine import HistoricalTolls, LinearRoadEngine, _active, _lav
from txstream.linearroad.formats import open_text
from txstream.linearroad.generate import generate
from txstream.linearroad.replay import duplicate_entries, numbered_lines, replay
from txstream.linearroad.validate import ValidationReport, validate
from txstream.model import check


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Ten minutes of one expressway: congestion (tolls), accidents, queries."""
    out = tmp_path_factory.mktemp("lr")
    generate(out, L=1, minutes=10, seed=3)
    return out


def _run(
    data: Path,
    out: Path,
    *,
    variant: str = "serializable",
    txn_size: str = "event",
    lav: str = "spec",
    duplicates: int = 0,
    state: bool = False,
) -> tuple[LinearRoadEngine, ValidationReport]:
    answers = out / f"answers-{variant}-{txn_size}-{lav}-{duplicates}.txt"
    engine = LinearRoadEngine(
        variant=variant,
        txn_size=txn_size,
        lav=lav,
        answers_path=answers,
        historical_tolls=HistoricalTolls.from_file(data / "tolls.dat"),
        state_dir=out / "state" if state else None,
    )
    engine.start()
    with open_text(data / "input.dat") as f:
        replay(engine, duplicate_entries(numbered_lines(f), duplicates))
    engine.finish()
    report = validate(data / "input.dat", answers, lav=lav, tolls_path=data / "tolls.dat")
    return engine, report


@pytest.mark.parametrize("txn_size", ["event", "1s", "2s", "3s"])
def test_serializable_answers_are_all_correct(small: Path, tmp_path: Path, txn_size: str) -> None:
    engine, report = _run(small, tmp_path, txn_size=txn_size)
    totals = report.totals
    assert report.ok, totals
    assert totals["correct"] == totals["expected"] > 5000
    assert report.by_type["accident"].expected > 0
    assert engine.rolled_back == 0


def test_serializable_with_raw_mean_lav(small: Path, tmp_path: Path) -> None:
    _, report = _run(small, tmp_path, lav="raw-mean")
    assert report.ok, report.totals


def test_not_serializable_gets_tolls_wrong(small: Path, tmp_path: Path) -> None:
    # The ingest path runs ahead of the minute path (it replays as fast as it can),
    # so notifications read the stores before the minute's tolls land.  (Accident
    # alerts go wrong or missing too, but how many depends on thread timing.)
    _, report = _run(small, tmp_path, variant="not-serializable")
    assert report.by_type["toll"].wrong > 0
    assert report.totals["duplicates"] == 0


def test_duplicates_are_rolled_back_only_by_the_serializable_variant(
    small: Path, tmp_path: Path
) -> None:
    with open_text(small / "input.dat") as f:
        lines = list(numbered_lines(f))
    injected = sum(1 for _ in duplicate_entries(lines, 2)) - len(lines)
    assert injected > 100

    engine, report = _run(small, tmp_path, duplicates=2)
    assert report.ok, report.totals
    assert engine.rolled_back == injected

    engine, report = _run(small, tmp_path, variant="not-serializable", duplicates=2)
    assert engine.rolled_back == 0
    assert report.by_type["toll"].duplicates == injected
    assert report.by_type["balance"].wrong > 0


def test_rolled_back_group_keeps_the_rest_of_the_group(small: Path, tmp_path: Path) -> None:
    engine, report = _run(small, tmp_path, txn_size="3s", duplicates=2)
    assert report.ok, report.totals
    assert engine.rolled_back > 0


_CRASHABLE = """
import sys, time
from txstream.linearroad.engine import HistoricalTolls, LinearRoadEngine
from txstream.linearroad.formats import open_text
from txstream.linearroad.replay import numbered_lines, replay
data, out = sys.argv[1], sys.argv[2]
engine = LinearRoadEngine(answers_path=out + "/answers.txt", state_dir=out + "/state",
    historical_tolls=HistoricalTolls.from_file(data + "/tolls.dat"), checkpoint_minutes=2)
engine.start()
print("resumed", engine.resumed_from, flush=True)
with open_text(data + "/input.dat") as f:
    lines = list(numbered_lines(f))
for i in range(0, len(lines), 500):
    replay(engine, lines[i:i + 500])
    time.sleep(float(sys.argv[3]))
engine.finish()
print("done", flush=True)
"""


def test_sigkill_mid_run_then_resume_gives_every_answer_once(small: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-c", _CRASHABLE, str(small), str(tmp_path)]
    victim = subprocess.Popen([*cmd, "0.05"], env=env, stdout=subprocess.PIPE, text=True)
    answers = tmp_path / "answers.txt"
    deadline = time.time() + 60
    # Kill it once answers have left the stores and a checkpoint has been taken.
    while time.time() < deadline and victim.poll() is None:
        if (tmp_path / "state" / "checkpoint.json").exists() and answers.stat().st_size > 0:
            break
        time.sleep(0.05)
    time.sleep(0.3)
    assert victim.poll() is None, "the run ended before it could be killed"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    done = subprocess.run([*cmd, "0"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    resumed = int(done.stdout.split()[1])
    assert resumed > 0
    report = validate(small / "input.dat", answers, tolls_path=small / "tolls.dat")
    assert report.ok, report.totals


def test_lav_definitions_round_half_up() -> None:
    # spec: mean over minutes of the per-minute mean of per-car means (scaled sums).
    rows = [[0, 0, 2, 2520 * 30 + 2520 * 41], [0, 0, 1, 2520 * 40]]
    assert _lav(rows, "spec") == 38  # (35.5 + 40) / 2 = 37.75
    assert _lav([[75, 2, 0, 0]], "raw-mean") == 38  # 37.5 rounds up
    assert _lav([], "spec") == 0


def test_accident_activity_window() -> None:
    stops = [[100, 1, 130, 250], [100, 2, 190, 200]]  # detected at 190, last stop 250
    assert not _active(stops, 4)
    assert _active(stops, 5)  # 190 // 60 + 2
    assert _active(stops, 6)  # 250 // 60 + 2
    assert not _active(stops, 7)
    assert not _active([[100, 1, 130, 250], [200, 2, 130, 250]], 5)  # other positions


def test_historical_tolls_lookup() -> None:
    h = HistoricalTolls([(7, 3, 1, 50), (7, 3, 0, 20), (8, 1, 0, 9)])
    assert h.lookup(7, 3, 0) == 20
    assert h.lookup(7, 3, 1) == 50
    assert h.lookup(7, 3, -1) == 50  # first in file order
    assert h.lookup(9, 3, 0) == 0


def test_unknown_names_are_refused() -> None:
    with pytest.raises(UnknownNameError, match="variant"):
        LinearRoadEngine(variant="fast")
    with pytest.raises(UnknownNameError, match="transaction size"):
        LinearRoadEngine(txn_size="5s")
    with pytest.raises(UnknownNameError, match="LAV"):
        LinearRoadEngine(lav="median")
    with pytest.raises(TxStreamError, match="checkpoint"):
        LinearRoadEngine(checkpoint_minutes=0)


def test_recorded_history_of_the_serializable_variant_is_csao(small: Path) -> None:
    with open_text(small / "input.dat") as f:
        lines = list(numbered_lines(f))[:6000]  # three minutes: tolls, boundaries
    engine = LinearRoadEngine(record=True)
    engine.start()
    replay(engine, lines)
    engine.finish()
    history = engine.tm.history(committed_only=True)
    assert len(history) > 10_000
    assert check(history, "cs").holds
    # Serializable in the order the ingest path created the transactions.
    assert check(history, "csao").holds
    assert any(history.arrivals.values())


@settings(max_examples=12)
@given(
    seed=st.integers(0, 10_000),
    minutes=st.integers(2, 4),
    rate=st.floats(1.0, 6.0),
    txn_size=st.sampled_from(["event", "1s", "3s"]),
    batch=st.integers(1, 3000),
)
def test_serializable_matches_the_batch_oracle_on_random_inputs(
    tmp_path_factory: pytest.TempPathFactory,
    seed: int,
    minutes: int,
    rate: float,
    txn_size: str,
    batch: int,
) -> None:
    data = tmp_path_factory.mktemp("random")
    generate(data, L=1, minutes=minutes, seed=seed, rate=rate)
    answers = data / "answers.txt"
    engine = LinearRoadEngine(
        txn_size=txn_size,
        answers_path=answers,
        historical_tolls=HistoricalTolls.from_file(data / "tolls.dat"),
    )
    engine.start()
    with open_text(data / "input.dat") as f:
        replay(engine, numbered_lines(f), batch=batch)
    engine.finish()
    report = validate(data / "input.dat", answers, tolls_path=data / "tolls.dat")
    assert report.ok, report.totals


def test_malformed_lines_are_rejected_with_their_reason_and_the_run_goes_on(
    small: Path, tmp_path: Path
) -> None:
    text = (small / "input.dat").read_text().splitlines()
    bad = {100: "0,12,107,x,0,1,0,10,53320,-1,-1,-1,-1,-1,-1", 2000: "garbage", 5000: "9,9"}
    for at in sorted(bad, reverse=True):
        text.insert(at, bad[at])
    data = tmp_path / "input.dat"
    data.write_text("\n".join(text) + "\n")
    answers = tmp_path / "answers.txt"
    engine = LinearRoadEngine(answers_path=answers)
    engine.start()
    with open_text(data) as f:
        replay(engine, numbered_lines(f))
    engine.finish()
    assert engine.rejected_lines() == [
        "line 101: input tuple: field 'x' is not an integer: " + bad[100],
        "line 2002: input tuple: expected 15 fields, got 1: garbage",
        "line 5003: input tuple: expected 15 fields, got 2: 9,9",
    ]
    report = validate(data, answers)
    assert report.totals["wrong"] == report.totals["missing"] == 0
    assert len(report.rejected_input) == 3
