"""Partitions (`harel_beanie.core.partitions`) and their leases
(`harel_beanie.transport.ownership`): the hash pinned, the routing of a filter, harel's store
and transport contracts with partitions on, a worker's claims and sweeps kept to the
partitions it owns, the post-commit relay kept to its family, and the leases shared, taken
over after they lapse and fenced, on the real server with a clock the test moves."""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import mongomock
import pymongo
import pytest
from harel.engine.execution import Execution, Status
from harel.spec.states import Event
from harel.testing import assert_async_transport_contract, assert_transport_contract
from mongomock_motor import AsyncMongoMockClient
from pymongo.errors import DuplicateKeyError

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.core.calls import FindOneAndUpdate, UpdateOne
from harel_beanie.core.names import partition_collection, queue_names
from harel_beanie.core.partitions import (
    DEFAULT_PARTITIONS,
    PARTITION_VECTORS,
    Held,
    PartitionScope,
    family_key,
    part_of,
    route,
)
from harel_beanie.transport import AsyncMongoTransport, MongoTransport, ownership
from harel_beanie.transport.ownership import LEASE_SECONDS, MARGIN, RENEW_EVERY, TAKEOVER_BOUND, PartitionOwner
from tests.support.contracts import ASYNC, SYNC
from tests.support.wire import Recorder

FAR = 4e9  # a lease end no test reaches


def all_held(parts: int = DEFAULT_PARTITIONS) -> PartitionScope:
    return PartitionScope(parts=parts, held={p: Held(1, FAR) for p in range(parts)})


def ids_in(part: int, n: int, parts: int = DEFAULT_PARTITIONS, stem: str = "x") -> list[str]:
    """`n` root ids whose partition is `part`."""
    found: list[str] = []
    i = 0
    while len(found) < n:
        i += 1
        if part_of(f"{stem}{i}", parts) == part:
            found.append(f"{stem}{i}")
    return found


# --- the hash and the routing, without I/O ---------------------------------------------------


@pytest.mark.parametrize("key, parts, expected", PARTITION_VECTORS)
def test_the_hash_is_pinned(key: str, parts: int, expected: int) -> None:
    assert part_of(key, parts) == expected


def test_a_fork_family_shares_its_roots_partition() -> None:
    for root in ("order-1", "a:b", "", "é", "x" * 300):
        child, grandchild = f"{root}:Fulfilment.Warehouse:1", f"{root}:Fulfilment.Warehouse:1:Pick:2"
        assert part_of(child, 64) == part_of(grandchild, 64) == part_of(root, 64)
    assert family_key("a:b:c") == "a"


def test_route_names_the_partition_only_through_a_mongos() -> None:
    sharded, single = PartitionScope(sharded=True), PartitionScope()
    p = part_of("order-1", DEFAULT_PARTITIONS)
    point = {"_id": {"$in": ["order-1"]}, "version": {"$in": [3]}}
    assert route("executions", point, single) is point
    assert route("executions", point, sharded) == {"_id": "order-1", "version": 3, "part": p}
    assert route("confirm", {"_id": "order-1"}, sharded) == {"_id": "order-1", "part": p}
    assert route("enqueue", {"_id": "order-1", "qn": {"$lt": 64}}, sharded)["part"] == p
    assert route("overflow", {"g": "order-1", "tok": "t"}, sharded)["part"] == p
    # a family's ids: one partition; ids of several: each of theirs
    family = {"_id": {"$in": ["order-1:a:1", "order-1:b:2"]}}
    assert route("executions", family, sharded)["part"] == p
    several = route("executions", {"_id": {"$in": ["order-1", "order-2", "order-3"]}}, sharded)
    assert several["part"] == {
        "$in": sorted({part_of(i, DEFAULT_PARTITIONS) for i in ("order-1", "order-2", "order-3")})
    }
    # collections outside the plan, and filters that fix no id, are left as they are
    assert route("counters", {"_id": "n"}, sharded) == {"_id": "n"}
    assert route("executions", {"pending": True}, sharded) == {"pending": True}


