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


def instructions(script: str, *args: str) -> int:
    """Instructions valgrind counted for ``python script *args`` (hash seed fixed)."""
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    command = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        script,
        *args,
    ]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stderr
    match = re.search(r"I\s+refs:\s+([\d,]+)", out)
    if match is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{out[-2000:]}")
    return int(match.group(1).replace(",", ""))


def counts(script: str, *args: str) -> dict[str, int]:
    """Instructions and simulated data-cache misses of ``python script *args`` (hash seed fixed).

    Keys ``I`` (instructions), ``D1`` (first-level data misses, reads and writes) and
    ``LLd`` (last-level data misses): cachegrind's simulation of its default caches,
    as deterministic as the instruction count, and about twice as slow to run.
    """
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    command = [
        "valgrind",
        "--tool=cachegrind",
        "--cache-sim=yes",
        "--cachegrind-out-file=/dev/null",
        sys.executable,
        script,
        *args,
    ]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stderr
    found = {}
    for key, pattern in (
        ("I", r"I\s+refs:\s+([\d,]+)"),
        ("D1", r"D1\s+misses:\s+([\d,]+)"),
        ("LLd", r"LLd\s+misses:\s+([\d,]+)"),
    ):
        match = re.search(pattern, out)
        if match is None:
            raise SystemExit(f"no {key} count in valgrind's output:\n{out[-2000:]}")
        found[key] = int(match.group(1).replace(",", ""))
    return found
