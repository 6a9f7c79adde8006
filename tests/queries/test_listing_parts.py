"""The listing (`queries.executions_page`) pages exactly what one full query of its filter
gives, in `_id` order (a time search newest first), on every server: sent as one query where `limit` bounds the server's
work (mongod), as parts each bounded by an index range where it does not (SecantusDB; see
`harel_beanie.queries.parts`). Checked against a plain full query on random executions and
random filters, paging with random sizes, and while executions change between pages: no row
is repeated, none skipped that matched from the first page to the last."""

from __future__ import annotations

import os
import random
import uuid
from typing import Any, Optional

import pymongo
import pytest
from harel.engine.execution import Execution, Status
from pymongo import monitoring

from harel_beanie import AsyncMongoStore, MongoStore, queries
from harel_beanie.core.documents import ExecutionDocument
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, part_of
from harel_beanie.core.time_order import TIME_SORT, is_timed
from harel_beanie.queries import pages, parts
from harel_beanie.queries.server import MONGOD, SECANTUS, Server
from tests.store.test_structure import _idle_documents

DEFINITIONS = ("Order", "Parcel", "Refund")
OUTCOMES = (None, "shipped", "lost")


def _id(rnd: random.Random, i: int) -> str:
    shape = i % 4
    if shape == 0:
        return uuid.UUID(int=rnd.getrandbits(128)).hex
    if shape == 1:
        return f"order-{rnd.randrange(10_000):05d}"
    if shape == 2:
        return rnd.choice(["", "a/b", "日本", "e\u0301", "$gt", "0", "~"]) + f"{i}"
    return f"{rnd.choice('0123456789abcdef')}{i}"


async def _seed(astore: Any, rnd: random.Random, n: int) -> list[str]:
    ids: list[str] = []
    roots: list[str] = []
    for i in range(n):
        eid = _id(rnd, i)
        parent = rnd.choice(roots) if roots and rnd.random() < 0.3 else None
        await astore.save(
            Execution(
                id=eid,
                definition_id=rnd.choice(DEFINITIONS),
                status=rnd.choice(list(Status)),
                outcome=rnd.choice(OUTCOMES),
                parent_id=parent,
                updated_at=1_800_000_000.0 - rnd.random() * 86400,
            )
        )
        ids.append(eid)
        if parent is None:
            roots.append(eid)
    coll = ExecutionDocument.get_pymongo_collection()
    await coll.insert_one({"_id": "tomb-" + ids[0], "tomb": {"at": 1.0}})  # a purged execution's tombstone
    legacy = Execution(id="legacy-" + ids[1], definition_id="Order", status=Status.DONE)
    # as harel's own store writes it: no summary fields until migrated
    await coll.insert_one({"_id": legacy.id, "definition_id": "Order", "version": 1, "data": legacy.model_dump_json()})
    return ids


def _random_filter(rnd: random.Random, ids: list[str], roots: list[str]) -> queries.ExecutionFilter:
    kw: dict[str, Any] = {}
    for name, make in (
        ("status", lambda: rnd.choice(list(Status)).value),
        ("definition_id", lambda: rnd.choice(DEFINITIONS)),
        ("outcome", lambda: rnd.choice(OUTCOMES[1:])),
        ("parent_id", lambda: rnd.choice(roots)),
        ("roots_only", lambda: True),
        ("updated_after", lambda: 1_800_000_000.0 - rnd.random() * 86400),
        ("updated_before", lambda: 1_800_000_000.0 - rnd.random() * 43200),
        ("id_prefix", lambda: rnd.choice(ids)[: rnd.randint(1, 3)]),
    ):
        if rnd.random() < 0.25:
            kw[name] = make()
    return queries.ExecutionFilter(**kw)


async def _all(flt: queries.ExecutionFilter) -> list[str]:
    """The listing's rows as one plain query gives them: by id, a time search newest first."""
    coll = ExecutionDocument.get_pymongo_collection()
    order = TIME_SORT if is_timed(flt.query()) else [("_id", 1)]
    return [d["_id"] async for d in coll.find(flt.query(), {"_id": 1}).sort(order)]


async def _walk(flt: queries.ExecutionFilter, rnd: random.Random, between: Any = None) -> list[str]:
    seen: list[str] = []
    after: Optional[str] = None
    while True:
        page = await queries.executions_page(flt, after=after, limit=rnd.randint(1, 7), hint=True)
        seen += [r.id for r in page.rows]
        if page.next_after is None:
            return seen
        after = page.next_after
        if between is not None:
            await between()


