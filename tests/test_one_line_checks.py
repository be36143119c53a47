"""The exact one-line errors of checks that share a helper (job options, boundary inputs).

The checks of ``Job.option`` and of the ``timeslice`` and ``punctuation``
boundaries' inputs go through shared helpers; these tests pin every message,
word for word, as it was before they shared them.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

import txstream as tx
from txstream.spark.runtime.boundaries import PerPunctuation, PerTimeslice


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("snapshotEvery", 0, "option snapshotEvery must be a positive integer, not 0"),
        ("snapshotEvery", True, "option snapshotEvery must be a positive integer, not True"),
        ("idleBatches", "2", "option idleBatches must be a positive integer, not '2'"),
        ("allFailLimit", -1, "option allFailLimit must be an integer >= 0 (0: no limit), not -1"),
        ("onError", "skip", "option onError is one of ('rollback', 'stop'), not 'skip'"),
        ("merge", "time", "option merge is one of ('batch', 'event-time'), not 'time'"),
        (
            "crossPartition",
            "2pc",
            "option crossPartition is one of ('forward', 'defer'), not '2pc'",
        ),
    ],
)
def test_a_bad_option_value_is_one_line_naming_what_it_must_be(
    key: str, value: Any, message: str
) -> None:
    with pytest.raises(tx.RuntimeJobError, match=f"^{re.escape(message)}$"):
        tx.Job().option(key, value)


def test_good_option_values_are_kept() -> None:
    job = tx.Job().option("snapshotEvery", 3).option("idleBatches", 1).option("allFailLimit", 0)
    job = job.option("onError", "stop").option("merge", "event-time")
    job = job.option("crossPartition", "defer")
    assert (job._snapshot_every, job._idle_batches, job._all_fail_limit) == (3, 1, 0)
    assert (job._on_error, job._merge, job.spec.cross_partition) == ("stop", "event-time", "defer")


class _Input:
    def __init__(self, keys: Any, order: Any = "t") -> None:
        self.keys, self.order = keys, order


@pytest.mark.parametrize(
    ("boundary", "inputs", "message"),
    [
        (
            PerTimeslice(1.0, "clock"),
            {"a": _Input(())},
            "boundary timeslice of='clock' names no input; inputs: a",
        ),
        (
            PerTimeslice(1.0, "clock"),
            {"clock": _Input([["k"]])},
            "the timeslice input 'clock' must have keys=() so that every partition sees its "
            "events (one slice clock); put keyed events in another input",
        ),
        (
            PerPunctuation("cti"),
            {"a": _Input(()), "b": _Input(())},
            "boundary punctuation of='cti' names no input; inputs: a, b",
        ),
        (
            PerPunctuation("cti"),
            {"cti": _Input([["k"]])},
            "the punctuation input 'cti' must have keys=() so that every partition sees each CTI",
        ),
    ],
)
def test_a_boundary_input_that_not_every_partition_sees_is_one_line(
    boundary: Any, inputs: dict[str, Any], message: str
) -> None:
    with pytest.raises(tx.RuntimeJobError, match=f"^{re.escape(message)}$"):
        boundary.validate(inputs)


def test_an_unkeyed_boundary_input_passes() -> None:
    PerTimeslice(1.0, "clock").validate({"clock": _Input(())})
    PerPunctuation("cti").validate({"cti": _Input(())})
