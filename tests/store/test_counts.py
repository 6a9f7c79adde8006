"""The execution counts kept up to date (`harel_beanie.core.counting`): exact against a full
count of the collection after runs of the shop models, folds, purges, prunes, and crashes
injected between the steps of a fold and of a removal; and read in a bounded number of
commands whatever the collection holds."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import httpx
import pymongo
import pytest
from fastapi import FastAPI
from harel.engine.execution import Execution, Status
from harel.engine.schema import DEFAULT_PREFIX
from harel.engine.store.base import Step, TimerOp
from prometheus_client import CollectorRegistry

from harel_beanie import queries
from harel_beanie.core import calls, flows
from harel_beanie.core.count_documents import counts_collection
from harel_beanie.core.counting import COUNTED, DIRTY, LEAVING
from harel_beanie.core.stuck import QUIET
from harel_beanie.dashboard import dashboard_router, no_auth
from harel_beanie.deploy.loader import load_models
from harel_beanie.harness.drivers import ManualClock, SyncDurable, order_steps
from harel_beanie.retention import pruning as retention
from harel_beanie.retention import removal as removal_module
from harel_beanie.store.async_store import AsyncMongoStore
from harel_beanie.store.dispatch import FlowRun, call
from harel_beanie.store.sync_store import MongoStore
from harel_beanie.telemetry.metrics import StoreMetrics
from tests.support.wire import Recorder

EXES = f"{DEFAULT_PREFIX}_executions"


@pytest.fixture(scope="module")
def definitions() -> dict[str, Any]:
    return load_models()


def full_counts(db: Any) -> tuple[dict[str, dict[str, int]], int]:
    """What the counters must equal: every execution (not one prune has begun removing) by
    definition and status, and the tombstones; one pass over all."""
    per: dict[str, dict[str, int]] = {}
    purged = 0
    for d in db[EXES].find({}, {"definition_id": 1, "status": 1, "version": 1, "tomb": 1, LEAVING: 1}):
        if d.get(LEAVING):
            continue
        if "tomb" in d:
            purged += 1
            continue
        s = per.setdefault(d["definition_id"], {})
        s[d.get("status") or "UNKNOWN"] = s.get(d.get("status") or "UNKNOWN", 0) + 1
    return per, purged


def check(store: MongoStore, db: Any) -> None:
    got = store.read_counts()
    assert got is not None
    assert (got.per, got.purged) == full_counts(db)
    # and the lowest id the counters know is below every stored one (where a first page starts)
    ids = [d["_id"] for d in db[EXES].find({}, {"_id": 1}) if isinstance(d["_id"], str)]
    assert got.low is not None if ids else got.low is None, got.low
    assert not ids or got.low <= min(ids), (got.low, min(ids))


def run_orders(store: MongoStore, definitions: dict[str, Any], rng: random.Random, n: int, tag: str) -> None:
    driver = SyncDurable(store, definitions, ManualClock(), execution="inline")
    for i in range(n):
        steps = order_steps(f"{tag}-{i}", card=rng.choice(["visa", "visa", "declined"]), scans=rng.randint(0, 2))
        driver.run(steps[: rng.randint(1, len(steps))])


def test_counts_follow_runs_and_folds(
    store: MongoStore, client: Any, db_name: str, definitions: dict[str, Any]
) -> None:
    db = client[db_name]
    rng = random.Random(7)
    store.init()
    fresh = store.read_counts()  # a fresh database's counters are built at set-up, empty
    assert fresh is not None and fresh.per == {} and fresh.unbuilt == []
    store.fold_counts()
    check(store, db)
    run_orders(store, definitions, rng, 12, "a")
    check(store, db)  # nothing folded: the dirty documents correct the counters
    assert store.fold_counts() > 0
    check(store, db)
    run_orders(store, definitions, rng, 6, "b")
    check(store, db)
    store.fold_counts()
    check(store, db)
    assert db[counts_collection(DEFAULT_PREFIX)].count_documents({}) == store.partitions.parts


class Crash(Exception):
    """A folder killed between two of its writes."""


def fold_until(store: MongoStore, stop: Any) -> None:
    """Run a fold of every partition, killed just before the first call `stop(call, n)` picks
    (n: the calls made so far); nothing after it is sent."""
    run = FlowRun(flows.fold_counts(store.partitions))
    n = 0
    while (c := run.next_call()) is not None:
        if stop(c, n):
            return
        run.reply(call(store._colls, c))
        n += 1


def is_mark(c: calls.Call) -> bool:
    """A fold's marks: a batch's bulk write of them, or one at a time where it missed."""
    return isinstance(c, (calls.UpdateOne, calls.BulkWrite)) and c.target == "executions"


@pytest.mark.parametrize("marks_done", [0, 3])
def test_a_fold_killed_between_its_writes_double_counts_nothing(
    store: MongoStore, client: Any, db_name: str, definitions: dict[str, Any], marks_done: int
) -> None:
    """Killed after applying a batch to the counter and before marking all of its documents
    (none, or some partitions' batches): the counts stay exact, and the next fold marks what
    was left."""
    db = client[db_name]
    store.init()
    store.fold_counts()  # built, empty
    run_orders(store, definitions, random.Random(3), 8, "k")
    seen: list[int] = []

    def stop(c: calls.Call, n: int) -> bool:
        if is_mark(c):
            seen.append(n)
        return len(seen) > marks_done

    fold_until(store, stop)
    assert seen, "the fold never reached its marks"
    counters = list(db[counts_collection(DEFAULT_PREFIX)].find({"marked": False, "seq": {"$gt": 0}}))
    assert counters, "no batch was left unmarked: the crash was not injected"
    check(store, db)
    run_orders(store, definitions, random.Random(4), 3, "k2")  # commits on half-marked documents
    check(store, db)
    store.fold_counts()
    check(store, db)
    assert db[EXES].count_documents({DIRTY: True}) == 0


def test_purges_and_reused_ids_keep_the_counts(
    store: MongoStore, client: Any, db_name: str, definitions: dict[str, Any]
) -> None:
    db = client[db_name]
    store.init()
    run_orders(store, definitions, random.Random(5), 6, "p")
    store.fold_counts()
    ids = [d["_id"] for d in db[EXES].find({"parent_id": None}, {"_id": 1})][:3]
    counted = {i: db[EXES].find_one({"_id": i}, {COUNTED: 1, "cseq": 1}) for i in ids[:2]}
    for i in ids[:2]:
        assert store.purge(i, store.load(i).version)
        # the tombstone keeps what the counters count the id as, until a fold counts it anew
        assert db[EXES].find_one({"_id": i}, {COUNTED: 1, "cseq": 1}) == counted[i]
    check(store, db)  # tombstones not folded yet
    store.fold_counts()
    check(store, db)
    assert store.read_counts().purged == 2
    run_orders(store, definitions, random.Random(6), 1, ids[0].rsplit("-", 1)[0])  # p-0 again, over its tombstone
    check(store, db)
    store.fold_counts()
    check(store, db)
    assert store.read_counts().purged == 1


def test_one_fold_folds_every_dirty_document_of_a_partition_batch_after_batch(
    store: MongoStore, client: Any, db_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition holding more dirty documents than one batch (`FOLD_BATCH`, made 5 here so
    12 documents take three batches, the last one short): one fold leaves none of them
    dirty, and the counters alone are exact."""
    monkeypatch.setattr(flows.counting, "FOLD_BATCH", 5)
    db = client[db_name]
    store.init()
    store.fold_counts()  # every counter built, nothing dirty
    ids = [f"many:{i:02d}" for i in range(12)]  # one family key: one partition
    for i in ids:
        store.save(Execution(id=i, definition_id="D", status=Status.RUNNING))
    part = store._state.scope.part_of(ids[0])
    assert db[EXES].count_documents({DIRTY: True, "part": part}) == 12
    assert store.fold_counts([part]) == 12
    assert db[EXES].count_documents({DIRTY: True}) == 0, "a fold stopped before its partition's last batch"
    counter = client[db_name][counts_collection(DEFAULT_PREFIX)].find_one({"_id": part})
    assert counter is not None and counter["n"] == {"dD": {"sRUNNING": 12}}  # keys escaped (core.counting), counter
    check(store, db)


def test_counts_of_documents_written_before_the_counters_are_built(
    store: MongoStore, client: Any, db_name: str, definitions: dict[str, Any]
) -> None:
    """Documents an earlier version wrote carry no mark and have no counters: the first fold
    builds each partition's counter from them, and until then the readers answer from the
    built partitions and name the others (`Counts.unbuilt`)."""
    db = client[db_name]
    store.init()
    run_orders(store, definitions, random.Random(8), 6, "old")
    db[EXES].update_many({}, {"$unset": {DIRTY: "", COUNTED: "", "cseq": ""}})
    db[counts_collection(DEFAULT_PREFIX)].delete_many({})
    nothing = store.read_counts()
    assert nothing is not None and nothing.per == {} and nothing.unbuilt == list(range(store.partitions.parts))
    run_orders(store, definitions, random.Random(9), 3, "new")  # dirty before the build
    store.fold_counts([0, 1, 2])  # some partitions built
    some = store.read_counts()
    assert some is not None and some.unbuilt == list(range(3, store.partitions.parts)) and some.low is None
    docs = [d for d in db[EXES].find({"part": {"$in": [0, 1, 2]}}) if "tomb" not in d]
    assert sum(some.totals().values()) == len(docs)  # exactly the built partitions' executions
    store.fold_counts()
    check(store, db)


def test_the_counters_of_every_partition_are_built_with_one_read_of_the_executions(
    mongo_url: str, client: Any, db_name: str
) -> None:
    """Documents written before the counters (as after an upgrade) are counted when the
    first fold finds the counters unbuilt: two updates (Rule 6's raise of older marks
    beside the count of the uncounted) and one aggregation over the executions for all the
    partitions found unbuilt, not that per partition (on a server
    with no index led by `part` alone each of those read the whole collection: 31 s for a
    first dashboard view at 20,000 executions on the embedded server, 4.6 s now). The
    counts built are the full counts."""
    name = f"{db_name}_build"
    rec = Recorder()
    st = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[rec]), name)
    try:
        st.init()
        for i in range(60):
            st.save(Execution(id=f"b-{i}", definition_id="D" if i % 3 else "E"))
        db = client[name]
        db[EXES].update_many({}, {"$unset": {DIRTY: "", COUNTED: "", "cseq": ""}})
        db[counts_collection(DEFAULT_PREFIX)].delete_many({})
        rec.clear()
        st.fold_counts()
        on_exes = [(n, c) for n, c in rec.commands if c.get(n) == EXES and n in ("update", "aggregate", "find")]
        # the update counting the uncounted, the one raising older marks (Rule 6), the sums
        assert [n for n, _ in on_exes if n != "find"] == ["update", "update", "aggregate"], on_exes
        got = st.read_counts()
        assert got is not None and got.per == {"D": {"PENDING": 40}, "E": {"PENDING": 20}}, got
    finally:
        st.close()
    client.drop_database(name)


