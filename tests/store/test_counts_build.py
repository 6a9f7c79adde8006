"""The counts' first build off the request path (`harel_beanie.core.counting`'s last
paragraph), on the real server: a request on a database whose counters are not built reads
a bounded number of documents (counted on the wire), builds nothing and says its counts are
partial on the page, the JSON, `/metrics` and the backlog; `migrate up` builds every counter
in batches, printing its progress, and resumes after a kill; a worker's sweep builds the
partitions it owns, one batch at a time.
"""

from __future__ import annotations

from typing import Any, Iterator

import httpx
import pymongo
import pytest
from fastapi import FastAPI
from harel.engine.execution import Execution, Status
from harel.engine.schema import DEFAULT_PREFIX
from prometheus_client import CollectorRegistry

from harel_beanie.core.count_documents import counts_collection
from harel_beanie.core.counting import COUNTED, DIRTY
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, Held, PartitionScope
from harel_beanie.core.stuck import QUIET
from harel_beanie.dashboard import dashboard_router, no_auth
from harel_beanie.migrate import Migrator, counts_build
from harel_beanie.queries.server import MONGOD
from harel_beanie.store.async_store import AsyncMongoStore
from harel_beanie.store.sync_store import MongoStore
from harel_beanie.telemetry.metrics import StoreMetrics
from tests.support.wire import Recorder

EXES = f"{DEFAULT_PREFIX}_executions"
COUNTS = counts_collection(DEFAULT_PREFIX)


def unbuilt_database(mongo_url: str, name: str, n: int) -> None:
    """`n` executions as a version before the counters wrote them: no mark on any, and no
    counter (what an upgrade finds)."""
    st = MongoStore(pymongo.MongoClient(mongo_url), name)
    try:
        st.init()
        for i in range(n):
            status = Status.DONE if i % 4 == 0 else Status.RUNNING
            st.save(Execution(id=f"x{i:05d}", definition_id="D" if i % 3 else "E", status=status))
    finally:
        st.close()
    db = pymongo.MongoClient(mongo_url)[name]
    db[EXES].update_many({}, {"$unset": {DIRTY: "", COUNTED: "", "cseq": ""}})
    db.drop_collection(COUNTS)


def truth(db: Any, query: Any = None) -> dict[str, dict[str, int]]:
    per: dict[str, dict[str, int]] = {}
    for d in db[EXES].find(query or {}, {"definition_id": 1, "status": 1}):
        s = per.setdefault(d["definition_id"], {})
        s[d["status"]] = s.get(d["status"], 0) + 1
    return per


@pytest.fixture
def names(client: Any, db_name: str) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for name in made:
        client.drop_database(name)


@pytest.mark.parametrize("n", [40, 400])
async def test_a_request_on_an_unbuilt_database_reads_a_bounded_number_of_documents_and_says_partial(
    mongo_url: str, client: Any, db_name: str, names: list[str], n: int
) -> None:
    """At 40 or 400 executions, the front page's JSON, its HTML, `/metrics` and the backlog read
    the counters and one page of rows, never an execution per execution stored (documents
    returned on the wire, by collection), send no update or sum to the executions
    (no build, no sum by definition), and say the counts
    leave out every partition."""
    name = f"{db_name}_{n}"
    names.append(name)
    unbuilt_database(mongo_url, name, n)
    rec = Recorder()
    astore = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[rec]), name)
    await astore.init()
    app = FastAPI()
    app.include_router(dashboard_router(astore, auth=no_auth, metrics=StoreMetrics(CollectorRegistry())), prefix="/ops")
    try:
        rec.clear()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
            front = (await http.get("/ops/api/executions", params={"limit": 10})).json()
            page = (await http.get("/ops/", params={"limit": 10})).text
            metrics = (await http.get("/ops/metrics")).text
            backlog = (await http.get("/ops/api/backlog")).json()
    finally:
        await astore.close()
    every = list(range(DEFAULT_PARTITIONS))
    assert front["uncounted"] == every and front["partitions"] == DEFAULT_PARTITIONS
    assert front["counts"] == {} and len(front["rows"]) == 10
    assert 'id="counts-partial"' in page and f"{DEFAULT_PARTITIONS} of {DEFAULT_PARTITIONS} partitions" in page
    assert f"harel_counts_unbuilt_partitions {float(DEFAULT_PARTITIONS)}" in metrics
    assert backlog["uncounted"] == every
    on_exes = [(c, body) for c, body in rec.commands if body.get(c) == EXES]
    built = [body for c, body in on_exes if c == "update"]
    # a sum by definition: the build's (of `cc`) or a count of the collection's
    groups = [
        repr(st["$group"]) for c, body in on_exes if c == "aggregate" for st in body["pipeline"] if "$group" in st
    ]
    summed = [g for g in groups if "$cc.d" in g or "$definition_id" in g]
    assert not built and not summed, (built, summed)  # nothing built, nothing counted over the collection
    # two pages of 10 rows (the JSON and the HTML), each read as a page is (its parts' windows)
    assert rec.returned_in[EXES] <= 4 * 10 + 2 * DEFAULT_PARTITIONS, rec.returned_in


