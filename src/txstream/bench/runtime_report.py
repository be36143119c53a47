"""The report of ``txstream bench runtime``: the goals checked on a run's rows, its figures.

:func:`summarize` turns the rows that :func:`~txstream.bench.runtime.run_point`
returned into the Markdown report (each goal of issues 13 and 28, met or not);
:data:`FIGURES` are the plots the harness draws from the same rows.
"""

from __future__ import annotations

from functools import partial
from statistics import median
from typing import Any

from txstream.bench.harness import Figure
from txstream.bench.runtime_points import (
    ACCOUNTS,
    DEFAULTS,
    FLOOD,
    LOAD,
    MASTERS,
    ONE_K,
    _get,
    setup,
    workload,
)


def _count(value: float | None) -> str:
    return "–" if value is None or value != value else f"{value:,.0f}"  # None, NaN: no value


def _share(value: Any) -> str:
    return "–" if value is None else f"{100 * float(value):.1f}%"


def _ratio(num: float, den: float, goal: float, what: str) -> str | None:
    if not num or not den:
        return None
    met = "met" if num / den >= goal else "not met"
    return f"- {what}: {num / den:.2f}x ({num:,.0f} / {den:,.0f}; goal {goal}x: {met})"


def summarize(rows: list[dict[str, Any]]) -> str:
    """The goals of the runtime issues (13 and 28), checked on this run's rows."""

    def typical(**where: Any) -> float:
        # The median over a point's repetitions (`bench --reps`): one slow or fast
        # minute of a shared host moves neither side of a ratio.
        vals = [r["txn_per_s"] for r in rows if all(_get(r, k) == v for k, v in where.items())]
        return float(median(vals)) if vals else 0.0

    def capacity(master: str, **where: Any) -> float:
        where = {**DEFAULTS, **where}
        return typical(
            engine="executors",
            master=master,
            rate=FLOOD,
            partitions=MASTERS[master],
            **where,
        )

    lines = [
        "| engine | setup | workload | offered events/s | txn/s | steady txn/s | p99 s | max s "
        "| serial share | hot floor | cross share | msgs/mp txn | bytes/mp txn | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for r in rows:
        lines.append(
            f"| {r['engine']} | {r.get('setup') or setup(r)} | {r.get('workload') or workload(r)} "
            f"| {r['rate']:,} | {r['txn_per_s']:,} | {_count(r.get('steady_txn_per_s'))} "
            f"| {r['p99_latency_s']} | {r['max_latency_s']} | {_share(r.get('serial_share'))} "
            f"| {_share(r.get('hot_floor'))} | {_share(r.get('cross_share'))} "
            f"| {r.get('msgs_per_mp_txn') if r.get('msgs_per_mp_txn') is not None else '–'} "
            f"| {r.get('bytes_per_mp_txn') if r.get('bytes_per_mp_txn') is not None else '–'} "
            f"| {r['errors']} |"
        )
        if r.get("note"):
            notes.append(f"- {r.get('setup') or setup(r)}, {workload(r)}: {r['note']}")
    lines.append("")
    cross0 = capacity("local[2]")
    uniform = capacity("local[2]", pattern="uniform")
    checks = [
        _ratio(cross0, capacity("local[1]"), 1.5, "capacity, local[2] / local[1] at cross 0"),
        _ratio(
            uniform,
            capacity("local[1]", pattern="uniform"),
            1.5,
            "capacity, local[2] / local[1] at uniform",
        ),
        _ratio(uniform, cross0, 0.9, "local[2], uniform / cross 0 (100k accounts)"),
        _ratio(
            capacity("local[2]", pattern="uniform", accounts=ONE_K),
            cross0,
            0.8,
            "local[2], uniform with 1k accounts / cross 0 (100k)",
        ),
        _ratio(
            capacity("local[2]", pattern="zipf", skew=0.8),
            cross0,
            0.8,
            "local[2], zipf 0.8 / cross 0",
        ),
        _ratio(
            capacity("local[2]", pattern="uniform", audit_every=1000),
            uniform,
            0.9,
            "local[2], uniform with an audit every 1,000 events / without",
        ),
    ]
    lines += [c for c in checks if c]
    defer = capacity("local[2]", pattern="uniform", cross_mode="defer")
    if defer and uniform:
        lines.append(
            f"- local[2], uniform: crossPartition forward / defer {uniform / defer:.2f}x "
            f"({uniform:,.0f} / {defer:,.0f})"
        )
    audited = [r for r in rows if _get(r, "audit_every") and r.get("audits") is not None]
    if audited:
        bad = sum(int(r.get("audit_violations") or 0) for r in audited)
        lines.append(
            f"- audits: {sum(int(r['audits']) for r in audited):,} in {len(audited)} runs, "
            f"{bad} violations (goal 0)"
        )
    shares: dict[tuple[str, float], dict[int, tuple[float, float]]] = {}
    for r in rows:
        if (
            r.get("serial_share") is not None
            and _get(r, "accounts") == ACCOUNTS
            and not _get(r, "audit_every")
            and _get(r, "pattern") in ("uniform", "zipf")
        ):
            key = (_get(r, "pattern"), float(_get(r, "skew")))
            shares.setdefault(key, {})[_get(r, "partitions")] = (
                float(r["serial_share"]),
                float(r.get("hot_floor") or 0.0),
            )
    for (pattern, skew), by_p in sorted(shares.items()):
        counted = ", ".join(
            f"P={n}: {_share(v[0])}" + (f" (hot floor {_share(v[1])})" if pattern == "zipf" else "")
            for n, v in sorted(by_p.items())
        )
        if pattern == "uniform":
            met = all(v[0] <= 0.05 for n, v in by_p.items() if n > 1)
            lines.append(
                f"- serial share, uniform 100k: {counted} (goal at most 5.0%: "
                + ("met" if met else "not met")
                + ")"
            )
        else:
            lines.append(f"- serial share, zipf {skew:g} 100k: {counted}")
    drv = typical(engine="driver", cross_partition_pct=10, rate=FLOOD)
    exe = capacity("local[2]", cross_partition_pct=10)
    if drv and exe:
        lines.append(
            f"- capacity, executors / driver engine at 10% cross: {exe / drv:.2f}x (goal 5x)"
        )
    for r in sorted(rows, key=lambda r: (_get(r, "cross_partition_pct"), r["rate"])):
        if r["engine"] == "executors" and r["master"] == "local[2]" and r["rate"] < FLOOD:
            steady, p99 = r.get("steady_txn_per_s"), r["p99_latency_s"]
            met = steady is not None and steady >= 50_000 and p99 is not None and p99 < 2
            lines.append(
                f"- local[2] at {r['rate']:,} events/s offered, {_get(r, 'cross_partition_pct')}% "
                f"cross: {_count(steady)} txn/s steady ({r['txn_per_s']:,} overall), "
                f"p99 {p99} s: goal 50,000 txn/s with p99 under 2 s "
                + ("met" if met else "not met")
            )
    lines.append(f"- errors in all runs: {sum(abs(r['errors']) for r in rows)} (goal 0)")
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines)


