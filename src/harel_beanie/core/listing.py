"""`list_executions` as an index-backed keyset query, with no I/O.

harel's MongoStore parses every document's `data` to filter status and parent, and pages
with `skip` (so page k reads k pages). Here status and parent_id are promoted fields with
indexes, every filter runs on the server, and the cursor is the last id of the previous page:
the next page starts right after it on the index, in the stable id order the contract asks
for, and reads about one page of documents whatever page it is.

In compatibility mode (a database harel's store wrote, not yet migrated) a document may lack
the promoted fields; the query then also admits documents with no `status`, fetches their
`data`, and the client applies the filters to them (harel's `matches`).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from harel.engine.execution import ExecutionPage, ExecutionSummary, Status
from harel.engine.store.base import matches

from harel_beanie.core import records
from harel_beanie.core.arguments import (
    BadArgument,
    BadArgumentType,
    require_bool,
    require_choice,
    require_int,
    require_str,
)
from harel_beanie.core.documents import LegacySummaryView, SummaryView, projection


def encode_cursor(last_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"after": last_id}).encode()).decode()


def decode_cursor(cursor: Optional[str]) -> Optional[str]:
    """The id a page starts after; None for the first page. A cursor this store did not
    hand out is refused rather than silently restarting the listing."""
    if cursor is None or cursor == "":
        return None
    cursor = require_str("cursor", cursor)
    try:
        after = json.loads(base64.urlsafe_b64decode(cursor.encode()))["after"]
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise BadArgument("cursor", f"is not a list_executions cursor: {cursor[:200]!r}") from None
    if not isinstance(after, str):
        raise BadArgument("cursor", f"is not a list_executions cursor: {cursor[:200]!r}")
    return require_str("cursor", after)


_STATUS_NAMES = tuple(s.value for s in Status)


def _statuses(status: Any) -> Iterable[Status]:
    """harel's statuses from `status`: an iterable of `Status` members or their names (a
    single name is a str, whose letters are not statuses: refused)."""
    if isinstance(status, (str, bytes)) or not isinstance(status, Iterable) or isinstance(status, Mapping):
        raise BadArgumentType("status", "an iterable of harel Status values", status)
    for s in status:
        yield s if isinstance(s, Status) else Status(require_choice("status", s, _STATUS_NAMES))


@dataclass
class ListingQuery:
    filter: dict[str, Any]
    projection: dict[str, Any]
    limit: int  # documents to fetch: one more than the page, to know if there is a next
    page: int
    status: Optional[set[Status]]
    definition_id: Optional[str]
    roots_only: bool
    compat: bool


def listing_query(
    status: Optional[Iterable[Status]],
    definition_id: Optional[str],
    roots_only: bool,
    limit: int,
    cursor: Optional[str],
    *,
    compat: bool,
) -> ListingQuery:
    limit = require_int("limit", limit, low=1, high=2**31 - 1)
    roots_only = require_bool("roots_only", roots_only)
    statuses = None if status is None else set(_statuses(status))
    query: dict[str, Any] = {}
    if definition_id is not None:
        definition_id = query["definition_id"] = require_str("definition_id", definition_id)
    if statuses is not None:
        wanted: list[Any] = sorted(s.value for s in statuses)
        if compat:
            query["status"] = {"$in": wanted + [None]}
        elif len(wanted) == 1:
            query["status"] = wanted[0]  # an equality: some planners scan for `$in` beside a range
        else:
            query["status"] = {"$in": wanted}
    if roots_only and not compat:
        query["parent_id"] = None
    after = decode_cursor(cursor)
    if after is not None:
        query["_id"] = {"$gt": after}
    view = LegacySummaryView if compat else SummaryView
    return ListingQuery(query, projection(view), limit + 1, limit, statuses, definition_id, roots_only, compat)


def listing_page(q: ListingQuery, docs: list[Mapping[str, Any]]) -> ExecutionPage:
    """The page from the documents the query fetched (sorted by `_id`, at most `q.limit`).

    In compatibility mode some fetched documents may not match (their filters ran here),
    and a page may meet purged executions' tombstones, so the page may hold fewer than
    `page` items while there is more: keep paging while `next_cursor` is set, as the
    protocol says."""
    more = len(docs) > q.page
    window = docs[: q.page]
    items: list[ExecutionSummary] = []
    for doc in window:
        if "definition_id" not in doc:
            # a purged execution's tombstone (only unfiltered and roots-only pages can meet
            # one): skipped here, not in the filter, which would cost some planners the index
            continue
        row = records.summary(doc)
        if not q.compat or matches(row, q.status, q.definition_id, q.roots_only):
            items.append(row)
    nxt = encode_cursor(window[-1]["_id"]) if more and window else None
    return ExecutionPage(items=items, next_cursor=nxt)
