"""Machine instructions of one child run under valgrind: the scripts' load-proof measure.

CPU seconds swing by 10-30% on a shared machine; valgrind's count of executed
instructions does not (the same binary, input and hash seed give the same
count whatever else runs).  ``*-instructions.py`` scripts run their measured
code twice in a child, at two sizes, and divide the difference.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

PATTERNS = {
    "I": r"I\s+refs:\s+([\d,]+)",
    "D1": r"D1\s+misses:\s+([\d,]+)",
    "LLd": r"LLd\s+misses:\s+([\d,]+)",
}
"""What each count is called in cachegrind's summary on stderr."""


def _run(script: str, args: tuple[str, ...], cache: bool, keys: tuple[str, ...]) -> dict[str, int]:
    """``keys`` of cachegrind's summary for ``python script *args`` (hash seed fixed)."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    command = [
        "valgrind",
        "--tool=cachegrind",
        f"--cache-sim={'yes' if cache else 'no'}",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        script,
        *args,
    ]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stderr
    found = {}
    for key in keys:
        match = re.search(PATTERNS[key], out)
        if match is None:
            raise SystemExit(f"no {key} count in valgrind's output:\n{out[-2000:]}")
        found[key] = int(match.group(1).replace(",", ""))
    return found


def instructions(script: str, *args: str) -> int:
    """Instructions valgrind counted for ``python script *args`` (hash seed fixed)."""
    return _run(script, args, cache=False, keys=("I",))["I"]


def counts(script: str, *args: str) -> dict[str, int]:
    """Instructions and simulated data-cache misses of ``python script *args`` (hash seed fixed).

    Keys ``I`` (instructions), ``D1`` (first-level data misses, reads and writes) and
    ``LLd`` (last-level data misses): cachegrind's simulation of its default caches,
    as deterministic as the instruction count, and about twice as slow to run.
    """
    return _run(script, args, cache=True, keys=("I", "D1", "LLd"))
