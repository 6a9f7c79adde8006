"""What the typed queries return, and the one check of the document class they read.

Why this module exists: every query of `harel_beanie.queries` projects to one of these row
models (never `data` unless the row needs it) and takes the executions class to read as
`doc=`; both are declared once here for the listing, the single-purpose queries and the
backlog.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from pydantic import BaseModel, Field

from harel_beanie.core.documents import ExecutionDocument, SummaryView, executions_class

Executions = type[ExecutionDocument]

#: harel's statuses, in the order a person reads a lifecycle
STATUSES = ("PENDING", "RUNNING", "SUSPENDED", "CANCELLING", "DONE", "FAILED", "CANCELLED")

#: What a query adds to a filter that could otherwise meet a purged execution's tombstone
#: (a document holding only `_id` and `tomb`): tombstones are not executions, and no view
#: lists them as such.
NOT_A_TOMBSTONE: dict[str, Any] = {"tomb": {"$exists": False}}


class ExecutionRow(SummaryView):
    """One execution as a dashboard row: the promoted fields only, never `data` (a
    `list_executions` row and the time of the last update)."""

    updated_at: Optional[float] = None


class TimerRow(BaseModel):
    id: str = Field(alias="_id")
    definition_id: str
    next_fire: Optional[float] = None
    timers: dict[str, float] = {}


class StuckRow(ExecutionRow):
    """A candidate of the stuck list: its row and what decides whether it is stuck or only
    waiting (`harel_beanie.core.stuck.is_stuck`)."""

    next_fire: Optional[float] = None
    timers: dict[str, float] = {}
    pending: Optional[bool] = None
    quiet: Optional[float] = None


class ExecutionDetail(ExecutionRow):
    """One execution as its page shows it: its row, the snapshot and its pending work (the
    entries as stored, whichever store wrote them). Leaves out the dedupe window and the
    trace ring (the trace is read with the store's `read_trace`)."""

    created_at: Optional[float] = None
    data: str
    outbox: list[dict[str, Any]] = []
    spawns: list[dict[str, Any]] = []
    timers: dict[str, float] = {}
    next_fire: Optional[float] = None
    trace_n: int = 0


#: The summary fields a document written by harel's own MongoStore lacks until it is written
#: again or migrated; the rows read them from the snapshot instead.
SUMMARY_FROM_DATA = ("status", "outcome", "active_path", "parent_id", "finished_at", "created_at", "updated_at")


def fill_from_data(row: ExecutionRow, data: Optional[str]) -> ExecutionRow:
    """`row` with the summary fields it lacks read from the snapshot `data` (a document harel's
    store wrote carries none of them); `row` itself when it has them or `data` is unreadable."""
    if row.status is not None or not data:
        return row
    try:
        snapshot = json.loads(data)
    except ValueError:
        return row
    if not isinstance(snapshot, dict):
        return row
    found = {k: snapshot.get(k) for k in SUMMARY_FROM_DATA if k in type(row).model_fields}
    return row.model_copy(update={k: v for k, v in found.items() if v is not None})


def checked_doc(doc: Any) -> Executions:
    """`doc` if it is the executions class of some prefix (`ExecutionDocument` or
    `bind(prefix)[0]`); anything else, another Document class included, is refused."""
    return executions_class("doc", doc)
