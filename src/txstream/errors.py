"""The project's exception hierarchy.

Every error txstream raises on purpose derives from :class:`TxStreamError`, so a
caller (and the command line) can tell "you gave me something wrong" from a bug.
Failures that a caller may simply retry (a deadlock victim, a failed validation)
derive from :class:`TransientError`.
"""

from __future__ import annotations

import re
from typing import ClassVar


def condition_of(name: str) -> str:
    """The condition a class named ``name`` gets unless it declares one.

    >>> condition_of("DuplicateKeyError"), condition_of("TransactionAborted")
    ('TXSTREAM_DUPLICATE_KEY', 'TXSTREAM_TRANSACTION_ABORTED')
    """
    stem = re.sub(r"(Error|Exception)$", "", name) or name
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", stem)
    return "TXSTREAM_" + words.upper()


class TxStreamError(Exception):
    """Root of every error txstream raises deliberately.

    The message says what was wrong and, where it can, what to do about it; the
    command line prints it as one line and exits non-zero.

    >>> import txstream as tx
    >>> try:
    ...     tx.Job().table("accounts", key="acct").table("accounts", key="acct")
    ... except tx.TxStreamError as exc:
    ...     print(f"{type(exc).__name__}: {exc}")
    RuntimeJobError: table 'accounts' is declared twice

    Like PySpark's errors, each class has a stable ``condition`` (also from
    :meth:`getCondition`): code that handles errors can match it without
    importing the class, and it stays when the message's wording changes.
    ``docs/errors.md`` lists them all.

    >>> tx.DuplicateKeyError.condition, tx.TxStreamError("x").getCondition()
    ('TXSTREAM_DUPLICATE_KEY', 'TXSTREAM_ERROR')
    """

    condition: ClassVar[str] = "TXSTREAM_ERROR"
    """This class's error condition (``TXSTREAM_<NAME>``), unique among txstream's classes."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        # A class that names no condition gets one from its own name (never its
        # parent's): every class has its own, and a rename shows in docs/errors.md.
        if "condition" not in cls.__dict__:
            cls.condition = condition_of(cls.__name__)

    def getCondition(self) -> str:
        """The error condition, as PySpark's ``PySparkException.getCondition()``."""
        return self.condition


class TransientError(TxStreamError):
    """A failure that goes away when the same work is retried.

    Deadlock victims and optimistic-validation failures raise subclasses of this,
    so a retry loop needs to catch exactly one type.

    >>> import txstream as tx
    >>> from txstream.txn.base import DeadlockError, ValidationError
    >>> issubclass(DeadlockError, tx.TransientError), issubclass(ValidationError, tx.TransientError)
    (True, True)
    >>> issubclass(tx.DuplicateKeyError, tx.TransientError)       # retrying repeats it
    False
    """


class UnknownNameError(TxStreamError, KeyError):
    """A name typed by a user (criterion, protocol, experiment ...) is not known.

    >>> import txstream as tx
    >>> exc = tx.UnknownNameError("protocol", "s2pl", ["ss2pl", "optimistic"])
    >>> print(exc)
    unknown protocol 's2pl'; choose one of: optimistic, ss2pl
    >>> isinstance(exc, KeyError), exc.known
    (True, ['optimistic', 'ss2pl'])
    """

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

    >>> import txstream as tx
    >>> from txstream.model import parse_one
    >>> try:
    ...     parse_one("r1(x) w2(x c2", source="h.txt")
    ... except tx.NotationError as exc:
    ...     print(exc.line, exc.column, "|", exc)
    1 7 | h.txt:1:7: not an operation: a read or write looks like r1(x) or w1[x] (at 'w2(x')
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
