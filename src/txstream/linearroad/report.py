"""The outcome of a Linear Road run: response times, the validator's counts, a latency plot.

Response time is wall-clock from the moment a tuple was handed to Spark to the
moment the transaction holding its answer committed (the paper's Section 5.4
measure).  The benchmark's requirement is every answer within 5 seconds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from txstream.errors import TxStreamError
from txstream.linearroad.engine import Latency
from txstream.storage.files import write_whole, writing

LIMIT_S = 5.0
"""Linear Road's response-time limit."""

TYPE_NAMES = {0: "toll", 1: "accident", 2: "balance", 3: "expenditure"}


class FellBehind(TxStreamError):
    """The run's answers lag the input by more than the run was told to accept."""


def response_stats(latencies: Sequence[Latency]) -> dict[str, float]:
    """Max, p99, mean response time and the share within :data:`LIMIT_S` (percent)."""
    if not latencies:
        return {"max_response_s": 0.0, "p99_response_s": 0.0, "mean_response_s": 0.0,
                "within_5s_pct": 100.0}  # fmt: skip
    times = sorted(x.committed - x.handoff for x in latencies)
    p99 = times[min(len(times) - 1, int(0.99 * len(times)))]
    within = sum(1 for t in times if t <= LIMIT_S)
    return {
        "max_response_s": round(times[-1], 3),
        "p99_response_s": round(p99, 3),
        "mean_response_s": round(sum(times) / len(times), 3),
        "within_5s_pct": round(100.0 * within / len(times), 3),
    }


def summary(
    *,
    variant: str,
    txn_size: str,
    lav: str,
    speedup: float | None,
    tuples: int,
    latencies: Sequence[Latency],
    engine_stats: dict[str, int],
    validation: Any | None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The run's ``summary.json`` content (``validation``: a ValidationReport or None)."""
    out: dict[str, Any] = {"variant": variant, "txn_size": txn_size, "lav": lav,
                           "speedup": speedup, "tuples": tuples}  # fmt: skip
    if validation is not None:
        totals = validation.totals
        out.update(
            wrong=totals["wrong"],
            missing=totals["missing"],
            duplicates=totals["duplicates"],
            answers_expected=totals["expected"],
            valid=validation.ok,
            by_type={k: vars(v) for k, v in validation.by_type.items()},
        )
    else:
        out.update(wrong=None, missing=None, duplicates=None, valid=None)
    out.update(response_stats(latencies))
    if latencies:
        first = min(x.handoff for x in latencies)
        last = max(x.committed for x in latencies)
        out["throughput_tuples_per_s"] = round(tuples / max(last - first, 1e-9), 1)
    else:
        out["throughput_tuples_per_s"] = 0.0
    out["answers_committed"] = len(latencies)
    out["per_type_max_response_s"] = {
        name: round(
            max((x.committed - x.handoff for x in latencies if x.type == t), default=0.0), 3
        )
        for t, name in TYPE_NAMES.items()
    }
    out["engine"] = engine_stats
    out.update(extra or {})
    return out


def write_summary(path: str | Path, data: dict[str, Any]) -> None:
    """Write ``data`` as indented JSON (whole or not at all; a failure names the file)."""
    write_whole(Path(path), json.dumps(data, indent=2) + "\n")


def table(data: dict[str, Any]) -> str:
    """The summary as a short human-readable table."""
    rows = [
        ("variant", data["variant"]),
        ("transaction size", data["txn_size"]),
        ("LAV", data["lav"]),
        ("speedup", f"{data['speedup']:g}" if data.get("spark", True) else "none (Python replay)"),
        ("tuples", data["tuples"]),
        ("answers committed", data["answers_committed"]),
        ("wrong / missing / duplicates",
         f"{data['wrong']} / {data['missing']} / {data['duplicates']}"),
        ("max response", f"{data['max_response_s']:.3f} s"),
        ("p99 response", f"{data['p99_response_s']:.3f} s"),
        ("within 5 s", f"{data['within_5s_pct']:.2f} %"),
        ("throughput", f"{data['throughput_tuples_per_s']:.0f} tuples/s"),
        ("rolled back", data["engine"].get("rolled_back", 0)),
        ("rejected input lines", data.get("rejected_lines", 0)),
    ]  # fmt: skip
    if data.get("resumed") or data.get("resumed_from_line"):
        # A resumed run counted only its own start, which read as answers
        # missing (11,169 committed of 14,905 expected, yet 0 missing).  The
        # runtime's in-process replay counts the whole input's tuples.
        whole = data.get("execution") == "runtime" and not data.get("spark", True)
        counted = "answers, responses" if whole else "tuples, answers, responses"
        rows.insert(3, ("resumed", f"yes: {counted} are this start's only"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    by_type = data.get("by_type")
    if by_type:
        lines.append("")
        lines.append(
            f"{'answer':<12}{'expected':>10}{'correct':>10}{'wrong':>8}{'missing':>9}{'dup':>6}"
        )
        for name, c in by_type.items():
            lines.append(
                f"{name:<12}{c['expected']:>10}{c['correct']:>10}{c['wrong']:>8}"
                f"{c['missing']:>9}{c['duplicates']:>6}"
            )
    return "\n".join(lines)


def plot_latency(path: str | Path, latencies: Sequence[Latency], title: str) -> None:
    """Response time over the run (worst per second, by answer type) and its distribution."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    if latencies:
        start = min(x.handoff for x in latencies)
        for t, name in TYPE_NAMES.items():
            worst: dict[int, float] = {}
            for x in latencies:
                if x.type == t:
                    s = int(x.handoff - start)
                    worst[s] = max(worst.get(s, 0.0), x.committed - x.handoff)
            if worst:
                secs = sorted(worst)
                left.plot(secs, [worst[s] for s in secs], ".", markersize=2, label=name)
        times = sorted(x.committed - x.handoff for x in latencies)
        right.plot(times, [100.0 * (i + 1) / len(times) for i in range(len(times))])
    for ax in (left, right):
        ax.grid(alpha=0.3)
    left.axhline(LIMIT_S, color="red", linewidth=0.8, label="5 s limit")
    left.set_xlabel("wall time since the first handoff (s)")
    left.set_ylabel("worst response time in that second (s)")
    left.legend(fontsize=8)
    right.axvline(LIMIT_S, color="red", linewidth=0.8)
    right.set_xlabel("response time (s)")
    right.set_ylabel("answers within (%)")
    right.set_xscale("symlog", linthresh=0.01)
    fig.suptitle(title)
    fig.tight_layout()
    try:
        with writing(Path(path)):
            fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
