"""``txstream check``: judge recorded histories against a correctness criterion.

One JSON object per history and criterion on stdout (or a table with
``--format table``).  Exit 0 when every verdict holds (with ``--expect``: when
every verdict matches the history's ``# expect:`` directive), 1 otherwise, 2 on
malformed input.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        """Criteria whose verdict differs from the ``# expect:`` directive."""
        bad = []
        for name, want in self.expected.items():
            got = self.verdicts.get(name)
            if not isinstance(got, Verdict) or got.holds != want:
                bad.append(name)
        return bad


def register_cli(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        choices=("json", "table"),
        default="json",
        help="JSON lines (default) or a readable table",
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
    if args.subwindows is not None and args.subwindows < 1:
        raise TxStreamError(f"--subwindows must be at least 1, not {args.subwindows}")
    many = len(chosen) > 1 or args.format == "table"
    rows: list[Row] = []
    for source, text in _read_inputs(args.inputs):
        for index, history in enumerate(parse(text, source), start=1):
            try:
                expected = expected_verdicts(history)
            except ValueError as exc:
                raise TxStreamError(f"{source}: history {index}: {exc}") from None
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
    if args.format == "table":
        _print_table(rows, chosen, args.expect)
    if args.expect:
        return 1 if any(row.mismatches() for row in rows) else 0
    holds = all(isinstance(v, Verdict) and v.holds for row in rows for v in row.verdicts.values())
    return 0 if holds else 1


def _read_inputs(inputs: list[str]) -> list[tuple[str, str]]:
    texts: list[tuple[str, str]] = []
    for name in inputs:
        if name == "-":
            texts.append(("<stdin>", sys.stdin.read()))
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


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TxStreamError(f"{path} is not UTF-8 text; a history file is plain text") from None


def _subwindows(history: History, source: str) -> int | None:
    value = history.meta.get("subwindows")
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise TxStreamError(f"{source}: '# subwindows: {value}' must be a positive whole number")
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


def _print_table(rows: list[Row], chosen: list[str], expect: bool) -> None:
    from rich.console import Console
    from rich.table import Table

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
        table.add_row(Path(row.source).name, str(row.index), title, txns, *cells, *extra)
    console = Console(width=max(120, Console().width))
    console.print(table)
    if expect:
        matched = sum(1 for row in rows if not row.mismatches())
        console.print(
            f"{matched} of {len(rows)} histories match the verdicts their sources give "
            "(* marks a verdict stated there; 'paper' says whether all of them match)."
        )
