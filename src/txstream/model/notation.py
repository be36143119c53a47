"""Reader and printer for the papers' history notation, the project's lingua franca.

Grammar, one history per chunk::

    r1(x)  w2[3]  c2  a1  rQ1[0]  c1@3      operations, separated by white space or commas
    arrival S: 1 2 3                        transactions 1, 2, 3 arose from events on S, in order
    # ...                                   a comment; the last one before the first
                                            operation is the history's title
    # expect: cs=true csao=false            directive: the verdicts a source gives
    # subwindows: 3                         directive: n for ws/lws
    ---                                     (a line of its own) ends one history, starts the next

Transaction ids are letters, digits and ``_``; items and stream names are
letters, digits and ``_.:-``; letters and digits of any script count
(``r1(é)``, ``wΔ[東京]``), as ``str.isalnum`` has them.  ``@k`` after a commit
records the broadcast cycle it committed in (ASCII digits).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from txstream.errors import NotationError
from txstream.model.conflict import no_gc
from txstream.model.history import History, HistoryInvariantError, Operation

# \w: letters and digits of any script, and _ (str.isalnum() or "_").
_ACCESS = re.compile(r"([rw])(\w+)(?:\(([\w.:\-]+)\)|\[([\w.:\-]+)\])")
_END = re.compile(r"([ca])(\w+)(?:@([0-9]+))?")
_ARRIVAL = re.compile(r"\s*arrival\s+([\w.:\-]+)\s*:(.*)")
_TXN_ID = re.compile(r"\w+")
_TOKEN = re.compile(r"[^\s,]+")
_DIRECTIVE = re.compile(r"#\s*(expect|subwindows)\s*:\s*(.*?)\s*")
DIRECTIVES = ("expect", "subwindows")


def parse_operation(token: str) -> Operation | None:
    """Read one operation such as ``r1(x)`` or ``c2@3``; ``None`` if it is not one."""
    m = _ACCESS.fullmatch(token)
    if m is not None:
        kind, txn, paren, brack = m.groups()
        if brack is not None:
            return Operation(kind, txn, brack, None, True)
        return Operation(kind, txn, paren)
    m = _END.fullmatch(token)
    if m is not None:
        kind, txn, cycle = m.groups()
        if cycle is None:
            return Operation(kind, txn)
        if kind == "a":
            return None
        try:
            return Operation(kind, txn, None, int(cycle))
        except ValueError:  # more digits than int() converts (4,300 by default)
            return None
    return None


def _why_not(token: str) -> str:
    """Explain in a few words why ``token`` is not an operation."""
    if not token or token[0] not in "rwca":
        return "an operation starts with r, w, c or a"
    if token[0] in "rw":
        return "a read or write looks like r1(x) or w1[x]"
    if "@" in token and token[0] == "a":
        return "only a commit carries a cycle (c1@3)"
    if _END.fullmatch(token) is not None:
        return f"a cycle number of {len(token.partition('@')[2]):,} digits is too long"
    return "a commit or abort looks like c1, a1 or c1@3"


def parse(text: str, source: str = "") -> list[History]:
    """Read every history in ``text``.

    Raises :class:`NotationError` (line, column, token) on the first malformed
    token or invalid history.  Empty chunks around ``---`` are skipped; text with
    no history at all is an error, so that an empty file is not silently "correct".
    """
    with no_gc():
        return _parse(text, source)


def _parse(text: str, source: str) -> list[History]:
    """Read every history in ``text``.

    Raises :class:`NotationError` (line, column, token) on the first malformed
    token or invalid history.  Empty chunks around ``---`` are skipped; text with
    no history at all is an error, so that an empty file is not silently "correct".
    A byte order mark at the start (UTF-8 as some editors save it) is skipped.
    """
    text = text.removeprefix("\ufeff")
    histories: list[History] = []
    ops: list[Operation] = []
    arrivals: dict[str, list[str]] = {}
    meta: dict[str, str] = {}
    first_line = 1
    lines = text.splitlines()
    append = ops.append
    parse_op = parse_operation

    def finish(end_line: int) -> None:
        if not ops and not arrivals:
            return
        history = History(list(ops), dict(arrivals), dict(meta))
        try:
            history.validate()
        except HistoryInvariantError as exc:
            line, col, token = _locate(lines, first_line, end_line, exc)
            raise NotationError(f"invalid history: {exc}", line, col, token, source) from None
        histories.append(history)

    for lineno, raw in enumerate(text.splitlines(), start=1):
        line, hash_, comment = raw.partition("#")
        if hash_:
            _note(meta, "#" + comment, heading=not ops and not arrivals)
        stripped = line.strip()
        if not stripped:
            continue
        if stripped == "---":
            finish(lineno)
            ops.clear()
            arrivals = {}
            meta = {}
            first_line = lineno + 1
            continue
        if stripped.split(None, 1)[0].split(":", 1)[0] == "arrival":
            m = _ARRIVAL.fullmatch(line)
            if m is None:
                raise NotationError(
                    "an arrival line looks like 'arrival S: 1 2 3'",
                    lineno,
                    line.index("arrival") + 1,
                    stripped,
                    source,
                )
            stream, rest = m.groups()
            txns = []
            for tm in _TOKEN.finditer(rest):
                if _TXN_ID.fullmatch(tm.group()) is None:
                    raise NotationError(
                        "transaction ids are letters, digits and _",
                        lineno,
                        m.start(2) + tm.start() + 1,
                        tm.group(),
                        source,
                    )
                txns.append(tm.group())
            arrivals.setdefault(stream, []).extend(txns)
            continue
        for token in line.replace(",", " ").split():
            op = parse_op(token)
            if op is None:
                raise NotationError(
                    f"not an operation: {_why_not(token)}",
                    lineno,
                    _column(line, token),
                    token,
                    source,
                )
            append(op)
    finish(len(text.splitlines()))
    if not histories:
        raise NotationError("the input holds no history", 1, 1, text[:20], source)
    return histories


def _locate(
    lines: list[str], first: int, last: int, exc: HistoryInvariantError
) -> tuple[int, int, str]:
    """Line, column and token of what ``exc`` blames, found again in the text.

    Validation errors are rare, so positions are not kept while parsing (a
    million operations would pay for them); the text is scanned once more.
    """
    seen = 0
    for lineno in range(first, min(last, len(lines)) + 1):
        line = lines[lineno - 1].partition("#")[0]
        is_arrival = line.strip().split(None, 1)[:1] and _ARRIVAL.fullmatch(line) is not None
        for m in _TOKEN.finditer(line):
            if is_arrival:
                if (
                    exc.arrival is not None
                    and m.group() == exc.arrival
                    and m.start() > line.index(":")
                ):
                    return lineno, m.start() + 1, m.group()
                continue
            if exc.position is not None:
                if seen == exc.position:
                    return lineno, m.start() + 1, m.group()
                seen += 1
    return first, 1, f"lines {first}-{last}"


def _note(meta: dict[str, str], comment: str, heading: bool) -> None:
    """Keep a directive; the last free comment before the first operation is the title."""
    m = _DIRECTIVE.fullmatch(comment.strip())
    if m is not None:
        meta[m.group(1)] = m.group(2)
    elif heading and comment.strip("# \t"):
        meta["title"] = comment.strip("# \t")


def expected_verdicts(history: History) -> dict[str, bool]:
    """The ``# expect: cs=true ...`` directive as a dict; empty when absent.

    Raises :class:`ValueError` on a malformed directive.
    """
    out: dict[str, bool] = {}
    for pair in history.meta.get("expect", "").split():
        name, _, value = pair.partition("=")
        if value not in ("true", "false"):
            raise ValueError(f"expect directive {pair!r} must look like cs=true or cs=false")
        out[name] = value == "true"
    return out


def _column(line: str, token: str) -> int:
    """1-based column of the first whole-token occurrence of ``token`` in ``line``."""
    for m in _TOKEN.finditer(line):
        if m.group() == token:
            return m.start() + 1
    return line.find(token) + 1


def parse_one(text: str, source: str = "") -> History:
    """Read text that must hold exactly one history."""
    histories = parse(text, source)
    if len(histories) != 1:
        raise NotationError(f"expected one history, found {len(histories)}", 1, 1, "---", source)
    return histories[0]


def format_history(history: History, per_line: int = 0) -> str:
    """Print a history in the notation; ``per_line`` > 0 wraps after that many operations."""
    lines = [f"arrival {s}: {' '.join(ts)}" for s, ts in history.arrivals.items()]
    words = [str(op) for op in history.operations]
    if per_line > 0:
        lines += [" ".join(words[i : i + per_line]) for i in range(0, len(words), per_line)]
    elif words:
        lines.append(" ".join(words))
    return "\n".join(lines)


def format_histories(histories: Iterable[History]) -> str:
    """Print several histories separated by ``---`` lines."""
    return "\n---\n".join(format_history(h) for h in histories) + "\n"