def test_a_sweep_reads_the_partitions_it_owns() -> None:
    scope = PartitionScope(parts=8, held={0: Held(3, FAR), 5: Held(4, FAR), 6: Held(1, 0.0)})
    # on one server partition 0's owner also reads the documents written before partitions
    assert scope.sweep_filter() == {"part": {"$in": [0, 5, None]}}
    scope.sharded = True
    assert scope.sweep_filter() == {"part": {"$in": [0, 5]}}  # the lapsed lease of 6 is not read
    assert PartitionScope(parts=4, held={}).sweep_filter() is None  # owns nothing: reads nothing
    assert PartitionScope(parts=4).sweep_filter() == {}  # no owner: everything, as harel's own tests use it


# --- harel's contracts with partitions on ------------------------------------------------------


@pytest.mark.parametrize("contract, ns", [("outbox", "O-"), ("purge", "P-"), ("listing", "L-")])
def test_harels_store_contracts_with_every_command_routed(mongo_url: str, db_name: str, contract: str, ns: str) -> None:
    """Through a mongos each command names its partition: the filters it then sends still
    find every document (the store wrote `part` on each)."""
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name, sharded=True, partitions=all_held())
    try:
        SYNC[contract](store, ns)
    finally:
        store.close()


@pytest.mark.parametrize("contract, ns", [("outbox", "O-"), ("purge", "P-")])
async def test_harels_async_store_contracts_with_every_command_routed(
    mongo_url: str, db_name: str, contract: str, ns: str
) -> None:
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name, sharded=True, partitions=all_held())
    try:
        await ASYNC[contract](store, ns)
    finally:
        await store.close()


@pytest.fixture
def databases(client: pymongo.MongoClient[Any]) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for name in made:
        client.drop_database(name)


def test_harels_transport_contract_with_partitions_owned(mongo_url: str, databases: list[str]) -> None:
    """Timing, priorities, FIFO per group, one in flight, oldest group first: harel's
    contract on a transport that owns every partition by lease (one claim over all of
    them), on the server and on mongomock."""

    def make(clock: Any) -> MongoTransport:
        databases.append("hbt_p_" + uuid.uuid4().hex[:10])
        return MongoTransport(pymongo.MongoClient(mongo_url), databases[-1], clock, partitions=all_held())

    assert_transport_contract(make)
    assert_transport_contract(lambda clock: MongoTransport(mongomock.MongoClient(), "m", clock, partitions=all_held()))


async def test_harels_async_transport_contract_with_partitions_owned(mongo_url: str, databases: list[str]) -> None:
    def make(clock: Any) -> AsyncMongoTransport:
        databases.append("hbt_p_" + uuid.uuid4().hex[:10])
        return AsyncMongoTransport(pymongo.AsyncMongoClient(mongo_url), databases[-1], clock, partitions=all_held())

    await assert_async_transport_contract(make)
    await assert_async_transport_contract(
        lambda clock: AsyncMongoTransport(AsyncMongoMockClient(), "m", clock, partitions=all_held())
    )


def test_through_a_mongos_claims_keep_each_groups_order_and_go_round_the_partitions(
    mongo_url: str, db_name: str
) -> None:
    """Through a mongos a claim names one partition at a time: FIFO within each group, one
    message of a group in flight, and between partitions round-robin (not the oldest group
    of all, which would need a read of every partition first)."""
    clock = Clock()
    a, b = ids_in(2, 1)[0], ids_in(9, 1)[0]
    t = MongoTransport(pymongo.MongoClient(mongo_url), db_name, clock, sharded=True, partitions=all_held())
    for group in (a, b):
        for n in range(3):
            t.publish(group, Event(kind=f"{group}-{n}"))
    seen: dict[str, list[str]] = {a: [], b: []}
    order = []
    for _ in range(6):
        first = t.claim("w", 30.0)
        assert first is not None
        other = t.claim("w", 30.0)  # the other group's head, never the same group's next
        assert other is None or other.group_id != first.group_id
        for lease in (first, other):
            if lease is not None:
                seen[lease.group_id].append(lease.event.kind)
                order.append(lease.group_id)
                t.ack(lease)
        if not any(len(v) < 3 for v in seen.values()):
            break
    assert seen == {g: [f"{g}-{n}" for n in range(3)] for g in (a, b)}
    assert set(order[:2]) == {a, b}  # both partitions served before either twice


