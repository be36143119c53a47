"""Bad command-line input: one line on stderr, exit 2, never a traceback or a hang.

Every case runs the real command line in this process (``txstream.cli.main``),
in a thread with a time limit, so a case that hangs fails instead of stalling
the suite.  The table holds the cases a fault-injection battery found (NaN,
infinities, negative and absurd sizes, ``bench --set`` values of the wrong
type); a sweep over every typed option of every command checks that no numeric
option accepts NaN, an infinity or a negative number; Hypothesis throws
arbitrary text at the numeric options and at the shared type helpers.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import errno
import gzip
import importlib
import io
import json
import math
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txstream.cli import build_parser, main
from txstream.cli.types import BadValueError, json_safe, parse_float, parse_int, path_arg
from txstream.linearroad.generate import generate
from txstream.spark.runtime import StoreError, read_output
from txstream.spark.session import check_master

LIMIT_S = 20.0


def run_cli(argv: list[str], limit: float = LIMIT_S) -> tuple[int, str, str]:
    """``main(argv)`` in a thread: (exit status, stdout, stderr); fails after ``limit`` s."""
    out, err = io.StringIO(), io.StringIO()
    result: list[int] = []
    crash: list[BaseException] = []

    def target() -> None:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                result.append(main(argv))
            except SystemExit as exc:  # argparse errors exit 2 through SystemExit
                result.append(exc.code if isinstance(exc.code, int) else 1)
            except BaseException as exc:  # a traceback is exactly what must not happen
                crash.append(exc)

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(limit)
    if th.is_alive():
        pytest.fail(f"txstream {' '.join(argv)} still running after {limit:g} s (a hang)")
    if crash:
        raise AssertionError(f"txstream {' '.join(argv)} raised {crash[0]!r}") from crash[0]
    return result[0], out.getvalue(), err.getvalue()


def assert_rejected(argv: list[str], needle: str = "") -> str:
    code, out, err = run_cli(argv)
    assert code == 2, f"txstream {' '.join(argv)}: exit {code}, stderr {err!r}"
    assert "Traceback" not in err and "Traceback" not in out
    assert err.strip() and err.count("\n") == 1, f"not one line: {err!r}"
    assert err.startswith("txstream"), err
    assert needle in err, f"{needle!r} not in {err!r}"
    return err


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Run in a temporary folder so no case can leave files in the checkout."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path


H = ["--history", "h.txt"]
FINITE = "must be a finite number"

CASES: list[tuple[list[str], str]] = [
    # stress: the manager used to take nan and fail every later lock wait
    (["stress", "--lock-timeout", "nan", *H], FINITE),
    (["stress", "--lock-timeout", "inf", *H], FINITE),
    (["stress", "--lock-timeout", "0", *H], "must be > 0"),
    (["stress", "--lock-timeout", "-1", *H], "must be > 0"),
    (["stress", "--threads", "1e20", *H], "not an integer"),
    (["stress", "--threads", "100000000000000000000", *H], "<= 256"),
    (["stress", "--threads", "1024", *H], "<= 256"),
    (["stress", "--threads", "-1", *H], ">= 1"),
    (["stress", "--transactions", "-5", *H], ">= 1"),
    (["stress", "--items", "abc", *H], "not an integer"),
    (["stress", "--items", "9" * 5000, *H], "not an integer"),
    (["stress", "--seed", "-1", *H], ">= 0"),
    # broadcast: inf divided by zero, nan hung
    (["broadcast", "simulate", "--op-delay", "inf"], FINITE),
    (["broadcast", "simulate", "--op-delay", "nan"], FINITE),
    (["broadcast", "simulate", "--txn-delay=-inf"], FINITE),
    (["broadcast", "simulate", "--txn-delay", "-1"], ">= 0"),
    (["broadcast", "simulate", "--cache", "nan"], FINITE),
    (["broadcast", "simulate", "--cache", "-1"], ">= 0"),
    (["broadcast", "simulate", "--server-interarrival", "0"], "must be > 0"),
    (["broadcast", "simulate", "--server-read-prob", "1.5"], "<= 1"),
    (["broadcast", "simulate", "--client-update-prob", "nan"], FINITE),
    (["broadcast", "simulate", "--objects", "0"], ">= 1"),
    (["broadcast", "simulate", "--objects", "10000000000"], "<= 5,000"),
    (["broadcast", "simulate", "--transactions", "1e9"], "not an integer"),
    (["broadcast", "simulate", "--object-bytes", "-8"], ">= 1"),
    (["broadcast", "simulate", "--groups", "nan"], "not an integer"),
    (["broadcast", "simulate", "--max-cycles", "0"], ">= 1"),
    (["broadcast", "simulate", "--objects", "5", "--client-length", "6"], "between 1 and"),
    # windows: inf overflowed int()
    (["windows", "run", "--t", "inf"], FINITE),
    (["windows", "run", "--t", "nan"], FINITE),
    (["windows", "run", "--t", "0"], "must be > 0"),
    (["windows", "run", "--n", "1"], ">= 2"),
    (["windows", "run", "--n", "1000000000000"], "<= 10,000"),
    (["windows", "run", "--n", "10000", "--t", "0.01"], "would take hours"),
    (["windows", "run", "--long-queries", "100000"], "<= 1,000"),
    (["windows", "run", "--snapshot-interval", "0.000001"], "snapshot queries"),
    (["windows", "run", "--duration", "inf"], FINITE),
    (["windows", "run", "--duration", "10000000"], "at most 3,600"),
    (["windows", "run", "--n", "100", "--t", "3600"], "takes hours"),
    (["broadcast", "simulate", "--timestamp-bits", "1024"], "<= 64"),
    (
        ["broadcast", "simulate", "--server-interarrival", "1", "--transactions", "2"],
        "did not finish",
    ),
    (["broadcast", "simulate", "--op-delay", "1e14", "--transactions", "2"], "did not finish"),
    (["broadcast", "simulate", "--objects", "5001"], "<= 5,000"),
    (["cq", "run", "--rows", "100000000"], "<= 1,000,000"),
    (["loading", "run", "--operations", "100000000"], "<= 5,000,000"),
    (["stress", "--transactions", "100000000", *H], "<= 1,000,000"),
    (["windows", "run", "--snapshot-interval", "-1"], ">= 0"),
    (["windows", "run", "--m", "0"], ">= 1"),
    (["windows", "run", "--keys", "3"], "--keys go with --spark"),
    (["windows", "run", "--spark"], "--spark needs --out DIR"),
    (["windows", "run", "--spark", "--out", "o", "--record", "h.txt"], "are for the simulation"),
    (["windows", "run", "--spark", "--out", "o", "--master", "nowhere"], "not a Spark master"),
    (
        ["windows", "run", "--spark", "--out", "o", "--keys", "1000", "--duration", "3000"],
        "packets; at most",
    ),
    (["windows", "run", "--long-queries", "-1"], ">= 0"),
    # cq: nan crashed int()
    (["cq", "run", "--seconds", "nan"], FINITE),
    (["cq", "run", "--seconds", "inf"], FINITE),
    (["cq", "run", "--seconds", "-1"], "must be > 0"),
    (["cq", "run", "--seconds", "1e9"], "<= 3,600"),
    (["cq", "run", "--update-rate", "nan"], FINITE),
    (["cq", "run", "--window", "0"], ">= 1"),
    (["cq", "run", "--rows", "-3"], ">= 1"),
    (["cq", "run", "--slide", "abc"], "not an integer"),
    # bench --set: checked against each parameter's declared type and range
    (["bench", "tm", "--set", "threads=-1"], "--set threads=-1: must be >= 1"),
    (["bench", "tm", "--set", "threads=0"], "must be >= 1"),
    (["bench", "tm", "--set", "threads=abc"], "not an integer"),
    (["bench", "tm", "--set", "threads=1e20"], "not an integer"),
    (["bench", "tm", "--set", "threads=100000"], "<= 256"),
    (["bench", "tm", "--set", "sync=fsync"], "not one of: memory, off, group, commit"),
    (["bench", "tm", "--set", "transactions=nan"], "not an integer"),
    (["bench", "tm", "--set", "contention=medium"], "not one of: low, high"),
    (["bench", "runtime", "--quick", "--out", "out[1]"], "use a folder name without []{}*?"),
    (["bench", "tm", "--set", "protocol=nope"], "not one of"),
    (["bench", "tm", "--set", "threads"], "is not PARAM=VALUE"),
    (["bench", "tm", "--set", "nope=1"], "has no parameter nope"),
    (["bench", "tm", "--seed", "-1"], ">= 0"),
    (["bench", "windows", "--set", "t=nan"], FINITE),
    (["bench", "windows", "--set", "n=1"], ">= 2"),
    (["bench", "cq", "--set", "seconds=inf"], FINITE),
    (["bench", "cq", "--set", "window_range=-2"], ">= 0"),
    (["bench", "cq", "--set", "seconds=2e9"], "<= 200"),
    (["bench", "windows", "--set", "n=100000"], "<= 1,000"),
    (["bench", "broadcast", "--set", "x=nan"], FINITE),
    (["bench", "loading", "--set", "k=0"], ">= 1"),
    (["bench", "loading", "--set", "preaggregate=maybe"], "not true or false"),
    (["bench", "loading", "--target", "oracle"], "not one of: postgres, embedded"),
    (["bench", "loading", "--target", ""], "not one of: postgres, embedded"),
    (["loading", "run", "--target", "postgres", "--conninfo", "garbage==="], "cannot connect"),
    (["bench", "linear-road", "--set", "speedup=nan"], FINITE),
    (["bench", "checker", "--set", "operations=-1"], ">= 1"),
    # linear-road: nan crashed int(); only the argument types changed here
    (["linear-road", "generate", "--L", "nan", "--out", "o"], FINITE),
    (["linear-road", "generate", "--L", "inf", "--out", "o"], FINITE),
    (["linear-road", "generate", "--L", "-1", "--out", "o"], ">= 0.5"),
    (["linear-road", "generate", "--L", "0.7", "--out", "o"], "multiple of 0.5"),
    (["linear-road", "generate", "--minutes", "1e9", "--out", "o"], "not an integer"),
    (["linear-road", "generate", "--rate", "nan", "--out", "o"], FINITE),
    (["linear-road", "run", "--L", "nan", "--out", "o"], FINITE),
    (["linear-road", "run", "--speedup", "inf", "--out", "o"], FINITE),
    (["linear-road", "run", "--speedup", "0", "--out", "o"], "must be > 0"),
    (["linear-road", "run", "--inject-duplicates", "-1", "--out", "o"], ">= 0"),
    # linear-road run --master: the JVM exited and PySpark raised a traceback
    (["linear-road", "run", "--master", "bogus", "--out", "o"], "'bogus' is not a Spark master"),
    (["linear-road", "run", "--master", "local[0]", "--out", "o"], "is not a Spark master"),
    # loading
    (["loading", "run", "--sessions", "0"], ">= 1"),
    (["loading", "run", "--sessions", "1e20"], "not an integer"),
    (["loading", "run", "--sessions", "100000"], "<= 256"),
    (["loading", "run", "--grouping", "-1"], ">= 1"),
    (["loading", "run", "--p", "nan"], FINITE),
    (["loading", "run", "--p", "2"], "<= 1"),
    (["loading", "run", "--starvation-ts", "inf"], FINITE),
    (["loading", "run", "--deadlock-timeout-ms", "0"], ">= 1"),
    (["loading", "run", "--operations", "-1"], ">= 0"),
    (["loading", "run", "--spark"], "add --target postgres"),
    (["loading", "run", "--spark", "--on", "cluster"], "cluster"),
    (["loading", "run", "--spark", "--master", "bogus"], "is not a Spark master"),
    (["loading", "run", "--spark", "--target", "postgres", "--on", "both", "--out", "o"], "--out"),
    (["loading", "run", "--on", "executors"], "go with --spark"),
    # check
    (["check", "--subwindows", "nan", "x"], "invalid int value"),
    (["check", "--subwindows", "-1", "x"], "must be at least 1"),
]


@pytest.mark.parametrize(("argv", "needle"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_one_line_and_exit_2(work: Path, argv: list[str], needle: str) -> None:
    assert_rejected(argv, needle)


# -- every numeric option of every command ---------------------------------------------

# The least arguments each subcommand parses with; a new subcommand with typed
# options must be added here (the sweep fails and says so).
BASE: dict[str, list[str]] = {
    "check": ["x.txt"],
    "bench": ["tm"],
    "loading run": [],
    "stress": H,
    "broadcast simulate": [],
    "windows run": [],
    "cq run": [],
    "linear-road generate": ["--out", "o"],
    "linear-road run": ["--out", "o"],
    "linear-road validate": ["--input", "x"],
}

NON_NUMERIC = (path_arg, str)


def typed_options(*types: Any) -> list[tuple[str, str]]:
    """(subcommand path, option) for every option that parses a number (or one of ``types``)."""
    found: list[tuple[str, str]] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, [*path, name])
            elif not action.option_strings:
                continue
            elif action.type in types or (not types and action.type not in (None, *NON_NUMERIC)):
                found.append((" ".join(path), action.option_strings[-1]))

    walk(build_parser(), [])
    return found


OPTIONS = typed_options()
PATH_OPTIONS = typed_options(path_arg, Path)


@pytest.mark.parametrize(("command", "option"), PATH_OPTIONS, ids=map(" ".join, PATH_OPTIONS))
def test_no_path_option_takes_an_empty_path(work: Path, command: str, option: str) -> None:
    # Path("") is the current folder: an unset shell variable wrote results there
    argv = [*command.split(), *BASE[command], option, ""]
    assert_rejected(argv, "an empty path; name a file or folder")


def test_the_path_sweep_sees_the_path_options() -> None:
    assert ("linear-road run", "--out") in PATH_OPTIONS and ("bench", "--out") in PATH_OPTIONS


def test_the_sweep_sees_every_command() -> None:
    commands = {c for c, _ in OPTIONS}
    assert commands <= set(BASE), f"add a BASE entry for {sorted(commands - set(BASE))}"
    assert {"stress", "broadcast simulate", "cq run", "linear-road generate"} <= commands
    assert len(OPTIONS) >= 40


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e999", "-1", "NaN", " nan "])
@pytest.mark.parametrize(("command", "option"), OPTIONS, ids=[f"{c} {o}" for c, o in OPTIONS])
def test_no_numeric_option_takes_nan_infinity_or_negative(
    work: Path, command: str, option: str, value: str
) -> None:
    assert_rejected([*command.split(), f"{option}={value}", *BASE[command]])


# Text that is not a valid value of any numeric option: non-finite, negative,
# absurdly large, or not a number at all.
BAD_TEXT = st.one_of(
    st.sampled_from(["nan", "-nan", "inf", "+inf", "-Infinity", "1e309", "", " ", "0x10"]),
    st.integers(max_value=-1).map(str),
    st.integers(min_value=2**63).map(str),  # above every bound, seeds included
    st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False).map(repr),
    st.floats(min_value=1e16, allow_infinity=False).map(repr),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12).filter(
        lambda t: not _is_number(t)
    ),
)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@settings(max_examples=150, deadline=None)
@given(option=st.sampled_from(OPTIONS), value=BAD_TEXT)
def test_fuzz_numeric_options_reject_bad_values(option: tuple[str, str], value: str) -> None:
    command, name = option
    with tempfile.TemporaryDirectory() as folder, contextlib.chdir(folder):
        assert_rejected([*command.split(), f"{name}={value}", *BASE[command]])


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=20), st.floats().map(repr), st.integers().map(str)))
def test_helpers_return_finite_in_range_values_or_refuse(text: str) -> None:
    try:
        value = parse_float(text, 0.0, 1e6, lo_open=True)
    except BadValueError as exc:
        assert str(exc) and "\n" not in str(exc)
    else:
        assert math.isfinite(value) and 0.0 < value <= 1e6
    try:
        number = parse_int(text, 1, 1000)
    except BadValueError as exc:
        assert str(exc) and "\n" not in str(exc)
    else:
        assert 1 <= number <= 1000


def test_a_huge_integer_is_named_by_its_length_not_printed() -> None:
    with pytest.raises(BadValueError, match="4000-digit number"):
        parse_int(str(10**3999), 1, 10)


# -- validation commands exit non-zero when something was rejected --------------------


def test_loading_input_with_every_line_malformed_is_refused(work: Path) -> None:
    (work / "bad.jsonl").write_text('garbage\n{"relation": "nope", "op": "insert"}\n[1]\n')
    err = assert_rejected(["loading", "run", "--input", "bad.jsonl"], "none of the 3 operations")
    assert "line 1: not JSON" in err
    (work / "empty.jsonl").write_text("\n  \n")
    assert_rejected(["loading", "run", "--input", "empty.jsonl"], "holds no operations")


def test_loading_input_with_some_lines_rejected_exits_1(work: Path) -> None:
    good = {
        "relation": "demand",
        "op": "insert",
        "values": {"custkey": 5, "partkey": 3, "date": 20060911, "quantity": 2, "comment": "x"},
    }
    nan = dict(good, values={**good["values"], "custkey": 6, "quantity": float("nan")})
    (work / "in.jsonl").write_text(f"{json.dumps(good)}\ngarbage\n{json.dumps(nan)}\n")
    code, out, err = run_cli(["loading", "run", "--input", "in.jsonl", "--parts", "10"])
    assert code == 1
    summary = json.loads(out, parse_constant=_no_constant)
    assert summary["operations"] == 1 and summary["rejected"] == 2 and summary["view_ok"]
    assert "nan is not an int" in err and "Traceback" not in err


def test_loading_input_nested_too_deeply_is_a_rejected_line(work: Path) -> None:
    # json.loads raised RecursionError (a traceback) on 100,000 nested brackets.
    (work / "deep.jsonl").write_text("[" * 100_000 + "\n")
    assert_rejected(["loading", "run", "--input", "deep.jsonl"], "line 1: not JSON that can be")
    good = {
        "relation": "demand",
        "op": "insert",
        "values": {"custkey": 5, "partkey": 3, "date": 20060911, "quantity": 2, "comment": "x"},
    }
    (work / "in.jsonl").write_text(json.dumps(good) + "\n" + '{"a": ' * 50_000 + "\n")
    code, out, err = run_cli(["loading", "run", "--input", "in.jsonl", "--target", "embedded"])
    assert code == 1 and json.loads(out)["rejected"] == 1
    assert "nested too deeply" in err and "Traceback" not in err


def test_linear_road_validate_exits_1_when_input_tuples_were_rejected(work: Path) -> None:
    raw = generate(work / "gen", L=0.5, minutes=1, seed=3).input.read_text().splitlines()
    (work / "clean.dat").write_text("\n".join(raw) + "\n")
    code, out, _ = run_cli(["linear-road", "validate", "--input", "clean.dat", "--format", "json"])
    assert code == 0 and json.loads(out)["ok"] is True
    raw.insert(3, "0,1,2")
    (work / "in.dat").write_text("\n".join(raw) + "\n")
    code, out, _ = run_cli(["linear-road", "validate", "--input", "in.dat", "--format", "json"])
    report = json.loads(out)
    assert code == 1 and report["ok"] is False and report["rejected_input"][0]["line"] == 4
    code, out, _ = run_cli(["linear-road", "validate", "--input", "in.dat"])
    assert code == 1 and "1 input tuple(s) rejected: exit status 1" in out


def test_linear_road_run_exits_1_when_input_lines_were_rejected(work: Path) -> None:
    # It printed a valid run and exited 0; /etc/passwd as the input was replayed
    # through the engine line by line into rejected.txt, also with exit 0.
    raw = generate(work / "gen", L=0.5, minutes=1, seed=3).input.read_text().splitlines()
    raw.insert(3, "0,1,2")
    (work / "in.dat").write_text("\n".join(raw) + "\n")
    argv = ["linear-road", "run", "--input", "in.dat", "--no-spark", "--out", "o"]
    code, out, err = run_cli(argv)
    assert code == 1 and "1 input line(s) rejected (o/rejected.txt)" in out, err
    assert "rejected input lines          1" in out and "Traceback" not in err
    (work / "other.txt").write_text("root:x:0:0:root:/root:/bin/bash\n")
    last = _error_line(["linear-road", "run", "--input", "other.txt", "--out", "o2"])
    assert last.endswith("not a Linear Road input") and not (work / "o2").exists()


# -- NaN never reaches JSON --------------------------------------------------------------


def _no_constant(name: str) -> object:
    raise AssertionError(f"{name} in JSON output")


def test_broadcast_summary_is_strict_json(work: Path) -> None:
    code, out, err = run_cli(
        ["broadcast", "simulate", "--transactions", "20", "--measured", "10", "--objects", "20"]
    )
    assert code == 0, err
    json.loads(out, parse_constant=_no_constant)


def test_json_safe_turns_non_finite_numbers_into_null() -> None:
    data = {"a": float("nan"), "b": [1.5, float("inf"), {"c": -float("inf")}], "d": "nan"}
    assert json_safe(data) == {"a": None, "b": [1.5, None, {"c": None}], "d": "nan"}
    json.dumps(json_safe(data), allow_nan=False)


# -- input files cut short, output folders reused ----------------------------------------


def _error_line(argv: list[str]) -> str:
    """Run ``argv``, expect exit 2 and a last stderr line ``txstream: ...``; return it.

    (``linear-road run`` prints progress lines on stderr before the error.)
    """
    code, out, err = run_cli(argv)
    assert code == 2, f"txstream {' '.join(argv)}: exit {code}, stderr {err!r}"
    assert "Traceback" not in err + out
    last = err.strip().splitlines()[-1]
    assert last.startswith("txstream: "), err
    return last


def test_linear_road_run_on_a_truncated_gz_input_is_one_line(work: Path) -> None:
    raw = generate(work / "gen", L=0.5, minutes=1, seed=3).input.read_bytes()
    whole = gzip.compress(raw)
    (work / "cut.dat.gz").write_bytes(whole[: len(whole) // 2])
    last = _error_line(["linear-road", "run", "--input", "cut.dat.gz", "--no-spark", "--out", "o"])
    assert "cannot read cut.dat.gz: Compressed file ended" in last


def test_linear_road_run_no_spark_twice_into_one_out_answers_once(work: Path) -> None:
    # The second run replayed the whole input again: each balance query was
    # answered twice, and validation failed with exit 1.
    generate(work / "gen", L=0.5, minutes=1, seed=3)
    argv = ["linear-road", "run", "--input", "gen/input.dat", "--no-spark", "--out", "o"]
    argv += ["--inject-duplicates", "2"]
    assert run_cli(argv)[0] == 0
    answers = (work / "o" / "answers.txt").read_text()
    # summary.json said "duplicated_reports": 0 (and counted the tuples without
    # them) while the local runner sent the repeats and rolled them all back.
    summary = json.loads((work / "o" / "summary.json").read_text())
    lines = len((work / "gen" / "input.dat").read_text().splitlines())
    repeated = summary["engine"]["rolled_back"]
    assert repeated > 0 and summary["duplicated_reports"] == repeated
    assert summary["tuples"] == lines + repeated
    code, out, err = run_cli(argv)
    assert code == 0, err
    assert "resuming from the checkpoint" in err
    assert "yes: answers, responses are this start's only" in out
    assert (work / "o" / "answers.txt").read_text() == answers
    summary = json.loads((work / "o" / "summary.json").read_text())
    assert summary["resumed"] is True and summary["valid"] is True


@pytest.mark.parametrize(
    "master",
    ["local", "local[1]", "local[*]", "local[2,3]", "local-cluster[2,1,1024]",
     "spark://h1:7077,h2:7077", "yarn", "k8s://https://h:443"],
)  # fmt: skip
def test_check_master_takes_the_masters_spark_takes(master: str) -> None:
    assert check_master(master) == master


@pytest.mark.parametrize(
    ("damaged", "text", "needle"),
    [
        ("run.json", "{bad", "o/run.json is damaged (Expecting"),
        ("run.json", "[1]", "o/run.json is damaged (not a JSON object)"),
        ("started.json", "{}", "o/started.json is damaged (no start time)"),
        ("ckpt/job.json", "{bad", "o/ckpt/job.json: damaged job record"),
        ("ckpt/job.json", "[]", "o/ckpt/job.json: damaged job record (not a JSON object)"),
    ],
)
def test_linear_road_run_on_a_damaged_out_is_one_line(
    work: Path, damaged: str, text: str, needle: str
) -> None:
    # Each of these raised json's (or AttributeError's) traceback.
    generate(work / "gen", L=0.5, minutes=1, seed=3)
    argv = ["linear-road", "run", "--input", "gen/input.dat", "--no-spark", "--out", "o"]
    assert run_cli([*argv, "--no-validate"])[0] == 0
    (work / "o" / damaged).write_text(text)
    assert needle in _error_line(argv)


def test_read_output_of_a_damaged_output_file_names_it(work: Path) -> None:
    generate(work / "gen", L=0.5, minutes=1, seed=3)
    argv = ["linear-road", "run", "--input", "gen/input.dat", "--no-spark", "--out", "o"]
    assert run_cli([*argv, "--no-validate"])[0] == 0
    part = sorted((work / "o" / "ckpt" / "outputs" / "answers").glob("*/*.jsonl"))[0]
    part.write_text(part.read_text()[:10])
    # (the commit marker's checksum of the file catches it before its rows are parsed)
    with pytest.raises(StoreError, match=rf"{part.name}: checksum mismatch"):
        read_output(work / "o" / "ckpt", "answers")


@pytest.mark.parametrize("name", ["empty.dat", "blank.dat", "empty.dat.gz"])
@pytest.mark.parametrize("command", ["validate", "run"])
def test_linear_road_input_without_a_tuple_is_refused(work: Path, name: str, command: str) -> None:
    # validate printed a table of zeros and run wrote no answers, both exit 0.
    (work / "empty.dat").write_text("")
    (work / "blank.dat").write_text("\n   \n")
    (work / "empty.dat.gz").write_bytes(gzip.compress(b""))
    extra = ["--no-spark", "--out", "o"] if command == "run" else []
    assert_rejected(["linear-road", command, "--input", name, *extra], f"{name} holds no input")
    assert not (work / "o").exists()


@pytest.mark.parametrize("engine", ["runtime", "driver"])
def test_linear_road_run_starts_spark_on_the_master_given(
    work: Path, monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    # --engine driver started local[2] whatever --master said.
    import txstream.spark.session as session

    asked: list[str | None] = []

    def no_jvm(*_args: object, master: str | None = None, **_kw: object) -> None:
        asked.append(master)
        raise KeyboardInterrupt  # stops the run before anything needs the session

    monkeypatch.setattr(session, "local_session", no_jvm)
    generate(work / "gen", L=0.5, minutes=1, seed=3)
    variant = "serializable" if engine == "runtime" else "not-serializable"
    argv = ["linear-road", "run", "--input", "gen/input.dat", "--engine", engine]
    code, _, _ = run_cli([*argv, "--variant", variant, "--master", "local[1]", "--out", "o"])
    assert code == 130 and asked == ["local[1]"]


@pytest.mark.parametrize(
    "argv",
    [
        ["stress", "--transactions", "200", "--history", "h.txt"],
        ["windows", "run", "--duration", "10", "--record", "h.txt"],
        ["broadcast", "simulate", "--transactions", "50", "--measured", "10", "--history", "h.txt"],
        ["cq", "run", "--seconds", "0.2", "--update-rate", "100", "--record", "h.txt"],
    ],
    ids=["stress", "windows", "broadcast", "cq"],
)
def test_a_full_disk_leaves_no_history_cut_short(
    work: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    # The history was written in place: a full disk left its first part, which
    # `txstream check` could read as the whole.
    real = Path.write_text

    def disk_full(self: Path, text: str, *args: object, **kw: object) -> int:
        real(self, text[: len(text) // 2])
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_text", disk_full)
    assert_rejected(argv, "cannot write")
    assert not any(p.name.endswith("h.txt") or ".tmp" in p.name for p in work.iterdir())


def _must_not_run(*args: object, **kw: object) -> Any:
    raise AssertionError("the run started")


def _impossible_paths(work: Path) -> dict[str, Path]:
    """Output paths no command can write, by kind (beside :func:`_read_only`)."""
    (work / "afile").write_text("a file\n")
    (work / "adir").mkdir()
    return {
        "under a file": work / "afile" / "out",
        "a folder": work / "adir",
        "a missing folder": work / "no" / "out",
    }


def _read_only(work: Path) -> Path:
    """An existing folder this user cannot write into: one made read-only with
    chmod, or, as root (whom chmod does not stop), a kernel folder nobody can
    create files in."""
    ro = work / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    for folder in (ro, Path("/sys/kernel"), Path("/proc/self")):
        try:
            (folder / f"probe-{os.getpid()}").open("w").close()
        except OSError:
            if folder.is_dir():
                return folder
        else:
            (folder / f"probe-{os.getpid()}").unlink()
    pytest.skip("no folder this user cannot write into")


# The impossible paths for a file option and for a folder option (a folder option
# makes a missing folder, and takes an existing one).
KINDS = {
    "file": ["under a file", "a folder", "a missing folder", "read-only"],
    "folder": ["under a file", "a file", "read-only"],
}
# (argv without the path, the module and name of what runs before the history is written)
HISTORY_OPTIONS: dict[str, tuple[list[str], str, str]] = {
    "stress --history": (["stress", "--history"], "txstream.txn.stress", "run_stress"),
    "windows run --record": (["windows", "run", "--record"], "txstream.windows.sim", "run"),
    "broadcast simulate --history": (
        ["broadcast", "simulate", "--history"],
        "txstream.broadcast.sim",
        "simulate",
    ),
    "cq run --record": (["cq", "run", "--record"], "txstream.cq.workload", "run"),
    "linear-road run --record": (
        ["linear-road", "run", "--input", "in.dat", "--no-spark", "--out", "o", "--record"],
        "txstream.linearroad.run_job",
        "_run_runtime",
    ),
}


@pytest.mark.parametrize("kind", KINDS["file"])
@pytest.mark.parametrize("option", list(HISTORY_OPTIONS))
def test_an_unwritable_history_file_fails_before_the_run(
    work: Path, monkeypatch: pytest.MonkeyPatch, option: str, kind: str
) -> None:
    # The history is written at the end: an impossible path failed after the
    # whole run (its --duration, --transactions, ...), and the run was lost.
    argv, module, name = HISTORY_OPTIONS[option]
    monkeypatch.setattr(importlib.import_module(module), name, _must_not_run)
    (work / "in.dat").write_text("0,0,10,1,0,0,0,0,0,0,-1,-1,-1,-1,-1\n")  # (linear-road)
    paths = _impossible_paths(work)
    path = _read_only(work) / "out" if kind == "read-only" else paths[kind]
    err = assert_rejected([*argv, str(path)], "cannot write ")
    assert str(path) in err, err
    assert (work / "afile").read_text() == "a file\n" and not any((work / "adir").iterdir())


# Every other option that names an output: (argv up to the path, the module and
# name of the work that must not start before the path is known good; whether
# the path is a "file" or a "folder").
LR_RUN_IN = ["linear-road", "run", "--input", "in.dat", "--no-spark"]
OUTPUT_OPTIONS: dict[str, tuple[list[str], str, str, str]] = {
    "linear-road run --out": (
        [*LR_RUN_IN, "--out"],
        "txstream.linearroad.run_job",
        "_run_runtime",
        "folder",
    ),
    "linear-road generate --out": (
        ["linear-road", "generate", "--L", "0.5", "--minutes", "1", "--out"],
        "txstream.linearroad.generate",
        "generate",
        "folder",
    ),
    "bench --out": (
        ["bench", "checker", "--quick", "--no-spark", "--no-progress", "--out"],
        "txstream.bench.checker",
        "EXPERIMENT.run",
        "folder",
    ),
    "windows run --out": (
        ["windows", "run", "--spark", "--out"],
        "txstream.windows.keyed",
        "workload",
        "folder",
    ),
    "loading run --out": (
        ["loading", "run", "--spark", "--on", "driver", "--operations", "10", "--out"],
        "txstream.loading.workloads",
        "demand_stream",
        "folder",
    ),
}
INPUT_OPTIONS = {
    ("loading run", "--input"),
    ("linear-road run", "--input"),
    ("linear-road run", "--tolls"),
    ("linear-road validate", "--input"),
    ("linear-road validate", "--answers"),
    ("linear-road validate", "--tolls"),
    ("linear-road validate", "--expected"),
}


def test_the_output_sweep_sees_every_output_path_option() -> None:
    outputs = {f"{c} {o}" for c, o in PATH_OPTIONS if (c, o) not in INPUT_OPTIONS}
    assert outputs == set(HISTORY_OPTIONS) | set(OUTPUT_OPTIONS), "add it to OUTPUT_OPTIONS"


OUTPUT_CASES = [(o, k) for o, (*_, wants) in OUTPUT_OPTIONS.items() for k in KINDS[wants]]


@pytest.mark.parametrize(("option", "kind"), OUTPUT_CASES, ids=map(" - ".join, OUTPUT_CASES))
def test_an_impossible_output_path_fails_before_the_work(
    work: Path, monkeypatch: pytest.MonkeyPatch, option: str, kind: str
) -> None:
    # linear-road generate computed the whole input before it found it could not
    # write it, and bench --out into a read-only folder ran every point before it
    # wrote the CSV.
    argv, module, name, wants = OUTPUT_OPTIONS[option]
    target: Any = importlib.import_module(module)
    *owners, attr = name.split(".")
    for owner in owners:
        target = getattr(target, owner)
    monkeypatch.setattr(target, attr, _must_not_run)
    (work / "in.dat").write_text("0,0,10,1,0,0,0,0,0,0,-1,-1,-1,-1,-1\n")
    paths = {**_impossible_paths(work), "a file": work / "afile"}
    if kind == "read-only":
        paths[kind] = _read_only(work) / ("out" if wants == "file" else "")
    path = paths[kind]
    err = assert_rejected([*argv, str(path)])
    assert str(path) in err, err
    if kind in ("a file", "under a file"):  # (not "File exists" or "Not a directory")
        assert f"{work / 'afile'} is a file" in err or "it is a file" in err, err
    assert (work / "afile").read_text() == "a file\n" and not any((work / "adir").iterdir())


class _FullDisk:
    """A file whose writes fail as on a full disk: ENOSPC, and no file name in the error."""

    def __init__(self, f: Any) -> None:
        self._f = f

    def write(self, data: Any) -> int:
        if not data:
            return 0
        raise OSError(errno.ENOSPC, "No space left on device")  # (write() names no file)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __enter__(self) -> _FullDisk:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


def _fill_disk_at(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Every file opened for writing whose name holds ``name`` is on a full disk (its
    temporary files too: ``.run.json.tmp-PID``)."""
    real = io.open

    def full_open(file: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        f = real(file, mode, *args, **kw)
        if isinstance(file, (str, Path)) and name in Path(file).name and set(mode) & set("wax+"):
            return _FullDisk(f)
        return f

    monkeypatch.setattr(io, "open", full_open)
    monkeypatch.setattr(builtins, "open", full_open)


LR_GENERATE = ["linear-road", "generate", "--L", "0.5", "--minutes", "1", "--out", "g"]
LR_RUN = ["linear-road", "run", "--input", "gen/input.dat", "--no-spark", "--out", "o"]
LR_DRIVER = [*LR_RUN, "--engine", "driver", "--variant", "not-serializable"]


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (LR_GENERATE, "input.dat.tmp"),
        (LR_GENERATE, "tolls.dat.tmp"),
        (LR_RUN, "run.json"),
        (LR_RUN, "started.json"),
        (LR_RUN, "answers.txt"),
        (LR_RUN, "answers.txt.batches.json.tmp"),
        (LR_RUN, "rejected.txt"),
        (LR_RUN, "summary.json"),
        (LR_RUN, "latency.png"),
        (LR_DRIVER, "answers.txt"),
        (LR_DRIVER, "rejected.txt"),
        (["bench", "checker", "--quick", "--no-spark", "--out", "b"], "checker.csv"),
        (["bench", "checker", "--quick", "--no-spark", "--out", "b"], "checker_time.png"),
    ],
)
def test_a_full_disk_names_the_file_it_could_not_write(
    work: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], name: str
) -> None:
    # A write on a full disk raises an OSError without a file name, which the
    # command line's last resort printed as "cannot access: No space left on device".
    generate(work / "gen", L=0.5, minutes=1, seed=3)
    with (work / "gen" / "input.dat").open("a") as f:
        f.write("not a tuple\n")  # a rejected line, so rejected.txt is not empty
    _fill_disk_at(monkeypatch, name)
    last = _error_line(argv)
    shown = name.removesuffix(".tmp")
    assert re.search(rf"cannot write \S*{re.escape(shown)}: No space left on device", last), last


