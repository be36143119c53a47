"""EDBT 2012 Figure 1 on txstream: temperature alerts against a specs table that changes.

Devices have a temperature range in table ``specs``.  Sensors report readings;
a reading outside its device's range raises an alert.  Mid-stream the sensors
switch to Fahrenheit and another system sends each device's new specification
(in Fahrenheit) on a second input, stamped with the time of the device's first
Fahrenheit reading.  With the ``timestamp`` boundary the specification change and
that reading are one transaction, the change first (its input is declared
first), so no Celsius reading sees a Fahrenheit range and no Fahrenheit reading
a Celsius one: no false alert, no missed alert, even across crashes.

    python examples/sensor_alerts.py generate --out /tmp/sensors
    python examples/sensor_alerts.py run --data /tmp/sensors --checkpoint /tmp/sensors/ckpt
    python examples/sensor_alerts.py show --checkpoint /tmp/sensors/ckpt
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import txstream as tx


# ---- the job: what a user writes --------------------------------------------------
def change_spec(t: tx.Tx, change: dict[str, Any]) -> None:
    t.update("specs", change["device"], low=change["low"], high=change["high"])


def check_reading(t: tx.Tx, reading: dict[str, Any]) -> None:
    spec = t.read("specs", reading["device"])
    if not spec["low"] <= reading["temp"] <= spec["high"]:
        t.emit("alerts", {"device": reading["device"], "temp": reading["temp"], "ts": reading["ts"]})


def job(specs: Any, changes: Any, readings: Any) -> tx.Job:
    """The job over its two inputs (DataFrames, or None for ``run_local``)."""
    return (
        tx.Job("sensor_alerts")
        .table("specs", key="device", initial=specs)
        .input("changes", changes, keys="device", order="ts")
        .input("readings", readings, keys="device", order="ts")
        .output("alerts", schema="device string, temp double, ts long")
        .boundary("timestamp")
        .option("merge", "event-time")  # whichever input a source hands over first
        .on("changes", change_spec)
        .on("readings", check_reading)
    )


def start(spark: Any, data: Path, checkpoint: Path, once: bool) -> Any:
    changes = spark.readStream.schema("device string, low double, high double, ts long")
    readings = spark.readStream.schema("device string, temp double, ts long")
    return (
        job(
            str(data / "specs.json"),
            changes.option("maxFilesPerTrigger", 2).json(str(data / "changes")),
            readings.option("maxFilesPerTrigger", 2).json(str(data / "readings")),
        )
        .option("recordHistory", True)
        .trigger(**({"availableNow": True} if once else {"processingTime": "200 milliseconds"}))
        .start(checkpoint=checkpoint, spark=spark)
    )
# ---- end of the job ------------------------------------------------------------------


def generate(out: Path, devices: int, files: int, per_file: int, seed: int) -> list[dict[str, Any]]:
    """Write specs, spec changes and readings; return the alerts a correct run raises."""
    rng = random.Random(seed)
    names = [f"D{i}" for i in range(devices)]
    specs = {d: (rng.uniform(0, 15), rng.uniform(25, 40)) for d in names}
    switch = {d: rng.randrange(files * per_file // 4, files * per_file * 3 // 4) for d in names}
    (out / "changes").mkdir(parents=True, exist_ok=True)
    (out / "readings").mkdir(parents=True, exist_ok=True)
    (out / "specs.json").write_text(
        "".join(json.dumps({"device": d, "low": lo, "high": hi}) + "\n"
                for d, (lo, hi) in specs.items()))
    f = lambda c: round(c * 9 / 5 + 32, 3)  # noqa: E731
    # Each file of changes lands together with the file of readings that holds
    # the device's first Fahrenheit reading (as another system would send it
    # at that time); the file source hands files over in modification order.
    expected, ts = [], 0
    for n in range(files):
        lines, changes = [], []
        for _ in range(per_file):
            d = rng.choice(names)
            celsius = round(rng.uniform(-5, 50), 1)
            temp = f(celsius) if ts >= switch[d] else celsius
            lines.append(json.dumps({"device": d, "temp": temp, "ts": ts}))
            if not specs[d][0] <= celsius <= specs[d][1]:
                expected.append({"device": d, "temp": temp, "ts": ts})
            ts += 1
        for d in names:
            if switch[d] // per_file == n:
                lo, hi = specs[d]
                changes.append(json.dumps(
                    {"device": d, "low": f(lo), "high": f(hi), "ts": switch[d]}))
        for folder, text in (("readings", lines), ("changes", changes)):
            path = out / folder / f"part-{n:04d}.json"
            path.write_text("".join(line + "\n" for line in text))
            os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))
    # The event-time merge runs a timestamp once a later one has arrived (as a
    # watermark holds Spark's last window) or the inputs end (a bounded run ends
    # them): the sensors' last word is a reading one tick later, inside its
    # device's range, so that a continuously running query runs the others too.
    d = names[0]
    last = (f(specs[d][0]) + f(specs[d][1])) / 2 if ts >= switch[d] else sum(specs[d]) / 2
    path = out / "readings" / f"part-{files:04d}.json"
    path.write_text(json.dumps({"device": d, "temp": round(last, 3), "ts": ts}) + "\n")
    os.utime(path, (1_700_000_000 + files, 1_700_000_000 + files))
    (out / "expected.json").write_text(json.dumps(expected))
    return expected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("generate", help="write an input")
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--devices", type=int, default=20)
    gen.add_argument("--files", type=int, default=30)
    gen.add_argument("--per-file", type=int, default=200)
    gen.add_argument("--seed", type=int, default=1)
    run = sub.add_parser("run", help="run the job until the input is consumed")
    run.add_argument("--data", type=Path, required=True)
    run.add_argument("--checkpoint", type=Path, required=True)
    run.add_argument("--continuous", action="store_true", help="keep running (processingTime)")
    show = sub.add_parser("show", help="print the committed alerts and compare with expected")
    show.add_argument("--checkpoint", type=Path, required=True)
    show.add_argument("--data", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "generate":
            expected = generate(args.out, args.devices, args.files, args.per_file, args.seed)
            print(f"wrote {args.out}: {len(expected)} alerts expected")
        elif args.cmd == "run":
            from txstream.spark import local_session

            query = start(local_session("sensor-alerts"), args.data, args.checkpoint,
                          once=not args.continuous)
            try:
                query.awaitTermination()
            finally:
                query.stop()
            print(json.dumps(query.lastProgress))
        else:
            alerts = tx.read_output(args.checkpoint, "alerts")
            print(json.dumps({"alerts": len(alerts)}))
            if args.data is not None:
                expected = json.loads((args.data / "expected.json").read_text())
                ok = alerts == expected
                print(json.dumps({"expected": len(expected), "exactly_as_expected": ok}))
                return 0 if ok else 1
    except tx.TxStreamError as exc:
        print(f"sensor_alerts: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
