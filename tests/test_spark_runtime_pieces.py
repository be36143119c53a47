"""The runtime's engine-independent pieces that need no JVM: exactly-once, SQL strings, replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from txstream.errors import TxStreamError
from txstream.spark.batches import ExactlyOnce, MicroBatch
from txstream.spark.sources import TAG, FileReplay
from txstream.spark.sql import case_when, literal


def test_exactly_once_skips_a_batch_id_it_handed_over() -> None:
    seen: list[tuple[int, object]] = []
    driver = ExactlyOnce(lambda b: seen.append((b.id, b._df)))
    for df, batch_id in [("a", 0), ("b", 1), ("a again", 0), ("c", 2), ("c again", 2)]:
        driver(df, batch_id)
    assert seen == [(0, "a"), (1, "b"), (2, "c")]
    assert driver.handled == [0, 1, 2] and driver.skipped == [0, 2]


def test_exactly_once_asks_done_and_retries_a_batch_whose_handler_failed() -> None:
    committed = {5}
    calls: list[int] = []

    def handler(b: MicroBatch) -> None:
        calls.append(b.id)
        if len(calls) == 1:
            raise RuntimeError("crash in the sink")
        committed.add(b.id)

    driver = ExactlyOnce(handler, done=committed.__contains__)
    driver(None, 5)  # committed before a restart: skipped
    with pytest.raises(RuntimeError):
        driver(None, 6)
    driver(None, 6)  # Spark runs the failed batch again: it is not done yet
    driver(None, 6)
    assert calls == [6, 6] and driver.skipped == [5, 6] and committed == {5, 6}


def test_sql_literals_and_case_when() -> None:
    assert literal("field '%s' is \\ odd") == "'field \\'%s\\' is \\\\ odd'"
    assert [literal(None), literal(True), literal(3), literal(1.5)] == ["NULL", "TRUE", "3", "1.5"]
    assert case_when(("x > 1", "'big'"), ("x < 0", "'neg'"), otherwise="'ok'") == (
        "CASE WHEN x > 1 THEN 'big' WHEN x < 0 THEN 'neg' ELSE 'ok' END"
    )
    with pytest.raises(TxStreamError):
        case_when()


def _lines() -> list[tuple[int, str]]:
    # (line number, "time,payload"); line 3 is sent twice (a faulty source).
    return [(1, "0,a"), (2, "1,b"), (3, "2,c"), (3, "2,c"), (4, "bad"), (5, "5,d")]


def _time_of(raw: str, previous: int) -> int:
    try:
        return max(previous, int(raw.split(",")[0]))
    except ValueError:
        return previous


def _replay(source: Path) -> FileReplay:
    replay = FileReplay(_lines, source, speedup=1e6, time_of=_time_of, chunk_seconds=2)
    replay.start()
    replay.join(timeout=120)
    assert not replay.is_alive() and replay.error is None
    return replay


def test_file_replay_writes_tagged_chunks_and_resumes(tmp_path: Path) -> None:
    source = tmp_path / "source"
    replay = _replay(source)
    files = sorted(p.name for p in source.iterdir() if not p.name.startswith("."))
    assert files == ["chunk-0000000.txt", "chunk-0000001.txt", "chunk-0000002.txt"]
    body = [line.split(TAG) for line in (source / "chunk-0000001.txt").read_text().splitlines()]
    assert [(no, raw) for no, _, raw in body] == [("3", "2,c"), ("3", "2,c"), ("4", "bad")]
    assert len({handoff for _, handoff, _ in body}) == 1 and float(body[0][1]) > 0
    assert (replay.handed, replay.repeated, replay.sim_time) == (6, 1, 4)

    # A restart with the same folder skips the chunks already written.
    (source / "chunk-0000002.txt").unlink()
    again = _replay(source)
    assert again.handed == 1 and (source / "chunk-0000002.txt").exists()


def test_file_replay_resumed_with_another_chunk_length_keeps_the_first(tmp_path: Path) -> None:
    # linear-road run derives the chunk length from --speedup: resumed at another
    # speedup, the chunks still to write had the names of chunks written before
    # the restart, were skipped as written, and their lines were lost.
    source = tmp_path / "source"
    lines = [(no, f"{no - 1},x{no}") for no in range(1, 21)]  # one line per second 0..19
    for chunk_seconds, given in ((1, lines[:10]), (2, lines)):  # crash after second 9
        replay = FileReplay(
            lambda given=given: given, source, 1e6, _time_of, chunk_seconds=chunk_seconds
        )
        replay.start()
        replay.join(timeout=120)
        assert replay.error is None
    handed = [
        line.split(TAG)[2] for p in sorted(source.glob("chunk-*.txt"))
        for line in p.read_text().splitlines()
    ]  # fmt: skip
    assert handed == [raw for _, raw in lines]
    (source / ".chunk-seconds").write_text("2x")  # damaged: one line, not a ValueError
    with pytest.raises(TxStreamError, match=r"damaged chunk-length record '2x'"):
        FileReplay(lambda: lines, source, 1e6, _time_of, chunk_seconds=1)


def test_file_replay_reports_an_input_error(tmp_path: Path) -> None:
    def broken() -> list[tuple[int, str]]:
        raise OSError("no such file: input.dat")

    replay = FileReplay(broken, tmp_path / "s", speedup=1.0, time_of=_time_of)
    replay.start()
    replay.join(timeout=120)
    assert isinstance(replay.error, OSError)


def test_warm_up_writes_a_line_zero_marker_and_waits_again_on_a_restart(tmp_path: Path) -> None:
    replay = FileReplay(_lines, tmp_path / "s", speedup=1.0, time_of=_time_of)
    reads = iter([0, 0, 1])
    replay.warm_up(lambda: next(reads), lambda: False)
    marker = tmp_path / "s" / "chunk-warmup.txt"
    assert marker.read_text() == f"0{TAG}0{TAG}warm-up\n"
    assert next(reads, None) is None  # it waited until Spark had read the marker
    # A restart (same folder) used to return at once because the marker was
    # there: the replay then ran ahead of the restarting query, and a resumed
    # Linear Road run at speedup 20 answered everything 50 s late.
    again = FileReplay(_lines, tmp_path / "s", speedup=1.0, time_of=_time_of)
    reads = iter([0, 0, 1])
    again.warm_up(lambda: next(reads), lambda: False)
    assert next(reads, None) is None
    second = tmp_path / "s" / "chunk-warmup-r1.txt"
    assert second.read_text() == marker.read_text()  # a new file: Spark reads it


def test_the_jvms_compile_with_c1_unless_the_caller_sets_java_options() -> None:
    # Settings only: the tests' shared session may have been started by another
    # caller (a benchmark that keeps Java's default compilers).
    from txstream.spark.session import JVM_OPTIONS, _settings

    assert _settings({})["spark.driver.extraJavaOptions"] == JVM_OPTIONS
    assert _settings({})["spark.executor.extraJavaOptions"] == JVM_OPTIONS
    mine = {"spark.executor.extraJavaOptions": "-Xss4m"}
    settings = _settings({"sql_shuffle_partitions": 4, "conf": mine})
    assert settings["spark.sql.shuffle.partitions"] == "4"
    assert settings["spark.executor.extraJavaOptions"] == "-Xss4m"
    assert settings["spark.driver.extraJavaOptions"] == JVM_OPTIONS


def test_arrow_batches_to_python_have_no_byte_limit_unless_the_caller_sets_one() -> None:
    # Spark re-measures a batch under construction for every row while a byte
    # limit is set; Int.MaxValue is the value that switches the check off.
    from txstream.spark.session import _settings

    key = "spark.sql.execution.arrow.maxBytesPerBatch"
    assert _settings({})[key] == str(2**31 - 1)
    assert _settings({"conf": {key: "1m"}})[key] == "1m"