async def prune_all(astore: AsyncMongoStore, leases: int = 0) -> retention.PruneReport:
    """prune, `leases` times `LEASE` after now: past a killed prune's leaving marks."""
    at = time.time() + leases * (removal_module.LEASE + 1)
    return await retention.prune(astore._exes, before=2e9, batch_size=7, clock=lambda: at)


async def test_prune_keeps_the_counts_and_a_killed_prune_too(
    astore: AsyncMongoStore, store: MongoStore, client: Any, db_name: str, definitions: dict[str, Any], monkeypatch: Any
) -> None:
    """prune marks what goes `leaving`, folds it, deletes it: killed after the marks, or
    after the fold, the counts are exact, and the next prune removes what was left (once
    the killed one's marks no longer hold: `retention.removal.LEASE`)."""
    db = client[db_name]
    store.init()
    await astore.init()
    await asyncio.to_thread(run_orders, store, definitions, random.Random(10), 10, "r")
    store.fold_counts()
    done = db[EXES].count_documents({"status": {"$in": ["DONE", "CANCELLED"]}})
    assert done > 7

    def killed(*a: Any, **k: Any) -> Any:
        raise Crash()
        yield  # a flow that dies before its first call

    monkeypatch.setattr(removal_module, "fold_leaving", killed)
    with pytest.raises(Crash):
        await prune_all(astore)
    assert db[EXES].count_documents({LEAVING: True}) > 0
    check(store, db)
    monkeypatch.undo()
    real_delete = removal_module.DeleteOne
    monkeypatch.setattr(removal_module, "DeleteOne", lambda *a, **k: (_ for _ in ()).throw(Crash()))
    with pytest.raises(Crash):
        await prune_all(astore, leases=1)
    monkeypatch.setattr(removal_module, "DeleteOne", real_delete)
    check(store, db)
    store.fold_counts()
    check(store, db)
    report = await prune_all(astore, leases=2)
    assert report.removed > 0 and db[EXES].count_documents({LEAVING: True}) == 0
    check(store, db)
    store.fold_counts()
    check(store, db)


