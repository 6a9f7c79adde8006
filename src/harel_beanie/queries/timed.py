"""A time search's page and counts on a server where `limit` bounds nothing (SecantusDB):
windows of `updated_at` from the top of the span down.

Why this module exists: such a server reads every match of a query before it keeps a page or
stops a count, so a search over one day read the whole day: 10 s a page and 31 s the front
page at a million executions (about 33,000 updated in a day). Newest first, the page is the
top of the span. Each status's part (`parts.split`: `status` and a range of `updated_at`,
one range of hb_status_updated) is read as windows going down (`core.windows.DownwardWalk`),
each sized from what the last held, until the page is full; a part read after the page is
full only reads down to its last row. A count walks the same windows and stops once it
reaches its cap, which is lower here (`SPAN_COUNT_CAP`) because every document counted is
read.
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional

from harel_beanie.core.time_order import TIME_SORT, time_key
from harel_beanie.core.windows import DownwardWalk
from harel_beanie.queries import parts
from harel_beanie.queries.parts import split
from harel_beanie.queries.rows import ExecutionRow

#: where a time search's count per status stops on such a server (each counted document is
#: read): a count equal to it means at least that many
SPAN_COUNT_CAP = 1_000
#: the first window is the span's width divided by this (the walk then sizes each window
#: from what the last held); a span open below starts at `OPEN_WIDTH` seconds
FIRST_SHARE, OPEN_WIDTH = 1024, 3600.0


class SpanWalk:
    """The filters on `updated_at` of the windows of a span (a query's `updated_at` range),
    from its top down to `floor` (inclusive; also the span's own lower bound, the higher
    of the two). A span open above is read first at and above the time the walk began.

    `next()` gives a window's filter; `saw(n)` says how many it held; `done` once the window
    that reaches the floor (or, with none, open below) was read."""

    def __init__(self, span: dict[str, Any], target: int, floor: Optional[float] = None) -> None:
        lows = [x for x in (span.get("$gte"), floor) if x is not None]
        self.low: Optional[float] = max(lows) if lows else None
        tops = [span["$lt"]] if "$lt" in span else []
        if "$lte" in span:  # inclusive: the window below it ends just above
            tops.append(math.nextafter(span["$lte"], math.inf))
        self._above: Optional[dict[str, Any]] = None
        if tops:
            top = min(tops)
        else:
            top = time.time()
            self._above = {"$gte": top}
        wide = (top - self.low) / FIRST_SHARE if self.low is not None else OPEN_WIDTH
        self._walk = DownwardWalk(
            top, target=target, width=max(wide, math.ulp(top) * 4), floor=self.low if self.low is not None else 0.0
        )
        self.done = self.low is not None and top <= self.low and self._above is None
        self._reading_above = False

    def next(self) -> dict[str, Any]:
        if self._above is not None:
            self._reading_above = True
            return self._above
        window = self._walk.next()
        bounds: dict[str, Any] = {"$lt": window.high}
        low = window.low if window.low is not None else self.low
        if low is not None:
            bounds["$gte"] = low
        return bounds

    def saw(self, n: int) -> None:
        if self._reading_above:
            self._reading_above, self._above = False, None
            self.done = self.low is not None and self._walk.high <= self.low
            return
        self._walk.saw(n)
        self.done = self._walk.done


async def page_rows(doc: Any, query: dict[str, Any], n: int) -> list[ExecutionRow]:
    """The first `n` rows of the time search `query` (its cursor included), newest first.
    The parts are read in turn, each until it has `n` rows or reaches the page's last row so
    far (nothing below that can be on the page)."""
    rows: list[ExecutionRow] = []
    for lead, rest in split(query):
        floor = None
        if len(rows) >= n and rows[n - 1].updated_at is not None:
            floor = rows[n - 1].updated_at
        got = await _walk(doc, lead, rest, n, floor)
        rows = sorted(rows + got, key=lambda r: time_key(r.updated_at, r.id), reverse=True)[:n]
    return rows


async def _walk(
    doc: Any, lead: dict[str, Any], rest: dict[str, Any], n: int, floor: Optional[float]
) -> list[ExecutionRow]:
    """Up to `n` rows of one part, newest first, window by window (the children of one
    execution, whose part is led by hb_parent, in one read: an execution starts few)."""
    if "updated_at" not in lead:
        return await _read(doc, lead, rest, n)
    rows: list[ExecutionRow] = []
    walk = SpanWalk(lead["updated_at"], n, floor)
    while not walk.done and len(rows) < n:
        got = await _read(doc, {**lead, "updated_at": walk.next()}, rest, n - len(rows))
        rows += got
        walk.saw(len(got))
    return rows


async def _read(doc: Any, lead: dict[str, Any], rest: dict[str, Any], n: int) -> list[ExecutionRow]:
    stages = parts.pipeline(lead, rest, n, dict(TIME_SORT))
    return await doc.aggregate(stages, projection_model=ExecutionRow).to_list()  # type: ignore[no-any-return]


async def count(doc: Any, query: dict[str, Any], cap: int) -> int:
    """How many documents match `query` (a time search), each part counted window by window
    from the top of the span, stopping once the total reaches `cap`."""
    if isinstance(query.get("parent_id"), str):  # the children of one execution: few, one range
        return await parts.count(doc, query, cap)
    total = 0
    for lead, rest in split(query):
        walk = SpanWalk(lead["updated_at"], max(1, cap // 4))
        while not walk.done and total < cap:
            held = await parts.count_part(doc, {**lead, "updated_at": walk.next()}, rest)
            total += held
            walk.saw(held)
    return min(total, cap)
