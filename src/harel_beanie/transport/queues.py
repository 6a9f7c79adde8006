"""The transport's operations, written once, free of I/O: publish, claim, ack and nack as
generators of the calls of `harel_beanie.core.calls`, which both transport shells run.

Why this module exists: harel's transport contract (one FIFO per group, at most one message
of a group in flight, leases that expire, parked nacks, priorities) is kept here with the
fewest round trips a message can take, on the queue documents of
`harel_beanie.transport.documents`. Round trips per path (each asserted on the wire in
tests/transport/test_transport.py): publish inline 1, into a full group 4 (it starts the spill), into
a spilling group 3, a message over the inline bound 3 (2 into a spilling group); claim of a
fresh group's inline head 2, of a served group's 3, of an overflow head one more, one that
finds nothing 2 (one window of each band, the last claim just before), one that finds a
spilled group drained 5 (Rule 5); a claim of k groups 2 (Rule 8, in
tests/transport/test_transport_claim_structure.py); ack inline 1, of an overflow head 2;
nack 1. An idle async claim adds `next_due` (1) and the store's `next_timer` (1, on the
store's client), then a claim per wake-up. The rules, and the argument for each:

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
Rule 3. A claim takes the due group first in the claim order: the lowest `available_at`
        (then `_id`), its key. A group that is fresh (new, or drained since: Rule 6) has
        its publish time less `FRESH_OFFSET` (544 years), so every fresh group comes before
        every served one (harel's order: a group never served goes first), in publish order;
        a served group's key is when it became claimable (its last ack, a nack, the end of
        its lease or park). A group is due when its key is at or before now: a lease and a
        park put it in the future, so a group in flight is never due, and one whose lease
        expired is due again without a write (the visibility timeout). The claim reads the
        key in windows (`harel_beanie.transport.claim_walk`: the fresh band's, then the
        served band's, each from where the last claim found its lowest), each a filter of
        exactly the window and `hb_claim`'s own partial filter (`pending > 0`): SecantusDB
        plans a range only on an index led by the field, when the rest of the filter is the
        index's partial filter, and reads every match whatever the limit; so a window
        costs the few groups it holds, not the queue (a claim with the priority or the
        partitions in its filter read all 10,000 queued groups, 0.4-1.3 s). The priority and
        the partitions owned are checked on the documents read (on a mongos the partition
        is in the filter: Rule 7). The argument that the order is kept: the windows tile the
        band upward from its start and the first is open below, so the first due group read
        is the lowest one; the start is the lowest key the last claim read and did not take
        (or where its reads ended), and a key below it can only come from a write since,
        which that first window reads. The head comes with the group (`$slice`) as read;
        with its inline messages done, a spilling group's head is its oldest overflow
        document (one more round trip, which also marks that document with the token).
        Overflow documents are never counted one by one: the overflow is what the documents
        say, so one cut short never strands another.
Rule 4. An ack, a nack and the overflow head's removal are each conditional on the lease's
        token: a lease that expired and was taken by another worker changes nothing. An ack
        pops the head (or deletes the overflow document), frees the group and puts it at the
        back of the round-robin; it bumps `wake`, since a message published while the head
        was in flight is claimable only now.
Rule 5. A claim that finds a group with nothing to deliver (its inline messages and its
        overflow gone) ends the spill and sets the counts to zero, conditional on no publish
        having come in or spilled since the claim read the group (`published`, `spilled`):
        a publish that did then makes the reset miss, and the claim gives the group back,
        claimable at once.
Rule 6. A group's priority is set by the publish that finds it drained (`pending` 0, no
        lease), and kept while it holds a message, as harel's transports do (they delete a
        drained group's lock document; a queue document outlives its drain). The publish
        decides it in its own write, an update pipeline reading the document as it was, so
        it stays one round trip. A group that spilled is drained once a claim has found its
        overflow empty (Rule 5): until then a publish into it keeps its priority. The same
        publish makes a drained group fresh (its key in the fresh band, Rule 3), as harel's
        transports make it a new group.
Rule 7. Every queue and overflow document carries its group's partition (`part`, the
        partition of the group's execution). A claim and `next_due` read only the partitions
        the transport's scope owns (all of them without an owner). Through a mongos a claim
        names one partition at a time, going round the partitions it owns, so it is a
        `findAndModify` on the whole shard key; it carries the partition lease's epoch as a
        fence (`ep`): a claimer whose lease was taken over by a newer owner no longer takes
        a group that owner has claimed. On one server one claim covers every partition it
        owns (it keeps the groups read of those). A claim that comes back for a partition
        whose lease ended meanwhile gives the group back at once.
Rule 8. A claim leases a group as it read it: one update conditional on the token, key and
        count of acks it read (`_id`, `token`, `available_at`, `acked`), setting its token
        and `available_at` to the lease's end. Anything that changed the group since the
        read (another claim, an ack popping the head read, a nack, a reset) changed one of
        them, so the update misses and the claim goes on to the next group read: the head
        handed over is the head the lease holds, and two claims never hold one group. (A
        `find_one_and_update` would take one round trip, but SecantusDB reads the whole
        collection for one, even by `_id`: 115 ms with 10,000 queued.) A claim of k groups
        (`claim_many`) sends the k conditional updates in one unordered bulk write, one
        token for all (every write names its group too); when fewer than k took, one read
        of the k by that token says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

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
    Flow,
    InsertOne,
    UpdateOne,
)
from harel_beanie.core.documents import SCHEMA_MARKER_ID
from harel_beanie.core.limits import MAX_PARK
from harel_beanie.core.partitions import PART, PartitionScope
from harel_beanie.transport.claim_walk import FRESH_OFFSET, ClaimWalk
from harel_beanie.transport.documents import INLINE_BYTES, INLINE_MAX, WAITING

#: a priority is a small int (harel's transports use 0..4); anything in this range is kept
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
#: the most groups one claim leases (a worker's free slots: harel's AsyncWorker runs 256)
MAX_PREFETCH = 1024

#: what a claim reads of each due group: its head, and what its lease is conditional on
_HEAD = {
    "q": {"$slice": 1},
    "pending": 1,
    "acked": 1,
    "published": 1,
    "spilled": 1,
    "part": 1,
    "token": 1,
    "available_at": 1,
    "priority": 1,
}
#: the claim order (Rule 3)
_ORDER = [("available_at", 1), ("_id", 1)]


@dataclass
class QueueLease(Lease):
    """harel's `Lease`, with what this transport needs back at ack: the head's size in
    bytes (inline), or the overflow document holding it."""

    size: int = 0
    overflow_id: Optional[ObjectId] = None
    priority: int = 0  # the group's, as claimed: a prefetched lease goes to a claim it suits


@dataclass
class QueueState:
    """What a transport instance knows between operations: its clock, and the partitions it
    works on (shared with its store and partition owner in a worker)."""

    clock: Callable[[], float]
    scope: PartitionScope = field(default_factory=PartitionScope)
    # per claim filter: where its windows of the claim key begin (Rule 3)
    walks: dict[str, ClaimWalk] = field(default_factory=dict)


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


def _write(now: float, priority: int, fields: dict[str, Any], adds: dict[str, int]) -> list[dict[str, Any]]:
    """An update pipeline (one stage, so every expression reads the document as it was):
    `fields` set, `adds` added to counts that may be missing, a new group's defaults, and the
    priority `priority` if the group was drained (nothing waiting, no lease), as harel's
    transports give it (Rule 6)."""
    drained = {"$and": [{"$lte": [_old("pending", 0), 0]}, {"$eq": [_old("token", None), None]}]}
    kept = {"token": None, "acked": 0, "spill": False}
    return [
        {
            "$set": {
                **{k: _old(k, v) for k, v in kept.items()},
                "priority": {"$cond": [drained, priority, _old("priority", priority)]},
                # a drained (or new) group is fresh: its key is in the fresh band (Rule 3)
                "available_at": {"$cond": [drained, now - FRESH_OFFSET, _old("available_at", now)]},
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
            st.clock(), priority, {**pushed, PART: part}, {"qn": 1, "qb": size, "pending": 1, "published": 1, "wake": 1}
        )
        try:
            yield UpdateOne("enqueue", room, append, upsert=True)  # Rule 1
            return
        except DuplicateKeyError:
            pass  # the group exists and has no room (or spills): Rule 2
    yield InsertOne("overflow", {"_id": ObjectId(), "g": group_id, "e": text, PART: part})
    told = {"$inc": {"spilled": 1, "published": 1, "wake": 1}}
    # `pending` + 1: the extra count the spill holds
    start = _write(
        st.clock(), priority, {"spill": True, PART: part}, {"spilled": 1, "published": 1, "wake": 1, "pending": 1}
    )
    for _ in range(3):  # a racing publish may start the spill between the two forms
        if (yield UpdateOne("enqueue", {"_id": group_id, "spill": True}, told)):
            return
        try:
            yield UpdateOne("enqueue", {"_id": group_id, "spill": {"$ne": True}}, start, upsert=True)
            return
        except DuplicateKeyError:
            continue  # another publish set `spill` first: tell it as a spilling group


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
        yield UpdateOne("queues", held, {"$set": {"available_at": st.clock(), "token": None}, "$inc": {"wake": 1}})


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
