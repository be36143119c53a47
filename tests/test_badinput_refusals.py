"""Bad input found by the session-22 sweep: each is refused in one line where it is given.

The command-line cases run ``txstream.cli.main`` in this process (the helpers of
``test_cli_badinput``); none may start its run or leave a file.  Before, each was
accepted: an option the run ignored, a value cut without a word, an output path
whose write replaced a device or a link, a file of another kind validated line by
line.  The API cases are the builder's: each raises at the call that is wrong,
not when the job runs (on Spark: at ``start()``, or in every transaction).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import txstream as tx
from test_cli_badinput import assert_rejected
from txstream.errors import TxStreamError
from txstream.storage.files import write_whole

LR_IN = "0,0,10,1,0,0,0,0,0,0,-1,-1,-1,-1,-1\n"  # one Linear Road position report
LR_RUN = ["linear-road", "run", "--input", "in.dat", "--no-spark", "--out", "o"]
H = ["--history", "h.txt"]

CLI_CASES: list[tuple[list[str], str]] = [
    # options a run ignored
    ([*LR_RUN, "--minutes", "2"], "--minutes only shape a generated input"),
    ([*LR_RUN, "--seed", "3"], "--seed only shape a generated input"),
    (
        ["linear-road", "run", "--tolls", "in.dat", "--L", "0.5", "--no-spark", "--out", "o"],
        "--tolls goes with --input",
    ),
    ([*LR_RUN, "--master", "local[1]"], "--no-spark starts no Spark"),
    (["loading", "run", "--conninfo", "host=x"], "--conninfo goes with --target postgres"),
    (["loading", "run", "--deadlock-timeout-ms", "5"], "goes with --target postgres"),
    (["loading", "run", "--input", "in.dat", "--operations", "5"], "--operations shapes a"),
    (["loading", "run", "--input", "in.dat", "--p", "0.2"], "--input names the operations"),
    (["stress", "--snapshot-updates", "si", *H], "--protocol ss2pl has no such choice"),
    (["windows", "run", "--query", "count:3", "--long-queries", "5"], "--query names the"),
    # values cut or runs of nothing
    (["broadcast", "simulate", "--transactions", "10", "--measured", "20"], "more than --trans"),
    (["broadcast", "simulate", "--objects", "5", "--server-length", "9"], "more than --objects"),
    (["windows", "run", "--duration", "0.1"], "shorter than one sub-window"),
    (["bench", "tm", "--set", "threads=2", "--set", "threads=3"], "--set threads is given twice"),
    (["bench", "loading", "--target", "embedded", "--set", "target=postgres"], "given twice"),
    # a --record that replaced the input or a file of the run
    ([*LR_RUN, "--record", "in.dat"], "is the --input file"),
    ([*LR_RUN, "--record", "o/answers.txt"], "is the run's own answers.txt"),
    ([*LR_RUN, "--record", "o/ckpt/h.txt"], "is the run's own ckpt"),
    # --expect on histories without a directive: exit 0 whatever the verdicts
    (["check", "--expect", "--format", "text", "hist.txt"], "no history has an '# expect:'"),
    (["check", "-c", "csao", "--expect", "--format", "json", "hist.txt"], "directive for csao"),
    # ... and on a mix, the histories without one counted as matching: exit 0 on a failure
    (["check", "--expect", "--format", "text", "mix.txt"], "mix.txt history 2 has no '# exp"),
    (["check", "--expect", "mix.txt", "hist.txt"], "history 2 (and 1 more) has no '# expect:'"),
    # answers files of another kind
    (
        ["linear-road", "validate", "--input", "in.dat", "--answers", "hist.txt"],
        "--answers hist.txt: none of its 2 line(s) is a Linear Road answer",
    ),
    (
        ["linear-road", "validate", "--input", "in.dat", "--expected", "empty.txt"],
        "--expected empty.txt holds no answers",
    ),
]


@pytest.mark.parametrize(("argv", "needle"), CLI_CASES, ids=[" ".join(c[0]) for c in CLI_CASES])
def test_refused_in_one_line_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], needle: str
) -> None:
    monkeypatch.chdir(tmp_path)
    fixtures = {"in.dat": LR_IN, "hist.txt": "r1(x) w2(x) c2 w1(x) c1\nr3(x) c3\n", "empty.txt": ""}
    fixtures["mix.txt"] = "# expect: cs=true\nr1(x) c1\n---\nr1(x) w2(x) c2 w1(x) c1\n"
    for name, text in fixtures.items():
        (tmp_path / name).write_text(text)
    assert_rejected(argv, needle)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(fixtures)  # nothing made
    assert all((tmp_path / n).read_text() == t for n, t in fixtures.items())  # nor changed


# -- output files: the rename replaced what was at the path ------------------------------


def _special(tmp_path: Path, kind: str) -> Path:
    target = tmp_path / "target.txt"
    target.write_text("keep\n")
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(target)
    return path


@pytest.mark.parametrize("kind", ["fifo", "link"])
@pytest.mark.parametrize(
    "argv",
    [
        ["stress", "--transactions", "5", "--history"],
        ["broadcast", "simulate", "--transactions", "5", "--measured", "5", "--history"],
        ["cq", "run", "--seconds", "0.1", "--record"],
    ],
    ids=["stress", "broadcast", "cq"],
)
def test_an_output_file_that_is_a_pipe_or_a_link_is_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], kind: str
) -> None:
    # As root, --history /dev/full left a regular file in place of the device, and
    # --record /dev/stdout replaced the link to /proc/self/fd/1 for every process.
    monkeypatch.chdir(tmp_path)
    path = _special(tmp_path, kind)
    reason = "is a symbolic link" if kind == "link" else "is not a regular file"
    err = assert_rejected([*argv, str(path)], reason)
    assert f"cannot write {'history file ' if argv[0] == 'stress' else ''}{path}" in err, err
    assert path.is_symlink() if kind == "link" else not path.is_file()
    assert (tmp_path / "target.txt").read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([kind, "target.txt"])


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_write_whole_refuses_a_pipe_or_a_link(tmp_path: Path, kind: str) -> None:
    path = _special(tmp_path, kind)
    with pytest.raises(TxStreamError, match=f"cannot write {path}: it is"):
        write_whole(path, "text\n")
    assert path.is_symlink() if kind == "link" else not path.is_file()
    assert (tmp_path / "target.txt").read_text() == "keep\n"


def test_a_refused_record_link_leaves_no_out_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The link was refused in one line, but after --out (and its missing parents) was
    # made: an empty run folder was left behind.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.dat").write_text(LR_IN)
    link = _special(tmp_path, "link")
    argv = [*LR_RUN[:-1], "new/o", "--record", str(link)]
    assert_rejected(argv, "is a symbolic link")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.dat", "link", "target.txt"]


@pytest.mark.parametrize(
    "argv",
    [
        [*LR_RUN, "--tolls", "adir"],
        ["linear-road", "validate", "--input", "in.dat", "--tolls", "adir"],
        ["linear-road", "validate", "--input", "adir"],
    ],
    ids=["run --tolls", "validate --tolls", "validate --input"],
)
def test_a_folder_given_for_a_file_is_called_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    # It said "no such file: adir", which sent the user looking for a typo.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.dat").write_text(LR_IN)
    (tmp_path / "adir").mkdir()
    err = assert_rejected(argv, "adir is a folder; name a file")
    assert f"{argv[argv.index('adir') - 1]} adir" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "in.dat"]


# -- the job builder ---------------------------------------------------------------------


def _fn(t: Any, e: Any) -> None:
    pass


def _job() -> tx.Job:
    return tx.Job("j").table("t", key="k").input("ev", None, keys="k")


API_CASES: list[tuple[str, Callable[[], Any], str]] = [
    ("name not a string", lambda: tx.Job(123), "a job's name is a non-empty string"),
    ("empty name", lambda: tx.Job(" "), "a job's name is a non-empty string"),
    ("empty key", lambda: tx.Job().table("t", key=""), "a column name or a list"),
    ("empty input key", lambda: tx.Job().input("ev", None, keys=""), "a column name or a list"),
    ("empty order", lambda: _job().input("e2", None, keys="k", order=""), "order is a column"),
    ("initial 42", lambda: tx.Job().table("t", key="k", initial=42), "initial is a DataFrame"),
    ("initial .txt", lambda: tx.Job().table("t", key="k", initial="r.txt"), "is not .json"),
    ("initial row", lambda: tx.Job().table("t", key="k", initial=[{"a": 1}]), "lacks key col"),
    ("source 42", lambda: tx.Job().input("ev", 42), "the source is a streaming DataFrame"),
    ("source path", lambda: tx.Job().input("ev", "events/"), "the source is a streaming"),
    ("fn of no args", lambda: _job().on("ev", lambda: None), "needs a function fn(tx"),
    ("fn of one arg", lambda: _job().on("ev", lambda t: None), "needs a function fn(tx"),
    ("fn of 3 args", lambda: _job().on("ev", lambda t, e, x: None), "needs a function fn(tx"),
    ("sink of no args", lambda: _job().output("o").sink("o", lambda: None), "sink(batch_id"),
    ("no trigger", lambda: tx.Job().trigger(), "give one of processingTime"),
    ("two triggers", lambda: tx.Job().trigger(once=True, availableNow=True), "give one of"),
    ("unknown trigger", lambda: tx.Job().trigger(every="5 seconds"), "unknown trigger 'every'"),
    ("once False", lambda: tx.Job().trigger(once=False), "once takes True only"),
    ("interval 5", lambda: tx.Job().trigger(processingTime=5), "an interval such as"),
    ("interval text", lambda: tx.Job().trigger(processingTime="soon"), "an interval such as"),
    ("continuous", lambda: tx.Job().trigger(continuous="1 second"), "commits micro-batches"),
    ("store ''", lambda: _job().on("ev", _fn).run_local([], ""), "an empty path"),
    ("store 5", lambda: _job().on("ev", _fn).run_local([], 5), "a folder path, not 5"),
    ("checkpoint ''", lambda: _job().on("ev", _fn).start(""), "an empty path"),
    ("Delta ''", lambda: tx.DeltaSink(""), "DeltaSink: an empty path"),
    # an empty schema meant "no schema": nothing checked, silently
    ("output schema ''", lambda: _job().output("o", schema=""), "an empty schema declares"),
    ("output schema ' '", lambda: _job().output("o", schema=" "), "an empty schema declares"),
    ("table schema ''", lambda: tx.Job().table("t", key="k", schema=""), "an empty schema"),
    ("pg columns str", lambda: tx.PostgresSink("", "t", "abc"), "columns must be a non-empty list"),  # type: ignore[arg-type]
    ("pg no columns", lambda: tx.PostgresSink("", "t", []), "columns must be a non-empty list"),
    ("pg twice", lambda: tx.PostgresSink("", "t", ["a", "a"]), "a column is named twice"),
    ("pg conninfo", lambda: tx.PostgresSink(5, "t", ["a"]), "conninfo is a string"),  # type: ignore[arg-type]
    ("pg types", lambda: tx.PostgresSink("", "t", ["a"], {"b": "int"}), "types names 'b'"),
    ("pg type", lambda: tx.PostgresSink("", "t", ["a"], {"a": "int; drop"}), "not a SQL type"),
]


@pytest.mark.parametrize(("what", "call", "needle"), API_CASES, ids=[c[0] for c in API_CASES])
def test_the_builder_refuses_at_the_wrong_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str, call: Callable[[], Any], needle: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TxStreamError) as caught:
        call()
    message = str(caught.value)
    assert needle in message and "\n" not in message, message
    assert not any(tmp_path.iterdir()), what  # (an empty store path wrote here)


def test_the_builder_still_takes_what_is_right(tmp_path: Path) -> None:
    class Handler:
        def __call__(self, t: Any, e: Any, extra: int = 0) -> None:
            t.upsert("t", {"k": e["k"], "n": 1})

    job = (
        tx.Job("j")
        .table("t", key="k", initial=[{"k": 0, "n": 0}])
        .input("ev", [], keys=["k"], order="k")
        .on("ev", Handler())
        .output("o")
        .sink("o", lambda batch, rows, *more: None)
    )
    for trigger in ({"processingTime": "200 milliseconds"}, {"availableNow": True}):
        job.trigger(**trigger)
    tx.Job().table("u", key="k", initial="rows.jsonl").table("v", key="k", initial=tmp_path)
    tx.PostgresSink("", "t", ["a", "b"], {"a": "bigint"})
    job.run_local([[("ev", {"k": 1})]], tmp_path / "s")
    assert tx.read_table(tmp_path / "s", "t") == [{"k": 0, "n": 0}, {"k": 1, "n": 1}]
