"""``txstream check`` end to end: output, exit codes, one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from txstream.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_line_per_history_in_input_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "h.txt"
    f.write_text("r1(x) w2(x) c2 w1(x) c1\n---\nr1(x) c1 w2(x) c2\n")
    code, out, err = run(["check", str(f)], capsys)
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 1 and err == ""
    assert [(o["history"], o["criterion"], o["holds"]) for o in lines] == [
        (1, "cs", False),
        (2, "cs", True),
    ]
    assert lines[0]["cycle"] and lines[1]["serial_order"] == ["1", "2"]


def test_exit_zero_when_all_hold(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "h.txt"
    f.write_text("arrival S: 1 2\nw1(S) c1 w2(S) c2\n")
    assert run(["check", "--criterion", "csao", str(f)], capsys)[0] == 0


def test_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO("r1(x) c1"))
    code, out, _ = run(["check", "-"], capsys)
    assert code == 0 and json.loads(out)["holds"] is True


@pytest.mark.parametrize(
    ("args", "text", "needle"),
    [
        (["check", "{f}"], "r1(x) ??", "1:7: not an operation"),
        (["check", "--criterion", "nope", "{f}"], "r1(x) c1", "unknown criterion 'nope'"),
        (["check", "--subwindows", "0", "{f}"], "r1(x) c1", "--subwindows must be at least 1"),
        (["check", "--subwindows", "1000000001", "{f}"], "r1(x) c1", "at most 1,000,000"),
        (["check", "{f}missing"], "", "no such file or folder"),
        (["check", "{f}"], "# expect: cs=maybe\nr1(x) c1", "must look like cs=true"),
        (["check", "{f}"], "", "holds no history"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], text: str, needle: str
) -> None:
    f = tmp_path / "h.txt"
    f.write_text(text)
    code, out, err = run([a.replace("{f}", str(f)) for a in args], capsys)
    assert code == 2 and out == ""
    assert needle in err and err.count("\n") == 1 and err.startswith("txstream: ")


def test_binary_file_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "h.txt"
    f.write_bytes(b"\xff\xfe\x00garbage")
    code, _, err = run(["check", str(f)], capsys)
    assert code == 2 and "not UTF-8" in err


def test_installed_entry_point_prints_no_traceback(tmp_path: Path) -> None:
    f = tmp_path / "h.txt"
    f.write_text("w1(x) c1 w1(y)")
    proc = subprocess.run(
        [sys.executable, "-m", "txstream.cli", "check", str(f)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "already ended transaction 1" in proc.stderr


def test_table_with_expectations_over_the_bundled_examples(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(
        [
            "check",
            "--criterion",
            "all",
            "--format",
            "table",
            "--expect",
            str(ROOT / "examples/histories"),
        ],
        capsys,
    )
    assert "botan-edbt2012.txt" in out
    assert code == 0, out
