"""The unified transactional model: operations, histories, notation and checkers.

Pure Python with no I/O: everything else in txstream records its runs as
:class:`History` objects and proves them correct with :func:`check`.
"""

from txstream.model.check import CheckOptions, Verdict, check, criteria, get_checker
from txstream.model.conflict import ConflictGraph, conflict_graph
from txstream.model.history import History, Kind, Operation, abort, commit, read, write
from txstream.model.notation import format_histories, format_history, parse, parse_one

__all__ = [
    "CheckOptions",
    "ConflictGraph",
    "History",
    "Kind",
    "Operation",
    "Verdict",
    "abort",
    "check",
    "commit",
    "conflict_graph",
    "criteria",
    "format_histories",
    "format_history",
    "get_checker",
    "parse",
    "parse_one",
    "read",
    "write",
]
