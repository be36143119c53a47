"""The project's exception hierarchy.

Every error txstream raises on purpose derives from :class:`TxStreamError`, so a
caller (and the command line) can tell "you gave me something wrong" from a bug.
Failures that a caller may simply retry (a deadlock victim, a failed validation)
derive from :class:`TransientError`.
"""

from __future__ import annotations


class TxStreamError(Exception):
    """Root of every error txstream raises deliberately.

    The message says what was wrong and, where it can, what to do about it; the
    command line prints it as one line and exits non-zero.
    """


class TransientError(TxStreamError):
    """A failure that goes away when the same work is retried.

    Deadlock victims and optimistic-validation failures raise subclasses of this,
    so a retry loop needs to catch exactly one type.
    """


class UnknownNameError(TxStreamError, KeyError):
    """A name typed by a user (criterion, protocol, experiment ...) is not known."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = sorted(known)
        super().__init__(f"unknown {kind} {name!r}; choose one of: {', '.join(self.known)}")

    def __str__(self) -> str:
        # KeyError would otherwise print the message wrapped in quotes.
        return str(self.args[0])


class NotationError(TxStreamError, ValueError):
    """Text in the history notation could not be read.

    ``line`` and ``column`` are 1-based; ``token`` is the offending text, which
    the message quotes cut to :attr:`MAX_SHOWN` characters (a megabyte of
    garbage without a space is one token).
    """

    MAX_SHOWN = 60

    def __init__(self, message: str, line: int, column: int, token: str, source: str = "") -> None:
        self.line = line
        self.column = column
        self.token = token
        self.source = source
        where = f"{source}:" if source else "line "
        shown = token if len(token) <= self.MAX_SHOWN else token[: self.MAX_SHOWN - 3] + "..."
        super().__init__(f"{where}{line}:{column}: {message} (at {shown!r})")