# --- a worker's share ----------------------------------------------------------------------------


def _exe(eid: str, version: int = 0) -> Execution:
    return Execution(id=eid, definition_id="d", status=Status.RUNNING, version=version)


@pytest.mark.parametrize("sharded", [False, True], ids=["one server", "through a mongos"])
def test_claims_and_sweeps_read_only_the_partitions_owned(mongo_url: str, db_name: str, sharded: bool) -> None:
    """Groups, pending entries and timers in two partitions; a transport and a store owning
    one of them see only its work, and the other's owner only the rest."""
    mine, theirs = ids_in(1, 3), ids_in(2, 3)
    setup = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    sender = MongoTransport(pymongo.MongoClient(mongo_url), db_name)
    from harel.engine.store.base import TimerOp

    for eid in mine + theirs:
        setup.commit(_exe(eid), [(eid, Event(kind="Go"))], timers=(TimerOp("schedule", "W", 5.0),))
        sender.publish(eid, Event(kind="Go"))
    for part, own_ids in ((1, mine), (2, theirs)):
        scope = PartitionScope(held={part: Held(1, FAR)})
        store = MongoStore(pymongo.MongoClient(mongo_url), db_name, sharded=sharded, partitions=scope)
        transport = MongoTransport(pymongo.MongoClient(mongo_url), db_name, sharded=sharded, partitions=scope)
        claimed = []
        while (lease := transport.claim("w", 30.0)) is not None:
            claimed.append(lease.group_id)
        assert sorted(claimed) == sorted(own_ids)
        assert sorted(e for e, _, _ in store.due_timers(10.0)) == sorted(own_ids)
        assert sorted(e.target_id for e in store.pending_outbox()) == sorted(own_ids)
        assert store.next_timer(0.0) == 5.0
    # and one owning nothing reads nothing
    idle = PartitionScope(held={})
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name, partitions=idle)
    assert store.due_timers(10.0) == [] and store.pending_outbox() == [] and store.next_timer(0.0) is None
    assert MongoTransport(pymongo.MongoClient(mongo_url), db_name, partitions=idle).claim("w", 30.0) is None


def test_the_post_commit_relay_reads_its_family_only(mongo_url: str, db_name: str) -> None:
    """A backlog of pending entries in other families, some in the same partition: the
    relay of one execution sends one read, whose filter names the family's ids (and, through
    a mongos, its partition), and gets back only the family's documents."""
    rec = Recorder()
    root = "order-7"
    p = part_of(root, DEFAULT_PARTITIONS)
    lookalikes = ids_in(p, 3, stem=root)  # other roots whose ids start with this one ("order-71")
    others = ids_in(p, 40, stem="same") + [f"other{i}" for i in range(40)] + lookalikes
    store = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[rec]), db_name, sharded=True)
    for eid in others + [root]:
        store.commit(_exe(eid), [(eid, Event(kind="Go"))])
    child = Execution(id=f"{root}:R.a:1", definition_id="d", status=Status.RUNNING, parent_id=root)
    store.commit(child, [(root, Event(kind="Done"))])  # a child holding work
    rec.commands.clear()
    spawns = store.pending_spawns(within=root)
    outbox = store.pending_outbox(within=root)
    finds = [c for name, c in rec.commands if name == "find"]
    assert len(finds) == 1, rec.commands  # one read for both kinds
    # one `_id` range in its partition (never an `$or`, which some servers scan the collection for)
    assert finds[0]["filter"] == {"pending": True, "_id": {"$gte": root, "$lt": root + ";"}, "part": p}, finds[0]
    assert spawns == [] and sorted(e.target_id for e in outbox) == [root, root]
    # the documents the read returned: the family's two and the look-alikes of its partition
    # (dropped by their parent chain above), never the backlog
    found = store._colls["executions"].find(finds[0]["filter"], {"_id": 1})  # noqa: SLF001 - the same read again
    assert sorted(d["_id"] for d in found) == sorted([root, f"{root}:R.a:1", *lookalikes])


