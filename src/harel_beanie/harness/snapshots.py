"""What a store holds at the end of a run, read back the same way from any store.

Why this module exists: the engine tests and the crash tests replay one script on several
stores (harel's `DictStore`, harel's Mongo stores, this one) and compare what each holds
afterwards: every execution (`model_dump(mode="json")`) and its trace, the armed timers, and
what is still pending in the outbox and the spawn queue.
"""

from __future__ import annotations

import math
from typing import Any, Optional


def snapshot(store: Any) -> dict[str, Any]:
    """What a sync store holds: every execution (`model_dump(mode="json")`) and its trace,
    the armed timers, and what is still pending in the outbox and the spawn queue."""
    ids: list[str] = []
    cursor: Optional[str] = None
    while True:
        page = store.list_executions(limit=500, cursor=cursor)
        ids += [item.id for item in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    return _assemble(
        {i: store.load(i) for i in ids},
        {i: store.read_trace(i) for i in ids},
        store.due_timers(math.inf),
        store.pending_outbox(),
        store.pending_spawns(),
    )


async def asnapshot(store: Any) -> dict[str, Any]:
    """`snapshot` for an async store."""
    ids: list[str] = []
    cursor: Optional[str] = None
    while True:
        page = await store.list_executions(limit=500, cursor=cursor)
        ids += [item.id for item in page.items]
        cursor = page.next_cursor
        if cursor is None:
            break
    return _assemble(
        {i: await store.load(i) for i in ids},
        {i: await store.read_trace(i) for i in ids},
        await store.due_timers(math.inf),
        await store.pending_outbox(),
        await store.pending_spawns(),
    )


def _assemble(
    executions: dict[str, Any], traces: dict[str, Any], timers: Any, outbox: Any, spawns: Any
) -> dict[str, Any]:
    return {
        "executions": {i: e.model_dump(mode="json") for i, e in executions.items() if e is not None},
        "traces": traces,
        "timers": sorted((eid, path, fire_at) for eid, path, fire_at in timers),
        "outbox": sorted((e.target_id or "", e.event.kind) for e in outbox),
        "spawns": sorted((s.parent_id or "", s.child_id) for s in spawns),
    }
