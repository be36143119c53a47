"""The independent Linear Road validator.

:func:`validate` recomputes the expected answers from the input with the batch
computation of :mod:`txstream.linearroad.reference` and compares an answers
file with them field by field, per answer type: how many were expected and
got, correct, wrong (a field differs, or an answer nobody asked for), missing
and duplicated.  A balance answer one charge old is accepted.

:func:`compare_expected` reports the per-field agreement of an answers file
with a reference file in the shared format (types 0, 1, 2, 3 and 5).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txstream.errors import TxStreamError
from txstream.linearroad.formats import Answer, parse_answer_line, read_lines
from txstream.linearroad.reference import Expected, expected_frames

TYPE_NAMES = {0: "toll", 1: "accident", 2: "balance", 3: "expenditure"}
COMPARED_FIELDS: dict[int, tuple[str, ...]] = {
    0: ("LAV", "Toll"),
    1: ("XWay", "Seg", "Dir"),
    2: ("ResultTime", "Balance"),
    3: ("Toll",),
}
"""Fields compared per answer type (the key fields identify the question)."""
_POSITIONS: dict[int, dict[str, int]] = {
    0: {"VID": 0, "Time": 1, "LAV": 2, "Toll": 3},
    1: {"Time": 0, "XWay": 1, "Seg": 2, "Dir": 3, "VID": 4},
    2: {"Time": 0, "ResultTime": 1, "QID": 2, "Balance": 3},
    3: {"Time": 0, "QID": 1, "Toll": 2},
}


@dataclass
class TypeCounts:
    """Counts of one answer type."""

    expected: int = 0
    got: int = 0
    correct: int = 0
    wrong: int = 0
    missing: int = 0
    duplicates: int = 0


@dataclass
class ValidationReport:
    """The outcome of :func:`validate`."""

    by_type: dict[str, TypeCounts]
    malformed: list[tuple[int, str]] = field(default_factory=list)
    """Answer lines that could not be read: ``(line_no, reason)``."""
    rejected_input: list[tuple[int, str, str]] = field(default_factory=list)
    """Malformed input tuples: ``(line_no, reason, raw line)``."""
    lav: str = "spec"
    accident_end: str = "spec"

    @property
    def totals(self) -> dict[str, int]:
        """Sums over the answer types: expected, got, correct, wrong, missing, duplicates."""
        keys = ("expected", "got", "correct", "wrong", "missing", "duplicates")
        return {k: sum(getattr(c, k) for c in self.by_type.values()) for k in keys}

    @property
    def ok(self) -> bool:
        """True when nothing is wrong, missing, duplicated or malformed."""
        t = self.totals
        return t["wrong"] == t["missing"] == t["duplicates"] == 0 and not self.malformed

    @property
    def clean(self) -> bool:
        """True when the answers are :attr:`ok` and no input tuple was rejected."""
        return self.ok and not self.rejected_input

    def to_json(self) -> str:
        """The report as a JSON object."""
        return json.dumps(
            {
                "lav": self.lav,
                "accident_end": self.accident_end,
                "ok": self.clean,
                "answers_ok": self.ok,
                "totals": self.totals,
                "by_type": {k: vars(v) for k, v in self.by_type.items()},
                "malformed_answers": [{"line": n, "reason": r} for n, r in self.malformed],
                "rejected_input": [
                    {"line": n, "reason": r, "raw": raw} for n, r, raw in self.rejected_input
                ],
            }
        )


def read_answers(path: str | Path) -> tuple[list[Answer], list[tuple[int, str]]]:
    """Every answer line of ``path``, plus the malformed ones ``(line_no, reason)``."""
    answers, bad = read_lines(path, parse_answer_line)
    return answers, [(no, reason) for no, reason, _ in bad]


def _expected_by_key(exp: Expected) -> dict[int, dict[tuple[int, ...], tuple[Any, ...]]]:
    """Expected answers per type, keyed like :meth:`Answer.key` (values minus the type)."""
    out: dict[int, dict[tuple[int, ...], tuple[Any, ...]]] = {t: {} for t in TYPE_NAMES}
    for vid, time, lav, toll in exp.tolls.itertuples(index=False):
        out[0][(0, vid, time)] = (vid, time, lav, toll)
    for time, xway, seg, d, vid in exp.accidents.itertuples(index=False):
        out[1][(1, vid, time)] = (time, xway, seg, d, vid)
    for time, rt, qid, bal, bal5 in exp.balances.itertuples(index=False):
        out[2][(2, qid)] = (time, rt, qid, bal, bal5)
    for time, qid, toll in exp.expenditures.itertuples(index=False):
        out[3][(3, qid)] = (time, qid, toll)
    return out


def _correct(kind: int, got: tuple[int, ...], want: tuple[Any, ...]) -> bool:
    if kind == 2:
        # Time and QID are the key; a balance one charge old is accepted.
        return got[3] in (want[3], want[4])
    return tuple(int(v) for v in got) == tuple(int(v) for v in want)


def validate(
    input_path: str | Path,
    answers_path: str | Path,
    *,
    lav: str = "spec",
    tolls_path: str | Path | None = None,
    accident_end: str = "spec",
) -> ValidationReport:
    """Compare ``answers_path`` with the answers recomputed from ``input_path``."""
    exp = expected_frames(input_path, lav=lav, tolls_path=tolls_path, accident_end=accident_end)
    answers, malformed = read_answers(answers_path)
    want = _expected_by_key(exp)
    counts = {name: TypeCounts(expected=len(want[t])) for t, name in TYPE_NAMES.items()}
    seen: Counter[tuple[int, ...]] = Counter()
    for a in answers:
        kind = 2 if a.type == 5 else a.type
        c = counts[TYPE_NAMES[kind]]
        c.got += 1
        key = a.key()
        seen[key] += 1
        if seen[key] > 1:
            c.duplicates += 1
            continue
        w = want[kind].get(key)
        if w is not None and _correct(kind, a.values, w):
            c.correct += 1
        else:
            c.wrong += 1
    for t, name in TYPE_NAMES.items():
        counts[name].missing = sum(1 for k in want[t] if k not in seen)
    return ValidationReport(counts, malformed, exp.rejected, lav, accident_end)


def disagreements(agreement: dict[str, Any]) -> int:
    """How many answers a :func:`compare_expected` result counts as not agreeing.

    Per answer type: the reference's answers this one lacks, the answers the
    reference lacks, and the matched answers that differ in any compared field;
    plus the malformed answer lines.
    """
    total = int(agreement.get("malformed", 0))
    for a in agreement.values():
        if isinstance(a, dict):
            total += a["missing"] + a["extra"] + a["differ"]
    return total


def _fields_of(kind: int, values: tuple[int, ...]) -> dict[str, int]:
    return {name: values[i] for name, i in _POSITIONS[kind].items()}


def compare_expected(answers_path: str | Path, expected_path: str | Path) -> dict[str, Any]:
    """Per-field agreement of ``answers_path`` with a reference answers file.

    Answers are matched by their question (type 0 and 1: VID and Time; 2 and
    3: QID).  A type-2 answer agrees on a field when it equals the reference's
    type-2 line or its type-5 line (one charge old).  Returns, per answer
    type, ``reference``, ``got``, ``matched``, ``missing``, ``extra``,
    ``differ`` (matched answers with a field that agrees with no reference
    line) and ``fields`` (per field: ``agree`` and ``pct`` of the matched
    answers).
    """
    got, bad_got = read_answers(answers_path)
    ref, bad_ref = read_answers(expected_path)
    if bad_ref:
        line, reason = bad_ref[0]
        raise TxStreamError(f"{expected_path}:{line}: {reason}")
    ref_by: dict[int, dict[tuple[int, ...], list[Answer]]] = {t: {} for t in TYPE_NAMES}
    for a in ref:
        kind = 2 if a.type == 5 else a.type
        ref_by[kind].setdefault(a.key(), []).append(a)
    got_by: dict[int, dict[tuple[int, ...], Answer]] = {t: {} for t in TYPE_NAMES}
    for a in got:
        kind = 2 if a.type == 5 else a.type
        got_by[kind].setdefault(a.key(), a)
    result: dict[str, Any] = {"malformed": len(bad_got)}
    for t, name in TYPE_NAMES.items():
        fields = ["Time", *COMPARED_FIELDS[t]]
        agree = dict.fromkeys(fields, 0)
        matched = differ = 0
        for key, a in got_by[t].items():
            alts = ref_by[t].get(key)
            if not alts:
                continue
            matched += 1
            mine = _fields_of(t, a.values)
            same = True
            for f in fields:
                if any(_fields_of(t, r.values)[f] == mine[f] for r in alts):
                    agree[f] += 1
                else:
                    same = False
            differ += not same
        result[name] = {
            "reference": len(ref_by[t]),
            "got": len(got_by[t]),
            "matched": matched,
            "missing": sum(1 for k in ref_by[t] if k not in got_by[t]),
            "extra": sum(1 for k in got_by[t] if k not in ref_by[t]),
            "differ": differ,
            "fields": {
                f: {"agree": n, "pct": round(100.0 * n / matched, 4) if matched else 100.0}
                for f, n in agree.items()
            },
        }
    return result
