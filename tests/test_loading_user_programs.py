"""A new user's own programs against continuous loading: bad values and input, and
the loaded views against a brute-force join.

Each test here failed before the fix it names; see the commit that added it (to
tests/test_users_7.py, which was split by subject into this file and two others).
"""

from __future__ import annotations

import pytest

from txstream.errors import TxStreamError

# -- continuous loading --------------------------------------------------------------


def _small_schema():
    from txstream.loading import Aggregate, JoinView, Relation, Schema

    return Schema(
        [
            Relation("a", {"id": "int", "j": "int", "x": "float"}, key=("id",), aggregates=("x",)),
            Relation("b", {"j": "int", "lbl": "text"}, key=("j",)),
        ],
        [
            JoinView("ab", ("a", "b"), on=(("a.j", "b.j"),), select=("a.id", "a.x", "b.lbl")),
            JoinView(
                "per_lbl",
                ("a", "b"),
                on=(("a.j", "b.j"),),
                group_by=("b.lbl",),
                aggregates=(Aggregate("sum", "a.x", "sx"), Aggregate("count", None, "n")),
            ),
        ],
    )


def test_a_float_too_large_for_a_float_column_is_rejected_not_fatal() -> None:
    # An integer literal beyond float range (1e400 written out) for a float
    # column raised OverflowError out of Loader.load: the whole load failed
    # instead of rejecting that one operation.
    from txstream.loading import EmbeddedTarget, Loader
    from txstream.loading.ops import InvalidOperation, validate

    schema = _small_schema()
    huge = "1" + "0" * 400
    with pytest.raises(InvalidOperation, match=r"a\.x"):
        validate(schema, f'{{"relation":"a","op":"insert","values":{{"id":1,"x":{huge}}}}}')
    target = EmbeddedTarget(schema)
    target.setup()
    with Loader(target, "reorder", sessions=2, grouping=2) as loader:
        report = loader.load(
            [
                {"relation": "a", "op": "insert", "values": {"id": 1, "j": 1, "x": 10**400}},
                {"relation": "a", "op": "insert", "values": {"id": 2, "j": 1, "x": 2}},
                {"relation": "b", "op": "increment", "values": {"j": 1, "lbl": 10**400}},
                # beyond bigint: PostgreSQL failed the whole load, embedded kept it
                {"relation": "a", "op": "insert", "values": {"id": 2**63, "j": 1}},
                {"relation": "a", "op": "insert", "values": {"id": 3, "j": -(2**63) - 1}},
                {"relation": "a", "op": "insert", "values": {"id": 10**5000, "j": 1}},
                {"relation": "a", "op": "insert", "values": {"id": 4, "x": 10**5000}},
            ]
        )
    assert [pos for pos, _ in report.rejected] == [0, 2, 3, 4, 5, 6]
    assert all("\n" not in why and len(why) < 200 for _, why in report.rejected)
    assert report.operations == 1
    assert target.state().base["a"] == {(2,): {"id": 2, "j": 1, "x": 2.0}}


