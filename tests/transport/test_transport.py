"""The transport (`harel_beanie.transport`) against harel's transport contract, with timing
and priorities, on the real server and on mongomock / mongomock-motor; its round trips per
operation counted on the wire; its queue documents bounded whatever a group's backlog."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import mongomock
import pymongo
from harel.spec.states import Event
from harel.testing import assert_async_transport_contract, assert_transport_contract
from mongomock_motor import AsyncMongoMockClient

from harel_beanie.transport import AsyncMongoTransport, MongoTransport
from harel_beanie.transport.documents import INLINE_MAX
from tests.support.wire import Recorder


def _fresh() -> str:
    return "hbt_q_" + uuid.uuid4().hex[:10]


def test_the_sync_contract_on_the_server(mongo_url: str, client: Any) -> None:
    made: list[str] = []

    def make(clock: Any) -> MongoTransport:
        made.append(_fresh())
        return MongoTransport(pymongo.MongoClient(mongo_url), made[-1], clock)

    try:
        assert_transport_contract(make)
    finally:
        for name in made:
            client.drop_database(name)


async def test_the_async_contract_on_the_server(mongo_url: str, client: Any) -> None:
    made: list[str] = []

    def make(clock: Any) -> AsyncMongoTransport:
        made.append(_fresh())
        return AsyncMongoTransport(pymongo.AsyncMongoClient(mongo_url), made[-1], clock)

    try:
        await assert_async_transport_contract(make)
    finally:
        for name in made:
            client.drop_database(name)


def test_the_sync_contract_on_mongomock() -> None:
    assert_transport_contract(lambda clock: MongoTransport(mongomock.MongoClient(), "m", clock))


async def test_the_async_contract_on_mongomock_motor() -> None:
    await assert_async_transport_contract(lambda clock: AsyncMongoTransport(AsyncMongoMockClient(), "m", clock))


QS, OV = "harel_hb_queues", "harel_hb_overflow"  # the queue and overflow collections
#: the commands of the transport's own operations (not the wake-ups' stream, nor sessions)
_WORK = {"update", "insert", "delete", "findAndModify", "find"}


def _sent(rec: Recorder) -> list[str]:
    return [f"{name} {cmd.get(name)}" for name, cmd in rec.take() if name in _WORK]


def test_round_trips_per_path(mongo_url: str, db_name: str) -> None:
    """The round trips of every path, on the wire (docs/production-stack.md says the
    same numbers): publish inline 1, into a full group 4 (it starts the spill), into a
    spilling group 3, a message over the inline bound 3 (2 into a spilling group); claim of a
    fresh group's inline head 2 (a window of the fresh band read, the group leased as read:
    Rules 3 and 8), of a served group's 3 (the fresh band read first, found empty), of an
    overflow head one more, a claim that finds nothing 2 (one window of each band: the last
    claim was just before), one that finds a spilled group drained 5 (it ends the spill); ack
    inline 1, of an overflow head 2; nack 1, parked or not. Each command is named with its
    collection."""
    rec = Recorder()
    t = MongoTransport(pymongo.MongoClient(mongo_url, event_listeners=[rec]), db_name)
    t.init()
    rec.clear()
    big = {"blob": "x" * (300 * 1024)}

    t.publish("g", Event(kind="first"))
    assert _sent(rec) == [f"update {QS}"]  # inline: the conditional upsert appends
    claim = [f"find {QS}", f"update {QS}"]  # a window read, then the lease conditional on it
    served = [f"find {QS}", *claim]  # the fresh band read first
    lease = t.claim("w", 30)
    assert lease is not None and _sent(rec) == claim
    t.nack(lease)  # back among the served groups
    assert _sent(rec) == [f"update {QS}"]
    lease = t.claim("w", 30)
    t.nack(lease, delay=5)
    assert lease is not None and _sent(rec) == [*served, f"update {QS}"]
    assert t.claim("w", 30) is None  # parked: nothing claimable
    assert _sent(rec) == [f"find {QS}", f"find {QS}"]

    for i in range(INLINE_MAX):
        t.publish("full", Event(kind=f"m{i}"))
    rec.clear()
    t.publish("full", Event(kind="spills"))  # no room: refused, overflow, not spilling yet, start
    assert _sent(rec) == [f"update {QS}", f"insert {OV}", f"update {QS}", f"update {QS}"]
    t.publish("full", Event(kind="spilling"))  # spilling: refused, overflow, told
    assert _sent(rec) == [f"update {QS}", f"insert {OV}", f"update {QS}"]
    t.publish("full", Event(kind="big", data=big))  # over the bound, spilling: overflow, told
    assert _sent(rec) == [f"insert {OV}", f"update {QS}"]
    t.publish("alone", Event(kind="big", data=big))  # over the bound, new group: starts a spill
    assert _sent(rec) == [f"insert {OV}", f"update {QS}", f"update {QS}"]

    lease = t.claim("w", 30, min_priority=0)
    while lease is not None and lease.group_id != "alone":  # an inline head: two commands
        assert _sent(rec) == claim
        t.ack(lease)
        assert _sent(rec) == [f"update {QS}"]
        lease = t.claim("w", 30)
    assert lease is not None and lease.overflow_id is not None
    assert _sent(rec) == [*claim, f"findAndModify {OV}"]  # the overflow head
    t.ack(lease)
    assert _sent(rec) == [f"delete {OV}", f"update {QS}"]

    # a claim that finds a spilled group drained ends the spill (Rule 5)
    solo = MongoTransport(t._client, db_name, prefix="solo")
    solo.init()
    solo.publish("g", Event(kind="big", data=big))
    solo.ack(solo.claim("w", 30))
    rec.clear()
    assert solo.claim("w", 30) is None
    q, o = "solo_hb_queues", "solo_hb_overflow"
    assert _sent(rec) == [f"find {q}", f"find {q}", f"update {q}", f"findAndModify {o}", f"update {q}"]
    t.close()


async def test_an_idle_claim_reads_when_to_wake(mongo_url: str, db_name: str) -> None:
    """An async claim that finds nothing answers after its read of each band without `idle_wait`
    (harel's behaviour). With it, it also reads when the next lease or park ends (one `find`)
    and asks `timers` (the store's `next_timer`: one `find` on the store's client), then
    claims once more after each wake-up (a notification, or each poll interval without a
    change stream); the waits are counted, not timed."""
    rec = Recorder()
    client = pymongo.AsyncMongoClient(mongo_url, event_listeners=[rec])
    t = AsyncMongoTransport(client, db_name)
    await t.init()
    rec.clear()
    assert await t.claim("w", 30) is None
    nothing = [f"find {QS}", f"find {QS}"]
    assert _sent(rec) == nothing

    asked: list[float] = []

    async def timers(after: float) -> None:
        asked.append(after)

    waiting = AsyncMongoTransport(client, db_name, idle_wait=0.3, poll_interval=0.1, timers=timers)
    await waiting.init()
    assert waiting.wakeups is not None
    waits = 0
    wait = waiting.wakeups.wait

    async def counted(generation: int, timeout: float) -> None:
        nonlocal waits
        waits += 1
        await wait(generation, timeout)

    waiting.wakeups.wait = counted  # type: ignore[method-assign]
    rec.clear()
    assert await waiting.claim("w", 30) is None
    assert waits >= 1 and len(asked) == 1
    assert _sent(rec) == [*nothing, f"find {QS}"] + nothing * waits
    await waiting.close()


async def test_a_deep_backlog_spills_and_keeps_its_order(mongo_url: str, client: Any, db_name: str) -> None:
    """A group holding more than the inline bound keeps the rest as overflow documents, in
    publish order; the queue document stays bounded; once drained, messages go inline again."""
    t = AsyncMongoTransport(pymongo.AsyncMongoClient(mongo_url), db_name)
    n = INLINE_MAX + 20
    for i in range(n):
        await t.publish("deep", Event(kind=f"m{i}"))
    doc = client[db_name].harel_hb_queues.find_one({"_id": "deep"})
    # inline messages, and one count for the spill (the overflow is what its documents say)
    assert doc["qn"] == INLINE_MAX and doc["pending"] == INLINE_MAX + 1 and doc["spill"] is True
    assert client[db_name].harel_hb_overflow.count_documents({"g": "deep"}) == 20
    got = []
    for _ in range(n):
        lease = await t.claim("w", 30)
        assert lease is not None
        got.append(lease.event.kind)
        assert await t.claim("other", 30) is None  # one in flight per group, spilling or not
        await t.ack(lease)
    assert got == [f"m{i}" for i in range(n)]
    assert await t.claim("w", 30) is None
    doc = client[db_name].harel_hb_queues.find_one({"_id": "deep"})
    assert (doc["pending"], doc["qn"], doc["spill"]) == (0, 0, False)
    await t.publish("deep", Event(kind="again"))
    assert client[db_name].harel_hb_queues.find_one({"_id": "deep"})["qn"] == 1  # inline again
    await t.close()


async def test_claims_racing_acks_on_lapsed_leases_lose_no_message(mongo_url: str, db_name: str) -> None:
    """Leases that lapse at once, so every claim may take a group whose head another worker
    is acknowledging: a message may come twice (harel's dedupe window absorbs that), never
    not at all. On SecantusDB a claim reading the head from the pre-image lost about one
    message in 40 in two runs of five: its pre-image is the document as the claim found it,
    so a claim racing an ack handed over the popped head again, and the next ack popped a
    message nobody had been given. The claim now reads the head before it leases, and its
    lease is conditional on the acks it read (`acked`, on the wire): an ack in between makes
    the lease miss (Rule 8)."""
    rec = Recorder()
    t = AsyncMongoTransport(pymongo.AsyncMongoClient(mongo_url, event_listeners=[rec]), db_name)
    deliveries = published = 0
    for round_ in range(5):
        group, n = f"race-{round_}", 40
        for i in range(n):
            await t.publish(group, Event(kind=f"m{i}"))
        seen: set[str] = set()
        idle = 0

        async def worker(k: int) -> None:
            nonlocal idle, deliveries
            while idle < 200:
                lease = await t.claim(f"w{k}", 0.001)
                if lease is None:
                    idle += 1
                    await asyncio.sleep(0.001)
                    continue
                idle = 0
                deliveries += 1
                seen.add(lease.event.kind)
                await t.ack(lease)

        await asyncio.gather(*(worker(k) for k in range(4)))
        published += n
        assert seen == {f"m{i}" for i in range(n)}, sorted({f"m{i}" for i in range(n)} - seen)
    # the race happened: claims took groups whose head was still being acknowledged
    assert deliveries > published, (deliveries, published)
    leases = [
        u["q"]
        for name, c in rec.commands
        if name == "update" and c["update"] == "harel_hb_queues"
        for u in c["updates"]
        if isinstance(u["u"], dict) and u["u"].get("$set", {}).get("token") is not None
    ]
    assert leases and all("acked" in q and "token" in q for q in leases), leases[:1]
    await t.close()


def test_a_message_larger_than_the_inline_bound_travels_alone(mongo_url: str, db_name: str) -> None:
    """A message over the inline byte bound goes to overflow at once; order is kept."""
    big = Event(kind="Big", data={"blob": "x" * (300 * 1024)})
    t = MongoTransport(pymongo.MongoClient(mongo_url), db_name)
    t.publish("g", Event(kind="small"))
    t.publish("g", big)
    t.publish("g", Event(kind="after"))
    kinds = []
    while (lease := t.claim("w", 30)) is not None:
        kinds.append(lease.event.kind)
        t.ack(lease)
    assert kinds == ["small", "Big", "after"]
    t.close()


def _transports(mongo_url: str, db_name: str) -> list[tuple[str, MongoTransport]]:
    return [
        ("server", MongoTransport(pymongo.MongoClient(mongo_url), db_name)),
        ("mongomock", MongoTransport(mongomock.MongoClient(), db_name)),
    ]


def test_a_drained_group_takes_the_priority_of_its_next_publish(mongo_url: str, db_name: str) -> None:
    """harel's rule: a group's priority is set by the publish that finds it drained (nothing
    waiting, no lease), and kept while it holds a message. The queue document outlives the
    drain here (harel deletes its lock document), so the publish must set it again: before,
    the first priority stuck, and a claim with `min_priority` never saw the group. Inline and
    spilling (a message over the inline bound) alike, on the server and on mongomock; a
    group that spilled is drained once a claim has found its overflow empty."""
    big = {"blob": "x" * (300 * 1024)}
    for layer, t in _transports(mongo_url, db_name):
        for data in ({}, big):
            g = f"g-{layer}-{'big' if data else 'small'}"
            t.publish(g, Event(kind="first", data=data), priority=0)
            t.publish(g, Event(kind="second", data=data), priority=3)  # not drained: kept
            assert t.claim("w", 30, min_priority=1) is None, layer
            for kind in ("first", "second"):
                lease = t.claim("w", 30)
                assert lease is not None and lease.event.kind == kind, layer
                t.ack(lease)
            assert t.claim("w", 30) is None, layer  # drained
            t.publish(g, Event(kind="third", data=data), priority=2)
            lease = t.claim("w", 30, min_priority=2)
            assert lease is not None and lease.event.kind == "third", (layer, g)
            t.publish(g, Event(kind="fourth"), priority=0)  # head in flight: not drained
            t.ack(lease)
            assert (lease := t.claim("w", 30, min_priority=2)) is not None and lease.event.kind == "fourth"
            t.ack(lease)
            if data:  # a group that spilled is known drained once a claim finds nothing (Rule 5)
                assert t.claim("w", 30) is None
            t.publish(g, Event(kind="fifth"), priority=0)  # drained again: back to 0
            assert t.claim("w", 30, min_priority=1) is None, layer
            t.ack(t.claim("w", 30))
