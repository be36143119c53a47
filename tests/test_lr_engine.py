"""The Linear Road engine without Spark: variants, transaction sizes, duplicates, crashes.

Every run is checked by the independent validator (a pandas batch computation)
on generated inputs; the crash test kills a real process with SIGKILL.
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from txstream.cli import main
from txstream.errors import TxStreamError, UnknownNameError
from txstream.linearroad.engine import (
    HistoricalTolls,
    LinearRoadEngine,
    _active,
    _lav,
    _still_needed,
)
from txstream.linearroad.formats import open_text
from txstream.linearroad.generate import generate
from txstream.linearroad.reference import expected_frames
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
    # Rolled back: every account ends as if no entry had been duplicated.
    clean, _ = _run(small, tmp_path)
    assert engine.balance.snapshot() == clean.balance.snapshot()

    # The not-serializable variant charges every duplicate's toll.  Whether a
    # balance query happens to read a doubly charged balance depends on how its
    # threads interleave, so that is not asserted (it was 0 beside a CPU hog).
    engine, report = _run(small, tmp_path, variant="not-serializable", duplicates=2)
    assert engine.rolled_back == 0
    assert report.by_type["toll"].duplicates == injected


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
    deadline = time.time() + 600  # (only against a hang: a loaded machine is slow)
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


def _recorded(small: Path, tmp_path: Path, variant: str) -> tuple[Any, ValidationReport]:
    with open_text(small / "input.dat") as f:
        lines = list(numbered_lines(f))[:6000]  # three minutes: tolls, boundaries
    data = tmp_path / "input.dat"
    data.write_text("".join(raw + "\n" for _, raw in lines))
    engine = LinearRoadEngine(variant=variant, record=True, answers_path=tmp_path / "a.txt")
    engine.start()
    replay(engine, lines)
    engine.finish()
    return engine.history(), validate(data, tmp_path / "a.txt")


def test_recorded_history_of_the_serializable_variant_is_csao(small: Path, tmp_path: Path) -> None:
    history, report = _recorded(small, tmp_path, "serializable")
    assert report.ok, report.totals
    assert len(history) > 10_000
    assert check(history, "cs").holds
    # Serializable in the input's order (line numbers), not just in commit order.
    assert check(history, "csao").holds
    assert len(history.arrivals["input"]) == len(history.committed())


def test_recorded_history_with_wrong_answers_is_not_csao(small: Path, tmp_path: Path) -> None:
    # The arrival order comes from the input's line numbers, never from the
    # order of commits: a notification that read a segment's toll before the
    # minute's toll transaction (earlier in the input) wrote it is a cycle.
    history, report = _recorded(small, tmp_path, "not-serializable")
    assert report.by_type["toll"].wrong > 0
    verdict = check(history, "csao")
    assert not verdict.holds
    if check(history, "cs").holds:
        # conflict-serializable, so only the arrival order can close the cycle
        assert any(e["reason"] == "arrival" for e in verdict.evidence["cycle"]), verdict.evidence
    # (else, about 1 run in 25 here, the cycle found may be of conflicts alone)


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


def _replay_lines(text: list[str], data: Path, answers: Path) -> LinearRoadEngine:
    """Write ``text`` as the input and run the engine over it to the end."""
    data.write_text("\n".join(text) + "\n")
    engine = LinearRoadEngine(answers_path=answers)
    engine.start()
    with open_text(data) as f:
        replay(engine, numbered_lines(f))
    engine.finish()
    return engine


def test_malformed_lines_are_rejected_with_their_reason_and_the_run_goes_on(
    small: Path, tmp_path: Path
) -> None:
    text = (small / "input.dat").read_text().splitlines()
    bad = {100: "0,12,107,x,0,1,0,10,53320,-1,-1,-1,-1,-1,-1", 2000: "garbage", 5000: "9,9"}
    for at in sorted(bad, reverse=True):
        text.insert(at, bad[at])
    data, answers = tmp_path / "input.dat", tmp_path / "answers.txt"
    engine = _replay_lines(text, data, answers)
    assert engine.rejected_lines() == [
        "line 101: input tuple: field 'x' is not an integer: " + bad[100],
        "line 2002: input tuple: expected 15 fields, got 1: garbage",
        "line 5003: input tuple: expected 15 fields, got 2: 9,9",
    ]
    report = validate(data, answers)
    assert report.totals["wrong"] == report.totals["missing"] == 0
    assert len(report.rejected_input) == 3


# -- hand-made inputs: exit-ramp re-entry, the accident-end readings -------------------


def _line(time: int, vid: int, lane: int, seg: int, pos: int, spd: int = 50) -> str:
    return f"0,{time},{vid},{spd},0,{lane},0,{seg},{pos},-1,-1,-1,-1,-1,-1"


def _engine_answers(lines: list[str], **options: Any) -> list[str]:
    engine = LinearRoadEngine(**options)
    engine.start()
    replay(engine, numbered_lines(lines))
    engine.finish()
    return engine.answer_lines


def test_car_back_from_the_exit_ramp_in_the_same_segment_gets_a_toll_notification(
    tmp_path: Path,
) -> None:
    seg = 5 * 5280
    lines = [
        _line(0, 7, 0, 5, seg + 100),  # enters segment 5
        _line(30, 7, 1, 5, seg + 900),
        _line(60, 7, 4, 5, seg + 1800),  # leaves by the exit ramp of segment 5
        _line(400, 7, 0, 5, seg + 100),  # back on the road, segment 5 again
        _line(430, 7, 1, 5, seg + 900),
        _line(460, 7, 4, 5, seg + 1800),  # and off again
    ]
    data = tmp_path / "in.dat"
    data.write_text("".join(line + "\n" for line in lines))
    times = {int(a.split(",")[2]) for a in _engine_answers(lines) if a.startswith("0,")}
    assert times == {0, 400}
    assert set(expected_frames(data).tolls["Time"]) == {0, 400}


def _accident_input(cars: list[tuple[int, int, bool]]) -> list[str]:
    """Cars stopping at one position of segment 10, and probes entering segment 7.

    ``cars``: per car, its first report's time, how many reports it sends from
    the position, and whether it then reports once more elsewhere (moves on).
    One probe car per minute enters segment 7 (3 upstream of 10) at second 45.
    """
    stop = 10 * 5280 + 2000
    rows: list[tuple[int, int, str]] = []
    for vid, (start, n, moves) in enumerate(cars, 1):
        for k in range(n):
            rows.append((start + 30 * k, vid, _line(start + 30 * k, vid, 1, 10, stop, 0)))
        if moves:
            t = start + 30 * n
            rows.append((t, vid, _line(t, vid, 1, 10, stop + 700)))
    for m in range(1, 16):
        t = 60 * (m - 1) + 45
        rows.append((t, 100 + m, _line(t, 100 + m, 1, 7, 7 * 5280 + 10)))
    return [line for _, _, line in sorted(rows)]


def _oracle_minutes(cars: list[tuple[int, int, bool]], reading: str) -> set[int]:
    """The minutes 1-15 in which the accident counts, straight from the definitions."""
    stopped = []
    for start, n, moves in cars:
        if n >= 4:  # the fourth identical report stops the car
            stopped.append((start + 90, start + 30 * (n - 1), start + 30 * n if moves else -1))
    if len(stopped) < 2:
        return set()
    detect = sorted(first for first, _, _ in stopped)[1]
    if reading == "spec":  # through the minute after the last stopped report
        end = max(last for _, last, _ in stopped) // 60 + 2
    else:  # through the minute of the first report, after detection, of a car that moved
        clears = [mv for _, _, mv in stopped if mv >= detect]
        end = min(clears) // 60 + 1 if clears else math.inf
    return {m for m in range(1, 16) if detect // 60 + 2 <= m <= end}


def _two_stay_stopped(cars: list[tuple[int, int, bool]]) -> bool:
    """Whether two cars are still stopped there after the first car that moves has moved."""
    stopped = [
        (start + 90, start + 30 * (n - 1), start + 30 * n if moves else None)
        for start, n, moves in cars
        if n >= 4
    ]
    moves = sorted(m for _, _, m in stopped if m is not None)
    if not moves:
        return False
    clear = moves[0]
    return sum(1 for first, last, m in stopped if (m is None or m > clear) and last >= clear) >= 2


car = st.tuples(st.integers(0, 120), st.integers(2, 12), st.booleans())


@settings(max_examples=25, deadline=None)
@given(st.lists(car, min_size=2, max_size=3), st.sampled_from(["spec", "clear-minute"]))
def test_accident_end_readings_match_brute_force(
    tmp_path_factory: pytest.TempPathFactory, cars: list[tuple[int, int, bool]], reading: str
) -> None:
    cars = [(start + 7 * i, n, moves) for i, (start, n, moves) in enumerate(cars)]
    # Open question, left out here (see docs/linear-road-data.md): when one of
    # three stopped cars moves and two stay stopped at the same place, the engine
    # counts a new accident of the two, the oracle's reading of clear-minute does not.
    assume(reading == "spec" or not _two_stay_stopped(cars))
    lines = _accident_input(cars)
    want = _oracle_minutes(cars, reading)
    got = {
        int(a.split(",")[1]) // 60 + 1
        for a in _engine_answers(lines, accident_end=reading)
        if a.startswith("1,") and int(a.split(",")[6]) > 100
    }
    assert got == want
    data = tmp_path_factory.mktemp("acc") / "in.dat"
    data.write_text("".join(line + "\n" for line in lines))
    acc = expected_frames(data, accident_end=reading).accidents
    assert {t // 60 + 1 for t, v in zip(acc["Time"], acc["VID"], strict=True) if v > 100} == want


def test_the_accident_end_readings_differ() -> None:
    # Car 1 stops from second 0 (stopped at 90) to 330 and moves on at 360; car 2
    # stops from 7 (stopped at 97) to 277 and moves on at 307, clearing the accident.
    cars = [(0, 12, True), (7, 10, True)]
    assert _oracle_minutes(cars, "spec") == {3, 4, 5, 6, 7}  # 330 // 60 + 2 = 7
    assert _oracle_minutes(cars, "clear-minute") == {3, 4, 5, 6}  # 307 // 60 + 1 = 6
    lines = _accident_input(cars)
    for reading in ("spec", "clear-minute"):
        got = {
            int(a.split(",")[1]) // 60 + 1
            for a in _engine_answers(lines, accident_end=reading)
            if a.startswith("1,") and int(a.split(",")[6]) > 100
        }
        assert got == _oracle_minutes(cars, reading)


def test_stops_are_kept_per_position_while_the_accident_lasts() -> None:
    # Car 1's own stop ended at 130 (minute 3), but car 2 keeps the accident going
    # to 500: car 1 still belongs to it (dropping it ended the accident early).
    stops = [[100, 1, 70, 130, 160], [100, 2, 100, 500, -1]]
    assert len(_still_needed(stops, 9, "spec")) == 2
    assert _active(stops, 10, "spec")  # 500 // 60 + 2
    assert _still_needed(stops, 12, "spec") == []
    # clear-minute: car 1 moved at 160, after the detection at 100: cleared in minute 3.
    assert _active(stops, 3, "clear-minute") and not _active(stops, 4, "clear-minute")


def test_no_accident_alert_missed_when_one_car_stays_stopped_longer(tmp_path: Path) -> None:
    # Generated input where one car of an accident stays stopped minutes longer
    # than the other: the engine used to drop the shorter stop and miss the
    # accident's last minutes (27 alerts here; 61 on L=2, 40 minutes).
    g = generate(tmp_path, L=1, minutes=12, seed=2)
    answers = tmp_path / "answers.txt"
    engine = LinearRoadEngine(answers_path=answers)
    engine.start()
    with open_text(g.input) as f:
        replay(engine, numbered_lines(f))
    engine.finish()
    report = validate(g.input, answers)
    assert report.by_type["accident"].expected > 100
    assert report.ok, report.by_type


def test_unknown_accident_end_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(UnknownNameError, match="accident-end"):
        LinearRoadEngine(accident_end="late")
    args = ["linear-road", "run", "--no-spark", "--accident-end", "late", "--out", str(tmp_path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "unknown accident-end reading 'late'" in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())


# -- kill and resume, again and again -------------------------------------------------

_KILLABLE = """
import sys, time
from txstream.linearroad.engine import HistoricalTolls, LinearRoadEngine
from txstream.linearroad.formats import open_text
from txstream.linearroad.replay import numbered_lines, replay
data, out, sync = sys.argv[1], sys.argv[2], sys.argv[3]
engine = LinearRoadEngine(answers_path=out + "/answers.txt", state_dir=out + "/state",
    historical_tolls=HistoricalTolls.from_file(data + "/tolls.dat"), checkpoint_minutes=2,
    sync=sync)
