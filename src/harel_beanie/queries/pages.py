"""The filtered, keyset-paged listing of executions (the dashboard's executions page) and
the counts per status beside it.

Why this module exists: a listing is fed from a request's parameters, so the filter is a
value object that checks every field when it is built (`ExecutionFilter`: a bad filter
cannot exist), and a page is a range of one index whatever is filtered, read after the id
the previous page ended on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

from beanie import SortDirection
from beanie.odm.queries.find import FindMany
from pymongo.errors import PyMongoError

from harel_beanie.core.arguments import BadArgumentType, optional_str, require_bool, require_int, require_time
from harel_beanie.core.counting import LEAVING
from harel_beanie.core.documents import ExecutionDocument, index_models
from harel_beanie.core.keys import prefix_range
from harel_beanie.core.time_order import NOTHING, TIME_SORT, after_time_cursor, is_timed, time_cursor
from harel_beanie.queries import parts, timed
from harel_beanie.queries.counts import execution_counts
from harel_beanie.queries.rows import (
    NOT_A_TOMBSTONE,
    STATUSES,
    ExecutionRow,
    Executions,
    checked_doc,
    fill_from_data,
)
from harel_beanie.queries.server import server_of
from harel_beanie.queries.single import status_name

#: the largest page `executions_page` reads
MAX_LIMIT = 10_000
#: where a filtered count stops (`status_counts`): a count equal to it means at least that many
COUNT_CAP = 10_000


@dataclass(frozen=True)
class ExecutionFilter:
    """What a listing is narrowed to. Every field is optional; together they are ANDed.

    Every field is checked when the filter is built: the ids and the outcome must be str (a
    dict would be a query operator), the status one of harel's (a `Status` or its name),
    `roots_only` a bool, the time bounds finite numbers. A wrong value raises TypeError or
    ValueError naming the field.

    The equality filters each have an index led by that field and followed by `_id`
    (hb_parent, hb_status, hb_definition), so a page in `_id` order is a range of one index
    whatever else is filtered; `outcome` is checked on the documents that range reaches. A time
    bound makes the listing a time search, listed newest first (`core.time_order`) and read
    through hb_status_updated (status, updated_at) from the top of the span down (see
    `_index_for`)."""

    definition_id: Optional[str] = None
    status: Optional[str] = None
    outcome: Optional[str] = None
    parent_id: Optional[str] = None  # the children of this execution
    roots_only: bool = False  # executions with no parent
    updated_after: Optional[float] = None  # epoch seconds, inclusive
    updated_before: Optional[float] = None  # epoch seconds, exclusive
    id_prefix: Optional[str] = None  # ids starting with this, literally (a range on `_id`)

    def __post_init__(self) -> None:
        checked: dict[str, Any] = {
            "definition_id": optional_str("definition_id", self.definition_id),
            "status": None if self.status is None else status_name("status", self.status),
            "outcome": optional_str("outcome", self.outcome),
            "parent_id": optional_str("parent_id", self.parent_id),
            "roots_only": require_bool("roots_only", self.roots_only),
            "updated_after": None if self.updated_after is None else require_time("updated_after", self.updated_after),
            "updated_before": None
            if self.updated_before is None
            else require_time("updated_before", self.updated_before),
            "id_prefix": optional_str("id_prefix", self.id_prefix) or None,
        }
        for name, value in checked.items():  # the checked, plain values replace what was passed
            object.__setattr__(self, name, value)

    def query(self, *, status: bool = True) -> dict[str, Any]:
        """The filter document; `status=False` leaves the status out (for counts per status).
        A filter that a tombstone could match (nothing but roots, or nothing at all) also
        leaves tombstones out."""
        status = require_bool("status", status)
        q: dict[str, Any] = {}
        if self.parent_id is not None:
            q["parent_id"] = self.parent_id
        elif self.roots_only:
            q["parent_id"] = None
        if self.definition_id is not None:
            q["definition_id"] = self.definition_id
        if status and self.status is not None:
            q["status"] = self.status
        if self.outcome is not None:
            q["outcome"] = self.outcome
        span: dict[str, float] = {}
        if self.updated_after is not None:
            span["$gte"] = self.updated_after
        if self.updated_before is not None:
            span["$lt"] = self.updated_before
        if span:
            q["updated_at"] = span
        if self.id_prefix:
            q.update(prefix_range(self.id_prefix))
        # a tombstone holds only `_id` and `tomb`: any equality on a value or a time bound
        # already leaves it out, and the indexes' plans stay as they are
        if q.get("parent_id") is None and not q.keys() & {"definition_id", "status", "outcome", "updated_at"}:
            q.update(NOT_A_TOMBSTONE)
        return q


def _filter(flt: Any) -> ExecutionFilter:
    if not isinstance(flt, ExecutionFilter):
        raise BadArgumentType("flt", "an ExecutionFilter", flt)
    return flt


def _index_for(query: dict[str, Any]) -> str:
    """The index a listing of `query` in `_id` order reads, first that applies:

    - the children of one execution: hb_parent (an execution starts few);
    - a time bound: hb_status_updated, one range of `updated_at` per status (the status
      named, or every status: the server seeks from one to the next), listed newest first.
      No index of its own: every commit moves `updated_at`, so an index led by it would
      cost every commit a second key change for a read only a person's search makes;
    - roots only: hb_parent (`parent_id` null);
    - a status, then a definition: hb_status, hb_definition (each followed by `_id`, so the
      page is a range of the index in its order);
    - nothing, or an id prefix alone: the `_id` index (named too: a server may otherwise
      weigh a plan that reads the whole collection)."""
    if isinstance(query.get("parent_id"), str):
        return "hb_parent"
    if "updated_at" in query:
        return "hb_status_updated"
    for key, name in (("parent_id", "hb_parent"), ("status", "hb_status"), ("definition_id", "hb_definition")):
        if key in query:
            return name
    return "_id_"


def executions(
    flt: ExecutionFilter = ExecutionFilter(),
    *,
    after: Optional[str] = None,
    doc: Executions = ExecutionDocument,
    hint: bool = False,
) -> FindMany[ExecutionRow]:
    """Executions matching `flt` in `_id` order, starting after the id `after` (the keyset
    cursor: the last id of the previous page, so page k reads about one page, never k). A
    time search (a bound on `updated_at`) is newest first instead (`core.time_order.TIME_SORT`),
    and its `after` is a cursor of that order (`Page.next_after`, `core.time_order.time_cursor`).
    Index: by the filter, as `_index_for` chooses (hb_parent, hb_status_updated, hb_status,
    hb_definition, else the `_id` index). `hint` names that index to the server (a planner
    may otherwise weigh several; only on a database whose indexes exist, i.e. not one
    awaiting `migrate up`). `executions_page` and `status_counts` name it only to a server
    on which that makes the read smaller (`harel_beanie.queries.server`)."""
    q = _listing_filter(flt, after)
    doc = checked_doc(doc)
    extra: dict[str, Any] = {"hint": _index_for(q)} if require_bool("hint", hint) else {}
    found = doc.find(q, projection_model=ExecutionRow, **extra)
    if is_timed(q):
        return found.sort([(key, SortDirection(way)) for key, way in TIME_SORT])
    return found.sort([("_id", SortDirection.ASCENDING)])


def _listing_filter(flt: ExecutionFilter, after: Optional[str]) -> dict[str, Any]:
    q = _filter(flt).query()
    cursor = optional_str("after", after)
    if is_timed(q):
        return after_time_cursor(q, cursor)
    if cursor is not None:  # the keyset bound joins the id prefix's range, if any
        q["_id"] = {**q.get("_id", {}), "$gt": cursor}
    return q


async def _rows(
    flt: ExecutionFilter, after: Optional[str], n: int, doc: Executions, indexed: bool
) -> list[ExecutionRow]:
    """The first `n` rows of the listing: one query where the server's `limit` bounds its work
    (naming its index where that helps), else parts each bounded by an index range
    (`harel_beanie.queries.parts`; only where the indexes exist: without them each part
    would scan the collection)."""
    server = await server_of(doc.get_pymongo_collection())
    if server.limit_bounds_work or not indexed:
        return await executions(flt, after=after, doc=doc, hint=indexed and server.hints_help).limit(n).to_list()
    query = _listing_filter(flt, after)
    if is_timed(query):
        return [] if query.get("_id") == NOTHING["_id"] else await timed.page_rows(doc, query, n)
    return await parts.page_rows(doc, query, n)


#: how long a look at whether the store's indexes exist is trusted (`hint=None`)
READY_TTL = 30.0
_READY: dict[tuple[int, str], tuple[float, bool]] = {}


async def _indexed(doc: Executions, hint: Optional[bool]) -> bool:
    """Whether the reads may rely on the store's indexes: `hint` when the caller knows
    (the dashboard surveys its database), else whether every index the store declares is
    there, looked at once every `READY_TTL` seconds (a database awaiting `migrate up` lacks
    them, and a read through a missing index is an error on the server)."""
    if hint is not None:
        return require_bool("hint", hint)
    coll = doc.get_pymongo_collection()
    key = (id(coll.database.client), coll.full_name)
    seen = _READY.get(key)
    if seen is not None and time.monotonic() - seen[0] < READY_TTL:
        return seen[1]
    try:
        present = {ix["name"] async for ix in await coll.list_indexes()}
    except PyMongoError:  # not known: read as on a database without them (slower, never wrong)
        return False
    ready = all(ix.document["name"] in present for ix in index_models(doc))
    _READY[key] = (time.monotonic(), ready)
    return ready


@dataclass
class Page:
    """One page of rows and the cursor of the next (None on the last page): the last row's
    id, or in a time search its (updated_at, id) as `core.time_order.time_cursor` writes it."""

    rows: list[ExecutionRow]
    next_after: Optional[str]


async def executions_page(
    flt: ExecutionFilter = ExecutionFilter(),
    *,
    after: Optional[str] = None,
    limit: int = 50,
    doc: Executions = ExecutionDocument,
    hint: Optional[bool] = None,
) -> Page:
    """A page of `executions(...)`: fetches one row more than `limit` to know if there is a next.
    `hint`: the store's indexes all exist, so the reads may rely on them (see `_rows`);
    None (the default): looked at on the server (`_indexed`).
    Rows of documents harel's own store wrote (no summary fields until migrated) have them
    read from their snapshots, in one more read of those documents only."""
    limit = require_int("limit", limit, low=1, high=MAX_LIMIT)
    doc = checked_doc(doc)
    rows = await _rows(_filter(flt), after, limit + 1, doc, await _indexed(doc, hint))
    more = len(rows) > limit
    rows = rows[:limit]
    legacy = [r.id for r in rows if r.status is None]
    if legacy:
        coll = checked_doc(doc).get_pymongo_collection()
        data = {d["_id"]: d.get("data") async for d in coll.find({"_id": {"$in": legacy}}, {"data": 1})}
        rows = [fill_from_data(r, data.get(r.id)) for r in rows]
    if not more:
        return Page(rows, None)
    last = rows[-1]
    if is_timed(_filter(flt).query()) and last.updated_at is not None:
        return Page(rows, time_cursor(last.updated_at, last.id))
    return Page(rows, last.id)


async def status_counts(
    flt: ExecutionFilter = ExecutionFilter(), *, doc: Executions = ExecutionDocument, hint: Optional[bool] = None
) -> dict[str, int]:
    """How many executions match `flt` in each status (the filter's own status ignored, so a
    page can show what choosing another status would give).

    With no filter or a definition alone, the counts are the counters the store keeps up to
    date (`queries.counts`): exact, and read in a few commands whatever the collection holds.
    Any other filter (a parent, roots only, an outcome, a time range, an id prefix) is counted
    per status over a range of one index (hb_parent with a parent filter, hb_status_updated
    with a time bound, else hb_status), each count stopping at `COUNT_CAP`: a count equal to
    the cap means at least that many. A time range on a server whose `limit` bounds nothing
    is counted from the top of the span down and stops at `timed.SPAN_COUNT_CAP` (every
    document counted there is read). `hint` as for `executions_page`."""
    flt = _filter(flt)
    doc = checked_doc(doc)
    server = await server_of(doc.get_pymongo_collection())
    indexed = await _indexed(doc, hint)
    named = indexed and server.hints_help
    in_parts = indexed and not server.limit_bounds_work  # each count a range of one index
    if _counted_by_counters(flt):
        counted = await execution_counts(doc=doc)
        if counted is not None:
            per = counted.per.get(flt.definition_id, {}) if flt.definition_id is not None else counted.totals()
            return {s: per[s] for s in STATUSES if per.get(s)}
    base = flt.query(status=False)
    base.pop("tomb", None)  # every count below has a status: no tombstone has one
    base[LEAVING] = {"$ne": True}  # one prune has begun removing is no longer counted
    coll = doc.get_pymongo_collection()
    out: dict[str, int] = {}
    for s in STATUSES:  # sequential: the counts are cheap, and a burst of them helps nobody
        q = {**base, "status": s}
        if in_parts and is_timed(q):
            n = await timed.count(doc, q, timed.SPAN_COUNT_CAP)
        elif in_parts:
            n = await parts.count(doc, q, COUNT_CAP)
        else:
            extra: dict[str, Any] = {"hint": _index_for(q)} if named else {}
            n = await coll.count_documents(q, limit=COUNT_CAP, **extra)
        if n:
            out[s] = n
    return out


def _counted_by_counters(flt: ExecutionFilter) -> bool:
    """Whether the counters answer `flt`'s counts: nothing filtered but the definition."""
    narrowed = (flt.outcome, flt.parent_id, flt.updated_after, flt.updated_before, flt.id_prefix)
    return all(v is None for v in narrowed) and not flt.roots_only