def test_reading_the_counts_sends_the_same_commands_whatever_the_collection_holds(
    mongo_url: str, client: Any, db_name: str
) -> None:
    """Counted by a command listener (explain cannot show a server's work): reading the
    counts costs the marker, the counters twice and the dirty documents, at 40 or at 400
    executions, folded or not by as many."""
    seen = []
    for size in (40, 400):
        name = f"{db_name}_{size}"
        rec = Recorder()
        st = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[rec]), name)
        try:
            st.init()
            for i in range(size):
                st.save(Execution(id=f"e-{i}", definition_id="D"))
            st.fold_counts()
            for i in range(10):  # as many written since the fold
                st.save(st.load(f"e-{i}"))
            rec.clear()
            got = st.read_counts()
            assert got is not None and got.per == {"D": {"PENDING": size}}
            seen.append(rec.names())
        finally:
            st.close()
        client.drop_database(name)
    assert seen[0] == seen[1] and len(seen[0]) == 4, seen


def test_commits_that_keep_the_status_leave_the_counts_alone(mongo_url: str, client: Any, db_name: str) -> None:
    """core/counting.py, Rule 2: a commit harel describes as keeping the status (its `Step`)
    sets no `cdirty` and its own `quiet`; after 40 of them a fold reads no dirty document
    and an exact read of the counts reads only the counter documents (documents returned,
    counted on the wire). One that moves the status is marked, and read by both."""
    name = f"{db_name}_pinned"
    rec = Recorder()
    st = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[rec]), name)
    try:
        st.init()
        ids = [f"p-{i}" for i in range(20)]
        for i in ids:
            st.save(Execution(id=i, definition_id="D", status=Status.RUNNING))
        st.fold_counts()
        running = Step(cause="event", from_status=Status.RUNNING, to_status=Status.RUNNING)
        for n in range(40):
            exe = st.load(ids[n % len(ids)])
            assert exe is not None
            exe.active_path, exe.updated_at = f"s{n}", 100.0 + n
            st.commit(exe, [], step=running)
        db = client[name]
        assert db[EXES].count_documents({DIRTY: True, "part": {"$gte": 0}}) == 0
        # each one's `quiet` is the time it wrote: it waits on nothing (core/stuck.py)
        assert all(d.get(QUIET) == d["updated_at"] for d in db[EXES].find({}, {QUIET: 1, "updated_at": 1}))
        rec.clear()
        st.fold_counts()
        assert rec.read_from(EXES) == 0, rec.commands
        rec.clear()
        got = st.read_counts()
        assert got is not None and got.per == {"D": {"RUNNING": 20}}
        assert rec.read_from(EXES) == 0, rec.commands
        assert rec.read_from(counts_collection(DEFAULT_PREFIX)) > 0
        # a status change is marked, and read by the next exact read and fold
        exe = st.load(ids[0])
        assert exe is not None
        exe.status = Status.DONE
        st.commit(exe, [], step=Step(cause="event", from_status=Status.RUNNING, to_status=Status.DONE))
        rec.clear()
        got = st.read_counts()
        assert got is not None and got.per == {"D": {"RUNNING": 19, "DONE": 1}}
        assert rec.read_from(EXES) == 1
        check(st, db)
    finally:
        st.close()
    client.drop_database(name)


