"""An app that uses Beanie itself: it passes the store's document models to its own
`init_beanie`, before or after it creates the store, and typed queries see what the store
wrote; a test suite that runs each test on its own event loop gets the same."""

from __future__ import annotations

import asyncio

import pymongo
from beanie import Document, init_beanie
from harel.engine.execution import Execution

from harel_beanie import DOCUMENT_MODELS, AsyncMongoStore, CounterDocument, ExecutionDocument, bind, document_models


class Order(Document):  # the app's own model
    sku: str

    class Settings:
        name = "orders"


def test_the_exported_models() -> None:
    assert DOCUMENT_MODELS == [ExecutionDocument, CounterDocument] == document_models()
    assert document_models("shop") == list(bind("shop"))
    assert [m.Settings.name for m in document_models("shop")] == ["shop_executions", "shop_counters"]  # type: ignore[attr-defined]


async def test_beanie_initialised_by_the_app_before_the_store(mongo_url: str, db_name: str) -> None:
    client: pymongo.AsyncMongoClient = pymongo.AsyncMongoClient(mongo_url)
    await init_beanie(database=client[db_name], document_models=[Order, *DOCUMENT_MODELS])
    store = AsyncMongoStore(client, db_name, beanie=False)  # the app's init_beanie bound them
    await store.save(Execution(definition_id="d", id="x"))
    await Order(sku="S-1").insert()
    doc = await ExecutionDocument.get("x")
    assert doc is not None and doc.status == "PENDING" and await Order.count() == 1
    await client.close()


async def test_beanie_initialised_by_the_app_after_the_store(mongo_url: str, db_name: str) -> None:
    client: pymongo.AsyncMongoClient = pymongo.AsyncMongoClient(mongo_url)
    store = AsyncMongoStore(client, db_name)
    await store.init()  # the store initialises its own classes...
    await init_beanie(database=client[db_name], document_models=[Order, *DOCUMENT_MODELS])  # ...and the app again
    await store.save(Execution(definition_id="d", id="y"))
    assert (await ExecutionDocument.find(ExecutionDocument.definition_id == "d").count()) == 1
    assert await store.load("y") is not None
    await client.close()


def test_one_loop_per_test(mongo_url: str, db_name: str) -> None:
    """Each "test" on an event loop of its own, with its own client and store, as
    pytest-asyncio's function-scoped loops give: the classes follow the newest store."""

    async def one_test(exe_id: str) -> int:
        client: pymongo.AsyncMongoClient = pymongo.AsyncMongoClient(mongo_url)
        store = AsyncMongoStore(client, db_name)
        await store.save(Execution(definition_id="d", id=exe_id))
        n = await ExecutionDocument.find_all().count()
        await store.close()
        return n

    assert asyncio.run(one_test("a")) == 1
    assert asyncio.run(one_test("b")) == 2
