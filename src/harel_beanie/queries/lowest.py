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
from typing import Any, Optional, TypeVar

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


async def lowest(doc: Any, query: dict[str, Any], field: str, n: int, model: type[Row], *, kind: str = "") -> list[Row]:
    """The first `n` documents matching `query` in ascending `field` order, projected to
    `model`. `query` may bound `field` itself ($gte, $gt, $lt, $lte); every match must
    have `field` as a number (the partial indexes behind these reads hold only those).
    `kind` keeps the start of reads of the same field and filter apart where they want
    different stretches of it (the soonest timers, and the timers long overdue), as `n`
    does for reads of different lengths."""
    n = require_int("n", n, low=1)
    coll = doc.get_pymongo_collection()
    if (await server_of(coll)).limit_bounds_work:
        return await _find(doc, query, n, field, model)
    own = dict(query.get(field, {}))
    rest = {k: v for k, v in query.items() if k != field}
    # a start and a width per number of rows wanted too: a width learnt for one row, kept
    # for a read of twenty, doubles across every gap in the field before it fills
    key = (coll.full_name, field, repr(sorted((k, repr(v)) for k, v in rest.items())) + f"{kind} n={n}")
    if key not in _START:
        await _recall(coll, key)
    if key not in _START:
        rows = await _find(doc, query, n, field, model)
        spread = float(getattr(rows[-1], field)) - float(getattr(rows[0], field)) if rows else 0.0
        await _keep(coll, key, rows, field, spread if spread > 0 else 1.0)
        return rows
    start, width = _START[key]
    rows = await _find(doc, {**rest, field: {**own, "$lt": _lesser(own.get("$lt"), start)}}, n, field, model)
    top = own.get("$lt", own.get("$lte"))
    walk = UpwardWalk(start, target=n, width=width, high=top)
    while len(rows) < n and not walk.done:
        window = walk.next()
        bounds = {**own, "$gte": max(own.get("$gte", start), window.low or start)}
        if window.high is not None:
            bounds["$lt"] = _lesser(own.get("$lt"), window.high)
        want = n - len(rows)
        got = await _find(doc, {**rest, field: bounds}, want, field, model)
        walk.saw(len(got))
        rows += got
        if got and len(got) == want:
            # a full window may have held far more than it returned (the server read them
            # all; the limit hid how many): the next read's width is the stretch that held
            # these rows and a little more, so that it reads about `n` again (a width learnt
            # on fewer documents would otherwise stay, and read ever more of them)
            span = float(getattr(rows[-1], field)) - float(getattr(rows[0], field))
            narrower = span * (1 + 2 / len(rows)) if span > 0 else walk.width / SHRINK
            walk.width = max(min(walk.width, narrower), math.ulp(float(getattr(rows[0], field))) * 4)
    await _keep(coll, key, rows, field, walk.width)
    return rows


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


async def _keep(coll: Any, key: tuple[str, str, str], rows: list[Any], field: str, width: float) -> None:
    """Remember where this read began, in the process and (when it moved) in the database."""
    if not rows:
        return
    start = float(getattr(rows[0], field))
    if not _usable(start, width):
        return
    if len(_START) >= _REMEMBERED:
        _START.clear()
        _KEPT.clear()
    _START[key] = (start, width)
    if _KEPT.get(key) != start:
        _KEPT[key] = start
        await keep(coll, start_key(*key), {"at": start, "size": width})
