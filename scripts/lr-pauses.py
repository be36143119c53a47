"""Measure the stop-the-world pauses of a Linear Road run: full GCs and checkpoints.

Replays the shared 1800-second input through the engine in Python (no Spark),
timing every generation-2 garbage collection (``gc.callbacks``) and every
checkpoint, and prints them as JSON.  About 4-5 minutes on 2 cores.

    .venv/bin/python scripts/lr-pauses.py [SHARED_LINEARROAD_DIR] [WORK_DIR]
"""

import gc
import json
import sys
import tempfile
import time
from pathlib import Path

from txstream.linearroad.engine import HistoricalTolls, LinearRoadEngine
from txstream.linearroad.formats import open_text
from txstream.linearroad.replay import numbered_lines, replay

shared = Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/linearroad")
work = Path(sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="lr-pauses-"))
pauses: list[float] = []
began: dict[str, float] = {}


def on_gc(phase: str, info: dict[str, int]) -> None:
    """Time generation-2 collections."""
    if info["generation"] == 2:
        if phase == "start":
            began["t"] = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - began["t"])


gc.callbacks.append(on_gc)
engine = LinearRoadEngine(
    historical_tolls=HistoricalTolls.from_file(shared / "lr-1x-1800s.tolls.dat.gz"),
    answers_path=work / "answers.txt",
    state_dir=work / "state",
)
checkpoints: list[float] = []
plain_checkpoint = engine.tm.checkpoint


def timed_checkpoint() -> int:
    """The engine's checkpoint, timed."""
    t = time.perf_counter()
    size = plain_checkpoint()
    checkpoints.append(time.perf_counter() - t)
    return size


engine.tm.checkpoint = timed_checkpoint  # type: ignore[method-assign]
engine.start()
started = time.perf_counter()
with open_text(shared / "lr-1x-1800s.dat.gz") as f:
    replay(engine, numbered_lines(f))
engine.finish()
print(
    json.dumps(
        {
            "replay_s": round(time.perf_counter() - started, 1),
            "full_gcs": len(pauses),
            "full_gc_total_s": round(sum(pauses), 1),
            "full_gc_max_s": round(max(pauses, default=0.0), 3),
            "checkpoints_s": [round(c, 3) for c in checkpoints],
        }
    )
)
