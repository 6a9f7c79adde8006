"""The fast in-memory layer: harel's contracts on mongomock (sync) and mongomock-motor
(async). No server is involved, so this layer proves only what those fakes model faithfully;
the README lists what they don't (and every behaviour here also runs on the real server)."""

from __future__ import annotations

import mongomock
from harel.testing import (
    assert_async_listing_contract,
    assert_async_outbox_contract,
    assert_listing_contract,
    assert_outbox_contract,
)
from mongomock_motor import AsyncMongoMockClient

from harel_beanie import AsyncMongoStore, MongoStore


# The purge contract checks dedupe marks, which the store reads with an `$elemMatch`
# projection on a scalar array that mongomock does not implement: it runs on the real server.


def test_sync_contracts_on_mongomock():
    assert_listing_contract(MongoStore(mongomock.MongoClient(), "m"), ordered=True)
    assert_outbox_contract(MongoStore(mongomock.MongoClient(), "m"))


async def test_async_contracts_on_mongomock_motor():
    # mongomock-motor is a Motor-shaped client: Beanie can't init on it, the store's own
    # operations run all the same
    await assert_async_listing_contract(AsyncMongoStore(AsyncMongoMockClient(), "m"), ordered=True)
    await assert_async_outbox_contract(AsyncMongoStore(AsyncMongoMockClient(), "m"))
