"""The transport's operations, written once, free of I/O: publish, claim, ack and nack as
generators of the calls of `harel_beanie.core.calls`, which both transport shells run.

Why this module exists: harel's transport contract (one FIFO per group, at most one message
of a group in flight, leases that expire, parked nacks, priorities) is kept here with the
fewest round trips a message can take, on the queue documents of
`harel_beanie.transport.documents`. Round trips per path (each asserted on the wire in
tests/transport/test_transport.py): publish inline 1, into a full group 4 (it starts the spill), into
a spilling group 3, a message over the inline bound 3 (2 into a spilling group); claim of an
inline head 1, of an overflow head 2, one that finds nothing 1, one that finds a spilled
group drained 4 (Rule 5, then it looks again); ack inline 1, of an overflow head 2; nack 1.
An idle async claim adds `next_due` (1) and the store's `next_timer` (1, on the store's
client), then a claim per wake-up. The rules, and the argument for each:

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
        its head returned with it (`$slice`), read from the document as leased (the
        post-image: see `_claim_in`). With its inline messages done, a spilling
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
Rule 6. A group's priority is set by the publish that finds it drained (`pending` 0, no
        lease), and kept while it holds a message, as harel's transports do (they delete a
        drained group's lock document; a queue document outlives its drain). The publish
        decides it in its own write, an update pipeline reading the document as it was, so
        it stays one round trip. A group that spilled is drained once a claim has found its
        overflow empty (Rule 5): until then a publish into it keeps its priority.
Rule 7. Every queue and overflow document carries its group's partition (`part`, the
        partition of the group's execution). A claim and `next_due` read only the partitions
        the transport's scope owns (all of them without an owner). Through a mongos a claim
        names one partition at a time, going round the partitions it owns, so it is a
        `findAndModify` on the whole shard key; it carries the partition lease's epoch as a
        fence (`ep`): a claimer whose lease was taken over by a newer owner no longer takes
        a group that owner has claimed. On one server one claim covers every partition it
        owns. A claim that comes back for a partition whose lease ended meanwhile gives the
        group back at once.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from bson import ObjectId
from harel.engine.transport import Lease
from harel.spec.states import Event
from pymongo.errors import DuplicateKeyError

from harel_beanie.core.arguments import BadArgumentType, require_int, require_seconds, require_str
from harel_beanie.core.calls import (
    CreateIndexes,
    DeleteOne,
    Find,
    FindOne,
    FindOneAndUpdate,
    Flow,
    InsertOne,
    UpdateOne,
)
from harel_beanie.core.documents import SCHEMA_MARKER_ID
from harel_beanie.core.partitions import PART, PartitionScope
from harel_beanie.transport.documents import INLINE_BYTES, INLINE_MAX, WAITING
from harel_beanie.transport.settings import MAX_PARK, MAX_VISIBILITY

#: a priority is a small int (harel's transports use 0..4); anything in this range is kept
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
#: claims of groups found empty (counts set right) before a claim gives up for this call
_CLAIM_TRIES = 8

_HEAD = {"q": {"$slice": 1}, "qn": 1, "pending": 1, "spill": 1, "acked": 1, "published": 1, "spilled": 1, "part": 1}


@dataclass
class QueueLease(Lease):
    """harel's `Lease`, with what this transport needs back at ack: the head's size in
    bytes (inline), or the overflow document holding it."""

    size: int = 0
    overflow_id: Optional[ObjectId] = None


@dataclass
class QueueState:
    """What a transport instance knows between operations: its clock, and the partitions it
    works on (shared with its store and partition owner in a worker)."""

    clock: Callable[[], float]
    scope: PartitionScope = field(default_factory=PartitionScope)


def queue_state(
    clock: Callable[[], float], sharded: Optional[bool], partitions: Optional[PartitionScope]
) -> QueueState:
    """A transport shell's state: its clock and its partition scope (`partitions`, shared
    with a store and a partition owner, or a new one over every partition), with `sharded`
    fixed if given (None: asked of the server at set-up)."""
    if sharded is not None and not isinstance(sharded, bool):
        raise BadArgumentType("sharded", "True, False or None", sharded)
    if partitions is not None and not isinstance(partitions, PartitionScope):
        raise BadArgumentType("partitions", "a PartitionScope", partitions)
    state = QueueState(clock, partitions if partitions is not None else PartitionScope())
    if sharded is not None:
        state.scope.sharded = sharded
    return state


def _event(value: Any) -> Event:
    if not isinstance(value, Event):
        raise BadArgumentType("event", "a harel Event", value)
    return value


def _old(field: str, default: Any) -> dict[str, Any]:
    return {"$ifNull": [f"${field}", default]}


def _write(priority: int, fields: dict[str, Any], adds: dict[str, int]) -> list[dict[str, Any]]:
    """An update pipeline (one stage, so every expression reads the document as it was):
    `fields` set, `adds` added to counts that may be missing, a new group's defaults, and the
    priority `priority` if the group was drained (nothing waiting, no lease), as harel's
    transports give it (Rule 6)."""
    drained = {"$and": [{"$lte": [_old("pending", 0), 0]}, {"$eq": [_old("token", None), None]}]}
    kept = {"available_at": 0.0, "token": None, "acked": 0, "spill": False}
    return [
        {
            "$set": {
                **{k: _old(k, v) for k, v in kept.items()},
                "priority": {"$cond": [drained, priority, _old("priority", priority)]},
                **{k: {"$add": [_old(k, 0), n]} for k, n in adds.items()},
                **fields,
            }
        }
    ]


def publish(st: QueueState, group_id: str, event: Event, priority: int = 0) -> Flow[None]:
    group_id = require_str("group_id", group_id)
    priority = require_int("priority", priority, low=PRIORITY_RANGE[0], high=PRIORITY_RANGE[1])
    text = _event(event).model_dump_json()
    size = len(text.encode())
    part = st.scope.part_of(group_id)  # Rule 7
    if size <= INLINE_BYTES:
        room = {"_id": group_id, "spill": {"$ne": True}, "qn": {"$lt": INLINE_MAX}, "qb": {"$lte": INLINE_BYTES - size}}
        # `$literal`: the message is a value, never an expression or a field path
        pushed = {"q": {"$concatArrays": [_old("q", []), {"$literal": [{"e": text}]}]}}
        append = _write(
            priority, {**pushed, PART: part}, {"qn": 1, "qb": size, "pending": 1, "published": 1, "wake": 1}
        )
        try:
            yield UpdateOne("enqueue", room, append, upsert=True)  # Rule 1
            return
        except DuplicateKeyError:
            pass  # the group exists and has no room (or spills): Rule 2
    yield InsertOne("overflow", {"_id": ObjectId(), "g": group_id, "e": text, PART: part})
    told = {"$inc": {"spilled": 1, "published": 1, "wake": 1}}
    # `pending` + 1: the extra count the spill holds
    start = _write(priority, {"spill": True, PART: part}, {"spilled": 1, "published": 1, "wake": 1, "pending": 1})
    for _ in range(3):  # a racing publish may start the spill between the two forms
        if (yield UpdateOne("enqueue", {"_id": group_id, "spill": True}, told)):
            return
        try:
            yield UpdateOne("enqueue", {"_id": group_id, "spill": {"$ne": True}}, start, upsert=True)
            return
        except DuplicateKeyError:
            continue  # another publish set `spill` first: tell it as a spilling group


def claim(st: QueueState, worker_id: str, visibility: float, min_priority: int = 0) -> Flow[Optional[QueueLease]]:
    worker_id = require_str("worker_id", worker_id)
    visibility = require_seconds("visibility", visibility, positive=True, high=MAX_VISIBILITY)
    min_priority = require_int("min_priority", min_priority, low=PRIORITY_RANGE[0], high=PRIORITY_RANGE[1])
    now = st.clock()
    due = {**WAITING, "available_at": {"$lte": now}, "priority": {"$gte": min_priority}}
    for scoped, fence in _claim_scopes(st.scope):
        found = yield from _claim_in(st, worker_id, now + visibility, {**due, **scoped}, fence)
        if found is not None:
            return found
    return None


def _claim_scopes(scope: PartitionScope) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """The filters a claim tries in turn (Rule 7), each with the fence it sets."""
    owned = scope.owned()
    if not scope.sharded:
        scoped = scope.sweep_filter()
        if scoped is not None:
            yield scoped, {}
        return
    parts = list(range(scope.parts)) if owned is None else sorted(owned)
    if not parts:
        return
    start = scope.turn % len(parts)
    scope.turn += 1  # the next claim starts at the next partition: round-robin between them
    for p in parts[start:] + parts[:start]:
        if owned is None:
            yield {PART: p}, {}
        else:
            yield {PART: p, "ep": {"$not": {"$gt": owned[p]}}}, {"ep": owned[p]}


def _claim_in(
    st: QueueState, worker_id: str, until: float, due: dict[str, Any], fence: dict[str, Any]
) -> Flow[Optional[QueueLease]]:
    """Rules 3 and 5 within one claim filter."""
    now = st.clock()
    for _ in range(_CLAIM_TRIES):
        token = f"{worker_id}:{uuid.uuid4().hex}"
        lease = {"$set": {"token": token, "available_at": until, **fence}}
        # The head is read from the document as the lease left it (`after`): the lease
        # changes no field read here, and a server whose pre-image is the document as it
        # found it, not as it wrote it (SecantusDB), would otherwise hand over a head an ack
        # had just popped, and the next ack would pop a message never delivered.
        doc = yield FindOneAndUpdate(
            "queues", due, lease, sort=[("available_at", 1), ("_id", 1)], projection=_HEAD, after=True
        )
        if doc is None:
            return None
        group_id, seq = doc["_id"], int(doc.get("acked") or 0) + 1
        owned, part = st.scope.owned(), doc.get(PART)
        if owned is not None and (0 if part is None else part) not in owned:  # no part: written before them
            # its partition's lease ended while the claim was on its way (Rule 7): give it back
            yield UpdateOne("queues", {"_id": group_id, "token": token}, {"$set": {"available_at": 0.0, "token": None}})
            return None
        if doc.get("q"):
            text = doc["q"][0]["e"]
            event = Event.model_validate_json(text)
            return QueueLease(seq, group_id, event, token=token, size=len(text.encode()))
        head = yield FindOneAndUpdate(
            "overflow", {"g": group_id}, {"$set": {"tok": token}}, sort=[("_id", 1)], after=True
        )  # as above: the document as marked
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
    yield DeleteOne("overflow", {"_id": overflow_id, "g": lease.group_id, "tok": lease.token})
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
    scoped = st.scope.sweep_filter()
    if scoped is None:
        return None  # it owns no partition now
    query = {**WAITING, **scoped}
    docs = yield Find("queues", query, {"available_at": 1}, sort=[("available_at", 1), ("_id", 1)], limit=1)
    return float(docs[0]["available_at"]) if docs else None


def setup(st: QueueState, queue_indexes: list[Any], overflow_indexes: list[Any]) -> Flow[None]:
    """The indexes the operations read (idempotent; none when both lists are empty), and the
    count of partitions the store recorded in its schema marker (the default until a store
    has set the database up: the store's set-up records the same default)."""
    if queue_indexes or overflow_indexes:
        yield CreateIndexes("queues", queue_indexes)
        yield CreateIndexes("overflow", overflow_indexes)
    marker = yield FindOne("counters", {"_id": SCHEMA_MARKER_ID}, {"parts": 1})
    parts = (marker or {}).get("parts")
    if isinstance(parts, int) and not isinstance(parts, bool) and parts > 0:
        st.scope.parts = parts
