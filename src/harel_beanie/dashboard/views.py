"""What each dashboard page shows, as data: one function per view, each returning a pydantic
model that is both the JSON endpoint's declared response model and the template's input.

Why this module exists: the HTML pages and the JSON endpoints must show the same thing, so
the reading is done once here, over `harel_beanie.queries` (index-backed, projected,
keyset-paged) and the store's own `read_trace`; the routes only choose a rendering.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from typing import Any, Mapping, Optional

from pydantic import BaseModel

from harel_beanie import queries
from harel_beanie.core.documents import ExecutionDocument
from harel_beanie.core.keys import decode_path
from harel_beanie.core.seqs import age_of
from harel_beanie.dashboard import statechart
from harel_beanie.dashboard.acting import FINISHED
from harel_beanie.queries.samples import sampled_backlog
from harel_beanie.queries.stuck import stuck

Doc = type[ExecutionDocument]


class ExecutionOut(queries.ExecutionRow):
    """A row as the pages and the JSON show it: its key is `id` (the row's `_id`)."""

    id: str

    @classmethod
    def of(cls, row: queries.ExecutionRow) -> "ExecutionOut":
        return cls(**row.model_dump(by_alias=False, include=set(cls.model_fields)))


class FilterOut(BaseModel):
    definition_id: Optional[str] = None
    status: Optional[str] = None
    outcome: Optional[str] = None
    parent_id: Optional[str] = None
    roots_only: bool = False
    updated_after: Optional[float] = None
    updated_before: Optional[float] = None
    id_prefix: Optional[str] = None


class ExecutionsView(BaseModel):
    """A page of executions matching a filter, and how many match it in each status."""

    filter: FilterOut
    counts: dict[str, int]
    total: int
    rows: list[ExecutionOut]
    after: Optional[str] = None  # the cursor this page started after
    next_after: Optional[str] = None  # pass as `after` for the next page; None on the last
    definitions: list[str]
    #: the partitions the counts leave out, their counters not built yet (core.counting); empty: none
    uncounted: list[int] = []
    partitions: int = 0


class OutboxOut(BaseModel):
    seq: int
    target_id: Optional[str] = None
    event_kind: Optional[str] = None
    age: Optional[float] = None  # seconds since the entry was written


class SpawnOut(BaseModel):
    seq: int
    child_id: str
    root_path: str
    age: Optional[float] = None


class TimerOut(BaseModel):
    path: str
    fire_at: float
    late_by: Optional[float] = None  # seconds past due; None if not due yet


class StepOut(BaseModel):
    """One trace step: what moved the execution from where to where, and when."""

    index: int
    at: Optional[float] = None
    event_kind: Optional[str] = None
    event_data: Any = None
    from_path: Optional[str] = None
    to_path: Optional[str] = None
    actions: list[str] = []
    assigned: Any = None


class DiagramOut(BaseModel):
    """The execution drawn on its statechart: the Mermaid source when its definition is known
    to the dashboard, and always the states as text (every path of the definition, or, for a
    definition the dashboard cannot load, the paths the execution is known to have been in)."""

    definition_known: bool
    source: Optional[str] = None
    paths: list[str] = []
    active: list[str] = []  # active paths: the execution's own and its regions'
    visited: list[str] = []
    last_from: Optional[str] = None
    last_to: Optional[str] = None
    children_by_state: dict[str, list[str]] = {}  # state path -> the child executions started there


class ExecutionView(BaseModel):
    """One execution: its state and context, children, pending work, timers and timeline."""

    now: float
    execution: ExecutionOut
    created_at: Optional[float] = None
    context: Any = None
    error: Any = None
    children: list[ExecutionOut]
    more_children: bool = False
    outbox: list[OutboxOut]
    spawns: list[SpawnOut]
    timers: list[TimerOut]
    timeline: list[StepOut]
    steps_written: int  # trace steps ever written; the timeline keeps the most recent
    actions: list[str] = []  # the actions this dashboard offers on it, as it is now
    unavailable: dict[str, str] = {}  # an action turned on but not offered here -> why not
    diagram: Optional[DiagramOut] = None


class SilentOut(BaseModel):
    id: str
    definition_id: str
    active_path: Optional[str] = None
    silent_for: float
    overdue_for: Optional[float] = None  # how long its earliest timer has been due (core.stuck)


class FailedView(BaseModel):
    """The failed queue (a page, by id) and the RUNNING executions silent for too long."""

    now: float
    failed: list[ExecutionOut]
    failed_total: int
    after: Optional[str] = None
    next_after: Optional[str] = None
    silent: list[SilentOut]
    stuck_after: float


class NextTimerOut(BaseModel):
    id: str
    definition_id: str
    path: str
    fire_at: float
    late_by: Optional[float] = None


class BacklogView(BaseModel):
    """Pending work across the store: what `harel-beanie status` shows."""

    now: float
    counts: dict[str, dict[str, int]]
    totals: dict[str, int]
    pending_outbox: int
    oldest_outbox_age: Optional[float] = None
    pending_spawns: int
    oldest_spawn_age: Optional[float] = None
    #: the executions holding the oldest pending entries, read now even from a sample (queries.oldest)
    oldest_outbox: list[queries.PendingHolder] = []
    oldest_spawns: list[queries.PendingHolder] = []
    due_timers: int
    next_timers: list[NextTimerOut]
    silent: list[SilentOut]
    stuck_after: float
    #: when the pending entries were counted (the newest per-minute sample's time, or `now`)
    entries_at: Optional[float] = None
    uncounted: list[int] = []  # as in `ExecutionsView`


async def executions_view(
    flt: queries.ExecutionFilter, *, after: Optional[str], limit: int, doc: Doc, hint: bool = False
) -> ExecutionsView:
    page = await queries.executions_page(flt, after=after, limit=limit, doc=doc, hint=hint)
    counts = await queries.status_counts(flt, doc=doc, hint=hint)
    definitions = await queries.definition_ids(doc=doc)
    total = counts.get(flt.status, 0) if flt.status else sum(counts.values())
    uncounted, partitions = await queries.unbuilt_partitions(doc=doc)
    return ExecutionsView(
        uncounted=uncounted,
        partitions=partitions,
        filter=FilterOut(**vars(flt)),
        counts=counts,
        total=total,
        rows=[ExecutionOut.of(r) for r in page.rows],
        after=after,
        next_after=page.next_after,
        definitions=definitions,
    )


def _text(value: Any) -> Optional[str]:
    """A stored value as text: a str as it is, anything else (another store's shapes) as JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, default=str, sort_keys=True)


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _step(raw: Any) -> StepOut:
    raw = raw if isinstance(raw, dict) else {"event_data": raw}
    index = raw.get("index")
    return StepOut(
        index=index if isinstance(index, int) and not isinstance(index, bool) else 0,
        at=_number(raw.get("timestamp")),
        event_kind=_text(raw.get("event_kind")),
        event_data=raw.get("event_data"),
        from_path=_text(raw.get("from_path")),
        to_path=_text(raw.get("to_path")),
        actions=[_text(a) or "" for a in raw.get("actions") or () if a is not None]
        if isinstance(raw.get("actions"), list)
        else [],
        assigned=raw.get("assigned"),
    )


def _snapshot(data: str) -> dict[str, Any]:
    """The stored execution as a dict; an unreadable one shows as such, not as a 500."""
    try:
        parsed = json.loads(data)
    except ValueError:
        return {"error": "the stored snapshot is not readable JSON"}
    return parsed if isinstance(parsed, dict) else {"error": "the stored snapshot is not an object"}


def _event_kind(raw: Any) -> Optional[str]:
    try:
        event = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return None
    return _text(event.get("kind")) if isinstance(event, dict) else None


def diagram(
    row: ExecutionOut, kids: list[ExecutionOut], timeline: list[StepOut], definitions: Mapping[str, Any]
) -> DiagramOut:
    """The execution on its statechart (see `harel_beanie.dashboard.statechart`)."""
    by_state: dict[str, list[str]] = {}
    for kid in kids:
        path = statechart.spawned_from(row.id, kid.id)
        if path is not None:
            by_state.setdefault(path, []).append(kid.id)
    active = [row.active_path] if row.active_path else []
    # its fork's regions (child executions of its own definition) while it is in that fork
    inside = (row.active_path or "\0") + "."
    active += [
        p for k in kids if k.definition_id == row.definition_id and (p := k.active_path) and p.startswith(inside)
    ]
    visited = sorted({p for s in timeline for p in (s.from_path, s.to_path) if p})
    last = next(((s.from_path, s.to_path) for s in reversed(timeline) if s.to_path), None)
    out = DiagramOut(
        definition_known=False,
        active=active,
        visited=visited,
        children_by_state=by_state,
        last_from=last[0] if last else None,
        last_to=last[1] if last else None,
    )
    defn = statechart.find_definition(dict(definitions), row.definition_id)
    if defn is None:
        out.paths = sorted(set(active) | set(visited) | set(by_state))
        return out
    marks = statechart.Marks(set(active), set(visited), last, {p: len(ids) for p, ids in by_state.items()})
    out.definition_known, out.paths = True, statechart.state_paths(defn)
    out.source = statechart.render(defn, marks)
    return out


async def execution_view(
    store: Any,
    execution_id: str,
    *,
    doc: Doc,
    actions: list[str],
    children: int = 100,
    definitions: Mapping[str, Any] = {},
) -> Optional[ExecutionView]:
    """Kept whole: it fills the one page model field by field, in the order the page shows them."""
    now = time.time()
    d = await queries.execution_detail(execution_id, doc=doc)
    if d is None:
        return None
    data = _snapshot(d.data)
    kids = await queries.children_of(execution_id, doc=doc).limit(children + 1).to_list()
    outbox = [
        OutboxOut(
            seq=e["seq"],
            target_id=_text(e.get("target_id")),
            event_kind=_event_kind(e.get("event")),
            age=age_of(e["seq"], now),
        )
        for e in d.outbox
    ]
    spawns = [
        SpawnOut(
            seq=s["seq"],
            child_id=_text(s.get("child_id")) or "",
            root_path=_text(s.get("root_path")) or "",
            age=age_of(s["seq"], now),
        )
        for s in d.spawns
    ]
    timers = sorted(
        (
            TimerOut(path=decode_path(k), fire_at=at, late_by=(now - at) if at <= now else None)
            # harel's terminate and a forceful cancel leave the timers armed (the sweep drops
            # them when due, firing nothing): a finished execution waits on none of them
            for k, at in (d.timers.items() if d.status not in FINISHED else ())
        ),
        key=lambda t: t.fire_at,
    )
    trace = await store.read_trace(execution_id)
    row = ExecutionOut.of(d)
    shown = [ExecutionOut.of(k) for k in kids[:children]]
    timeline = [_step(s) for s in trace]
    return ExecutionView(
        now=now,
        execution=row,
        created_at=d.created_at,
        context=data.get("context"),
        error=data.get("error"),
        children=shown,
        more_children=len(kids) > children,
        outbox=outbox,
        spawns=spawns,
        timers=timers,
        timeline=timeline,
        steps_written=d.trace_n or len(trace),
        actions=actions,
        diagram=diagram(row, shown, timeline, definitions),
    )


async def failed_view(
    *, after: Optional[str], limit: int, stuck_after: float, doc: Doc, hint: bool = False
) -> FailedView:
    now = time.time()
    page = await queries.executions_page(
        queries.ExecutionFilter(status="FAILED"), after=after, limit=limit, doc=doc, hint=hint
    )
    # the counters (exact, a few reads), and the stuck as the backlog reads them (core.stuck)
    total = (await queries.status_counts(doc=doc, hint=hint)).get("FAILED", 0)
    silent = [SilentOut(**s) for s in await stuck(after=stuck_after, now=now, show=limit, doc=doc)]
    return FailedView(
        now=now,
        failed=[ExecutionOut.of(r) for r in page.rows],
        failed_total=total,
        after=after,
        next_after=page.next_after,
        silent=silent,
        stuck_after=stuck_after,
    )


async def backlog_view(*, stuck_after: float, show: int, doc: Doc, samples: Any = None) -> BacklogView:
    """The backlog page's figures; with `samples`, the pending entries from the newest sample
    (`queries.samples.sampled_backlog`), which keeps the page's reads off the documents that
    hold one."""
    options: dict[str, Any] = {"stuck_after": stuck_after, "show": show}
    b = await (queries.backlog(doc=doc, **options) if samples is None else sampled_backlog(doc, samples, **options))
    totals = dict(sum((Counter(per) for per in b.counts.values()), Counter[str]()))
    timers = [
        NextTimerOut(**t, late_by=(b.now - t["fire_at"]) if t["fire_at"] <= b.now else None) for t in b.next_timers
    ]
    return BacklogView(
        now=b.now,
        counts=b.counts,
        totals=totals,
        pending_outbox=b.pending_outbox,
        oldest_outbox_age=b.oldest_outbox_age,
        pending_spawns=b.pending_spawns,
        oldest_spawn_age=b.oldest_spawn_age,
        oldest_outbox=[queries.PendingHolder(**r) for r in b.oldest_outbox],
        oldest_spawns=[queries.PendingHolder(**r) for r in b.oldest_spawns],
        due_timers=b.due_timers,
        next_timers=timers,
        silent=[SilentOut(**s) for s in b.stuck],
        stuck_after=stuck_after,
        entries_at=b.entries_at,
        uncounted=b.unbuilt,
    )
