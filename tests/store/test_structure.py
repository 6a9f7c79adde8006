"""Structural performance facts of the store that do not depend on timing.

1. Round trips per operation, counted with a PyMongo `CommandListener` on a client built for
   the test: every commit exactly 1 (state only, the first of a new execution, with emits
   and/or spawns whatever their number, with a trace step), once the instance holds its seq
   lease (its first minting commit takes it first, on the counters collection);
   `load_for_event` 1 (2 for a duplicate, confirmed at majority) - on the sync and on the
   async store. No commit touches the counters collection (no global seq document every
   worker must update).
2. Server work follows pending work, not the collection: with N idle executions (2,000, then
   20,000 in the same database) and K executions holding pending outbox entries, spawns and
   due timers, every relay, sweep, ack, purge, listing and prefix query is explained with
   `executionStats` on exactly the command the store sent (captured by the listener); the
   winning plan must be an index scan on the index declared for it, and the documents and
   keys examined must be about K and the same at both N.
3. Bounded documents: after many processed events with no backlog, the document stays under
   1 MB: the dedupe window and the trace ring stop growing once full.

What the embedded server (SecantusDB) can and cannot show. Its explain is synthesised:
documents examined = collection size for a collection scan, = results for an index scan;
`limit` does not bound its work; a filter holding `_id` next to another field, and a range on
`_id` alone, are reported (and for the range, run) as collection scans, though mongod answers
them from the `_id` index. So here:
- index plans and counts that SecantusDB reports faithfully are asserted everywhere;
- "a page of documents" for a listing whose filter matches many (limit bounding the work),
  the `_id`-addressed writes (ack by owner, delete_timer, purge's delete) and the `_id` range
  of ids_with_prefix are asserted from explain only on a real mongod (`MONGODB_URL` set); on
  SecantusDB the test checks the structural fact instead (the filter is an `_id` point or an
  `_id` range, nothing else the server would have to search by);
- on mongod, each operation's real execution is also counted server-side
  (`serverStatus.metrics.queryExecutor` deltas), which SecantusDB does not report.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any, Iterator, Optional

import pymongo
import pytest
from harel.engine.execution import Execution, Status
from harel.engine.store.base import TimerOp
from harel.spec.states import Event

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.core import flows
from harel_beanie.core.commit import CommitRequest, plan_commit
from harel_beanie.core.partitions import Held
from tests.support.wire import Recorder

ON_MONGOD = bool(os.environ.get("MONGODB_URL"))
mongod_only = pytest.mark.skipif(not ON_MONGOD, reason="SecantusDB cannot show this; runs with MONGODB_URL (mongod)")

EXECUTIONS = "harel_executions"
COUNTERS = "harel_counters"
# commands that are not a store operation's round trip


def _collection(name: str, cmd: dict[str, Any]) -> Any:
    return cmd.get(name)


# --- 1. round trips ---------------------------------------------------------------------------


@pytest.fixture
def counted(mongo_url: str, db_name: str) -> Iterator[tuple[MongoStore, Recorder]]:
    rec = Recorder()
    store = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[rec]), db_name)
    store.init()  # set-up (indexes, layout marker) costs a few round trips once
    store._run(flows.mint_seqs(store._state, 1))  # and so does the seq lease, on the first mint
    rec.clear()
    yield store, rec
    store.close()


@pytest.fixture
async def acounted(mongo_url: str, db_name: str) -> Any:
    rec = Recorder()
    store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url, event_listeners=[rec]), db_name)
    await store.init()
    await store._run(flows.mint_seqs(store._state, 1))
    rec.clear()
    yield store, rec
    await store.close()


def _running(definition: str = "RT", **kw: Any) -> Execution:
    return Execution(definition_id=definition, status=Status.RUNNING, active_path="A", **kw)


def _emits(n: int, target: Optional[str]) -> list[tuple[Optional[str], Event]]:
    return [(target, Event(kind=f"E{i}", data={"i": i})) for i in range(n)]


def _spawns(parent: str, n: int) -> tuple[tuple[str, str, dict[str, Any]], ...]:
    return tuple((f"{parent}.c{i}.{uuid.uuid4().hex[:6]}", "Fork.A", {"i": i}) for i in range(n))


# (emits, spawns) combinations a commit may carry; each costs exactly one round trip
_WORK = [(1, 0), (5, 0), (0, 1), (0, 4), (1, 1), (3, 2), (20, 8)]


def _check_commit_round_trips(step: str, sent: list[tuple[str, dict[str, Any]]], want: int = 1) -> None:
    names = [name for name, _ in sent]
    assert len(sent) == want, f"{step}: {len(sent)} round trips {names}, want {want}"
    touched = {_collection(name, cmd) for name, cmd in sent}
    assert COUNTERS not in touched, f"{step}: a commit went to the counters collection: {names}"


def test_sync_commit_round_trips(counted: tuple[MongoStore, Recorder]) -> None:
    store, rec = counted
    exe = _running()
    store.commit(exe, [], processed_event_id=Event(kind="Start").id)
    sent = rec.take()
    _check_commit_round_trips("first commit of a new execution", sent)
    assert [n for n, _ in sent] == ["insert"]

    store.commit(exe, [], processed_event_id=Event(kind="Go").id)
    sent = rec.take()
    _check_commit_round_trips("state-only commit", sent)
    assert [n for n, _ in sent] == ["update"]
    # the CAS as point clauses (keys.point): mongod's plain equality, no index planning on
    # SecantusDB
    assert sent[0][1]["updates"][0]["q"] == {"_id": {"$in": [exe.id]}, "version": {"$in": [1]}}

    for n_emits, n_spawns in _WORK:
        for target in (None, exe.id, "elsewhere"):
            store.commit(exe, _emits(n_emits, target), Event(kind="X").id, spawns=_spawns(exe.id, n_spawns))
            _check_commit_round_trips(f"commit with {n_emits} emits, {n_spawns} spawns", rec.take())

    # timers scheduled and cancelled, with or without emits
    store.commit(exe, [], Event(kind="T").id, timers=(TimerOp("schedule", "A", 5.0), TimerOp("schedule", "B", 9.0)))
    _check_commit_round_trips("commit scheduling timers", rec.take())
    store.commit(exe, _emits(2, exe.id), Event(kind="U").id, timers=(TimerOp("cancel", "A", 5.0),))
    _check_commit_round_trips("commit with emits cancelling a timer", rec.take())

    # a new execution whose first commit already carries an emit (harel's create + Start)
    fresh = _running()
    store.commit(fresh, _emits(1, fresh.id), spawns=_spawns(fresh.id, 2))
    _check_commit_round_trips("first commit with emits and spawns", rec.take())


def test_the_first_mint_of_an_instance_takes_its_lease(mongo_url: str, db_name: str) -> None:
    """The one commit that is not one round trip: an instance's first commit that mints seqs
    (emits or spawns) takes a node lease first, on the counters collection (4 commands on a
    fresh database: the node counter, harel's seq counters, a probe for a free node, its
    lease), then commits in one. A commit that mints nothing does not take it; the lease's
    extension, about every 30 s while the instance mints, is one write (tests/core/test_flows.py)."""
    rec = Recorder()
    store = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[rec]), db_name)
    store.init()
    rec.clear()
    exe = _running()
    store.commit(exe, [], processed_event_id=Event(kind="Start").id)
    assert [n for n, _ in rec.take()] == ["insert"]
    store.commit(exe, _emits(2, exe.id), Event(kind="X").id)
    sent = [(name, _collection(name, cmd)) for name, cmd in rec.take()]
    lease = [("findAndModify", COUNTERS), ("find", COUNTERS), ("find", COUNTERS), ("insert", COUNTERS)]
    assert sent == [*lease, ("update", EXECUTIONS)]
    store.commit(exe, _emits(2, exe.id), Event(kind="Y").id)
    assert [n for n, _ in rec.take()] == ["update"]
    store.close()


def test_sync_trace_step_adds_no_round_trip(counted: tuple[MongoStore, Recorder]) -> None:
    store, rec = counted
    exe = _running()
    store.commit(exe, [], trace={"cause": "create"})
    assert len(rec.take()) == 1
    for n_emits, n_spawns in [(0, 0), (2, 0), (0, 2), (3, 3)]:
        store.commit(exe, _emits(n_emits, exe.id), Event(kind="X").id, spawns=_spawns(exe.id, n_spawns))
        without = len(rec.take())
        store.commit(
            exe,
            _emits(n_emits, exe.id),
            Event(kind="X").id,
            spawns=_spawns(exe.id, n_spawns),
            trace={"cause": "event", "n": n_emits},
        )
        with_trace = rec.take()
        assert len(with_trace) == without, f"a trace step added round trips: {[n for n, _ in with_trace]}"
        _check_commit_round_trips("commit with a trace step", with_trace)
    assert len(store.read_trace(exe.id)) == 5


def test_sync_load_for_event_is_one_round_trip(counted: tuple[MongoStore, Recorder]) -> None:
    store, rec = counted
    exe = _running()
    seen = Event(kind="Seen").id
    store.commit(exe, [], processed_event_id=seen)
    rec.clear()
    loaded, hit = store.load_for_event(exe.id, seen)
    assert loaded is not None and loaded.id == exe.id and hit
    # a duplicate is confirmed by a second read, at majority (the store writes at majority),
    # before harel is told to drop it: only duplicates pay it
    sent = rec.take()
    assert [n for n, _ in sent] == ["find", "find"]
    assert "readConcern" not in sent[0][1] and sent[1][1]["readConcern"] == {"level": "majority"}
    loaded, hit = store.load_for_event(exe.id, Event(kind="New").id)
    assert loaded is not None and not hit
    assert [n for n, _ in rec.take()] == ["find"]
    assert store.load_for_event("missing", seen) == (None, False)
    assert [n for n, _ in rec.take()] == ["find"]


async def test_async_commit_round_trips(acounted: tuple[AsyncMongoStore, Recorder]) -> None:
    store, rec = acounted
    exe = _running()
    await store.commit(exe, [], processed_event_id=Event(kind="Start").id)
    sent = rec.take()
    _check_commit_round_trips("first commit of a new execution", sent)
    assert [n for n, _ in sent] == ["insert"]
    await store.commit(exe, [], processed_event_id=Event(kind="Go").id)
    sent = rec.take()
    _check_commit_round_trips("state-only commit", sent)
    assert [n for n, _ in sent] == ["update"]
    for n_emits, n_spawns in _WORK:
        await store.commit(exe, _emits(n_emits, exe.id), Event(kind="X").id, spawns=_spawns(exe.id, n_spawns))
        _check_commit_round_trips(f"commit with {n_emits} emits, {n_spawns} spawns", rec.take())
        await store.commit(
            exe, _emits(n_emits, exe.id), Event(kind="X").id, spawns=_spawns(exe.id, n_spawns), trace={"cause": "event"}
        )
        _check_commit_round_trips("commit with a trace step", rec.take())


async def test_async_load_for_event_is_one_round_trip(acounted: tuple[AsyncMongoStore, Recorder]) -> None:
    store, rec = acounted
    exe = _running()
    seen = Event(kind="Seen").id
    await store.commit(exe, [], processed_event_id=seen)
    rec.clear()
    loaded, hit = await store.load_for_event(exe.id, seen)
    assert loaded is not None and hit
    assert [n for n, _ in rec.take()] == ["find", "find"]  # the duplicate confirmed, as above
    loaded, hit = await store.load_for_event(exe.id, Event(kind="New").id)
    assert loaded is not None and not hit
    assert [n for n, _ in rec.take()] == ["find"]


# --- 1b. one relay read per pass (the argument is in harel_beanie.core.flows) -----------------------


def _finds(sent: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [cmd for name, cmd in sent if name == "find" and cmd.get("find") == EXECUTIONS]


def _with_work(store: MongoStore, eid: str, kind: str = "E") -> list[int]:
    exe = _running(id=eid)
    store.commit(exe, [])
    return store.commit(exe, [(eid, Event(kind=kind))], Event(kind="X").id, spawns=_spawns(eid, 1))


def test_relay_pass_is_one_round_trip(counted: tuple[MongoStore, Recorder]) -> None:
    """harel's relay asks pending_spawns then pending_outbox: one read answers both, through
    the one pending index."""
    store, rec = counted
    _with_work(store, "rp-a")
    rec.clear()
    spawns = store.pending_spawns()
    outbox = store.pending_outbox()
    sent = rec.take()
    assert [s.parent_id for s in spawns] == ["rp-a"] and [e.event.kind for e in outbox] == ["E"]
    assert [n for n, _ in sent] == ["find"] and _finds(sent)[0]["filter"] == {"pending": True}
    # nothing pending: still one read a pass
    for e in outbox:
        store.ack_outbox(e.seq)
    for sp in spawns:
        store.ack_spawn(sp.seq)
    rec.clear()
    assert store.pending_spawns() == [] and store.pending_outbox() == []
    assert len(rec.take()) == 1
    # the kept answer is used once: a second pending_outbox reads
    store.pending_outbox()
    assert len(rec.take()) == 1


def test_relay_pass_sees_a_commit_in_between(counted: tuple[MongoStore, Recorder]) -> None:
    """Fails if the kept answer outlived a write of this store: an entry committed between
    the two calls must be in the second answer."""
    store, rec = counted
    assert store.pending_spawns() == []
    exe = _running(id="rp-late")
    store.commit(exe, [])
    store.commit(exe, [("rp-late", Event(kind="Late"))])
    rec.clear()
    assert [e.event.kind for e in store.pending_outbox()] == ["Late"]
    assert len(_finds(rec.take())) == 1  # read again


def test_a_relay_read_plans_as_one_range_of_the_pending_index(
    counted: tuple[MongoStore, Recorder], mongo_url: str, db_name: str
) -> None:
    """A relay over every partition, the post-commit relay's read of one family and a sweep
    of the partitions a worker owns, as the store sends them, explained by the server: on
    SecantusDB (whose explain names its own planner's pick for these shapes) a range of
    `hb_pending_part`, which it plans only because `pending` leads its keys (on (part, _id) it
    planned a collection scan; `{pending}` alone read `hb_pending` before layout 4); on mongod
    an index scan, no collection scan."""
    store, rec = counted
    _with_work(store, "fam-1")
    _with_work(store, "fam-2")
    rec.clear()
    store.pending_spawns()  # a relay over every partition: `{pending}` alone
    every = _finds(rec.take())[0]["filter"]
    store.pending_spawns(within="fam-1")
    family = _finds(rec.take())[0]["filter"]
    store._state.scope.held = {store._state.scope.part_of("fam-1"): Held(epoch=1, until=time.time() + 60)}
    store.pending_spawns()
    sweep = _finds(rec.take())[0]["filter"]
    assert "part" in family and "_id" in family and set(sweep["part"]) == {"$in"}, (family, sweep)
    assert every == {"pending": True}, every
    db = pymongo.MongoClient(mongo_url)[db_name]
    for read in (every, family, sweep):
        plan = db.command("explain", {"find": EXECUTIONS, "filter": read}, verbosity="queryPlanner")
        stages = _stages(plan["queryPlanner"]["winningPlan"])
        assert not any(st == "COLLSCAN" for st, _ in stages), (read, stages)
        if not ON_MONGOD:
            assert ("IXSCAN", "hb_pending_part") in stages, (read, stages)


def test_relay_pass_sees_an_ack_in_between(counted: tuple[MongoStore, Recorder]) -> None:
    store, rec = counted
    seqs = _with_work(store, "rp-ack")
    assert len(store.pending_spawns()) == 1
    store.ack_outbox(seqs[0])
    assert store.pending_outbox() == []


def test_relay_pass_reads_again_for_another_tree(counted: tuple[MongoStore, Recorder]) -> None:
    store, rec = counted
    _with_work(store, "rp-x")
    _with_work(store, "rp-y")
    assert [s.parent_id for s in store.pending_spawns(within="rp-x")] == ["rp-x"]
    rec.clear()
    assert sorted(e.event.kind for e in store.pending_outbox()) == ["E", "E"]  # both trees
    assert len(_finds(rec.take())) == 1


def test_relay_pass_sees_another_threads_commit(counted: tuple[MongoStore, Recorder]) -> None:
    """An operation of this instance from another thread, between the two calls, voids the
    kept answer as the caller's own would."""
    store, rec = counted
    assert store.pending_spawns() == []
    worker = threading.Thread(target=lambda: _with_work(store, "rp-thread"))
    worker.start()
    worker.join()
    assert [e.event.kind for e in store.pending_outbox()] == ["E"]


async def test_async_relay_pass_is_one_round_trip_and_sees_other_tasks(
    acounted: tuple[AsyncMongoStore, Recorder],
) -> None:
    import asyncio

    store, rec = acounted
    exe = _running(id="arp")
    await store.commit(exe, [])
    await store.commit(exe, [("arp", Event(kind="E"))], Event(kind="X").id, spawns=_spawns("arp", 1))
    rec.clear()
    assert len(await store.pending_spawns()) == 1 and len(await store.pending_outbox()) == 1
    assert [n for n, _ in rec.take()] == ["find"]
    # another task's commit lands between the two calls of a pass
    other = _running(id="arp-other")
    await store.commit(other, [])
    assert len(await store.pending_spawns()) == 1
    await asyncio.gather(store.commit(other, [("arp-other", Event(kind="F"))]))
    assert sorted(e.event.kind for e in await store.pending_outbox()) == ["E", "F"]


# --- 1c. index keys a commit writes -------------------------------------------------------------


def _entries(client: pymongo.MongoClient[Any], db_name: str) -> dict[str, int]:
    """Bytes of index entries per index, as SecantusDB counts them (collStats: the packed
    keys of each index's entries, none when the index holds no entry)."""
    stats = client[db_name].command("collStats", EXECUTIONS)
    return {k: int(v) for k, v in (stats.get("indexSizes") or {}).items()}


@pytest.mark.skipif(ON_MONGOD, reason="mongod's indexSizes are B-tree pages, never empty; SecantusDB counts entries")
def test_a_document_without_work_has_no_key_in_the_pending_indexes(
    counted: tuple[MongoStore, Recorder], client: pymongo.MongoClient[Any], db_name: str
) -> None:
    """The partial indexes hold a document only while it holds that work: a state-only commit
    of an idle execution writes keys in the four listing indexes and none in hb_pending_part or
    hb_timer_pending; an emit puts one in hb_pending_part until its ack, a timer one in
    hb_timer_pending until it is deleted."""
    store, _ = counted
    exe = _running(id="keys")
    store.commit(exe, [])
    store.commit(exe, [], Event(kind="Go").id)
    sizes = _entries(client, db_name)
    assert not sizes.get("hb_pending_part") and not sizes.get("hb_timer_pending"), sizes
    assert all(sizes.get(n) for n in ("hb_definition", "hb_status", "hb_status_updated", "hb_parent")), sizes
    [seq] = store.commit(exe, [("keys", Event(kind="E"))])
    assert _entries(client, db_name).get("hb_pending_part")
    store.ack_outbox(seq)
    assert not _entries(client, db_name).get("hb_pending_part")
    assert client[db_name][EXECUTIONS].find_one({"_id": "keys"}).get("pending") is None
    store.commit(exe, [], timers=(TimerOp("schedule", "A", 5.0),))
    assert _entries(client, db_name).get("hb_timer_pending")
    store.delete_timer("keys", "A", 5.0)
    assert not _entries(client, db_name).get("hb_timer_pending")


def test_the_indexes_each_commit_shape_writes_a_key_in(
    counted: tuple[MongoStore, Recorder], client: pymongo.MongoClient[Any], db_name: str
) -> None:
    """Per commit shape, the indexes the committed document has a key in (its partial
    filters and sparseness, from the document as stored): what a server that writes only
    changed keys may touch, and what one that rewrites every key of a changed document
    (SecantusDB) rewrites. Against layout 3's set (with `hb_pending`): a state-only commit
    and a timer's belong to as many, a commit holding an outbox entry or a spawn to one
    fewer. (SecantusDB also plans over every index on every write: docs/INDEXES.md gives
    each one's measured cost.)"""
    from harel_beanie.core.documents import LAYOUT_3_INDEXES, ExecutionDocument, index_models
    from tests.support.index_use import Index, holds_key

    now = [Index.model("executions", ix) for ix in index_models(ExecutionDocument)]
    layout_3 = now + [Index.model("executions", ix) for ix in LAYOUT_3_INDEXES]
    store, _ = counted
    coll = client[db_name][EXECUTIONS]

    def belongs(eid: str) -> tuple[int, int]:
        doc = coll.find_one({"_id": eid})
        assert doc is not None
        return sum(holds_key(doc, ix) for ix in layout_3), sum(holds_key(doc, ix) for ix in now)

    exe = _running(id="shapes")
    store.commit(exe, [])
    store.commit(exe, [], Event(kind="Go").id)  # state only
    before, after = belongs("shapes")
    doc = coll.find_one({"_id": "shapes"})
    assert doc is not None and after == before and not holds_key(doc, layout_3[-1])
    # the four listing indexes, and the counts' mark until a fold clears it
    marked = {"hb_part_cdirty"} if doc.get("cdirty") else set()
    listing = {"hb_definition", "hb_status", "hb_status_updated", "hb_parent"}
    assert {ix.name for ix in now if holds_key(doc, ix)} == listing | marked
    store.commit(exe, [], timers=(TimerOp("schedule", "A", 5.0),))  # a timer armed
    assert belongs("shapes") == (before + 2, after + 2)  # hb_timer_pending, hb_part_timer
    store.delete_timer("shapes", "A", 5.0)
    store.commit(exe, [("shapes", Event(kind="E"))], spawns=(("shapes:c", "Fork.A", {}),))
    assert belongs("shapes") == (before + 2, after + 1)  # hb_pending_part (and hb_pending before)


# --- 2. server work follows pending work ------------------------------------------------------

K = 8  # executions holding pending work (each: 2 outbox entries, 1 spawn, 1 due timer)
SIZES = (2_000, 20_000)  # idle executions
PAGE = 5  # listing page size


def _idle_documents(start: int, stop: int, now: float) -> list[dict[str, Any]]:
    """Idle executions exactly as the store writes a new one (its own commit plan): running,
    children of one root, half of them with a timer armed an hour ahead, nothing pending."""
    docs = []
    for i in range(start, stop):
        exe = Execution(
            id=f"idle-{i:06d}",
            definition_id="Idle",
            status=Status.RUNNING,
            active_path="Wait",
            parent_id="idle-root",
            created_at=now,
            updated_at=now,
        )
        timers = (TimerOp("schedule", "Wait", now + 3600.0),) if i % 2 else ()
        plan = plan_commit(CommitRequest(exe, [], Event(kind="Start").id, timers), trace_max=200, dedupe_window=1000)
        assert plan.insert is not None
        docs.append(plan.insert)
    return docs


def _stages(plan: dict[str, Any]) -> list[tuple[str, Optional[str]]]:
    """(stage, index name) of every node of an explain plan, depth first."""
    out: list[tuple[str, Optional[str]]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "stage" in node:
                out.append((node["stage"], node.get("indexName")))
            for key in ("queryPlan", "inputStage", "inputStages", "winningPlan"):
                if key in node:
                    walk(node[key])
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(plan)
    return out


_COMMAND_NOISE = {"lsid", "$db", "$clusterTime", "$readPreference", "txnNumber", "readConcern", "writeConcern"}


def _as_find(name: str, cmd: dict[str, Any]) -> dict[str, Any]:
    """The find whose plan a captured command runs: the find itself, or the filter of an
    update/delete (SecantusDB ignores an update's filter in explain; mongod plans the write's
    query stage the same way)."""
    if name == "find":
        return {k: v for k, v in cmd.items() if k not in _COMMAND_NOISE}
    if name == "update":
        (u,) = cmd["updates"]
        return {"find": cmd["update"], "filter": u["q"], **({} if u.get("multi") else {"limit": 1})}
    if name == "delete":
        (d,) = cmd["deletes"]
        return {"find": cmd["delete"], "filter": d["q"], **({"limit": 1} if d.get("limit") else {})}
    raise AssertionError(f"unexpected command {name}")


class Observed:
    """One operation's captured command and the server's account of it."""

    def __init__(self, name: str, cmd: dict[str, Any], explain: dict[str, Any], executed: Optional[dict[str, int]]):
        self.name = name
        self.find = _as_find(name, cmd)
        self.filter = self.find["filter"]
        stats = explain["executionStats"]
        self.docs = int(stats.get("totalDocsExamined", 0))
        self.keys = int(stats.get("totalKeysExamined", 0))
        self.returned = int(stats.get("nReturned", 0))
        self.stages = _stages(explain["queryPlanner"]["winningPlan"])
        self.executed = executed  # mongod: {"keys", "docs"} the real operation read (queryExecutor)

    @property
    def index(self) -> Optional[str]:
        scans = [ix for st, ix in self.stages if st in ("IXSCAN", "EXPRESS_IXSCAN") and ix]
        return scans[0] if scans else None

    @property
    def collscan(self) -> bool:
        return any(st == "COLLSCAN" for st, _ in self.stages)

    def __repr__(self) -> str:
        return f"<{self.name} {self.filter} stages={self.stages} docs={self.docs} keys={self.keys} executed={self.executed}>"


class Lab:
    """A database with idle executions and a few executions holding pending work; runs each
    store operation, captures what it sent and explains it."""

    def __init__(self, mongo_url: str, client: pymongo.MongoClient[Any], db_name: str) -> None:
        self.client = client
        self.db = client[db_name]
        self.rec = Recorder()
        self.store = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[self.rec]), db_name)
        self.store.init()
        # other store instances: a relay on another worker, and one that never read the
        # entries it acks (a restarted worker: it has no owner hint, so it finds them by seq)
        self.relay = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[self.rec]), db_name)
        self.relay.init()
        self.cold = MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[self.rec]), db_name)
        self.cold.init()
        self.coll = self.db[EXECUTIONS]
        self.n = 0
        self.stage = 0
        self.now = time.time()

    def close(self) -> None:
        for st in (self.store, self.relay, self.cold):
            st.close()

    def grow(self, n: int) -> None:
        """Add idle executions up to `n`: insert_many of documents shaped as the store writes."""
        docs = _idle_documents(self.n, n, self.now)
        for i in range(0, len(docs), 2_000):
            self.coll.insert_many(docs[i : i + 2_000], ordered=False)
        self.n = n

    def fresh_pending(self) -> None:
        """Replace the previous stage's busy executions with K new ones, written through the
        store: roots of `Hot`, each with 2 outbox entries (one addressed to this stage's purge
        victim), a spawn, a due timer and a later one; and K failed roots of `Broken`."""
        self.coll.delete_many({"definition_id": {"$in": ["Hot", "Broken"]}})
        self.stage += 1
        self.victim = f"idle-{self.stage - 1:06d}"
        self.hot = [f"hot-{self.stage}-{i}" for i in range(K)]
        for eid in self.hot:
            exe = Execution(id=eid, definition_id="Hot", status=Status.RUNNING, active_path="A")
            self.store.commit(exe, [])
            emits = [(self.victim, Event(kind="Ping")), (eid, Event(kind="Self"))]
            timers = (TimerOp("schedule", "A", self.now - 10.0), TimerOp("schedule", "B", self.now + 3600.0))
            self.store.commit(exe, emits, Event(kind="Go").id, timers, spawns=((f"{eid}.r", "Fork.A", {}),))
        for i in range(K):
            self.store.commit(
                Execution(id=f"broken-{self.stage}-{i}", definition_id="Broken", status=Status.FAILED), []
            )
        self.rec.clear()

    def _executed_counter(self) -> Optional[dict[str, int]]:
        if not ON_MONGOD:
            return None  # SecantusDB's serverStatus has no metrics.queryExecutor
        qe = self.client.admin.command("serverStatus").get("metrics", {}).get("queryExecutor")
        if not qe:
            return None
        return {"keys": int(qe.get("scanned", 0)), "docs": int(qe.get("scannedObjects", 0))}

    def run(self, op: Any, *, mutates: bool = False, only: Optional[str] = None) -> list[Observed]:
        """Run `op` (a callable on the store), capture the commands it sent to the executions
        collection, and explain each against the data as the operation found it (a write's
        documents are restored from a snapshot first)."""
        snapshot = list(self.coll.find({"_id": {"$in": self.hot + [self.victim]}})) if mutates else []
        self.rec.clear()
        before = self._executed_counter()
        op()
        after = self._executed_counter()
        sent = [(n, c) for n, c in self.rec.take() if _collection(n, c) == EXECUTIONS]
        if only is not None:
            sent = [(n, c) for n, c in sent if n == only]
        assert sent, "the operation sent nothing to the executions collection"
        if mutates:
            for doc in snapshot:
                self.coll.replace_one({"_id": doc["_id"]}, doc, upsert=True)
        executed = None if before is None or after is None else {k: after[k] - before[k] for k in before}
        out = []
        for name, cmd in sent:
            explain = self.db.command("explain", _as_find(name, cmd), verbosity="executionStats")
            out.append(Observed(name, cmd, explain, executed if len(sent) == 1 else None))
        return out

    def observe_all(self) -> dict[str, list[Observed]]:
        """Every operation of the issue's list, on this stage's data."""
        s, r, c, obs = self.store, self.relay, self.cold, {}
        now = time.time()
        obs["pending_outbox"] = self.run(lambda: r.pending_outbox())
        obs["pending_spawns"] = self.run(lambda: r.pending_spawns())
        obs["due_timers"] = self.run(lambda: r.due_timers(now))
        assert len(r.pending_outbox()) == 2 * K and len(r.pending_spawns()) == K and len(r.due_timers(now)) == K
        for key, kwargs in {
            "list_status": {"status": [Status.FAILED]},
            "list_definition": {"definition_id": "Hot"},
            "list_roots": {"roots_only": True},
            "list_status_large": {"status": [Status.RUNNING]},
            "list_definition_large": {"definition_id": "Idle"},
        }.items():
            first = s.list_executions(limit=PAGE, **kwargs)
            assert len(first.items) == PAGE and first.next_cursor is not None
            obs[key] = self.run(lambda: s.list_executions(limit=PAGE, **kwargs))
            obs[key + "_page2"] = self.run(lambda: s.list_executions(limit=PAGE, cursor=first.next_cursor, **kwargs))
        obs["ids_with_prefix"] = self.run(lambda: s.ids_with_prefix(f"hot-{self.stage}-"))
        assert sorted(s.ids_with_prefix(f"hot-{self.stage}-")) == sorted(self.hot)

        # acks: by a store that never saw the entries (found by the seq index) and by the one
        # that wrote them (it knows the owner: addressed by _id)
        seqs = [e.seq for e in r.pending_outbox()]
        spawn_seqs = [e.seq for e in r.pending_spawns()]
        # (a store without the owner finds it through the pending index, then writes by _id)
        cold_outbox = self.run(lambda: c.ack_outbox(seqs[0]), mutates=True)
        obs["ack_outbox"] = [o for o in cold_outbox if o.name == "find"]
        obs["ack_outbox_cold_write"] = [o for o in cold_outbox if o.name == "update"]
        obs["ack_outbox_owned"] = self.run(lambda: s.ack_outbox(seqs[1]), mutates=True)
        cold_spawn = self.run(lambda: c.ack_spawn(spawn_seqs[0]), mutates=True)
        obs["ack_spawn"] = [o for o in cold_spawn if o.name == "find"]
        obs["ack_spawn_cold_write"] = [o for o in cold_spawn if o.name == "update"]
        obs["ack_spawn_owned"] = self.run(lambda: s.ack_spawn(spawn_seqs[1]), mutates=True)
        eid, path, fire_at = r.due_timers(now)[0]
        obs["delete_timer"] = self.run(lambda: r.delete_timer(eid, path, fire_at), mutates=True)
        victim = s.load(self.victim)
        assert victim is not None
        purged = self.run(lambda: s.purge(self.victim, victim.version), mutates=True)
        # purge: a point read of the version, the tombstone written over the document (a
        # replacement guarded by _id and version), the holders of entries addressed to it
        # found by the seq index, and those entries pulled by _id
        obs["purge_read"] = [o for o in purged if o.name == "find" and "pending" not in o.filter]
        obs["purge_replace"] = [o for o in purged if o.name == "update" and "version" in o.filter]
        obs["purge_pending"] = [o for o in purged if o.name == "find" and "pending" in o.filter]
        obs["purge_entries"] = [o for o in purged if o.name == "update" and "version" not in o.filter]
        assert all(obs[k] for k in ("purge_read", "purge_replace", "purge_pending", "purge_entries")), purged
        return obs