# --- the leases ----------------------------------------------------------------------------------


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _owner(mongo_url: str, db_name: str, name: str, clock: Clock, parts: int = 8) -> PartitionOwner:
    coll = pymongo.AsyncMongoClient(mongo_url)[db_name][partition_collection("harel")]
    return PartitionOwner(coll, name, PartitionScope(parts=parts, clock=clock), clock=clock)


async def test_leases_are_shared_taken_over_after_they_lapse_and_fenced(mongo_url: str, db_name: str) -> None:
    clock = Clock()
    a, b = _owner(mongo_url, db_name, "a", clock), _owner(mongo_url, db_name, "b", clock)
    await a.tick()
    assert sorted(await a.tick()) == list(range(8))  # alone: every partition
    await b.tick()  # b joins: its share is 4, none free yet
    held_a = await a.tick()  # a gives back what is above its share
    held_b = await b.tick()  # and b takes it
    assert len(held_a) == len(held_b) == 4 and not set(held_a) & set(held_b)
    # Rule 3: a lease taken or renewed is acted on until MARGIN before its end on the server
    assert {h.until for h in held_b.values()} == {clock.now + LEASE_SECONDS - MARGIN}
    assert {h.until for h in (await b.tick()).values()} == {clock.now + LEASE_SECONDS - MARGIN}
    epochs = {p: h.epoch for p, h in held_b.items()}
    # b stops renewing (a crash). Until its lease lapses nobody else takes its partitions
    clock.now += LEASE_SECONDS - 1
    assert len(await a.tick()) == 4
    assert b.state.scope.owned() == {}  # b's own clock says its margin is past: it acts on nothing
    clock.now += RENEW_EVERY
    taken = await a.tick()
    assert sorted(taken) == list(range(8))  # within the bound: LEASE_SECONDS + RENEW_EVERY
    assert all(taken[p].epoch == epochs[p] + 1 for p in epochs)  # every takeover bumps the epoch
    assert clock.now - 1000.0 <= TAKEOVER_BOUND + RENEW_EVERY
    # b wakes: its renewal is refused (no longer the owner), so it holds nothing it lost,
    # and it leaves a's leases as a renewed them (its clock, a second on, is not a's)
    leases = pymongo.MongoClient(mongo_url)[db_name][partition_collection("harel")]
    before = {d["_id"]: d["until"] for d in leases.find({"_id": {"$in": sorted(epochs)}})}
    clock.now += 1
    back = await b.tick()
    assert not set(back) & set(a.state.held)
    assert {d["_id"]: d["until"] for d in leases.find({"_id": {"$in": sorted(epochs)}})} == before


async def test_three_workers_on_sixteen_partitions_own_every_one(mongo_url: str, db_name: str) -> None:
    """Rule 2's fair share is ceil(P / members): three workers on 16 partitions hold 6, 6 and
    4 once settled, so none is left unowned (a share of P // members, 5, would leave the
    16th to no one for good)."""
    clock = Clock()
    owners = [_owner(mongo_url, db_name, name, clock, parts=16) for name in "abc"]
    for _ in range(4):  # a takes all alone; then each look gives back or takes up to its share
        for owner in owners:
            await owner.tick()
    held = [set(o.state.scope.owned() or {}) for o in owners]
    assert sorted(p for h in held for p in h) == list(range(16)), held  # each once, none left out
    assert sorted(map(len, held)) == [4, 6, 6], held


