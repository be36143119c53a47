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
        # Path("") is the current folder: an unset shell variable checked its *.txt files.
        (["check", ""], "", "an empty input name"),
        (["check", "{f}", " "], "r1(x) c1", "an empty input name"),
        (["check", "{f}"], "# expect: cs=maybe\nr1(x) c1", "must look like cs=true"),
        (["check", "{f}"], "# expect: xs=true\nr1(x) c1", "unknown criterion 'xs'"),
        (["check", "{f}"], "", "holds no history"),
        # isdigit() took '²' for a digit, and int() of it raised ValueError's traceback.
        (["check", "{f}"], "# subwindows: ²\nrQ1[0] cQ1", "must be a whole number"),
        (["check", "{f}"], "# subwindows: 0\nrQ1[0] cQ1", "must be a whole number"),
        # int() refuses more than 4,300 digits with a ValueError: a traceback.
        (["check", "{f}"], f"# subwindows: {'9' * 5000}\nrQ1[0] cQ1", "at most 1,000,000"),
        (["check", "{f}"], "# subwindows: 1000001\nrQ1[0] cQ1", "at most 1,000,000"),
        (["check", "{f}"], f"c1@{'9' * 5000}", "cycle"),
        (["check", "-c", "ws", "{f}"], f"rQ1[{'9' * 5000}] cQ1", "sub-window"),
        (["check", "-c", "ws", "{f}"], f"w{'9' * 5000}[0] c{'9' * 5000}", "slide"),
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


def serial_history(n: int) -> str:
    """``n`` transactions writing one item one after the other: serial order 1..n."""
    return " ".join(f"w{i}(x) c{i}" for i in range(1, n + 1)) + "\n"


def test_text_cuts_a_long_serial_order_short_and_json_keeps_it_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    f = tmp_path / "h.txt"
    f.write_text("# a long run\n" + serial_history(100))
    code, out, err = run(["check", "--format", "text", str(f)], capsys)
    assert code == 0 and err == ""
    assert out.splitlines()[:3] == [
        f"{f}, history 1: a long run",
        "  cs: holds",
        "    operations 200, transactions 100, committed 100",
    ]
    order = " ".join(line.strip() for line in out.splitlines()[3:-1])
    assert order == "serial order (100): 1 2 3 4 5 6 7 8 9 10 ... 85 more ... 96 97 98 99 100"
    assert all(len(line) <= 60 for line in out.splitlines()[3:-1])  # wrapped
    assert any("... 85 more ..." in line for line in out.splitlines())  # not across lines
    assert out.splitlines()[-1] == "1 history, 1 verdict: 1 holds, 0 fail"
    _, out, _ = run(["check", "--format", "json", str(f)], capsys)
    assert json.loads(out)["serial_order"] == [str(i) for i in range(1, 101)]


def test_text_shows_a_cycle_edge_by_edge_and_cuts_a_long_one_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # lines of at most 120 characters: no wrapping here
    f = tmp_path / "h.txt"
    # 1 -> 2 -> ... -> 20 -> 1: each reads y_i that the next one then writes.
    ops = [f"r{i}(y{i}) w{i % 20 + 1}(y{i})" for i in range(1, 21)]
    f.write_text("r1(x) w2(x) c2 w1(x) c1\n---\n" + " ".join(ops + [f"c{i}" for i in range(1, 21)]))
    code, out, _ = run(["check", "--format", "text", str(f)], capsys)
    lines = out.splitlines()
    assert code == 1
    assert lines[1:6] == [
        "  cs: FAILS",
        "    operations 5, transactions 2, committed 2",
        "    cycle (2 edges): 1 -> 2 -> 1",
        "      1 -> 2: conflict on x (r1(x) then w2(x))",
        "      2 -> 1: conflict on x (w2(x) then w1(x))",
    ]
    long = lines[lines.index(f"{f}, history 2") :]
    assert long[3] == (
        "    cycle (20 edges): 1 -> 2 -> 3 -> 4 -> 5 -> 6 -> 7 -> 8 -> 9 -> 10 -> ... 6 more ... "
        "-> 17 -> 18 -> 19 -> 20 -> 1"
    )
    assert len([line for line in long if ": conflict on y" in line]) == 10
    assert "      ... 10 more edges" in long
    assert lines[-1] == "2 histories, 2 verdicts: 0 hold, 2 fail"


