"""Where phase 1's CPU goes: a line-level sampling profile of scripts/runtime-phase1-cpu.py.

A SIGPROF timer samples the running line every 0.5 ms of CPU while a phase-1
task runs, after the first batch (which loads the state and writes a snapshot)
(cProfile's per-call cost would distort the small functions of the hot path);
prints the hottest lines and the share of each txstream function (the
innermost txstream frame of each sample).  Arguments go to the script.

    PYTHONPATH=src .venv/bin/python scripts/runtime-phase1-profile.py --batches 6
"""

from __future__ import annotations

import collections
import runpy
import signal
import sys
from pathlib import Path
from typing import Any

import txstream.spark.runtime.spark_tasks as q

lines: collections.Counter[tuple[str, int, str]] = collections.Counter()
functions: collections.Counter[tuple[str, str]] = collections.Counter()


def sample(signum: int, frame: Any) -> None:
    """Count the running line and its innermost txstream function."""
    code = frame.f_code
    lines[(Path(code.co_filename).name, frame.f_lineno, code.co_name)] += 1
    while frame is not None:
        if "txstream" in frame.f_code.co_filename:
            functions[(Path(frame.f_code.co_filename).name, frame.f_code.co_name)] += 1
            return
        frame = frame.f_back


def main() -> None:
    """Run the script with the sampler on inside phase-1 tasks; print the profile."""
    task = q._phase1_task

    def sampled(*args: Any, **kwargs: Any) -> Any:
        if args[1].snapshot:  # (the first batch loads the state: runtime-phase1-cpu.py skips it)
            yield from task(*args, **kwargs)
            return
        signal.setitimer(signal.ITIMER_PROF, 0.0005, 0.0005)
        try:
            yield from task(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0, 0)

    q._phase1_task = sampled  # type: ignore[assignment]
    signal.signal(signal.SIGPROF, sample)
    script = Path(__file__).with_name("runtime-phase1-cpu.py")
    sys.argv = [str(script), *sys.argv[1:]]
    runpy.run_path(str(script), run_name="__main__")
    total = sum(lines.values()) or 1
    print(f"{total} samples")
    for (name, line, function), n in lines.most_common(30):
        print(f"{100 * n / total:5.1f}% {name}:{line} {function}")
    print("by function:")
    for (name, function), n in functions.most_common(20):
        print(f"{100 * n / total:5.1f}% {name} {function}")


if __name__ == "__main__":
    main()
