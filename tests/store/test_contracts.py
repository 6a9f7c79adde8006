"""harel's own contract checks (harel.testing), on both stores, on the real server."""

from __future__ import annotations

import pytest
from harel.engine.store.base import AsyncExecutionStore, ExecutionStore

from tests.support.contracts import ASYNC, SYNC

#: each contract on a database of its own, its ids under a prefix
NAMESPACED = [("listing", "L-"), ("outbox", "O-"), ("purge", "P-")]


def test_sync_store_is_an_execution_store(store):
    assert isinstance(store, ExecutionStore)


async def test_async_store_is_an_async_execution_store(astore):
    assert isinstance(astore, AsyncExecutionStore)


@pytest.mark.parametrize("contract, ns", NAMESPACED)
def test_sync_contract(store, contract, ns):
    SYNC[contract](store, ns)


@pytest.mark.parametrize("contract, ns", NAMESPACED)
async def test_async_contract(astore, contract, ns):
    await ASYNC[contract](astore, ns)


def test_contracts_share_one_database(store):
    # the contracts are namespaced so they hold on a backend shared with other data
    for contract, ns in (("listing", "a."), ("listing", "a$"), ("outbox", "b．"), ("purge", "c\u00e9")):
        SYNC[contract](store, ns)


async def test_async_contracts_through_a_motor_client(mongo_url, db_name):
    # a drop-in for harel's AsyncMongoStore, which takes Motor's AsyncIOMotorClient
    from motor.motor_asyncio import AsyncIOMotorClient

    from harel_beanie import AsyncMongoStore

    store = AsyncMongoStore(AsyncIOMotorClient(mongo_url), db_name)
    for check in ASYNC.values():
        await check(store, "M-")
    await store.close()


async def test_beanie_queries_see_what_the_store_wrote(astore):
    # the store initialises the Beanie documents on its database: the app queries them
    from harel.engine.execution import Execution, Status

    from harel_beanie import ExecutionDocument

    await astore.save(Execution(id="q1", definition_id="orders", status=Status.RUNNING))
    await astore.save(Execution(id="q2", definition_id="orders", status=Status.FAILED))
    failed = await ExecutionDocument.find(ExecutionDocument.status == "FAILED").to_list()
    assert [d.id for d in failed] == ["q2"] and failed[0].definition_id == "orders"
