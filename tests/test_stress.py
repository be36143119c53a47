"""Concurrent stress runs, the stress command, and crash safety under SIGKILL."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from txstream.cli import main
from txstream.errors import TxStreamError
from txstream.model import check, parse_one
from txstream.storage import OrderError
from txstream.testing import counter_process
from txstream.txn import TransactionManager
from txstream.txn.stress import run_stress


@pytest.mark.parametrize(
    ("protocol", "ordered"),
    [
        ("ss2pl", False),
        ("ss2pl", True),
        ("optimistic", False),
        ("optimistic", True),
        ("snapshot", False),
    ],
)
def test_stress_histories_are_serializable(protocol, ordered) -> None:
    summary, tm = run_stress(
        protocol, threads=8, transactions=3000, items=40, ordered=ordered, seed=7
    )
    assert summary["committed"] == 3000 and summary["sum_ok"]
    history = tm.history(committed_only=True)
    assert check(history, "csao" if ordered else "cs").holds
    if ordered:
        assert len(history.arrivals["events"]) == 3000
    tm.locks.check_idle()


@pytest.fixture
def fast_switching():
    """Switch threads often, so that short runs really interleave."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


def test_high_contention_run_finishes_with_deadlocks_resolved(fast_switching) -> None:
    summary, tm = run_stress("ss2pl", threads=8, transactions=3000, items=4, seed=3)
    assert summary["committed"] == 3000 and summary["deadlocks"] > 0
    assert summary["retries"] == summary["aborted"] and summary["sum_ok"]
    assert check(tm.history(committed_only=True), "cs").holds


def test_none_produces_non_serializable_histories_under_contention(fast_switching) -> None:
    failures = 0
    for seed in range(12):
        _summary, tm = run_stress("none", threads=8, transactions=3000, items=6, seed=seed)
        if not check(tm.history(committed_only=True), "cs").holds:
            failures += 1
            break
    assert failures, "none never produced a non-serializable history in 5 runs"


def test_snapshot_isolation_updates_are_not_serializable(fast_switching) -> None:
    bad = 0
    for seed in range(12):
        _, tm = run_stress("snapshot", 8, 2000, items=6, seed=seed, snapshot_updates="si")
        if not check(tm.history(committed_only=True), "cs").holds:
            bad += 1
            break
    assert bad


