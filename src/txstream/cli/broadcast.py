"""``txstream broadcast``: the C matrix of an update history, and simulation runs.

``txstream broadcast cmatrix FILE`` prints ``{"objects": [...], "C": [[...]]}``
for a history with commit cycles (``c1@3``); ``txstream broadcast simulate``
runs the discrete-event simulation once, prints its summary as JSON and can
write the recorded history for ``txstream check --criterion uc``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from txstream.broadcast.base import ALGORITHM_NAMES, BroadcastError
from txstream.broadcast.params import MAX_OBJECTS, SERVER_OPS, SimParams, step_budget
from txstream.cli import Group, Subparsers
from txstream.cli.types import (
    json_safe,
    nonnegative_float,
    nonnegative_int,
    path_arg,
    positive_float,
    positive_int,
    probability,
    seed,
)
from txstream.model import format_history, parse_one
from txstream.storage.files import check_writable, write_whole

MAX_TXNS = 10_000_000
MAX_BITS = 1e15
"""Bounds that catch typos: sizes and times (bit-units) far beyond any experiment."""


GROUP = Group("broadcast", help="broadcast disks: C matrix of a history, simulation runs")


def register_cli(group: Subparsers) -> None:
    """Add ``broadcast``'s subcommands (``cmatrix``, ``simulate``)."""
    c = group.add_parser(
        "cmatrix",
        help="the F-Matrix C of an update history with commit cycles (JSON)",
        description="Compute C with the incremental rules of Section 3.2.1. C[i][j] is "
        "C(ob_i, ob_j); objects are listed in order of first appearance.",
    )
    c.add_argument("file", metavar="FILE", help="a history in the notation, or - for stdin")
    c.add_argument(
        "--objects",
        metavar="A,B,...",
        help="the database's objects, in this order; any other object is an error",
    )
    c.set_defaults(func=run_cmatrix)

    s = group.add_parser(
        "simulate",
        help="one simulation run (Table 1 defaults); JSON summary",
        description="Simulate one server and one client; times are in bit-units.",
    )
    d = SimParams()
    s.add_argument("--algorithm", "-a", default=d.algorithm, help=", ".join(ALGORITHM_NAMES))
    s.add_argument(
        "--groups", type=positive_int(MAX_OBJECTS), help="number of groups (grouped algorithm only)"
    )
    s.add_argument("--client-length", type=positive_int(MAX_OBJECTS), default=d.client_txn_length)
    s.add_argument(
        "--server-length", type=nonnegative_int(MAX_OBJECTS), default=d.server_txn_length
    )
    s.add_argument(
        "--server-interarrival",
        type=positive_float(MAX_BITS),
        default=d.server_interarrival,
        help="mean bit-units between server transactions",
    )
    s.add_argument("--objects", type=positive_int(MAX_OBJECTS), default=d.objects)
    s.add_argument("--object-bytes", type=positive_int(2**30), default=d.object_bits // 8)
    s.add_argument("--server-read-prob", type=probability, default=d.server_read_prob)
    s.add_argument(
        "--server-ops",
        choices=SERVER_OPS,
        default=d.server_ops,
        help="update: every server operation writes its object (reading it first with "
        "the read probability); read-or-write: each is a read or a write",
    )
    s.add_argument("--op-delay", type=nonnegative_float(MAX_BITS), default=d.op_delay)
    s.add_argument("--txn-delay", type=nonnegative_float(MAX_BITS), default=d.txn_delay)
    s.add_argument("--timestamp-bits", type=nonnegative_int(64), default=d.timestamp_bits)
    s.add_argument("--transactions", type=positive_int(MAX_TXNS), default=d.transactions)
    s.add_argument(
        "--measured",
        type=positive_int(MAX_TXNS),
        default=None,  # (None: not given: the default is cut to --transactions, a value is not)
        help=f"statistics from the last N ({d.measured}, at most --transactions)",
    )
    s.add_argument(
        "--cache", type=nonnegative_float(1e9), metavar="CYCLES", help="client cache currency T"
    )
    s.add_argument("--client-update-prob", type=probability, default=0.0)
    s.add_argument("--max-cycles", type=positive_int(10**9), help="stop after this many cycles")
    s.add_argument(
        "--max-steps",
        type=positive_int(10**10),
        help="give up (exit 2) after this many simulation events "
        "(default: 1000 per transaction + 100,000)",
    )
    s.add_argument("--seed", type=seed, default=0)
    s.add_argument("--history", type=path_arg, metavar="FILE", help="write the recorded history")
    s.set_defaults(func=run_simulate)


def run_cmatrix(args: argparse.Namespace) -> int:
    """Execute ``txstream broadcast cmatrix``."""
    from txstream.broadcast.cmatrix import c_matrix

    if args.file == "-":
        text, source = sys.stdin.read(), "<stdin>"
    else:
        text, source = Path(args.file).read_text(), args.file
    history = parse_one(text, source)
    objects = None
    if args.objects is not None:
        objects = [o.strip() for o in args.objects.split(",") if o.strip()]
        if not objects:
            raise BroadcastError("--objects names no object; give e.g. --objects ob1,ob2")
    result = c_matrix(history, objects)
    print(json.dumps(result.to_json()))
    return 0


def run_simulate(args: argparse.Namespace) -> int:
    """Execute ``txstream broadcast simulate``."""
    from txstream.broadcast.sim import simulate

    if args.object_bytes < 1:
        raise BroadcastError(f"--object-bytes must be positive, got {args.object_bytes}")
    if args.measured is not None and args.measured > args.transactions:
        # (it was cut to --transactions without a word: the statistics covered fewer)
        raise BroadcastError(
            f"--measured {args.measured} is more than --transactions {args.transactions}; "
            "statistics come from the last --measured of them"
        )
    measured = SimParams().measured if args.measured is None else args.measured
    params = SimParams(
        algorithm=args.algorithm,
        groups=args.groups,
        client_txn_length=args.client_length,
        server_txn_length=args.server_length,
        server_interarrival=args.server_interarrival,
        objects=args.objects,
        object_bits=args.object_bytes * 8,
        server_read_prob=args.server_read_prob,
        server_ops=args.server_ops,
        op_delay=args.op_delay,
        txn_delay=args.txn_delay,
        timestamp_bits=args.timestamp_bits,
        transactions=args.transactions,
        measured=min(measured, args.transactions),
        cache_cycles=args.cache,
        client_update_prob=args.client_update_prob,
        max_cycles=args.max_cycles,
        max_steps=args.max_steps if args.max_steps else step_budget(args.transactions),
        record=args.history is not None,
    )
    params.validate()
    if args.server_ops == "update" and args.server_length > args.objects:
        # (the simulation cut it to the number of objects; its own checks first)
        raise BroadcastError(
            f"--server-length {args.server_length} is more than --objects {args.objects}: a "
            "server update transaction writes distinct objects"
        )
    if args.history is not None:
        check_writable(args.history)  # before the run, not after it
    result = simulate(params, args.seed)
    if args.history is not None and result.history is not None:
        write_whole(args.history, format_history(result.history, per_line=20) + "\n")
    print(json.dumps(json_safe(result.summary()), allow_nan=False))
    return 0