_TOLLS_GZ = gzip.compress(b"".join(b"%d,1,0,5\n" % vid for vid in range(2000)))


@pytest.mark.parametrize("engine", ["runtime", "driver"])
@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("t.dat", b"1,2,0,4\n1,2,x,4\n", "t.dat:2: historical toll: field 'x' is not an integer"),
        ("t.dat", b"1,2,0,4\n\n1,2,0\n", "t.dat:3: historical toll: expected 4 fields, got 3"),
        ("t.dat", b"1,2,0,4,5\n6,7,0,9,10\n", "t.dat:1: historical toll: expected 4 fields, got 5"),
        ("t.dat", b"1,2,0,4\n1,2,0,4\n1,2,0,4,5\n", "t.dat:3: historical toll: expected 4 fields"),
        ("t.dat", b"1,2,0,4\n1,\xff,0,4\n", "t.dat:2: not ASCII text"),
        ("t.dat.gz", _TOLLS_GZ[: len(_TOLLS_GZ) // 2], "cannot read historical tolls t.dat.gz"),
    ],
    ids=["not-an-integer", "3-fields", "5-fields-everywhere", "5-fields", "not-ascii", "cut-gz"],
)
def test_linear_road_run_checks_the_tolls_before_spark_starts(
    work: Path, monkeypatch: pytest.MonkeyPatch, engine: str, name: str, content: bytes, needle: str
) -> None:
    # The runtime read --tolls on the executors at the first query that needs it
    # (Spark up, the run under way); the driver engine read it with pandas, whose
    # errors named no line (or, five fields on every line, took the first as an index).
    import txstream.spark.session as session

    def no_spark(*_args: object, **_kw: object) -> None:
        raise AssertionError("Spark started before the tolls file was checked")

    monkeypatch.setattr(session, "local_session", no_spark)
    generate(work / "gen", L=0.5, minutes=1, seed=3)
    (work / name).write_bytes(content)
    variant = "serializable" if engine == "runtime" else "not-serializable"
    argv = ["linear-road", "run", "--input", "gen/input.dat", "--tolls", name]
    assert_rejected([*argv, "--engine", engine, "--variant", variant, "--out", "o"], needle)
    assert not (work / "o").exists()


def test_a_resumed_driver_engine_run_says_its_counts_are_this_starts() -> None:
    # The driver engine's summary has "resumed_from_line", not "resumed": its
    # resumed table said "tuples 80224" of a 134,224-line input with no word why.
    from txstream.linearroad.report import summary, table

    data = summary(
        variant="serializable", txn_size="event", lav="spec", speedup=1.0, tuples=80224,
        latencies=[], engine_stats={}, validation=None,
        extra={"resumed_from_line": 54000, "spark": False},
    )  # fmt: skip
    assert "yes: tuples, answers, responses are this start's only" in table(data)
    assert "resumed" not in table({**data, "resumed_from_line": 0})


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--no-spark", "--speedup", "3"], "--speedup paces the Spark replay"),
        (["--engine", "driver", "--partitions", "3"], "--partitions sets the runtime engine's"),
    ],
)
def test_linear_road_run_refuses_an_option_it_would_ignore(
    work: Path, extra: list[str], needle: str
) -> None:
    # Each was accepted and did nothing (found by running every option on fresh inputs).
    argv = ["linear-road", "run", "--L", "0.5", "--minutes", "1", *extra, "--out", "o"]
    assert_rejected(argv, needle)
    assert not (work / "o").exists()
