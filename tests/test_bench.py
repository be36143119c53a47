"""The bench harness: grid x repetitions -> CSV + PNG, and the checker benchmark."""

import csv
import warnings
from pathlib import Path
from typing import Any

import pytest

from txstream.bench.checker import generate_history_text
from txstream.bench.harness import Experiment, Figure, run_experiment
from txstream.cli import main
from txstream.errors import TxStreamError, UnknownNameError
from txstream.model import check, parse_one


def toy(point: dict[str, int], seed: int) -> dict[str, float]:
    return {"y": point["x"] * 2 + seed % 3, "z": float(point["x"])}


def test_grid_times_repetitions_written_as_csv_and_png(tmp_path: Path) -> None:
    exp = Experiment(
        name="toy",
        description="",
        grid=[{"x": 1}, {"x": 2}],
        quick_grid=[{"x": 1}],
        run=toy,
        repetitions=3,
        figures=[Figure("toy", x="x", y=("y", "z"), title="toy")],
    )
    rows = run_experiment(exp, tmp_path, progress=False)
    assert len(rows) == 6
    with (tmp_path / "toy.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert [r["x"] for r in table] == ["1", "1", "1", "2", "2", "2"]
    assert {"rep", "seed", "y", "z"} <= set(table[0])
    png = (tmp_path / "toy.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
    assert len(run_experiment(exp, tmp_path / "q", quick=True, progress=False)) == 1


def test_seeds_differ_between_repetitions(tmp_path: Path) -> None:
    exp = Experiment(
        name="s", description="", grid=[{"x": 1}], quick_grid=[], run=toy, repetitions=4
    )
    seeds = [r["seed"] for r in run_experiment(exp, tmp_path, progress=False)]
    assert len(set(seeds)) == 4
    with pytest.raises(TxStreamError, match="nothing to run"):
        run_experiment(exp, tmp_path, quick=True, progress=False)


def test_repetitions_run_in_rounds_and_keep_their_seeds(tmp_path: Path) -> None:
    # A shared host's slow minutes must hit every point alike, not all repetitions
    # of one point: the runs go in rounds; the CSV and the seeds keep the grid's order.
    ran: list[tuple[int, int]] = []

    def record(point: dict[str, Any], seed: int) -> dict[str, Any]:
        ran.append((point["x"], seed))
        return {"y": seed}

    exp = Experiment(
        name="r",
        description="",
        grid=[{"x": 1}, {"x": 2}],
        quick_grid=[],
        run=record,
        repetitions=2,
    )
    rows = run_experiment(exp, tmp_path, progress=False)
    assert [x for x, _ in ran] == [1, 2, 1, 2]
    assert [(r["x"], r["rep"]) for r in rows] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert [r["seed"] for r in rows] == [0, 7919 + 1, 2, 7919 + 3]
    assert all(r["y"] == r["seed"] for r in rows)


def test_same_seed_gives_points_that_differ_only_there_one_seed(tmp_path: Path) -> None:
    # Golab et al. 5.1: the four schedulers run on an identical workload, so a
    # scheduler must not change the seed; a new repetition still draws a new one.
    exp = Experiment(
        name="same",
        description="",
        grid=[{"n": n, "s": s} for n in (1, 2) for s in ("a", "b")],
        quick_grid=[],
        run=lambda point, seed: {"y": seed},
        repetitions=2,
        same_seed=("s",),
    )
    rows = run_experiment(exp, tmp_path, progress=False)
    seeds = {(r["n"], r["s"], r["rep"]): r["seed"] for r in rows}
    assert seeds == {
        (1, "a", 0): 0, (1, "b", 0): 0, (1, "a", 1): 7920, (1, "b", 1): 7920,
        (2, "a", 0): 4, (2, "b", 0): 4, (2, "a", 1): 7924, (2, "b", 1): 7924,
    }  # fmt: skip


def test_every_windows_scheduler_of_a_repetition_gets_the_same_seed(tmp_path: Path) -> None:
    from dataclasses import replace

    from txstream.bench.windows import EXPERIMENT

    exp = replace(EXPERIMENT, run=lambda point, seed: {"y": seed}, figures=[])
    by_case: dict[tuple[Any, ...], set[int]] = {}
    for r in run_experiment(exp, tmp_path, progress=False):
        by_case.setdefault((r["workload"], r["t"], r["n"], r["rep"]), set()).add(r["seed"])
    assert len(by_case) == 30 * 3
    assert all(len(seeds) == 1 for seeds in by_case.values())
    assert len({s for seeds in by_case.values() for s in seeds}) == 30 * 3


def test_generated_history_has_the_asked_size() -> None:
    h = parse_one(generate_history_text(10_000, seed=3))
    assert 9_000 <= len(h) <= 10_000
    assert len(h.transactions()) == 1_000
    assert check(h, "cs").evidence["committed"] > 900


def test_bench_checker_quick_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "checker", "--quick", "--no-progress", "--out", str(tmp_path)]) == 0
    with (tmp_path / "checker.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["operations"]) for r in rows] == [10_000, 100_000]
    assert all(float(r["check_s"]) > 0 and float(r["peak_mb"]) >= 0 for r in rows)
    assert (tmp_path / "checker_time.png").exists() and (tmp_path / "checker_memory.png").exists()


def test_unknown_experiment_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "nope"]) == 2
    assert "unknown experiment 'nope'" in capsys.readouterr().err
    with pytest.raises(UnknownNameError):
        from txstream.bench.registry import get_experiment

        get_experiment("nope")


