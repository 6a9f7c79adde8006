"""The smallest values of a field (`harel_beanie.queries.lowest`: the backlog's soonest timers
and longest-silent executions) are exactly a full sorted query's first N, sent as one query
where `limit` bounds the server's work and in windows where it does not; and in windows a
read touches about N documents, however many match.

Checked on random timers and silences, sent as each kind of server would get them, while
documents arrive below the last read's smallest value, leave, and move between reads."""

from __future__ import annotations

import os
import random
from typing import Any

import pymongo
import pytest
from pymongo import monitoring

from harel_beanie import AsyncMongoStore
from harel_beanie.core.documents import ExecutionDocument
from harel_beanie.core.keys import ANY_TIME
from harel_beanie.queries import lowest as lowest_module
from harel_beanie.queries.lowest import lowest
from harel_beanie.queries.rows import ExecutionRow, TimerRow
from harel_beanie.queries.server import MONGOD, SECANTUS, Server
from harel_beanie.queries.single import stuck_filter
from tests.store.test_structure import _idle_documents

NOW = 1_800_000_000.0


@pytest.fixture(params=[MONGOD, SECANTUS], ids=lambda s: s.name)
def as_if(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Server:
    """The read sent as it is to this kind of server, whichever the tests run on; nothing
    remembered from another test."""

    async def server_of(collection: Any) -> Server:
        return request.param  # type: ignore[no-any-return]

    monkeypatch.setattr(lowest_module, "server_of", server_of)
    monkeypatch.setattr(lowest_module, "_START", {})
    monkeypatch.setattr(lowest_module, "_KEPT", {})
    return request.param  # type: ignore[no-any-return]


def _shaped(docs: list[dict[str, Any]], rnd: random.Random, start: int) -> list[dict[str, Any]]:
    for i, d in enumerate(docs):
        d["_id"] = f"x{start + i:06d}"
        d["updated_at"] = NOW - rnd.random() * 30 * 86400  # silent for up to a month
        d["status"] = "RUNNING" if rnd.random() < 0.8 else "DONE"
        if "next_fire" in d:
            d["next_fire"] = NOW + rnd.choice([-1, 1]) * rnd.random() * 7 * 86400  # some overdue
    return docs


async def _want(query: dict[str, Any], field: str, n: int) -> list[float]:
    coll = ExecutionDocument.get_pymongo_collection()
    return [d[field] async for d in coll.find(query, {field: 1}).sort(field, 1).limit(n)]


async def test_the_smallest_are_the_full_query_s_first_while_documents_change(astore: Any, as_if: Server) -> None:
    rnd = random.Random(5)
    await astore.init()
    coll = ExecutionDocument.get_pymongo_collection()
    await coll.insert_many(_shaped(_idle_documents(0, 600, NOW), rnd, 0))
    made = 600
    for step in range(12):
        n = rnd.choice([1, 3, 10, 50])
        timers = await lowest(ExecutionDocument, {"next_fire": dict(ANY_TIME)}, "next_fire", n, TimerRow)
        assert [r.next_fire for r in timers] == await _want({"next_fire": dict(ANY_TIME)}, "next_fire", n)
        silent = stuck_filter(rnd.choice([60.0, 86400.0]), now=NOW)
        stuck = await lowest(ExecutionDocument, silent, "updated_at", n, ExecutionRow)
        assert [r.updated_at for r in stuck] == await _want(silent, "updated_at", n)
        # between reads: some arrive below what was smallest, some leave, some move up
        low_timer = timers[0].next_fire if timers else NOW
        fresh = _shaped(_idle_documents(made, made + 20, NOW), rnd, made)
        for d in fresh:
            d["updated_at"] -= 40 * 86400  # silent longer than any before
            if "next_fire" in d:
                d["next_fire"] = (low_timer or NOW) - rnd.random() * 3600
        made += 20
        await coll.insert_many(fresh)
        gone = [r.id for r in stuck[: rnd.randint(0, len(stuck))]]
        await coll.delete_many({"_id": {"$in": gone}})
        await coll.update_many({"_id": {"$in": [r.id for r in timers[:2]]}}, {"$set": {"next_fire": NOW + 8 * 86400.0}})


class _Finds(monitoring.CommandListener):
    def __init__(self) -> None:
        self.filters: list[dict[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "find" and event.command["find"] == "harel_executions":
            self.filters.append(dict(event.command["filter"]))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.mark.skipif(bool(os.environ.get("MONGODB_URL")), reason="the windows are what the embedded server is sent")
async def test_a_read_touches_about_n_however_many_match(
    mongo_url: str, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backlog's ten soonest timers were one sorted, limited query: SecantusDB read every
    execution waiting on a timer for them (296 ms at 100,000 stored executions, 8,000 of
    them waiting). Here the documents each read's filter matches are counted again: after a
    process's first read, a read of 10 touches a few dozen of the 2,000 waiting."""
    monkeypatch.setattr(lowest_module, "_START", {})
    monkeypatch.setattr(lowest_module, "_KEPT", {})
    watched = _Finds()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[watched]), db_name)
    await store.init()
    rnd = random.Random(9)
    sync = pymongo.MongoClient(mongo_url)[db_name].harel_executions
    sync.insert_many(_shaped(_idle_documents(0, 4_000, NOW), rnd, 0))
    work = []
    for _ in range(4):
        watched.filters.clear()
        got = await lowest(ExecutionDocument, {"next_fire": dict(ANY_TIME)}, "next_fire", 10, TimerRow)
        work.append(sum(sync.count_documents(f) for f in watched.filters))
        assert [r.next_fire for r in got] == await _want({"next_fire": dict(ANY_TIME)}, "next_fire", 10)
    # a new process (`harel-beanie status`) starts where the database says the last began
    lowest_module._START.clear()
    watched.filters.clear()
    got = await lowest(ExecutionDocument, {"next_fire": dict(ANY_TIME)}, "next_fire", 10, TimerRow)
    work.append(sum(sync.count_documents(f) for f in watched.filters))
    assert [r.next_fire for r in got] == await _want({"next_fire": dict(ANY_TIME)}, "next_fire", 10)
    await store.close()
    assert work[0] >= 1_900, work  # the first reads every match (so the counting sees the reads)
    assert max(work[1:]) <= 100, work
