"""Typed, index-backed queries over the store's documents: the way to build a dashboard.

Each function returns a Beanie query (not yet run) over an executions document class, the
default `ExecutionDocument` or `bind(prefix)[0]`, projected to a small row model and served
by one of the indexes declared in `harel_beanie.core.documents` (the tests check each plan with
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

from harel_beanie.core.documents import PENDING, ExecutionDocument, SummaryView
from harel_beanie.core.keys import ANY_SEQ, ANY_TIME, decode_path, require_int, require_str, require_time
from harel_beanie.core.seqs import minted_at


class ExecutionRow(SummaryView):
    """One execution as a dashboard row: the promoted fields only, never `data` (a
    `list_executions` row and the time of the last update)."""

    updated_at: Optional[float] = None


class TimerRow(BaseModel):
    id: str = Field(alias="_id")
    definition_id: str
    next_fire: Optional[float] = None
    timers: dict[str, float] = {}


Executions = type[ExecutionDocument]

_STATUSES = tuple(s.value for s in Status)


def _doc(doc: Any) -> Executions:
    if not (isinstance(doc, type) and issubclass(doc, ExecutionDocument)):
        raise TypeError(
            f"doc must be ExecutionDocument or a class from bind(prefix), got {type(doc).__name__}: {doc!r}"
        )
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


def failed_since(
    since: float, *, definition_id: Optional[str] = None, doc: Executions = ExecutionDocument
) -> FindMany[ExecutionRow]:
    """Executions that failed at or after `since` (epoch seconds), newest first.
    Index: hb_status_updated (status, updated_at)."""
    doc = _doc(doc)
    query: dict[str, Any] = {"status": "FAILED", "updated_at": {"$gte": require_time("since", since)}}
    if _optional_str("definition_id", definition_id) is not None:
        query["definition_id"] = definition_id
    return doc.find(query, projection_model=ExecutionRow).sort([("updated_at", SortDirection.DESCENDING)])


def stuck_running(
    older_than: float, *, now: Optional[float] = None, doc: Executions = ExecutionDocument
) -> FindMany[ExecutionRow]:
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
    return doc.find({"parent_id": require_str("parent_id", parent_id)}, projection_model=ExecutionRow).sort(
        [("_id", SortDirection.ASCENDING)]
    )


def waiting_on_timer(*, before: Optional[float] = None, doc: Executions = ExecutionDocument) -> FindMany[TimerRow]:
    """Executions with an armed timer (due before `before`, if given), soonest first.
    Index: hb_timer_pending (next_fire, partial: documents with a timer bound)."""
    doc = _doc(doc)
    bound: dict[str, Any] = dict(ANY_TIME)
    if before is not None:
        bound["$lte"] = require_time("before", before, infinite_ok=True)
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
    oldest_spawn_age: Optional[float] = None  # seconds, as for the outbox
    due_timers: int = 0
    next_timers: list[dict[str, Any]] = field(default_factory=list)
    stuck: list[dict[str, Any]] = field(default_factory=list)
    stuck_after: float = 300.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def backlog(
    *, doc: Executions = ExecutionDocument, stuck_after: float = 300.0, now: Optional[float] = None, show: int = 10
) -> Backlog:
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
            {"$match": {**PENDING, f"{array}.seq": ANY_SEQ}},  # through hb_pending
            {"$project": {"n": {"$size": f"${array}"}, "low": {"$min": {"$map": {"input": f"${array}", "in": "$$this.seq"}}}}},
            {"$group": {"_id": None, "n": {"$sum": "$n"}, "low": {"$min": "$low"}}},
        ])).to_list(None)  # fmt: skip
        if rows:
            setattr(out, attr, rows[0]["n"])
            if rows[0]["n"]:
                born = minted_at(rows[0]["low"])
                age = None if born is None else max(0.0, now - born)
                setattr(out, "oldest_outbox_age" if array == "outbox" else "oldest_spawn_age", age)
    out.due_timers = await doc.find({"next_fire": {**ANY_TIME, "$lte": now}}).count()
    # the bound may be stale (a cancelled timer): report the real timers
    # show=0 lists none (a limit of 0 would mean no limit at all)
    for row in await waiting_on_timer(doc=doc).limit(show).to_list() if show else ():
        for key, at in sorted(row.timers.items(), key=lambda kv: kv[1]):
            out.next_timers.append(
                {"id": row.id, "definition_id": row.definition_id, "path": decode_path(key), "fire_at": at}
            )
    out.next_timers = sorted(out.next_timers, key=lambda t: t["fire_at"])[:show]
    stuck = await stuck_running(stuck_after, now=now, doc=doc).limit(show).to_list() if show else []
    out.stuck = [
        {
            "id": r.id,
            "definition_id": r.definition_id,
            "active_path": r.active_path,
            "silent_for": now - (r.updated_at or now),
        }
        for r in stuck
    ]
    return out


# --- filtered, keyset-paged listing (the dashboard's executions page) ----------------------

#: harel's statuses, in the order a person reads a lifecycle
STATUSES = ("PENDING", "RUNNING", "SUSPENDED", "CANCELLING", "DONE", "FAILED", "CANCELLED")


@dataclass(frozen=True)
class ExecutionFilter:
    """What a listing is narrowed to. Every field is optional; together they are ANDed.

    The equality filters each have an index led by that field and followed by `_id`
    (hb_parent, hb_status, hb_definition), so a page in `_id` order is a range of one index
    whatever else is filtered; `outcome` and the time bounds are checked on the documents that
    range reaches."""

    definition_id: Optional[str] = None
    status: Optional[str] = None
    outcome: Optional[str] = None
    parent_id: Optional[str] = None  # the children of this execution
    roots_only: bool = False  # executions with no parent
    updated_after: Optional[float] = None  # epoch seconds, inclusive
    updated_before: Optional[float] = None  # epoch seconds, exclusive

    def query(self, *, status: bool = True) -> dict[str, Any]:
        """The filter document; `status=False` leaves the status out (for counts per status)."""
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
        return q


def index_for(query: dict[str, Any]) -> Optional[str]:
    """The index whose leading equality serves `query` in `_id` order (parent, then status,
    then definition: the most selective first, as a rule), or None for the `_id` index."""
    for key, name in (("parent_id", "hb_parent"), ("status", "hb_status"), ("definition_id", "hb_definition")):
        if key in query:
            return name
    return None


def executions(
    flt: ExecutionFilter = ExecutionFilter(),
    *,
    after: Optional[str] = None,
    doc: Executions = ExecutionDocument,
    hint: bool = False,
) -> FindMany[ExecutionRow]:
    """Executions matching `flt` in `_id` order, starting after the id `after` (the keyset
    cursor: the last id of the previous page, so page k reads about one page, never k).
    Index: hb_parent, hb_status or hb_definition by the filter; with none, the `_id` index.
    `hint` names that index to the server (a planner may otherwise weigh several; only on
    a database whose indexes exist, i.e. not one awaiting `migrate up`)."""
    q = flt.query()
    if after is not None:
        q["_id"] = {"$gt": after}
    index = index_for(q) if hint else None
    extra: dict[str, Any] = {"hint": index} if index else {}
    return doc.find(q, projection_model=ExecutionRow, **extra).sort([("_id", SortDirection.ASCENDING)])


@dataclass
class Page:
    """One page of rows and the cursor of the next (None on the last page)."""

    rows: list[ExecutionRow]
    next_after: Optional[str]


async def executions_page(
    flt: ExecutionFilter = ExecutionFilter(),
    *,
    after: Optional[str] = None,
    limit: int = 50,
    doc: Executions = ExecutionDocument,
    hint: bool = False,
) -> Page:
    """A page of `executions(...)`: fetches one row more than `limit` to know if there is a next."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    rows = await executions(flt, after=after, doc=doc, hint=hint).limit(limit + 1).to_list()
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, rows[-1].id if more else None)


async def status_counts(
    flt: ExecutionFilter = ExecutionFilter(), *, doc: Executions = ExecutionDocument, hint: bool = False
) -> dict[str, int]:
    """How many executions match `flt` in each status (the filter's own status ignored, so a
    page can show what choosing another status would give). One count per status, each a
    range of one index (hb_parent with a parent filter, else hb_status; with only a status,
    mongod counts the index keys without a fetch). `hint` as for `executions`."""
    base = flt.query(status=False)
    out: dict[str, int] = {}
    for s in STATUSES:  # sequential: the counts are cheap, and a burst of them helps nobody
        q = {**base, "status": s}
        index = index_for(q) if hint else None
        n = await (doc.find(q, hint=index) if index else doc.find(q)).count()
        if n:
            out[s] = n
    return out


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


async def execution_detail(execution_id: str, *, doc: Executions = ExecutionDocument) -> Optional[ExecutionDetail]:
    """One execution by `_id` (a point read), projected to `ExecutionDetail`."""
    return await doc.find_one({"_id": execution_id}, projection_model=ExecutionDetail)
