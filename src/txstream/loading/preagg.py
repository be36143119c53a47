"""Pre-aggregation of increments inside one load transaction (Luo et al. Section 4).

Every load transaction modifies one relation.  Increments of "aggregate"
attributes on the same tuple are combined into one statement whose amounts
are the sums; a combined increment whose amounts are all zero is dropped.
Upserts (MERGE) combine too: a run that starts with an upsert absorbs later
upserts and increments of the same tuple (amounts added, other columns taken
from the last upsert); a zero upsert is kept, since it may insert a row.

The paper moves all increments to the front of the transaction and sorts them
by tuple.  That may move an increment across an insert or delete of the same
tuple, which changes the result.  Here an increment only moves across
operations on *other* tuples (which commute with it): a run of combinable
operations on one tuple ends at the next operation of another kind on that
tuple.  The combined statement takes the place of the run's first operation,
so the final state is always the same as without pre-aggregation.
"""

from __future__ import annotations

from typing import Any

from txstream.loading.ops import Key, Modification
from txstream.loading.schema import Schema


def preaggregate(schema: Schema, ops: list[Modification]) -> list[Modification]:
    """The statements to execute for ``ops`` (all on one relation), combined."""
    if len(ops) < 2:
        return list(ops)
    out: list[Modification | None] = []
    # per tuple: (position in out, kind of run, amounts, other columns)
    runs: dict[Key, tuple[int, str, dict[str, Any], dict[str, Any]]] = {}
    aggregates: dict[str, tuple[str, ...]] = {}
    for op in ops:
        aggs = aggregates.get(op.relation)
        if aggs is None:
            aggs = aggregates[op.relation] = schema.relations[op.relation].aggregates
        tkey = (op.relation, *op.key)
        run = runs.get(tkey)
        if op.kind == "increment":
            if run is not None:
                amounts = run[2]
                for col, val in op.values:
                    amounts[col] = amounts.get(col, 0) + val
                continue
            runs[tkey] = (len(out), "increment", dict(op.values), {})
            out.append(None)
            continue
        if op.kind == "upsert":
            vals = dict(op.values)
            if run is not None and run[1] == "upsert":
                amounts, others = run[2], run[3]
                for col in aggs:
                    amounts[col] = amounts.get(col, 0) + vals[col]
                others.update({c: v for c, v in vals.items() if c not in aggs})
                continue
            if run is not None:
                _close(out, op.relation, op.key, run)
            runs[tkey] = (
                len(out),
                "upsert",
                {c: vals[c] for c in aggs},
                {c: v for c, v in vals.items() if c not in aggs},
            )
            out.append(None)
            continue
        # insert / delete / update: ends any run on this tuple
        if run is not None:
            _close(out, op.relation, op.key, run)
            del runs[tkey]
        out.append(op)
    for tkey, run in runs.items():
        _close(out, str(tkey[0]), tuple(tkey[1:]), run)
    return [op for op in out if op is not None]


def _close(
    out: list[Modification | None],
    relation: str,
    key: Key,
    run: tuple[int, str, dict[str, Any], dict[str, Any]],
) -> None:
    pos, kind, amounts, others = run
    if kind == "increment":
        if all(v == 0 for v in amounts.values()):
            return  # the paper's c = 0 case: nothing to do
        out[pos] = Modification(relation, "increment", key, tuple(sorted(amounts.items())))
    else:
        values = {**others, **amounts}
        out[pos] = Modification(relation, "upsert", key, tuple(sorted(values.items())))
