"""A time search (a listing bounded by `updated_at`) is listed newest first and read from the
top of its span down: a page reads about a page, and a count stops near its cap, however
many executions the span holds. At a million executions one day held about 33,000 and its
first page cost 10 s on the embedded server, read whole and sorted by id.

The order itself (pages equal to one full query, on both kinds of server) is checked with the
other filters in tests/queries/test_listing_parts.py."""

from __future__ import annotations

import os
import random
import uuid
from typing import Any

import pymongo
import pytest
from harel.engine.execution import Execution, Status

from harel_beanie import AsyncMongoStore, queries
from harel_beanie.core.arguments import BadArgument
from harel_beanie.core.time_order import TIME_SORT, after_time_cursor, read_time_cursor, time_cursor
from harel_beanie.queries import timed
from tests.queries.test_listing_parts import _Matches
from tests.store.test_structure import _idle_documents

DAY = 86_400.0
T0 = 1_800_000_000.0


def test_the_cursor_is_the_last_rows_place_and_nothing_else_is_taken_for_one() -> None:
    for when, eid in [(T0 + 0.1, "a:b"), (1e-300, ""), (-5.0, "日本")]:
        assert read_time_cursor(time_cursor(when, eid)) == (when, eid)
    for bad in ["", "abc", "1.5", "nan:x", "inf:x", "-inf:x", "1e999:x"]:
        with pytest.raises(BadArgument, match="after"):
            read_time_cursor(bad)
    q = after_time_cursor({"updated_at": {"$gte": 1.0}}, time_cursor(5.0, "k"))
    assert q == {"updated_at": {"$gte": 1.0, "$lte": 5.0}, "$or": [{"updated_at": {"$lt": 5.0}}, {"_id": {"$lt": "k"}}]}


def test_a_span_walk_tiles_its_span_from_the_top_down() -> None:
    walk = timed.SpanWalk({"$gte": 100.0, "$lt": 1124.0}, target=10)
    seen = []
    while not walk.done:
        bounds = walk.next()
        seen.append((bounds.get("$gte"), bounds["$lt"]))
        walk.saw(0)  # empty windows: each doubles
    assert seen[0] == (1123.0, 1124.0) and seen[-1][0] == 100.0
    assert all(low == nxt_high for (low, _), (_, nxt_high) in zip(seen, seen[1:]))
    assert len(seen) <= 11
    opened = timed.SpanWalk({"$gte": 100.0}, target=10)  # open above: at and above now, first
    assert set(opened.next()) == {"$gte"}


@pytest.mark.skipif(bool(os.environ.get("MONGODB_URL")), reason="the windows are what the embedded server is sent")
async def test_a_time_page_and_its_counts_read_about_a_page(mongo_url: str, db_name: str) -> None:
    n, page = 4_000, 50
    rnd = random.Random(8)
    watched = _Matches()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[watched]), db_name)
    await store.init()
    docs = _idle_documents(0, n, T0)
    for d in docs:  # one day of executions, nine in ten finished
        d["_id"] = uuid.UUID(int=rnd.getrandbits(128)).hex
        d["status"] = "DONE" if rnd.random() < 0.9 else "RUNNING"
        d["updated_at"] = T0 - rnd.random() * DAY
    sync = pymongo.MongoClient(mongo_url)[db_name].harel_executions
    sync.insert_many(docs)
    flt = queries.ExecutionFilter(updated_after=T0 - DAY, updated_before=T0 + 1)
    full = [d["_id"] for d in sync.find(flt.query(), {"_id": 1}).sort(TIME_SORT)]
    assert len(full) == n

    def work() -> int:  # the documents the bounded stages matched: what the server read
        got = sum(sync.count_documents(lead) for lead in watched.leads)
        watched.leads.clear()
        return got

    after, at, costs = None, 0, []
    for _ in range(3):  # three pages in a row
        got = await queries.executions_page(flt, after=after, limit=page, hint=True)
        assert [r.id for r in got.rows] == full[at : at + page]
        costs.append(work())
        after, at = got.next_after, at + page
    deep = sync.find_one({"_id": full[2_000]})
    assert deep is not None
    got = await queries.executions_page(flt, after=time_cursor(deep["updated_at"], deep["_id"]), limit=page, hint=True)
    assert [r.id for r in got.rows] == full[2_001 : 2_001 + page]
    costs.append(work())
    assert max(costs) <= 10 * page, costs  # about 160 here; read whole, each page was all 4,000

    counts = await queries.status_counts(flt, hint=True)
    running = sum(1 for d in docs if d["status"] == "RUNNING")
    assert counts == {"DONE": timed.SPAN_COUNT_CAP, "RUNNING": running}, counts
    assert work() <= 3 * timed.SPAN_COUNT_CAP + running  # stops near the cap (about 1,600 here)
    await store.close()


async def test_an_id_as_the_cursor_of_a_time_search_is_its_end(astore: Any) -> None:
    """An id (a cursor of a listing by id) names a row with no time: the time order puts
    those last, so nothing follows it. Answered, not refused: `after` is any string."""
    await astore.init()
    await astore.save(Execution(id="x", definition_id="Order", status=Status.DONE, updated_at=T0))
    flt = queries.ExecutionFilter(updated_after=T0 - DAY)
    assert [r.id for r in (await queries.executions_page(flt, hint=True)).rows] == ["x"]
    page = await queries.executions_page(flt, after="x", hint=True)
    assert page.rows == [] and page.next_after is None
    assert [r.id async for r in queries.executions(flt, after="x")] == []


async def test_hostile_cursors_of_a_time_search_are_refused_or_literal(astore: Any) -> None:
    """A cursor is request text: a non-string is refused naming `after`; any string is a place
    in the order, its id a literal (an operator-looking id matches no row's id)."""
    await astore.init()
    await astore.save(Execution(id="x", definition_id="Order", status=Status.DONE, updated_at=T0))
    flt = queries.ExecutionFilter(updated_after=T0 - DAY)
    for bad in [{"$gt": ""}, ["a"], 5, True]:
        with pytest.raises(TypeError, match="after"):
            await queries.executions_page(flt, after=bad, hint=True)  # type: ignore[arg-type]
    for text in [f"{T0 + 1}:" + '{"$gt": ""}', f"{T0 + 1}:$gt", f"{T0 + 1}:\x00", "1e308:x", "\x00"]:
        page = await queries.executions_page(flt, after=text, hint=True)
        # a time above the row's: it follows; no time (not a cursor): nothing follows
        assert [r.id for r in page.rows] == ([] if text == "\x00" else ["x"]), text
