"""`backlog()`: everything `harel-beanie status`, the dashboard's backlog page and `/metrics`
show, read at one moment.

Why this module exists: those three views must agree, so the figures are gathered once here:
executions by definition and status, purged executions' tombstones, the pending outbox and
its oldest entry, pending spawns, the executions holding the oldest entries of each kind
(`queries.oldest`), due and next timers, and the stuck executions (stuck, not waiting:
`harel_beanie.core.stuck`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from harel.engine.schema import Names

from harel_beanie.core.arguments import require_bool, require_int, require_seconds, require_time
from harel_beanie.core.counting import LEAVING, UNKNOWN
from harel_beanie.core.documents import PENDING, SCHEMA_MARKER_ID, ExecutionDocument
from harel_beanie.core.keys import ANY_TIME, decode_path
from harel_beanie.core.names import prefix_of
from harel_beanie.core.seqs import age_of
from harel_beanie.queries.counts import execution_counts
from harel_beanie.queries.lowest import lowest
from harel_beanie.queries.oldest import MAX_OLDEST, OLDEST, oldest_holders, oldest_of
from harel_beanie.queries.rows import Executions, TimerRow, checked_doc
from harel_beanie.queries.stuck import stuck as stuck_list

#: the most rows `show` may ask for (the next timers, the stuck executions)
MAX_SHOW = 10_000


@dataclass
class Backlog:
    """What is pending and what is stuck, at one moment."""

    now: float
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # definition -> status -> n
    purged: int = 0  # tombstones: ids whose execution a purge removed
    pending_outbox: int = 0
    oldest_outbox_age: Optional[float] = None  # seconds; None if none pending or unknown
    pending_spawns: int = 0
    oldest_spawn_age: Optional[float] = None  # seconds, as for the outbox
    #: the executions holding the oldest pending outbox entries, and spawns, oldest first
    #: (`queries.oldest.holder_row`): read at `now` even where the counts above come from a sample
    oldest_outbox: list[dict[str, Any]] = field(default_factory=list)
    oldest_spawns: list[dict[str, Any]] = field(default_factory=list)
    due_timers: int = 0
    next_timers: list[dict[str, Any]] = field(default_factory=list)
    stuck: list[dict[str, Any]] = field(default_factory=list)
    stuck_after: float = 300.0
    #: when the pending entries' figures were read: `now` when this call read them, a
    #: minute's sample's time when they come from one (`queries.samples.sampled_backlog`)
    entries_at: Optional[float] = None
    #: the partitions whose counts are not built yet: `counts` and `purged` leave
    #: their executions out (core.counting's last paragraph); empty: every one counted
    unbuilt: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def backlog(
    *,
    doc: Executions = ExecutionDocument,
    stuck_after: float = 300.0,
    now: Optional[float] = None,
    show: int = 10,
    timers: Optional[int] = None,
    entries: bool = True,
    oldest: int = OLDEST,
) -> Backlog:
    """Everything `harel-beanie status` reports. The counts are the counters kept up to date
    (`queries.counts`: O(partitions + executions written since the last fold)), or one pass
    over the collection where they cannot answer; every other figure reads only the
    documents that hold pending work, through their indexes, and the stuck list reads only
    candidates (`queries.stuck`), never the executions waiting on a timer. `show` bounds the
    stuck executions and (unless `timers` is given) the next timers listed. `entries` False
    leaves the pending entries' counts and ages out (0 and None), for a caller that keeps
    them from a recent sample (`/metrics`): they read every document holding one. On a database
    still in harel's layout (before `migrate up`) the statuses and the pending work are read
    from every document instead, as the store itself does there. `oldest` bounds the
    executions listed as holding the oldest entries of each kind (`queries.oldest`: about
    that many documents read through their own indexes, whatever `entries` says; 0 lists none)."""
    doc = checked_doc(doc)
    stuck_after = require_seconds("stuck_after", stuck_after)
    now = time.time() if now is None else require_time("now", now)
    show = require_int("show", show, low=0, high=MAX_SHOW)
    timers = show if timers is None else require_int("timers", timers, low=0, high=MAX_SHOW)
    entries = require_bool("entries", entries)
    oldest = require_int("oldest", oldest, low=0, high=MAX_OLDEST)
    out = Backlog(now=now, stuck_after=stuck_after, entries_at=now if entries else None)
    coll = doc.get_pymongo_collection()
    counted = await execution_counts(doc=doc)
    if counted is not None:
        out.counts, out.purged = counted.per, counted.purged
        out.unbuilt = counted.unbuilt
    else:
        await _counted_whole(coll, out)
    if await _in_harel_layout(coll):
        await _statuses_from_data(coll, out)
        await _pending_scanned(coll, out, timers, oldest)
    else:
        await _pending_indexed(doc, out, timers, entries)
        if oldest:
            held = await oldest_holders(doc, oldest, now)
            out.oldest_outbox, out.oldest_spawns = held["outbox"], held["spawn"]
    # stuck, not waiting (core.stuck): read through indexes holding only candidates
    out.stuck = await stuck_list(after=stuck_after, now=now, show=show, doc=doc)
    return out


async def _counted_whole(coll: Any, out: Backlog) -> None:
    """The counts of a database whose counters cannot answer (another layout): one pass over
    the collection. A document prune has begun removing is not counted, as by the counters."""
    groups = await (
        await coll.aggregate(
            [
                {"$match": {LEAVING: {"$ne": True}}},
                {
                    "$group": {
                        "_id": {"d": "$definition_id", "s": {"$ifNull": ["$status", UNKNOWN]}},
                        "n": {"$sum": 1},
                    }
                },
            ]
        )
    ).to_list(None)
    for g in groups:
        definition = g["_id"].get("d")
        if definition is None:  # only a tombstone lacks a definition
            out.purged += g["n"]
        else:
            per = out.counts.setdefault(str(definition), {})
            per[g["_id"]["s"]] = per.get(g["_id"]["s"], 0) + g["n"]


async def _in_harel_layout(coll: Any) -> bool:
    """Whether the database is still in harel's MongoStore layout (no layout recorded): its
    documents carry no `pending` flag and no `next_fire` bound until `migrate up`."""
    prefix = prefix_of(coll.name) or coll.name  # another name: it stands for the prefix
    marker = await coll.database[Names(prefix).counters].find_one({"_id": SCHEMA_MARKER_ID}, {"_id": 1})
    return marker is None


async def _statuses_from_data(coll: Any, out: Backlog) -> None:
    """The status of each document harel's store wrote (counted as UNKNOWN above: it has no
    status field), read from its snapshot."""
    async for d in coll.find(
        {"status": {"$exists": False}, "data": {"$exists": True}}, {"definition_id": 1, "data": 1}
    ):
        per = out.counts.get(str(d.get("definition_id")))
        if per is None or not per.get(UNKNOWN):
            continue
        try:
            status = json.loads(d["data"]).get("status")
        except (ValueError, AttributeError):
            continue
        if isinstance(status, str):
            per[UNKNOWN] -= 1
            per[status] = per.get(status, 0) + 1
            if not per[UNKNOWN]:
                del per[UNKNOWN]


async def _pending_indexed(doc: Executions, out: Backlog, show: int, entries: bool = True) -> None:
    """The pending work of a database in this store's layout: only the documents holding
    some are read, through the partial indexes (the entries' unless `entries` is False)."""
    if entries:
        await _entries_indexed(doc, out)
    await _timers_indexed(doc, out, show)


async def _entries_indexed(doc: Executions, out: Backlog) -> None:
    """The pending entries' counts and the oldest's age: one pass over the documents holding any."""
    coll, now = doc.get_pymongo_collection(), out.now
    arrays = {"outbox": ("pending_outbox", "oldest_outbox_age"), "spawns": ("pending_spawns", "oldest_spawn_age")}
    # one pass over the pending documents for both arrays: each document is read once (on
    # SecantusDB, which reads every match, two passes read each twice)
    per_doc = {
        f"{array}_{k}": v
        for array in arrays
        for k, v in (
            ("n", {"$size": {"$ifNull": [f"${array}", []]}}),
            ("low", {"$min": {"$map": {"input": {"$ifNull": [f"${array}", []]}, "in": "$$this.seq"}}}),
        )
    }
    summed = {f"{a}_{k}": {op: f"${a}_{k}"} for a in arrays for k, op in (("n", "$sum"), ("low", "$min"))}
    rows = await (
        await coll.aggregate(
            [{"$match": dict(PENDING)}, {"$project": per_doc}, {"$group": {"_id": None, **summed}}]  # hb_pending_part
        )
    ).to_list(None)
    for array, (count_attr, age_attr) in arrays.items():
        if rows and rows[0][f"{array}_n"]:
            setattr(out, count_attr, rows[0][f"{array}_n"])
            low = rows[0][f"{array}_low"]
            setattr(out, age_attr, age_of(low, now) if isinstance(low, int) else None)


async def _timers_indexed(doc: Executions, out: Backlog, show: int) -> None:
    """The due timers' count and the next `show` timers, through the timer index."""
    now = out.now
    out.due_timers = await doc.find({"next_fire": {**ANY_TIME, "$lte": now}}).count()
    # the bound may be stale (a cancelled timer): report the real timers
    # show=0 lists none (a limit of 0 would mean no limit at all)
    for row in await lowest(doc, {"next_fire": dict(ANY_TIME)}, "next_fire", show, TimerRow) if show else ():
        for key, at in sorted(row.timers.items(), key=lambda kv: kv[1]):
            out.next_timers.append(
                {"id": row.id, "definition_id": row.definition_id, "path": decode_path(key), "fire_at": at}
            )
    out.next_timers = sorted(out.next_timers, key=lambda t: t["fire_at"])[:show]


async def _pending_scanned(coll: Any, out: Backlog, show: int, oldest: int) -> None:
    """The same figures for a database in harel's layout, read from every document (what the
    store itself does there until `migrate up`)."""
    now, low = out.now, {"outbox": None, "spawns": None}
    fields = {"definition_id": 1, "outbox.seq": 1, "spawns.seq": 1, "timers": 1}
    held: list[tuple[str, str, Optional[str], list[int]]] = []
    async for d in coll.find({"data": {"$exists": True}}, fields):
        for array in low:
            seqs = [e["seq"] for e in d.get(array) or () if isinstance(e, dict) and isinstance(e.get("seq"), int)]
            held.append(("outbox" if array == "outbox" else "spawn", d["_id"], d.get("definition_id"), seqs))
            if array == "outbox":
                out.pending_outbox += len(seqs)
            else:
                out.pending_spawns += len(seqs)
            if seqs:
                low[array] = min(seqs) if low[array] is None else min(low[array], *seqs)
        timers = {k: v for k, v in (d.get("timers") or {}).items() if isinstance(v, (int, float))}
        if any(at <= now for at in timers.values()):
            out.due_timers += 1
        out.next_timers += [
            {"id": d["_id"], "definition_id": d.get("definition_id"), "path": decode_path(k), "fire_at": float(at)}
            for k, at in timers.items()
        ]
    out.next_timers = sorted(out.next_timers, key=lambda t: t["fire_at"])[:show]
    if out.pending_outbox and low["outbox"] is not None:
        out.oldest_outbox_age = age_of(low["outbox"], now)
    if out.pending_spawns and low["spawns"] is not None:
        out.oldest_spawn_age = age_of(low["spawns"], now)
    listed = oldest_of(held, oldest, now)
    out.oldest_outbox, out.oldest_spawns = listed["outbox"], listed["spawn"]


def human_duration(seconds: float) -> str:
    """A duration for people: 45s, 12m, 3.5h, 2.0d (the sign dropped; the caller says
    "ago" or "in"). The status command and the dashboard both show durations this way."""
    s = abs(seconds)
    text = (
        f"{s:.0f}s"
        if s < 120
        else f"{s / 60:.0f}m"
        if s < 7200
        else f"{s / 3600:.1f}h"
        if s < 172800
        else f"{s / 86400:.1f}d"
    )
    return text
