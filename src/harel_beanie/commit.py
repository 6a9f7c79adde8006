"""What one commit writes: a single conditional update, or the insert of a new execution.

This is the design's commit (one document holds an execution and everything that must land
with it, so one single-document write is atomic on a bare standalone server), built here
once, with no I/O, for both stores. Compared with harel's MongoStore it:

- takes seqs from the store's own `SeqMint`, not from a counters round trip;
- inserts a brand-new execution (version 0) directly instead of update, read, then insert;
- keeps `processed` a window of the most recent event ids (`$push` + `$slice`), so a
  long-lived execution's document stays bounded;
- promotes the summary fields so listing and dashboards read them through indexes;
- keeps `next_fire` a lower bound of the armed timers (`$min` on schedule), so the timer
  sweep reads only documents with something due;
- counts trace steps (`trace_n`) instead of a per-execution counter document.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from harel.engine.execution import Execution
from harel.engine.store.base import TimerOp
from harel.spec.states import Event

from harel_beanie.keys import encode_path, require_str, timer_field
from harel_beanie.seqs import SeqMint

DEFAULT_DEDUPE_WINDOW = 1000
"""How many of the most recent event ids an execution remembers as processed (see README)."""


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


def summary_fields(exe: Execution) -> dict[str, Any]:
    """The fields copied out of `data` so queries need not parse it."""
    return {
        "status": exe.status.value,
        "outcome": exe.outcome,
        "active_path": exe.active_path,
        "parent_id": exe.parent_id,
        "created_at": exe.created_at,
        "updated_at": exe.updated_at,
        "finished_at": exe.finished_at,
    }


def final_timer_ops(timers: Sequence[TimerOp]) -> dict[str, Optional[float]]:
    """Path -> fire_at (None = cancel), the last op per path winning: one update can't both
    `$set` and `$unset` the same field."""
    out: dict[str, Optional[float]] = {}
    for op in timers:
        require_str("timer path", op.path)
        if op.action == "schedule":
            at = float(op.fire_at)
            if not math.isfinite(at):  # a NaN bound would match no sweep and hide every timer
                raise ValueError(f"timer {op.path!r} must fire at a finite time, got {op.fire_at!r}")
            out[op.path] = at
        elif op.action == "cancel":
            out[op.path] = None
        else:
            raise ValueError(f"unknown timer action {op.action!r} for path {op.path!r}")
    return out


def strict_json(what: str, value: Any) -> str:
    """`value` as JSON, refusing NaN and infinities: JSON has no such numbers, and harel's
    own serialisation would silently store them as null."""
    try:
        return json.dumps(value, separators=(",", ":"), allow_nan=False, default=str)
    except ValueError:
        raise ValueError(f"{what} holds a NaN or infinite number, which can't be stored") from None


def trace_item(step: dict[str, Any]) -> dict[str, Any]:
    """A trace step as stored: its JSON text, because a user's context keys may hold `.` or
    start with `$`, which a BSON field name inside `$push` must not."""
    return {"t": strict_json("the trace step", step)}


def plan_commit(
    exe: Execution,
    emits: Sequence[tuple[Optional[str], Event]],
    processed_event_id: Optional[str],
    timers: Sequence[TimerOp],
    spawns: Sequence[tuple[str, str, dict[str, Any]]],
    trace: Optional[dict[str, Any]],
    *,
    mint: Optional[SeqMint],
    seq_floor: int = 0,
    trace_max: int,
    dedupe_window: int,
) -> CommitPlan:
    """Build the commit of `exe` at `exe.version + 1`. `exe` itself is not changed: the
    store bumps its version only once the write has landed."""
    require_str("execution id", exe.id)
    require_str("definition id", exe.definition_id)
    if processed_event_id is not None:
        require_str("processed event id", processed_event_id)
    old = exe.version
    new = old + 1

    n_out, n_spawn = len(emits), len(spawns)
    minted: list[int] = []
    if n_out or n_spawn:
        if mint is None:
            raise RuntimeError("the store has no seq node yet")  # the store sets one up first
        minted = mint.take(n_out + n_spawn, above=seq_floor)
    seqs, spawn_seqs = minted[:n_out], minted[n_out:]
    strict_json(f"the context of execution {exe.id!r}", exe.context)
    outbox = []
    for s, (t, e) in zip(seqs, emits):
        strict_json(f"the data of event {e.kind!r}", e.data)
        target = None if t is None else require_str("emit target id", t)
        outbox.append({"seq": s, "target_id": target, "event": e.model_dump_json()})
    spawn_items = [
        {
            "seq": s,
            "parent_id": exe.id,
            "child_id": require_str("child id", cid),
            "root_path": require_str("root path", rp),
            "context": strict_json(f"the context of child {cid!r}", dict(ctx)),
        }
        for s, (cid, rp, ctx) in zip(spawn_seqs, spawns)
    ]
    trace_items = [trace_item(trace)] if trace is not None else []
    timer_ops = final_timer_ops(timers)
    schedules = {p: at for p, at in timer_ops.items() if at is not None}

    data = exe.model_copy(update={"version": new}).model_dump_json()
    promoted = summary_fields(exe)
    token = os.urandom(8).hex()

    if old == 0:
        doc: dict[str, Any] = {
            "_id": exe.id,
            "definition_id": exe.definition_id,
            "version": new,
            "data": data,
            **promoted,
            "outbox": outbox,
            "spawns": spawn_items,
            "processed": [processed_event_id] if processed_event_id is not None else [],
            "timers": {encode_path(p): at for p, at in schedules.items()},
            "trace": trace_items[-trace_max:] if trace_max else trace_items,
            "trace_n": len(trace_items),
            "commit_token": token,
        }
        # absent rather than null when there is none: `$min`/`$max` keep a null (null sorts
        # below every number), so a null bound would hide every later timer from the sweep
        if schedules:
            doc["next_fire"] = min(schedules.values())
        if minted:
            doc["seq_hi"] = max(minted)
        return CommitPlan(exe.id, old, {"_id": exe.id}, {}, doc, seqs, spawn_seqs, len(data.encode()), token)

    set_ops: dict[str, Any] = {"data": data, "version": new, **promoted, "commit_token": token}
    unset_ops: dict[str, str] = {}
    for path, at in timer_ops.items():
        if at is None:
            unset_ops[timer_field(path)] = ""
        else:
            set_ops[timer_field(path)] = at
    update: dict[str, Any] = {"$set": set_ops}
    if unset_ops:
        update["$unset"] = unset_ops
    if schedules:
        update["$min"] = {"next_fire": min(schedules.values())}
    push: dict[str, Any] = {}
    if outbox:
        push["outbox"] = {"$each": outbox}
    if spawn_items:
        push["spawns"] = {"$each": spawn_items}
    if trace_items:
        push["trace"] = {"$each": trace_items, **({"$slice": -trace_max} if trace_max else {})}
        update["$inc"] = {"trace_n": 1}
    if processed_event_id is not None:
        push["processed"] = {"$each": [processed_event_id], "$slice": -dedupe_window}
    if push:
        update["$push"] = push

    cas: dict[str, Any] = {"_id": exe.id, "version": old}
    if minted:
        # this execution's seqs must keep increasing even if our clock is behind the last
        # writer's: the server refuses the write if it has issued one at or above ours
        cas["seq_hi"] = {"$not": {"$gte": minted[0]}}
        update["$max"] = {"seq_hi": minted[-1]}
    return CommitPlan(exe.id, old, cas, update, None, seqs, spawn_seqs, len(data.encode()), token)


def append_trace_update(entry: dict[str, Any], trace_max: int) -> dict[str, Any]:
    """`append_trace` outside a commit: the same ring push and step count."""
    return {
        "$push": {"trace": {"$each": [trace_item(entry)], **({"$slice": -trace_max} if trace_max else {})}},
        "$inc": {"trace_n": 1},
    }