@pytest.fixture(scope="module")
def observed(mongo_url: str, client: pymongo.MongoClient[Any]) -> Iterator[dict[int, dict[str, list[Observed]]]]:
    db_name = "hbt_structure_" + uuid.uuid4().hex[:8]
    lab = Lab(mongo_url, client, db_name)
    try:
        out = {}
        for n in SIZES:
            lab.grow(n)
            lab.fresh_pending()
            out[n] = lab.observe_all()
        yield out
    finally:
        lab.close()
        client.drop_database(db_name)


def _one(observed: dict[int, dict[str, list[Observed]]], key: str) -> dict[int, Observed]:
    out = {}
    for n in SIZES:
        found = observed[n][key]
        assert len(found) == 1, f"{key}: expected one command, got {found}"
        out[n] = found[0]
    return out


def _same_at_every_n(key: str, by_n: dict[int, Observed], slack: int = 0) -> None:
    small, large = by_n[SIZES[0]], by_n[SIZES[-1]]
    assert large.docs <= small.docs + slack and large.keys <= small.keys + slack, (
        f"{key}: server work grew with N: {SIZES[0]} -> {small}, {SIZES[-1]} -> {large}"
    )
    if small.executed is not None and large.executed is not None:
        assert large.executed["docs"] <= small.executed["docs"] + slack, (key, small.executed, large.executed)
        assert large.executed["keys"] <= small.executed["keys"] + slack + 1, (key, small.executed, large.executed)


