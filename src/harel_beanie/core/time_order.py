"""The order of a time search (newest first) and its keyset cursor, with no I/O.

Why this module exists: a listing narrowed to a time span matches every execution updated in
it, and a busy day holds tens of thousands. Listed by id, each page had to read them all on a
server whose `limit` bounds nothing; listed newest first, a page is the top of the span and
is read as a few narrow windows of `updated_at` (`harel_beanie.queries.timed`). The cursor
of such a listing is a position in that order, the last row's (updated_at, id), handed to
the caller as one string: `updated_at` as Python writes a float (exact, and never holding a
colon), a colon, then the id as it is.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from harel_beanie.core.arguments import BadArgument, require_str, require_time

#: the sort of a time search: newest first, ties by id, descending too (a total order)
TIME_SORT: list[tuple[str, int]] = [("updated_at", -1), ("_id", -1)]


def is_timed(query: dict[str, Any]) -> bool:
    """Whether a listing's filter is a time search (it bounds `updated_at`)."""
    return "updated_at" in query


def time_cursor(updated_at: float, last_id: str) -> str:
    """The cursor after the row (`updated_at`, `last_id`) of a time search."""
    return f"{require_time('updated_at', updated_at)!r}:{require_str('last_id', last_id)}"


def read_time_cursor(cursor: str) -> tuple[float, str]:
    """(updated_at, id) of a cursor `time_cursor` made; anything else is refused (BadArgument
    naming `after`) rather than read as some other position."""
    cursor = require_str("after", cursor)
    at, colon, last_id = cursor.partition(":")
    try:
        when = float(at)
    except ValueError:
        when = math.nan
    if not colon or math.isnan(when) or math.isinf(when):
        raise BadArgument("after", f"is not a cursor of a time search (updated_at:id): {cursor[:200]!r}")
    return when, last_id


#: a filter nothing matches: what follows a cursor that is not a place in the time order
NOTHING: dict[str, Any] = {"_id": {"$in": []}}


def after_time_cursor(query: dict[str, Any], cursor: Optional[str]) -> dict[str, Any]:
    """`query` (a time search) narrowed to the rows after `cursor` in `TIME_SORT`: updated
    no later than the cursor's row and, if at the same time, with a smaller id. The bound on
    `updated_at` joins the span's (a range the index reads); the tie is an `$or` the
    server checks on what that range reaches.

    A cursor `time_cursor` did not make (an id from a listing by id, say) is a row with no
    time, which the order puts last (`time_key`): nothing follows it (`NOTHING`). It is not
    refused: `after` is a free string to every listing, and an id is a valid one."""
    if cursor is None:
        return dict(query)
    try:
        when, last_id = read_time_cursor(cursor)
    except BadArgument:
        return {**query, **NOTHING}
    out = dict(query)
    out["updated_at"] = {**query.get("updated_at", {}), "$lte": when}
    out["$or"] = [{"updated_at": {"$lt": when}}, {"_id": {"$lt": last_id}}]
    return out


def time_key(updated_at: Optional[float], row_id: str) -> tuple[float, str]:
    """A row's place in `TIME_SORT`, to sort with `reverse=True` (a row with no time last)."""
    return (-math.inf if updated_at is None else updated_at, row_id)
