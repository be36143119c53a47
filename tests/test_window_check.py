"""ws and lws (Golab et al., Definitions 1-2) against the paper and a brute-force oracle."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txstream.errors import TxStreamError
from txstream.model import CheckOptions, History, Operation, check, parse_one

# Section 3.1: five sub-windows, T_0..T_4 (omitted) filled the window, then two slides.
PAPER = {
    "H_a": (
        "rQ1[0] w5[0] c5 w6[1] c6 rQ1[1] rQ1[2] rQ1[3] rQ1[4] cQ1",
        False,
        False,
        None,
    ),
    "H_b": ("rQ1[0] w5[0] c5 rQ1[1] w6[1] c6 rQ1[2] rQ1[3] rQ1[4] cQ1", True, False, 4),
    "H_c": ("rQ1[4] w5[0] c5 rQ1[3] rQ1[2] rQ1[1] w6[1] c6 rQ1[0] cQ1", True, False, 5),
    "H_d": ("rQ1[4] w5[0] c5 rQ1[0] rQ1[3] rQ1[2] w6[1] c6 rQ1[1] cQ1", True, True, 6),
}


def run(text: str, criterion: str, n: int | None = None) -> dict[str, object]:
    verdict = check(parse_one(text), criterion, CheckOptions(subwindows=n))
    evidence = verdict.to_json()
    json.dumps(evidence)  # JSON-ready
    return evidence


@pytest.mark.parametrize("name", sorted(PAPER))
@pytest.mark.parametrize("n", [None, 5])
def test_paper_examples(name: str, n: int | None) -> None:
    text, ws, lws, state = PAPER[name]
    assert check(parse_one(text), "cs").holds  # "all four histories are serializable"
    got_ws = run(text, "ws", n)
    got_lws = run(text, "lws", n)
    assert (got_ws["holds"], got_lws["holds"]) == (ws, lws)
    assert got_ws["subwindows"] == 5
    assert got_ws["initial_state"] == 4
    assert got_ws["operations"] == 10
    assert got_ws["transactions"] == 3
    if ws:
        # Figure 5: H_b reads the state after T_4, H_c after T_5, H_d after T_6.
        assert got_ws["reads_state_after"] == {"Q1": state}
    else:
        (violation,) = got_ws["violations"]  # type: ignore[misc]
        assert violation["txn"] == "Q1"
        assert violation["read_versions"] == {"0": 0, "1": 6, "2": 2, "3": 3, "4": 4}
        assert "T5" in violation["why"]
    if lws:
        assert got_lws["reads_state_after"] == {"Q1": 6}
    else:
        (violation,) = got_lws["violations"]  # type: ignore[misc]
        assert violation["txn"] == "Q1"
        assert violation["latest_state"] == 6


def test_aborted_slide_did_not_happen() -> None:
    text = "rQ1[0] w5[0] a5 w6[1] c6 rQ1[1] rQ1[2] rQ1[3] rQ1[4] cQ1"
    ws = run(text, "ws")
    assert ws["holds"] and ws["reads_state_after"] == {"Q1": 6}
    assert ws["slides"] == 1
    assert run(text, "lws")["holds"]


def test_aborted_and_unfinished_queries_are_ignored() -> None:
    text = "rQ1[0] w5[0] c5 w6[1] c6 rQ1[1] aQ1 rQ2[0] w7[2] c7 rQ2[1]"
    assert run(text, "ws", 5)["holds"]
    assert run(text, "lws", 5)["reads_state_after"] == {}


def test_query_over_part_of_the_window() -> None:
    # Q1 reads only sub-windows 2..4; T5 and T6 replace 0 and 1, which it never sees.
    text = "rQ1[4] w5[0] c5 rQ1[3] w6[1] c6 rQ1[2] cQ1"
    assert run(text, "ws", 5)["reads_state_after"] == {"Q1": 4}
    assert run(text, "lws", 5)["reads_state_after"] == {"Q1": 6}


def test_reading_one_sub_window_in_two_versions() -> None:
    text = "rQ1[0] w5[0] c5 rQ1[0] cQ1"
    verdict = run(text, "ws", 5)
    assert not verdict["holds"]
    (violation,) = verdict["violations"]  # type: ignore[misc]
    assert violation["read_versions"] == {"0": [0, 5]}
    assert not check(parse_one(text), "cs").holds


def test_no_slides_reads_the_initial_state() -> None:
    verdict = run("rQ1[0] rQ1[1] rQ1[2] cQ1 cQ2", "lws", 3)
    assert verdict["holds"] and verdict["initial_state"] == 2
    assert verdict["reads_state_after"] == {"Q1": 2, "Q2": 2}


def test_window_not_yet_full() -> None:
    # j0 = 0: the initial state is "after T_-1"; its versions are -3, -2, -1.
    text = "rQ1[2] w0[0] c0 w1[1] c1 rQ1[0] rQ1[1] cQ1"
    verdict = run(text, "ws", 3)
    assert verdict["initial_state"] == -1
    assert verdict["reads_state_after"] == {"Q1": 1}
    assert run(text, "lws", 3)["holds"]


def test_definition_2_counts_commits_not_writes() -> None:
    # T5 overwrites sub-window 0 after Q1 read it, but commits only after Q1 does:
    # Definition 2 only asks Q1 to reflect slides committed before it committed.
    assert run("rQ1[0] w5[0] rQ1[1] cQ1 c5", "lws", 5)["holds"]
    # Had T5 committed first, Q1 would have missed the latest state.
    verdict = run("rQ1[0] w5[0] c5 rQ1[1] cQ1", "lws", 5)
    assert not verdict["holds"]
    assert verdict["violations"][0]["latest_state"] == 5  # type: ignore[index]
    # A slide committed later than a newer one it precedes still counts through it.
    text = "rQ1[0] w5[0] w6[1] c6 cQ1 c5"
    assert not run(text, "lws", 5)["holds"]
    assert run(text, "ws", 5)["reads_state_after"] == {"Q1": 4}


def test_long_history_is_checked_quickly() -> None:
    n = 10
    ops: list[Operation] = []
    for j in range(n, 30_000):
        q = f"Q{j}"
        ops += [Operation("r", q, str((j + 1) % n)), Operation("w", str(j), str(j % n))]
        ops += [Operation("c", str(j)), Operation("r", q, str(j % n)), Operation("c", q)]
    h = History(ops)
    assert check(h, "ws", CheckOptions(n)).holds
    assert check(h, "lws", CheckOptions(n)).holds


@pytest.mark.parametrize(
    ("text", "n", "fragment"),
    [
        ("r5[0] w5[0] c5", None, "write-only"),
        ("wQ1[0] cQ1", None, "read-only"),
        ("rQ1[x] cQ1", None, "not a sub-window index"),
        ("w5[-1] c5", None, "not a sub-window index"),
        ("w5[0] w5[0] c5", None, "more than once"),
        ("c5 rQ1[0] cQ1", None, "writes no sub-window"),
        ("w5[1] c5 rQ1[2] cQ1", None, "pass --subwindows"),
        ("w5[1] c5", 3, "must write sub-window 5 mod 3 = 2"),
        ("rQ1[3] cQ1", 2, "larger --subwindows"),
        ("rQ1[0] cQ1", 0, "at least 1"),
        ("w6[1] c6 w5[0] c5", 5, "subscript order"),
        ("w5[0] c5 w05[0] c05", 5, "both name window slide 5"),
    ],
)
def test_bad_histories_are_refused(text: str, n: int | None, fragment: str) -> None:
    for criterion in ("ws", "lws"):
        with pytest.raises(TxStreamError, match=fragment.replace("-", r"\-")) as info:
            check(parse_one(text), criterion, CheckOptions(subwindows=n))
        assert "\n" not in str(info.value)


def test_out_of_order_aborted_slide_is_fine() -> None:
    assert run("w6[1] c6 w5[0] a5 rQ1[0] rQ1[1] cQ1", "lws", 5)["holds"]


def test_a_slide_aborted_before_its_write_is_fine() -> None:
    # It did not move the window, as an aborted slide that wrote did not; it was
    # refused as "window slide 5 writes no sub-window".
    for criterion in ("ws", "lws"):
        got = run("rQ1[0] a5 w6[1] c6 rQ1[1] cQ1", criterion, 5)
        assert got["holds"] and got["slides"] == 1 and got["initial_state"] == 4
    # A committed slide must still write its sub-window.
    with pytest.raises(TxStreamError, match="writes no sub-window"):
        check(parse_one("rQ1[0] c5 w6[1] c6 rQ1[1] cQ1"), "ws", CheckOptions(5))


# --- brute force from the definitions -------------------------------------------------


@st.composite
def window_histories(draw: st.DrawFn) -> tuple[History, int]:
    """Slides T_j0.. writing in subscript order, interleaved with a few queries."""
    n = draw(st.integers(2, 4))
    j0 = draw(st.integers(0, 7))
    programs: list[list[Operation]] = []
    for j in range(j0, j0 + draw(st.integers(0, 5))):
        program = [Operation("w", str(j), str(j % n))]
        end = draw(st.sampled_from(["c", "c", "c", "a", None]))
        if end is not None:
            program.append(Operation(end, str(j)))
        programs.append(program)
    slides = len(programs)
    for k in range(1, draw(st.integers(1, 3)) + 1):
        q = f"Q{k}"
        reads = draw(
            st.one_of(
                st.permutations(range(n)),
                st.lists(st.integers(0, n - 1), max_size=n + 1),
            )
        )
        program = [Operation("r", q, str(i)) for i in reads]
        end = draw(st.sampled_from(["c", "c", "c", "a", None]))
        if end is not None:
            program.append(Operation(end, q))
        programs.append(program)
    cursors = [0] * len(programs)
    merged: list[Operation] = []
    while True:
        # A slide may write only once the slide before it has written.
        live = [
            i
            for i, program in enumerate(programs)
            if cursors[i] < len(program) and (i == 0 or i >= slides or cursors[i - 1] > 0)
        ]
        if not live:
            break
        i = draw(st.sampled_from(live))
        merged.append(programs[i][cursors[i]])
        cursors[i] += 1
    return History(merged), n


class Window:
    """The window states of ``h`` straight from the model: initial, then after each slide."""

    def __init__(self, h: History, n: int) -> None:
        slide_ids = [int(t) for t in h.transactions() if t.isdigit()]
        self.n = n
        self.j0 = min(slide_ids) if slide_ids else n
        # The omitted slides T_(j0-n) .. T_(j0-1) left the initial window.
        self.initial = {j % n: j for j in range(self.j0 - n, self.j0)}
        self.slides = sorted(j for j in slide_ids if str(j) in h.committed())
        self.states = [self.j0 - 1, *self.slides]

    def after(self, k: int) -> dict[int, int]:
        state = dict(self.initial)
        for j in self.slides:
            if j <= k:
                state[j % self.n] = j
        return state


def oracle(h: History, n: int) -> dict[str, tuple[dict[int, list[int]], bool, bool, list[int]]]:
    """Per committed query: versions read, Definition 1, Definition 2, slides committed before."""
    win = Window(h, n)
    db = dict(win.initial)
    reads: dict[str, list[tuple[int, int]]] = {}
    committed_slides: list[int] = []
    before: dict[str, list[int]] = {}
    for op in h.committed_projection():
        if op.kind == "w":
            db[int(op.item or "")] = int(op.txn)
        elif op.kind == "r":
            reads.setdefault(op.txn, []).append((int(op.item or ""), db[int(op.item or "")]))
        elif op.txn.isdigit():
            committed_slides.append(int(op.txn))
        else:
            before[op.txn] = list(committed_slides)
    out = {}
    for q, earlier in before.items():
        rs = reads.get(q, [])
        # Definition 1: the reads agree with a state the window had.
        agree = [k for k in win.states if all(win.after(k)[i] == v for i, v in rs)]
        # Definition 2: ... and that state reflects every slide committed before q committed.
        latest = [k for k in agree if all(k >= j for j in earlier)]
        versions: dict[int, list[int]] = {}
        for i, v in rs:
            if v not in versions.setdefault(i, []):
                versions[i].append(v)
        out[q] = (versions, bool(agree), bool(latest), earlier)
    return out


def as_json_versions(versions: dict[int, list[int]]) -> dict[str, object]:
    return {str(i): vs[0] if len(vs) == 1 else vs for i, vs in versions.items()}


@given(window_histories())
def test_checkers_agree_with_the_definitions(case: tuple[History, int]) -> None:
    h, n = case
    expected = oracle(h, n)
    win = Window(h, n)
    for criterion, col in (("ws", 1), ("lws", 2)):
        verdict = check(h, criterion, CheckOptions(subwindows=n))
        json.dumps(verdict.to_json())
        ev = verdict.evidence
        bad = {q for q, row in expected.items() if not row[col]}
        assert verdict.holds == (not bad)
        assert {v["txn"] for v in ev.get("violations", [])} == bad
        for v in ev.get("violations", []):
            assert v["read_versions"] == as_json_versions(expected[v["txn"]][0])
        assert set(ev["reads_state_after"]) == set(expected) - bad
        for q, k in ev["reads_state_after"].items():
            # The state named is one the window had, and the query's reads agree with it.
            assert k in win.states
            state = win.after(k)
            assert all(vs == [state[i]] for i, vs in expected[q][0].items())
            if criterion == "lws":
                assert all(k >= j for j in expected[q][3])
        assert ev["queries"] == len(expected)
        assert ev["initial_state"] == win.j0 - 1


@given(window_histories())
def test_lws_implies_ws_implies_serializable(case: tuple[History, int]) -> None:
    h, n = case
    options = CheckOptions(subwindows=n)
    ws = check(h, "ws", options).holds
    if check(h, "lws", options).holds:
        assert ws
    if ws:
        assert check(h, "cs").holds


@given(window_histories())
def test_inferred_subwindows_give_the_same_verdict(case: tuple[History, int]) -> None:
    h, n = case
    indices = [int(op.item) for op in h if op.item is not None]
    if not indices or max(indices) != n - 1:
        return
    for criterion in ("ws", "lws"):
        assert check(h, criterion).to_json() == check(h, criterion, CheckOptions(n)).to_json()


def test_a_huge_sub_window_index_or_count_costs_nothing() -> None:
    # The window was a list of n sub-windows: n = 10^12 (an index in the history,
    # or --subwindows / '# subwindows:') ran out of memory with a traceback.
    verdict = run("rQ1[999999999999] cQ1", "ws")
    assert verdict["holds"] and verdict["subwindows"] == 10**12
    text = "rQ1[0] w5[5] c5 rQ1[5] cQ1 rQ2[5] w1000000000005[5] c1000000000005 rQ2[0] cQ2"
    assert run(text, "ws", 10**12)["reads_state_after"] == {"Q1": 5, "Q2": 5}
    lws = run(text, "lws", 10**12)
    assert [v["txn"] for v in lws["violations"]] == ["Q2"]  # type: ignore[attr-defined]