# operation -> (index that must serve it, max documents examined, max keys examined)
INDEXED = {
    "pending_outbox": ("hb_pending_part", K, 2 * K + 1),
    "pending_spawns": ("hb_pending_part", K, K + 1),
    "due_timers": ("hb_timer_pending", K, K + 1),
    # an ack without the owner hint: the pending documents' seqs, read through hb_pending_part
    "ack_outbox": ("hb_pending_part", K, K + 1),
    "ack_spawn": ("hb_pending_part", K, K + 1),
    "purge_pending": ("hb_pending_part", K, 2 * K + 1),
    # a filter matching few: about those (2K roots: K Hot + K Broken)
    "list_status": ("hb_status", K + 1, K + 2),
    "list_status_page2": ("hb_status", K + 1, K + 2),
    "list_definition": ("hb_definition", K + 1, K + 2),
    "list_definition_page2": ("hb_definition", K + 1, K + 2),
    "list_roots": ("hb_parent", 2 * K + 1, 2 * K + 2),
    "list_roots_page2": ("hb_parent", 2 * K + 1, 2 * K + 2),
}


def _params(keys: Any) -> list[Any]:
    return sorted(keys)


@pytest.mark.parametrize("key", _params(INDEXED))
def test_server_work_follows_pending_work(observed: dict[int, dict[str, list[Observed]]], key: str) -> None:
    index, max_docs, max_keys = INDEXED[key]
    by_n = _one(observed, key)
    for n, o in by_n.items():
        assert o.index == index and not o.collscan, f"{key} at N={n}: not an index scan on {index}: {o}"
        assert o.docs <= max_docs and o.keys <= max_keys, f"{key} at N={n}: read more than ~K: {o}"
        if o.executed is not None:  # mongod: what the real operation read
            assert o.executed["docs"] <= max_docs and o.executed["keys"] <= max_keys + 1, (key, n, o.executed)
    _same_at_every_n(key, by_n)


