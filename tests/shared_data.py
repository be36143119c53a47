"""Where the workplace's shared reference data lives (never copied into the repository).

``TXSTREAM_SHARED`` names the shared folder; otherwise the folder beside the
checkout (``../shared``) or this machine's ``/work/shared``.  A test that needs
the data fails, with this message, when none exists: it is not skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

_CANDIDATES = [
    *([Path(os.environ["TXSTREAM_SHARED"])] if os.environ.get("TXSTREAM_SHARED") else []),
    Path(__file__).resolve().parents[2] / "shared",
    Path("/work/shared"),
]


def shared_dir() -> Path:
    """The shared folder: the first candidate that has ``linearroad/`` in it."""
    for base in _CANDIDATES:
        if (base / "linearroad").is_dir():
            return base
    return _CANDIDATES[0]  # tests then fail on the missing file, naming this path


LINEARROAD = shared_dir() / "linearroad"
