"""A listing's page as reads that a server plans as ranges of one index each, for a server
on which `limit` bounds nothing (SecantusDB).

Why this module exists: SecantusDB plans a filter from its shape, not from statistics. An
equality on the leading field of a compound index and a range on the next field (`status`
then `_id`) reads only that range of the index; any other shape falls back to one clause
alone (`definition_id` and `status` and an `_id` bound reads every execution of the
definition) or to the whole collection (a range on `_id` alone), and a hint walks the whole
index. It reads every match before the limit keeps a page. So a page is sent as one or more
parts, each an aggregate whose first `$match` is exactly the shape the server bounds (it
plans with that stage alone) and whose second `$match` holds the rest of the filter:

- the children of an execution: `parent_id`, then the `_id` bound (hb_parent);
- a time bound: `status` and the `updated_at` range (hb_status_updated), one part per
  status when none is named, the `_id` bound in the rest;
- roots only, a status, a definition: that field, then the `_id` bound;
- nothing of these (the whole listing, an id prefix, an outcome): one part per status and
  one for documents with none (tombstones, executions harel's own store wrote), each
  `status` then the `_id` bound, over hb_status.

Each part sorts and limits its own matches; the page is the first of their union in `_id`
order, so it is exactly the page one query would give (every document matching the filter
is in one part: a status is one of harel's, or there is none).
"""

from __future__ import annotations

from typing import Any, Optional

from harel_beanie.core.windows import string_uppers
from harel_beanie.queries.rows import STATUSES, ExecutionRow


def split(query: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(the bounded first stage, the rest) of each part of `query` (a listing's filter, the
    keyset bound included)."""
    ids = {"_id": query["_id"]} if "_id" in query else {}
    if isinstance(query.get("parent_id"), str):
        leads = [{"parent_id": query["parent_id"], **ids}]
    elif "updated_at" in query:
        statuses = [query["status"]] if "status" in query else list(STATUSES)
        leads = [{"status": s, "updated_at": query["updated_at"]} for s in statuses]
    elif "parent_id" in query:
        leads = [{"parent_id": None, **ids}]
    elif "status" in query:
        leads = [{"status": query["status"], **ids}]
    elif "definition_id" in query:
        leads = [{"definition_id": query["definition_id"], **ids}]
    else:
        leads = [{"status": s, **ids} for s in (*STATUSES, None)]
    return [(lead, {k: v for k, v in query.items() if k not in lead}) for lead in leads]


def pipeline(lead: dict[str, Any], rest: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """One part's aggregate: the bounded stage first (the server plans with it alone)."""
    stages: list[dict[str, Any]] = [{"$match": lead}]
    if rest:
        stages.append({"$match": rest})
    return [*stages, {"$sort": {"_id": 1}}, {"$limit": limit}]


# --- reading a page: windows on `_id` ------------------------------------------------------

#: what a listing's first page began with last time, and the position its windows filled at,
#: by collection and filter (a cost hint only: a page reads the same rows without them)
_FIRST: dict[tuple[str, str], str] = {}
_DEPTH: dict[tuple[str, str], int] = {}
_REMEMBERED = 1_000


async def page_rows(doc: Any, query: dict[str, Any], n: int) -> list[ExecutionRow]:
    """The first `n` rows of the listing of `query` (its keyset bound included), in `_id`
    order, read window by window on `_id` so that a page reads about a page of each part's
    index range however many executions follow it.

    Windows start at the cursor (or an id prefix) and widen (`string_uppers`) until the page
    fills or the key is exhausted; until one holds a row, an empty window widens by a whole
    position.
    A first page with no prefix starts at the id the last first page of this filter began
    with: all below it (usually none) in one read, then windows above. The very first of a
    filter in a process has no such id and reads its parts whole, once. A time bound is
    already a bounded range (the executions updated in it): read in one go. Kept whole: where
    the windows start and how they widen are one rule, read top to bottom."""
    pieces = split(query)
    if "updated_at" in query:
        return await _read(doc, pieces, n, None)
    ids = dict(query.get("_id", {}))
    key = (doc.get_pymongo_collection().full_name, repr(sorted((k, repr(v)) for k, v in query.items() if k != "_id")))
    ceiling: Optional[str] = ids.get("$lt")
    rows: list[ExecutionRow] = []
    if "$gt" in ids and not ids.get("$gte", "") > ids["$gt"]:  # the cursor, within a prefix's range
        anchor, low = ids["$gt"], {"$gt": ids["$gt"]}
    elif "$gte" in ids:  # an id prefix's first page (or a cursor below it)
        anchor, low = ids["$gte"], {"$gte": ids["$gte"]}
    elif key in _FIRST:
        anchor = _FIRST[key]
        rows = await _read(doc, pieces, n, {"$lte": anchor})
        low = {"$gt": anchor}
    else:
        rows = await _read(doc, pieces, n, None)
        _remember(_FIRST, key, rows[0].id if rows else None)
        return rows
    if not ids and rows:
        _remember(_FIRST, key, rows[0].id)
    skip, found = None, False
    for position, upper in string_uppers(anchor, _DEPTH.get(key, len(anchor)) + 1):
        if len(rows) >= n:
            break
        if position == skip:
            continue
        if ceiling is not None and (upper is None or upper >= ceiling):
            upper = ceiling
        got = await _read(doc, pieces, n - len(rows), {**low, **({"$lt": upper} if upper is not None else {})})
        rows += got
        # an empty window before any row widens by a whole position; never into the window
        # open above (past the rows, it could hold the rest of the key)
        found = found or bool(got)
        skip = position if not found and position > 0 else None
        _remember(_DEPTH, key, position)
        if upper is None or upper == ceiling:
            break
        low = {"$gte": upper}
    return rows[:n]


def _remember(memory: dict[tuple[str, str], Any], key: tuple[str, str], value: Any) -> None:
    if value is None:
        return
    if len(memory) >= _REMEMBERED:
        memory.clear()
    memory[key] = value


async def _read(
    doc: Any, pieces: list[tuple[dict[str, Any], dict[str, Any]]], n: int, ids: Optional[dict[str, Any]]
) -> list[ExecutionRow]:
    """The first `n` rows of the union of the parts, each read with its `_id` bound replaced
    by `ids` (None: as the query had it)."""
    rows: list[ExecutionRow] = []
    for lead, rest in pieces:  # in turn: a page's reads stay in the request's task, and in order
        stage = lead if ids is None else {**lead, "_id": ids}
        rows += await doc.aggregate(pipeline(stage, rest, n), projection_model=ExecutionRow).to_list()
    return sorted(rows, key=lambda r: r.id)[:n]
