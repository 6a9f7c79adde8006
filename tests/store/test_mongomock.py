"""The fast in-memory layer: harel's contracts on mongomock (sync) and mongomock-motor
(async). No server is involved, so this layer proves only what those fakes model faithfully;
docs/testing.md lists what they don't (and every behaviour here also runs on the real server).
The store picks, from the client kind, the forms of the reads and the write mongomock lacks
(the `$elemMatch` projection, the `delete_timer` pipeline); these tests cover those forms."""

from __future__ import annotations

import mongomock
from harel.engine.execution import Execution
from harel.engine.store.base import TimerOp
from mongomock_motor import AsyncMongoMockClient

from harel_beanie import AsyncMongoStore, MongoStore
from tests.support.contracts import ASYNC, SYNC


def test_sync_contracts_on_mongomock():
    for check in SYNC.values():
        check(MongoStore(mongomock.MongoClient(), "m"), "")


async def test_async_contracts_on_mongomock_motor():
    # mongomock-motor is a Motor-shaped client: Beanie can't init on it, the store's own
    # operations run all the same
    for check in ASYNC.values():
        await check(AsyncMongoStore(AsyncMongoMockClient(), "m"), "")


def test_dedupe_and_timers_on_mongomock():
    store = MongoStore(mongomock.MongoClient(), "m")
    exe = Execution(definition_id="d")
    timers = (TimerOp("schedule", "A.t", 10.0), TimerOp("schedule", "B.t", 20.0))
    store.commit(exe, [], processed_event_id="e1", timers=timers)
    assert store.load_for_event(exe.id, "e1")[1] and not store.load_for_event(exe.id, "e2")[1]
    assert store.is_processed(exe.id, "e1") and not store.is_processed(exe.id, "e2")
    assert store.load_for_event("nope", "e1") == (None, False)
    assert store.due_timers(15.0) == [(exe.id, "A.t", 10.0)]
    store.delete_timer(exe.id, "A.t", 9.0)  # another fire time: left alone
    assert store.due_timers(15.0) == [(exe.id, "A.t", 10.0)]
    store.delete_timer(exe.id, "A.t", 10.0)
    assert store.due_timers(15.0) == []
    assert store.due_timers(25.0) == [(exe.id, "B.t", 20.0)]
    store.delete_timer(exe.id, "B.t", 20.0)
    assert store.due_timers(float("inf")) == []
