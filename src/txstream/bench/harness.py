"""The shared bench harness: grids of parameter points, repetitions, CSV and plots.

Call order: :func:`run_experiment` walks ``grid`` (or ``quick_grid``) x
``repetitions``, in rounds: every point once, then every point again, so that a
shared host's slow minutes hit all points alike rather than all repetitions of one;
for each pair it calls ``run(point, seed)``, which must return a dict of metrics;
every row (parameters, ``rep``, ``seed``, metrics) goes to ``<out>/<name>.csv`` in
the grid's order; afterwards each :class:`Figure` becomes ``<out>/<figure>.png``,
plotting the mean over repetitions with min-max bars.
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txstream.bench.values import BadValueError, parse_float, parse_int
from txstream.errors import TxStreamError
from txstream.storage.files import check_folder, writing

Point = dict[str, Any]
Metrics = dict[str, Any]


@dataclass(frozen=True)
class Figure:
    """One plot: ``y`` against ``x``, a line per ``series`` value, a panel per ``facet``.

    ``y`` may name several metric columns; each then becomes a line of its own
    (and ``series`` further splits them: a colour per series value, a line style
    per metric).  ``kind="bar"``: grouped bars instead of lines, a group per ``x``
    value (in the rows' order) and a bar per series, for categories such as
    workloads.
    """

    name: str
    x: str
    y: str | tuple[str, ...]
    title: str
    series: str | None = None
    facet: str | None = None
    logx: bool = False
    logy: bool = False
    ylabel: str | None = None
    hline: float | None = None  # a target line, e.g. a speed goal
    where: tuple[tuple[str, Any], ...] = ()  # plot only rows with these (column, value)s
    # (a frozenset value: any of its values)
    kind: str = "line"  # or "bar"


@dataclass(frozen=True)
class Param:
    """What ``bench --set NAME=VALUE`` accepts for one parameter of an experiment.

    ``kind`` is ``int``, ``float``, ``bool`` or ``str``; numbers must be finite and
    within ``[lo, hi]`` (``lo_open``: strictly above ``lo``); a string must be one
    of ``choices`` when they are given.
    """

    kind: type
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    choices: tuple[str, ...] = ()

    def parse(self, text: str) -> Any:
        """``text`` as this parameter's value; :class:`BadValueError` if it is not one."""
        if self.kind is bool:
            word = text.strip().lower()
            if word in _TRUE:
                return True
            if word in _FALSE:
                return False
            raise BadValueError(f"not true or false: {text!r}")
        if self.kind is int:
            lo = None if self.lo is None else int(self.lo) + (1 if self.lo_open else 0)
            return parse_int(text, lo, None if self.hi is None else int(self.hi))
        if self.kind is float:
            return parse_float(text, self.lo, self.hi, lo_open=self.lo_open)
        if self.choices and text not in self.choices:
            raise BadValueError(f"{text!r} is not one of: {', '.join(self.choices)}")
        if not text:
            raise BadValueError("empty value")
        return text


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")

INFERRED_SCALE = 100
"""A numeric parameter an experiment does not declare may be at most this many
times the largest value its grids use (a typo such as ``seconds=2e9`` fails)."""


@dataclass
class Experiment:
    """A named experiment: what to vary, how to measure one point, what to plot."""

    name: str
    description: str
    grid: list[Point]
    quick_grid: list[Point]
    run: Callable[[Point, int], Metrics]
    figures: list[Figure] = field(default_factory=list)
    repetitions: int = 3
    quick_repetitions: int = 1
    spark_default: bool = False
    """Run the full grid's points as Spark tasks unless told otherwise (independent,
    simulated-time points such as the broadcast sweep)."""
    wants_out: bool = False
    """Pass the output folder to ``run`` as the point's ``_out`` (not written to the CSV)."""
    summarize: Callable[[list[dict[str, Any]]], str] | None = None
    """Conclusions drawn from all rows (e.g. the largest speedup meeting a limit),
    as Markdown: written to ``<out>/<name>-summary.md`` and printed."""
    params: dict[str, Param] = field(default_factory=dict)
    """Types and ranges of the parameters ``bench --set`` may change; a parameter
    not declared here is checked against the values its grids use (see
    :func:`param_spec`)."""
    same_seed: tuple[str, ...] = ()
    """Parameters that do not change a run's seed: points that differ only in these
    get the same seed in each repetition (the first such point's), e.g. the
    scheduler, so that every scheduler of a repetition sees the same input."""


def param_spec(exp: Experiment, name: str) -> Param:
    """How ``--set name=...`` is checked for ``exp``: declared, or inferred from the grids.

    Inferred: ``bool`` if every grid value is a bool, a non-negative ``int`` if
    every value is an integer, a non-negative finite ``float`` if every value is
    a number (both at most :data:`INFERRED_SCALE` times the largest grid value,
    and at least up to 1), otherwise any non-empty string.
    """
    if name in exp.params:
        return exp.params[name]
    values = [p[name] for p in [*exp.grid, *exp.quick_grid] if name in p]
    if values and all(isinstance(v, bool) for v in values):
        return Param(bool)
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if values and len(numbers) == len(values):
        kind = int if all(isinstance(v, int) for v in numbers) else float
        return Param(kind, lo=0, hi=max(1, INFERRED_SCALE * max(numbers)))
    return Param(str)


def _assignments(
    exp: Experiment, option: str, items: list[str], extra: set[str] | None = None
) -> list[tuple[str, str]]:
    """``PARAM=VALUE`` items as pairs; one line naming the problem for a bad one."""
    known = {k for point in [*exp.grid, *exp.quick_grid] for k in point} | (extra or set())
    pairs = []
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise TxStreamError(f"{option} {item!r} is not PARAM=VALUE")
        if key not in known:
            raise TxStreamError(
                f"experiment {exp.name} has no parameter {key}; "
                f"its parameters: {', '.join(sorted(known))}"
            )
        pairs.append((key, text))
    return pairs


def apply_overrides(exp: Experiment, items: list[str]) -> Experiment:
    """``exp`` with each ``PARAM=VALUE`` of ``items`` set in every point of both grids.

    Each value is parsed and checked against :func:`param_spec`, so a bad one
    (``threads=-1``, ``threads=abc``, ``t=nan``) fails here with one line instead
    of deep inside a run (a barrier that never fills, a ``TypeError``).
    """
    if not items:
        return exp
    overrides: dict[str, Any] = {}
    for key, text in _assignments(exp, "--set", items, set(exp.params)):
        try:
            overrides[key] = param_spec(exp, key).parse(text)
        except BadValueError as exc:
            raise TxStreamError(f"--set {key}={text}: {exc} (experiment {exp.name})") from None
    return dataclasses.replace(
        exp,
        grid=[{**p, **overrides} for p in exp.grid],
        quick_grid=[{**p, **overrides} for p in exp.quick_grid],
    )


def select_points(exp: Experiment, items: list[str]) -> Experiment:
    """``exp`` with only the points whose ``PARAM`` is ``VALUE``, for each ``PARAM=VALUE``.

    Values are compared as the points print them (``str``); a parameter the
    experiment does not have, or a choice that leaves no point, is an error.
    """
    if not items:
        return exp
    wanted: dict[str, set[str]] = {}
    for key, text in _assignments(exp, "--only", items):
        wanted.setdefault(key, set()).add(text)

    def keep(point: Point) -> bool:
        return all(str(point.get(k)) in values for k, values in wanted.items())

    chosen = dataclasses.replace(
        exp,
        grid=[p for p in exp.grid if keep(p)],
        quick_grid=[p for p in exp.quick_grid if keep(p)],
    )
    if not chosen.grid and not chosen.quick_grid:
        raise TxStreamError(f"--only {' '.join(items)} leaves no point of experiment {exp.name}")
    return chosen


Mapper = Callable[[Callable[[tuple[Point, int]], Metrics], list[tuple[Point, int]]], list[Metrics]]
"""Runs ``fn`` over a list of ``(point, seed)`` pairs, keeping their order (e.g. as Spark tasks)."""


def run_experiment(
    exp: Experiment,
    out: Path,
    quick: bool = False,
    progress: bool = True,
    seed: int = 0,
    mapper: Mapper | None = None,
) -> list[dict[str, Any]]:
    """Run every point of ``exp``, write its CSV and plots into ``out``; return the rows.

    With ``mapper`` the points run through it (all at once, e.g. one Spark task
    each) instead of one after another with a progress bar; seeds are the same.
    """
    grid = exp.quick_grid if quick else exp.grid
    reps = exp.quick_repetitions if quick else exp.repetitions
    if not grid or reps < 1:
        raise TxStreamError(f"experiment {exp.name} has nothing to run")
    check_folder(out)  # the CSV and figures are written after every point ran
    by_point = [(point, rep) for point in grid for rep in range(reps)]
    # Seeds follow the grid's order (a point's seed does not depend on the run
    # order); the runs go in rounds, the grid's order within each.
    order = sorted(range(len(by_point)), key=lambda i: by_point[i][1])
    tasks = [by_point[i] for i in order]
    first: dict[tuple[tuple[str, str], ...], int] = {}
    # The grid position whose seed each point takes: its own, or that of the first
    # point equal to it but for ``same_seed`` (seeds stay as before without it).
    home = (
        [
            first.setdefault(
                tuple(sorted((k, repr(v)) for k, v in point.items() if k not in exp.same_seed)), g
            )
            for g, point in enumerate(grid)
        ]
        if exp.same_seed
        else list(range(len(grid)))
    )
    seeded = [
        (dict(point), seed * 1_000_003 + rep * 7919 + home[i // reps] * reps + rep)
        for i in order
        for point, rep in [by_point[i]]
    ]
    done: dict[int, dict[str, Any]] = {}  # (by grid position)
    if mapper is not None:
        if progress:
            print(f"bench {exp.name}: {len(seeded)} runs as parallel tasks", flush=True)
        run = exp.run
        results = mapper(lambda ps: run(dict(ps[0]), ps[1]), seeded)
        for i, (point, rep), (_, run_seed), metrics in zip(
            order, tasks, seeded, results, strict=True
        ):
            done[i] = {**point, "rep": rep, "seed": run_seed, **metrics}
    else:
        with _progress(progress, f"bench {exp.name}", len(tasks)) as advance:
            for i, (point, rep), (_, run_seed) in zip(order, tasks, seeded, strict=True):
                given = {**point, "_out": str(out)} if exp.wants_out else dict(point)
                metrics = exp.run(given, run_seed)
                done[i] = {**point, "rep": rep, "seed": run_seed, **metrics}
                advance(_describe(point, metrics))
    rows = [done[i] for i in range(len(by_point))]
    write_csv(rows, out / f"{exp.name}.csv")
    for fig in exp.figures:
        plot(rows, fig, out / f"{fig.name}.png")
    if exp.summarize is not None:
        text = exp.summarize(rows)
        summary = out / f"{exp.name}-summary.md"
        with writing(summary):
            summary.write_text(text + "\n")
        if progress:
            print(text, flush=True)
    return rows


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """Write rows with the union of their keys as columns, in first-seen order."""
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with writing(path), path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def _wanted(row: dict[str, Any], fig: Figure) -> bool:
    """Whether ``row`` passes ``fig.where`` (a frozenset value allows any of its values)."""
    return all(
        row.get(k) in v if isinstance(v, frozenset) else row.get(k) == v for k, v in fig.where
    )


def aggregate(
    rows: list[dict[str, Any]], fig: Figure
) -> dict[Any, dict[Any, list[tuple[Any, float, float, float]]]]:
    """Group rows as facet -> series -> [(x, mean, min, max)] sorted by x."""
    groups: dict[Any, dict[Any, dict[Any, list[float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(list))
    )
    metrics = (fig.y,) if isinstance(fig.y, str) else fig.y
    for row in rows:
        if not _wanted(row, fig):
            continue
        facet = row.get(fig.facet) if fig.facet else None
        for metric in metrics:
            if row.get(metric) is None:
                continue
            if fig.series and len(metrics) > 1:
                series: Any = f"{row.get(fig.series)} {metric}"
            elif fig.series:
                series = row.get(fig.series)
            else:
                series = metric
            groups[facet][series][row[fig.x]].append(float(row[metric]))
    return {
        facet: {
            series: [(x, statistics.fmean(ys), min(ys), max(ys)) for x, ys in sorted(by_x.items())]
            for series, by_x in by_series.items()
        }
        for facet, by_series in groups.items()
    }


def plot(rows: list[dict[str, Any]], fig: Figure, path: Path) -> None:
    """Draw ``fig`` from ``rows`` into a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = aggregate(rows, fig)
    facets = list(data) or [None]
    metrics = (fig.y,) if isinstance(fig.y, str) else fig.y
    # bars: the groups in the order the rows first show them (the grid's order)
    shown = [
        r.get(fig.x) for r in rows if _wanted(r, fig) and any(r.get(m) is not None for m in metrics)
    ]
    order = {x: i for i, x in enumerate(dict.fromkeys(shown))}
    width = 5.5 * len(facets)
    height = 4.2
    if max((len(v) for v in data.values()), default=0) > 6:
        width += 4  # room for the legend beside the plot
    if fig.kind == "bar":
        width, height = max(width, 1.1 * len(order) + 4), 5.2
    figure, axes = plt.subplots(1, len(facets), figsize=(width, height), squeeze=False)
    styles = ("-", "--", ":", "-.")
    for ax, facet in zip(axes[0], facets, strict=True):
        series_all = list(data.get(facet, {}).items())
        colours: dict[Any, Any] = {}
        widths: list[float] = []
        for n, (series, points) in enumerate(series_all):
            means = [p[1] for p in points]
            lows = [max(0.0, p[1] - p[2]) for p in points]
            highs = [max(0.0, p[3] - p[1]) for p in points]
            if fig.kind == "bar":
                # a group holds the bars of the series it has, side by side, centred
                xs = []
                for p in points:
                    there = [
                        m for m, (_, pts) in enumerate(series_all) if any(q[0] == p[0] for q in pts)
                    ]
                    step = 0.8 / len(there)
                    xs.append(order[p[0]] - 0.4 + step * (there.index(n) + 0.5))
                    widths.append(step)
                ax.bar(
                    xs,
                    means,
                    widths[-len(points) :],
                    yerr=[lows, highs],
                    capsize=2,
                    label=str(series),
                    color=f"C{n % 10}",
                )
                continue
            xs = [p[0] for p in points]
            style = "-"
            if fig.series and len(metrics) > 1:
                # "<series value> <metric>": one colour per series value, a style per metric
                head, _, metric = str(series).rpartition(" ")
                style = styles[metrics.index(metric) % len(styles)] if metric in metrics else "-"
                colour = colours.setdefault(head, f"C{len(colours) % 10}")
            else:
                colour = f"C{n % 10}"
            ax.errorbar(
                xs,
                means,
                yerr=[lows, highs],
                marker="o",
                capsize=3,
                label=str(series),
                color=colour,
                linestyle=style,
            )
        if fig.kind == "bar" and order:
            ticks = sorted(order.items(), key=lambda kv: kv[1])
            ax.set_xticks([i for _, i in ticks])
            ax.set_xticklabels([str(x) for x, _ in ticks], rotation=30, ha="right")
        if fig.hline is not None:
            ax.axhline(fig.hline, color="grey", linestyle="--", linewidth=1)
        ax.set_xlabel(fig.x)
        ax.set_ylabel(fig.ylabel or (fig.y if isinstance(fig.y, str) else ", ".join(fig.y)))
        if fig.logx:
            ax.set_xscale("log")
            ticks = sorted({p[0] for pts in data.get(facet, {}).values() for p in pts})
            if ticks and all(isinstance(t, int | float) for t in ticks):
                # the values themselves (1, 2, 8, 32), not powers of ten
                ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
                ax.minorticks_off()
        if fig.logy:
            ax.set_yscale("log")
        ax.set_title(f"{fig.title}" + (f" ({fig.facet}={facet})" if fig.facet else ""))
        ax.grid(True, alpha=0.3)
        if not data.get(facet):  # e.g. a figure of points that --only left out
            ax.text(0.5, 0.5, "no points in these runs", ha="center", transform=ax.transAxes)
        elif fig.kind == "bar" or len(data.get(facet, {})) > 6:
            ax.legend(title=fig.series, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        elif fig.series or not isinstance(fig.y, str):
            ax.legend(title=fig.series)
    figure.tight_layout()
    try:
        with writing(path):
            figure.savefig(path, dpi=110)
    finally:
        plt.close(figure)


def _describe(point: Point, metrics: Metrics) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in point.items())
    first = next(iter(metrics.items()), None)
    if first is not None:
        value = f"{first[1]:.4g}" if isinstance(first[1], float) else str(first[1])
        shown += f" -> {first[0]}={value}"
    return shown


class _progress:
    """A rich progress bar on stderr when it is a terminal, plain lines otherwise."""

    def __init__(self, enabled: bool, title: str, total: int) -> None:
        self.enabled = enabled
        self.title = title
        self.total = total
        self.done = 0
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> Callable[[str], None]:
        if self.enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                TextColumn("{task.fields[last]}"),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(self.title, total=self.total, last="")
        return self.advance

    def advance(self, text: str) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, advance=1, last=text)
        elif self.enabled:
            print(f"[{self.done}/{self.total}] {self.title}: {text}", file=sys.stderr, flush=True)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