# a listing whose filter matches ~N: the plan is the index on every server (asserted here);
# "reads about a page" needs a server whose limit bounds the work (mongod, test below)
LARGE_LISTINGS = {
    "list_status_large": "hb_status",
    "list_status_large_page2": "hb_status",
    "list_definition_large": "hb_definition",
    "list_definition_large_page2": "hb_definition",
}


@pytest.mark.parametrize("key", _params(LARGE_LISTINGS))
def test_listing_a_large_match_uses_its_index_and_keyset(
    observed: dict[int, dict[str, list[Observed]]], key: str
) -> None:
    by_n = _one(observed, key)
    for n, o in by_n.items():
        assert o.index == LARGE_LISTINGS[key] and not o.collscan, f"{key} at N={n}: {o}"
        assert "skip" not in o.find, f"{key}: pages with skip: {o.find}"
        assert o.find.get("limit") == PAGE + 1, f"{key}: fetches more than a page: {o.find}"
        if key.endswith("_page2"):
            assert set(o.filter["_id"]) == {"$gt"}, f"{key}: the cursor is not a keyset bound: {o.filter}"


@mongod_only
@pytest.mark.parametrize("key", sorted(LARGE_LISTINGS))
def test_listing_a_large_match_reads_about_a_page(observed: dict[int, dict[str, list[Observed]]], key: str) -> None:
    by_n = _one(observed, key)
    for n, o in by_n.items():
        assert o.docs <= PAGE + 2 and o.keys <= PAGE + 2, f"{key} at N={n}: read more than a page: {o}"
        if o.executed is not None:
            assert o.executed["docs"] <= PAGE + 2, (key, n, o.executed)
    _same_at_every_n(key, by_n)


