"""The independent Linear Road validator and reference answers.

Checked three ways: against the independent reference answers of the shared
1800-second input (per-field agreement), against a brute-force oracle on small
random inputs (Hypothesis), and by corrupting correct answers files.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared_data import shared_file
from txstream.cli import main
from txstream.errors import UnknownNameError
from txstream.linearroad.generate import generate
from txstream.linearroad.reference import expected_answers, expected_frames
from txstream.linearroad.validate import compare_expected, validate


def test_agreement_with_independent_reference_on_1800_seconds(tmp_path: Path) -> None:
    ours = tmp_path / "answers.txt"
    lines = expected_answers(
        shared_file("lr-1x-1800s.dat.gz"),
        lav="raw-mean",
        tolls_path=shared_file("lr-1x-1800s.tolls.dat.gz"),
    )
    ours.write_text("".join(line + "\n" for line in lines))
    agreement = compare_expected(ours, shared_file("lr-1x-1800s.expected.gz"))
    assert agreement["malformed"] == 0
    expected_counts = {"toll": 567386, "accident": 8874, "balance": 7676, "expenditure": 1491}
    for name, count in expected_counts.items():
        a = agreement[name]
        assert (a["reference"], a["matched"], a["missing"], a["extra"]) == (count, count, 0, 0)
        for f, v in a["fields"].items():
            assert v["pct"] == 100.0, (name, f, v)


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    g = generate(tmp_path_factory.mktemp("lrv"), L=1, minutes=12, seed=3)
    return g.input, g.tolls, expected_answers(g.input, tolls_path=g.tolls)


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize("lav", ["spec", "raw-mean"])
def test_correct_answers_validate_clean(
    generated: tuple[Path, Path, list[str]], tmp_path: Path, lav: str
) -> None:
    inp, tolls, _ = generated
    lines = expected_answers(inp, lav=lav, tolls_path=tolls)
    kinds = {line[0] for line in lines}
    assert kinds == {"0", "1", "2", "3"}
    r = validate(inp, _write(tmp_path / "a.txt", lines), lav=lav, tolls_path=tolls)
    assert r.ok and r.totals["correct"] == r.totals["expected"] == len(lines)
    assert json.loads(r.to_json())["ok"] is True


def test_lav_definitions_differ_somewhere(generated: tuple[Path, Path, list[str]]) -> None:
    inp, tolls, _ = generated
    spec = expected_frames(inp, lav="spec", tolls_path=tolls).tolls
    raw = expected_frames(inp, lav="raw-mean", tolls_path=tolls).tolls
    assert (spec["LAV"] != raw["LAV"]).any()


def test_wrong_missing_duplicate_answers_are_counted(
    generated: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    inp, tolls, lines = generated
    lines = list(lines)
    tolls_at = [i for i, line in enumerate(lines) if line.startswith("0,")]
    acc_at = [i for i, line in enumerate(lines) if line.startswith("1,")]
    bal_at = [i for i, line in enumerate(lines) if line.startswith("2,")]
    f = lines[tolls_at[5]].split(",")
    f[5] = str(int(f[5]) + 2)  # a wrong toll
    lines[tolls_at[5]] = ",".join(f)
    g = lines[bal_at[0]].split(",")
    g[5] = str(int(g[5]) + 1)  # a wrong balance
    lines[bal_at[0]] = ",".join(g)
    lines.append(lines[acc_at[0]])  # a duplicated accident alert
    del lines[tolls_at[9]]  # a missing toll notification
    lines.append("3,1,0.000,999999,5")  # an answer to a question nobody asked
    r = validate(inp, _write(tmp_path / "a.txt", lines), tolls_path=tolls)
    assert (r.by_type["toll"].wrong, r.by_type["toll"].missing) == (1, 1)
    assert r.by_type["balance"].wrong == 1
    assert r.by_type["accident"].duplicates == 1
    assert r.by_type["expenditure"].wrong == 1
    assert r.totals == {**r.totals, "wrong": 3, "missing": 1, "duplicates": 1}
    assert not r.ok


def test_balance_one_charge_old_is_accepted(
    generated: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    inp, tolls, _ = generated
    e = expected_frames(inp, tolls_path=tolls)
    b = e.balances[e.balances["Balance"] != e.balances["Balance5"]].iloc[0]
    lines = expected_answers(inp, tolls_path=tolls)
    old = f"2,{b.Time},0.000,{b.ResultTime},{b.QID},{b.Balance5}"
    i = lines.index(f"2,{b.Time},0.000,{b.ResultTime},{b.QID},{b.Balance}")
    lines[i] = old
    r = validate(inp, _write(tmp_path / "a.txt", lines), tolls_path=tolls)
    assert r.ok


def test_malformed_input_and_answers_reported_with_line_and_reason(
    generated: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    raw = generated[0].read_text().splitlines()[:300]
    raw.insert(3, "0,1,2")
    raw.insert(10, "0,1,2,3,0,9,0,0,0,-1,-1,-1,-1,-1,-1")
    inp = _write(tmp_path / "in.dat", raw)
    answers = expected_answers(inp)
    answers.insert(0, "0,1,x,0.000,0,0")
    answers.insert(1, "9,1,2")
    r = validate(inp, _write(tmp_path / "a.txt", answers))
    assert [(n, reason) for n, reason, _ in r.rejected_input] == [
        (4, "input tuple: expected 15 fields, got 3"),
        (11, "lane 9 out of range 0-4"),
    ]
    assert [n for n, _ in r.malformed] == [1, 2]
    assert "unknown answer type 9" in r.malformed[1][1]
    assert r.totals["wrong"] == r.totals["missing"] == 0 and not r.ok


def test_official_sample_validates(tmp_path: Path) -> None:
    sample = shared_file("datafile20seconds.dat")
    lines = expected_answers(sample)
    assert sum(line.startswith("0,") for line in lines) == 279
    assert validate(sample, _write(tmp_path / "a.txt", lines)).ok


def test_cli_validate_table_json_and_expected(
    generated: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp, tolls, lines = generated
    ans = _write(tmp_path / "a.txt", lines)
    base = ["linear-road", "validate", "--input", str(inp), "--tolls", str(tolls)]
    assert main([*base, "--answers", str(ans)]) == 0
    assert "expenditure" in capsys.readouterr().out
    assert main([*base, "--expected", str(ans), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["agreement"]["toll"]["fields"]["Toll"]["pct"] == 100.0
    bad = _write(tmp_path / "bad.txt", lines[1:])
    assert main([*base, "--answers", str(bad)]) == 1


def test_cli_validate_exits_1_when_the_reference_disagrees_or_input_was_rejected(
    generated: tuple[Path, Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp, tolls, lines = generated
    base = ["linear-road", "validate", "--input", str(inp), "--tolls", str(tolls)]
    ans = _write(tmp_path / "a.txt", lines)
    assert main([*base, "--answers", str(ans), "--expected", str(ans)]) == 0
    capsys.readouterr()
    # The answers are right for the input, but a reference that differs in one
    # toll (and lacks one answer) must fail the comparison.
    i = next(k for k, line in enumerate(lines) if line.startswith("0,"))
    f = lines[i].split(",")
    changed = [*lines[:i], ",".join([*f[:5], str(int(f[5]) + 2)]), *lines[i + 1 : -1]]
    ref = _write(tmp_path / "ref.txt", changed)
    assert main([*base, "--answers", str(ans), "--expected", str(ref)]) == 1
    assert "2 answer(s) disagree" in capsys.readouterr().out
    assert main([*base, "--answers", str(ans), "--expected", str(ref), "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and not out["agreement_ok"]
    # A rejected input tuple fails the validation even when every answer is right.
    raw = inp.read_text().splitlines()
    bad_input = _write(tmp_path / "in.dat", [*raw, "0,1,2"])
    args = ["linear-road", "validate", "--input", str(bad_input), "--tolls", str(tolls)]
    assert main([*args, "--answers", str(ans)]) == 1
    assert "1 input tuple(s) rejected" in capsys.readouterr().out
    assert main([*args, "--answers", str(ans), "--format", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["answers_ok"] and not out["ok"]
    assert out["rejected_input"] == [
        {"line": len(raw) + 1, "reason": "input tuple: expected 15 fields, got 3", "raw": "0,1,2"}
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lav", "median"], "unknown LAV definition 'median'"),
        (["--format", "xml"], "unknown format 'xml'"),
        (["--answers", "/nonexistent"], "no such file"),
        (["--accident-end", "never"], "unknown accident-end reading 'never'"),
    ],
)
def test_cli_validate_bad_options_one_line(
    generated: tuple[Path, Path, list[str]],
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["linear-road", "validate", "--input", str(generated[0]), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_unknown_names_in_api(generated: tuple[Path, Path, list[str]]) -> None:
    with pytest.raises(UnknownNameError):
        expected_frames(generated[0], lav="median")
    with pytest.raises(UnknownNameError, match="accident-end"):
        expected_frames(generated[0], accident_end="late")


# Brute-force oracle for toll notifications and LAV on small random inputs.

reports = st.lists(
    st.tuples(
        st.integers(0, 5),  # car
        st.integers(0, 12),  # report number (30 s apart, offset by car)
        st.integers(0, 100),  # speed
        st.integers(0, 3),  # segment
        st.integers(0, 5279),  # offset in the segment
        st.sampled_from([1, 2, 3, 4]),  # lane
    ),
    min_size=1,
    max_size=40,
    unique_by=lambda r: (r[0], r[1]),
)


def _round(x: float) -> int:
    return math.floor(x + 0.5)


def _oracle(rows: list[tuple[int, ...]], lav: str) -> list[str]:
    out = []
    last_seg: dict[int, int] = {}
    last_lane: dict[int, int] = {}
    for t in sorted(rows, key=lambda r: (r[1], r[2])):
        _, time, vid, _spd, _x, lane, _d, seg = t[:8]
        # A new segment, or back on the road after the exit lane (a new trip).
        entered = last_seg.get(vid) != seg or last_lane.get(vid) == 4
        if entered and lane != 4:
            m = time // 60 + 1
            window = [r for r in rows if r[7] == seg and m - 5 <= r[1] // 60 + 1 <= m - 1]
            value = 0
            if window and lav == "raw-mean":
                value = _round(sum(r[3] for r in window) / len(window))
            elif window:
                per_minute = defaultdict(lambda: defaultdict(list))
                for r in window:
                    per_minute[r[1] // 60][r[2]].append(r[3])
                means = [
                    sum(sum(s) / len(s) for s in cars.values()) / len(cars)
                    for cars in per_minute.values()
                ]
                value = _round(sum(means) / len(means))
            out.append(f"0,{vid},{time},0.000,{value},0")
        last_seg[vid] = seg
        last_lane[vid] = lane
    return out


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(reports, st.sampled_from(["spec", "raw-mean"]))
def test_toll_notifications_match_brute_force(
    tmp_path: Path, data: list[tuple[int, ...]], lav: str
) -> None:
    rows = []
    for car, k, spd, seg, off, lane in data:
        # Distinct positions per report, so no car is ever stopped (no accidents).
        pos = seg * 5280 + (off + 37 * k) % 5280
        rows.append((0, 30 * k + car, car, spd, 0, lane, 0, seg, pos, -1, -1, -1, -1, -1, -1))
    rows.sort(key=lambda r: (r[1], r[2]))
    inp = _write(tmp_path / "in.dat", [",".join(map(str, r)) for r in rows])
    got = sorted(expected_answers(inp, lav=lav))
    assert got == sorted(_oracle(rows, lav))
