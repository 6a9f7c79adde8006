"""What one commit writes: a single conditional update, or the insert of a new execution.

This is the design's commit (one document holds an execution and everything that must land
with it, so one single-document write is atomic on a bare standalone server), built here
once, with no I/O, for both stores. Compared with harel's MongoStore it:

- takes seqs from the store's own leased mint (`harel_beanie.core.seqs`), not from a counters
  round trip;
- inserts a brand-new execution (version 0) directly instead of update, read, then insert;
- keeps `processed` a window of the most recent event ids (`$push` + `$slice`), so a
  long-lived execution's document stays bounded;
- promotes the summary fields so listing and dashboards read them through indexes;
- keeps `next_fire` a lower bound of the armed timers, so the timer sweep reads only
  documents with something due, and as if a cancelled timer had never been armed
  (`core.stuck`, Rule T1): a commit with timer ops sets it to the earliest of the timers
  it leaves (those loaded at the version it writes over, less its cancels, with its
  schedules: `core.timer_ops`), or removes it when none is left; only commits arm timers
  and the version pins the load's, so no armed timer is missed;
- counts trace steps (`trace_n`) instead of a per-execution counter document;
- bounds what it keeps for itself in bytes, not only in count, so no execution can be
  wedged by the store's own additions: a trace step is stored whole up to
  `trace_step_bytes` and slimmed past it, an event id longer than `MAX_EVENT_ID_BYTES`
  is remembered by its digest, and the execution's own JSON gets what is left of the
  server's limit (`data_budget`); the bounds themselves are `harel_beanie.core.sizes`;
- remembers the tokens of its last `COMMIT_TOKENS` commits, so a writer whose reply was
  lost learns that its commit landed even if others committed after it;
- pays for the counts only when it changes what they count (`core.counting`, Rule 2): a
  commit harel describes as leaving the status as it was (`Step.from_status`) is sent
  *pinned*: its filter also requires the stored status, definition and no leaving mark to
  be what it writes, it does not set `cdirty`, and it sets or clears `quiet` itself
  (`core.stuck`). Where it cannot know `quiet` from what it writes (a RUNNING execution
  it gives no new entry or timer), the filter pins what the store's load saw it wait on
  (a timer bound held, else an entry pending: not quiet; else, or nothing seen, neither:
  quiet, set to the `updated_at` it writes). A pinned commit whose pins do not hold
  (harel's description was wrong, an old document, an ack or the sweep since the load)
  misses, and is sent again unpinned, marked for the fold as before (`flows.committing`):
  one read and one write more, on that path only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Mapping, Optional, Sequence

from harel.engine.execution import Execution, Status
from harel.engine.store.base import Step, TimerOp
from harel.spec.states import Event

from harel_beanie.core.arguments import require_str
from harel_beanie.core.counting import DIRTY, LEAVING
from harel_beanie.core.keys import encode_path, point, timer_field
from harel_beanie.core.sizes import DEFAULT_TRACE_STEP_BYTES, dedupe_key, ring_length, strict_json, trace_item
from harel_beanie.core.stuck import QUIET
from harel_beanie.core.timer_ops import bound_update, final_timer_ops, remaining_timers

DEFAULT_DEDUPE_WINDOW = 1000
"""How many of the most recent event ids an execution remembers as processed (docs/design.md, "The dedupe window")."""

COMMIT_TOKENS = 16
"""How many commits back a writer whose reply was lost is still recognised as landed."""


@dataclass(frozen=True)
class CommitRequest:
    """What harel's `commit` passes, held once: each store builds it from its `commit`'s
    arguments (harel's signature, kept as is) and hands it whole to `flows.commit`, which
    hands it to `plan_commit`.

    `exe` is the execution at its loaded version (bumped by the store once the write has
    landed); `emits` the outbox entries, (target id or None, event); `processed_event_id`
    the event this step consumed, for the dedupe window; `timers` the timer ops, the last
    per path winning; `spawns` the children to create, (child id, root path, context);
    `trace` the step to append to the trace ring; `step` harel's description of the commit
    for observers, which a store may ignore and this one does."""

    exe: Execution
    emits: Sequence[tuple[Optional[str], Event]] = ()
    processed_event_id: Optional[str] = None
    timers: Sequence[TimerOp] = ()
    spawns: Sequence[tuple[str, str, dict[str, Any]]] = ()
    trace: Optional[dict[str, Any]] = None
    step: Optional[Step] = None


@dataclass
class CommitPlan:
    """The write for one commit, and what the caller gets back when it lands."""

    execution_id: str
    old_version: int
    filter: dict[str, Any]  # the CAS: `_id`, the loaded version, and the seq floor if any
    update: dict[str, Any]  # the partial update when the execution exists
    insert: Optional[dict[str, Any]]  # the whole document when it is new (version 0)
    seqs: list[int]  # the outbox seqs, in `emits` order
    spawn_seqs: list[int] = field(default_factory=list)
    data_bytes: int = 0
    token: str = ""  # written with the commit: tells a writer whose reply was lost that it landed
    new_bytes: int = 0  # what this commit's new outbox entries and spawns take
    pinned: bool = False  # sent without `cdirty`, its filter pinning what it is counted as
    pending: bool = False  # it adds an outbox entry or a spawn
    armed: bool = False  # it arms a timer
    timers: Optional[dict[str, float]] = None  # the timers it leaves (Rule T1), if known


def bson_date(epoch_seconds: float) -> datetime:
    """Epoch seconds as the value a BSON date reads back as: naive UTC, whole milliseconds
    (so a migration comparing stored and computed fields sees them equal)."""
    return _EPOCH + timedelta(milliseconds=int(epoch_seconds * 1000))


_EPOCH = datetime(1970, 1, 1)


def summary_fields(exe: Execution) -> dict[str, Any]:
    """The fields copied out of `data` so queries need not parse it, and the finish time as
    a BSON date (`finished_on`), the only form a TTL index expires (kept for the date it gives; the TTL option is retired)."""
    finished_on = None if exe.finished_at is None else bson_date(exe.finished_at)
    return {
        "status": exe.status.value,
        "outcome": exe.outcome,
        "active_path": exe.active_path,
        "parent_id": exe.parent_id,
        "created_at": exe.created_at,
        "updated_at": exe.updated_at,
        "finished_at": exe.finished_at,
        "finished_on": finished_on,
    }


def plan_commit(
    request: CommitRequest,
    *,
    seqs: Sequence[int] = (),
    trace_max: int,
    dedupe_window: int,
    trace_step_bytes: int = DEFAULT_TRACE_STEP_BYTES,
    part_of: Optional[Callable[[str], int]] = None,
    pin: bool = True,
    waited: Optional[tuple[bool, bool]] = None,
    armed: Optional[Mapping[str, float]] = None,
) -> CommitPlan:
    """Build the commit of `request.exe` at its version + 1, its outbox entries and spawns
    taking `seqs` (minted by the caller, one per emit then one per spawn, increasing): the
    whole document of a new execution (version 0), else one conditional update; the store
    bumps the execution's version once it has landed. `part_of` gives a new document's
    partition. `pin` False sends it unpinned whatever harel says (the resend of a pinned
    commit that missed: see the module); `waited` is what the execution waited on when
    loaded at this version (an entry pending, a timer bound held): which `quiet` a pinned
    commit pins; `armed` the timers it held then: its timer bound's (Rule T1); each None
    where the store does not know."""
    exe = request.exe
    c = _parts(request, seqs, trace_max, trace_step_bytes)
    insert: Optional[dict[str, Any]] = None
    pinned, left = False, remaining_timers(armed, c.timer_ops)
    if exe.version == 0:
        cas: dict[str, Any] = {"_id": exe.id}
        update: dict[str, Any] = {}
        insert = _new_document(exe, c)
        if part_of is not None:
            insert["part"] = part_of(exe.id)
    else:
        pinned = pin and keeps_counted(request, c)
        cas, update = _cas_update(exe, c, dedupe_window, pinned, waited, left)
    return CommitPlan(
        exe.id,
        exe.version,
        cas,
        update,
        insert,
        c.out_seqs,
        c.spawn_seqs,
        data_bytes=len(c.data.encode()),
        token=c.token,
        new_bytes=_entries_bytes(c.outbox, c.spawns),
        pinned=pinned,
        pending=bool(c.outbox or c.spawns),
        armed=bool(c.schedules),
        timers={encode_path(p): at for p, at in c.schedules.items()} if insert is not None else left,
    )


def keeps_counted(request: CommitRequest, c: "_CommitParts") -> bool:
    """Whether the commit is sent pinned (see the module): harel says it leaves the status
    as it was, and it cancels no timer (a cancel may leave it waiting on nothing, and
    `quiet` is the fold's to decide then: `core.stuck`, Rule T2)."""
    step = request.step
    if step is None or step.from_status != request.exe.status:
        return False
    return all(at is not None for at in c.timer_ops.values())


@dataclass
class _CommitParts:
    """What one commit writes, checked and in stored form, before it is shaped as the
    insert of a new execution or as the update of an existing one."""

    new_version: int
    data: str  # the execution's JSON at `new_version`
    promoted: dict[str, Any]  # `summary_fields`
    token: str
    out_seqs: list[int]
    spawn_seqs: list[int]
    outbox: list[dict[str, Any]]
    spawns: list[dict[str, Any]]
    trace: list[dict[str, Any]]  # the step to push, if any
    ring: int  # how many steps the trace ring keeps
    timer_ops: dict[str, Optional[float]]  # path -> fire_at, None = cancel
    processed: list[str]  # the dedupe key to push, if any

    @property
    def minted(self) -> list[int]:
        """Every seq of the commit, increasing: the emits' then the spawns'."""
        return self.out_seqs + self.spawn_seqs

    @property
    def schedules(self) -> dict[str, float]:
        """The timer ops that arm a timer."""
        return {p: at for p, at in self.timer_ops.items() if at is not None}


def _parts(request: CommitRequest, seqs: Sequence[int], trace_max: int, trace_step_bytes: int) -> _CommitParts:
    """Check every caller string and value a commit stores, and put each in stored form."""
    exe, emits, spawns, processed_event_id = request.exe, request.emits, request.spawns, request.processed_event_id
    require_str("exe.id", exe.id)
    require_str("exe.definition_id", exe.definition_id)
    if processed_event_id is not None:
        require_str("processed_event_id", processed_event_id)
    new = exe.version + 1

    n_out = len(emits)
    if len(seqs) != n_out + len(spawns):
        raise ValueError(f"{len(seqs)} seqs for {n_out} emits and {len(spawns)} spawns")
    out_seqs, spawn_seqs = list(seqs[:n_out]), list(seqs[n_out:])
    strict_json(f"the context of execution {exe.id!r}", exe.context)
    outbox = []
    for s, (t, e) in zip(out_seqs, emits):
        strict_json(f"the data of event {e.kind!r}", e.data)
        target = None if t is None else require_str("emits[].target", t)
        outbox.append({"seq": s, "target_id": target, "event": e.model_dump_json()})
    spawn_items = [
        {
            "seq": s,
            "parent_id": exe.id,
            "child_id": require_str("spawns[].child_id", cid),
            "root_path": require_str("spawns[].root_path", rp),
            "context": strict_json(f"the context of child {cid!r}", dict(ctx)),
        }
        for s, (cid, rp, ctx) in zip(spawn_seqs, spawns)
    ]
    ring = ring_length(trace_max, trace_step_bytes)
    trace_items = [trace_item(request.trace, trace_step_bytes)] if request.trace is not None else []
    timer_ops = final_timer_ops(request.timers)
    processed = [dedupe_key(processed_event_id)] if processed_event_id is not None else []
    return _CommitParts(
        new_version=new,
        data=exe.model_copy(update={"version": new}).model_dump_json(),
        promoted=summary_fields(exe),
        token=os.urandom(8).hex(),
        out_seqs=out_seqs,
        spawn_seqs=spawn_seqs,
        outbox=outbox,
        spawns=spawn_items,
        trace=trace_items,
        ring=ring,
        timer_ops=timer_ops,
        processed=processed,
    )


def _new_document(exe: Execution, c: _CommitParts) -> dict[str, Any]:
    """The whole document of a new execution."""
    doc: dict[str, Any] = {
        "_id": exe.id,
        "definition_id": exe.definition_id,
        "version": c.new_version,
        "data": c.data,
        **c.promoted,
        "outbox": c.outbox,
        "spawns": c.spawns,
        "processed": c.processed,
        "timers": {encode_path(p): at for p, at in c.schedules.items()},
        "trace": c.trace[-c.ring :],
        "trace_n": len(c.trace),
        "commit_tokens": [c.token],
        "born": c.token,  # which creation this is: a purge buries it (see flows.purge)
        DIRTY: True,  # not counted yet (harel_beanie.core.counting, Rule 2)
    }
    if c.outbox or c.spawns:
        doc["pending"] = True  # the relays' index (documents.PENDING)
    # absent rather than null when there is none: `$min`/`$max` keep a null (null sorts
    # below every number), so a null bound would hide every later timer from the sweep
    if c.schedules:
        doc["next_fire"] = min(c.schedules.values())
    if c.minted:
        doc["seq_hi"] = max(c.minted)
    return doc


def _cas_update(
    exe: Execution,
    c: _CommitParts,
    dedupe_window: int,
    pinned: bool = False,
    waited: Optional[tuple[bool, bool]] = None,
    left: Optional[dict[str, float]] = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The filter (the CAS on the loaded version, the seq floor, and a pinned commit's pins)
    and the partial update of an existing execution."""
    set_ops: dict[str, Any] = {"data": c.data, "version": c.new_version, **c.promoted}
    cas: dict[str, Any] = {"_id": point(exe.id), "version": point(exe.version)}
    unset_ops: dict[str, str] = {QUIET: ""}
    if pinned:
        _pin(exe, c, waited, cas, set_ops, unset_ops)
    else:
        # it may move the status: the counts' mark rides along, and a commit to an
        # execution prune has begun removing keeps it (core.counting, Rules 2 and 5); no
        # longer silent: the fold gives it its `quiet` again if it waits on nothing
        set_ops[DIRTY] = True
        unset_ops[LEAVING] = ""
    if c.outbox or c.spawns:
        set_ops["pending"] = True  # cleared by the write that removes the last entry
    for path, at in c.timer_ops.items():
        if at is None:
            unset_ops[timer_field(path)] = ""
        else:
            set_ops[timer_field(path)] = at
    update: dict[str, Any] = {"$set": set_ops}
    if unset_ops:
        update["$unset"] = unset_ops
    bound_update(c.timer_ops, left, set_ops, unset_ops, update)
    push: dict[str, Any] = {"commit_tokens": {"$each": [c.token], "$slice": -COMMIT_TOKENS}}
    if c.outbox:
        push["outbox"] = {"$each": c.outbox}
    if c.spawns:
        push["spawns"] = {"$each": c.spawns}
    if c.trace:
        push["trace"] = {"$each": c.trace, "$slice": -c.ring}
        update["$inc"] = {"trace_n": 1}
    if c.processed:
        push["processed"] = {"$each": c.processed, "$slice": -dedupe_window}
    update["$push"] = push

    if c.minted:
        # this execution's seqs must keep increasing even if our clock is behind the last
        # writer's: the server refuses the write if it has issued one at or above ours
        cas["seq_hi"] = {"$not": {"$gte": c.minted[0]}}
        update["$max"] = {"seq_hi": c.minted[-1]}
    return cas, update


def _pin(
    exe: Execution,
    c: _CommitParts,
    waited: Optional[tuple[bool, bool]],
    cas: dict[str, Any],
    set_ops: dict[str, Any],
    unset_ops: dict[str, str],
) -> None:
    """A pinned commit's pins and its own `quiet`: what it is counted as stays (Rule 2)."""
    cas.update(status=point(exe.status.value), definition_id=point(exe.definition_id))
    cas[LEAVING] = {"$exists": False}
    quiet = exe.updated_at
    if exe.status is Status.RUNNING and not (c.outbox or c.spawns or c.schedules) and quiet is not None:
        # it waits on nothing exactly if nothing was pending and no timer bound held
        # before (this commit adds neither): the filter pins what the load saw, so its
        # `quiet` is a fact (core.stuck); seen nothing, it pins "waits on nothing"
        if waited is not None and waited[1]:
            cas["next_fire"] = {"$exists": True}  # not quiet: a timer bound held
        elif waited is not None and waited[0]:
            cas["pending"] = True  # not quiet: an entry pending
        else:
            cas.update(pending={"$exists": False}, next_fire={"$exists": False})
            set_ops[QUIET] = float(quiet)
            del unset_ops[QUIET]


def _entries_bytes(outbox: list[dict[str, Any]], spawns: list[dict[str, Any]]) -> int:
    return sum(len(e["event"]) + 64 for e in outbox) + sum(len(s["context"]) + len(s["child_id"]) + 96 for s in spawns)


def append_trace_update(entry: dict[str, Any], trace_max: int, trace_step_bytes: int) -> dict[str, Any]:
    """`append_trace` outside a commit: the same bounded ring push and step count."""
    ring = ring_length(trace_max, trace_step_bytes)
    return {
        "$push": {"trace": {"$each": [trace_item(entry, trace_step_bytes, "entry")], "$slice": -ring}},
        "$inc": {"trace_n": 1},
    }
