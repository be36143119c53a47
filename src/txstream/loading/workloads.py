"""The paper's demand/inventory workload (Luo et al. Section 5.1) and a repeated-increment one.

``demand(partkey, date, quantity, custkey, comment)`` is keyed (and
partitioned) on ``custkey``; ``inventory(partkey, date, quantity,
extended_cost, extended_price)`` on ``(partkey, date)``, with ``quantity`` an
aggregate attribute.  The join view ``onhand_demand`` joins them on
``partkey`` and ``date``.  Initially each of the ``s`` active parts has one
inventory tuple for today that matches 4 demand tuples.  The stream has two
kinds of operations: O1 inserts a demand tuple for a random active part
(probability ``p``), O2 updates the inventory tuple of a random active part
(here: an increment of its quantity).
"""

from __future__ import annotations

import random
from typing import Any

from txstream.loading.ops import Modification
from txstream.loading.schema import Aggregate, JoinView, Relation, Schema

TODAY = 20060911


def demand_schema(aggregate_view: bool = False) -> Schema:
    """demand, inventory and the join view onhand_demand (plus, optionally, an aggregate view)."""
    demand = Relation(
        "demand",
        {"partkey": "int", "date": "int", "quantity": "int", "custkey": "int", "comment": "text"},
        key=("custkey",),
    )
    inventory = Relation(
        "inventory",
        {
            "partkey": "int",
            "date": "int",
            "quantity": "int",
            "extended_cost": "int",
            "extended_price": "int",
        },
        key=("partkey", "date"),
        aggregates=("quantity", "extended_cost", "extended_price"),
    )
    on = (("demand.partkey", "inventory.partkey"), ("demand.date", "inventory.date"))
    views = [
        JoinView(
            "onhand_demand",
            ("demand", "inventory"),
            on,
            select=(
                "demand.partkey as partkey",
                "demand.date as date",
                "demand.quantity as quantity",
                "demand.custkey as custkey",
                "inventory.quantity as onhand",
            ),
        )
    ]
    if aggregate_view:
        views.append(
            JoinView(
                "demand_by_part",
                ("demand", "inventory"),
                on,
                group_by=("inventory.partkey as partkey",),
                aggregates=(
                    Aggregate("count", None, "orders"),
                    Aggregate("sum", "demand.quantity", "wanted"),
                    Aggregate("avg", "inventory.quantity", "onhand_avg"),
                ),
            )
        )
    return Schema([demand, inventory], views)


def initial_rows(parts: int, seed: int = 0, per_part: int = 4) -> dict[str, list[dict[str, Any]]]:
    """One inventory tuple per active part (today) and ``per_part`` matching demand tuples."""
    rng = random.Random(seed)
    inventory = [
        {
            "partkey": p,
            "date": TODAY,
            "quantity": rng.randint(50, 500),
            "extended_cost": rng.randint(100, 10_000),
            "extended_price": rng.randint(100, 20_000),
        }
        for p in range(parts)
    ]
    demand = [
        {
            "partkey": p,
            "date": TODAY,
            "quantity": rng.randint(1, 10),
            "custkey": p * per_part + j,
            "comment": "initial",
        }
        for p in range(parts)
        for j in range(per_part)
    ]
    return {"demand": demand, "inventory": inventory}


def demand_stream(
    count: int, parts: int, p: float = 0.5, seed: int = 0, first_custkey: int = 10**9
) -> list[Modification]:
    """``count`` operations: O1 (insert into demand) with probability ``p``, else O2."""
    rng = random.Random(seed)
    ops: list[Modification] = []
    cust = first_custkey + seed * 10_000_000
    for _ in range(count):
        part = rng.randrange(parts)
        if rng.random() < p:
            cust += 1
            ops.append(
                Modification(
                    "demand",
                    "insert",
                    (cust,),
                    (
                        ("comment", "web"),
                        ("date", TODAY),
                        ("partkey", part),
                        ("quantity", rng.randint(1, 10)),
                    ),
                )
            )
        else:
            ops.append(
                Modification(
                    "inventory", "increment", (part, TODAY), (("quantity", -rng.randint(1, 5)),)
                )
            )
    return ops


def increment_stream(
    count: int, parts: int, seed: int = 0, cancel: float = 0.2
) -> list[Modification]:
    """Inventory increments over few parts, so one transaction repeats tuples.

    A fraction ``cancel`` of the operations undo the previous amount on the same
    part, so some combined increments sum to zero (and are dropped).
    """
    rng = random.Random(seed)
    ops: list[Modification] = []
    last: dict[int, int] = {}
    for _ in range(count):
        part = rng.randrange(parts)
        if part in last and rng.random() < cancel:
            amount = -last.pop(part)
        else:
            amount = rng.choice([-3, -2, -1, 1, 2, 3])
            last[part] = amount
        ops.append(
            Modification(
                "inventory",
                "increment",
                (part, TODAY),
                tuple(sorted({"quantity": amount, "extended_cost": 7 * amount}.items())),
            )
        )
    return ops
