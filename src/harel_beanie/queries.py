"""Typed, index-backed queries over the store's documents: the way to build a dashboard.

Each function returns a Beanie query (not yet run) over an executions document class, the
default `ExecutionDocument` or `bind(prefix)[0]`, projected to a small row model and served
by one of the indexes declared in `harel_beanie.documents` (the tests check each plan with
explain). Run it with `await q.to_list()`, refine it with `.limit(n)`, or page it.

    failed = await failed_since(time.time() - 3600, definition_id="order").to_list()
    kids = await children_of(parent_id).to_list()

`backlog()` gathers what `harel-beanie status` shows: executions by definition and status,
the pending outbox and its oldest entry, pending spawns, due and next timers, and executions
running but silent for longer than a threshold.

These need Beanie initialised on the store's database: the async store does it on set-up,
or pass the classes to your own `init_beanie`.

Every argument is checked before a query is built: a value of the wrong type (a dict, a
list, a bool where a number goes, a NaN) raises TypeError or ValueError naming the argument,
so a value taken from a request can never reach the filter as a query operator
(`{"$ne": None}` as a parent id would list every child of every execution).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from beanie import SortDirection
from beanie.odm.queries.find import FindMany
from harel.engine.execution import Status
from pydantic import BaseModel, Field

from harel_beanie.documents import ExecutionDocument
from harel_beanie.keys import ANY_SEQ, decode_path, require_int, require_str, require_time
from harel_beanie.seqs import minted_at


class ExecutionRow(BaseModel):
    """One execution as a dashboard row: the promoted fields only, never `data`."""

    id: str = Field(alias="_id")
    definition_id: str
    status: Optional[str] = None
    outcome: Optional[str] = None
    active_path: Optional[str] = None
    parent_id: Optional[str] = None
    updated_at: Optional[float] = None
    finished_at: Optional[float] = None
    version: int = 0


class TimerRow(BaseModel):
    id: str = Field(alias="_id")
    definition_id: str
    next_fire: Optional[float] = None
    timers: dict[str, float] = {}


Executions = type[ExecutionDocument]

_STATUSES = tuple(s.value for s in Status)


def _doc(doc: Any) -> Executions:
    if not (isinstance(doc, type) and issubclass(doc, ExecutionDocument)):
        raise TypeError(f"doc must be ExecutionDocument or a class from bind(prefix), got {type(doc).__name__}: {doc!r}")
    return doc


def _optional_str(what: str, value: Any) -> Optional[str]:
    return None if value is None else require_str(what, value)


def _seconds(what: str, value: Any) -> float:
    """A finite, non-negative duration in seconds."""
    seconds = require_time(what, value)
    if seconds < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return seconds


def _status(value: Any) -> str:
    if isinstance(value, Status):
        return value.value
    status = require_str("status", value)
    if status not in _STATUSES:
        raise ValueError(f"status must be one of {', '.join(_STATUSES)}, got {value!r}")
    return status


def failed_since(since: float, *, definition_id: Optional[str] = None, doc: Executions = ExecutionDocument) -> FindMany[ExecutionRow]:
    """Executions that failed at or after `since` (epoch seconds), newest first.
    Index: hb_status_updated (status, updated_at)."""
    doc = _doc(doc)
    query: dict[str, Any] = {"status": "FAILED", "updated_at": {"$gte": require_time("since", since)}}
    if _optional_str("definition_id", definition_id) is not None:
        query["definition_id"] = definition_id
    return doc.find(query, projection_model=ExecutionRow).sort([("updated_at", SortDirection.DESCENDING)])


def stuck_running(older_than: float, *, now: Optional[float] = None, doc: Executions = ExecutionDocument) -> FindMany[ExecutionRow]:
    """RUNNING executions not updated for more than `older_than` seconds, most silent first.
    Index: hb_status_updated (status, updated_at)."""
    doc = _doc(doc)
    cutoff = (time.time() if now is None else require_time("now", now)) - _seconds("older_than", older_than)
    query = {"status": "RUNNING", "updated_at": {"$lt": cutoff}}
    return doc.find(query, projection_model=ExecutionRow).sort([("updated_at", SortDirection.ASCENDING)])


def children_of(parent_id: str, *, doc: Executions = ExecutionDocument) -> FindMany[ExecutionRow]:
    """The child executions (orthogonal regions, invoked submachines) of one execution.
    Index: hb_parent (parent_id, _id)."""
    doc = _doc(doc)
    return doc.find({"parent_id": require_str("parent_id", parent_id)}, projection_model=ExecutionRow).sort([("_id", SortDirection.ASCENDING)])


def waiting_on_timer(*, before: Optional[float] = None, doc: Executions = ExecutionDocument) -> FindMany[TimerRow]:
    """Executions with an armed timer (due before `before`, if given), soonest first.
    Index: hb_next_fire (next_fire)."""
    doc = _doc(doc)
    bound: dict[str, Any] = {"$gte": float("-inf")}
    if before is not None:
        bound = {"$lte": require_time("before", before, infinite_ok=True)}
    return doc.find({"next_fire": bound}, projection_model=TimerRow).sort([("next_fire", SortDirection.ASCENDING)])


def by_status(status: str | Status, *, doc: Executions = ExecutionDocument) -> FindMany[ExecutionRow]:
    """Executions in one status (a harel `Status` or its name), by id.
    Index: hb_status (status, _id)."""
    doc = _doc(doc)
    return doc.find({"status": _status(status)}, projection_model=ExecutionRow).sort([("_id", SortDirection.ASCENDING)])


@dataclass
class Backlog:
    """What is pending and what is stuck, at one moment."""

    now: float
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # definition -> status -> n
    pending_outbox: int = 0
    oldest_outbox_age: Optional[float] = None  # seconds; None if none pending or unknown
    pending_spawns: int = 0
    due_timers: int = 0
    next_timers: list[dict[str, Any]] = field(default_factory=list)
    stuck: list[dict[str, Any]] = field(default_factory=list)
    stuck_after: float = 300.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)




async def backlog(*, doc: Executions = ExecutionDocument, stuck_after: float = 300.0, now: Optional[float] = None, show: int = 10) -> Backlog:
    """Everything `harel-beanie status` reports. The counts group the whole collection
    (one pass over the (status, _id) index keys on mongod); every other figure reads only the
    documents that hold pending work, through their indexes."""
    doc = _doc(doc)
    stuck_after = _seconds("stuck_after", stuck_after)
    now = time.time() if now is None else require_time("now", now)
    if require_int("show", show) < 0:
        raise ValueError(f"show must not be negative, got {show!r}")
    out = Backlog(now=now, stuck_after=stuck_after)
    coll = doc.get_pymongo_collection()
    groups = await (await coll.aggregate([
        {"$group": {"_id": {"d": "$definition_id", "s": {"$ifNull": ["$status", "UNKNOWN"]}}, "n": {"$sum": 1}}},
    ])).to_list(None)  # fmt: skip
    for g in groups:
        out.counts.setdefault(g["_id"]["d"], {})[g["_id"]["s"]] = g["n"]
    for array, attr in (("outbox", "pending_outbox"), ("spawns", "pending_spawns")):
        rows = await (await coll.aggregate([
            {"$match": {f"{array}.seq": ANY_SEQ}},
            {"$project": {"n": {"$size": f"${array}"}, "low": {"$min": {"$map": {"input": f"${array}", "in": "$$this.seq"}}}}},
            {"$group": {"_id": None, "n": {"$sum": "$n"}, "low": {"$min": "$low"}}},
        ])).to_list(None)  # fmt: skip
        if rows:
            setattr(out, attr, rows[0]["n"])
            if array == "outbox" and rows[0]["n"]:
                born = minted_at(rows[0]["low"])
                out.oldest_outbox_age = None if born is None else max(0.0, now - born)
    out.due_timers = await doc.find({"next_fire": {"$lte": now}}).count()
    # the bound may be stale (a cancelled timer): report the real timers
    # show=0 lists none (a limit of 0 would mean no limit at all)
    for row in await waiting_on_timer(doc=doc).limit(show).to_list() if show else ():
        for key, at in sorted(row.timers.items(), key=lambda kv: kv[1]):
            out.next_timers.append({"id": row.id, "definition_id": row.definition_id, "path": decode_path(key), "fire_at": at})
    out.next_timers = sorted(out.next_timers, key=lambda t: t["fire_at"])[:show]
    stuck = await stuck_running(stuck_after, now=now, doc=doc).limit(show).to_list() if show else []
    out.stuck = [{"id": r.id, "definition_id": r.definition_id, "active_path": r.active_path, "silent_for": now - (r.updated_at or now)} for r in stuck]
    return out
