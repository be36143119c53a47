"""The history notation: reading, printing, and errors that name line and column."""

import pytest
from hypothesis import given

from strategies import histories
from txstream.errors import NotationError
from txstream.model import History, Operation, format_histories, format_history, parse, parse_one


def test_reads_every_operation_form() -> None:
    h = parse_one("r1(x) w2[3] c2 a1 rQ1[0] c5 c1_a@3 w_7(a.b:c-d)")
    assert h.operations == [
        Operation("r", "1", "x"),
        Operation("w", "2", "3", None, True),
        Operation("c", "2"),
        Operation("a", "1"),
        Operation("r", "Q1", "0", None, True),
        Operation("c", "5"),
        Operation("c", "1_a", None, 3),
        Operation("w", "_7", "a.b:c-d"),
    ]


def test_comments_newlines_arrivals_and_separators() -> None:
    text = """
    # first
    arrival S: 1 2
    w1(S) c1   # trailing comment
    w2(S)
    c2
    ---
    ---
    # expect: cs=true
    # subwindows: 4
    r3(x) c3
    """
    first, second = parse(text)
    assert first.arrivals == {"S": ["1", "2"]}
    assert [str(op) for op in first] == ["w1(S)", "c1", "w2(S)", "c2"]
    assert first.meta["title"] == "first"
    assert second.meta == {"expect": "cs=true", "subwindows": "4"}


def test_commas_separate_operations_too() -> None:
    assert len(parse_one("r1(x), w1(x),c1")) == 3


@pytest.mark.parametrize(
    ("text", "line", "column", "token"),
    [
        ("r1(x) q2 c1", 1, 7, "q2"),
        ("r1(x)\n  w2(x c2", 2, 3, "w2(x"),
        ("r1(x)\nr1()", 2, 1, "r1()"),
        ("a1@3", 1, 1, "a1@3"),
        ("r1(x y)", 1, 1, "r1(x"),
        ("w1(x) c1\narrival S 1 2", 2, 1, "arrival S 1 2"),
        ("w1(x) c1\narrival S: 1 ?", 2, 14, "?"),
        # int() refuses more than 4,300 digits: its ValueError was not a NotationError.
        (f"r1(x) c1@{'9' * 5000}", 1, 7, f"c1@{'9' * 5000}"),
    ],
)
def test_malformed_input_names_line_column_and_token(
    text: str, line: int, column: int, token: str
) -> None:
    with pytest.raises(NotationError) as info:
        parse(text)
    err = info.value
    assert (err.line, err.column, err.token) == (line, column, token)
    assert f"{line}:{column}" in str(err)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("r1(x) c1 w1(y)", "already ended transaction 1"),
        ("c1 a1", "already ended transaction 1"),
        ("arrival S: 9\nw1(x) c1", "names transaction 9"),
        ("arrival S: 1 1\nw1(x) c1", "twice"),
        ("", "no history"),
        ("# only a comment\n---\n", "no history"),
    ],
)
def test_invalid_histories_are_rejected(text: str, needle: str) -> None:
    with pytest.raises(NotationError, match=needle):
        parse(text)


def test_parse_one_wants_exactly_one() -> None:
    with pytest.raises(NotationError, match="expected one history, found 2"):
        parse_one("r1(x)\n---\nr2(x)")


@given(histories())
def test_printing_then_reading_gives_the_same_history(h: History) -> None:
    again = parse_one(format_history(h)) if h.operations or h.arrivals else h
    assert again.operations == h.operations
    assert {s: t for s, t in again.arrivals.items()} == h.arrivals


@given(histories(), histories())
def test_several_histories_round_trip(a: History, b: History) -> None:
    both = [h for h in (a, b) if h.operations]
    if both:
        assert [x.operations for x in parse(format_histories(both))] == [x.operations for x in both]


def test_round_trip_keeps_bracket_style_and_cycles() -> None:
    text = "arrival S: 1\nrQ1[0] w1(x) c1@7 cQ1"
    assert format_history(parse_one(text)) == text


def test_committed_projection_drops_aborted_and_active() -> None:
    h = parse_one("arrival S: 1 2 3\nw1(x) w2(x) w3(x) c1 a2")
    p = h.committed_projection()
    assert [str(op) for op in p] == ["w1(x)", "c1"]
    assert p.arrivals == {"S": ["1"]}


@pytest.mark.parametrize(
    ("text", "line", "column", "token"),
    [
        ("r1(x) a1 w1(x) c1", 1, 10, "w1(x)"),
        ("# t\nr1(x) c1\nr2(x)\n  c2 c2@4", 4, 6, "c2@4"),
        ("arrival S: 1 2 9\nw1(S) c1 w2(S) c2", 1, 16, "9"),
        ("arrival S: 1 2 1\nw1(S) c1 w2(S) c2", 1, 12, "1"),
    ],
)
def test_invariant_errors_point_at_the_operation(
    text: str, line: int, column: int, token: str
) -> None:
    with pytest.raises(NotationError) as info:
        parse(text, source="f.txt")
    err = info.value
    assert (err.line, err.column, err.token) == (line, column, token)


def test_a_huge_token_is_cut_short_in_the_message() -> None:
    # A line of garbage without a space (a binary file, a pasted blob) was quoted
    # whole: a one-line error of megabytes.
    token = "y" * 1_000_000
    with pytest.raises(NotationError) as info:
        parse(f"r1(x)\nr1(x) {token} c1")
    err = info.value
    assert (err.line, err.column, err.token) == (2, 7, token)
    assert len(str(err)) < 200
    assert str(err).startswith("line 2:7: not an operation") and "yyy..." in str(err)


def test_a_byte_order_mark_before_the_history_is_not_part_of_it() -> None:
    # Windows editors save UTF-8 with a BOM; it was read as part of the first token.
    h = parse_one("\ufeffr1(x) c1\r\nw2(x) c2\r\n")
    assert [str(op) for op in h] == ["r1(x)", "c1", "w2(x)", "c2"]
    assert parse_one("\ufeff# title\r\nr1(x) c1").meta["title"] == "title"
    with pytest.raises(NotationError) as info:
        parse("\ufeffr1(x) q2")
    assert (info.value.line, info.value.column) == (1, 7)


def test_letters_and_digits_of_any_script_name_transactions_items_and_streams() -> None:
    # "letters, digits": r1(é) was refused as "a read or write looks like r1(x)".
    h = parse_one("arrival Поток: Δ1 ٣\nrΔ1(é) w٣[東京:v1] cΔ1 r٣(é) c٣")
    assert [(op.kind, op.txn, op.item) for op in h][:2] == [("r", "Δ1", "é"), ("w", "٣", "東京:v1")]
    assert h.arrivals == {"Поток": ["Δ1", "٣"]}
    assert format_history(h) == "arrival Поток: Δ1 ٣\nrΔ1(é) w٣[東京:v1] cΔ1 r٣(é) c٣"
    # Still not an operation: a symbol, or a space inside the parentheses.
    for text in ("r1(x€)", "r1(é y)", "r€(x)"):
        with pytest.raises(NotationError):
            parse(text)