engine.start()
print("resumed", engine.resumed_from, flush=True)
with open_text(data + "/input.dat") as f:
    lines = list(numbered_lines(f))
# Whole minutes per call: a car's two reports of a minute share one ingest run.
for i in range(0, len(lines), 4000):
    batch = lines[i:i + 4000]
    replay(engine, batch, batch=4000)
    if batch[-1][0] > engine.resumed_from:  # new work: leave time for a kill
        time.sleep(0.2)
engine.finish()
print("done", flush=True)
"""


@pytest.mark.parametrize("sync", ["off", "group"])
def test_repeated_sigkill_and_resume_lose_and_repeat_no_answer(
    small: Path, tmp_path: Path, sync: str
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [sys.executable, "-c", _KILLABLE, str(small), str(tmp_path), sync]
    rng = random.Random(sync)
    kills = 0
    for _ in range(20):
        victim = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        assert victim.stdout is not None
        victim.stdout.readline()  # "resumed N": recovery is over, the replay starts
        time.sleep(rng.uniform(0.05, 0.6))
        if victim.poll() is not None:
            break
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        kills += 1
        if kills == 5:
            break
    assert kills >= 3
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = validate(small / "input.dat", tmp_path / "answers.txt", tolls_path=small / "tolls.dat")
    assert report.ok, report.by_type


def test_each_ingest_offset_covers_only_lines_it_took(tmp_path: Path) -> None:
    # A micro-batch spanning a minute boundary with a malformed line after it:
    # the first minute's ingest must not commit an offset beyond the tuples
    # still waiting (a crash then would skip them on resume).
    seg = 5 * 5280
    raw = [_line(t, 1 + t % 7, 1, 5, seg + t) for t in range(40, 80, 2)]
    raw.insert(15, "garbage")  # line 16: after the boundary at second 60 (line 11)
    engine = LinearRoadEngine(state_dir=tmp_path / "state")
    ingests: list[tuple[int, list[int]]] = []
    execute = engine._execute

    def spy(job: Any) -> Any:
        if job.path == "ingest":
            chunk, rejects = job.items
            ingests.append((job.offset, [a[0] for a in chunk] + [r[0] for r in rejects]))
        return execute(job)

    engine._execute = spy  # type: ignore[method-assign]
    engine.start()
    replay(engine, numbered_lines(raw))
    engine.finish()
    assert len(ingests) == 2
    taken: set[int] = set()
    for offset, lines in ingests:
        taken.update(lines)
        assert set(range(1, offset + 1)) <= taken, (offset, sorted(taken))
    assert taken == set(range(1, len(raw) + 1))


def test_a_tuple_out_of_time_order_is_rejected_by_engine_and_validator(
    small: Path, tmp_path: Path
) -> None:
    text = (small / "input.dat").read_text().splitlines()
    late = text[50].split(",")
    late[1] = "0"  # a position report from time 0, far into the input
    text.insert(3000, ",".join(late))
    data, answers = tmp_path / "input.dat", tmp_path / "answers.txt"
    engine = _replay_lines(text, data, answers)
    (line,) = engine.rejected_lines()
    assert line.startswith("line 3001: time 0 is before the previous tuple's time")
    report = validate(data, answers)
    assert report.totals["wrong"] == report.totals["missing"] == 0
    assert [n for n, _, _ in report.rejected_input] == [3001]
