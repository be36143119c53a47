"""``txstream check``: judge recorded histories against a correctness criterion.

On a terminal, each history's verdicts as text, long evidence cut short
(``--format text``); otherwise (a pipe, a file) one JSON object per history and
criterion with all the evidence (``--format json``); or a table of verdicts
(``--format table``).  Exit 0 when every verdict holds (with ``--expect``: when
every verdict matches the history's ``# expect:`` directive), 1 otherwise, 2 on
malformed input.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txstream.cli import Subparsers
from txstream.errors import TxStreamError
from txstream.model import CheckOptions, History, Verdict, check, criteria, parse
from txstream.model.notation import expected_verdicts
from txstream.spark.runtime.results import history_text, is_runtime_store


@dataclass
class Row:
    """One history's verdicts, for printing."""

    source: str
    index: int
    history: History
    verdicts: dict[str, Verdict | str]  # a string says why the criterion does not apply
    expected: dict[str, bool]

    def mismatches(self) -> list[str]:
        """Checked criteria whose verdict differs from the ``# expect:`` directive.

        A criterion the directive gives but the command did not check (``-c cs``
        on a history expecting ``cs`` and ``csao``) is not compared.
        """
        bad = []
        for name, want in self.expected.items():
            if name not in self.verdicts:
                continue
            got = self.verdicts[name]
            if not isinstance(got, Verdict) or got.holds != want:
                bad.append(name)
        return bad


MAX_SUBWINDOWS = 1_000_000
"""More sub-windows than this is taken for a typo (the checker itself takes any n)."""


