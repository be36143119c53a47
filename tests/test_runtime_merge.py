"""Several inputs merged into one order across micro-batches, without Spark.

Moved from ``tests/test_runtime.py`` (split by subject); shared helpers are in
``tests/runtime_jobs.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import txstream as tx
from txstream.model import check


# -- several inputs merged into one order across micro-batches ---------------------------
def specs_job(merge: str) -> tx.Job:
    def change(t: tx.Tx, c: dict[str, Any]) -> None:
        t.update("specs", c["device"], high=c["high"])

    def reading(t: tx.Tx, r: dict[str, Any]) -> None:
        if r["temp"] > t.read("specs", r["device"])["high"]:
            t.emit("alerts", {"device": r["device"], "ts": r["ts"]})

    return (
        tx.Job("specs")
        .table("specs", key="device", initial=[{"device": d, "high": 30.0} for d in "ABC"])
        .input("changes", None, keys="device", order="ts")
        .input("readings", None, keys="device", order="ts")
        .output("alerts")
        .boundary("timestamp")
        .on("changes", change)
        .on("readings", reading)
        .option("merge", merge)
        .option("recordHistory", True)
    )


def test_event_time_merge_holds_a_change_that_arrives_ahead_of_the_readings(
    tmp_path: Path,
) -> None:
    # The change to Fahrenheit (high 86) at ts 10 is handed over a batch early,
    # with readings up to ts 5 only; readings 6..12 come in the next batch.
    readings = [
        ("readings", {"device": "A", "temp": 50.0 if ts < 10 else 80.0, "ts": ts})
        for ts in range(13)
    ]
    batches = [
        [("changes", {"device": "A", "high": 86.0, "ts": 10}), *readings[:6]],
        readings[6:],
        [("readings", {"device": "B", "temp": 1.0, "ts": 20})],
    ]
    expected = [{"device": "A", "ts": ts} for ts in range(10)]  # 50 C > 30; 80 F < 86
    specs_job("event-time").run_local(batches, tmp_path / "merged", partitions=2)
    assert tx.read_output(tmp_path / "merged", "alerts") == expected
    assert check(tx.read_history(tmp_path / "merged"), "csao").holds
    # Batch order applies the change before readings 6..9: they are missed.
    specs_job("batch").run_local(batches, tmp_path / "batch", partitions=2)
    assert tx.read_output(tmp_path / "batch", "alerts") == expected[:6]


@given(
    seed=st.integers(0, 10_000),
    cuts=st.lists(st.integers(0, 30), min_size=2, max_size=6),
    partitions=st.integers(1, 3),
)
def test_event_time_merge_equals_serial_order_by_time_however_sources_split_batches(
    tmp_path_factory: pytest.TempPathFactory, seed: int, cuts: list[int], partitions: int
) -> None:
    import random

    rng = random.Random(seed)
    changes = [
        {"device": rng.choice("ABC"), "high": float(rng.randrange(20, 90)), "ts": ts}
        for ts in sorted(rng.sample(range(40), 5))
    ]
    readings = [
        {"device": rng.choice("ABC"), "temp": float(rng.randrange(0, 100)), "ts": ts}
        for ts in range(40)
    ]
    # Serial execution by time, changes first at equal times.
    high = dict.fromkeys("ABC", 30.0)
    expected = []
    for ts in range(40):
        for c in changes:
            if c["ts"] == ts:
                high[c["device"]] = c["high"]
        for r in readings:
            if r["ts"] == ts and r["temp"] > high[r["device"]]:
                expected.append({"device": r["device"], "ts": ts})

    # Each input is split into batches at its own random points, so one runs
    # ahead of the other; an input is quiet only once it has nothing left (the
    # premise of idleBatches=1).
    def chunks(items: list[Any], k: int) -> list[list[Any]]:
        points = sorted(rng.sample(range(1, len(items)), min(k, len(items)) - 1))
        return [items[x:y] for x, y in zip([0, *points], [*points, len(items)], strict=True)]

    change_chunks = chunks(changes, max(1, cuts[0] % 5))
    reading_chunks = chunks(readings, max(1, cuts[1] % 8))
    batches = [
        [("changes", c) for c in (change_chunks[i] if i < len(change_chunks) else [])]
        + [("readings", r) for r in (reading_chunks[i] if i < len(reading_chunks) else [])]
        for i in range(max(len(change_chunks), len(reading_chunks)))
    ]
    batches.append([])  # one quiet batch at the end releases what is still held
    store = tmp_path_factory.mktemp("merge")
    specs_job("event-time").run_local(batches, store, partitions=partitions)
    assert tx.read_output(store, "alerts") == expected
    assert check(tx.read_history(store), "csao").holds


def test_the_sensor_alerts_example_gives_every_expected_alert_without_spark(
    tmp_path: Path,
) -> None:
    # The example's job (its own transaction functions) on its generated input,
    # handed over as its file sources would (2 files per input and micro-batch),
    # with run_local: every expected alert, none held back at the end of the input.
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "examples" / "sensor_alerts.py"
    module_spec = importlib.util.spec_from_file_location("sensor_alerts", path)
    assert module_spec is not None and module_spec.loader is not None
    example = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(example)
    data = tmp_path / "data"
    expected = example.generate(data, devices=6, files=12, per_file=40, seed=5)
    specs = [json.loads(line) for line in (data / "specs.json").read_text().splitlines()]
    job = example.job(specs, None, None)

    def files(name: str) -> list[list[tuple[str, Any]]]:
        paths = sorted((data / name).glob("*.json"))
        rows = [[(name, json.loads(x)) for x in p.read_text().splitlines()] for p in paths]
        return [[r for part in rows[i : i + 2] for r in part] for i in range(0, len(rows), 2)]

    readings, changes = files("readings"), files("changes")
    batches = [
        (readings[i] if i < len(readings) else []) + (changes[i] if i < len(changes) else [])
        for i in range(max(len(readings), len(changes)))
    ]
    job.run_local(batches, tmp_path / "store", 2)
    assert tx.read_output(tmp_path / "store", "alerts") == expected
