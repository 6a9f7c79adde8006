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

import os
from typing import Any, Optional

from harel_beanie.core.start_documents import start_key
from harel_beanie.core.windows import position_uppers
from harel_beanie.queries.counts import execution_counts
from harel_beanie.queries.rows import STATUSES, ExecutionRow
from harel_beanie.queries.starts import keep, recall


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


def matches(lead: dict[str, Any], rest: dict[str, Any]) -> list[dict[str, Any]]:
    """One part's filter stages: the bounded stage first (the server plans with it alone)."""
    return [{"$match": lead}, *([{"$match": rest}] if rest else [])]


def pipeline(
    lead: dict[str, Any], rest: dict[str, Any], limit: int, sort: Optional[dict[str, int]] = None
) -> list[dict[str, Any]]:
    """One part's page: its filter stages, then its first `limit` in `sort`'s order (`_id`'s
    by default)."""
    return [*matches(lead, rest), {"$sort": sort or {"_id": 1}}, {"$limit": limit}]


async def count_part(doc: Any, lead: dict[str, Any], rest: dict[str, Any], cap: Optional[int] = None) -> int:
    """How many documents one part (or a window of it) matches, stopping at `cap` if given."""
    stages = [*matches(lead, rest), *([{"$limit": cap}] if cap is not None else [])]
    stages.append({"$group": {"_id": None, "n": {"$sum": 1}}})
    got = await (await doc.get_pymongo_collection().aggregate(stages)).to_list(None)
    return int(got[0]["n"]) if got else 0


async def count(doc: Any, query: dict[str, Any], cap: int) -> int:
    """How many documents match `query`, each part counted over its own index range and
    stopping at `cap` (a count equal to the cap means at least that many). Sent as a
    count's usual filter, the same shape is planned by one clause alone: an id prefix and a
    status reads every execution of the status."""
    total = 0
    for lead, rest in split(query):
        total += await count_part(doc, lead, rest, cap)
    return min(total, cap)


# --- reading a page: windows on `_id` ------------------------------------------------------

#: per collection and filter, a cost hint only (a page reads the same rows without them): what
#: its last first page began with, the position its windows filled at, and how many rows
#: each part gave (the largest is read first)
_FIRST: dict[tuple[str, str], str] = {}
_DEPTH: dict[tuple[str, str], int] = {}
_SHARE: dict[tuple[str, str], list[int]] = {}
#: what was last kept in the database of each (`harel_beanie.queries.starts`): the first id
#: and the position, written again only when one moves
_KEPT: dict[tuple[str, str], tuple[str, Optional[int]]] = {}
_REMEMBERED = 1_000

Piece = tuple[dict[str, Any], dict[str, Any]]


async def page_rows(doc: Any, query: dict[str, Any], n: int) -> list[ExecutionRow]:
    """The first `n` rows of the listing of `query` (its keyset bound included), in `_id`
    order, read so that a page reads about a page of each part's index range however many
    executions follow it.

    The parts are read one after another, the one that gave the most rows last time first.
    Each is read in windows on `_id` from the cursor (or an id prefix) up, each a whole
    position of the id wider than the last (`position_uppers`), until it has `n` rows or the
    key is exhausted. Once `n` rows are in hand, nothing after the `n`-th can be on the page,
    so every later part is read below it: usually one read of a few rows each.

    A first page with no prefix starts at the id the last first page of this filter began
    with: all below it (usually none) in one read, then windows above. That id is kept in the
    process and in the database (`harel_beanie.queries.starts`), so a restarted dashboard
    starts there too. The very first of a filter, with no start kept anywhere, starts at the
    lowest id the counters have counted (every partition's smallest, a lower bound); where
    they do not know it, it reads its parts whole, once. (A time search is
    `harel_beanie.queries.timed`'s.)"""
    pieces = split(query)
    ids = dict(query.get("_id", {}))
    coll = doc.get_pymongo_collection()
    key = (coll.full_name, repr(sorted((k, repr(v)) for k, v in query.items() if k != "_id")))
    if not ids and key not in _FIRST:
        await _find_start(doc, coll, key)
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
        whole = await _read_each(doc, pieces, n, None)
        rows = _first(whole, n)
        _remember(_FIRST, key, rows[0].id if rows else None)
        _remember(_SHARE, key, _shares(whole, rows))
        if len(rows) > 1:  # the page's ids share this many characters: its windows fill there
            _remember(_DEPTH, key, len(os.path.commonprefix([rows[0].id, rows[-1].id])))
        await _keep(coll, key)
        return rows
    rows = await _above(doc, pieces, n, rows, (anchor, low, ids.get("$lt")), key)
    if not ids:
        if rows:  # the page's first row: the start was below it (a lower bound, or a row gone)
            _remember(_FIRST, key, rows[0].id)
        await _keep(coll, key)
    return rows