def test_text_says_what_each_criterion_found_and_what_the_history_expects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "h.txt"
    f.write_text("# expect: cs=false\nr1(x) c1\n")
    code, out, _ = run(["check", "--format", "text", "-c", "all", "--expect", str(f)], capsys)
    assert code == 1  # the cs verdict differs from the directive
    assert "  cs: holds (expected: fails; DIFFERS)" in out.splitlines()
    assert any(line.startswith("  ws: n/a, ") for line in out.splitlines())
    assert out.splitlines()[-1] == "0 of 1 histories match their '# expect:' verdicts"


def test_text_is_the_default_on_a_terminal_and_json_lines_in_a_pipe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    f = tmp_path / "h.txt"
    f.write_text(serial_history(3))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    _, out, _ = run(["check", str(f)], capsys)
    assert "  cs: holds" in out.splitlines()
    # A pipe, as scripts read it: JSON lines, as before.
    proc = subprocess.run(
        [sys.executable, "-m", "txstream.cli", "check", str(f)], capture_output=True, text=True
    )
    assert proc.returncode == 0 and json.loads(proc.stdout)["serial_order"] == ["1", "2", "3"]


def test_expect_compares_only_the_criteria_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The directive gives cs and csao; a check of cs alone counted csao, which it
    # never judged, as a mismatch: exit 1 and "0 of 1 histories match".
    f = tmp_path / "h.txt"
    f.write_text("# expect: cs=true csao=false\narrival S: 2 1\nw1(x) c1 w2(x) c2\n")
    for criterion in ("cs", "csao", "all"):
        code, out, _ = run(
            ["check", "-c", criterion, "--expect", "--format", "text", str(f)], capsys
        )
        assert code == 0, out
        assert out.splitlines()[-1] == "1 of 1 histories match their '# expect:' verdicts"
    code, out, _ = run(["check", "--expect", "--format", "table", str(f)], capsys)
    assert code == 0 and "1 of 1 histories match" in out
    # A criterion that was checked and differs still counts.
    f.write_text("# expect: cs=false csao=false\narrival S: 2 1\nw1(x) c1 w2(x) c2\n")
    code, out, _ = run(["check", "--expect", "--format", "text", str(f)], capsys)
    assert code == 1 and "  cs: holds (expected: fails; DIFFERS)" in out.splitlines()


def test_a_file_saved_with_a_byte_order_mark_and_crlf_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "h.txt"
    f.write_bytes("\ufeffr1(x) w2(x) c2\r\nw1(x) c1\r\n".encode())
    code, out, err = run(["check", str(f)], capsys)
    assert code == 1 and err == "" and json.loads(out)["holds"] is False


def test_stdin_is_read_once_and_must_be_utf8(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io

    def stdin(data: bytes) -> None:
        monkeypatch.setattr(
            sys, "stdin", io.TextIOWrapper(io.BytesIO(data), errors="surrogateescape")
        )

    # A second '-' found stdin drained: "<stdin>:1:1: the input holds no history".
    stdin(b"r1(x) c1\n")
    code, out, err = run(["check", "-", "-"], capsys)
    assert code == 0 and err == ""
    assert [json.loads(line)["source"] for line in out.splitlines()] == ["<stdin>", "<stdin>"]
    # Bytes that are not UTF-8 were decoded with surrogate escapes, as Python's
    # stdin does in a C locale, and came back as "not an operation ... '\udcff'".
    stdin(b"\xff\xfe r1(x) c1\n")
    code, out, err = run(["check", "-"], capsys)
    assert code == 2 and out == ""
    assert err == "txstream: <stdin> is not UTF-8 text; a history file is plain text\n"


def test_table_prints_names_and_titles_as_they_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # rich read them as markup: "[/]" in a title raised MarkupError's traceback,
    # and "[b]h[i].txt" showed as "h.txt".
    f = tmp_path / "[b]h[i].txt"
    f.write_text("# [/] and [red]x[/red]\nr1(x) c1\n")
    code, out, err = run(["check", "--format", "table", str(f)], capsys)
    assert code == 0 and err == ""
    assert "[b]h[i].txt" in out and "[/] and [red]x[/red]" in out
