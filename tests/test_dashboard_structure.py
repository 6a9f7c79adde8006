"""The dashboard's listing pages stay index-backed with 20,000 stored executions: every
command a page sends to the executions collection is captured (a PyMongo CommandListener on
the store's client) and explained. What SecantusDB cannot show (see tests/test_structure.py:
a filter on `_id` alone is reported as a collection scan there) is asserted on mongod only,
and structurally everywhere."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pymongo
import pytest
from fastapi import FastAPI
from harel.engine.execution import Execution, Status

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.dashboard import dashboard_router, no_auth
from tests.test_structure import ON_MONGOD, Recorder, _idle_documents, _stages

N = 20_000
PAGE = 25


def _plan(db: Any, name: str, cmd: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """The find a captured find/count runs, and the stages of its winning plan."""
    if name == "find":
        find = {k: cmd[k] for k in ("find", "filter", "sort", "limit", "projection", "hint") if k in cmd}
    else:  # count_documents: an aggregate whose first stage is the $match
        match = cmd["pipeline"][0].get("$match", {})
        find = {"find": cmd["aggregate"], "filter": match, **({"hint": cmd["hint"]} if "hint" in cmd else {})}
    explain = db.command("explain", find, verbosity="queryPlanner")
    return find, _stages(explain["queryPlanner"]["winningPlan"])


@pytest.fixture(scope="module")
def big(mongo_url: str) -> Any:
    db_name = f"hbt_dash_big_{int(time.time())}"
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(mongo_url)
    coll = client[db_name].harel_executions
    setup = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    setup.init()  # the layout recorded and the indexes made first, as on a database in use
    setup.close()
    docs = _idle_documents(0, N, time.time())
    for i in range(0, N, 2_000):
        coll.insert_many(docs[i : i + 2_000], ordered=False)
    yield mongo_url, db_name, None
    client.drop_database(db_name)
    client.close()


async def test_listing_pages_are_index_backed_at_20k(big: Any) -> None:
    mongo_url, db_name, _ = big
    rec = Recorder()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[rec]), db_name)
    await store.init()  # creates the indexes on the 20,000 documents
    now = time.time()
    for i in range(30):
        await store.save(Execution(id=f"f-{i:03d}", definition_id="Order", status=Status.FAILED, updated_at=now))
    for i in range(8):
        await store.save(Execution(id=f"f-000:R:{i}", definition_id="Region", status=Status.DONE, parent_id="f-000"))
    db = pymongo.MongoClient(mongo_url)[db_name]
    app = FastAPI()
    app.include_router(dashboard_router(store, auth=no_auth, page_size=PAGE))
    pages = {
        "by status, page 2": "/?status=FAILED&after=f-009",
        "by definition and status": "/?definition=Order&status=FAILED&after=f-003",
        "children of, page 2": "/?parent=f-000&after=f-000:R:3",
        "roots only": "/?roots=true",
        "failed queue, page 2": "/failed?after=f-010",
        "json, by parent": "/api/executions?parent=f-000&limit=25",
        "one execution": "/execution?id=f-000",
    }
    # (one page of each shape, each matching few of the 20,000: SecantusDB reads every match
    # whatever the limit, and counts by reading, so each page here already costs seconds
    # for its counts per status; that a page reads about a page on mongod is asserted for
    # the store's listing in tests/test_structure.py)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        for label, url in pages.items():
            rec.clear()
            r = await http.get(url)
            assert r.status_code == 200, (label, r.text[:500])
            sent = [
                (n, c)
                for n, c in rec.take()
                if n in ("find", "aggregate")
                and c.get(n) == "harel_executions"
                and not (n == "find" and set(c["filter"]) == {"_id"})
            ]  # a point read by _id (one execution)
            assert sent, label
            for name, cmd in sent:
                find, stages = _plan(db, name, cmd)
                scans = [ix for st, ix in stages if st in ("IXSCAN", "EXPRESS_IXSCAN", "COUNT_SCAN")]
                assert scans and not any(st == "COLLSCAN" for st, _ in stages), (label, find, stages)
                assert "skip" not in find, (label, find)
                if name == "find" and find.get("sort") == {"_id": 1} and label != "one execution":
                    assert find.get("limit") == PAGE + 1, (label, find)  # a page, and one to know if more
                    if "after=" in url:
                        assert set(find["filter"]["_id"]) == {"$gt"}, (label, find)  # a keyset, not an offset
    await store.close()


async def test_the_unfiltered_list_is_a_keyset_on_id(big: Any) -> None:
    """No filter: the `_id` index in `_id` order (mongod); SecantusDB reports any range on
    `_id` alone as a collection scan, so there the command's shape is what is checked."""
    mongo_url, db_name, _ = big
    rec = Recorder()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[rec]), db_name)
    db = pymongo.MongoClient(mongo_url)[db_name]
    app = FastAPI()
    app.include_router(dashboard_router(store, auth=no_auth, page_size=PAGE))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        await store.init()
        rec.clear()
        assert (await http.get("/?after=idle-000100")).status_code == 200
    finds = [c for n, c in rec.take() if n == "find" and c.get("find") == "harel_executions"]
    (page,) = [c for c in finds if c.get("sort") == {"_id": 1}]
    # (a tombstone holds no field to filter on: the unfiltered page leaves it out by name)
    assert page["filter"] == {"_id": {"$gt": "idle-000100"}, "tomb": {"$exists": False}} and page["limit"] == PAGE + 1
    if ON_MONGOD:
        _, stages = _plan(db, "find", page)
        assert ("IXSCAN", "_id_") in stages and not any(st == "COLLSCAN" for st, _ in stages), stages
    await store.close()