def test_plot_survives_rounding_in_min_max_bars(tmp_path: Path) -> None:
    # The mean of three equal floats can land a hair above their max.
    rows = [{"x": 1, "y": 0.1 + 0.2}, {"x": 1, "y": 0.3}, {"x": 1, "y": 0.1 + 0.2}]
    from txstream.bench.harness import plot

    plot(rows, Figure("r", x="x", y="y", title="r"), tmp_path / "r.png")
    assert (tmp_path / "r.png").exists()


def test_a_figure_without_points_says_so_without_warnings(tmp_path: Path) -> None:
    # `--only` can leave a figure's points out (no offered-load rows for the
    # latency-load figure): matplotlib warned about an empty legend
    from txstream.bench.harness import plot

    rows = [{"x": 1, "y": None, "s": "a"}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot(rows, Figure("r", x="x", y="y", title="r", series="s"), tmp_path / "r.png")
    assert (tmp_path / "r.png").exists()


def test_set_overrides_a_parameter_and_unknown_ones_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    args = ["bench", "windows", "--quick", "--no-progress", "--out", str(tmp_path)]
    assert main([*args, "--set", "queries=5"]) == 0
    rows = list(csv.DictReader((tmp_path / "windows.csv").open()))
    assert rows and {r["queries"] for r in rows} == {"5"}
    assert main([*args, "--set", "nope=1"]) == 2
    assert "has no parameter nope" in capsys.readouterr().err


def test_a_mapper_runs_the_same_points_with_the_same_seeds(tmp_path: Path) -> None:
    calls: list[int] = []

    def mapper(fn: Any, items: list[Any]) -> list[Any]:  # what Spark's run_points does
        calls.append(len(items))
        return [fn(item) for item in reversed(items)][::-1]

    exp = Experiment(
        name="m",
        description="",
        grid=[{"x": 1}, {"x": 2}],
        quick_grid=[],
        run=lambda point, seed: {"y": point["x"] * 10 + seed % 7},
        repetitions=2,
    )
    plain = run_experiment(exp, tmp_path / "a", progress=False)
    mapped = run_experiment(exp, tmp_path / "b", progress=False, mapper=mapper)
    assert plain == mapped and calls == [4]


def test_summary_is_written_beside_the_csv(tmp_path: Path) -> None:
    exp = Experiment(
        name="toy",
        description="",
        grid=[{"x": 1}, {"x": 2}],
        quick_grid=[],
        run=toy,
        repetitions=1,
        summarize=lambda rows: f"largest x: {max(r['x'] for r in rows)}",
    )
    run_experiment(exp, tmp_path, progress=False)
    assert (tmp_path / "toy-summary.md").read_text() == "largest x: 2\n"


def test_linear_road_summary_names_the_largest_speedup_meeting_5_seconds() -> None:
    from txstream.bench.linearroad import summarize

    def row(variant: str, speedup: float, worst: float, behind: int = 0) -> dict[str, Any]:
        return {
            "sweep": "speedup", "input": "shared", "variant": variant, "speedup": speedup,
            "max_response_s": worst, "fell_behind": behind,
            "meets_5s": int(worst <= 5 and not behind), "wrong_tolls": 7, "missing_accidents": 1,
            "mean_response_s": 1.0,
        }  # fmt: skip

    rows = [
        row("serializable", 3, 2.5),
        row("not-serializable", 3, 2.0),
        {**row("adhoc", 3, 3.25), "gate_wait_s": 4.5, "wrong_tolls": 0, "missing_accidents": 0},
        row("serializable", 4, 6.1),
        row("not-serializable", 4, 4.2),
        row("serializable", 5, 70.0, behind=1),
        row("not-serializable", 5, 65.0, behind=1),
    ]
    text = summarize(rows)
    assert "| serializable | 3 | L = 3 at 867 tuples per expressway-second" in text
    assert "| not-serializable | 4 |" in text
    assert "| adhoc | 3 |" in text
    assert "| 3 | 1.00 | 1.00 | 1.00 |" in text  # mean responses
    assert "| 3 | 2.50 | 2.00 | +0.50 s | 3.25 | 4.5 | 7 / 1 | 0 / 0 |" in text
    behind = "| 5 | 70.00 (fell behind) | 65.00 (fell behind) | +5.00 s | - | 0.0 "
    behind += "| fell behind | - |"
    assert behind in text


def test_only_keeps_the_chosen_points_and_names_bad_choices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from txstream.bench.harness import select_points

    exp = Experiment(
        name="toy",
        description="",
        grid=[{"x": 1, "s": "a"}, {"x": 2, "s": "a"}, {"x": 2, "s": "b"}],
        quick_grid=[{"x": 1, "s": "a"}],
        run=toy,
    )
    assert select_points(exp, ["x=2", "s=b"]).grid == [{"x": 2, "s": "b"}]
    assert select_points(exp, ["s=a", "s=b", "x=2"]).grid == exp.grid[1:]
    with pytest.raises(TxStreamError, match="leaves no point"):
        select_points(exp, ["x=3"])
    with pytest.raises(TxStreamError, match="has no parameter y"):
        select_points(exp, ["y=1"])
    args = ["bench", "windows", "--quick", "--no-progress", "--out", str(tmp_path)]
    assert main([*args, "--only", "nope=1"]) == 2
    assert "has no parameter nope" in capsys.readouterr().err


def test_the_collector_is_paused_during_a_task_and_back_after() -> None:
    import gc

    from txstream.spark.runtime.tasks import collector_paused

    assert gc.isenabled()
    try:
        with collector_paused():
            assert not gc.isenabled()
            with collector_paused():  # nested: still paused inside, paused after
                pass
            assert not gc.isenabled()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
        with pytest.raises(ValueError), collector_paused():
            raise ValueError("a task that fails")
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()


def test_cyclic_garbage_of_a_paused_task_is_collected_not_frozen() -> None:
    import gc
    import weakref

    from txstream.spark.runtime.tasks import collector_paused

    class Row(dict[str, object]):
        pass

    try:
        with collector_paused():
            row = Row()
            row["self"] = row  # a cycle: reference counting alone never frees it
            alive = weakref.ref(row)
            del row
            assert alive() is not None  # the collector is paused
        assert alive() is None, "the batch's cyclic garbage was frozen instead of collected"
    finally:
        gc.unfreeze()
        gc.enable()


def test_nested_pauses_collect_once_at_the_outer_end() -> None:
    import gc
    import weakref

    from txstream.spark.runtime.tasks import collector_paused

    class Row(dict[str, object]):
        pass

    try:
        with collector_paused():
            with collector_paused():
                row = Row()
                row["self"] = row
                alive = weakref.ref(row)
                del row
            # the inner end neither collected nor froze: the outer one decides
            assert alive() is not None
            assert not gc.isenabled()
        assert alive() is None
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()


def test_runtime_feed_writes_the_rendered_events_stamped_when_sent(tmp_path: Path) -> None:
    import json

    from txstream.bench.ledger import events
    from txstream.bench.runtime import _feed, _render

    stream = list(events(50, 100, 10, seed=3))
    files = _render(stream, chunk=20)
    assert len(files) == 3
    for name in ("deposits", "transfers"):
        (tmp_path / name).mkdir()
    started: list[float] = []
    _feed(tmp_path, files, rate=10_000, chunk=20, started=started, first=4)
    got: dict[str, list[dict[str, Any]]] = {"deposits": [], "transfers": []}
    for name in got:
        names = sorted(p.name for p in (tmp_path / name).iterdir())
        assert names == ["part-000004.json", "part-000005.json", "part-000006.json"]
        for part in names:
            got[name] += [
                json.loads(line)
                for line in (tmp_path / name / part).read_text().split("\n")
                if line
            ]
    for name in got:
        sent = [e.pop("sent") for e in got[name]]
        assert all(isinstance(s, float) and s >= started[0] for s in sent)
        assert got[name] == [e for n, e in stream if n == name]


def test_runtime_steady_rate_is_the_commit_rate_without_the_drain(tmp_path: Path) -> None:
    import os

    from txstream.bench.runtime import _marker, _steady

    (tmp_path / "txstream" / "commits").mkdir(parents=True)
    # 30,000 events every 0.5 s (60,000/s), then the drain: a batch 2 s later
    timed = [{"batchId": b, "numInputRows": 30_000} for b in range(3, 13)]
    timed.insert(4, {"batchId": 99, "numInputRows": 0})  # an empty batch counts for nothing
    times = {b: 1000.0 + 0.5 * (b - 3) for b in range(3, 12)} | {12: 1006.5, 99: 1001.7}
    for b, t in times.items():
        _marker(tmp_path, b).write_text("{}")
        os.utime(_marker(tmp_path, b), (t, t))
    assert _steady(tmp_path, timed) == 60_000
    assert _steady(tmp_path, timed[:3]) is None  # too few batches to tell a rate
    _marker(tmp_path, 7).unlink()  # the driver engine writes no commit markers
    assert _steady(tmp_path, timed) is None


def test_runtime_summary_checks_the_goals_on_the_right_rows() -> None:
    from txstream.bench.runtime import FLOOD, LOAD, ONE_K, SWEEP, summarize

    def row(
        engine: str, master: str, cross: int, rate: int, tps: int, p99: float, **more: Any
    ) -> dict[str, Any]:
        return {
            "engine": engine,
            "master": master,
            "cross_partition_pct": cross,
            "rate": rate,
            "txn_per_s": tps,
            "steady_txn_per_s": tps + 1_000 if rate < FLOOD else None,
            "p99_latency_s": p99,
            "max_latency_s": p99,
            "errors": 0,
            **more,
        }

    uniform = {"pattern": "uniform"}
    rows = [
        row("executors", "local[1]", 0, FLOOD, 40_000, 9.0),
        row("executors", "local[2]", 0, FLOOD, 60_000, 8.0),
        # two more repetitions of that point (`bench --reps 3`): the median counts
        row("executors", "local[2]", 0, FLOOD, 20_000, 8.0, rep=1),
        row("executors", "local[2]", 0, FLOOD, 80_000, 8.0, rep=2),
        row("executors", "local[2]", 0, LOAD, 49_500, 1.5),
        row("executors", "local[2]", 0, SWEEP[0], 38_000, 0.9),
        row("executors", "local[2]", 10, LOAD, 49_500, 2.5),
        row("executors", "local[2]", 10, FLOOD, 30_000, 9.0),
        row("driver", "local[2]", 10, FLOOD, 15_000, 9.0),
        row("executors", "local[1]", 0, FLOOD, 30_000, 9.0, **uniform, partitions=1),
        row("executors", "local[2]", 0, FLOOD, 57_000, 9.0, **uniform, serial_share=0.0),
        # another setup, not the one the ratios are about
        row(
            "executors",
            "local[2]",
            0,
            FLOOD,
            99_000,
            9.0,
            **uniform,
            partitions=8,
            serial_share=0.02,
        ),
        row("executors", "local[2]", 0, FLOOD, 90_000, 9.0, **uniform, cross_mode="defer"),
        row(
            "executors",
            "local[2]",
            0,
            FLOOD,
            47_000,
            9.0,
            **uniform,
            partitions=32,
            serial_share=0.06,
        ),
        row("executors", "local[2]", 0, FLOOD, 44_000, 9.0, **uniform, accounts=ONE_K),
        row(
            "executors",
            "local[2]",
            0,
            FLOOD,
            50_000,
            9.0,
            pattern="zipf",
            skew=0.8,
            serial_share=0.2,
            hot_floor=0.25,
        ),
        row(
            "executors",
            "local[2]",
            0,
            FLOOD,
            54_000,
            9.0,
            **uniform,
            audit_every=1000,
            audits=300,
            audit_violations=2,
            note="something to say",
        ),
    ]
    text = summarize(rows)
    assert "local[2] / local[1] at cross 0: 1.50x (60,000 / 40,000; goal 1.5x: met)" in text
    assert "local[2] / local[1] at uniform: 1.90x (57,000 / 30,000; goal 1.5x: met)" in text
    assert "uniform / cross 0 (100k accounts): 0.95x (57,000 / 60,000; goal 0.9x: met)" in text
    assert "uniform with 1k accounts / cross 0 (100k): 0.73x" in text
    assert "zipf 0.8 / cross 0: 0.83x" in text
    assert "audit every 1,000 events / without: 0.95x (54,000 / 57,000" in text
    assert "forward / defer 0.63x (57,000 / 90,000)" in text
    assert "audits: 300 in 1 runs, 2 violations (goal 0)" in text
    assert "P=2: 0.0%, P=8: 2.0%, P=32: 6.0% (goal at most 5.0%: not met)" in text
    assert "zipf 0.8 100k: P=2: 20.0% (hot floor 25.0%)" in text
    assert "local[2] P=2, uniform 100k +audit/1000: something to say" in text
    assert "executors / driver engine at 10% cross: 2.00x" in text
    # the goal is judged on the steady commit rate, which the drain does not lower
    assert "0% cross: 50,500 txn/s steady (49,500 overall), p99 1.5 s: goal" in text
    assert "p99 1.5 s: goal 50,000 txn/s with p99 under 2 s met" in text
    assert "p99 2.5 s: goal 50,000 txn/s with p99 under 2 s not met" in text
    assert "39,000 txn/s steady (38,000 overall), p99 0.9 s: goal 50,000 txn/s" in text
    assert text.count("not met") == 4  # 39,000 too few, 2.5 s too late, 0.73x, 6%
    # every offered-load point, the lower ones first
    lower = text.index(f"at {SWEEP[0]:,} events/s offered, 0% cross")
    assert lower < text.index(f"at {LOAD:,} events/s offered")
    assert f"at {FLOOD:,}" not in text
    assert "errors in all runs: 0" in text


def test_ledger_cross_pattern_is_todays_stream_at_two_partitions() -> None:
    import hashlib
    import json

    from txstream.bench.ledger import events

    # digests of the stream before the patterns existed (main at ef80880)
    for args, digest in [
        ((3000, 100, 10, 3), "74d9f95a29d41775"),
        ((2000, 7, 50, 1), "a562e80225cb4499"),
    ]:
        got = hashlib.sha256(json.dumps(list(events(*args))).encode()).hexdigest()[:16]
        assert got == digest


def _transfers(stream: list[Any]) -> list[dict[str, Any]]:
    return [e for name, e in stream if name == "transfers"]


def test_ledger_cross_share_holds_on_any_partitions() -> None:
    from txstream.bench.ledger import events
    from txstream.spark.runtime.partitioning import partition_of

    for parts in (2, 3, 8, 32):
        for pct in (0, 10, 100):
            moves = _transfers(list(events(4000, 1000, pct, seed=7, partitions=parts)))
            crossing = sum(
                partition_of(t["src"], parts) != partition_of(t["dst"], parts) for t in moves
            )
            assert crossing / len(moves) == pytest.approx(pct / 100, abs=0.03), (parts, pct)


def test_ledger_uniform_crosses_one_minus_one_over_p_and_never_to_itself() -> None:
    from txstream.bench.ledger import events
    from txstream.bench.runtime import schedule_metrics

    stream = list(events(6000, 100_000, 0, seed=2, pattern="uniform"))
    assert all(t["src"] != t["dst"] for t in _transfers(stream))
    for parts in (2, 8, 32):
        share = schedule_metrics(stream, parts, 72_000)["cross_share"]
        assert share == pytest.approx(1 - 1 / parts, abs=0.03)
    # the partitions the input is made for do not change a uniform input
    assert list(events(500, 1000, 0, 2, pattern="uniform", partitions=8)) == list(
        events(500, 1000, 0, 2, pattern="uniform")
    )


def test_ledger_zipf_is_deterministic_and_skewed_by_its_exponent() -> None:
    from collections import Counter

    from txstream.bench.ledger import events

    def top_share(skew: float, seed: int = 4) -> float:
        stream = list(events(20_000, 10_000, 0, seed, pattern="zipf", skew=skew))
        drawn = Counter(a for t in _transfers(stream) for a in (t["src"], t["dst"]))
        return drawn.most_common(1)[0][1] / sum(drawn.values())

    one = list(events(3000, 1000, 0, 9, pattern="zipf", skew=0.8))
    assert one == list(events(3000, 1000, 0, 9, pattern="zipf", skew=0.8))
    assert one != list(events(3000, 1000, 0, 10, pattern="zipf", skew=0.8))
    # rank 1's weight over the sum of r**-s for r = 1..10,000
    for skew in (0.8, 1.2):
        expected = 1 / sum((r + 1) ** -skew for r in range(10_000))
        # (dst != src redraws lower the hottest account's share a little)
        assert top_share(skew) == pytest.approx(expected, rel=0.15)
    assert top_share(1.2) > 2 * top_share(0.8) > 10 * top_share(0.0)
    # the hot accounts are shuffled by the seed, not the smallest ids
    firsts = {
        Counter(
            t["src"] for t in _transfers(list(events(3000, 1000, 0, s, pattern="zipf", skew=1.2)))
        ).most_common(1)[0][0]
        for s in range(4)
    }
    assert len(firsts) > 1
    with pytest.raises(ValueError, match="pattern is one of"):
        list(events(10, 10, 0, 1, pattern="nope"))


def test_ledger_audits_carry_the_serial_total_and_leave_the_ledger_events_alone() -> None:
    from txstream.bench.ledger import audit_totals, events, serial_oracle

    plain = list(events(2500, 50, 10, seed=5))
    audited = list(events(2500, 50, 10, seed=5, audit_every=1000))
    audits = [e for name, e in audited if name == "audits"]
    assert [e["id"] for e in audits] == [1000, 2001]  # after every 1,000 ledger events
    ends = [e["id"] for n, e in events(3000, 50, 10, 5, audit_every=1000) if n == "audits"]
    assert ends == [1000, 2001, 3002]  # and after the last when it is a 1,000th
    assert [
        (n, {k: v for k, v in e.items() if k != "id"}) for n, e in audited if n != "audits"
    ] == [(n, {k: v for k, v in e.items() if k != "id"}) for n, e in plain]
    totals = audit_totals(audited, 50)
    assert [t for _, t in totals] == [e["expected"] for e in audits]
    for audit_id, total in totals:
        prefix = [(n, e) for n, e in audited if e["id"] < audit_id]
        assert sum(serial_oracle(prefix, 50)[0].values()) == total
    # the oracle ignores the audits (they only read)
    assert [ok for _, ok in serial_oracle(audited, 50)[1]] == [
        ok for _, ok in serial_oracle(plain, 50)[1]
    ]


def test_runtime_audit_violations_count_wrong_missing_and_extra_audits() -> None:
    from txstream.bench.runtime import audit_violations

    want = [(10, 500), (20, 510), (30, 530)]
    good = [{"id": i, "total": t, "ok": True} for i, t in want]
    assert audit_violations(good, want) == 0
    assert audit_violations(good[:2], want) == 1  # one missing
    assert audit_violations([*good, good[0]], want) == 1  # one twice
    assert audit_violations([*good, {"id": 40, "total": 1, "ok": True}], want) == 1
    wrong = [good[0], {"id": 20, "total": 511, "ok": False}, good[2]]
    assert audit_violations(wrong, want) == 1
    # a total equal to the serial one that the job itself found wrong is a violation too
    assert audit_violations([good[0], {**good[1], "ok": False}, good[2]], want) == 1


def test_runtime_multi_partition_counts_sum_over_the_timed_batches() -> None:
    from txstream.bench.runtime import multi_partition

    timed = [
        {"multiPartition": {"transactions": 10, "messages": 30, "bytes": 2000}},
        {"multiPartition": {"transactions": 0, "messages": 0, "bytes": 0}},
        {"multiPartition": {"transactions": 30, "messages": 50, "bytes": 6000}},
    ]
    assert multi_partition(timed) == {
        "mp_txns": 40,
        "msgs_per_mp_txn": 2.0,
        "bytes_per_mp_txn": 200.0,
    }
    # a runtime that reports none (before issue 28)
    assert multi_partition([{"numInputRows": 5}]) == {
        "mp_txns": None,
        "msgs_per_mp_txn": None,
        "bytes_per_mp_txn": None,
    }


def test_runtime_render_writes_a_file_per_input_with_audits() -> None:
    from txstream.bench.ledger import events
    from txstream.bench.runtime import _render

    stream = list(events(30, 10, 0, seed=1, audit_every=10))
    files = _render(stream, 11, ("deposits", "transfers", "audits"))
    assert [len(f["audits"]) for f in files] == [1, 1, 1]
    assert sum(len(v) for f in files for v in f.values()) == len(stream)


def test_runtime_grids_hold_the_issue_28_points() -> None:
    from txstream.bench.runtime import ACCOUNTS, GRID, QUICK, run_name, setup, workload

    def has(grid: list[dict[str, Any]], master: str, label: str, parts: int | None = None) -> bool:
        return any(
            p["master"] == master
            and workload(p) == label
            and (parts is None or p["partitions"] == parts)
            and p["cross_mode"] == "forward"
            and p["engine"] == "executors"
            for p in grid
        )

    for m in ("local[1]", "local[2]"):
        assert has(QUICK, m, "cross 0% 100k") and has(QUICK, m, "uniform 100k")
    for label in ("uniform 1k", "zipf 0.8 100k", "uniform 100k +audit/1000"):
        assert has(QUICK, "local[2]", label, 2)
    assert has(QUICK, "local[2]", "uniform 100k", 8) and has(QUICK, "local[2]", "uniform 100k", 32)
    assert any(p["cross_mode"] == "defer" for p in QUICK)
    for m in ("local[1]", "local[2]"):
        for accounts in ("1k", "100k"):
            for label in ("cross 0%", "uniform", "zipf 0.8", "zipf 1.2"):
                assert has(GRID, m, f"{label} {accounts}"), (m, label, accounts)
        assert has(GRID, m, "uniform 100k +audit/1000")
    for parts in (8, 32):
        for label in ("uniform 100k", "zipf 0.8 100k", "zipf 1.2 100k"):
            assert has(GRID, "local[2]", label, parts)
    # every point of a grid runs in a folder of its own, named by what varies
    for grid in (GRID, QUICK):
        names = [run_name(p, 0) for p in grid]
        assert len(set(names)) == len(names)
    assert setup({"master": "local[2]", "partitions": 8, "cross_mode": "defer"}) == (
        "local[2] P=8 defer"
    )
    assert workload({"pattern": "zipf", "skew": 1.2, "accounts": ACCOUNTS}) == "zipf 1.2 100k"
    # the same workload is the same input in every setup of a run
    from txstream.bench.runtime import _stream

    small = {"events": 300, "warmup": 100, "accounts": 1000}
    one, two = (
        {**p, **small, "seed": i}
        for i, p in enumerate(
            q for q in QUICK if workload(q) == "uniform 100k" and q["partitions"] in (1, 32)
        )
    )
    assert one["master"] != two["master"] and _stream(one) == _stream(two)


def test_runtime_set_checks_the_new_parameters(tmp_path: Path) -> None:
    from txstream.bench.harness import apply_overrides
    from txstream.bench.runtime import EXPERIMENT

    exp = apply_overrides(
        EXPERIMENT, ["pattern=zipf", "skew=1.5", "accounts=500", "partitions=4", "cross_mode=defer"]
    )
    assert all(
        (p["pattern"], p["skew"], p["accounts"], p["partitions"], p["cross_mode"])
        == ("zipf", 1.5, 500, 4, "defer")
        for p in exp.quick_grid
    )
    for bad in ("pattern=hot", "partitions=0", "accounts=1", "audit_every=-1", "cross_mode=2pc"):
        with pytest.raises(TxStreamError, match=bad.split("=")[0]):
            apply_overrides(EXPERIMENT, [bad])


def test_runtime_audit_points_say_when_the_runtime_has_no_global_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from txstream.bench import runtime

    class Before:
        def input(self, name: str, source: Any, keys: Any = (), order: Any = None) -> None:
            pass

    class After:
        def input(self, name: str, source: Any, keys: Any = (), global_reads: Any = None) -> None:
            pass

    monkeypatch.setattr(runtime, "Job", Before)
    assert "no global reads" in str(runtime._missing_feature({"audit_every": 1000}))
    assert runtime._missing_feature({"audit_every": 0}) is None
    got = runtime.child({"audit_every": 1000, "master": "local[2]"}, Path("unused"))
    assert got["errors"] == -1 and "no global reads" in got["note"]  # before Spark starts
    monkeypatch.setattr(runtime, "Job", After)
    assert runtime._missing_feature({"audit_every": 1000}) is None


def test_bar_figure_groups_categories_in_the_rows_order(tmp_path: Path) -> None:
    from txstream.bench.harness import plot

    rows = [
        {"w": "uniform", "m": "local[1]", "y": 10.0, "s": 0.1, "f": 0.2, "p": 2},
        {"w": "uniform", "m": "local[2]", "y": 18.0, "s": 0.0, "f": 0.1, "p": 8},
        {"w": "cross", "m": "local[2]", "y": 20.0, "s": 0.3, "f": 0.3, "p": 2},
        {"w": "skip", "m": "local[2]", "y": None, "s": None, "f": None, "p": 2},
    ]
    plot(rows, Figure("b", x="w", y="y", series="m", kind="bar", title="t"), tmp_path / "b.png")
    plot(rows, Figure("l", x="p", y=("s", "f"), series="w", title="t"), tmp_path / "l.png")
    for name in ("b.png", "l.png"):
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
    # a frozenset in where: any of its values
    from txstream.bench.harness import aggregate

    some = Figure("a", x="p", y="y", series="w", title="t", where=(("w", frozenset({"cross"})),))
    assert aggregate(rows, some) == {None: {"cross": [(2, 20.0, 20.0, 20.0)]}}


def test_runtime_heartbeat_writes_a_neutral_row_into_every_input(tmp_path: Path) -> None:
    import json

    from txstream.bench.runtime import SPACING, _heartbeat

    inputs = ("deposits", "transfers", "audits")
    for name in (*inputs, "staging"):
        (tmp_path / name).mkdir()
    _heartbeat(tmp_path, 5 * SPACING + 1, "t", inputs)
    rows = {n: json.loads((tmp_path / n / "beat-t.json").read_text()) for n in inputs}
    assert {r["id"] for r in rows.values()} == {5 * SPACING + 1}  # between two events' ids
    assert rows["deposits"]["amount"] == rows["transfers"]["amount"] == 0
    assert rows["transfers"]["src"] == rows["transfers"]["dst"]
    assert not list((tmp_path / "staging").iterdir())
