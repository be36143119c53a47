"""Experiment drivers: each paper figure or table is an :class:`Experiment`.

An experiment is a grid of parameter points times repetitions with seeds; running
it writes ``<name>.csv`` and one PNG per figure into an output folder.
"""

from txstream.bench.harness import Experiment, Figure, run_experiment

__all__ = ["Experiment", "Figure", "run_experiment"]
