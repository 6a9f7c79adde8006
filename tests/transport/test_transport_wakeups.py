"""Idle claims without polling: on a server with change streams (SecantusDB as its default
one-member replica set, as a replica set or Atlas would be), a claim that finds nothing waits
on a change stream and is woken by a publish made from another process's client, by a nack,
and by the store's next timer; on a standalone server it polls; when the stream breaks (the
server restarted on its data) claimers poll until it is open again, from its resume token,
and no message is missed. The transport's contract, harel's worker draining through it and
the worker command run here on the replica-set server too (the rest of the suite runs on a
standalone one; `HAREL_BEANIE_TEST_REPLICA_SET=1` runs all of it on a replica set).

No timing is asserted: each wait is bounded far above the wake-up it waits for (`idle_wait`
is a minute), so a claim that returns in time was woken, and the wake-up counters say by what.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Iterator

import pymongo
import pytest
from harel.engine.aio.distributed import AsyncDistributedRunner
from harel.engine.execution import Execution, Status
from harel.engine.store.base import TimerOp
from harel.spec.states import Event
from harel.testing import assert_async_transport_contract

from harel_beanie import AsyncMongoStore
from harel_beanie.deploy.embedded import EmbeddedServer
from harel_beanie.deploy.loader import default_models_dir, load_models
from harel_beanie.transport import AsyncMongoTransport

MODELS = default_models_dir()  # the shop models, shipped in the package
LONG = 60.0  # idle_wait: far above any wake-up these tests wait for
BOUND = 30.0  # how long a test waits for a claim to come back


@pytest.fixture(scope="module")
def rs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    """SecantusDB as a one-member replica set (change streams on), on a data directory of its
    own so that it can be restarted on the same data."""
    server = EmbeddedServer(tmp_path_factory.mktemp("rs-data"), standalone=False)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _db() -> str:
    return "hbt_w_" + uuid.uuid4().hex[:10]


async def _streaming(t: AsyncMongoTransport) -> None:
    """Until the transport's stream is open (set-up starts it in the background)."""
    await t.init()
    assert t.wakeups is not None
    for _ in range(300):  # bounded: 30 s
        if t.wakeups.mode == "stream":
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"the change stream never opened: mode {t.wakeups.mode}")


async def test_a_publish_from_another_client_wakes_an_idle_claim(rs_server: EmbeddedServer) -> None:
    db = _db()
    waiter = AsyncMongoTransport(pymongo.AsyncMongoClient(rs_server.url), db, idle_wait=LONG)
    other = AsyncMongoTransport(pymongo.AsyncMongoClient(rs_server.url), db)  # another process's, in effect
    await _streaming(waiter)
    assert waiter.wakeups is not None
    before = waiter.wakeups.notifications
    claim = asyncio.create_task(waiter.claim("w", 30))
    await asyncio.sleep(0.5)  # the claim found nothing and waits
    assert not claim.done()
    await other.publish("g", Event(kind="Wake"))
    lease = await asyncio.wait_for(claim, BOUND)
    assert lease is not None and lease.event.kind == "Wake"
    assert waiter.wakeups.notifications > before and waiter.wakeups.mode == "stream"
    await waiter.close()
    await other.close()


async def test_a_nack_and_an_ack_with_more_to_do_wake_a_claim_of_another_process(rs_server: EmbeddedServer) -> None:
    db = _db()
    holder = AsyncMongoTransport(pymongo.AsyncMongoClient(rs_server.url), db)
    waiter = AsyncMongoTransport(pymongo.AsyncMongoClient(rs_server.url), db, idle_wait=LONG)
    await _streaming(waiter)
    for kind in ("first", "second"):
        await holder.publish("g", Event(kind=kind))
    held = await holder.claim("h", 30)
    assert held is not None
    claim = asyncio.create_task(waiter.claim("w", 30))
    await asyncio.sleep(0.5)
    assert not claim.done()  # the only group is in flight
    await holder.nack(held)
    again = await asyncio.wait_for(claim, BOUND)
    assert again is not None and again.event.kind == "first"
    claim = asyncio.create_task(waiter.claim("w2", 30))
    await asyncio.sleep(0.5)
    assert not claim.done()
    await waiter.ack(again)  # leaves "second": the group is claimable again, and says so
    nxt = await asyncio.wait_for(claim, BOUND)
    assert nxt is not None and nxt.event.kind == "second"
    await holder.close()
    await waiter.close()


async def test_the_stores_next_timer_ends_an_idle_wait(rs_server: EmbeddedServer) -> None:
    db = _db()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(rs_server.url), db)
    transport = AsyncMongoTransport(
        pymongo.AsyncMongoClient(rs_server.url), db, idle_wait=LONG, timers=store.next_timer
    )
    await _streaming(transport)
    due = time.time() + 1.5
    await store.commit(
        Execution(id="t", definition_id="d", status=Status.RUNNING), [], timers=(TimerOp("schedule", "Wait", due),)
    )
    assert await store.next_timer(time.time()) == pytest.approx(due)
    # nothing to claim: the claim comes back (None) once the timer is due, for the worker's sweep
    assert await asyncio.wait_for(transport.claim("w", 30), BOUND) is None
    assert time.time() >= due - 0.05  # it waited for the timer, not less
    await transport.close()
    await store.close()


