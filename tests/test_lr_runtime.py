"""Linear Road as a tx.Job on the partitioned runtime, without a JVM.

The job runs in this process through the runtime's local runner (the same
executor, store and commit loop as Spark tasks) on inputs from the project's
generator, and every answer is judged by the independent validator.  The
balance fragments are checked against a single-balance-row oracle
(Hypothesis), the answers sink against crashes, and the recorded histories
with the project's CSAO checker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import txstream as tx
from txstream.linearroad.generate import generate
from txstream.linearroad.runtime_job import AnswersFile, format_answers, rejected_lines, run_local
from txstream.linearroad.txns import LinearRoadTxns, balance_part, combine_balance, tolls_path
from txstream.linearroad.validate import validate
from txstream.model import check


@pytest.fixture(scope="module")
def lr_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("lr")
    generate(folder, L=1.5, minutes=12, seed=11)
    return folder


def _run(folder: Path, out: Path, **kw: Any) -> Any:
    lav = kw.pop("lav", "spec")
    end = kw.pop("accident_end", "spec")
    txns = LinearRoadTxns(lav=lav, accident_end=end, tolls_path=tolls_path(folder / "tolls.dat"))
    answers, sink = run_local(folder / "input.dat", out, txns, **kw)
    return (
        validate(folder / "input.dat", answers, lav=lav, tolls_path=folder / "tolls.dat",
                 accident_end=end),
        sink,
    )  # fmt: skip


def _clean(report: Any) -> None:
    counts = report.by_type
    assert sum(c.expected for c in counts.values()) > 1000
    for kind, c in counts.items():
        assert (c.wrong, c.missing, c.duplicates) == (0, 0, 0), (kind, c)
    assert counts["balance"].expected > 0 and counts["expenditure"].expected > 0


@pytest.mark.parametrize(
    ("size", "lav", "end", "partitions"),
    [
        ("event", "spec", "spec", 4),
        ("event", "raw-mean", "clear-minute", 3),
        ("1s", "spec", "spec", 2),
        ("3s", "spec", "clear-minute", 1),
    ],
)
def test_every_answer_is_right_on_a_generated_input(
    lr_input: Path, tmp_path: Path, size: str, lav: str, end: str, partitions: int
) -> None:
    report, _ = _run(
        lr_input, tmp_path, txn_size=size, lav=lav, accident_end=end, partitions=partitions,
        batch_lines=997,
    )  # fmt: skip
    _clean(report)
    assert report.by_type["accident"].expected > 0


def test_a_rerun_on_the_same_out_resumes_after_the_committed_batches(
    lr_input: Path, tmp_path: Path
) -> None:
    # `linear-road run --no-spark` run again into the same --out (after a crash, or
    # after it finished) replayed the whole input as new batches: every balance
    # query was answered again.  A run over the first 3 batches' lines stands for
    # one that crashed after committing them.
    lines = (lr_input / "input.dat").read_text().splitlines(keepends=True)
    part = tmp_path / "part"
    part.mkdir()
    (part / "input.dat").write_text("".join(lines[:3000]))
    (part / "tolls.dat").write_text((lr_input / "tolls.dat").read_text())
    out = tmp_path / "out"
    _run(part, out, batch_lines=1000)
    report, _ = _run(lr_input, out, batch_lines=1000)
    _clean(report)
    answers = (out / "answers.txt").read_text()
    report, sink = _run(lr_input, out, batch_lines=1000)  # a finished run, again
    _clean(report)
    assert (out / "answers.txt").read_text() == answers and sink.answers == 0


def test_duplicated_reports_have_no_effect_and_the_history_is_csao(
    lr_input: Path, tmp_path: Path
) -> None:
    report, _ = _run(lr_input, tmp_path, duplicate_every=2, record=True, batch_lines=1500)
    _clean(report)
    assert len(tx.read_output(tmp_path / "ckpt", "duplicates")) > 100
    verdict = check(tx.read_history(tmp_path / "ckpt"), "csao")
    assert verdict.holds, verdict.evidence


def test_malformed_and_out_of_order_tuples_are_rejected_with_their_reason(
    lr_input: Path, tmp_path: Path
) -> None:
    lines = (lr_input / "input.dat").read_text().splitlines()
    late = lines[3000].split(",")
    late[1] = "0"  # a position report back at second 0, long after it
    lines.insert(3000, ",".join(late))
    lines.insert(100, "not,a,tuple")
    # A malformed balance query reaches every partition (its type field says 2):
    # it must still be rejected once, not once per partition.
    lines.insert(200, "2,10,5,-1,-1,-1,-1,-1,-1,x7,-1,-1,-1,-1,-1")
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "input.dat").write_text("\n".join(lines) + "\n")
    (folder / "tolls.dat").write_text((lr_input / "tolls.dat").read_text())
    report, _ = _run(folder, tmp_path / "out", partitions=4)
    _clean(report)
    rejected = rejected_lines(tmp_path / "out" / "ckpt")
    assert len(rejected) == 3, rejected
    assert rejected[0].startswith("line 101: input tuple: expected 15 fields, got 3")
    bad = "2,10,5,-1,-1,-1,-1,-1,-1,x7,-1,-1,-1,-1,-1"
    assert rejected[1] == f"line 201: input tuple: field 'x7' is not an integer: {bad}"
    assert rejected[2].startswith("line 3003: ") and "time order" in rejected[2]


def test_a_line_placed_on_fields_its_parse_disagrees_with_is_refused(tmp_path: Path) -> None:
    # Spark places a line by a cheap reading of its fields; should that ever
    # disagree with the parser (exotic white space or digits), the line must be
    # refused with that reason, not run on a partition that does not own its rows.
    from txstream.linearroad.runtime_job import linear_road_job, placement

    good = "0,10,7,30,1,1,0,3,15840,-1,-1,-1,-1,-1,-1"
    row = {"seq": 1, "handoff": 0.0, "raw": good, **placement(good)}
    assert (row["xk"], row["dk"], row["time"], row["everywhere"]) == (1, 0, 10, False)
    job = linear_road_job(LinearRoadTxns())
    job.run_local([[("lines", row), ("lines", {**row, "seq": 2, "xk": 9})]], tmp_path, 4)
    assert rejected_lines(tmp_path) == [f"line 2: fields the partitioning could not read: {good}"]
    assert tx.read_failures(tmp_path) == []


def test_the_answers_sink_writes_each_batch_once_across_a_crash(tmp_path: Path) -> None:
    rows = [{"kind": 0, "text": "0,7,60,@,40,0", "handoff": 1.0, "seq": 1}]
    path = tmp_path / "answers.txt"
    sink = AnswersFile(path, 0.0, clock=lambda: 2.5)
    sink(0, rows)
    sink(0, rows)  # delivered again: skipped
    # A crash after the file was written but before the batch was recorded:
    with path.open("a") as f:
        f.write("0,7,90,3.000,40,0\n")
    again = AnswersFile(path, 0.0, clock=lambda: 3.0)
    again(1, [{"kind": 0, "text": "0,7,90,@,40,0", "handoff": 2.0, "seq": 2}])
    assert path.read_text().splitlines() == ["0,7,60,2.500,40,0", "0,7,90,3.000,40,0"]


@given(
    st.lists(
        st.tuples(st.sampled_from([(0, 0), (0, 1), (1, 0), (2, 1)]), st.integers(0, 300),
                  st.booleans()),
        max_size=25,
    ),
    st.integers(1, 4),
)  # fmt: skip
def test_balance_parts_add_up_to_a_single_balance_row(
    entries: list[tuple[tuple[int, int], int, bool]], partitions: int
) -> None:
    # Oracle: one balance row per car; each entry charges the pending toll and,
    # off the exit lane, leaves its own toll pending.
    balance = pending = 0
    rows: dict[tuple[int, int], dict[str, int]] = {}
    for when, ((x, d), toll, exit_lane) in enumerate(entries):
        balance += pending
        pending = 0 if exit_lane else toll
        row = rows.setdefault((x, d), {"charged": 0, "pending": 0, "last": -1})
        row["charged"] += row["pending"]
        row["pending"], row["last"] = pending, when
    # The runtime: each partition's fragment sums its (xway, dir) rows.
    from txstream.spark.runtime.partitioning import partition_of

    parts = []
    for pid in range(partitions):
        mine = [r for v, r in rows.items() if partition_of(v, partitions) == pid]
        charged, part_pending, last = balance_part(mine)
        parts.append(f"5,100,{charged},{part_pending},{last}")
    assert combine_balance(parts) == (5, 100, balance)


def test_balance_parts_are_combined_per_query_in_the_batch() -> None:
    rows = [
        {"kind": 2, "text": "9,120,10,4,100", "handoff": 1.0, "seq": 5},
        {"kind": 0, "text": "0,3,121,@,30,8", "handoff": 1.0, "seq": 6},
        {"kind": 2, "text": "9,120,7,2,90", "handoff": 1.0, "seq": 5},
    ]
    lines, kinds = format_answers(rows, "1.000")
    assert lines == ["2,120,1.000,120,9,19", "0,3,121,1.000,30,8"]
    assert [k for k, _ in kinds] == [2, 0]
