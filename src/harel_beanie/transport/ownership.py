"""Partition ownership: which worker process does the background work of which partitions.

Why this module exists. Claims, relay sweeps and timer sweeps read only the partitions a
process owns (`harel_beanie.core.partitions`), so that adding a worker or a shard divides
the background work instead of multiplying it. Each partition is leased to one process at a
time, in the spirit of Temporal's shard ownership: a lease is renewed, taken over when it
lapses, and numbered, so the owner's claims carry a fencing epoch. The rules:

Rule 1. The leases are one small document per partition (`_id` the partition: `owner`,
        `until`, `epoch`) in the `<prefix>_hb_partitions` collection, beside one document per
        live process (`_id` "member:<owner>", `until`), so that every process knows how many
        share the work. The collection is small and stays unsharded.
Rule 2. Every `RENEW_EVERY` seconds a process (a) renews its member document and the leases
        it holds, conditional on still being their owner, (b) reads the collection, (c) gives
        back the leases above its fair share (ceil(P / live processes)), and (d) takes lapsed
        or never-held partitions up to its share, each with one conditional write that bumps
        the partition's epoch. A lease it did not renew (another took it over) is dropped.
        A lease given back leaves the process's scope before the write that frees it: once
        that lands another process may take the partition while this look is under way.
Rule 3. A process acts on a partition only while its lease, as its own clock sees it, has
        at least `MARGIN` left: `Held.until` is the renewal's send time plus `LEASE_SECONDS`
        less `MARGIN`. Others take the partition over only once `until` has passed on their
        clocks, so with clocks within `MARGIN` of each other two processes never both act.
        A process paused past its lease (a stopped VM, a long GC) finds, on waking, that its
        leases lapsed by its own clock and acts on nothing until it renews (Rule 2's renewal
        is conditional on still being the owner). Through a mongos each claim also carries
        the epoch (`harel_beanie.transport.queues`, Rule 7), so a group the new owner has
        claimed is never taken by the old one.
        The clock requirement: the worker hosts' clocks within `MARGIN` of each other.
        Beyond it, a clock ahead takes a lapsed lease while its owner still acts on it, for
        up to the skew less `MARGIN` (tests/core/test_partitions.py, a clock 1.5 s and 3 s
        ahead); ahead by more than `LEASE_SECONDS` it takes every lease at its first look
        from owners still renewing them; a clock behind keeps acting after the others took
        over. Two owners then claim and sweep one partition, so its background work is done
        twice; events stay applied once and in order per group, since a group's lease token
        and harel's dedupe read no other process's clock. The partition runs
        (tests/reliability/test_reliability_partitions.py) record what every worker did
        under which lease and by which clock: with one clock 1.5 s ahead no partition is
        acted on inside two workers' valid leases; with one 11 s ahead every partition its
        peer held is, and the history is still exact (docs/production-stack.md, "The
        worker hosts' clocks").
Rule 4. The bound: while any process runs, a partition whose owner died is owned again within
        `LEASE_SECONDS + RENEW_EVERY` (plus clock skew): its lease lapses, the dead process's
        member document lapses with it so the others' fair share grows, and each of them
        looks again within `RENEW_EVERY`. A process that stops cleanly gives its leases back
        at once, so the others take them at their next look.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from pymongo.errors import DuplicateKeyError, PyMongoError

from harel_beanie.core.calls import DeleteOne, Find, FindOneAndUpdate, Flow, UpdateMany, UpdateOne
from harel_beanie.core.partitions import Held, PartitionScope
from harel_beanie.store.dispatch import acall, adrive

log = logging.getLogger("harel_beanie.transport.ownership")

#: How long a partition lease lasts from its last renewal (seconds).
LEASE_SECONDS = 10.0
#: How often a process renews its leases and looks for partitions to take or give back.
RENEW_EVERY = 2.5
#: How long before its lease ends (by its own clock) a process stops acting on a partition:
#: the clock skew between worker hosts must stay below it.
MARGIN = 2.0
#: Rule 4's bound: a dead owner's partitions are owned again within this (plus clock skew).
TAKEOVER_BOUND = LEASE_SECONDS + RENEW_EVERY

_MEMBER = "member:"


@dataclass
class OwnerState:
    """What one process's partition owner knows: who it is, and the leases it holds."""

    owner: str
    scope: PartitionScope
    clock: Callable[[], float] = time.time
    lease_seconds: float = LEASE_SECONDS
    margin: float = MARGIN
    held: dict[int, Held] = field(default_factory=dict)

    @property
    def member_id(self) -> str:
        return _MEMBER + self.owner


