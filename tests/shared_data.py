"""Where the independent Linear Road reference data lives (never copied into the repository).

``TXSTREAM_SHARED`` names the shared folder; otherwise ``shared`` beside the
checkout (``../shared``).  :func:`shared_file` gives a file of its
``linearroad/`` folder to the cross-checks that need it.  When the data is not
there they cannot run: under CI (``CI`` set) that fails the test, elsewhere
the test is skipped and pytest's summary says so in one line (every such skip
is raised here, so ``-ra`` folds them into one ``SKIPPED [n]`` line).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_CHECKOUT = Path(__file__).resolve().parents[1]


def _candidates() -> list[Path]:
    env = os.environ.get("TXSTREAM_SHARED")
    return [Path(env)] if env else [_CHECKOUT.parent / "shared"]


def linearroad_dir() -> Path | None:
    """The shared ``linearroad/`` folder, or None when it is not there."""
    for base in _candidates():
        if (base / "linearroad").is_dir():
            return base / "linearroad"
    return None


def shared_file(name: str) -> Path:
    """``linearroad/name`` of the shared data; fail under CI, skip elsewhere, if absent."""
    where = linearroad_dir()
    path = where / name if where is not None else None
    if path is not None and path.is_file():
        return path
    looked = ", ".join(str(b / "linearroad") for b in _candidates())
    message = (
        f"the independent Linear Road reference data is not in {looked} "
        "(set TXSTREAM_SHARED): the cross-checks against it did not run"
    )
    if os.environ.get("CI"):
        pytest.fail(message + " - and CI requires them", pytrace=False)
    pytest.skip(message)