def register_cli(sub: Subparsers) -> None:
    """Add the ``check`` subcommand."""
    names = list(criteria())
    p = sub.add_parser(
        "check",
        help="check histories (papers' notation) against a correctness criterion",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="FILE|DIR|-",
        help="history files, folders of *.txt history files, or - for stdin",
    )
    p.add_argument(
        "--criterion",
        "-c",
        default="cs",
        metavar="NAME",
        help=f"one of {', '.join(names)}, or 'all' (default: cs)",
    )
    p.add_argument(
        "--subwindows",
        type=int,
        metavar="N",
        help="number of sub-windows n for ws/lws (default: from the history)",
    )
    p.add_argument(
        "--format",
        choices=("text", "json", "table"),
        help="text (the default on a terminal), JSON lines with all the evidence (the "
        "default otherwise) or a table of verdicts",
    )
    p.add_argument(
        "--expect",
        action="store_true",
        help="compare with each history's '# expect:' directive; exit 0 iff all match",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Execute ``txstream check``."""
    known = list(criteria())
    if args.criterion == "all":
        chosen = known
    elif args.criterion in known:
        chosen = [args.criterion]
    else:
        raise TxStreamError(
            f"unknown criterion {args.criterion!r}; choose one of: {', '.join(known)}, all"
        )
    if args.subwindows is not None and not 1 <= args.subwindows <= MAX_SUBWINDOWS:
        raise TxStreamError(
            f"--subwindows must be at least 1 and at most {MAX_SUBWINDOWS:,}, not {args.subwindows}"
        )
    if args.format is None:  # a person reads a terminal; a pipe or a file gets JSON lines
        args.format = "text" if sys.stdout.isatty() else "json"
    many = len(chosen) > 1 or args.format == "table"
    rows: list[Row] = []
    for source, text in _read_inputs(args.inputs):
        for index, history in enumerate(parse(text, source), start=1):
            try:
                expected = expected_verdicts(history)
            except ValueError as exc:
                raise TxStreamError(f"{source}: history {index}: {exc}") from None
            for name in expected:
                if name not in known:
                    raise TxStreamError(
                        f"{source}: history {index}: '# expect:' names unknown criterion "
                        f"{name!r}; choose from: {', '.join(known)}"
                    )
            options = CheckOptions(subwindows=args.subwindows or _subwindows(history, source))
            verdicts: dict[str, Verdict | str] = {}
            for name in chosen:
                try:
                    verdicts[name] = check(history, name, options)
                except TxStreamError as exc:
                    if not many:
                        raise TxStreamError(f"{source}: history {index}: {exc}") from None
                    verdicts[name] = str(exc)
            row = Row(source, index, history, verdicts, expected)
            rows.append(row)
            if args.format == "json":
                _print_json(row)
            elif args.format == "text":
                _print_text(row)
    if args.expect and not any(n in row.verdicts for row in rows for n in row.expected):
        # (exit 0, "all match", whatever the verdicts: nothing had been compared)
        raise TxStreamError(
            f"--expect: no history has an '# expect:' directive for {', '.join(chosen)}; "
            "nothing to compare: leave --expect out to judge the verdicts"
        )
    bare = [row for row in rows if not row.expected] if args.expect else []
    if bare:
        # (it counted as matching, whatever its verdicts: a failing history passed)
        more = f" (and {len(bare) - 1:,} more)" if len(bare) > 1 else ""
        raise TxStreamError(
            f"--expect: {bare[0].source} history {bare[0].index}{more} has no '# expect:' "
            "directive, so nothing to compare it with: add one, or check it without --expect"
        )
    if args.format == "table":
        _print_table(rows, chosen, args.expect)
    elif args.format == "text":
        _print_text_summary(rows, args.expect)
    if args.expect:
        return 1 if any(row.mismatches() for row in rows) else 0
    holds = all(isinstance(v, Verdict) and v.holds for row in rows for v in row.verdicts.values())
    return 0 if holds else 1


def _read_inputs(inputs: list[str]) -> list[tuple[str, str]]:
    texts: list[tuple[str, str]] = []
    stdin: str | None = None
    for name in inputs:
        if not name.strip():
            # Path("") is the current folder: an unset shell variable would check it.
            raise TxStreamError("an empty input name; name a file, a folder or - for stdin")
        if name == "-":
            if stdin is None:  # read once: a second '-' is the same text, not an empty one
                stdin = _read_stdin()
            texts.append(("<stdin>", stdin))
            continue
        path = Path(name)
        if path.is_dir() and is_runtime_store(path):
            # A runtime job's store (or checkpoint): all its committed batches,
            # across restarts, are one history.
            texts.append((str(path), history_text(path)))
        elif path.is_dir():
            files = sorted(path.glob("*.txt"))
            stores = sorted(
                p for p in path.iterdir() if p.is_dir() and is_runtime_store(p, with_history=True)
            )
            if not files and not stores:
                raise TxStreamError(
                    f"folder {path} holds no *.txt history files and no runtime job stores"
                )
            texts += [(str(f), _read(f)) for f in files]
            texts += [(str(p), history_text(p)) for p in stores]
        elif path.exists():
            texts.append((str(path), _read(path)))
        else:
            raise TxStreamError(f"no such file or folder: {name}")
    return texts


def _read_stdin() -> str:
    """Standard input, decoded as UTF-8 as files are.

    Python's own decoding of ``sys.stdin`` depends on the locale (in a C locale it
    turns bad bytes into surrogate escapes, which then read as odd tokens).
    """
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # stdin replaced by a text stream (tests, embedding)
        return sys.stdin.read()
    try:
        return bytes(buffer.read()).decode("utf-8")
    except UnicodeDecodeError:
        raise TxStreamError("<stdin> is not UTF-8 text; a history file is plain text") from None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TxStreamError(f"{path} is not UTF-8 text; a history file is plain text") from None


def _subwindows(history: History, source: str) -> int | None:
    """The ``# subwindows:`` directive, checked as ``--subwindows`` is."""
    value = history.meta.get("subwindows")
    if value is None:
        return None
    # ASCII digits only: isdigit() takes '²' for one (int() then raised), and int()
    # refuses more than 4,300 digits; a value that long is out of range anyway.
    if re.fullmatch("[0-9]{1,20}", value) is None or not 1 <= int(value) <= MAX_SUBWINDOWS:
        shown = value if len(value) <= 20 else f"{value[:20]}..."
        raise TxStreamError(
            f"{source}: '# subwindows: {shown}' must be a whole number, at least 1 and at "
            f"most {MAX_SUBWINDOWS:,}"
        )
    return int(value)