@pytest.fixture(params=[MONGOD, SECANTUS], ids=lambda s: s.name)
def as_if(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Server:
    """The listing sent as it is to this kind of server, whichever the tests run on."""

    async def server_of(collection: Any) -> Server:
        return request.param  # type: ignore[no-any-return]

    monkeypatch.setattr(pages, "server_of", server_of)
    return request.param  # type: ignore[no-any-return]


async def test_pages_are_the_full_query_in_order(astore, as_if: Server) -> None:
    rnd = random.Random(11)
    await astore.init()
    ids = await _seed(astore, rnd, 160)
    roots = [d["_id"] async for d in ExecutionDocument.get_pymongo_collection().find({"parent_id": None, "tomb": None})]
    flts = [queries.ExecutionFilter()] + [_random_filter(rnd, ids, roots) for _ in range(40)]
    for flt in flts:
        assert await _walk(flt, rnd) == await _all(flt), flt


async def test_pages_while_executions_change(astore, as_if: Server) -> None:
    rnd = random.Random(5)
    await astore.init()
    ids = await _seed(astore, rnd, 120)
    coll = ExecutionDocument.get_pymongo_collection()
    touched: set[str] = set()

    async def change() -> None:  # between two pages: move some, add some, remove some
        for _ in range(3):
            victim = rnd.choice(ids)
            touched.add(victim)
            await coll.update_one({"_id": victim}, {"$set": {"status": rnd.choice(list(Status)).value}})
        fresh = _id(rnd, rnd.randrange(10**6))
        touched.add(fresh)
        await astore.save(Execution(id=fresh, definition_id="Order", status=Status.RUNNING))
        gone = rnd.choice(ids)
        touched.add(gone)
        await coll.delete_one({"_id": gone})

    for flt in [queries.ExecutionFilter(), queries.ExecutionFilter(status="RUNNING")]:
        before = set(await _all(flt))
        seen = await _walk(flt, rnd, change)
        after = set(await _all(flt))
        assert seen == sorted(set(seen)), flt  # in `_id` order, none repeated
        assert (before & after) - touched <= set(seen), flt  # none skipped that stayed put


def test_every_part_leads_with_what_the_server_bounds() -> None:
    q = queries.ExecutionFilter(definition_id="Order", status="FAILED", outcome="x").query()
    q["_id"] = {"$gt": "k"}
    ((lead, rest),) = parts.split(q)
    assert lead == {"status": "FAILED", "_id": {"$gt": "k"}} and rest == {"definition_id": "Order", "outcome": "x"}
    everything = parts.split({**queries.ExecutionFilter().query(), "_id": {"$gt": "k"}})
    assert [lead["status"] for lead, _ in everything] == [*queries.STATUSES, None]
    assert all(rest == {"tomb": {"$exists": False}} for _, rest in everything)
    timed = parts.split(queries.ExecutionFilter(updated_after=5.0).query())
    assert [set(lead) for lead, _ in timed] == [{"status", "updated_at"}] * len(queries.STATUSES)


class _Matches(monitoring.CommandListener):
    """The first `$match` of every aggregate sent to the executions: what SecantusDB plans
    with, and reads every match of whatever the limit."""

    def __init__(self) -> None:
        self.leads: list[dict[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "aggregate" and event.command["aggregate"] == "harel_executions":
            self.leads.append(dict(event.command["pipeline"][0]["$match"]))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.mark.skipif(bool(os.environ.get("MONGODB_URL")), reason="the parts are what the embedded server is sent")
async def test_a_page_reads_about_a_page_however_many_follow(mongo_url: str, db_name: str) -> None:
    """SecantusDB reads every match of a query, whatever its limit: a page sent as "the next 51
    after the cursor" read every execution after it (an id-prefix page of 45 rows cost 254 ms
    at 10,000 executions, 3.3 s at 100,000). Here each page's reads are counted as the
    documents their bounded stages match (counted again with a count per stage): a page
    reads at most a few dozen pages' worth, the first and the last alike, while the pages
    stay exactly the full query's."""
    n, page = 4_000, 50
    rnd = random.Random(3)
    watched = _Matches()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[watched]), db_name)
    await store.init()
    docs = _idle_documents(0, n, 1_800_000_000.0)
    for d in docs:  # uuid-like ids, as harel mints them; nine in ten finished
        d["_id"] = uuid.UUID(int=rnd.getrandbits(128)).hex
        d["status"] = "DONE" if rnd.random() < 0.9 else "RUNNING"
    sync = pymongo.MongoClient(mongo_url)[db_name].harel_executions
    sync.insert_many(docs)
    full = sorted(d["_id"] for d in docs)
    work: list[int] = []
    reads: list[int] = []
    for flt in [queries.ExecutionFilter(), queries.ExecutionFilter(status="DONE")]:
        for start in [None, None, full[n // 3], full[-120]]:  # the first page twice: the second knows its start
            watched.leads.clear()
            got = await queries.executions_page(flt, after=start, limit=page, hint=True)
            want = [i for i in await _all(flt) if start is None or i > start][:page]
            assert [r.id for r in got.rows] == want
            work.append(sum(sync.count_documents(lead) for lead in watched.leads))
            reads.append(len(watched.leads))
    # a new process (a restarted dashboard) starts where the last first page began, as the
    # database keeps it: its first page reads a page's worth too
    for memo in (parts._FIRST, parts._DEPTH, parts._SHARE, parts._KEPT):
        memo.clear()
    watched.leads.clear()
    got = await queries.executions_page(queries.ExecutionFilter(), limit=page, hint=True)
    assert [r.id for r in got.rows] == (await _all(queries.ExecutionFilter()))[:page]
    restarted = sum(sync.count_documents(lead) for lead in watched.leads)
    assert restarted <= 20 * page, restarted
    await store.close()
    cold = {0, 4}  # each filter's very first page in this process reads its parts whole
    assert work[0] >= n * 0.9, work  # (so the counting sees the reads)
    assert max(w for i, w in enumerate(work) if i not in cold) <= 20 * page, work
    # and in few reads: each part once or twice past the largest one's walk (a page of the
    # whole listing was a read of every part for every window: 8 reads a window, dozens of
    # windows at 100,000 executions, 12 s a page)
    parts_of = [
        len(parts.split(f.query())) for f in [queries.ExecutionFilter(), queries.ExecutionFilter(status="DONE")]
    ]
    assert all(r <= 2 * parts_of[i // 4] + 12 for i, r in enumerate(reads) if i not in cold), reads


@pytest.mark.skipif(bool(os.environ.get("MONGODB_URL")), reason="the parts are what the embedded server is sent")
async def test_the_api_reads_in_parts_where_the_indexes_are_there(mongo_url: str, db_name: str) -> None:
    """`executions_page` and `status_counts` called as the API's users call them (no `hint`)
    look at the indexes themselves: the listing went to the server as one query, which
    SecantusDB read whole (20 s for a first page at 100,000 executions)."""
    watched = _Matches()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[watched]), db_name)
    await store.init()
    await queries.executions_page(queries.ExecutionFilter(), limit=5)
    await queries.status_counts(queries.ExecutionFilter(id_prefix="a"))
    # the page: the counters asked for the lowest id (built, empty, when the store set the
    # fresh database up: no aggregate), then, with no execution counted yet, one read per
    # part (its first, whole); the counts: one per status, each in parts
    assert not any("cc" in lead for lead in watched.leads), watched.leads  # nothing built by a read
    assert len(watched.leads) == len(parts.split(queries.ExecutionFilter().query())) + len(queries.STATUSES)
    pymongo.MongoClient(mongo_url)[db_name].harel_executions.drop_index("hb_status")
    pages._READY.clear()
    watched.leads.clear()
    await queries.executions_page(queries.ExecutionFilter(), limit=5)  # one query: parts would scan
    assert watched.leads == []
    await store.close()


@pytest.mark.skipif(bool(os.environ.get("MONGODB_URL")), reason="the parts are what the embedded server is sent")
async def test_a_first_page_with_no_start_kept_starts_at_the_counters_lowest_id(mongo_url: str, db_name: str) -> None:
    """The very first page of a filter on a database, with no start kept anywhere, read its
    parts whole: at a million executions that is minutes, on the day a dashboard is first
    opened. It now starts at the lowest id the counters have counted, and reads about a page,
    for the unfiltered listing and for a filter alike."""
    n, page = 4_000, 50
    rnd = random.Random(4)
    sync_client = pymongo.MongoClient(mongo_url)
    sync = sync_client[db_name].harel_executions
    MongoStore(sync_client, db_name).init()
    docs = _idle_documents(0, n, 1_800_000_000.0)
    for d in docs:  # as the store writes them (its partition), uuid-like ids, nine in ten finished
        d["_id"] = uuid.UUID(int=rnd.getrandbits(128)).hex
        d["part"] = part_of(d["_id"], DEFAULT_PARTITIONS)
        d["status"] = "DONE" if rnd.random() < 0.9 else "RUNNING"
    sync.insert_many(docs)
    MongoStore(sync_client, db_name, create_schema=False).fold_counts()  # as a worker's sweeps do
    watched = _Matches()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[watched]), db_name)
    await store.init()
    for memo in (parts._FIRST, parts._DEPTH, parts._SHARE, parts._KEPT):
        memo.clear()
    assert sync_client[db_name]["harel_hb_starts"].count_documents({}) == 0
    for flt in [queries.ExecutionFilter(), queries.ExecutionFilter(status="DONE")]:
        watched.leads.clear()
        got = await queries.executions_page(flt, limit=page, hint=True)
        assert [r.id for r in got.rows] == (await _all(flt))[:page]
        work = sum(sync.count_documents(lead) for lead in watched.leads)
        assert work <= 20 * page, work  # read whole, it was every execution
    await store.close()
