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
        }  # fmt: skip

    rows = [
        row("serializable", 3, 2.5),
        row("not-serializable", 3, 2.0),
        row("serializable", 4, 6.1),
        row("not-serializable", 4, 4.2),
        row("serializable", 5, 70.0, behind=1),
        row("not-serializable", 5, 65.0, behind=1),
    ]
    text = summarize(rows)
    assert "| serializable | 3 | L = 3 at 867 tuples per expressway-second" in text
    assert "| not-serializable | 4 |" in text
    assert "| 3 | 2.50 | 2.00 | +0.50 s | 7 / 1 |" in text
    assert "| 5 | 70.00 (fell behind) | 65.00 (fell behind) | +5.00 s | fell behind |" in text


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
    from txstream.bench.runtime import FLOOD, LOAD, SWEEP, summarize

    def row(
        engine: str, master: str, cross: int, rate: int, tps: int, p99: float
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
        }

    text = summarize(
        [
            row("executors", "local[1]", 0, FLOOD, 40_000, 9.0),
            row("executors", "local[2]", 0, FLOOD, 60_000, 8.0),
            row("executors", "local[2]", 0, LOAD, 49_500, 1.5),
            row("executors", "local[2]", 0, SWEEP[0], 38_000, 0.9),
            row("executors", "local[2]", 10, LOAD, 49_500, 2.5),
            row("executors", "local[2]", 10, FLOOD, 30_000, 9.0),
            row("driver", "local[2]", 10, FLOOD, 15_000, 9.0),
        ]
    )
    assert "local[2] / local[1] at 0% cross: 1.50x" in text
    assert "executors / driver engine at 10% cross: 2.00x" in text
    # the goal is judged on the steady commit rate, which the drain does not lower
    assert "0% cross: 50,500 txn/s steady (49,500 overall), p99 1.5 s: goal" in text
    assert "p99 1.5 s: goal 50,000 txn/s with p99 under 2 s met" in text
    assert "p99 2.5 s: goal 50,000 txn/s with p99 under 2 s not met" in text
    assert "39,000 txn/s steady (38,000 overall), p99 0.9 s: goal 50,000 txn/s" in text
    assert text.count("not met") == 2  # 39,000 txn/s is too few, 2.5 s too late
    # every offered-load point, the lower ones first
    lower = text.index(f"at {SWEEP[0]:,} events/s offered, 0% cross")
    assert lower < text.index(f"at {LOAD:,} events/s offered")
    assert f"at {FLOOD:,}" not in text
    assert "errors in all runs: 0" in text
