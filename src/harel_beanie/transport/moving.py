"""Moving a deployment's undelivered messages between harel's Mongo transport and this one,
with the workers stopped: `up` into this package's queues, `down` back into harel's.

Why this module exists: switching transports must not lose a message or deliver one twice.
Each group (execution) moves on its own, in three steps that can each be repeated:

1. the group's messages are written to the destination, with ids fixed by the source (`up`:
   overflow ids made from harel's seqs; `down`: a block of harel's seqs reserved once and
   recorded on the source queue before any is used), so writing them again changes nothing;
2. the destination group is made claimable, with the source's priority;
3. the source's messages and lease of the group are deleted.

Every document written carries its group's partition (`harel_beanie.core.partitions`), and
through a mongos every command that addresses a group names it, so each reaches one shard.

A run cut short anywhere is finished by running it again: a group whose step 3 has not
happened is moved again onto what step 1 already wrote. A group that holds messages on both
sides is refused (something still publishes: stop the publishers as well as the workers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from bson import ObjectId
from harel.engine.schema import Names
from pymongo import ReplaceOne, ReturnDocument
from pymongo.errors import BulkWriteError

from harel_beanie.core.documents import SCHEMA_MARKER_ID
from harel_beanie.core.names import queue_names
from harel_beanie.core.partitions import PART, PartitionScope
from harel_beanie.store.sharding import on_mongos_async
from harel_beanie.transport.documents import INLINE_BYTES, INLINE_MAX, WAITING


class MoveRefused(RuntimeError):
    """A move that would lose or mix messages; the message says what to do."""


@dataclass
class MoveReport:
    direction: str
    groups: int = 0
    messages: int = 0
    refused: list[str] = field(default_factory=list)


def _overflow_id(seq: int) -> ObjectId:
    """An overflow id that sorts by harel's seq and before any id a publish makes now (its
    time part is zero), the same on every run."""
    return ObjectId(b"\x00\x00\x00\x00" + int(seq).to_bytes(8, "big"))


async def _scope(db: Any, prefix: str, sharded: Optional[bool]) -> PartitionScope:
    """The database's partitions (the count its schema marker records), and whether the
    commands go through a mongos (asked of the server unless `sharded` says)."""
    marker = await db[Names(prefix).counters].find_one({"_id": SCHEMA_MARKER_ID}, {"parts": 1}) or {}
    scope = PartitionScope(sharded=await on_mongos_async(db.client) if sharded is None else sharded)
    if isinstance(marker.get("parts"), int) and marker["parts"] > 0:
        scope.parts = marker["parts"]
    return scope


def _key(scope: PartitionScope, group: str) -> dict[str, Any]:
    """A queue document's filter: its id, and through a mongos its partition."""
    return {"_id": group, PART: scope.part_of(group)} if scope.sharded else {"_id": group}


def _part(scope: PartitionScope, group: str) -> dict[str, Any]:
    """An overflow filter's partition, through a mongos."""
    return {PART: scope.part_of(group)} if scope.sharded else {}


def _layout(texts: list[str]) -> tuple[list[str], list[str]]:
    """The messages a queue document keeps inline, and those that go to overflow (in order)."""
    inline: list[str] = []
    used = 0
    for i, text in enumerate(texts):
        size = len(text.encode())
        if len(inline) >= INLINE_MAX or used + size > INLINE_BYTES:
            return inline, texts[i:]
        inline.append(text)
        used += size
    return inline, []