def tick(st: OwnerState) -> Flow[dict[int, Held]]:
    """One look (Rule 2): renew, read, give back above the fair share, take up to it. Returns
    the leases held afterwards (also kept in `st.held`)."""
    sent = st.clock()
    until = sent + st.lease_seconds
    yield UpdateOne("partitions", {"_id": st.member_id}, {"$set": {"until": until}}, upsert=True)
    if st.held:
        renew = {"_id": {"$in": sorted(st.held)}, "owner": st.owner}
        yield UpdateMany("partitions", renew, {"$set": {"until": until}})
    docs = yield Find("partitions", {})
    now = st.clock()
    members = sum(1 for d in docs if str(d["_id"]).startswith(_MEMBER) and float(d.get("until") or 0) > now)
    leases = {d["_id"]: d for d in docs if isinstance(d["_id"], int) and 0 <= d["_id"] < st.scope.parts}
    held = {
        p: Held(int(d.get("epoch") or 0), until - st.margin)
        for p, d in leases.items()
        if d.get("owner") == st.owner and p in st.held and float(d.get("until") or 0) == until
    }
    share = math.ceil(st.scope.parts / max(1, members))
    for p in sorted(held)[share:]:  # above the fair share: back to the others (Rule 2c)
        _stop_acting(st, p)
        yield UpdateOne("partitions", {"_id": p, "owner": st.owner}, {"$set": {"until": 0.0, "owner": None}})
        del held[p]
    free = [p for p in range(st.scope.parts) if p not in leases or float(leases[p].get("until") or 0) <= now]
    random.shuffle(free)  # processes starting together try different partitions first
    for p in free[: max(0, share - len(held))]:
        took = yield from _take(st, p, now)
        if took is not None:
            held[p] = took
    st.held = held
    return held


def _take(st: OwnerState, p: int, now: float) -> Flow[Optional[Held]]:
    """Take partition `p` if its lease lapsed (or never existed), bumping its epoch."""
    lapsed = {"_id": p, "$or": [{"until": {"$lte": now}}, {"until": None}]}
    sent = st.clock()
    take = {"$set": {"owner": st.owner, "until": sent + st.lease_seconds}, "$inc": {"epoch": 1}}
    try:
        doc = yield FindOneAndUpdate("partitions", lapsed, take, upsert=True, after=True)
    except DuplicateKeyError:
        return None  # another process holds it (or took it first)
    if doc is None or doc.get("owner") != st.owner:
        return None
    return Held(int(doc.get("epoch") or 0), sent + st.lease_seconds - st.margin)


def _stop_acting(st: OwnerState, p: Optional[int] = None) -> None:
    """Take partition `p` (every partition: None) out of the leases the process's claims and
    sweeps read, before the write that gives it back: once that write lands another process
    may take the partition at its next look, while this look is still under way (Rule 3)."""
    if st.scope.held is not None:
        st.scope.held = {} if p is None else {q: h for q, h in st.scope.held.items() if q != p}


def release(st: OwnerState) -> Flow[None]:
    """Give every lease back and leave (a clean stop): the others take them at their next
    look instead of after the lease lapses."""
    _stop_acting(st)
    if st.held:
        mine = {"_id": {"$in": sorted(st.held)}, "owner": st.owner}
        yield UpdateMany("partitions", mine, {"$set": {"until": 0.0, "owner": None}})
    yield DeleteOne("partitions", {"_id": st.member_id})
    st.held = {}


class PartitionOwner:
    """Runs `tick` every `RENEW_EVERY` seconds for one process, and publishes the leases it
    holds into `scope` (shared with the process's store and transport, whose sweeps and
    claims then read those partitions only). `collection` is the transport's partition
    collection on an async client (`harel_beanie.transport.settings.queue_collections`)."""

    def __init__(self, collection: Any, worker_id: str, scope: PartitionScope, **options: Any) -> None:
        self.state = OwnerState(f"{worker_id}:{uuid.uuid4().hex[:8]}", scope, **options)
        self._colls = {"partitions": collection}
        scope.held = {}  # nothing is owned before the first look

    async def tick(self) -> dict[int, Held]:
        held = await adrive(tick(self.state), self._call)
        self.state.scope.held = dict(held)
        return held

    async def _call(self, c: Any) -> Any:
        return await acall(self._colls, c)

    async def run(self, stop: asyncio.Event, every: float = RENEW_EVERY) -> None:
        """Look every `every` seconds until `stop` is set; a failed look (the server away)
        is tried again at the next, while the leases held run out by the clock (Rule 3)."""
        while not stop.is_set():
            try:
                await self.tick()
            except PyMongoError as exc:
                log.warning("partition leases not renewed: %s", exc)
            try:
                await asyncio.wait_for(stop.wait(), timeout=every)
            except asyncio.TimeoutError:
                pass

    async def release(self) -> None:
        await adrive(release(self.state), self._call)
        self.state.scope.held = {}