def _print_json(row: Row) -> None:
    for name, verdict in row.verdicts.items():
        obj: dict[str, Any] = {"source": row.source, "history": row.index}
        if "title" in row.history.meta:
            obj["title"] = row.history.meta["title"]
        if isinstance(verdict, Verdict):
            obj.update(verdict.to_json())
        else:
            obj.update({"criterion": name, "holds": None, "not_applicable": verdict})
        if name in row.expected:
            obj["expected"] = row.expected[name]
        print(json.dumps(obj), flush=False)
    sys.stdout.flush()


HEAD, TAIL = 10, 5
"""The transaction ids text output shows at each end of a long list (the rest is counted)."""

MAX_LINES = 10
"""Cycle edges or violations text output shows, of a longer list."""

_NBSP = "\N{NO-BREAK SPACE}"


def _print_text(row: Row) -> None:
    """One history's verdicts for a person: counts, cut-short evidence, wrapped lines.

    The JSON format (``--format json``) keeps all the evidence; this one shows
    what to look at first (a run's serial order holds every committed
    transaction: thousands of ids on one line were not readable).
    """
    width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    title = row.history.meta.get("title")
    print(f"{row.source}, history {row.index}" + (f": {title}" if title else ""))
    for name, verdict in row.verdicts.items():
        expected = ""
        if name in row.expected:
            want = "holds" if row.expected[name] else "fails"
            agree = isinstance(verdict, Verdict) and verdict.holds == row.expected[name]
            expected = f" (expected: {want}{'' if agree else '; DIFFERS'})"
        if not isinstance(verdict, Verdict):
            print(f"  {name}: n/a, {verdict}{expected}")
            continue
        print(f"  {name}: {'holds' if verdict.holds else 'FAILS'}{expected}")
        for line in _evidence_lines(verdict.evidence):
            print(
                textwrap.fill(
                    line,
                    width,
                    initial_indent="    ",
                    subsequent_indent="      ",
                    break_long_words=False,
                    break_on_hyphens=False,
                ).replace(_NBSP, " ")
            )
    sys.stdout.flush()


def _evidence_lines(evidence: dict[str, Any]) -> list[str]:
    """The evidence of one verdict as lines of text (long lists cut short)."""
    counts = [f"{k.replace('_', ' ')} {v:,}" for k, v in evidence.items() if type(v) is int]
    lines = [", ".join(counts)] if counts else []
    rest = []
    for key, value in evidence.items():
        if type(value) is int or value in ({}, []):
            continue
        if key == "serial_order":
            lines.append(f"serial order ({len(value):,}): {_ids(value)}")
        elif key in ("cycle", "update_cycle"):
            nodes = [edge["from"] for edge in value] + [value[0]["from"]]
            lines.append(f"{key.replace('_', ' ')} ({len(value):,} edges): {_ids(nodes, ' -> ')}")
            lines += [_edge(edge) for edge in value[:MAX_LINES]]
            if len(value) > MAX_LINES:
                lines.append(f"  ... {len(value) - MAX_LINES:,} more edges")
        elif key == "violating_transactions":
            lines.append(f"violating transactions ({len(value):,}): {_ids(value)}")
        elif key == "violations":
            lines.append(f"violations ({len(value):,}):")
            lines += [_violation(v) for v in value[:MAX_LINES]]
            if len(value) > MAX_LINES:
                lines.append(f"  ... {len(value) - MAX_LINES:,} more violations")
        else:
            rest.append(key)
    if rest:
        lines.append(f"(also {', '.join(rest)}: see --format json)")
    return lines