async def test_a_clean_stop_gives_the_leases_back(mongo_url: str, db_name: str) -> None:
    clock = Clock()
    a, b = _owner(mongo_url, db_name, "a", clock), _owner(mongo_url, db_name, "b", clock)
    await a.tick(), await b.tick(), await a.tick(), await b.tick()
    await b.release()
    await a.tick()  # the member b left: a's share is all of them, taken at once
    assert sorted(await a.tick()) == list(range(8))


async def test_a_look_stops_acting_on_a_partition_before_it_gives_it_back(mongo_url: str, db_name: str) -> None:
    """Rule 2c under Rule 3: once the write giving a partition back lands, another process may
    take it at its next look while this look is still under way; the claims and sweeps of
    the giving process no longer read it by then."""
    clock = Clock()
    a, b = _owner(mongo_url, db_name, "a", clock), _owner(mongo_url, db_name, "b", clock)
    await a.tick(), await a.tick(), await b.tick()
    assert len(a.state.scope.owned() or {}) == 8  # a alone held them all; b now shares
    acting_when_given: dict[int, set[int]] = {}
    send = a._call

    async def watching(c: Any) -> Any:
        if isinstance(c, UpdateOne) and c.update == {"$set": {"until": 0.0, "owner": None}}:
            acting_when_given[c.filter["_id"]] = set(a.state.scope.owned() or {})
        return await send(c)

    a._call = watching  # type: ignore[method-assign]
    held = await a.tick()
    assert len(acting_when_given) == 4 and len(held) == 4  # four given back to b
    assert all(p not in acting for p, acting in acting_when_given.items()), acting_when_given


@pytest.mark.parametrize("skew", [MARGIN - 0.5, MARGIN + 1.0], ids=["within MARGIN", "beyond MARGIN"])
async def test_a_clock_ahead_takes_a_lapsed_lease_after_its_owner_stopped_only_within_the_margin(
    mongo_url: str, db_name: str, skew: float
) -> None:
    """Rule 3's clock requirement: `a` holds both partitions and stops renewing (a crash); `b`,
    its clock `skew` ahead, looks every 0.1 s until it takes them. Within MARGIN `a`'s own
    clock has already stopped it acting then; beyond MARGIN `a` still acts on them for the
    skew less MARGIN (on a clock the test moves: no timing)."""
    clock = Clock()
    a = _owner(mongo_url, db_name, "a", clock, parts=2)
    await a.tick(), await a.tick()
    assert sorted(a.state.held) == [0, 1]

    def ahead() -> float:
        return clock.now + skew

    coll = pymongo.AsyncMongoClient(mongo_url)[db_name][partition_collection("harel")]
    b = PartitionOwner(coll, "b", PartitionScope(parts=2, clock=ahead), clock=ahead)
    while not await b.tick():
        clock.now += 0.1
    both = set(a.state.scope.owned() or {}) & set(b.state.scope.owned() or {})
    if skew < MARGIN:
        assert both == set(), both
    else:
        assert both == {0, 1}
        still = min(h.until for h in a.state.held.values()) - clock.now  # how long a acts on
        assert skew - MARGIN - 0.1 <= still <= skew - MARGIN, still


async def test_two_looks_at_once_take_a_lapsed_partition_once(mongo_url: str, db_name: str) -> None:
    """Rule 2d: a take is conditional on the lease having lapsed on the server, not only in
    the taker's read. `a` reads the leases (every partition free), then `b` looks and takes
    its share, then `a` sends its takes: the one of a partition `b` took is refused."""
    clock = Clock()
    a, b = _owner(mongo_url, db_name, "a", clock, parts=2), _owner(mongo_url, db_name, "b", clock, parts=2)
    flow = ownership.tick(a.state)
    reply: Any = None
    while not isinstance(call := flow.send(reply), FindOneAndUpdate):  # a's first take, held back
        reply = await a._call(call)
    taken_by_b = await b.tick()
    assert len(taken_by_b) == 1  # two members now: one partition each
    while True:
        error: Any = None
        try:
            reply = await a._call(call)
        except DuplicateKeyError as exc:  # the upsert of a lease that exists and has not lapsed
            error = exc
        try:
            call = flow.throw(error) if error is not None else flow.send(reply)
        except StopIteration as done:
            held_a = done.value
            break
    assert len(held_a) == 1 and not set(held_a) & set(taken_by_b), (held_a, taken_by_b)


