"""``txstream broadcast cmatrix`` / ``simulate`` and the broadcast bench experiment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from txstream.bench.broadcast import EXPERIMENT, run_point, tasks
from txstream.bench.registry import get_experiment
from txstream.cli import main
from txstream.model import check, criteria, parse_one


def test_cmatrix_example_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "ex4.txt"
    f.write_text("# Example 4\nw1(ob1) w1(ob2) c1@1 r2(ob1) w2(ob1) c2@2 r3(ob2) w3(ob2) c3@3\n")
    assert main(["broadcast", "cmatrix", str(f)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"objects": ["ob1", "ob2"], "C": [[2, 1], [1, 3]]}


@pytest.mark.parametrize(
    ("text", "extra", "message"),
    [
        ("w1(x) w2(y c2@2\n", [], "not an operation"),
        ("w1(x) c1@3 w2(y) c2@2\n", [], "cycle numbers go backwards"),
        ("r1(z) w1(x) c1@1\n", ["--objects", "x,y"], "'z' does not exist"),
        ("", [], "no history"),
        # the matrix's 64-bit entries overflowed: a traceback
        ("w1(x) c1@99999999999999999999999\n", [], "c1@99999999999999999999999 is too large"),
        ("w1(x) c1@9223372036854775808\n", [], "the largest is 9223372036854775807"),
    ],
)
def test_cmatrix_bad_input(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    text: str,
    extra: list[str],
    message: str,
) -> None:
    f = tmp_path / "h.txt"
    f.write_text(text)
    assert main(["broadcast", "cmatrix", str(f), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("txstream: ") and message in err
    assert err.count("\n") == 1


def test_cmatrix_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["broadcast", "cmatrix", "/nonexistent/h.txt"]) == 2
    assert "cannot access" in capsys.readouterr().err


def test_simulate_writes_a_checkable_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hist = tmp_path / "run.txt"
    args = ["broadcast", "simulate", "--objects", "10", "--object-bytes", "100"]
    args += ["--transactions", "20", "--measured", "10", "--history", str(hist)]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["completed"] == 20 and summary["params"]["algorithm"] == "f-matrix"
    history = parse_one(hist.read_text())
    assert len(history.committed()) > 20
    if "uc" in criteria():
        assert check(history, "uc").holds
        assert main(["check", "--criterion", "uc", str(hist)]) == 0


def test_simulate_bad_algorithm(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["broadcast", "simulate", "--algorithm", "x-matrix"]) == 2
    assert "unknown algorithm 'x-matrix'" in capsys.readouterr().err


def test_bench_experiment_is_registered_and_quick_points_run() -> None:
    exp = get_experiment("broadcast")
    assert exp is EXPERIMENT
    assert len(exp.grid) == 26 * 4 + 6 and len(exp.quick_grid) == 16
    point = {"sweep": "client_txn_length", "x": 2, "algorithm": "r-matrix"}
    row = run_point({**point, "transactions": 40, "measured": 20, "max_reps": 2}, seed=1)
    assert {"response_time", "restarts", "client_txn_length"} <= set(row)
    assert row["client_txn_length"] == 2 and row["replications"] <= 2
    assert [seed for _, seed in tasks(quick=True, seed=2)][:2] == [2_000_006, 2_000_007]