def _ids(ids: list[str], sep: str = " ") -> str:
    """``ids`` joined by ``sep``, the middle of a long list counted rather than listed."""
    if len(ids) <= HEAD + TAIL + 1:
        return sep.join(ids)
    # No-break spaces keep the marker on one line when it is wrapped (see _print_text).
    marker = _NBSP.join(["...", f"{len(ids) - HEAD - TAIL:,}", "more", "..."])
    return sep.join([*ids[:HEAD], marker, *ids[-TAIL:]])


def _edge(edge: dict[str, Any]) -> str:
    """One edge of a cycle: the conflict (and its operations) or the arrival order behind it."""
    if edge["reason"] == "conflict":
        ops = " then ".join(edge["operations"])
        return f"  {edge['from']} -> {edge['to']}: conflict on {edge['item']} ({ops})"
    return f"  {edge['from']} -> {edge['to']}: arrival order of {edge['stream']}"


def _violation(violation: Any) -> str:
    """One violation of ``ws``, ``lws`` or ``uc`` in a line (anything else as JSON)."""
    if isinstance(violation, dict) and "why" in violation:  # ws, lws
        return f"  {violation['txn']}: {violation['why']}"
    if isinstance(violation, dict) and violation.get("cycle"):  # uc: a cycle within LIVE(t)
        nodes = [edge["from"] for edge in violation["cycle"]] + [violation["cycle"][0]["from"]]
        return f"  {violation['txn']}: its LIVE set has the cycle {_ids(nodes, ' -> ')}"
    return f"  {json.dumps(violation)}"


def _print_text_summary(rows: list[Row], expect: bool) -> None:
    """The last line of the text output: how many verdicts hold (or match ``# expect:``)."""
    verdicts = [v for row in rows for v in row.verdicts.values()]
    judged = [v for v in verdicts if isinstance(v, Verdict)]
    held = sum(v.holds for v in judged)
    parts = [_count(held, "holds", "hold"), _count(len(judged) - held, "fails", "fail")]
    if len(judged) < len(verdicts):
        parts.append(f"{len(verdicts) - len(judged):,} n/a")
    counted = f"{_count(len(rows), 'history', 'histories')}, {_count(len(verdicts), 'verdict')}"
    print(f"{counted}: {', '.join(parts)}")
    if expect:
        matched = sum(1 for row in rows if not row.mismatches())
        print(f"{matched:,} of {len(rows):,} histories match their '# expect:' verdicts")


def _count(n: int, one: str, many: str | None = None) -> str:
    """``n`` and the noun, singular or plural."""
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def _print_table(rows: list[Row], chosen: list[str], expect: bool) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title="txstream check", show_lines=False)
    # The verdicts are the point of the table: they keep their width and the
    # file and title columns give way on a narrow terminal.
    table.add_column("source", overflow="ellipsis", max_width=24, no_wrap=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("history", overflow="fold", ratio=1, min_width=12)
    table.add_column("txns", justify="right", no_wrap=True)
    for name in chosen:
        table.add_column(name, justify="center", no_wrap=True, min_width=6)
    if expect:
        table.add_column("paper", no_wrap=True)
    for row in rows:
        cells = []
        for name in chosen:
            verdict = row.verdicts[name]
            mark = "*" if name in row.expected else ""
            if isinstance(verdict, Verdict):
                text = "[green]holds[/]" if verdict.holds else "[red]fails[/]"
            else:
                text = "[dim]n/a[/]"
            cells.append(text + mark)
        title = row.history.meta.get("title", "")
        txns = str(len(row.history.transactions()))
        extra = []
        if expect:
            bad = row.mismatches()
            extra = ["[green]yes[/]" if not bad else f"[red]no: {', '.join(bad)}[/]"]
        # Text, not str: rich reads brackets in a str as markup ("[/]" raised MarkupError).
        source = Text(Path(row.source).name)
        table.add_row(source, str(row.index), Text(title), txns, *cells, *extra)
    console = Console(width=max(120, Console().width))
    console.print(table)
    if expect:
        matched = sum(1 for row in rows if not row.mismatches())
        console.print(
            f"{matched} of {len(rows)} histories match the verdicts their sources give "
            "(* marks a verdict stated there; 'paper' says whether all of them match)."
        )
