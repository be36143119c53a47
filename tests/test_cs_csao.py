"""cs and csao against the definitions: a brute-force oracle on small histories."""

from itertools import pairwise, permutations

import pytest
from hypothesis import given

from strategies import histories
from txstream.model import History, check, parse_one
from txstream.model.conflict import conflict_graph


def conflicting_pairs(h: History) -> list[tuple[str, str]]:
    """(Ti, Tj) for every pair of conflicting operations p < q of the committed projection."""
    ops = [op for op in h.committed_projection() if op.is_access]
    return [(p.txn, q.txn) for i, p in enumerate(ops) for q in ops[i + 1 :] if p.conflicts_with(q)]


def serial_order_is_equivalent(h: History, order: list[str]) -> bool:
    """Definition 6: the serial history orders every conflict as ``h`` does."""
    pos = {t: i for i, t in enumerate(order)}
    return all(pos[a] < pos[b] for a, b in conflicting_pairs(h))


def respects_arrivals(h: History, order: list[str]) -> bool:
    pos = {t: i for i, t in enumerate(order)}
    committed = h.committed()
    for txns in h.arrivals.values():
        kept = [t for t in txns if t in committed]
        if any(pos[a] > pos[b] for a, b in pairwise(kept)):
            return False
    return True


def oracle(h: History, arrival: bool) -> bool:
    committed = sorted(h.committed())
    return any(
        serial_order_is_equivalent(h, list(p)) and (not arrival or respects_arrivals(h, list(p)))
        for p in permutations(committed)
    )


@given(histories())
def test_cs_agrees_with_brute_force(h: History) -> None:
    verdict = check(h, "cs")
    assert verdict.holds == oracle(h, arrival=False)
    if verdict.holds:
        order = verdict.evidence["serial_order"]
        assert sorted(order) == sorted(h.committed())
        assert serial_order_is_equivalent(h, order)
    else:
        assert_cycle_is_real(h, verdict.evidence["cycle"])


@given(histories())
def test_csao_agrees_with_brute_force(h: History) -> None:
    verdict = check(h, "csao")
    assert verdict.holds == oracle(h, arrival=True)
    if verdict.holds:
        order = verdict.evidence["serial_order"]
        assert serial_order_is_equivalent(h, order) and respects_arrivals(h, order)
    else:
        assert_cycle_is_real(h, verdict.evidence["cycle"])


@given(histories())
def test_csao_implies_cs(h: History) -> None:
    if check(h, "csao").holds:
        assert check(h, "cs").holds


def assert_cycle_is_real(h: History, cycle: list[dict[str, object]]) -> None:
    """Each edge of the evidence is a real conflict or a declared arrival order."""
    assert cycle, "a failing verdict must show a cycle"
    pairs = set(conflicting_pairs(h))
    for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True):
        assert a["to"] == b["from"]
    for edge in cycle:
        if edge["reason"] == "conflict":
            assert (edge["from"], edge["to"]) in pairs
            first, second = edge["operations"]  # type: ignore[misc]
            assert first[1:].startswith(str(edge["from"])) and second[1:].startswith(
                str(edge["to"])
            )
        else:
            txns = h.arrivals[str(edge["stream"])]
            assert txns.index(str(edge["from"])) < txns.index(str(edge["to"]))


@given(histories(max_txns=5, with_arrivals=False))
def test_reduced_graph_has_the_full_graphs_reachability(h: History) -> None:
    """The linear-time graph keeps exactly the conflict relation's transitive closure."""
    graph = conflict_graph(h)
    full = set(conflicting_pairs(h))

    def closure(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
        reach = set(edges)
        changed = True
        while changed:
            changed = False
            for a, b in list(reach):
                for c, d in list(reach):
                    if b == c and (a, d) not in reach:
                        reach.add((a, d))
                        changed = True
        return reach

    reduced = {(a, b) for a, out in graph.succ.items() for b in out}
    assert reduced <= full
    assert closure(reduced) == closure(full)


@pytest.mark.parametrize(
    ("text", "cs"),
    [
        # Weikum & Vossen style textbook cases.
        ("r1(x) w2(x) c2 w1(x) c1", False),  # lost update
        ("r1(x) r2(x) w1(x) w2(x) c1 c2", False),
        ("r1(x) w1(x) r2(x) w2(x) c1 c2", True),
        ("r1(x) w2(x) c2 w1(x) a1", True),  # the aborted one does not count
        ("w1(x) w2(y) r1(y) r2(x) c1 c2", False),
        ("w1(x) w2(y) r1(y) r2(x) c1", True),  # T2 still active
        ("r1(x) r2(x) c1 c2", True),  # reads never conflict
    ],
)
def test_textbook_histories(text: str, cs: bool) -> None:
    assert check(parse_one(text), "cs").holds is cs


def test_serial_order_follows_input_order_when_free() -> None:
    verdict = check(parse_one("r3(a) c3 r1(b) c1 r2(c) c2"), "cs")
    assert verdict.evidence["serial_order"] == ["3", "1", "2"]


def test_csao_cycle_names_the_stream() -> None:
    verdict = check(parse_one("arrival S: 2 1\nw1(x) c1 w2(x) c2"), "csao")
    assert not verdict.holds
    reasons = {edge["reason"]: edge for edge in verdict.evidence["cycle"]}
    assert reasons["arrival"]["stream"] == "S"
    assert reasons["conflict"]["operations"] == ["w1(x)", "w2(x)"]


def test_deep_graph_does_not_hit_the_recursion_limit() -> None:
    n = 20_000
    # T_i writes a_i, T_(i+1) reads it: a chain 0 -> 1 -> ... -> n-1 of depth n.
    chain = " ".join(f"r{i}(a{i - 1}) w{i}(a{i})" for i in range(1, n)) + " w0(a0) "
    commits = " ".join(f"c{i}" for i in range(n))
    # Written in this order the history reads a0 before T0 writes it: serializable.
    verdict = check(parse_one(chain + commits), "cs")
    assert verdict.holds and len(verdict.evidence["serial_order"]) == n
    # Let T0 write a0 first and read a_(n-1) last: the chain closes into one long cycle.
    cyclic = "w0(a0) " + chain.replace(" w0(a0) ", f" r0(a{n - 1}) ") + commits
    verdict = check(parse_one(cyclic), "cs")
    assert not verdict.holds
    assert len(verdict.evidence["cycle"]) == n


def test_unicode_names_are_judged_like_ascii_ones() -> None:
    text = "arrival Σ: β α\nrα(ü) wβ(ü) cβ wα(ü) cα"
    assert not check(parse_one(text), "cs").holds
    assert not check(parse_one(text), "csao").holds
    assert check(parse_one(text.replace("wα(ü)", "wα(ö)")), "cs").holds