def test_bad_input_to_the_loading_api_is_one_line() -> None:
    from txstream.loading import Aggregate, EmbeddedTarget, JoinView, Loader, Relation, Schema

    r = Relation("r", {"a": "int", "b": "int"}, key=("a",))
    s = Relation("s", {"a": "int", "c": "text"}, key=("a",))
    target = EmbeddedTarget(_small_schema())
    target.setup()
    bad = [
        lambda: Relation(3, {"a": "int"}, key=("a",)),
        lambda: Relation("r", ["a"], key=("a",)),
        lambda: Relation("r", {"a": "int"}, key=None),
        lambda: Relation("r", {3: "int"}, key=(3,)),
        lambda: Relation("r", {"a": "int", "b": "int"}, key="ab"),  # was the key (a, b)
        lambda: Schema(r),
        lambda: Schema(["r"]),
        lambda: Schema([r, s], ["v"]),
        lambda: Schema([r, s], [JoinView("v", ("r", "s"), on=((1, 2),), select=("r.a",))]),
        lambda: Schema(
            [r, s],
            [
                JoinView(
                    "v",
                    ("r", "s"),
                    on=(("r.a", "s.a"),),
                    group_by=("r.b",),
                    aggregates=(Aggregate(3, "r.b", "x"),),
                )
            ],
        ),
        lambda: Schema(
            [r, s],
            [JoinView("v", ("r", "s"), on=(("r.a", "s.a"),), group_by=("r.b",), aggregates=("s",))],
        ),
        # int = text: never equal on the embedded target (an empty view, silently);
        # PostgreSQL failed every load with 'operator does not exist: bigint = text'
        lambda: Schema([r, s], [JoinView("v", ("r", "s"), on=(("r.a", "s.c"),), select=("r.a",))]),
        lambda: Loader(target, None),
        lambda: Loader(target, ["naive"]),
        lambda: Loader(None),
        lambda: Loader(target, max_attempts="x"),
        lambda: Loader(target, max_attempts=1.5),
        lambda: Loader(target, "reorder", starvation_ts="x"),
        lambda: Loader(target, "reorder", starvation_ts=float("nan")),
        lambda: Loader(target, "naive", starvation_ts=-1),
        lambda: Loader(target).load(None),
        lambda: Loader(target).load(5),
        lambda: EmbeddedTarget(None),
        lambda: EmbeddedTarget(_small_schema(), statement_delay=-1),
        lambda: EmbeddedTarget(_small_schema(), statement_delay=float("nan")),
        # bulk_load took anything: unknown columns, a missing key, wrong types
        lambda: target.bulk_load({"b": [{"j": 1, "bogus": 2}]}),
        lambda: target.bulk_load({"b": [{"lbl": "x"}]}),
        lambda: target.bulk_load({"b": [{"j": "one", "lbl": "x"}]}),
        lambda: target.bulk_load({"b": {"j": 1}}),
        lambda: target.bulk_load({"b": [{"j": 1}, {"j": 1}]}),  # the key twice
        lambda: target.bulk_load([{"j": 1}]),
    ]
    for k, fn in enumerate(bad):
        with pytest.raises(TxStreamError) as info:
            fn()
        assert "\n" not in str(info.value), k
    assert target.state().base == {"a": {}, "b": {}}  # nothing half loaded
    assert Relation("r", {"ab": "int", "a": "int"}, key="ab").key == ("ab",)  # one name
    target.bulk_load({"b": [{"j": "1", "lbl": "x"}], "a": [{"id": 1, "j": 1, "x": 2}]})
    state = target.state()
    assert state.base["b"] == {(1,): {"j": 1, "lbl": "x"}}  # coerced as operations are
    assert state.views["ab"] == {(1, 2.0, "x"): 1}


# -- end to end: the views against a brute-force join ------------------------------


@pytest.mark.parametrize("method", ["naive", "partition", "reorder"])
def test_loaded_views_equal_a_brute_force_join_of_the_loaded_tables(method) -> None:
    import random
    from collections import Counter

    from txstream.loading import EmbeddedTarget, Loader

    schema = _small_schema()
    rng = random.Random(7)
    ops = []
    for _ in range(400):
        if rng.random() < 0.6:
            kind = rng.choice(["insert", "delete", "update", "increment", "upsert"])
            values: dict = {"id": rng.randint(1, 15)}
            if kind in ("insert", "upsert"):
                values.update(j=rng.randint(1, 4), x=rng.choice([0.5, 2.0, 3.25]))
            elif kind == "update":
                values["j"] = rng.randint(1, 4)
            elif kind == "increment":
                values["x"] = rng.choice([1.0, -0.5])
            ops.append({"relation": "a", "op": kind, "values": values})
        else:
            kind = rng.choice(["insert", "delete", "update"])
            values = {"j": rng.randint(1, 4)}
            if kind != "delete":
                values["lbl"] = rng.choice("pq")
            ops.append({"relation": "b", "op": kind, "values": values})
    target = EmbeddedTarget(schema, statement_delay=0.0002)
    target.setup()
    with Loader(target, method, sessions=5, grouping=4, seed=3) as loader:
        report = loader.load(ops)
    assert report.operations == 400 and not report.rejected
    state = target.state()
    a_rows, b_rows = state.base["a"].values(), state.base["b"].values()
    joined = [(a, b) for a in a_rows for b in b_rows if a["j"] is not None and a["j"] == b["j"]]
    assert state.views["ab"] == Counter((a["id"], a["x"], b["lbl"]) for a, b in joined)
    groups: dict = {}
    for a, b in joined:
        n, xs = groups.get((b["lbl"],), (0, []))
        groups[(b["lbl"],)] = (n + 1, [*xs, a["x"]] if a["x"] is not None else xs)
    want = {g: (sum(xs) if xs else None, n) for g, (n, xs) in groups.items()}
    got = state.views["per_lbl"]
    assert got.keys() == want.keys()
    for g, (sx, n) in want.items():
        assert got[g][1] == n
        assert (got[g][0] is None) == (sx is None)
        if sx is not None:
            assert abs(got[g][0] - sx) < 1e-9