# writes addressed by _id (with a guard on another field), and the prefix range on _id
BY_ID = [
    "ack_outbox_owned",
    "ack_spawn_owned",
    "ack_outbox_cold_write",
    "ack_spawn_cold_write",
    "delete_timer",
    "purge_read",
    "purge_replace",
]


@pytest.mark.parametrize("key", BY_ID)
def test_writes_by_id_are_point_writes(observed: dict[int, dict[str, list[Observed]]], key: str) -> None:
    """Every server: the filter is an `_id` equality (plus guards on that one document)."""
    for n, o in _one(observed, key).items():
        ident = o.filter.get("_id")
        # a plain equality, or the one-element `$in` mongod canonicalises to it (keys.point)
        point = isinstance(ident, dict) and set(ident) == {"$in"} and len(ident["$in"]) == 1
        assert isinstance(ident, str) or point, f"{key} at N={n}: not addressed by _id: {o.filter}"


@mongod_only
@pytest.mark.parametrize("key", BY_ID)
def test_writes_by_id_use_the_id_index(observed: dict[int, dict[str, list[Observed]]], key: str) -> None:
    by_n = _one(observed, key)
    for n, o in by_n.items():
        # the planner may pick `_id_` or the other field's index: either reaches one document
        assert not o.collscan and o.docs <= 1 and o.keys <= 2, f"{key} at N={n}: {o}"
        assert o.index is not None or any(st in ("IDHACK", "EXPRESS_IXSCAN") for st, _ in o.stages), o
    _same_at_every_n(key, by_n)


