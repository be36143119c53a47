"""Checked number types for the command line and for ``bench --set``.

Every numeric option of every ``txstream`` command is parsed by one of these, so
NaN, infinities, negative counts and absurd sizes are refused where they enter:
argparse turns the :class:`argparse.ArgumentTypeError` into one line on stderr
and exit 2, before any work starts (no traceback, no hang, no ``MemoryError``
after a minute).  :func:`parse_int` and :func:`parse_float` are the same checks
for code that is not argparse (``bench --set PARAM=VALUE``); they raise
:class:`BadValueError` and live in :mod:`txstream.bench.values` (below the
command line), re-exported here.

The upper bounds are deliberately generous: they exist so that a typo such as
``--threads 100000000`` fails at once instead of exhausting memory.

The checks on output files (written whole, refused before the run) are
:mod:`txstream.storage.files`: the layers below the command line use them too.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txstream.bench.values import BadValueError, parse_float, parse_int

MAX_SEED = 2**63 - 1
"""Seeds are non-negative and fit in 64 bits (numpy and Spark take them too)."""


def _argparse_type(fn: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            return fn(text)
        except BadValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name  # argparse names the type in some messages
    return parse


def _path(text: str) -> Path:
    if not text.strip():
        # Path("") is ".": an empty value (an unset shell variable) would write here
        raise BadValueError("an empty path; name a file or folder")
    return Path(text)


path_arg: Callable[[str], Path] = _argparse_type(_path, "path")
"""An argparse ``type=`` for a path, refusing an empty one."""


def int_range(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=`` for an integer within ``[lo, hi]``."""
    return _argparse_type(lambda t: parse_int(t, lo, hi), "integer")


def float_range(
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> Callable[[str], float]:
    """An argparse ``type=`` for a finite float within the range."""
    return _argparse_type(
        lambda t: parse_float(t, lo, hi, lo_open=lo_open, hi_open=hi_open), "number"
    )


def positive_int(max: int) -> Callable[[str], int]:
    """An integer from 1 to ``max``."""
    return int_range(1, max)


def nonnegative_int(max: int) -> Callable[[str], int]:
    """An integer from 0 to ``max``."""
    return int_range(0, max)


def positive_float(max: float) -> Callable[[str], float]:
    """A finite float greater than 0, at most ``max``."""
    return float_range(0.0, max, lo_open=True)


def nonnegative_float(max: float) -> Callable[[str], float]:
    """A finite float from 0 to ``max``."""
    return float_range(0.0, max)


probability: Callable[[str], float] = float_range(0.0, 1.0)
"""A finite float in ``[0, 1]``."""

seed: Callable[[str], int] = int_range(0, MAX_SEED)
"""A random seed: an integer from 0 to 2**63-1."""


def json_safe(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by ``None``.

    ``json.dumps`` would write ``NaN``/``Infinity``, which is not JSON; a metric
    that has no value (a mean over nothing) is reported as ``null`` instead.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
