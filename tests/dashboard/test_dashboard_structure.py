"""The dashboard's pages stay index-backed with 20,000 stored executions: every command a
page sends is captured (a PyMongo CommandListener on the store's client) and explained.

- The front page's reads are counted: exactly the commands it sends, in order, for the plain
  page and for each way of searching (id prefix, definition, status, outcome, parent, roots,
  a time range as "within", as from / to, and as the JSON twin's `updated_after` /
  `updated_before`), each find and count naming its index and explained as a scan of it, so a
  change that adds a read or a collection scan fails here. A time range reads only the
  executions updated in it (hb_status_updated), not the collection.
- The other listing pages (failed queue, children, one execution) are explained the same way.

Which explain is trusted: mongod's only (`MONGODB_URL`). SecantusDB's is synthesised (an index
scan reports its matches, never the walk: a hinted read walks the whole index, and every match
is read whatever the limit, while its explain shows neither), so there the assertions are on
the work itself: the reads are sent unhinted, each page's reads are stages the server bounds
by an index range (`harel_beanie.queries.parts`), and what they read is counted as what those
stages match (a count per stage), a few pages' worth at most. (The first page of a filter in a
dashboard process reads its parts whole, once, to learn where its windows start: each page
is requested twice and the second counted.)

The dashboard's sampler (a sample a minute for the charts) sends from an asyncio task of its
own; a page's reads are those of the request's task. The counts and the definitions list come
from the counters the store keeps (`harel_beanie.queries.counts`), never from a count or a
`distinct` over the executions: that is checked on every server."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlencode

import httpx
import pymongo
import pytest
from fastapi import FastAPI
from harel.engine.execution import Execution, Status
from pymongo import monitoring

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.dashboard import dashboard_router, no_auth
from harel_beanie.queries import STATUSES
from tests.store.test_structure import ON_MONGOD, _idle_documents, _stages

N = 20_000
PAGE = 25
#: whose explain the plan assertions trust (see the module docstring)
EXPLAIN_TRUSTED = ON_MONGOD
#: the most documents a page's reads may make SecantusDB read
MOST_READ = 20 * PAGE


def _is_page_read(name: str, cmd: dict[str, Any]) -> bool:
    """A listing's read (sorted, limited), as opposed to a count."""
    if name == "find":
        return "sort" in cmd
    return any("$sort" in stage for stage in cmd["pipeline"])


def _first_stage(name: str, cmd: dict[str, Any]) -> dict[str, Any]:
    """What SecantusDB plans a read with: a find's filter, an aggregate's first `$match`."""
    return dict(cmd["filter"] if name == "find" else cmd["pipeline"][0].get("$match", {}))


#: the shapes SecantusDB reads as one range of an index: an equality on its leading field and
#: a range (or equality) on the next, or a range of a single-field partial index (the stuck
#: list's: `hb_quiet`, and the timers long overdue on `hb_timer_pending`)
BOUNDED = [
    {"status", "_id"},
    {"definition_id", "_id"},
    {"parent_id", "_id"},
    {"status", "updated_at"},
    {"quiet"},
    {"next_fire"},
]


def _read_by_secantus(db: Any, label: str, reads: list[tuple[str, dict[str, Any]]]) -> int:
    """The documents SecantusDB reads for `reads` (a page's), each checked unhinted and, for a
    listing's read, of a bounded shape."""
    total = 0
    for name, cmd in reads:
        assert "hint" not in cmd, (label, cmd)  # a hint walks the whole index there
        first = _first_stage(name, cmd)
        if _is_page_read(name, cmd):
            assert set(first) in BOUNDED or set(first) <= {"parent_id", "_id"}, (label, first)
            total += db.harel_executions.count_documents(first)
    return total


def _plan(db: Any, name: str, cmd: dict[str, Any]) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """The find a captured find/count runs, and the stages of its winning plan."""
    if name == "find":
        find = {k: cmd[k] for k in ("find", "filter", "sort", "limit", "projection", "hint") if k in cmd}
    else:  # count_documents: an aggregate whose first stage is the $match
        match = cmd["pipeline"][0].get("$match", {})
        find = {"find": cmd["aggregate"], "filter": match, **({"hint": cmd["hint"]} if "hint" in cmd else {})}
    explain = db.command("explain", find, verbosity="queryPlanner")
    return find, _stages(explain["queryPlanner"]["winningPlan"])


