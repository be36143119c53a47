"""The Linear Road generator and file formats: determinism, content, formats, bad input."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_data import shared_file
from txstream.cli import main
from txstream.errors import TxStreamError
from txstream.linearroad.formats import (
    Answer,
    MalformedTupleError,
    format_answer,
    open_text,
    parse_answer_line,
    parse_input_line,
    parse_toll_line,
)
from txstream.linearroad.generate import generate
from txstream.linearroad.reference import _accidents, expected_frames, read_input


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """L = 1.5 (a half expressway), 12 minutes."""
    g = generate(tmp_path_factory.mktemp("lr"), L=1.5, minutes=12, seed=7)
    return g.input, g.tolls


def test_same_seed_same_files_other_seed_differs(tmp_path: Path) -> None:
    a = generate(tmp_path / "a", L=1, minutes=3, seed=1)
    b = generate(tmp_path / "b", L=1, minutes=3, seed=1)
    c = generate(tmp_path / "c", L=1, minutes=3, seed=2)
    assert a.input.read_bytes() == b.input.read_bytes()
    assert a.tolls.read_bytes() == b.tolls.read_bytes()
    assert a.input.read_bytes() != c.input.read_bytes()
    assert a.density == pytest.approx(a.tuples / 180)


def test_every_line_is_official_format_sorted_by_time(small: tuple[Path, Path]) -> None:
    times = []
    lanes: set[tuple[int, int]] = set()
    with open_text(small[0]) as f:
        for line in f:
            t = parse_input_line(line)
            times.append(t[1])
            if t[0] == 0:
                lanes.add((t[4], t[6]))
    assert times == sorted(times)
    # L = 1.5: expressway 0 both directions, expressway 1 direction 0 only.
    assert lanes == {(0, 0), (0, 1), (1, 0)}


def test_cars_enter_travel_change_segments_and_exit(small: tuple[Path, Path]) -> None:
    trips: dict[int, list[tuple[int, ...]]] = defaultdict(list)
    with open_text(small[0]) as f:
        for line in f:
            t = parse_input_line(line)
            if t[0] == 0:
                trips[t[2]].append(t)
    exited = 0
    for reports in trips.values():
        assert reports[0][5] == 0  # enters on the entrance lane
        assert all(b[1] - a[1] == 30 for a, b in itertools.pairwise(reports))
        if reports[-1][5] == 4:
            exited += 1
            assert len({r[7] for r in reports}) > 1  # changed segments on the way
    assert exited > len(trips) // 10  # many are still on the road when the input ends
    speeds = {r[3] for reports in trips.values() for r in reports}
    assert min(speeds) == 0 and max(speeds) > 60 and len(speeds) > 40


def test_congestion_tolls_accidents_that_clear_and_queries(small: tuple[Path, Path]) -> None:
    e = expected_frames(small[0], tolls_path=small[1])
    assert (e.tolls["Toll"] > 0).sum() > 100
    assert len(e.accidents) > 0
    assert (e.balances["Balance"] > 0).sum() > 0
    assert len(e.expenditures) > 0 and (e.expenditures["Toll"] > 0).mean() > 0.9
    df, _ = read_input(small[0])
    p = df[df["Type"] == 0].copy()
    p["m"] = p["Time"] // 60 + 1
    acc = _accidents(p)
    assert isinstance(acc, pd.DataFrame) and len(acc) >= 2
    assert (acc["m1"] < 12).any()  # at least one accident clears before the end


def test_historical_tolls_cover_every_car_and_day(small: tuple[Path, Path]) -> None:
    vids = set()
    with open_text(small[0]) as f:
        for line in f:
            vids.add(parse_input_line(line)[2])
    seen = defaultdict(set)
    with open_text(small[1]) as f:
        for line in f:
            vid, day, xway, toll = parse_toll_line(line)
            assert 0 <= toll <= 99 and xway in (0, 1)
            seen[vid].add(day)
    assert set(seen) == vids
    assert all(days == set(range(1, 70)) for days in seen.values())


def test_spark_generator_writes_the_same_files(spark: object, tmp_path: Path) -> None:
    from txstream.linearroad.generate_job import generate_spark

    a = generate(tmp_path / "seq", L=1.5, minutes=3, seed=4)
    b = generate_spark(tmp_path / "spark", L=1.5, minutes=3, seed=4, spark=spark)
    assert a.input.read_bytes() == b.input.read_bytes()
    assert a.tolls.read_bytes() == b.tolls.read_bytes()


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("0,1,2,3", "expected 15 fields"),
        ("0,1,x,3,0,0,0,0,0,-1,-1,-1,-1,-1,-1", "'x' is not an integer"),
        ("7,1,2,3,0,0,0,0,0,-1,-1,-1,-1,-1,-1", "unknown tuple type 7"),
        ("0,-1,2,3,0,0,0,0,0,-1,-1,-1,-1,-1,-1", "negative time"),
        ("0,10800,2,3,0,0,0,0,0,-1,-1,-1,-1,-1,-1", "time 10800 beyond the 3-hour"),
        ("0,1,2,3,0,5,0,0,0,-1,-1,-1,-1,-1,-1", "lane 5"),
        ("0,1,2,3,0,0,2,0,0,-1,-1,-1,-1,-1,-1", "direction 2"),
        ("0,1,2,3,0,0,0,1,0,-1,-1,-1,-1,-1,-1", "position 0 is not in segment 1"),
        ("3,1,2,3,0,0,0,0,0,4,-1,-1,-1,-1,70", "day 70"),
    ],
)
def test_malformed_input_says_why(line: str, reason: str) -> None:
    with pytest.raises(MalformedTupleError, match=reason):
        parse_input_line(line)


def test_shared_inputs_parse() -> None:
    with open_text(shared_file("datafile20seconds.dat")) as f:
        assert sum(1 for line in f if parse_input_line(line)) == 280


ints = st.integers(min_value=0, max_value=10**6)


@given(
    st.sampled_from([0, 1, 2, 3, 5]),
    st.lists(ints, min_size=5, max_size=5),
    st.floats(min_value=0, max_value=1e5, allow_nan=False),
)
def test_answer_lines_round_trip(kind: int, values: list[int], emit: float) -> None:
    n = {0: 4, 1: 5, 2: 4, 3: 3, 5: 4}[kind]
    a = Answer(kind, tuple(values[:n]), round(emit, 3))
    b = parse_answer_line(format_answer(a))
    assert b.type == a.type and b.values == a.values
    assert b.emit == pytest.approx(a.emit, abs=1e-3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--L", "0.7"], "L must be a multiple of 0.5"),
        (["--L", "0.3"], "argument --L: must be >= 0.5"),
        (["--minutes", "0"], "argument --minutes: must be >= 1"),
        (["--rate", "99"], "argument --rate: must be >= 0.01 and <= 20"),
    ],
)
def test_cli_generate_bad_values_one_line(
    tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["linear-road", "generate", "--out", str(tmp_path), *args])
    except SystemExit as exc:  # the checked argparse types exit 2 themselves
        code = int(exc.code or 0)
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_generate_prints_density(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["linear-road", "generate", "--out", str(tmp_path), "--minutes", "2"]) == 0
    out = capsys.readouterr().out
    assert "tuples per expressway-second" in out
    assert (tmp_path / "input.dat").is_file() and (tmp_path / "tolls.dat").is_file()


def test_interrupted_generate_leaves_no_input_beside_truncated_tolls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # linear-road run without --input takes an existing DIR/input.dat as finished:
    # Ctrl-C while the tolls were written left a whole input.dat and half a tolls.dat.
    import txstream.linearroad.generate as gen

    whole = gen.historical_tolls

    def interrupted(vids: list[int], *, seed: int) -> Iterator[str]:
        yield from itertools.islice(whole(vids, seed=seed), 100)
        raise KeyboardInterrupt

    monkeypatch.setattr(gen, "historical_tolls", interrupted)
    with pytest.raises(KeyboardInterrupt):
        generate(tmp_path, L=0.5, minutes=1, seed=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    monkeypatch.setattr(gen, "historical_tolls", whole)
    paths = generate(tmp_path, L=0.5, minutes=1, seed=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input.dat", "tolls.dat"]
    assert paths.tolls.read_text().count("\n") > 100


def test_unreadable_file_is_a_txstream_error(tmp_path: Path) -> None:
    with pytest.raises(TxStreamError, match="cannot read"):
        open_text(tmp_path / "missing.dat")


@settings(max_examples=8, deadline=None)
@given(
    st.sampled_from([0.5, 1.0, 1.5]),
    st.integers(1, 2),
    st.integers(0, 10**6),
    st.sampled_from([0.1, 1.0, 3.0]),
)
def test_any_seed_gives_valid_sorted_unique_input(
    L: float, minutes: int, seed: int, rate: float
) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        g = generate(tmp, L=L, minutes=minutes, seed=seed, rate=rate)
        with open_text(g.input) as f:
            rows = [parse_input_line(line) for line in f]
    assert [r[1] for r in rows] == sorted(r[1] for r in rows)
    assert all(r[1] < minutes * 60 for r in rows)
    assert len({(r[1], r[2]) for r in rows if r[0] == 0}) == sum(r[0] == 0 for r in rows)
    qids = [r[9] for r in rows if r[0] != 0]
    assert len(qids) == len(set(qids))
    assert {r[4] * 2 + r[6] for r in rows} <= set(range(int(L * 2)))
