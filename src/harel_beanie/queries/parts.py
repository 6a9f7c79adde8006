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

from typing import Any

from harel_beanie.queries.rows import STATUSES


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
