"""The transport's claim, written once, free of I/O: `claim` and `claim_many` as generators of
the calls of `harel_beanie.core.calls`, which both transport shells run.

Why this module exists: the claim is the transport's largest operation (windows of the claim
key in two bands, a conditional lease of each group read, the overflow's head, the give-back
of a group it may not keep), and its rules are `harel_beanie.transport.queues`' Rules 3, 5, 7
and 8, which that module states with the other operations; it is kept apart so each module
holds one job.
"""

from __future__ import annotations

import uuid
from typing import Any, Generator, Iterator, Optional

from harel.spec.states import Event

from harel_beanie.core.arguments import require_int, require_seconds, require_str
from harel_beanie.core.calls import (
    BulkWrite,
    Find,
    FindOneAndUpdate,
    Flow,
    UpdateOne,
)
from harel_beanie.core.limits import MAX_VISIBILITY
from harel_beanie.core.partitions import PART, PartitionScope
from harel_beanie.transport.claim_walk import BANDS, ClaimWalk
from harel_beanie.transport.documents import WAITING
from harel_beanie.transport.queues import _HEAD, _ORDER, MAX_PREFETCH, PRIORITY_RANGE, QueueLease, QueueState


def claim(st: QueueState, worker_id: str, visibility: float, min_priority: int = 0) -> Flow[Optional[QueueLease]]:
    """harel's claim: the one due group first in the claim order (Rule 3), leased."""
    leases = yield from claim_many(st, worker_id, visibility, 1, min_priority)
    return leases[0] if leases else None


def claim_many(
    st: QueueState, worker_id: str, visibility: float, k: int, min_priority: int = 0
) -> Flow[list[QueueLease]]:
    """Up to `k` due groups, first in the claim order, each leased on its own (Rule 8)."""
    worker_id = require_str("worker_id", worker_id)
    visibility = require_seconds("visibility", visibility, positive=True, high=MAX_VISIBILITY)
    k = require_int("k", k, low=1, high=MAX_PREFETCH)
    min_priority = require_int("min_priority", min_priority, low=PRIORITY_RANGE[0], high=PRIORITY_RANGE[1])
    until = st.clock() + visibility
    leases: list[QueueLease] = []
    for scoped, fence in _claim_scopes(st.scope):
        leases += yield from _claim_in(st, worker_id, until, scoped, fence, k - len(leases), min_priority)
        if len(leases) >= k:
            break
    return leases


def _claim_scopes(scope: PartitionScope) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """The filters a claim tries in turn (Rule 7), each with the fence it sets: on one
    server a single one, sent as no filter (the partitions owned are checked on the documents
    read, Rule 3), or none when it owns no partition now."""
    owned = scope.owned()
    if not scope.sharded:
        if scope.sweep_filter() is not None:
            yield {}, {}
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
    st: QueueState,
    worker_id: str,
    until: float,
    due: dict[str, Any],
    fence: dict[str, Any],
    want: int = 1,
    min_priority: int = PRIORITY_RANGE[0],
) -> Flow[list[QueueLease]]:
    """Rules 3, 5 and 8 within one claim filter: the fresh band's windows, then the served
    band's, read in turn (`harel_beanie.transport.claim_walk`), the due groups they hold
    leased `want` at a time."""
    token = f"{worker_id}:{uuid.uuid4().hex}"
    leases: list[QueueLease] = []
    tried: set[str] = set()  # read and tried, by this claim
    for band in BANDS:
        if len(leases) >= want:
            break
        # one walk per band and partition read (not per epoch: a takeover keeps what it learnt)
        walk = st.walks.setdefault(f"{band.name} {due.get(PART)}", ClaimWalk())
        taken: set[str] = set()  # read and leased: their key has moved (Rule 8)
        windows = walk.windows(band.floor, band.ceiling(st.clock()), band.inclusive, want)
        step = next(windows, None)
        while step is not None and len(leases) < want:
            bounds, limit = step
            docs = yield Find("queues", {"available_at": bounds, **WAITING, **due}, _HEAD, sort=_ORDER, limit=limit)
            step = _send(windows, docs)
            owned = st.scope.owned()
            usable = [
                d
                for d in docs
                if d["_id"] not in tried
                and int(d.get("priority") or 0) >= min_priority
                and (owned is None or st.scope.sharded or _part(d) in owned)
            ]
            while usable and len(leases) < want:
                batch, usable = usable[: want - len(leases)], usable[want - len(leases) :]
                tried.update(d["_id"] for d in batch)
                won = yield from _lease_all(batch, token, until, due, fence)
                taken.update(d["_id"] for d in won)
                leases += yield from _heads(st, won, token)
        windows.close()
        walk.settle(taken)
    return leases