async def _find_start(doc: Any, coll: Any, key: tuple[str, str]) -> None:
    """Where a first page with no start in this process begins: where a reader kept it in the
    database, else at the lowest id the counters know (no execution's id is below it: each
    partition's counter keeps the smallest id it has held, `core.counting.Counts.low`). Where
    they do not know it either, the first page reads its parts whole, once."""
    await _recall(coll, key)
    if key not in _FIRST:
        counted = await execution_counts(doc=doc)
        _remember(_FIRST, key, None if counted is None else counted.low)


async def _above(
    doc: Any,
    pieces: list[Piece],
    n: int,
    rows: list[ExecutionRow],
    start: tuple[str, dict[str, Any], Optional[str]],
    key: tuple[str, str],
) -> list[ExecutionRow]:
    """The page from `rows` (what lies at or below the anchor) and the parts' rows above
    `start` (the anchor, the bound it starts after, the ceiling): the part that gave most
    first, each later one below the page's `n`-th row."""
    anchor, low, ceiling = start
    share = _SHARE.get(key, [0] * len(pieces))
    order = sorted(range(len(pieces)), key=lambda i: -share[i] if i < len(share) else 0)
    each: list[list[ExecutionRow]] = [[] for _ in pieces]
    for i in order:
        bound = ceiling if len(rows) < n else _below(rows[n - 1].id, ceiling)
        each[i] = await _walk(doc, pieces[i], n, anchor, low, bound, key)
        rows = sorted(rows + each[i], key=lambda r: r.id)[:n]
    _remember(_SHARE, key, _shares(each, rows))
    return rows


async def _recall(coll: Any, key: tuple[str, str]) -> None:
    """Where a first page of this filter began, as a reader kept it in the database."""
    saved = await recall(coll, start_key(*key)) or {}
    if isinstance(saved.get("at"), str):
        _remember(_FIRST, key, saved["at"])
        _KEPT[key] = (saved["at"], saved.get("size"))
        if isinstance(saved.get("size"), (int, float)):
            _remember(_DEPTH, key, int(saved["size"]))
        if isinstance(saved.get("share"), list) and all(isinstance(x, int) for x in saved["share"]):
            _remember(_SHARE, key, saved["share"])


async def _keep(coll: Any, key: tuple[str, str]) -> None:
    """Keep where this first page began in the database, when it moved since last kept."""
    at, size = _FIRST.get(key), _DEPTH.get(key)
    if at is None or _KEPT.get(key) == (at, size):
        return
    if len(_KEPT) >= _REMEMBERED:
        _KEPT.clear()
    _KEPT[key] = (at, size)
    await keep(coll, start_key(*key), {"at": at, "size": size, "share": _SHARE.get(key, [])})


def _shares(each: list[list[ExecutionRow]], page: list[ExecutionRow]) -> list[int]:
    """How many of the page's rows each part gave."""
    shown = {r.id for r in page}
    return [sum(1 for r in rows if r.id in shown) for rows in each]


def _below(last: str, ceiling: Optional[str]) -> str:
    """The exclusive bound that keeps `last` and everything before it: `last` followed by
    the first code point is the next string after it."""
    bound = last + "\x00"
    return bound if ceiling is None or bound < ceiling else ceiling


async def _walk(
    doc: Any, piece: Piece, n: int, anchor: str, low: dict[str, Any], bound: Optional[str], key: tuple[str, str]
) -> list[ExecutionRow]:
    """Up to `n` rows of one part from `low` up (below `bound`), in windows a position wider
    each, starting one position deeper than the last page of this filter filled at."""
    rows: list[ExecutionRow] = []
    for position, upper in position_uppers(anchor, _DEPTH.get(key, len(anchor)) + 1):
        if bound is not None and (upper is None or upper >= bound):
            upper = bound
        rows += await _read(doc, [piece], n - len(rows), {**low, **({"$lt": upper} if upper is not None else {})})
        if len(rows) >= n:
            _remember(_DEPTH, key, position)
        if len(rows) >= n or upper is None or upper == bound:
            break
        low = {"$gte": upper}
    return rows


def _remember(memory: dict[tuple[str, str], Any], key: tuple[str, str], value: Any) -> None:
    if value is None:
        return
    if len(memory) >= _REMEMBERED:
        memory.clear()
    memory[key] = value


async def _read(doc: Any, pieces: list[Piece], n: int, ids: Optional[dict[str, Any]]) -> list[ExecutionRow]:
    """The first `n` rows of the union of the parts, each read with its `_id` bound replaced
    by `ids` (None: as the query had it)."""
    return _first(await _read_each(doc, pieces, n, ids), n)


async def _read_each(doc: Any, pieces: list[Piece], n: int, ids: Optional[dict[str, Any]]) -> list[list[ExecutionRow]]:
    """Each part's first `n` rows, as `_read` bounds them."""
    out: list[list[ExecutionRow]] = []
    for lead, rest in pieces:  # in turn: a page's reads stay in the request's task, and in order
        stage = lead if ids is None else {**lead, "_id": ids}
        out.append(await doc.aggregate(pipeline(stage, rest, n), projection_model=ExecutionRow).to_list())
    return out


def _first(each: list[list[ExecutionRow]], n: int) -> list[ExecutionRow]:
    return sorted((r for rows in each for r in rows), key=lambda r: r.id)[:n]
