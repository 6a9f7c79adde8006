"""How stored documents become harel's records, for both stores, with no I/O.

Every reader here accepts both the documents this store writes and those harel's MongoStore
wrote (spawn contexts as dicts, trace steps as dicts carrying their own index, no promoted
summary fields), so a database harel's store wrote reads correctly before it is migrated.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Optional

from harel.engine.execution import Execution, ExecutionSummary
from harel.engine.store.base import OutboxEntry, SpawnEntry
from harel.spec.states import Event

from harel_beanie.core.counting import DIRTY
from harel_beanie.core.keys import decode_path


def execution(doc: Optional[Mapping[str, Any]]) -> Optional[Execution]:
    """The execution a document holds; None for no document or a purged one's tombstone."""
    return None if doc is None or "data" not in doc else Execution.model_validate_json(doc["data"])


def summary(doc: Mapping[str, Any]) -> ExecutionSummary:
    """A listing row: from the promoted fields, or from `data` where they are missing."""
    if doc.get("status") is None and doc.get("data") is not None:
        return ExecutionSummary.from_data(json.loads(doc["data"]), doc.get("version", 0))
    return ExecutionSummary(
        id=doc["_id"],
        definition_id=doc["definition_id"],
        status=doc["status"],
        outcome=doc.get("outcome"),
        active_path=doc.get("active_path"),
        version=doc.get("version", 0),
        parent_id=doc.get("parent_id"),
        finished_at=doc.get("finished_at"),
    )


def outbox_entries(docs: Iterable[Mapping[str, Any]]) -> tuple[list[OutboxEntry], dict[int, str]]:
    """Every pending entry, oldest first, and which document holds each seq."""
    entries, owners = [], {}
    for doc in docs:
        for e in doc.get("outbox") or ():
            entries.append(OutboxEntry(e["seq"], e.get("target_id"), Event.model_validate_json(e["event"])))
            owners[e["seq"]] = doc["_id"]
    entries.sort(key=lambda e: e.seq)
    return entries, owners


def spawn_context(raw: Any) -> dict[str, Any]:
    return json.loads(raw) if isinstance(raw, str) else dict(raw)


def spawn_entries(docs: Iterable[Mapping[str, Any]]) -> tuple[list[SpawnEntry], dict[int, str]]:
    entries, owners = [], {}
    for doc in docs:
        for s in doc.get("spawns") or ():
            entries.append(
                SpawnEntry(s["seq"], s["parent_id"], s["child_id"], s["root_path"], spawn_context(s["context"]))
            )
            owners[s["seq"]] = doc["_id"]
    entries.sort(key=lambda s: s.seq)
    return entries, owners


def timers_held(doc: Mapping[str, Any]) -> Optional[dict[str, float]]:
    """The timers a document holds (stored key -> fire time), or None where they are not all
    fire times (a document of another layout): a commit's hint for its bound (`core.commit`)."""
    held = doc.get("timers") or {}
    if not isinstance(held, dict):
        return None
    out: dict[str, float] = {}
    for key, at in held.items():
        if isinstance(at, bool) or not isinstance(at, (int, float)):
            return None
        out[str(key)] = float(at)
    return out


def due_timers(
    docs: Iterable[Mapping[str, Any]], now: float
) -> tuple[list[tuple[str, str, float]], list[dict[str, Any]]]:
    """The timers due at `now`, by fire time, and the repairs to make: documents whose
    `next_fire` bound is stale (nothing due, because the timer it bounded was cancelled) get
    their bound raised to their earliest timer, guarded on the version read."""
    due: list[tuple[str, str, float]] = []
    repairs: list[dict[str, Any]] = []
    for doc in docs:
        timers = doc.get("timers") or {}
        mine = [(doc["_id"], decode_path(k), float(at)) for k, at in timers.items() if at <= now]
        due += mine
        bound = doc.get("next_fire")
        earliest = min(timers.values(), default=None)
        if not mine and bound != earliest:
            # nothing due: the bound is stale (its timer was cancelled) or missing (a document
            # harel's store wrote): set it to the earliest timer, or drop it if none is left
            guard = {"_id": doc["_id"], "version": doc.get("version"), "next_fire": bound}
            # (marked for the fold: without the bound, it may wait on nothing; core.stuck)
            fix: dict[str, Any] = {"$set": {DIRTY: True}}
            if earliest is not None:
                fix["$set"]["next_fire"] = earliest
            else:
                fix["$unset"] = {"next_fire": ""}
            repairs.append({"filter": guard, "update": fix})
    due.sort(key=lambda t: t[2])
    return due, repairs


def trace_steps(doc: Optional[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The trace ring, oldest first, each step with its 0-based `index`.

    This store keeps a step as its JSON (`{"t": ...}`) and stamps the index on read from
    `trace_n`, the count of steps ever written; harel's store kept the step as a dict
    holding its index."""
    if doc is None:
        return []
    items = list(doc.get("trace") or ())
    ours = [i for i, item in enumerate(items) if _is_ours(item)]
    first = (doc.get("trace_n") or len(ours)) - len(ours)
    theirs = [item.get("index") for item in items if not _is_ours(item)]
    if theirs and isinstance(theirs[-1], int):
        # a document harel's store wrote, not migrated: `trace_n` counts only our steps
        first = max(first, theirs[-1] + 1)
    out = []
    for item in items:
        if _is_ours(item):
            step = json.loads(item["t"])
            out.append({**step, "index": step.get("index", first)})
            first += 1
        else:
            out.append(dict(item))
    return out


def _is_ours(item: Mapping[str, Any]) -> bool:
    return len(item) == 1 and isinstance(item.get("t"), str)