async def test_migrate_up_builds_every_counter_in_batches_saying_its_progress_and_resumes_after_a_kill(
    mongo_url: str, client: Any, db_name: str, names: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"{db_name}_m"
    names.append(name)
    unbuilt_database(mongo_url, name, 150)
    monkeypatch.setattr(counts_build, "BATCH", 20)
    monkeypatch.setattr(counts_build, "SAY_EVERY", 2)

    async def a_server_where_limit_bounds_work(_: Any) -> Any:
        return MONGOD  # batches, as on mongod (on this server the build is one pass: below)

    monkeypatch.setattr(counts_build, "server_of", a_server_where_limit_bounds_work)
    said: list[str] = []

    class Killed(Exception):
        pass

    def dies_at_the_second(line: str) -> None:
        said.append(line)
        if len(said) == 2:
            raise Killed

    aclient: Any = pymongo.AsyncMongoClient(mongo_url)
    try:
        with pytest.raises(Killed):
            await Migrator(aclient[name], say=dies_at_the_second).up()
        db = client[name]
        assert db[COUNTS].count_documents({"built": True}) < DEFAULT_PARTITIONS  # killed half-way
        await Migrator(aclient[name], say=said.append).up()
    finally:
        await aclient.close()
    progress = [line for line in said if line.startswith("counts:")]
    # 150 executions, 20 a batch, two batches a line: read grows, and the last says all built
    assert len(progress) >= 3, said
    assert progress[0] == f"counts: 0/{DEFAULT_PARTITIONS} partitions built, 40 executions read", said
    assert progress[-1].startswith(f"counts: {DEFAULT_PARTITIONS}/{DEFAULT_PARTITIONS} partitions built"), said
    st = MongoStore(pymongo.MongoClient(mongo_url), name)
    try:
        got = st.read_counts()
    finally:
        st.close()
    assert got is not None and got.unbuilt == [] and got.per == truth(client[name])


def test_a_worker_sweep_builds_the_partitions_it_owns_a_batch_at_a_time(
    mongo_url: str, client: Any, db_name: str, names: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store owning partitions 0-3, folding as a worker's sweep does (`build_batches=1`):
    each sweep reads at most one batch of ids, only its partitions' counters get built, and
    the counts then name the other twelve as not counted."""
    from harel_beanie.core.flows import counting as flow_counting

    name = f"{db_name}_w"
    names.append(name)
    unbuilt_database(mongo_url, name, 200)
    monkeypatch.setattr(flow_counting, "BUILD_BATCH", 10)
    owned = [0, 1, 2, 3]
    rec = Recorder()
    scope = PartitionScope(held={p: Held(epoch=1, until=float("inf")) for p in owned})
    st = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[rec]), name, partitions=scope)
    db = client[name]
    mine = db[EXES].count_documents({"part": {"$in": owned}})
    try:
        st.init()
        sweeps = 0
        while db[COUNTS].count_documents({"_id": {"$in": owned}, "built": True}) < len(owned):
            rec.clear()
            st.fold_counts(build_batches=1)
            sweeps += 1
            # one batch of ids, and its sums (a group per partition, definition and status:
            # two definitions, two statuses), nothing folded yet (nothing is dirty)
            assert rec.returned_in[EXES] <= 10 + len(owned) * 2 * 2, rec.returned_in
            assert sweeps <= mine // 10 + 2, "the build does not move on"
        assert sweeps >= mine // 10  # a batch a sweep, not the whole build in one
        assert db[COUNTS].count_documents({"built": True}) == len(owned)
        got = st.read_counts()
    finally:
        st.close()
    assert got is not None and got.unbuilt == list(range(4, DEFAULT_PARTITIONS))
    assert got.per == truth(db, {"part": {"$in": owned}})  # exactly the owned partitions' executions


async def test_on_the_embedded_server_migrate_up_builds_the_counts_in_one_pass(
    mongo_url: str, client: Any, db_name: str, names: list[str]
) -> None:
    """Where `limit` bounds no work (SecantusDB), each batch's read of its next ids would read
    the collection: `migrate up` builds the rest in one pass there (an update and a sum over
    the executions, no id read), and says so in one line."""
    name = f"{db_name}_one"
    names.append(name)
    unbuilt_database(mongo_url, name, 90)
    rec = Recorder()
    said: list[str] = []
    aclient: Any = pymongo.AsyncMongoClient(mongo_url, event_listeners=[rec])
    try:
        await Migrator(aclient[name], say=said.append).up()
    finally:
        await aclient.close()
    assert [line for line in said if line.startswith("counts:")] == [
        f"counts: {DEFAULT_PARTITIONS}/{DEFAULT_PARTITIONS} partitions built, 90 executions read"
    ]
    on_exes = [c for c, body in rec.commands if body.get(c) == EXES]
    # two updates: Rule 6's raise of older marks to the new epoch's base, then the build's own
    assert on_exes.count("update") == 2 and on_exes.count("aggregate") == 1 and "find" not in on_exes, on_exes
    st = MongoStore(pymongo.MongoClient(mongo_url), name)
    try:
        got = st.read_counts()
    finally:
        st.close()
    assert got is not None and got.unbuilt == [] and got.per == truth(client[name])


def test_the_build_gives_quiet_only_to_an_execution_waiting_on_nothing(
    mongo_url: str, client: Any, db_name: str, names: list[str]
) -> None:
    """An adopted database (no counter, no marks) holding a RUNNING execution with an outbox
    entry still pending: the build marks it counted but not `quiet` (it waits on its entry,
    not silent, docs/dashboard.md "Stuck, or waiting"); a RUNNING one waiting on nothing
    gets `quiet` at its last update, and a finished one none."""
    name = f"{db_name}_q"
    names.append(name)
    unbuilt_database(mongo_url, name, 3)  # x00000 DONE, x00001 and x00002 RUNNING
    db = client[name]
    entry = {"target": "x00001:child", "event": {"kind": "go"}}
    db[EXES].update_one({"_id": "x00001"}, {"$set": {"outbox": [entry], "pending": True}})
    db[EXES].update_many({}, {"$set": {"updated_at": 1000.0}, "$unset": {QUIET: ""}})
    st = MongoStore(pymongo.MongoClient(mongo_url), name)
    try:
        st.fold_counts()  # builds every counter, as a worker's sweep or `migrate up` does
    finally:
        st.close()
    quiet = {d["_id"]: d.get(QUIET) for d in db[EXES].find({}, {QUIET: 1})}
    assert quiet == {"x00000": None, "x00001": None, "x00002": 1000.0}, quiet
    assert db[COUNTS].count_documents({"built": True}) == DEFAULT_PARTITIONS