def test_purge_pulls_entries_by_id(observed: dict[int, dict[str, list[Observed]]]) -> None:
    """Every server: purge's pull of the entries addressed to the purged execution is
    addressed by `_id` to the few documents holding pending entries, whatever N is."""
    for n, o in _one(observed, "purge_entries").items():
        ids = o.filter.get("_id", {}).get("$in")
        assert isinstance(ids, list) and 0 < len(ids) <= K, f"N={n}: {o.filter}"


def test_ids_with_prefix_is_an_id_range(observed: dict[int, dict[str, list[Observed]]]) -> None:
    """Every server: a pure range on `_id`, the one field its index serves (no regex)."""
    for n, o in _one(observed, "ids_with_prefix").items():
        assert set(o.filter) == {"_id"} and set(o.filter["_id"]) <= {"$gte", "$lt"}, o.filter
        assert o.returned == K


@mongod_only
def test_ids_with_prefix_uses_the_id_index(observed: dict[int, dict[str, list[Observed]]]) -> None:
    by_n = _one(observed, "ids_with_prefix")
    for n, o in by_n.items():
        assert o.index == "_id_" and not o.collscan, f"N={n}: {o}"
        assert o.docs <= K and o.keys <= K + 1, f"N={n}: {o}"
    _same_at_every_n("ids_with_prefix", by_n)


