"""The suite's own test order under xdist (conftest.deal_slow_first, conftest.SLOW)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import SLOW, deal_slow_first

ROOT = Path(__file__).resolve().parent.parent


def test_the_slow_tests_open_each_workers_share_and_every_test_runs_once() -> None:
    ids = [f"tests/test_{c}.py::t" for c in "abcdefghijk"]  # 11 tests
    slow = ("tests/test_h.py", "tests/test_c.py", "tests/test_k.py")
    order = deal_slow_first(ids, slow, workers=2)
    assert sorted(order) == list(range(11))
    # xdist's worksteal: the first worker gets 11 // 2 = 5 tests, the second the other 6.
    first, second = order[:5], order[5:]
    assert [ids[i] for i in first[:2]] == ["tests/test_h.py::t", "tests/test_k.py::t"]
    assert ids[second[0]] == "tests/test_c.py::t"
    # the others keep their collection order within each share
    rest = [i for i in order if not ids[i].startswith(slow)]
    assert rest == sorted(rest)


def test_a_modules_slow_tests_stay_together_in_collection_order() -> None:
    ids = ["tests/test_a.py::x", "tests/test_m.py::s1", "tests/test_m.py::f"]
    ids += ["tests/test_m.py::s2[1]", "tests/test_m.py::s2[2]", "tests/test_z.py::s"]
    slow = ("tests/test_m.py::s2", "tests/test_z.py::s", "tests/test_m.py::s1")
    order = [ids[i] for i in deal_slow_first(ids, slow, workers=2)]
    # test_m's slow tests (its best rank is 0) open the first share, together
    assert order[:3] == ["tests/test_m.py::s1", "tests/test_m.py::s2[1]", "tests/test_m.py::s2[2]"]
    assert order[3] == "tests/test_z.py::s"  # the second share (3 of 6 tests each)
    assert sorted(order) == sorted(ids)


def test_three_workers_each_get_a_slow_test_first() -> None:
    ids = [f"tests/test_{n}.py::t" for n in range(9)]
    slow = ("tests/test_8.py", "tests/test_7.py", "tests/test_6.py")
    order = deal_slow_first(ids, slow, workers=3)
    assert sorted(order) == list(range(9))
    assert [ids[order[k * 3]] for k in range(3)] == [f"tests/test_{n}.py::t" for n in (8, 7, 6)]


def test_every_slow_name_is_a_test_of_the_suite() -> None:
    # A renamed test would silently lose its early start.
    for prefix in SLOW:
        path, _, name = prefix.partition("::")
        tree = ast.parse((ROOT / path).read_text())
        names = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        assert any(n.startswith(name) for n in names), prefix
