"""The transport's operations, written once, free of I/O: publish, claim, ack and nack as
generators of the calls of `harel_beanie.core.calls`, which both transport shells run.

Why this module exists: harel's transport contract (one FIFO per group, at most one message
of a group in flight, leases that expire, parked nacks, priorities) is kept here with the
fewest round trips a message can take, one per operation, on the queue documents of
`harel_beanie.core.queue_documents`. The rules, and the argument for each:

Rule 1. A publish is one conditional upsert of the group's queue document that appends the
        message, when the group keeps its messages inline and has room. There is no global
        counter: a group's order is its array's order, and `pending` counts the inline
        messages in the same write.
Rule 2. A group with no room, or a message too large, spills: the message becomes an
        overflow document, and the queue document is marked `spill` with one extra count
        (`pending` = inline messages + 1 while spilling), so the group stays claimable for as
        long as its overflow may hold anything. While a group spills, every later message
        spills too, so a publisher's messages keep their order. The overflow document is
        inserted BEFORE the queue document is told (`spilled` is bumped, and `spill` set with
        its extra count if it was not): a publish cut short between the two leaves a document
        a claim still finds while the group spills (delivered, perhaps besides the copy
        harel's relay publishes again: harel's dedupe takes one of them).
Rule 3. A claim is one `find_one_and_update` over the `hb_claim` index: the due group served
        longest ago (new groups first), leased by a fresh token until `now + visibility`,
        its head returned with it (`$slice`). With its inline messages done, a spilling
        group's head is its oldest overflow document (one more round trip, which also marks
        that document with the token). Overflow documents are never counted one by one: the
        overflow is what the documents say, so one cut short never strands another.
Rule 4. An ack, a nack and the overflow head's removal are each conditional on the lease's
        token: a lease that expired and was taken by another worker changes nothing. An ack
        pops the head (or deletes the overflow document), frees the group and puts it at the
        back of the round-robin; it bumps `wake`, since a message published while the head
        was in flight is claimable only now.
Rule 5. A claim that finds a group with nothing to deliver (its inline messages and its
        overflow gone) ends the spill and sets the counts to zero, conditional on no publish
        having come in or spilled since the claim read the group (`published`, `spilled`):
        a publish that did then makes the reset miss, and the group is looked at again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

from bson import ObjectId
from harel.engine.transport import Lease
from harel.spec.states import Event
from pymongo.errors import DuplicateKeyError

from harel_beanie.core.arguments import BadArgumentType, require_int, require_seconds, require_str
from harel_beanie.core.calls import CreateIndexes, DeleteOne, Find, FindOneAndUpdate, Flow, InsertOne, UpdateOne
from harel_beanie.core.queue_documents import INLINE_BYTES, INLINE_MAX, WAITING
from harel_beanie.transport.settings import MAX_PARK, MAX_VISIBILITY

#: a priority is a small int (harel's transports use 0..4); anything in this range is kept
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
#: claims of groups found empty (counts set right) before a claim gives up for this call
_CLAIM_TRIES = 8

_HEAD = {"q": {"$slice": 1}, "qn": 1, "pending": 1, "spill": 1, "acked": 1, "published": 1, "spilled": 1}


@dataclass
class QueueLease(Lease):
    """harel's `Lease`, with what this transport needs back at ack: the head's size in
    bytes (inline), or the overflow document holding it."""

    size: int = 0
    overflow_id: Optional[ObjectId] = None


@dataclass
class QueueState:
    """What a transport instance knows between operations: its clock."""

    clock: Callable[[], float]


def _event(value: Any) -> Event:
    if not isinstance(value, Event):
        raise BadArgumentType("event", "a harel Event", value)
    return value


def publish(st: QueueState, group_id: str, event: Event, priority: int = 0) -> Flow[None]:
    group_id = require_str("group_id", group_id)
    priority = require_int("priority", priority, low=PRIORITY_RANGE[0], high=PRIORITY_RANGE[1])
    text = _event(event).model_dump_json()
    size = len(text.encode())
    new_group = {"available_at": 0.0, "token": None, "priority": priority, "acked": 0}
    if size <= INLINE_BYTES:
        room = {"_id": group_id, "spill": {"$ne": True}, "qn": {"$lt": INLINE_MAX}, "qb": {"$lte": INLINE_BYTES - size}}
        append = {
            "$push": {"q": {"e": text}},
            "$inc": {"qn": 1, "qb": size, "pending": 1, "published": 1, "wake": 1},
            "$setOnInsert": {**new_group, "spill": False},
        }
        try:
            yield UpdateOne("enqueue", room, append, upsert=True)  # Rule 1
            return
        except DuplicateKeyError:
            pass  # the group exists and has no room (or spills): Rule 2
    yield InsertOne("overflow", {"_id": ObjectId(), "g": group_id, "e": text})
    told = {"$inc": {"spilled": 1, "published": 1, "wake": 1}}
    for _ in range(3):  # a racing publish may start the spill between the two forms
        if (yield UpdateOne("enqueue", {"_id": group_id, "spill": True}, told)):
            return
        start = {**told, "$set": {"spill": True}}
        start["$inc"] = {**told["$inc"], "pending": 1}  # the extra count the spill holds
        try:
            yield UpdateOne("enqueue", {"_id": group_id, "spill": {"$ne": True}}, {**start, "$setOnInsert": new_group},
                            upsert=True)  # fmt: skip
            return
        except DuplicateKeyError:
            continue  # another publish set `spill` first: tell it as a spilling group


def claim(st: QueueState, worker_id: str, visibility: float, min_priority: int = 0) -> Flow[Optional[QueueLease]]:
    worker_id = require_str("worker_id", worker_id)
    visibility = require_seconds("visibility", visibility, positive=True, high=MAX_VISIBILITY)
    min_priority = require_int("min_priority", min_priority, low=PRIORITY_RANGE[0], high=PRIORITY_RANGE[1])
    now = st.clock()
    due = {**WAITING, "available_at": {"$lte": now}, "priority": {"$gte": min_priority}}
    for _ in range(_CLAIM_TRIES):
        token = f"{worker_id}:{uuid.uuid4().hex}"
        lease = {"$set": {"token": token, "available_at": now + visibility}}
        doc = yield FindOneAndUpdate("queues", due, lease, sort=[("available_at", 1), ("_id", 1)], projection=_HEAD)
        if doc is None:
            return None
        group_id, seq = doc["_id"], int(doc.get("acked") or 0) + 1
        if doc.get("q"):
            text = doc["q"][0]["e"]
            event = Event.model_validate_json(text)
            return QueueLease(seq, group_id, event, token=token, size=len(text.encode()))
        head = yield FindOneAndUpdate("overflow", {"g": group_id}, {"$set": {"tok": token}}, sort=[("_id", 1)])
        if head is not None:
            event = Event.model_validate_json(head["e"])
            return QueueLease(seq, group_id, event, token=token, overflow_id=head["_id"])
        # nothing to deliver: the spill is over, or a count is off (Rule 5)
        same = {"_id": group_id, "token": token, "published": doc.get("published"), "spilled": doc.get("spilled")}
        fixed = {"pending": 0, "qn": 0, "qb": 0, "spill": False, "token": None, "available_at": now}
        yield UpdateOne("queues", same, {"$set": fixed})
    return None


def _lease(value: Any) -> Lease:
    if not isinstance(value, Lease):
        raise BadArgumentType("lease", "a Lease this transport's claim returned", value)
    require_str("lease.group_id", value.group_id)
    require_str("lease.token", value.token)
    return value


def ack(st: QueueState, lease: Lease) -> Flow[None]:
    lease = _lease(lease)
    freed = {"$set": {"token": None, "available_at": st.clock()}, "$currentDate": {"touched": True}}
    held = {"_id": lease.group_id, "token": lease.token}
    overflow_id = lease.overflow_id if isinstance(lease, QueueLease) else None
    if overflow_id is None:
        size = lease.size if isinstance(lease, QueueLease) else len(lease.event.model_dump_json().encode())
        pop = {"$pop": {"q": -1}, "$inc": {"qn": -1, "qb": -size, "pending": -1, "acked": 1, "wake": 1}}
        yield UpdateOne("queues", held, {**pop, **freed})  # Rule 4
        return
    # the head goes, then the lease (overflow documents are not counted: Rule 3). Each is
    # conditional on the token, so either is done once: an ack sent again after a lost reply
    # finds the document gone and still releases a lease it holds
    yield DeleteOne("overflow", {"_id": overflow_id, "tok": lease.token})
    yield UpdateOne("queues", held, {"$inc": {"acked": 1, "wake": 1}, **freed})


def nack(st: QueueState, lease: Lease, delay: float = 0.0) -> Flow[None]:
    lease = _lease(lease)
    delay = require_seconds("delay", delay, high=MAX_PARK)
    held = {"_id": lease.group_id, "token": lease.token}
    if delay > 0:
        # parked: the token stays, so the head is not claimed again before the delay passes
        yield UpdateOne("queues", held, {"$set": {"available_at": st.clock() + delay}})
    else:
        yield UpdateOne("queues", held, {"$set": {"available_at": 0.0, "token": None}, "$inc": {"wake": 1}})


def next_due(st: QueueState) -> Flow[Optional[float]]:
    """When the next waiting group becomes claimable (a lease or a park ends), if any: what
    an idle claimer waits for when nothing is claimable now."""
    docs = yield Find("queues", WAITING, {"available_at": 1}, sort=[("available_at", 1), ("_id", 1)], limit=1)
    return float(docs[0]["available_at"]) if docs else None


def setup(st: QueueState, queue_indexes: list[Any], overflow_indexes: list[Any]) -> Flow[None]:
    """The indexes the operations read (idempotent)."""
    yield CreateIndexes("queues", queue_indexes)
    yield CreateIndexes("overflow", overflow_indexes)
