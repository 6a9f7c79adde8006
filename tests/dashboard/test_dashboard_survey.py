"""The dashboard's look at its database (`dashboard.survey`) reads no execution where the
store's layout marker already says the store is there: on SecantusDB a `find_one({})` reads
the whole collection under the server's lock (3 s at 100,000 executions), and the look is
taken again every few seconds while the dashboard serves, so every page waited on it. Where
there is no marker (harel's own layout, a mistyped database) it still reads one document."""

from __future__ import annotations

from typing import Any

import pymongo
from pymongo import monitoring

from harel_beanie import AsyncMongoStore
from harel_beanie.dashboard.survey import survey


class _Reads(monitoring.CommandListener):
    def __init__(self) -> None:
        self.on_executions: list[str] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command.get(event.command_name) == "harel_executions" and event.command_name in ("find", "aggregate"):
            self.on_executions.append(event.command_name)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def test_a_marked_database_is_surveyed_without_reading_an_execution(mongo_url: str, db_name: str) -> None:
    reads = _Reads()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[reads]), db_name)
    await store.init()
    reads.on_executions.clear()
    found = await survey("harel")
    assert found.layout is not None and found.holds_store and not found.missing
    assert reads.on_executions == []
    await store.close()


async def test_a_database_without_the_marker_is_looked_at_once(mongo_url: str, db_name: str) -> None:
    reads = _Reads()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[reads]), db_name)
    await store.init()
    sync: Any = pymongo.MongoClient(mongo_url)[db_name]
    sync.harel_counters.delete_many({})  # as harel's own store leaves a database: no marker
    sync.harel_executions.insert_one({"_id": "x", "definition_id": "Order", "version": 1, "data": "{}"})
    reads.on_executions.clear()
    found = await survey("harel")
    assert found.layout is None and found.has_executions and found.holds_store
    assert reads.on_executions == ["find"]
    await store.close()