def test_a_claim_whose_partition_lease_ends_during_it_gives_the_group_back(mongo_url: str, db_name: str) -> None:
    """Rule 7: the lease of the claimed group's partition ends (by the claimer's clock) while
    the claim is on the wire: the claim returns nothing and the group is claimable at once by
    the partition's next owner, not after the group's own lease."""
    group = ids_in(3, 1)[0]
    clock = Clock()
    publisher = MongoTransport(pymongo.MongoClient(mongo_url), db_name, clock)
    publisher.publish(group, Event(kind="A"))
    old = MongoTransport(
        pymongo.MongoClient(mongo_url),
        db_name,
        clock,
        partitions=PartitionScope(held={3: Held(1, 1005.0)}, clock=clock),
    )
    send = old._call

    def late(c: Any) -> Any:
        reply = send(c)
        leases = isinstance(c, UpdateOne) and c.target == "queues" and c.update.get("$set", {}).get("token")
        if leases and reply:
            clock.now += 10  # the lease's answer arrives after the partition lease's end
        return reply

    old._call = late  # type: ignore[method-assign]
    assert old.claim("old", 60.0) is None
    queues, _ = queue_names("harel")
    doc = pymongo.MongoClient(mongo_url)[db_name][queues].find_one({"_id": group})
    assert doc is not None and doc["token"] is None and doc["available_at"] <= clock.now, doc  # due at once
    new = MongoTransport(
        pymongo.MongoClient(mongo_url),
        db_name,
        clock,
        partitions=PartitionScope(held={3: Held(2, clock.now + 5)}, clock=clock),
    )
    lease = new.claim("new", 60.0)
    assert lease is not None and lease.group_id == group


async def test_a_stale_owners_claim_is_refused_through_a_mongos(mongo_url: str, db_name: str) -> None:
    """Through a mongos a claim carries its partition lease's epoch: once the new owner has
    claimed a group, the old owner's claims on it are refused, even after the group's own
    lease ends."""
    group = ids_in(3, 1)[0]
    clock = Clock()
    old = PartitionScope(sharded=True, held={3: Held(1, FAR)})
    new = PartitionScope(sharded=True, held={3: Held(2, FAR)})
    publisher = MongoTransport(pymongo.MongoClient(mongo_url), db_name, clock, sharded=True)
    publisher.publish(group, Event(kind="A"))
    t_new = MongoTransport(pymongo.MongoClient(mongo_url), db_name, clock, sharded=True, partitions=new)
    t_old = MongoTransport(pymongo.MongoClient(mongo_url), db_name, clock, sharded=True, partitions=old)
    lease = t_new.claim("new", 5.0)
    assert lease is not None
    t_new.nack(lease)  # free again, claimable at once
    assert t_old.claim("old", 5.0) is None  # fenced: the group carries the newer epoch
    assert t_new.claim("new", 5.0) is not None
    queues, _ = queue_names("harel")
    doc = pymongo.MongoClient(mongo_url)[db_name][queues].find_one({"_id": group})
    assert doc["ep"] == 2 and doc["part"] == 3


@pytest.mark.parametrize(
    "option, value", [("partitions", "all"), ("partitions", {}), ("sharded", "yes"), ("sharded", 1)]
)
def test_the_partition_options_refuse_a_wrong_value_naming_it(option: str, value: Any) -> None:
    for make in (
        lambda: MongoStore(mongomock.MongoClient(), "d", **{option: value}),
        lambda: MongoTransport(mongomock.MongoClient(), "d", **{option: value}),
    ):
        with pytest.raises(TypeError, match=option):
            make()
