"""The experiments that ``txstream bench NAME`` knows, found by module name.

Each module listed here defines a module-level ``EXPERIMENT``.  Modules are
imported only when an experiment is asked for, so ``txstream --help`` stays fast.
"""

from __future__ import annotations

import importlib

from txstream.bench.harness import Experiment
from txstream.errors import UnknownNameError

EXPERIMENT_MODULES: tuple[str, ...] = (
    "txstream.bench.checker",
    "txstream.bench.loading",
    "txstream.bench.broadcast",
    "txstream.bench.tm",
    "txstream.bench.windows",
    "txstream.bench.cq",
    "txstream.bench.cq_spark",
    "txstream.bench.linearroad",
    "txstream.bench.runtime",
)


def experiments() -> dict[str, Experiment]:
    """Every registered experiment by name."""
    found: dict[str, Experiment] = {}
    for module in EXPERIMENT_MODULES:
        exp = importlib.import_module(module).EXPERIMENT
        found[exp.name] = exp
    return found


def get_experiment(name: str) -> Experiment:
    """The experiment called ``name``; :class:`UnknownNameError` otherwise."""
    found = experiments()
    if name not in found:
        raise UnknownNameError("experiment", name, list(found))
    return found[name]