async def test_a_standalone_server_gets_polling(mongo_url: str, client: Any) -> None:
    hello = client.admin.command("hello")
    if hello.get("setName"):
        pytest.skip("the session's server is a replica set (HAREL_BEANIE_TEST_REPLICA_SET=1 or MONGODB_URL)")
    db = _db()
    waiter = AsyncMongoTransport(pymongo.AsyncMongoClient(mongo_url), db, idle_wait=LONG, poll_interval=0.05)
    other = AsyncMongoTransport(pymongo.AsyncMongoClient(mongo_url), db)
    await waiter.init()
    claim = asyncio.create_task(waiter.claim("w", 30))
    await asyncio.sleep(0.3)
    await other.publish("g", Event(kind="Polled"))
    lease = await asyncio.wait_for(claim, BOUND)
    assert lease is not None and waiter.wakeups is not None
    for _ in range(50):  # the stream task gave up for good: no change streams here
        if waiter.wakeups._task is not None and waiter.wakeups._task.done():
            break
        await asyncio.sleep(0.1)
    assert waiter.wakeups.mode == "poll" and waiter.wakeups.opened == 0
    await waiter.close()
    await other.close()
    client.drop_database(db)


async def test_a_restart_keeps_wake_ups_and_misses_nothing(rs_server: EmbeddedServer) -> None:
    """The server stopped under an open stream and started again on its data: the stream goes
    on from its resume token (the driver resumes it, or the transport opens it again), a claim
    waiting after the restart is woken by a publish, and every message is claimed once."""
    db = _db()
    options = {"serverSelectionTimeoutMS": 20_000}
    waiter = AsyncMongoTransport(pymongo.AsyncMongoClient(rs_server.url, **options), db, idle_wait=LONG)
    other = AsyncMongoTransport(pymongo.AsyncMongoClient(rs_server.url, **options), db)
    await _streaming(waiter)
    assert waiter.wakeups is not None
    await other.publish("g", Event(id="before", kind="M"))
    first = await asyncio.wait_for(waiter.claim("w", 30), BOUND)
    assert first is not None and first.event.id == "before"
    await waiter.ack(first)
    rs_server.stop()
    rs_server.start()
    await _streaming(waiter)
    before = waiter.wakeups.notifications
    claim = asyncio.create_task(waiter.claim("w", 30))
    await asyncio.sleep(1.0)
    await other.publish("g", Event(id="after", kind="M"))
    lease = await asyncio.wait_for(claim, BOUND)
    assert lease is not None and lease.event.id == "after"
    assert waiter.wakeups.notifications > before and waiter.wakeups.mode == "stream"
    await waiter.ack(lease)
    assert await other.claim("x", 30) is None  # nothing claimed twice, nothing left
    await waiter.close()
    await other.close()


async def test_an_invalidated_stream_is_opened_again(rs_server: EmbeddedServer) -> None:
    """A stream the server ends (its database dropped: an invalidate) is opened again with no
    token, and wakes claimers as before."""
    db = _db()
    waiter = AsyncMongoTransport(pymongo.AsyncMongoClient(rs_server.url), db, idle_wait=LONG)
    other = AsyncMongoTransport(pymongo.AsyncMongoClient(rs_server.url), db)
    await _streaming(waiter)
    assert waiter.wakeups is not None
    await other.publish("g", Event(kind="M"))
    await pymongo.AsyncMongoClient(rs_server.url).drop_database(db)
    for _ in range(300):  # bounded: 30 s
        if waiter.wakeups.opened >= 2 and waiter.wakeups.mode == "stream":
            break
        await asyncio.sleep(0.1)
    assert waiter.wakeups.opened >= 2 and waiter.wakeups.mode == "stream", vars(waiter.wakeups)
    claim = asyncio.create_task(waiter.claim("w", 30))
    await asyncio.sleep(0.5)
    await other.publish("g2", Event(kind="After"))
    lease = await asyncio.wait_for(claim, BOUND)
    assert lease is not None and lease.event.kind == "After"
    await waiter.close()
    await other.close()


async def test_the_contract_holds_on_the_replica_set(rs_server: EmbeddedServer) -> None:
    await assert_async_transport_contract(
        lambda clock: AsyncMongoTransport(pymongo.AsyncMongoClient(rs_server.url), _db(), clock)
    )


async def test_harels_worker_drains_through_stream_wake_ups(rs_server: EmbeddedServer) -> None:
    """harel's `AsyncWorker.run`, idle between bursts, on this transport with the stream
    open: every execution reaches its end."""
    db = _db()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(rs_server.url), db)
    transport = AsyncMongoTransport(
        pymongo.AsyncMongoClient(rs_server.url), db, idle_wait=LONG, timers=store.next_timer
    )
    await _streaming(transport)
    definitions = load_models(MODELS)
    runner = AsyncDistributedRunner(store, transport, definitions)
    worker = runner.worker(worker_id="rs-worker", concurrency=8)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        for burst in range(3):
            for i in range(4):
                await runner.create(
                    "Payment", {"order_id": f"{burst}-{i}", "amount": 2.0}, execution_id=f"p-{burst}-{i}"
                )
            for _ in range(300):  # bounded: 30 s per burst
                done = [await store.load(f"p-{burst}-{i}") for i in range(4)]
                if all(e is not None and e.active_path == "Captured" for e in done):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"burst {burst} never finished")
    finally:
        stop.set()
        transport.wake()
        await asyncio.wait_for(task, BOUND)
    assert transport.wakeups is not None and transport.wakeups.notifications > 0
    await transport.close()
    await store.close()