# --- 3. bounded documents ---------------------------------------------------------------------

_MB = 1024 * 1024


def _size(store: MongoStore, client: pymongo.MongoClient[Any], db_name: str, eid: str) -> dict[str, int]:
    doc = (
        client[db_name][EXECUTIONS]
        .aggregate(
            [
                {"$match": {"_id": eid}},
                {
                    "$project": {
                        "bytes": {"$bsonSize": "$$ROOT"},
                        "processed": {"$size": "$processed"},
                        "trace": {"$size": "$trace"},
                    }
                },
            ]
        )
        .next()
    )
    return {k: int(doc[k]) for k in ("bytes", "processed", "trace")}


def _drive(store: MongoStore, exe: Execution, events: int, every: int, on_mark: Any) -> list[str]:
    ids = []
    for i in range(1, events + 1):
        eid = Event(kind="Tick").id  # harel's event ids: 32 hex characters
        exe.context["n"] = i % 10  # a state that changes, not grows
        store.commit(exe, [], processed_event_id=eid, trace={"cause": "event", "event_kind": "Tick"})
        ids.append(eid)
        if i % every == 0:
            on_mark(i)
    return ids


def _check_bounded(store: MongoStore, client: pymongo.MongoClient[Any], db_name: str, events: int) -> None:
    window, ring = store.settings.dedupe_window, store.trace_max
    exe = Execution(definition_id="Long", status=Status.RUNNING, active_path="A")
    store.commit(exe, [])
    marks: dict[int, dict[str, int]] = {}
    ids = _drive(
        store, exe, events, max(window, ring), lambda i: marks.__setitem__(i, _size(store, client, db_name, exe.id))
    )
    end = _size(store, client, db_name, exe.id)
    assert end["processed"] == window and end["trace"] == ring, end
    assert end["bytes"] < _MB, f"{events} events: the document is {end['bytes']} bytes"
    # once the window and the ring are full, a processed event adds nothing
    full = marks[max(window, ring)]
    assert end["bytes"] <= full["bytes"] + 64, f"still growing after the window filled: {full} -> {end}"
    # the window keeps the most recent ids; older ones have left it
    assert store.is_processed(exe.id, ids[-1]) and store.is_processed(exe.id, ids[-window])
    assert not store.is_processed(exe.id, ids[-window - 1])


def test_document_stays_bounded(store: MongoStore, client: pymongo.MongoClient[Any], db_name: str) -> None:
    """The default window (1,000) and ring (200), filled and then 1,000 events more: the size
    is flat from the moment they are full, so 100,000 events (the soak) leave it where it is."""
    window = store.settings.dedupe_window
    _check_bounded(store, client, db_name, window + 1_000)


@pytest.mark.soak
def test_document_stays_bounded_after_100k_events(
    store: MongoStore, client: pymongo.MongoClient[Any], db_name: str
) -> None:
    _check_bounded(store, client, db_name, 100_000)
