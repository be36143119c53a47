"""One tiny point of ``txstream bench runtime`` end to end (its own Spark application)."""

from __future__ import annotations

from pathlib import Path

from txstream.bench.runtime import FLOOD, _point, run_point


def test_a_uniform_audited_point_on_more_partitions_than_cores_equals_the_oracle(
    tmp_path: Path,
) -> None:
    point = _point(
        "executors", "local[2]", 0, 2_400, FLOOD, pattern="uniform", partitions=3, audit_every=300
    )
    point.update({"accounts": 500, "warmup": 600, "chunk": 600, "_out": str(tmp_path)})
    got = run_point(point, seed=3)
    assert got["errors"] == 0
    assert got["committed_events"] == 3_000 + 10  # and an audit after every 300
    assert got["audits"] == 10 and got["audit_violations"] == 0
    assert got["workload"] == "uniform 500 +audit/300"
    assert got["setup"] == "local[2] P=3"
    # counted from the input: 2 of 3 transfers cross on 3 partitions
    assert 0.55 < got["cross_share"] < 0.78
    assert 0 <= got["serial_share"] < 1 and 0 < got["hot_floor"] <= 1
    # transfers ran forwarded between the partitions, and the runtime counted what they sent
    assert got["mp_txns"] > 0 and got["msgs_per_mp_txn"] > 0 and got["deferred"] == 0
    name = "executors-local2-uniform_500__audit_300-P3-forward-e2400-r250000-s3"
    assert (tmp_path / "runtime" / name).is_dir()
