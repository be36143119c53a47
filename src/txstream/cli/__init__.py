"""The ``txstream`` command line: the top layer, which nothing else in txstream imports.

This module is the entry point (:func:`entry`, :func:`main`, :func:`build_parser`).
Beside it: :mod:`~txstream.cli.types`, the checked option types every command
parses its numbers and paths with, and one module per command:
:mod:`~txstream.cli.check` (``txstream check``), :mod:`~txstream.cli.stress`,
:mod:`~txstream.cli.bench`, and one per engine (:mod:`~txstream.cli.cq`,
:mod:`~txstream.cli.linearroad`, ...).  The layers below may not import the
command line, argparse or click (``tests/test_layering.py``), so an engine is
usable as a library without it.

Every module in :data:`CLI_MODULES` exposes ``register_cli(subparsers)`` and
sets ``func`` on its parser; ``func(args)`` returns the exit status.  A module
whose command has subcommands (``txstream cq run``) declares it as ``GROUP``, a
:class:`Group`; its ``register_cli`` then receives the group's subcommands (see
:func:`command_group`).  Errors the user can fix
(:class:`~txstream.errors.TxStreamError`) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeAlias

from txstream import __version__
from txstream.errors import TxStreamError

CLI_MODULES: tuple[str, ...] = (
    "txstream.cli.check",
    "txstream.cli.bench",
    "txstream.cli.loading",
    "txstream.cli.stress",
    "txstream.cli.broadcast",
    "txstream.cli.windows",
    "txstream.cli.cq",
    "txstream.cli.linearroad",
)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``txstream: ...``, exit 2) instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        """Print the error in one line and exit 2; ``-h`` shows the usage."""
        self.exit(2, f"{self.prog}: {message} (see -h)\n")


# A string: _SubParsersAction is generic only to type checkers.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What ``register_cli`` receives: the subcommands of the parser above it (or of its group)."""


@dataclass(frozen=True)
class Group:
    """A command with subcommands, as its module declares it (``GROUP = Group(...)``).

    ``description`` is the module's docstring when None, shown as written when
    ``raw`` (with its own line breaks).
    """

    name: str
    help: str
    description: str | None = None
    metavar: str = "COMMAND"
    raw: bool = True


def command_group(
    sub: argparse._SubParsersAction[Any], group: Group, doc: str | None
) -> Subparsers:
    """Add ``group``'s command; return where to add its subcommands.

    ``doc`` (the module's docstring) describes it unless ``group`` has a
    description.  Without a subcommand the group prints its help and exits 2,
    as a usage error does.
    """
    parser: argparse.ArgumentParser = sub.add_parser(
        group.name,
        help=group.help,
        description=doc if group.description is None else group.description,
        formatter_class=(
            argparse.RawDescriptionHelpFormatter if group.raw else argparse.HelpFormatter
        ),
    )
    parser.set_defaults(func=lambda _args: _print_help(parser))
    return parser.add_subparsers(metavar=group.metavar)


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser with every subsystem's subcommands."""
    parser = _Parser(
        prog="txstream",
        description="Transactional stream processing: check histories, run engines and benchmarks.",
    )
    parser.add_argument("--version", action="version", version=f"txstream {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in CLI_MODULES:
        module = importlib.import_module(name)
        group: Group | None = getattr(module, "GROUP", None)
        module.register_cli(sub if group is None else command_group(sub, group, module.__doc__))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        status: int = func(args)
        return status
    except TxStreamError as exc:
        print(f"txstream: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        name = f" {exc.filename}" if exc.filename else ""
        print(f"txstream: cannot access{name}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as exc:
        print(
            f"txstream: input is not UTF-8 text ({exc.reason} at byte {exc.start})", file=sys.stderr
        )
        return 2
    except KeyboardInterrupt:
        print("txstream: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """Console-script entry point."""
    try:
        sys.exit(main())
    except BrokenPipeError:
        # Output piped into `head` and friends: not an error worth a traceback.
        sys.stderr.close()
        sys.exit(1)