def test_a_commit_pins_what_its_load_saw_it_wait_on(mongo_url: str, client: Any, db_name: str) -> None:
    """core/commit.py: a commit that keeps a RUNNING execution RUNNING and gives it no entry or
    timer pins what the store's load saw it wait on. Waiting on a timer, loaded by this
    store: one update, not marked, no `quiet`. Loaded by another store (no hint): it pins
    "waits on nothing", misses, reads the version back and is sent again marked, and the
    fold decides `quiet` (counted on the wire)."""
    name = f"{db_name}_hint"
    rec = Recorder()
    st = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[rec]), name)
    other = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[rec]), name)
    running = Step(cause="event", from_status=Status.RUNNING, to_status=Status.RUNNING)
    try:
        st.init()
        exe = Execution(id="w", definition_id="D", status=Status.RUNNING, updated_at=1.0)
        st.commit(exe, [], timers=(TimerOp("schedule", "t", fire_at=9e9),))
        st.fold_counts()
        db = client[name]
        for n, committer in enumerate((st, other, st)):
            loaded = st.load("w")
            assert loaded is not None
            loaded.updated_at = 2.0 + n
            rec.clear()
            committer.commit(loaded, [], step=running)
            sent = [c for c in rec.names() if c in ("update", "find")]  # (a first operation reads the marker)
            doc = db[EXES].find_one({"_id": "w"})
            assert doc is not None and QUIET not in doc
            if committer is st:
                assert sent == ["update"] and DIRTY not in doc, (sent, doc)
            else:  # no hint: pinned "waits on nothing", missed, read back, sent again marked
                assert sent[-3:] == ["update", "find", "update"] and doc.get(DIRTY) is True, (sent, doc)
                st.fold_counts()
                assert QUIET not in db[EXES].find_one({"_id": "w"})  # type: ignore[operator]
        check(st, db)
    finally:
        st.close()
        other.close()
    client.drop_database(name)


