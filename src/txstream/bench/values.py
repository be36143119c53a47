"""Checked numbers from text: ``bench --set`` values and the command line's options.

:func:`parse_int` and :func:`parse_float` refuse what is not a number, NaN, the
infinities and values out of range, raising :class:`BadValueError` (one line);
the command line's argparse types (:mod:`txstream.cli.types`) wrap them, and
the bench harness parses ``--set PARAM=VALUE`` with them, so both refuse the
same values with the same words.
"""

from __future__ import annotations

import math

from txstream.errors import TxStreamError


class BadValueError(TxStreamError, ValueError):
    """A number given by the user is not a number, not finite, or out of range."""


def _range_text(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    def show(v: float) -> str:
        return f"{v:,}" if isinstance(v, int) else f"{v:g}"

    if lo is not None and hi is not None:
        left = ">" if lo_open else ">="
        right = "<" if hi_open else "<="
        return f"{left} {show(lo)} and {right} {show(hi)}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {show(lo)}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {show(hi)}"
    return "a finite number"


def parse_int(text: str, lo: int | None = None, hi: int | None = None) -> int:
    """``text`` as an integer within ``[lo, hi]``; :class:`BadValueError` otherwise."""
    try:
        value = int(text.strip())
    except ValueError:
        # int() also refuses absurdly long digit strings (sys.int_info limit): same message.
        raise BadValueError(f"not an integer: {text!r}") from None
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        shown = f"{value:,}" if abs(value) < 10**30 else f"a {len(str(abs(value)))}-digit number"
        raise BadValueError(f"must be {_range_text(lo, hi, False, False)}, not {shown}")
    return value


def parse_float(
    text: str,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> float:
    """``text`` as a finite float in the range; :class:`BadValueError` otherwise.

    ``lo_open``/``hi_open`` exclude the bound itself (``> 0`` rather than ``>= 0``).
    NaN and the infinities (also ``1e999``, which overflows to infinity) are refused.
    """
    try:
        value = float(text.strip())
    except ValueError:
        raise BadValueError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise BadValueError(f"must be a finite number, not {text.strip()!r}")
    if (
        (lo is not None and (value < lo or (lo_open and value == lo)))
        or (hi is not None and (value > hi or (hi_open and value == hi)))
    ):  # fmt: skip
        raise BadValueError(f"must be {_range_text(lo, hi, lo_open, hi_open)}, not {value:g}")
    return value