def _heads(st: QueueState, won: list[dict[str, Any]], token: str) -> Flow[list[QueueLease]]:
    """The leases of the groups a claim just won, in claim order (Rules 5 and 7)."""
    leases: list[QueueLease] = []
    owned = st.scope.owned()
    for doc in won:
        group_id, part = doc["_id"], doc.get(PART)
        if owned is not None and (0 if part is None else part) not in owned:  # no part: written before them
            # its partition's lease ended while the claim was on its way (Rule 7): give it back
            yield UpdateOne(
                "queues", {"_id": group_id, "token": token}, {"$set": {"available_at": st.clock(), "token": None}}
            )
            continue
        lease = yield from _head(st, doc, token)
        if lease is not None:
            leases.append(lease)
    return leases


def _send(windows: Generator[Any, Any, None], docs: list[dict[str, Any]]) -> Any:
    try:
        return windows.send(docs)
    except StopIteration:
        return None


def _part(doc: dict[str, Any]) -> int:
    part = doc.get(PART)
    return 0 if part is None else int(part)  # no part: written before partitions, partition 0's


def _lease_all(
    docs: list[dict[str, Any]], token: str, until: float, due: dict[str, Any], fence: dict[str, Any]
) -> Flow[list[dict[str, Any]]]:
    """Lease each of `docs` as it was read: a write conditional on the lease and the count
    of acks it read (Rule 8), in one round trip; the documents whose write took."""
    lease = {"$set": {"token": token, "available_at": until, **fence}}

    def as_read(d: dict[str, Any]) -> dict[str, Any]:
        return {
            "_id": d["_id"],
            "token": d.get("token"),
            "available_at": d["available_at"],
            "acked": d.get("acked"),
            **WAITING,
            **due,
        }

    if len(docs) == 1:
        return docs if (yield UpdateOne("queues", as_read(docs[0]), lease)) else []
    taken = yield BulkWrite("queues", tuple(UpdateOne("queues", as_read(d), lease) for d in docs))
    if taken == len(docs):
        return docs
    if not taken:
        return []
    # another claimer took some of them between the read and the write: which ones (on a
    # mongos, in the one partition they were read from)
    mine = {"_id": {"$in": [d["_id"] for d in docs]}, "token": token, **{k: v for k, v in due.items() if k == PART}}
    ids = {d["_id"] for d in (yield Find("queues", mine, {"_id": 1}))}
    return [d for d in docs if d["_id"] in ids]


def _head(st: QueueState, doc: dict[str, Any], token: str) -> Flow[Optional[QueueLease]]:
    """The head of a group just leased by `token`, read with it (inline) or marked in its
    overflow; None when it had nothing to deliver (Rule 5: its counts set right)."""
    group_id, seq = doc["_id"], int(doc.get("acked") or 0) + 1
    priority = int(doc.get("priority") or 0)
    if doc.get("q"):
        text = doc["q"][0]["e"]
        event = Event.model_validate_json(text)
        return QueueLease(seq, group_id, event, token=token, size=len(text.encode()), priority=priority)
    head = yield FindOneAndUpdate(
        "overflow", {"g": group_id}, {"$set": {"tok": token}}, sort=[("_id", 1)], after=True
    )  # the document as marked (SecantusDB's pre-image is the document as it found it)
    if head is not None:
        event = Event.model_validate_json(head["e"])
        return QueueLease(seq, group_id, event, token=token, overflow_id=head["_id"], priority=priority)
    # nothing to deliver: the spill is over, or a count is off (Rule 5)
    same = {"_id": group_id, "token": token, "published": doc.get("published"), "spilled": doc.get("spilled")}
    fixed = {"pending": 0, "qn": 0, "qb": 0, "spill": False, "token": None, "available_at": st.clock()}
    if not (yield UpdateOne("queues", same, {"$set": fixed})):
        # a publish came in since the read: the group goes back as it is, claimable now
        released = {"$set": {"token": None, "available_at": st.clock()}, "$inc": {"wake": 1}}
        yield UpdateOne("queues", {"_id": group_id, "token": token}, released)
    return None
