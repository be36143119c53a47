"""Expected Linear Road answers, computed from the whole input at once with pandas.

This is the validator's oracle: a batch computation, independent of any
streaming code.  Semantics (checked against the independent reference answers
in ``../shared/linearroad/``, see ``docs/linear-road-data.md``):

- minute ``m`` of time ``t`` is ``t // 60 + 1``;
- a toll notification answers every position report that puts a car in a new
  segment (its first report included, and a report back on the road after one
  on the exit lane, even in the segment it left from), except on the exit
  lane (4);
- LAV of segment ``s`` in minute ``m``: over minutes ``m-5 .. m-1``; ``raw-mean``
  is the plain mean of every speed reported there, ``spec`` the mean over those
  minutes of the per-minute mean of the per-car mean speeds; rounded half up;
- toll ``2 * (cars - 50)^2`` when LAV < 40, more than 50 distinct cars reported
  in the segment in minute ``m-1`` and no accident active within 4 segments
  downstream, else 0;
- a car is stopped at its fourth consecutive report with the same expressway,
  direction, lane and position, never on the exit lane; an accident is two
  cars stopped at one such place (same position and lane); it is active from
  the minute after the second car's fourth report up to (``--accident-end
  spec``) the minute after the last report of a car stopped there, or
  (``clear-minute``) the minute of the report that clears it: the first
  report, from the detection on, of a car stopped there that has moved (no
  end while none has);
- an accident notification goes with a toll notification when an accident is
  active in the car's segment or up to 4 segments downstream;
- the toll of a notification is charged when the car next enters a segment;
  a balance answer is the sum of the charges up to the query's time.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd  # type: ignore[import-untyped]

from txstream.errors import TxStreamError, UnknownNameError
from txstream.linearroad.formats import (
    ACCIDENT_END_DEFINITIONS,
    EXIT_LANE,
    INPUT_FIELDS,
    LAV_DEFINITIONS,
    TIME,
    MalformedTupleError,
    open_text,
    out_of_order,
    parse_input_line,
    parse_toll_line,
    read_lines,
)

_SEG = ["XWay", "Dir", "Seg"]
_KEY = [*_SEG, "m"]


def check_lav(lav: str) -> str:
    """Return ``lav`` if it names a LAV definition, else raise :class:`UnknownNameError`."""
    if lav not in LAV_DEFINITIONS:
        raise UnknownNameError("LAV definition", lav, list(LAV_DEFINITIONS))
    return lav


def check_accident_end(name: str) -> str:
    """Return ``name`` if it names an accident-end reading, else :class:`UnknownNameError`."""
    if name not in ACCIDENT_END_DEFINITIONS:
        raise UnknownNameError("accident-end reading", name, list(ACCIDENT_END_DEFINITIONS))
    return name


NEVER = 10**9
"""The last minute of an accident nothing has cleared (``clear-minute``)."""


@dataclass
class Expected:
    """Expected answers as DataFrames, one per answer type.

    ``tolls`` (type 0): VID, Time, LAV, Toll; ``accidents`` (type 1): Time,
    XWay, Seg, Dir, VID; ``balances`` (type 2): Time, ResultTime, QID,
    Balance, and Balance5 (one charge old); ``expenditures`` (type 3): Time,
    QID, Toll.  ``rejected`` lists ``(line_no, reason, raw)`` of malformed input.
    """

    tolls: Any
    accidents: Any
    balances: Any
    expenditures: Any
    rejected: list[tuple[int, str, str]]

    def lines(self) -> list[str]:
        """Every expected answer in the answers-file format (Emit 0), types 0-3."""
        out = [f"0,{r[0]},{r[1]},0.000,{r[2]},{r[3]}" for r in self.tolls.itertuples(index=False)]
        out += [
            f"1,{r[0]},0.000,{r[1]},{r[2]},{r[3]},{r[4]}"
            for r in self.accidents.itertuples(index=False)
        ]
        out += [
            f"2,{r[0]},0.000,{r[1]},{r[2]},{r[3]}"
            for r in self.balances[["Time", "ResultTime", "QID", "Balance"]].itertuples(index=False)
        ]
        out += [f"3,{r[0]},0.000,{r[1]},{r[2]}" for r in self.expenditures.itertuples(index=False)]
        return out


def read_input(path: str | Path) -> tuple[Any, list[tuple[int, str, str]]]:
    """The input as a DataFrame, plus the malformed lines ``(line_no, reason, raw)``."""
    line_of: list[int] = []
    parsed, rejected = read_lines(path, parse_input_line, numbers=line_of)
    # A tuple that goes back in time is rejected, as the engine does.
    rows, previous = [], 0
    for index, row in enumerate(parsed):
        if row[TIME] < previous:
            rejected.append(
                (line_of[index], out_of_order(row[TIME], previous), ",".join(map(str, row)))
            )
            continue
        previous = row[TIME]
        rows.append(row)
    rejected.sort()
    arr = np.array(rows, dtype=np.int64).reshape(-1, len(INPUT_FIELDS))
    return pd.DataFrame(arr, columns=list(INPUT_FIELDS)), rejected


def read_tolls(path: str | Path) -> Any:
    """Historical tolls ``VID,Day,XWay,Toll`` as a DataFrame.

    A file that is not one (unreadable, a line without four integers) is one
    :class:`TxStreamError` naming the file and the first bad line.  pandas
    reads it (a few times faster than Python); only when it fails is the file
    read again line by line to say where.  ``index_col=False`` and the warning
    turned into an error keep pandas from taking a first fifth field for an
    index, or dropping it, on a file with five fields on every line.
    """
    names = ["VID", "Day", "XWay", "Toll"]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(path, header=None, names=names, dtype=np.int64, index_col=False)
    except (OSError, ValueError, EOFError, pd.errors.ParserWarning) as exc:
        raise TxStreamError(
            _bad_toll_line(path) or f"cannot read historical tolls {path}: {exc}"
        ) from None
    return df


def _bad_toll_line(path: str | Path) -> str | None:
    """Where and why ``path`` is not a historical-tolls file, or None if every line is one."""
    try:
        with open_text(path) as f:
            for no, raw in enumerate(f.buffer, 1):  # bytes: a bad byte has a line number
                try:
                    line = raw.decode("ascii")
                except UnicodeDecodeError:
                    return f"{path}:{no}: not ASCII text"
                if line.strip():
                    try:
                        parse_toll_line(line)
                    except MalformedTupleError as exc:
                        return f"{path}:{no}: {exc}"
    except (OSError, EOFError) as exc:
        return f"cannot read historical tolls {path}: {exc}"
    return None


def _lav(p: Any, lav: str) -> Any:
    """LAV per segment and minute (over the five minutes before it)."""
    if lav == "raw-mean":
        st = p.groupby(_KEY).agg(s=("Spd", "sum"), c=("Spd", "size")).reset_index()
    else:
        per_car = p.groupby([*_KEY, "VID"])["Spd"].mean().reset_index()
        st = per_car.groupby(_KEY).agg(s=("Spd", "mean")).reset_index()
        st["c"] = 1
    frames = []
    for d in range(1, 6):
        x = st.copy()
        x["m"] = x["m"] + d
        frames.append(x)
    w = pd.concat(frames).groupby(_KEY)[["s", "c"]].sum().reset_index()
    w["LAV"] = np.floor(w["s"] / w["c"] + 0.5).astype(np.int64)
    return w[[*_KEY, "LAV"]]


def _accidents(p: Any, accident_end: str = "spec") -> Any:
    """Accidents: XWay, Dir, Seg, first and last active minute."""
    p = p.sort_values(["VID", "Time"], kind="stable").copy()
    g = p.groupby("VID")
    # The car's next report: the one after its last stopped report clears (clear-minute).
    p["Next"] = g["Time"].shift(-1).fillna(-1).astype(np.int64)
    same = np.ones(len(p), dtype=bool)
    for s in (1, 2, 3):
        pr = g[["Pos", "Lane", "XWay", "Dir"]].shift(s)
        same &= (
            (pr["Pos"] == p["Pos"])
            & (pr["Lane"] == p["Lane"])
            & (pr["XWay"] == p["XWay"])
            & (pr["Dir"] == p["Dir"])
        ).to_numpy()
    # Never stopped on the exit ramp (the car has left the expressway).
    stopped = p[same & (p["Lane"] != EXIT_LANE).to_numpy()]
    cols = ["XWay", "Dir", "Seg", "Pos", "Lane", "Time", "VID", "Next"]
    if stopped.empty:
        return pd.DataFrame(columns=["XWay", "Dir", "Seg", "m0", "m1"], dtype=np.int64)
    # A stop episode per car and position: first (4th identical) and last stopped
    # report, and the car's next report after the last (-1: none).
    ep = (
        stopped[cols]
        .groupby(["XWay", "Dir", "Seg", "Pos", "Lane", "VID"])
        .agg(min=("Time", "min"), max=("Time", "max"), moved=("Next", "last"))
        .reset_index()
    )
    acc = []
    # Two cars stopped at one place: the same position *and* lane.
    for (x, d, seg, _pos, _lane), grp in ep.groupby(["XWay", "Dir", "Seg", "Pos", "Lane"]):
        if grp["VID"].nunique() < 2:
            continue
        starts = sorted(grp["min"])
        detect = starts[1]
        if accident_end == "spec":
            end = int(grp["max"].max()) // 60 + 2
        else:
            clears = [int(mv) for mv in grp["moved"] if mv >= 0 and mv >= detect]
            end = min(clears) // 60 + 1 if clears else NEVER
        if detect // 60 + 2 > end:
            continue
        acc.append((x, d, seg, detect // 60 + 2, end))
    return pd.DataFrame(acc, columns=["XWay", "Dir", "Seg", "m0", "m1"], dtype=np.int64)


def _accident_near(n: Any, acc: Any) -> Any:
    """For each notification row of ``n``: the accident segment nearby, or -1."""
    near = np.full(len(n), -1, dtype=np.int64)
    xw, di, sg, mm = (n[c].to_numpy() for c in ("XWay", "Dir", "Seg", "m"))
    for a in acc.itertuples(index=False):
        downstream = (a.Seg - sg) if a.Dir == 0 else (sg - a.Seg)
        hit = (
            (xw == a.XWay)
            & (di == a.Dir)
            & (downstream >= 0)
            & (downstream <= 4)
            & (mm >= a.m0)
            & (mm <= a.m1)
        )
        near[hit & (near < 0)] = a.Seg
    return near


def expected_frames(
    input_path: str | Path,
    *,
    lav: str = "spec",
    tolls_path: str | Path | None = None,
    accident_end: str = "spec",
) -> Expected:
    """Every expected answer of the input, as :class:`Expected`."""
    check_lav(lav)
    check_accident_end(accident_end)
    df, rejected = read_input(input_path)
    p = df[df["Type"] == 0].copy()
    p["m"] = p["Time"] // 60 + 1
    p = p.sort_values(["VID", "Time"], kind="stable")
    prev = p.groupby("VID")[["Seg", "XWay", "Dir", "Lane"]].shift()
    new_seg = (
        prev["Seg"].isna()
        | (prev["Seg"] != p["Seg"])
        | (prev["XWay"] != p["XWay"])
        | (prev["Dir"] != p["Dir"])
        # Back on the road after the exit ramp: a new trip enters its segment again.
        | ((prev["Lane"] == EXIT_LANE) & (p["Lane"] != EXIT_LANE))
    )
    cars = p.groupby(_KEY)["VID"].nunique().rename("cars").reset_index()
    cars["m"] = cars["m"] + 1
    n = p[new_seg & (p["Lane"] != EXIT_LANE)][["VID", "Time", *_KEY]]
    n = n.merge(_lav(p, lav), on=_KEY, how="left").merge(cars, on=_KEY, how="left")
    n = n.fillna({"LAV": 0, "cars": 0}).astype({"LAV": np.int64, "cars": np.int64})
    acc = _accidents(p, accident_end)
    near = _accident_near(n, acc)
    toll = np.where((n["cars"] > 50) & (n["LAV"] < 40) & (near < 0), 2 * (n["cars"] - 50) ** 2, 0)
    n["Toll"] = toll.astype(np.int64)
    n["near"] = near
    n = n.sort_values(["Time", "VID"], kind="stable").reset_index(drop=True)
    tolls = n[["VID", "Time", "LAV", "Toll"]]
    an = n[n["near"] >= 0]
    accidents = pd.DataFrame(
        {
            "Time": an["Time"],
            "XWay": an["XWay"],
            "Seg": an["near"],
            "Dir": an["Dir"],
            "VID": an["VID"],
        }
    ).reset_index(drop=True)
    balances = _balances(df, n, p[new_seg][["VID", "Time"]])
    expenditures = _expenditures(df, tolls_path)
    return Expected(tolls, accidents, balances, expenditures, rejected)


def _balances(df: Any, n: Any, entries: Any) -> Any:
    """Balance answers: charges are each toll, taken when the car next enters a segment."""
    q = df[df["Type"] == 2][["Time", "VID", "QID"]]
    # Entering a segment on the exit lane charges the previous toll too.
    ent = entries.sort_values(["VID", "Time"], kind="stable").copy()
    ent["ChargeTime"] = ent.groupby("VID")["Time"].shift(-1)
    ch = n[["VID", "Time", "Toll"]].merge(ent, on=["VID", "Time"], how="left")
    ch = ch[ch["ChargeTime"].notna() & (ch["Toll"] > 0)]
    ch = ch.astype({"ChargeTime": np.int64}).sort_values("ChargeTime", kind="stable")
    ch["cum"] = ch.groupby("VID")["Toll"].cumsum()
    q = q.sort_values("Time", kind="stable")
    m = pd.merge_asof(
        q, ch[["VID", "ChargeTime", "Toll", "cum"]], left_on="Time", right_on="ChargeTime",
        by="VID", direction="backward",
    )  # fmt: skip
    bal = m["cum"].fillna(0).astype(np.int64)
    last = m["Toll"].fillna(0).astype(np.int64)
    return pd.DataFrame(
        {
            "Time": m["Time"],
            "ResultTime": m["Time"],
            "QID": m["QID"],
            "Balance": bal,
            "Balance5": bal - last,
        }
    ).reset_index(drop=True)


def _expenditures(df: Any, tolls_path: str | Path | None) -> Any:
    """Daily-expenditure answers from the historical tolls (0 where none is known)."""
    q = df[df["Type"] == 3][["Time", "VID", "QID", "XWay", "Day"]]
    if tolls_path is None:
        h = pd.DataFrame(columns=["VID", "Day", "XWay", "Toll"], dtype=np.int64)
    else:
        # A key given twice counts once, its first row in file order (as the engines read it).
        h = read_tolls(tolls_path).drop_duplicates(["VID", "Day", "XWay"], keep="first")
    m = q.merge(h, on=["VID", "Day", "XWay"], how="left")
    miss = m["Toll"].isna()
    if miss.any():
        # Queries without an expressway (-1) match any expressway of that car and day.
        alt = q[q["XWay"] < 0].merge(h.drop(columns="XWay"), on=["VID", "Day"], how="left")
        alt = alt.drop_duplicates("QID").set_index("QID")["Toll"]
        m.loc[miss, "Toll"] = m.loc[miss, "QID"].map(alt)
    m["Toll"] = m["Toll"].fillna(0).astype(np.int64)
    return m[["Time", "QID", "Toll"]].reset_index(drop=True)


def expected_answers(
    input_path: str | Path,
    *,
    lav: str = "spec",
    tolls_path: str | Path | None = None,
    accident_end: str = "spec",
) -> list[str]:
    """The expected answers of the input as answers-file lines (Emit 0.000)."""
    return expected_frames(
        input_path, lav=lav, tolls_path=tolls_path, accident_end=accident_end
    ).lines()