async def up(db: Any, prefix: str, *, say: Callable[[str], None] = print, sharded: Optional[bool] = None) -> MoveReport:
    """Every group of harel's transport into this package's queues (see the module).
    `sharded`: whether the commands go through a mongos (None: asked of the server).

    Kept whole: the three steps of a group's move (copy, then drop from harel's, then the
    lock) must stay in this order for a run cut short to be finished by the next, and they
    read best as one loop."""
    names, (queues_name, overflow_name) = Names(prefix), queue_names(prefix)
    messages, locks = db[names.messages], db[names.transport_locks]
    queues, overflow = db[queues_name], db[overflow_name]
    report = MoveReport("up")
    scope = await _scope(db, prefix, sharded)
    for group in sorted(await messages.distinct("group_id")):
        part = scope.part_of(group)
        rows = await messages.find({"group_id": group}).sort("_id", 1).to_list(None)
        if not rows:
            continue
        mine = await queues.find_one({**_key(scope, group), **WAITING}, {"hb_moved": 1})
        moved = None if mine is None else mine.get("hb_moved")
        if moved is not None and moved >= rows[-1]["_id"]:
            # written by an earlier run cut short in step 3: finish that step
            await messages.delete_many({"group_id": group, "_id": {"$lte": moved}})
            await locks.delete_one({"_id": group})
            continue
        if mine is not None:
            report.refused.append(group)
            continue
        lock = await locks.find_one({"_id": group}) or {}
        texts = [r["event"] for r in rows]
        inline, spilled = _layout(texts)
        if spilled:  # step 1: the overflow, then the queue that tells of it
            docs = [
                {"_id": _overflow_id(r["_id"]), "g": group, "e": r["event"], PART: part} for r in rows[len(inline) :]
            ]
            # the whole shard key in each upsert's filter: `part`, which the id's group fixes
            writes = [ReplaceOne({"_id": d["_id"], "g": group, PART: part}, d, upsert=True) for d in docs]
            await overflow.bulk_write(writes, ordered=False)
        queue = {
            "q": [{"e": t} for t in inline],
            "qn": len(inline),
            "qb": sum(len(t.encode()) for t in inline),
            "pending": len(inline) + bool(spilled),
            "spill": bool(spilled),
            "spilled": len(spilled),
            "available_at": 0.0,
            "token": None,
            "priority": int(lock.get("priority") or 0),
            "acked": 0,
            "published": len(texts),
            "wake": 1,
            "hb_moved": rows[-1]["_id"],  # what a repeated run recognises as its own
            PART: part,
        }
        await queues.replace_one(_key(scope, group), queue, upsert=True)  # step 2
        await messages.delete_many({"group_id": group, "_id": {"$lte": rows[-1]["_id"]}})  # step 3
        await locks.delete_one({"_id": group})
        report.groups += 1
        report.messages += len(texts)
    await queues.update_many({"hb_moved": {"$exists": True}}, {"$unset": {"hb_moved": ""}})
    _say_refused(report, say, "this package's queues")
    return report


async def down(
    db: Any, prefix: str, *, say: Callable[[str], None] = print, sharded: Optional[bool] = None
) -> MoveReport:
    """Every group of this package's queues back into harel's transport (see the module).
    `sharded` as for `up`."""
    names, (queues_name, overflow_name) = Names(prefix), queue_names(prefix)
    messages, locks, counters = db[names.messages], db[names.transport_locks], db[names.transport_counters]
    queues, overflow = db[queues_name], db[overflow_name]
    report = MoveReport("down")
    scope = await _scope(db, prefix, sharded)
    async for queue in queues.find({"$or": [WAITING, {"hb_block": {"$exists": True}}]}):
        group = queue["_id"]
        spilled = await overflow.find({"g": group, **_part(scope, group)}).sort("_id", 1).to_list(None)
        texts = [m["e"] for m in queue.get("q") or ()] + [m["e"] for m in spilled]
        block = queue.get("hb_block")
        if block is None:
            if not texts:
                continue
            if await messages.find_one({"group_id": group}, {"_id": 1}) is not None:
                report.refused.append(group)
                continue
            top = await counters.find_one_and_update(
                {"_id": "seq"}, {"$inc": {"n": len(texts)}}, upsert=True, return_document=ReturnDocument.AFTER
            )
            block = [int(top["n"]) - len(texts) + 1, int(top["n"])]
            # the reserved seqs, recorded before any is used: a repeated run reuses them
            await queues.update_one(
                {**_key(scope, group), "hb_block": {"$exists": False}}, {"$set": {"hb_block": block}}
            )
            queue = await queues.find_one(_key(scope, group)) or queue
            block = queue["hb_block"]
        rows = [{"_id": block[0] + i, "group_id": group, "event": t} for i, t in enumerate(texts)]
        if rows:  # step 1
            try:
                await messages.insert_many(rows, ordered=False)
            except BulkWriteError as exc:  # written by an earlier run: the same ids, the same messages
                if any(e.get("code") != 11000 for e in exc.details.get("writeErrors", [])):
                    raise
        ready = {"available_at": 0.0, "token": None, "priority": int(queue.get("priority") or 0)}
        await locks.update_one({"_id": group}, {"$setOnInsert": ready}, upsert=True)  # step 2
        await overflow.delete_many({"g": group, **_part(scope, group)})  # step 3
        await queues.delete_one(_key(scope, group))
        report.groups += 1
        report.messages += len(rows)
    _say_refused(report, say, "harel's transport")
    return report


def _say_refused(report: MoveReport, say: Callable[[str], None], where: str) -> None:
    if report.refused:
        raise MoveRefused(
            f"{len(report.refused)} group(s) already hold messages in {where} "
            f"({', '.join(repr(g) for g in report.refused[:5])}{'...' if len(report.refused) > 5 else ''}): "
            f"something still publishes; stop the publishers as well as the workers, then run it again "
            f"({report.groups} group(s), {report.messages} message(s) moved so far)"
        )
    say(f"moved {report.messages} message(s) of {report.groups} group(s) {report.direction}")