CROSS_ONLY = (
    ("pattern", "cross"),
    ("accounts", ACCOUNTS),
    ("audit_every", 0),
    ("cross_mode", "forward"),
)
"""The rows of the cross-share figures (those of issue 13): today's input, any partitions."""

_BY_CROSS = partial(Figure, x="cross_partition_pct", series="master", facet="engine")
"""The frame of issue 13's figures: against the cross-partition share, a line per master,
a panel per engine."""

FIGURES = [
    Figure(
        name="runtime_workloads",
        x="workload",
        y="txn_per_s",
        series="setup",
        kind="bar",
        title="capacity per workload, txn/s (dashed: 50k)",
        ylabel="transactions / s",
        hline=50_000.0,
        where=(("rate", FLOOD), ("engine", "executors")),
    ),
    Figure(
        name="runtime_serial_share",
        x="partitions",
        y=("serial_share", "hot_floor"),
        series="workload",
        logx=True,
        title="serial share (solid, counted) and hot floor (dashed)",
        ylabel="share of a batch's events",
        where=(
            ("engine", "executors"),
            ("cross_mode", "forward"),
            ("rate", FLOOD),
            ("accounts", ACCOUNTS),
            ("pattern", frozenset({"uniform", "zipf"})),
            ("partitions", frozenset({2, 8, 32})),
        ),
    ),
    _BY_CROSS(
        name="runtime",
        y="txn_per_s",
        title="capacity, txn/s (dashed: 50k)",
        ylabel="transactions / s",
        hline=50_000.0,
        where=(("rate", FLOOD), *CROSS_ONLY),
    ),
    _BY_CROSS(
        name="runtime_latency",
        y="p99_latency_s",
        title=f"p99 s at {LOAD // 1000}k/s offered (dashed: 2 s)",
        ylabel="seconds",
        hline=2.0,
        where=(("rate", LOAD), *CROSS_ONLY),
    ),
    Figure(
        name="runtime_latency_load",
        x="steady_txn_per_s",
        y="p99_latency_s",
        title="p99 against steady txn/s, local[2], 0% cross (dashed: 2 s)",
        ylabel="p99 latency, seconds",
        logy=True,
        hline=2.0,
        where=(
            ("engine", "executors"),
            ("master", "local[2]"),
            ("cross_partition_pct", 0),
            *CROSS_ONLY,
        ),
    ),
]
"""The figures of the experiment (see :class:`~txstream.bench.harness.Figure`)."""