def test_stress_command(tmp_path, capsys) -> None:
    hist = tmp_path / "h.txt"
    rc = main(
        [
            "stress",
            "--protocol",
            "ss2pl",
            "--threads",
            "4",
            "--transactions",
            "500",
            "--ordered",
            "--history",
            str(hist),
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["check"] == {"criterion": "csao", "holds": True}
    for key in ("committed", "aborted", "deadlocks", "retries", "seconds"):
        assert key in out
    history = parse_one(hist.read_text())
    assert history.arrivals and check(history, "csao").holds
    assert main(["check", "-c", "csao", str(hist)]) == 0
    capsys.readouterr()
    rc = main(["stress", "-p", "none", "-n", "4", "-m", "3000", "-k", "5", "--history", str(hist)])
    out = json.loads(capsys.readouterr().out)
    assert rc == (0 if out["check"]["holds"] and out["sum_ok"] else 1)


def test_stress_command_bad_input(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["stress", "--threads", "0", "--history", str(tmp_path / "h")])
    assert exc.value.code == 2
    assert main(["stress", "-p", "none", "--ordered", "-m", "5", "--history", "h"]) == 2
    assert "predefined order" in capsys.readouterr().err
    rc = main(["stress", "-m", "5", "--history", str(tmp_path / "no" / "such" / "h")])
    assert rc == 2 and "cannot write history file" in capsys.readouterr().err


def _verify(path, sync="commit"):
    """Reopen the store: exactly events 0..n-1, each once, in sums and out."""
    tm = TransactionManager("ss2pl", path=path, sync=sync)
    n = int(tm.offset("gen", 0))
    out = tm.store.streams.get("out")
    events = out.committed() if out is not None else []
    assert events == list(range(n)), f"stream out holds {events[-5:]} for offset {n}"
    sums = tm.store.tables["sums"].snapshot() if "sums" in tm.store.tables else {}
    expected = {}
    for i in range(n):
        expected[i % 7] = expected.get(i % 7, 0) + i
    assert sums == expected
    report = tm.recovery
    tm.close()
    return n, report


def test_sigkill_at_random_moments_loses_and_duplicates_nothing(tmp_path) -> None:
    rng = random.Random(2026)
    path = tmp_path / "db"
    offsets = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for round_no in range(22):
        sync = ("commit", "group", "off")[round_no % 3]
        every = "37" if round_no % 2 else "0"  # checkpoints in every other round
        proc = subprocess.Popen(
            [sys.executable, "-m", "txstream.testing", str(path), sync, every],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        assert line.startswith("ready"), line
        time.sleep(rng.uniform(0.0, 0.15))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        n, report = _verify(path, sync)
        assert report is not None and not report.corrupt
        offsets.append(n)
    assert offsets == sorted(offsets) and offsets[-1] > 100
    # The worker picks up exactly where the last committed offset left it.
    assert counter_process(str(path), "off", limit=offsets[-1] + 5) == offsets[-1] + 5
    assert _verify(path)[0] == offsets[-1] + 5


def test_uncommitted_work_vanishes_on_reopen(tmp_path) -> None:
    tm = TransactionManager("ss2pl", path=tmp_path)
    acct = tm.table("acct")
    with tm.begin() as t:
        t.insert(acct, "a", 1)
    t = tm.begin()
    t.increment(acct, "a", 5)
    t.insert(acct, "b", 2)
    # the process "dies" here: no commit, no abort (closing gives up the store
    # directory's lock as death would; it writes nothing of t)
    tm.close()
    again = TransactionManager("ss2pl", path=tmp_path)
    assert again.table("acct").rows() == {"a": 1}
    assert again.recovery.clean and again.recovery.transactions == 1


@pytest.mark.parametrize("protocol", ["ss2pl", "optimistic", "snapshot", "none"])
def test_every_protocol_is_durable(tmp_path, protocol) -> None:
    tm = TransactionManager(protocol, path=tmp_path, sync="group")
    acct = tm.table("acct")
    out = tm.stream("out", order_by=0, require_order=True, granularity="range", range_size=2)
    for i in range(5):
        with tm.begin() as t:
            if i == 0:
                t.insert(acct, "a", 0)
            else:
                t.increment(acct, "a", i)
            t.append(out, [i, f"e{i}"])
            t.commit_offset("src", i + 1)
    with pytest.raises(RuntimeError), tm.begin() as t:
        t.increment(acct, "a", 100)
        t.append(out, [9, "lost"])
        raise RuntimeError
    tm.close()
    again = TransactionManager(protocol, path=tmp_path)
    assert again.table("acct").snapshot() == {"a": 10}
    assert again.stream("out").committed() == [[i, f"e{i}"] for i in range(5)]
    assert again.offset("src") == 5 and again.recovery.transactions == 5
    with again.begin() as t:
        t.append("out", [5, "e5"])
        with pytest.raises(OrderError):
            t.append("out", [4, "late"])
    again.close()


def test_checkpoint_empties_the_log_and_recovery_uses_it(tmp_path) -> None:
    tm = TransactionManager("ss2pl", path=tmp_path)
    acct = tm.table("acct")
    out = tm.stream("out", granularity="event")
    for i in range(10):
        with tm.begin() as t:
            t.put(acct, (i % 3, "k"), {"n": i})
            t.append(out, i)
            t.commit_offset("src", i + 1)
    running = tm.begin()  # in flight across the checkpoint: not in it
    running.append(out, "pending")
    size_before = (tmp_path / "wal.log").stat().st_size
    assert tm.checkpoint() > 0
    assert (tmp_path / "wal.log").stat().st_size < size_before
    running.commit()
    with tm.begin() as t:
        t.delete(acct, (0, "k"))
        t.commit_offset("src", 11)
    tm.close()
    again = TransactionManager("ss2pl", path=tmp_path)
    assert again.table("acct").snapshot() == {(1, "k"): {"n": 7}, (2, "k"): {"n": 8}}
    assert again.stream("out").committed() == [*range(10), "pending"]
    assert again.offset("src") == 11 and again.recovery.transactions == 2
    with pytest.raises(TxStreamError, match="no log"):
        TransactionManager().checkpoint()
