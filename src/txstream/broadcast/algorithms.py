"""The control-information algorithms, chosen by name.

``f-matrix``
    The n x n matrix C: C(i, j) is the latest commit cycle of a transaction that
    wrote object i and that the last writer of object j depends on (directly or
    through other reads).  Kept up to date by the three incremental rules of
    Section 3.2.1; column j rides along with object j.
``f-matrix-no``
    F-Matrix whose control information is deemed to take no air time: the
    paper's baseline.
``grouped``
    The n x g matrix MC(i, s) = max of C(i, j) over the objects j of group s;
    ``groups`` sets g.  g = n is F-Matrix, g = 1 is the vector of Datacycle.
``datacycle``
    The vector of last-write cycles; a read needs every earlier read to be still
    current.  Serializable.
``r-matrix``
    The same vector with the weaker condition: every earlier read still current,
    *or* the object being read unchanged since the transaction's first read.

Read-condition of the matrix family (``f-matrix``, ``f-matrix-no``, ``grouped``,
``datacycle``): a read of object j in cycle c with column ``col_j`` may follow an
earlier read (i, c_i, ``col_i``) iff ``col_j[i] < c_i``.  With a client cache a
value may be older than an earlier read, so we also require ``col_i[j] < c``
(nothing the earlier value depends on overwrote the cached one); when reads go
forward in time that second test always holds, so without a cache the condition
is exactly the paper's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from txstream.broadcast.base import BroadcastError, Column, ControlAlgorithm, Read
from txstream.errors import UnknownNameError

Matrix = npt.NDArray[np.int64]


class _CycleGuard:
    """Remembers the last commit cycle and refuses one that goes backwards."""

    def __init__(self) -> None:
        self.last = 0

    def advance(self, cycle: int) -> None:
        if cycle < self.last:
            raise BroadcastError(
                f"commit cycle {cycle} goes backwards (the previous commit was in cycle "
                f"{self.last}); commit update transactions in non-decreasing cycles"
            )
        self.last = cycle


class CMatrix:
    """The F-Matrix C, maintained incrementally by rules 1-3 of Section 3.2.1.

    Stored column by column (``cols[j]`` is C(., j), a numpy array) and copy on
    write: a commit replaces the columns it changes instead of changing them, so
    a snapshot is just the tuple of current columns.  Every entry starts at cycle
    0 (the initial transaction t0 wrote every object then).  With ``ordered``
    (the server's case) commit cycles must not decrease; a serial order of a
    recorded history may legitimately visit a later-committed transaction first.
    """

    def __init__(self, n: int, ordered: bool = True) -> None:
        zero = np.zeros(n, dtype=np.int64)
        zero.flags.writeable = False
        self.n = n
        self.cols: list[Matrix] = [zero] * n
        self.guard = _CycleGuard() if ordered else None

    def commit(self, reads: Sequence[int], writes: Sequence[int], cycle: int) -> None:
        """Apply a transaction with read set ``reads`` and write set ``writes``.

        Rule 1: C(i, j) = cycle for i, j both written.  Rule 2: for j written and
        i not written, C(i, j) = max over read objects k of the old C(i, k) (0 when
        nothing was read).  Rule 3: columns of unwritten objects stay.  Every
        written column thus becomes the same vector, which the columns share.
        """
        if self.guard is not None:
            self.guard.advance(cycle)
        if not writes:
            return
        cols = self.cols
        rs = set(reads)
        if len(rs) == 1:
            new = cols[next(iter(rs))].copy()
        elif rs:
            new = np.maximum.reduce([cols[k] for k in rs])
        else:
            new = np.zeros(self.n, dtype=np.int64)
        ws = list(set(writes))
        new[ws] = cycle
        new.flags.writeable = False
        for j in ws:
            cols[j] = new

    def snapshot(self) -> tuple[Matrix, ...]:
        """The current columns (immutable arrays), as broadcast in a cycle."""
        return tuple(self.cols)

    def as_lists(self) -> list[list[int]]:
        """C as nested lists, ``[i][j]``."""
        rows: list[list[int]] = np.column_stack(self.cols).tolist()
        return rows


def _matrix_condition(previous: Sequence[Read], read: Read) -> bool:
    """The (symmetric) matrix read-condition described in the module docstring."""
    col = read.column
    j = read.obj
    c = read.cycle
    return all(col[p.obj] < p.cycle and p.column[j] < c for p in previous)


class FMatrix(ControlAlgorithm):
    """F-Matrix: the full C matrix; column j is broadcast right after object j."""

    name = "f-matrix"

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.matrix = CMatrix(n)

    def on_commit(self, reads: Sequence[int], writes: Sequence[int], cycle: int) -> None:
        """Apply rules 1-3 for the committed transaction."""
        self.matrix.commit(reads, writes, cycle)

    def snapshot(self, cycle: int) -> tuple[Matrix, ...]:
        """The columns of C as they stand."""
        return self.matrix.snapshot()

    def column(self, snapshot: Any, obj: int) -> Column:
        """Column ``C(., obj)``."""
        return snapshot[obj]

    def read_condition(self, previous: Sequence[Read], read: Read) -> bool:
        """For every earlier read (i, c_i): C(i, j) < c_i (plus the cache test)."""
        return _matrix_condition(previous, read)

    def control_entries(self) -> int:
        """A column of n timestamps per object."""
        return self.n


class FMatrixNo(FMatrix):
    """F-Matrix whose control information costs no broadcast time (the baseline)."""

    name = "f-matrix-no"

    def control_entries(self) -> int:
        """Nothing: the control information is free."""
        return 0


class Grouped(ControlAlgorithm):
    """The grouped matrix MC(i, s): objects fall into ``groups`` contiguous groups."""

    name = "grouped"

    def __init__(self, n: int, groups: int = 10) -> None:
        super().__init__(n)
        if not 1 <= groups <= n:
            raise BroadcastError(
                f"groups must be between 1 and the number of objects ({n}), got {groups}"
            )
        self.groups = groups
        self.group_of = [j * groups // n for j in range(n)]
        members = [[j for j in range(n) if self.group_of[j] == s] for s in range(groups)]
        self.position = [members[self.group_of[j]].index(j) for j in range(n)]
        # Per group an n x |s| block of C's columns, updated in place, so that a
        # group's MC column is one vectorised maximum over the block's rows.
        self.blocks = [np.zeros((n, len(m)), dtype=np.int64) for m in members]
        self.matrix = CMatrix(n)
        zero = np.zeros(n, dtype=np.int64)
        zero.flags.writeable = False
        self._mc: list[Matrix] = [zero] * groups
        self._dirty: set[int] = set()

    def on_commit(self, reads: Sequence[int], writes: Sequence[int], cycle: int) -> None:
        """Keep the full C (the server can afford it); groups are folded per snapshot."""
        self.matrix.commit(reads, writes, cycle)
        cols = self.matrix.cols
        for j in writes:
            s = self.group_of[j]
            self.blocks[s][:, self.position[j]] = cols[j]
            self._dirty.add(s)

    def snapshot(self, cycle: int) -> tuple[Matrix, ...]:
        """The g columns of MC: the maximum of C over each group's columns."""
        for s in self._dirty:
            mc = self.blocks[s].max(axis=1)
            mc.flags.writeable = False
            self._mc[s] = mc
        self._dirty.clear()
        return tuple(self._mc)

    def column(self, snapshot: Any, obj: int) -> Column:
        """Column ``MC(., s_obj)`` of the object's group."""
        return snapshot[self.group_of[obj]]

    def read_condition(self, previous: Sequence[Read], read: Read) -> bool:
        """For every earlier read (i, c_i): MC(i, s_j) < c_i (plus the cache test)."""
        return _matrix_condition(previous, read)

    def control_entries(self) -> int:
        """On average g timestamps per object (n x g in all)."""
        return self.groups


class _Vector(ControlAlgorithm):
    """The vector of last-write cycles (MC with a single group)."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.last_write = [0] * n
        self.guard = _CycleGuard()

    def on_commit(self, reads: Sequence[int], writes: Sequence[int], cycle: int) -> None:
        """Written objects now carry ``cycle``."""
        self.guard.advance(cycle)
        for j in writes:
            self.last_write[j] = cycle

    def snapshot(self, cycle: int) -> tuple[int, ...]:
        """The vector as a tuple."""
        return tuple(self.last_write)

    def column(self, snapshot: Any, obj: int) -> Column:
        """The whole vector: MC(., db) for the one group ``db``."""
        return snapshot

    def control_entries(self) -> int:
        """One timestamp per object."""
        return 1


class Datacycle(_Vector):
    """Datacycle: a read proceeds only if no earlier read was overwritten since."""

    name = "datacycle"

    def read_condition(self, previous: Sequence[Read], read: Read) -> bool:
        """For every earlier read (i, c_i): MC(i, db) < c_i (plus the cache test)."""
        return _matrix_condition(previous, read)


class RMatrix(_Vector):
    """R-Matrix: Datacycle's condition, or the object unchanged since the first read."""

    name = "r-matrix"
    supports_cache = False

    def read_condition(self, previous: Sequence[Read], read: Read) -> bool:
        """(For all earlier (i, c_i): MC(i, db) < c_i) or MC(j, db) < c_1."""
        if not previous:
            return True
        col = read.column
        if col[read.obj] < previous[0].cycle:
            return True
        return all(col[p.obj] < p.cycle for p in previous)


ALGORITHMS: dict[str, Callable[..., ControlAlgorithm]] = {
    "f-matrix": FMatrix,
    "r-matrix": RMatrix,
    "datacycle": Datacycle,
    "grouped": Grouped,
    "f-matrix-no": FMatrixNo,
}


def make_algorithm(name: str, n: int, groups: int | None = None) -> ControlAlgorithm:
    """The algorithm called ``name`` for ``n`` objects (``groups`` only for ``grouped``)."""
    factory = ALGORITHMS.get(name)
    if factory is None:
        raise UnknownNameError("algorithm", name, list(ALGORITHMS))
    if name == "grouped":
        return factory(n, groups if groups is not None else min(10, n))
    if groups is not None:
        raise BroadcastError(f"--groups applies only to the grouped algorithm, not {name}")
    return factory(n)