class TaskCommands(monitoring.CommandListener):
    """Every command a client sends, with the asyncio task that sent it: a page's reads are
    those of the request's task (httpx's ASGI transport runs the app in the caller's), the
    dashboard's sampler sends from a task of its own."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, str, dict[str, Any]]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # a command sent from no event loop (none is, here)
            task = None
        self.sent.append((task, event.command_name, dict(event.command)))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def clear(self) -> None:
        self.sent.clear()

    def of_this_task(self) -> list[tuple[str, dict[str, Any]]]:
        me = asyncio.current_task()
        return [(name, cmd) for task, name, cmd in self.sent if task is me and name != "endSessions"]


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
    rec = TaskCommands()
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
    # the store's listing in tests/store/test_structure.py)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        for label, url in pages.items():
            rec.clear()
            r = await http.get(url)
            assert r.status_code == 200, (label, r.text[:500])
            sent = [
                (n, c)
                for n, c in rec.of_this_task()
                if n in ("find", "aggregate")
                and c.get(n) == "harel_executions"
                and not (n == "find" and set(c["filter"]) == {"_id"})
            ]  # a point read by _id (one execution)
            assert sent, label
            if not EXPLAIN_TRUSTED:
                rec.clear()
                assert (await http.get(url)).status_code == 200, label  # the second time: see the docstring
                again = [(n, c) for n, c in rec.of_this_task() if n in ("find", "aggregate")]
                again = [
                    (n, c)
                    for n, c in again
                    if c.get(n) == "harel_executions" and set(c.get("filter", {"": 0})) != {"_id"}
                ]
                assert any(_is_page_read(n, c) for n, c in again), label
                assert _read_by_secantus(db, label, again) <= MOST_READ, label
                continue
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
    """No filter: on mongod, the `_id` index in `_id` order, named to the server. On
    SecantusDB (which plans any range on `_id` alone as a collection scan, and reads every
    match whatever the limit) one part per status, each a window of hb_status after the
    cursor: the page reads about a page of the 20,000 that follow."""
    mongo_url, db_name, _ = big
    rec = TaskCommands()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[rec]), db_name)
    db = pymongo.MongoClient(mongo_url)[db_name]
    app = FastAPI()
    app.include_router(dashboard_router(store, auth=no_auth, page_size=PAGE))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        await store.init()
        rec.clear()
        assert (await http.get("/?after=idle-000100")).status_code == 200
        finds = [c for n, c in rec.of_this_task() if n == "find" and c.get("find") == "harel_executions"]
        parts = [c for n, c in rec.of_this_task() if n == "aggregate" and _is_page_read(n, c)]
    if not EXPLAIN_TRUSTED:
        firsts = [_first_stage("aggregate", c) for c in parts]
        assert {f["status"] for f in firsts} == {*STATUSES, None}, firsts
        assert all(f["_id"].get("$gt", f["_id"].get("$gte", "")) >= "idle-000100" for f in firsts), firsts
        assert _read_by_secantus(db, "unfiltered", [("aggregate", c) for c in parts]) <= MOST_READ
        await store.close()
        return
    (page,) = [c for c in finds if c.get("sort") == {"_id": 1}]
    # (a tombstone holds no field to filter on: the unfiltered page leaves it out by name)
    assert page["filter"] == {"_id": {"$gt": "idle-000100"}, "tomb": {"$exists": False}} and page["limit"] == PAGE + 1
    assert page["hint"] == "_id_"
    _, stages = _plan(db, "find", page)
    assert ("IXSCAN", "_id_") in stages and not any(st == "COLLSCAN" for st, _ in stages), stages
    await store.close()


# --- the front page's reads, counted ---------------------------------------------------------


#: the executions updated in the searched window, two days ago
IN_WINDOW = 5
#: the page's read, then the counts and the definitions (from the counters), the charts' samples
FRONT_PAGE = ["find", "counts", "find"]


def _examined(db: Any, find: dict[str, Any]) -> int:
    stats = db.command("explain", find, verbosity="executionStats")["executionStats"]
    return int(stats["totalDocsExamined"])


async def test_the_front_page_reads_are_counted_and_index_backed(big: Any) -> None:
    mongo_url, db_name, _ = big
    rec = TaskCommands()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[rec]), db_name)
    await store.init()
    window = time.time() - 2 * 86400
    for i in range(IN_WINDOW):
        await store.save(
            Execution(
                id=f"span-{i}", definition_id="Order", status=Status.DONE, outcome="shipped", updated_at=window + i
            )
        )
    db = pymongo.MongoClient(mongo_url)[db_name]
    app = FastAPI()
    app.include_router(dashboard_router(store, auth=no_auth, page_size=PAGE))
    iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t))  # noqa: E731
    span = {"from": iso(window - 1), "to": iso(window + 60)}
    # each search: its address, the index its page reads, the index its counts read
    searches = {
        "front page": ("/", "_id_", "hb_status"),
        "id prefix": ("/?prefix=idle-0123", "_id_", "hb_status"),
        "definition": ("/?definition=Order", "hb_definition", "hb_status"),
        "status": ("/?status=DONE", "hb_status", "hb_status"),
        "outcome": ("/?outcome=shipped", "_id_", "hb_status"),
        "children of, page 2": ("/?parent=idle-root&after=idle-010000", "hb_parent", "hb_parent"),
        "roots only": ("/?roots=true", "hb_parent", "hb_parent"),
        "from / to": ("/?" + urlencode(span), "hb_status_updated", "hb_status_updated"),
        "from / to and a status": (
            "/?" + urlencode({**span, "status": "DONE"}),
            "hb_status_updated",
            "hb_status_updated",
        ),
        "within, and a status": ("/?within=3600&status=DONE", "hb_status_updated", "hb_status_updated"),
        "json, updated_after / before": (
            f"/api/executions?updated_after={window - 1}&updated_before={window + 60}",
            "hb_status_updated",
            "hb_status_updated",
        ),
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
        assert (await http.get("/")).status_code == 200  # the first: the store's set-up, the sampler started
        for label, (url, page_index, count_index) in searches.items():
            rec.clear()
            r = await http.get(url)
            assert r.status_code == 200, (label, r.text[:500])
            sent = rec.of_this_task()
            names = [n for n, _ in sent]
            expected = FRONT_PAGE if not url.startswith("/api/") else FRONT_PAGE[:-1]  # the twin draws no chart
            if not EXPLAIN_TRUSTED:
                rec.clear()
                r = await http.get(url)  # the second time: see the module docstring
                _secantus_front_page(db, label, url, r, rec.of_this_task(), expected)
                continue
            assert names[0] == "find" and ("find", "harel_hb_counts") in [(n, c.get(n)) for n, c in sent], label
            assert not any(n in ("distinct", "count") and c[n] == "harel_executions" for n, c in sent), label
            page = sent[0][1]
            assert page["hint"] == page_index and page["limit"] == PAGE + 1 and "skip" not in page, (label, page)
            for name, cmd in sent:
                if name in ("find", "aggregate") and cmd[name] == "harel_executions":
                    find, stages = _plan(db, name, cmd)
                    assert not any(st == "COLLSCAN" for st, _ in stages), (label, find, stages)
            if page_index == "hb_status_updated":  # a time range reads the executions updated in it
                bounded = {k: v for k, v in page["filter"].items() if k in ("status", "updated_at")}
                in_range = db.harel_executions.count_documents(bounded)
                assert in_range < N // 100 and _examined(db, _plan(db, "find", page)[0]) <= in_range, label
                if "within" not in url:
                    assert {row["id"] for row in _rows_of(r)} == {f"span-{i}" for i in range(IN_WINDOW)}, label
            if not url.startswith("/api/"):
                samples = sent[-1][1]
                assert samples["find"] == "harel_hb_samples" and set(samples["filter"]) == {"_id"}, samples
                assert samples["hint"] == "_id_"
                _, stages = _plan(db, "find", samples)
                assert ("IXSCAN", "_id_") in stages and not any(st == "COLLSCAN" for st, _ in stages), stages
    await store.close()


def _secantus_front_page(
    db: Any, label: str, url: str, r: httpx.Response, sent: list[tuple[str, dict[str, Any]]], expected: list[str]
) -> None:
    """A page's reads on SecantusDB: the listing's parts (each bounded, together reading about
    a page), and the rest (the counts, the definitions, the samples; the counts are the
    counters' and checked with them) all unhinted."""
    assert r.status_code == 200, (label, r.text[:500])
    reads = [(n, c) for n, c in sent if n == "aggregate" and _is_page_read(n, c)]
    assert reads and all(c["aggregate"] == "harel_executions" for _, c in reads), label
    rest = [(n, c) for n, c in sent if not (n == "aggregate" and _is_page_read(n, c))]
    assert ("distinct", "harel_executions") not in [(n, c.get(n)) for n, c in rest], label
    assert ("find", "harel_hb_counts") in [(n, c.get(n)) for n, c in rest], label
    assert ("find", "harel_hb_samples") in [(n, c.get(n)) for n, c in rest] or len(expected) < len(FRONT_PAGE)
    assert not any("hint" in c for _, c in rest), label
    read = _read_by_secantus(db, label, reads)
    # an outcome alone narrows no index: its pages read until a page of matches is found, on
    # any server (mongod's explain shows the same walk of the `_id` index)
    assert read <= (N + 100 if label == "outcome" else MOST_READ), (label, read)
    if "updated" in url or "from=" in url:  # a time range: the executions updated in it
        assert {row["id"] for row in _rows_of(r)} == {f"span-{i}" for i in range(IN_WINDOW)}, label


def _rows_of(response: httpx.Response) -> list[dict[str, Any]]:
    """The rows a listing response shows: the JSON twin's, or the HTML page's ids."""
    if response.headers["content-type"].startswith("application/json"):
        return list(response.json()["rows"])
    import re

    return [{"id": i} for i in re.findall(r'<tr[^>]*data-id="([^"]*)"', response.text)]
