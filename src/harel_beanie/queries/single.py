"""The single-purpose queries: failed since a time, silent for too long, the children of one
execution, waiting on a timer, in one status, one execution by id.

Why this module exists: each is one index-backed, projected Beanie query a dashboard or a
script runs as it is (`await q.to_list()`) or refines (`.limit(n)`). Every argument passes
`harel_beanie.core.arguments` before the query is built, so a value taken from a request
never reaches the filter as anything but a literal.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from beanie import SortDirection
from beanie.odm.queries.find import FindMany
from harel.engine.execution import Status

from harel_beanie.core.arguments import optional_str, require_choice, require_seconds, require_str, require_time
from harel_beanie.core.documents import ExecutionDocument, Tombstone, projection
from harel_beanie.core.keys import ANY_TIME
from harel_beanie.queries.rows import (
    STATUSES,
    ExecutionDetail,
    ExecutionRow,
    Executions,
    TimerRow,
    checked_doc,
    fill_from_data,
)


def status_name(what: str, value: Any) -> str:
    """A harel `Status` or its name, as the name."""
    if isinstance(value, Status):
        return value.value
    return require_choice(what, value, STATUSES)


def failed_since(
    since: float, *, definition_id: Optional[str] = None, doc: Executions = ExecutionDocument
) -> FindMany[ExecutionRow]:
    """Executions that failed at or after `since` (epoch seconds), newest first.
    Index: hb_status_updated (status, updated_at)."""
    doc = checked_doc(doc)
    query: dict[str, Any] = {"status": "FAILED", "updated_at": {"$gte": require_time("since", since)}}
    definition = optional_str("definition_id", definition_id)
    if definition is not None:
        query["definition_id"] = definition
    return doc.find(query, projection_model=ExecutionRow).sort([("updated_at", SortDirection.DESCENDING)])


def stuck_running(
    older_than: float, *, now: Optional[float] = None, doc: Executions = ExecutionDocument
) -> FindMany[ExecutionRow]:
    """RUNNING executions not updated for more than `older_than` seconds, most silent first,
    those waiting on a timer or on pending work included: the stuck ones are `stuck()`
    (`harel_beanie.queries.stuck`), which the views list. Index: hb_status_updated (status,
    updated_at); on a server whose `limit` bounds nothing it reads every match."""
    doc = checked_doc(doc)
    query = stuck_filter(older_than, now=now)
    return doc.find(query, projection_model=ExecutionRow).sort([("updated_at", SortDirection.ASCENDING)])


def stuck_filter(older_than: float, *, now: Optional[float] = None) -> dict[str, Any]:
    """The filter of `stuck_running`."""
    cutoff = (time.time() if now is None else require_time("now", now)) - require_seconds("older_than", older_than)
    return {"status": "RUNNING", "updated_at": {"$lt": cutoff}}


def children_of(parent_id: str, *, doc: Executions = ExecutionDocument) -> FindMany[ExecutionRow]:
    """The child executions (orthogonal regions, invoked submachines) of one execution.
    Index: hb_parent (parent_id, _id)."""
    doc = checked_doc(doc)
    return doc.find({"parent_id": require_str("parent_id", parent_id)}, projection_model=ExecutionRow).sort(
        [("_id", SortDirection.ASCENDING)]
    )


def waiting_on_timer(*, before: Optional[float] = None, doc: Executions = ExecutionDocument) -> FindMany[TimerRow]:
    """Executions with an armed timer (due before `before`, if given), soonest first.
    Index: hb_timer_pending (next_fire, partial: documents with a timer bound)."""
    doc = checked_doc(doc)
    bound: dict[str, Any] = dict(ANY_TIME)
    if before is not None:
        bound["$lte"] = require_time("before", before, infinite_ok=True)
    return doc.find({"next_fire": bound}, projection_model=TimerRow).sort([("next_fire", SortDirection.ASCENDING)])


def by_status(status: str | Status, *, doc: Executions = ExecutionDocument) -> FindMany[ExecutionRow]:
    """Executions in one status (a harel `Status` or its name), by id.
    Index: hb_status (status, _id)."""
    doc = checked_doc(doc)
    return doc.find({"status": status_name("status", status)}, projection_model=ExecutionRow).sort(
        [("_id", SortDirection.ASCENDING)]
    )


async def execution_detail(execution_id: str, *, doc: Executions = ExecutionDocument) -> Optional[ExecutionDetail]:
    """One execution by `_id` (a point read), projected to `ExecutionDetail`; None when there is
    none or it was purged (see `purged`). A document harel's own store wrote (no summary
    fields yet) has them read from its snapshot."""
    doc = checked_doc(doc)
    fields = {**projection(ExecutionDetail), "tomb": 1}  # a point read by `_id` alone
    raw = await doc.get_pymongo_collection().find_one({"_id": require_str("execution_id", execution_id)}, fields)
    if raw is None or "tomb" in raw:  # a purged execution's tombstone is not an execution
        return None
    found = ExecutionDetail.model_validate(raw)
    filled = fill_from_data(found, found.data)
    assert isinstance(filled, ExecutionDetail)
    return filled


async def purged(execution_id: str, *, doc: Executions = ExecutionDocument) -> Optional[Tombstone]:
    """The tombstone a purge left under `execution_id` (when it was purged), or None if that id
    holds no tombstone. A point read by `_id`."""
    doc = checked_doc(doc)
    raw = await doc.get_pymongo_collection().find_one(
        {"_id": require_str("execution_id", execution_id), "tomb": {"$exists": True}}, {"tomb": 1}
    )
    return None if raw is None else Tombstone.model_validate(raw["tomb"])
