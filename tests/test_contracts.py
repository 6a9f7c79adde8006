"""harel's own contract checks (harel.testing), on both stores, on the real server."""

from __future__ import annotations

from harel.engine.store.base import AsyncExecutionStore, ExecutionStore
from harel.testing import (
    assert_async_listing_contract,
    assert_async_outbox_contract,
    assert_async_purge_contract,
    assert_listing_contract,
    assert_outbox_contract,
    assert_purge_contract,
)


def test_sync_store_is_an_execution_store(store):
    assert isinstance(store, ExecutionStore)


async def test_async_store_is_an_async_execution_store(astore):
    assert isinstance(astore, AsyncExecutionStore)


def test_sync_listing_contract(store):
    assert_listing_contract(store, ordered=True, ns="L-")


def test_sync_outbox_contract(store):
    assert_outbox_contract(store, ns="O-")


def test_sync_purge_contract(store):
    assert_purge_contract(store, ns="P-")


async def test_async_listing_contract(astore):
    await assert_async_listing_contract(astore, ordered=True, ns="L-")


async def test_async_outbox_contract(astore):
    await assert_async_outbox_contract(astore, ns="O-")


async def test_async_purge_contract(astore):
    await assert_async_purge_contract(astore, ns="P-")


def test_contracts_share_one_database(store):
    # the contracts are namespaced so they hold on a backend shared with other data
    assert_listing_contract(store, ordered=True, ns="a.")
    assert_listing_contract(store, ordered=True, ns="a$")
    assert_outbox_contract(store, ns="b．")
    assert_purge_contract(store, ns="c\u00e9")


async def test_async_contracts_through_a_motor_client(mongo_url, db_name):
    # a drop-in for harel's AsyncMongoStore, which takes Motor's AsyncIOMotorClient
    from motor.motor_asyncio import AsyncIOMotorClient

    from harel_beanie import AsyncMongoStore

    store = AsyncMongoStore(AsyncIOMotorClient(mongo_url), db_name)
    await assert_async_listing_contract(store, ordered=True, ns="M-")
    await assert_async_outbox_contract(store, ns="M-")
    await assert_async_purge_contract(store, ns="M-")
    await store.close()


async def test_beanie_queries_see_what_the_store_wrote(astore):
    # the store initialises the Beanie documents on its database: the app queries them
    from harel.engine.execution import Execution, Status

    from harel_beanie import ExecutionDocument

    await astore.save(Execution(id="q1", definition_id="orders", status=Status.RUNNING))
    await astore.save(Execution(id="q2", definition_id="orders", status=Status.FAILED))
    failed = await ExecutionDocument.find(ExecutionDocument.status == "FAILED").to_list()
    assert [d.id for d in failed] == ["q2"] and failed[0].definition_id == "orders"
