"""The seq mint's node leases: how a store instance gets seqs no other instance issues.

The argument (why a node lease and a clock-based range give unique, increasing seqs) is in
`harel_beanie.core.seqs`, which is pure; these flows make the lease writes it relies on: take a
free or expired node, extend the lease before using a range past its recorded `hi`, give
the node back on close. They sit apart because the commit is their only other user.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, Mapping, Optional

from pymongo.errors import ConnectionFailure, DuplicateKeyError

from harel_beanie.core.calls import Find, FindOne, Flow, Increment, InsertOne, UpdateOne
from harel_beanie.core.documents import NODE_COUNTER_ID
from harel_beanie.core.flows.state import StoreState
from harel_beanie.core.seqs import (
    HAREL_SEQ_COUNTERS,
    LEASE_TTL_S,
    NODES,
    Lease,
    extended_hi,
    lease_id,
    ms_floor_above,
    new_range,
)

_LEASE_ROUNDS = 4  # lease extensions/takes one mint may need (a lost lease, then a new one)
_LEASE_PROBE = 64  # node lease documents read per round trip while looking for a free node


def mint_seqs(st: StoreState, count: int, above: int = 0) -> Flow[list[int]]:
    """`count` unique seqs above `above`, extending or taking a lease when the mint needs."""
    if count == 0:
        return []
    for _ in range(_LEASE_ROUNDS):
        seqs = st.mint.take(count, above)
        if seqs is not None:
            return seqs
        want = st.mint.wanted_ms(count, above)
        lease = st.mint.lease
        if lease is None or not (yield from _extend_lease(st, lease, want)):
            yield from _take_lease(st, want)
    raise RuntimeError(f"could not mint seqs in {st.where}: the seq lease keeps being lost")


def _extend_lease(st: StoreState, lease: Lease, want_ms: int) -> Flow[bool]:
    """Raise the lease's recorded `hi` (conditional on still owning it) before using it."""
    hi = extended_hi(lease.hi, st.mint.now_ms(), want_ms)
    expires = st.clock() + LEASE_TTL_S
    held = yield UpdateOne(
        "leases",
        {"_id": lease_id(lease.node), "owner": lease.owner},
        {"$max": {"hi": hi}, "$set": {"expires": expires}},
    )
    if held:
        st.mint.install(replace(lease, hi=hi, expires=expires))
        return True
    st.mint.drop(lease)  # taken over after it expired (Rule 5): find another node
    return False


def _take_lease(st: StoreState, want_ms: int) -> Flow[None]:
    """Take a node whose lease is free or expired, starting where the node counter points
    (so instances starting together spread over the nodes) and probing onwards."""
    counter = yield Increment("leases", NODE_COUNTER_ID, "n")
    start = int(counter["n"]) - 1 if counter is not None else int.from_bytes(os.urandom(2), "big")
    harel = yield Find("leases", {"_id": {"$in": list(HAREL_SEQ_COUNTERS)}}, {"n": 1})
    floor_ms = max((ms_floor_above(int(d.get("n") or 0)) for d in harel), default=0)
    for first in range(0, NODES, _LEASE_PROBE):
        nodes = [(start + i) % NODES for i in range(first, first + _LEASE_PROBE)]
        docs = yield Find("leases", {"_id": {"$in": [lease_id(n) for n in nodes]}})
        found = {d["_id"]: d for d in docs}
        for node in nodes:
            doc = found.get(lease_id(node))
            if doc is not None and float(doc.get("expires") or 0) > st.clock():
                continue  # held by a live instance
            if (yield from _claim(st, node, doc, max(floor_ms, want_ms - 1))):
                return
    raise RuntimeError(f"all {NODES} seq nodes of {st.where} are leased by live store instances")


def release_lease(st: StoreState) -> Flow[None]:
    """Give the node back when the store closes, so the next instance can take it at once
    (conditional on still owning it; a crashed instance's lease just expires)."""
    lease = st.mint.lease
    if lease is not None:
        st.mint.drop(lease)
        yield UpdateOne("leases", {"_id": lease_id(lease.node), "owner": lease.owner}, {"$set": {"expires": 0.0}})


def _claim(st: StoreState, node: int, doc: Optional[Mapping[str, Any]], floor_ms: int) -> Flow[bool]:
    """Take `node` over from the lease document read (`doc`, None if it has none yet),
    starting above its recorded `hi`; False if another instance got there first."""
    recorded_hi = int(doc.get("hi") or 0) if doc is not None else 0
    lo, hi = new_range(recorded_hi, st.mint.now_ms(), floor_ms)
    lease = Lease(node, lo, hi, os.urandom(8).hex(), st.clock() + LEASE_TTL_S)
    mine = {"_id": lease_id(node), "node": node, "owner": lease.owner, "hi": hi, "expires": lease.expires}
    try:
        if doc is None:
            yield InsertOne("leases", mine)
            took = True
        else:
            took = bool(
                (
                    yield UpdateOne(
                        "leases",
                        {"_id": lease_id(node), "owner": doc.get("owner"), "hi": doc.get("hi")},
                        {"$set": mine},
                    )
                )
            )
    except (DuplicateKeyError, ConnectionFailure):
        took = False
    if not took:
        # refused, raced, or the reply was lost: the write may still be ours (a lost reply,
        # or the driver's own retry meeting what its first attempt wrote): only the owner
        # recorded now can tell
        now = yield FindOne("leases", {"_id": lease_id(node)})
        if now is None or now.get("owner") != lease.owner:
            return False
    st.mint.install(lease)
    return True
