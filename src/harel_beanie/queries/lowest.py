"""The documents with the smallest values of one indexed field (the soonest timers, the
executions silent the longest), read so that the work follows what is shown, not what is
stored.

Why this module exists: "the first N by a field" is one sorted, limited query, and on a
server whose `limit` bounds its work (mongod) that is all it needs. On one that reads every
match before keeping N (SecantusDB), the same query costs every execution waiting on a timer
for the backlog's ten soonest. So there the field is read in windows (`UpwardWalk`) from the
smallest value the last such read found (the values below it, usually none, in one read),
each window sized from what the last held, until N are in hand. Where the last read began is
kept in the process and in the database (`harel_beanie.queries.starts`), so a new process
(`harel-beanie status`) starts there too; the very first read of a kind, with no start kept
anywhere, reads its matches whole, once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

from beanie import SortDirection

from harel_beanie.core.arguments import require_int
from harel_beanie.core.start_documents import start_key
from harel_beanie.core.windows import SHRINK, UpwardWalk
from harel_beanie.queries.server import server_of
from harel_beanie.queries.starts import keep, recall

Row = TypeVar("Row")

#: per collection, field and filter: where the last read's smallest value was, and the width
#: of its last window (a cost hint only: the rows are the same without it)
_START: dict[tuple[str, str, str], tuple[float, float]] = {}
#: ... and the start last kept in the database (written again only when it moves)
_KEPT: dict[tuple[str, str, str], float] = {}
_REMEMBERED = 1_000
#: the widest window, in seconds, before the walk's last one is open above (about 31 years)
WIDEST = 1e9


async def lowest(
    doc: Any,
    query: dict[str, Any],
    field: str,
    n: int,
    model: type[Row],
    *,
    kind: str = "",
    value: Optional[Callable[[Row], float]] = None,
    widest: float = WIDEST,
    whole: bool = False,
) -> list[Row]:
    """The first `n` documents matching `query` in ascending `field` order, projected to
    `model`. `query` may bound `field` itself ($gte, $gt, $lt, $lte); every match must
    have `field` as a number (the partial indexes behind these reads hold only those).
    `kind` keeps the start of reads of the same field and filter apart where they want
    different stretches of it (the soonest timers, and the timers long overdue), as `n`
    does for reads of different lengths. `value` reads `field` off a row where it is no
    attribute of the model (a dotted path); by default the row's attribute `field`.
    `widest` is the width past which a window is open above (`UpwardWalk`), in the key's
    own units; `whole` says the key holds integers, so every bound the walk computes is
    sent as one: a server may compare an integer above 2^53 with a fractional bound
    inexactly, and differently in its index and in its filter, so that a document at a
    window's edge matched neither window (SecantusDB did, for seqs)."""
    n = require_int("n", n, low=1)
    at: Callable[[Row], float] = value or (lambda row: float(getattr(row, field)))
    coll = doc.get_pymongo_collection()
    if (await server_of(coll)).limit_bounds_work:
        return await _find(doc, query, n, field, model)
    rest = {k: v for k, v in query.items() if k != field}
    # a start and a width per number of rows wanted too: a width learnt for one row, kept
    # for a read of twenty, doubles across every gap in the field before it fills
    key = (coll.full_name, field, repr(sorted((k, repr(v)) for k, v in rest.items())) + f"{kind} n={n}")
    if key not in _START:
        await _recall(coll, key)
    if key not in _START:
        rows = await _find(doc, query, n, field, model)
        spread = at(rows[-1]) - at(rows[0]) if rows else 0.0
        await _keep(coll, key, rows, at, spread if spread > 0 else 1.0)
        return rows
    walk = _Windowed(doc, query, field, model, at, math.floor if whole else float, widest)
    rows, width = await walk.up(n, *_START[key])
    await _keep(coll, key, rows, at, width)
    return rows


@dataclass(frozen=True)
class _Windowed:
    """One windowed read of `lowest`: the query, its key, and how the key is read off a row
    (`at`) and sent in a bound (`sent`)."""

    doc: Any
    query: dict[str, Any]
    field: str
    model: Any
    at: Callable[[Any], float]
    sent: Callable[[float], Any]
    widest: float

    async def up(self, n: int, start: float, width: float) -> tuple[list[Any], float]:
        """The first `n` rows from below `start` (usually none) then up in windows from it;
        and the width the last window ended with."""
        field, sent, at = self.field, self.sent, self.at
        own = dict(self.query.get(field, {}))
        rest = {k: v for k, v in self.query.items() if k != field}
        rows = await self.read({**rest, field: {**own, "$lt": _lesser(own.get("$lt"), sent(start))}}, n)
        top = own.get("$lt", own.get("$lte"))
        walk = UpwardWalk(start, target=n, width=width, high=top, widest=self.widest)
        while len(rows) < n and not walk.done:
            window = walk.next()
            bounds = {**own, "$gte": max(own.get("$gte", sent(start)), sent(window.low or start))}
            if window.high is not None:
                bounds["$lt"] = _lesser(own.get("$lt"), sent(window.high))
            want = n - len(rows)
            got = await self.read({**rest, field: bounds}, want)
            walk.saw(len(got))
            rows += got
            if got and len(got) == want:
                # a full window may have held far more than it returned (the server read them
                # all; the limit hid how many): the next read's width is the stretch that held
                # these rows and a little more, so that it reads about `n` again (a width learnt
                # on fewer documents would otherwise stay, and read ever more of them)
                span = at(rows[-1]) - at(rows[0])
                narrower = span * (1 + 2 / len(rows)) if span > 0 else walk.width / SHRINK
                walk.width = max(min(walk.width, narrower), math.ulp(at(rows[0])) * 4)
        return rows, walk.width

    async def read(self, query: dict[str, Any], n: int) -> list[Any]:
        return await _find(self.doc, query, n, self.field, self.model)


def _lesser(a: Optional[float], b: float) -> float:
    return b if a is None else min(a, b)


async def _find(doc: Any, query: dict[str, Any], n: int, field: str, model: type[Row]) -> list[Row]:
    rows: list[Row] = (
        await doc.find(query, projection_model=model).sort([(field, SortDirection.ASCENDING)]).limit(n).to_list()
    )
    return rows


async def _recall(coll: Any, key: tuple[str, str, str]) -> None:
    """The start a reader kept in the database (another process, or this one before)."""
    saved = await recall(coll, start_key(*key))
    at, size = (saved or {}).get("at"), (saved or {}).get("size")
    if isinstance(at, (int, float)) and isinstance(size, (int, float)) and _usable(float(at), float(size)):
        _START[key] = (float(at), float(size))
        _KEPT[key] = float(at)


def _usable(start: float, width: float) -> bool:
    return math.isfinite(start) and math.isfinite(width) and width > 0


async def _keep(
    coll: Any, key: tuple[str, str, str], rows: list[Any], at: Callable[[Any], float], width: float
) -> None:
    """Remember where this read began, in the process and (when it moved) in the database."""
    if not rows:
        return
    start = at(rows[0])
    if not _usable(start, width):
        return
    if len(_START) >= _REMEMBERED:
        _START.clear()
        _KEPT.clear()
    _START[key] = (start, width)
    if _KEPT.get(key) != start:
        _KEPT[key] = start
        await keep(coll, start_key(*key), {"at": start, "size": width})