def test_an_old_database_whose_marks_count_versions_counts_right(store: MongoStore, client: Any, db_name: str) -> None:
    """Rule 1: a `cc` written before the counts stopped counting versions carries a `v`, and
    a counter a `v` sum; no migration: every delta and reader ignores them."""
    store.init()
    for i in range(6):
        store.save(Execution(id=f"o-{i}", definition_id="D", status=Status.RUNNING))
    store.fold_counts()
    db = client[db_name]
    db[EXES].update_many({"cc": {"$type": "object"}}, {"$set": {"cc.v": 7}})
    db[counts_collection(DEFAULT_PREFIX)].update_many({"seq": {"$exists": True}}, {"$set": {"v": 42}})
    for i in range(3):  # status changes, from marks carrying a `v`
        exe = store.load(f"o-{i}")
        assert exe is not None
        exe.status = Status.DONE
        store.commit(exe, [], step=Step(cause="event", from_status=Status.RUNNING, to_status=Status.DONE))
    check(store, db)  # read with the dirty ones
    store.fold_counts()
    check(store, db)  # and from the counters alone
    assert store.read_counts().per == {"D": {"RUNNING": 3, "DONE": 3}}  # type: ignore[union-attr]


async def test_the_front_page_and_metrics_show_the_full_counts(
    astore: AsyncMongoStore, store: MongoStore, client: Any, db_name: str, definitions: dict[str, Any]
) -> None:
    db = client[db_name]
    store.init()
    await astore.init()
    await asyncio.to_thread(run_orders, store, definitions, random.Random(11), 8, "m")
    store.fold_counts()
    await asyncio.to_thread(run_orders, store, definitions, random.Random(12), 3, "m2")  # some unfolded
    per, _ = full_counts(db)
    totals: dict[str, int] = {}
    for ss in per.values():
        for s, n in ss.items():
            totals[s] = totals.get(s, 0) + n
    registry = CollectorRegistry()
    app = FastAPI()
    app.include_router(dashboard_router(astore, auth=no_auth, metrics=StoreMetrics(registry)), prefix="/ops")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
        front = (await http.get("/ops/api/executions")).json()
        order = (await http.get("/ops/api/executions", params={"definition": "Order"})).json()
        metrics = (await http.get("/ops/metrics")).text
    assert front["counts"] == totals
    assert front["definitions"] == sorted(d for d in db[EXES].distinct("definition_id") if isinstance(d, str))
    assert order["counts"] == per["Order"]
    for definition, ss in per.items():
        for s, n in ss.items():
            assert f'harel_executions{{definition="{definition}",status="{s}"}} {float(n)}' in metrics
    assert await queries.status_counts(queries.ExecutionFilter(roots_only=True)) == {
        s: n for s in queries.STATUSES if (n := db[EXES].count_documents({"status": s, "parent_id": None}))
    }
