"""What a caller of harel's MongoStore / AsyncMongoStore reads or sets works the same on
this store: the constructor forms, `from_url` with harel's positional arguments, settable
`trace_max`, `close`, and the collections harel's stores keep as attributes."""

from __future__ import annotations

import inspect
from typing import Any

import mongomock
import pytest
from harel.engine.aio_store.mongo import AsyncMongoStore as HarelAsyncMongoStore
from harel.engine.execution import Execution
from harel.engine.store.mongo import MongoStore as HarelMongoStore
from mongomock_motor import AsyncMongoMockClient

from harel_beanie import AsyncMongoStore, MongoStore, RetryPolicy


@pytest.mark.parametrize("ours, theirs", [(MongoStore, HarelMongoStore), (AsyncMongoStore, HarelAsyncMongoStore)])
def test_every_argument_of_harels_constructors_is_accepted(ours: Any, theirs: Any) -> None:
    for name in ("__init__", "from_url"):
        mine = inspect.signature(getattr(ours, name)).parameters
        by_keyword = any(q.kind == q.VAR_KEYWORD for q in mine.values())  # passed on as options
        for p in inspect.signature(getattr(theirs, name)).parameters.values():
            if p.kind == p.KEYWORD_ONLY and by_keyword and p.name not in mine:
                continue
            assert p.name in mine, f"{ours.__name__}.{name} lacks {p.name}"
            assert mine[p.name].kind == p.kind, f"{ours.__name__}.{name}({p.name}) is taken another way"


def test_trace_max_is_settable_and_honoured() -> None:
    store = MongoStore(mongomock.MongoClient(), prefix="app")
    assert store.trace_max == 200
    store.trace_max = 2
    exe = Execution(definition_id="d")
    for i in range(4):
        store.commit(exe, [], trace={"step": i})
    assert [s["index"] for s in store.read_trace(exe.id)] == [2, 3]
    with pytest.raises(ValueError):
        store.trace_max = -1
    assert store.trace_max == 2


async def test_async_trace_max_is_settable_and_honoured() -> None:
    store = AsyncMongoStore(AsyncMongoMockClient())
    store.trace_max = 1
    exe = Execution(definition_id="d")
    for i in range(3):
        await store.commit(exe, [], trace={"step": i})
    assert [s["step"] for s in await store.read_trace(exe.id)] == [2]
    await store.close()


def test_harels_collection_attributes() -> None:
    client = mongomock.MongoClient()
    store = MongoStore(client, "shop", prefix="app")
    store.save(Execution(definition_id="d", id="x"))
    assert store._db.name == "shop"
    assert store._exes.name == "app_executions" and store._exes.find_one({"_id": "x"})["version"] == 1
    assert store._counters.name == "app_counters"


def test_from_url_takes_harels_positional_arguments(mongo_url: str, db_name: str) -> None:
    store = MongoStore.from_url(mongo_url, db_name, 2, 0.1, prefix="p")
    store.save(Execution(definition_id="d", id="x"))
    assert store.load("x") is not None and store.settings.prefix == "p"
    store.close()


async def test_async_from_url_takes_harels_positional_arguments(mongo_url: str, db_name: str) -> None:
    store = await AsyncMongoStore.from_url(mongo_url, db_name, 2, 0.1)
    await store.save(Execution(definition_id="d", id="x"))
    assert (await store.load("x")) is not None
    await store.close()


def test_harels_retry_arguments_override_the_policy() -> None:
    policy = RetryPolicy(attempts=5, delay=2.0, timeout_ms=100).overridden(3, None)
    assert (policy.attempts, policy.delay, policy.timeout_ms) == (3, 2.0, 100)
