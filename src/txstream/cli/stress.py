"""``txstream stress``: many threads run random transactions; the history is checked.

Each of ``--transactions`` logical transactions is drawn from a random mix
(seeded per transaction, so a retry repeats the same work):

* 20% are read-only: 2-6 reads (under ``snapshot`` these use snapshots);
* the rest do 2-6 operations: reads, increments and read-then-write updates
  (the read takes a shared lock that the write must upgrade - the classic
  source of deadlocks).

Items are rows ``x.0`` ... ``x.K-1`` of table ``x``; half the accesses go to a
hot tenth of them, so there is contention.  A transaction that fails with a
retryable error (deadlock victim, failed validation, write conflict, wound) is
retried as a new transaction (a new id in the history) until it commits.

At the end the committed history goes to ``--history`` (with its ``arrival``
line, the begin order), is checked for ``cs`` (``csao`` when ordered), and the
table is checked against the workload: the sum of all rows must equal the
number of committed increments and updates.  A JSON summary goes to stdout; the
exit status is 0 only if the run finished and both checks pass.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from txstream.cli import Subparsers
from txstream.cli.types import json_safe, path_arg, positive_float, positive_int, seed
from txstream.errors import TxStreamError
from txstream.model import check, format_history
from txstream.storage.files import check_writable, write_whole
from txstream.txn import stress  # the module, so that a test can replace run_stress
from txstream.txn.protocols import PROTOCOLS


def command(args: argparse.Namespace) -> int:
    """Execute ``txstream stress``."""
    path = Path(args.history)
    if args.snapshot_updates is not None and args.protocol != "snapshot":
        # (accepted and ignored: only the snapshot protocol has the choice)
        raise TxStreamError(
            f"--snapshot-updates chooses how updates run under --protocol snapshot; "
            f"--protocol {args.protocol} has no such choice: leave it out"
        )
    check_writable(path, "history file ")  # before the run, not after it
    summary, tm = stress.run_stress(
        args.protocol,
        args.threads,
        args.transactions,
        args.items,
        args.ordered,
        args.seed,
        args.snapshot_updates or "locking",
        args.lock_timeout,
    )
    history = tm.history(committed_only=True)
    criterion = "csao" if args.ordered else "cs"
    verdict = check(history, criterion)
    text = format_history(history)
    write_whole(path, text + ("\n" if not text.endswith("\n") else ""), "history file ")
    summary["history"] = str(path)
    summary["operations"] = len(history)
    summary["check"] = {"criterion": criterion, "holds": verdict.holds}
    if not verdict.holds:
        cycle = verdict.evidence.get("cycle", [])
        summary["check"]["cycle"] = cycle[:6]  # the whole cycle: `txstream check FILE`
        summary["check"]["cycle_length"] = len(cycle)
        summary["check"]["cycle_shown"] = min(6, len(cycle))
    json.dump(json_safe(summary), sys.stdout, indent=2, allow_nan=False)
    sys.stdout.write("\n")
    return 0 if verdict.holds and summary["sum_ok"] else 1


def register_cli(subparsers: Subparsers) -> None:
    """Add the ``stress`` subcommand."""
    p = subparsers.add_parser(
        "stress",
        help="run random concurrent transactions and check the recorded history",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--protocol", "-p", default="ss2pl", choices=sorted(PROTOCOLS))
    p.add_argument("--threads", "-n", type=positive_int(256), default=4, help="threads (default 4)")
    p.add_argument(
        "--transactions",
        "-m",
        type=positive_int(1_000_000),
        default=10_000,
        help="transactions (default 10000)",
    )
    p.add_argument(
        "--items", "-k", type=positive_int(1_000_000), default=100, help="data items (default 100)"
    )
    p.add_argument(
        "--ordered",
        action="store_true",
        help="enforce arrival order (ss2pl, optimistic); the history is checked for csao",
    )
    p.add_argument("--seed", type=seed, default=0, help="workload seed (default 0)")
    p.add_argument(
        "--snapshot-updates",
        choices=("locking", "si"),
        default=None,  # (None: not given; another protocol refuses it rather than ignore it)
        help="under snapshot: update transactions lock (default; serializable) or use "
        "snapshot isolation (si; write skew possible)",
    )
    p.add_argument(
        "--lock-timeout",
        type=positive_float(86_400),
        default=None,
        help="lock-wait timeout, seconds",
    )
    p.add_argument(
        "--history", type=path_arg, required=True, metavar="FILE", help="write the history here"
    )
    p.set_defaults(func=command)
