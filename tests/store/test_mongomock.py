"""The fast in-memory layer: harel's contracts on mongomock (sync) and mongomock-motor
(async). No server is involved, so this layer proves only what those fakes model faithfully;
docs/testing.md lists what they don't (and every behaviour here also runs on the real server).
The store picks, from the client kind, the forms of the reads and the write mongomock lacks
(the `$elemMatch` projection, the `delete_timer` pipeline); these tests cover those forms."""

from __future__ import annotations

from typing import Any

import mongomock
from harel.engine.execution import Execution, Status
from harel.engine.store.base import TimerOp
from mongomock_motor import AsyncMongoMockClient

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.core.count_documents import counts_collection
from harel_beanie.core.counting import unkey
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


def _counted(n: int) -> list[Execution]:
    return [Execution(id=f"x{i}", definition_id="d", status=Status.DONE if i % 2 else Status.RUNNING) for i in range(n)]


def _totals(db: Any) -> dict[str, int]:
    """The counters' sums per status (every counter document of the prefix)."""
    out: dict[str, int] = {}
    for counter in db[counts_collection("harel")].find({"n": {"$exists": True}}):
        for per in counter["n"].values():
            for status, n in per.items():
                out[unkey(status)] = out.get(unkey(status), 0) + n
    return out


def test_the_counts_fold_on_mongomock():
    """The fold marks a batch with one bulk write (core.flows.counting); mongomock's bulk
    write refuses PyMongo's operations, so on it the ops go one at a time (store.dispatch)."""
    store = MongoStore(mongomock.MongoClient(), "m")
    for exe in _counted(6):
        store.commit(exe, [])
    store.fold_counts()
    coll = store._client["m"]["harel_executions"]
    assert coll.count_documents({"cdirty": True}) == 0 and coll.count_documents({"cseq": {"$exists": True}}) == 6
    assert _totals(store._client["m"]) == {"DONE": 3, "RUNNING": 3}


async def test_the_counts_fold_on_mongomock_motor():
    store = AsyncMongoStore(AsyncMongoMockClient(), "m")
    for exe in _counted(4):
        await store.commit(exe, [])
    await store.fold_counts()
    assert _totals(store._client["m"].delegate) == {"DONE": 2, "RUNNING": 2}
