"""Layout step 3 (`harel_beanie.migrate.partitions`) on the real server: a database at layout 2
(executions holding outbox entries, spawns and timers; queues with messages waiting, one
group spilled to overflow documents; nothing carrying `part`) goes up to 3 and back, while a
store and a transport of this version keep working on it, and afterwards a worker that owns
partitions finds every piece of work in them.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterator, Optional

import pymongo
import pytest
from harel import Event
from harel.engine.execution import Execution
from harel.engine.schema import DEFAULT_PREFIX, Names
from harel.engine.store import TimerOp

from harel_beanie import MongoStore
from harel_beanie.core.count_build import EPOCH_ID
from harel_beanie.core.documents import PARTITION_INDEXES, RETIRED_INDEXES, SCHEMA_MARKER_ID, SCHEMA_VERSION
from harel_beanie.core.names import queue_names
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, Held, PartitionScope, part_of
from harel_beanie.migrate import PROGRESS_ID, STEPS, MigrationError, Migrator, StepReport
from harel_beanie.transport import MongoTransport
from harel_beanie.transport.documents import INLINE_MAX

FAR = 10.0**12  # a lease end, and a time by which every timer is due
SPILLED = "x05"  # the group whose backlog outgrows its queue document
QUEUE_INDEXES = ("hb_part_claim",)


class Db:
    """One database and what the test wrote to it: every outbox event, spawn, timer and
    message it expects a worker to find."""

    def __init__(self, client: pymongo.MongoClient[Any], url: str, name: str) -> None:
        self.client, self.url, self.name = client, url, name
        db = client[name]
        self.exes, self.counters = db[Names(DEFAULT_PREFIX).executions], db[Names(DEFAULT_PREFIX).counters]
        self.queues, self.overflow = (db[n] for n in queue_names(DEFAULT_PREFIX))
        self.outbox: set[str] = set()
        self.spawns: set[str] = set()
        self.timers: set[tuple[str, str]] = set()
        self.messages: dict[str, list[str]] = {}  # group -> event ids waiting, in order
        self.acked: set[str] = set()
        self.published = 0

    def store(self, partitions: Optional[PartitionScope] = None) -> MongoStore:
        return MongoStore(pymongo.MongoClient(self.url), self.name, partitions=partitions)

    def transport(self, partitions: Optional[PartitionScope] = None) -> MongoTransport:
        return MongoTransport(pymongo.MongoClient(self.url), self.name, partitions=partitions)

    def execution(self, store: MongoStore, eid: str, i: int) -> None:
        """A new execution holding some of each kind of work (which ones depends on `i`)."""
        exe = Execution(id=eid, definition_id="d")
        store.commit(exe, [])
        emits = [(None, Event(kind="Hi", id=f"{eid}-hi"))] if i % 2 == 0 else []
        spawns = ((f"{eid}:Fork.A:1", "Fork.A", {}),) if i % 3 == 0 else ()
        store.commit(exe, emits, timers=(TimerOp("schedule", "Wait", 2000.0 + i),), spawns=spawns)
        self.outbox |= {e.id for _, e in emits}
        self.spawns |= {child for child, _, _ in spawns}
        self.timers.add((eid, "Wait"))

    def publish(self, transport: MongoTransport, group: str, n: int) -> None:
        waiting = self.messages.setdefault(group, [])
        for _ in range(n):
            self.published += 1
            event = Event(kind="M", id=f"{group}-m{self.published}")
            transport.publish(group, event)
            waiting.append(event.id)

    def claim_one(self, transport: MongoTransport) -> str:
        lease = transport.claim("w", 30.0)
        assert lease is not None
        transport.ack(lease)
        assert self.messages[lease.group_id][0] == lease.event.id  # each group in order
        self.messages[lease.group_id].pop(0)
        self.acked.add(lease.event.id)
        return lease.event.id

    def migrate(self, direction: str, to: Optional[int] = None, **kw: Any) -> list[StepReport]:
        async def run() -> list[StepReport]:
            client: Any = pymongo.AsyncMongoClient(self.url)
            try:
                m = Migrator(client[self.name], DEFAULT_PREFIX, say=lambda line: None, **kw)
                return await (m.up(3 if to is None else to) if direction == "up" else m.down(2 if to is None else to))
            finally:
                await client.close()

        return asyncio.run(run())

    def marker(self) -> dict[str, Any]:
        marker = self.counters.find_one({"_id": SCHEMA_MARKER_ID})
        assert marker is not None
        return marker

    def unpartitioned(self) -> int:
        return sum(c.count_documents({"part": None}) for c in (self.exes, self.queues, self.overflow))

    def assert_partitioned(self, parts: int) -> None:
        """Every document carries the partition of its id (of its group, for overflow)."""
        for coll, key in ((self.exes, "_id"), (self.queues, "_id"), (self.overflow, "g")):
            docs = list(coll.find({}, {key: 1, "part": 1}))
            assert docs and all(d.get("part") == part_of(d[key], parts) for d in docs), coll.name
        names = {ix["name"] for ix in self.exes.list_indexes()}
        assert set(PARTITION_INDEXES) <= names
        assert set(QUEUE_INDEXES) <= {ix["name"] for ix in self.queues.list_indexes()}

    def assert_found_by_owners(self, parts: int) -> None:
        """A store and a transport owning every partition find every entry, spawn, timer
        and message; one owning a single partition finds exactly that partition's."""
        scope = PartitionScope(held={p: Held(epoch=1, until=FAR) for p in range(parts)})
        store = self.store(partitions=scope)
        try:
            assert {e.event.id for e in store.pending_outbox()} == self.outbox
            assert {s.child_id for s in store.pending_spawns()} == self.spawns
            assert {(eid, path) for eid, path, _ in store.due_timers(FAR)} == self.timers
            for p in range(1, parts):  # partition 0 also sweeps documents without `part`
                scope.held = {p: Held(epoch=1, until=FAR)}
                mine = {(eid, path) for eid, path in self.timers if part_of(eid, parts) == p}
                assert {(eid, path) for eid, path, _ in store.due_timers(FAR)} == mine
        finally:
            store.close()
        transport = self.transport(partitions=PartitionScope(held={p: Held(1, FAR) for p in range(parts)}))
        try:
            waiting = sum(len(ids) for ids in self.messages.values())
            for _ in range(waiting):
                self.claim_one(transport)
            assert transport.claim("w", 30.0) is None
            assert not any(self.messages.values())
        finally:
            transport.close()


def to_layout_2(db: Db, parts: Optional[int] = DEFAULT_PARTITIONS) -> None:
    """The database as a store and transport of layout 2 leave it: no `part` anywhere, none
    of the indexes led by it, version 2 recorded (with `parts` as given: None for none)."""
    for coll in (db.exes, db.queues, db.overflow):
        coll.update_many({}, {"$unset": {"part": ""}})
    for name in PARTITION_INDEXES:
        db.exes.drop_index(name)
    db.queues.drop_index(QUEUE_INDEXES[0])
    db.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": 2}, "$unset": {"parts": ""}})
    if parts is not None:
        db.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"parts": parts}})


@pytest.fixture
def db(client: pymongo.MongoClient[Any], mongo_url: str, db_name: str) -> Iterator[Db]:
    """Executions over many families (a root with one child among them) and queued
    messages, one group spilled, written by this store and transport, then taken to layout 3
    (step 4 down: it only creates an index again)."""
    d = Db(client, mongo_url, db_name)
    store, transport = d.store(), d.transport()
    for i in range(24):
        d.execution(store, f"x{i:02d}", i)
    d.execution(store, "x03:Fork.A:1", 1)  # a child: its family's partition
    for i in range(0, 24, 3):
        d.publish(transport, f"x{i:02d}", 2)
    d.publish(transport, SPILLED, INLINE_MAX + 6)
    assert d.overflow.count_documents({}) > 0
    store.close()
    transport.close()
    d.migrate("down", to=3)
    yield d


def _stop_after(n: int, version: int = 3) -> Callable[[int, str, int], None]:
    def hook(v: int, direction: str, batches: int) -> None:
        if v == version and batches == n:
            raise KeyboardInterrupt

    return hook


# --- up from layout 2 -----------------------------------------------------------------------


@pytest.mark.parametrize("recorded", [None, 5])
def test_up_gives_every_document_its_partition(db: Db, recorded: Optional[int]) -> None:
    to_layout_2(db, parts=recorded)
    assert db.unpartitioned() == db.exes.count_documents({}) + db.queues.count_documents(
        {}
    ) + db.overflow.count_documents({})

    [report] = db.migrate("up", batch_size=4)
    parts = recorded or DEFAULT_PARTITIONS  # a recorded count is kept; none: the default
    assert (report.version, report.direction, report.updated) == (3, "up", db.exes.count_documents({}))
    assert db.marker()["n"] == 3 and db.marker()["parts"] == parts
    assert db.unpartitioned() == 0
    db.assert_partitioned(parts)
    assert db.exes.find_one({"_id": "x03:Fork.A:1"})["part"] == db.exes.find_one({"_id": "x03"})["part"]
    db.assert_found_by_owners(parts)


def test_up_refuses_a_recorded_count_no_store_accepts(db: Db) -> None:
    to_layout_2(db, parts=0)
    with pytest.raises(MigrationError, match="records 0 partitions"):
        db.migrate("up")
    assert db.unpartitioned() > 0 and db.marker()["n"] == 2
    assert not set(PARTITION_INDEXES) & {ix["name"] for ix in db.exes.list_indexes()}


# --- live: workers of this version keep working while the step runs ------------------------


def test_up_runs_while_a_store_and_a_transport_work(db: Db) -> None:
    """A store and a transport of this version, opened at layout 2, commit, publish and
    claim between the step's batches: executions it has passed and not yet reached change,
    new ones appear on both sides of its cursor (one as a worker of layout 2 writes it,
    without `part`), messages are published to old and new groups and claimed. Nothing is
    lost, and afterwards owners of the partitions find all of it."""
    to_layout_2(db)
    store, transport = db.store(), db.transport()
    store.init()  # layout 2: it runs, writing `part` on what it creates
    counter = iter(range(100, 200))

    def work(version: int, direction: str, batches: int) -> None:
        if version != 3:
            return
        i = next(counter)
        after = db.counters.find_one({"_id": PROGRESS_ID})["after"]
        for eid in ("a" + after, after + "z", f"y{i}"):  # behind the cursor, ahead of it, last
            db.execution(store, eid, i)
        # a worker of layout 2 creates one behind the cursor: without `part`
        db.execution(store, "a" + after + "old", i)
        db.exes.update_one({"_id": "a" + after + "old"}, {"$unset": {"part": ""}})
        # old executions, passed and not yet reached, move on
        for eid in ("x00", "x22"):
            exe = store.load(eid)
            assert exe is not None
            store.commit(exe, [(None, Event(kind="Hi", id=f"{eid}-hi{i}"))])
            db.outbox.add(f"{eid}-hi{i}")
        db.publish(transport, "x00", 1)
        db.publish(transport, f"y{i}", 2)
        db.publish(transport, SPILLED, 1)
        db.claim_one(transport)

    [report] = db.migrate("up", batch_size=4, on_batch=work)
    assert report.batches > 3
    store.close()
    transport.close()

    assert db.marker()["n"] == 3
    assert db.unpartitioned() == 0  # the old worker's executions too
    db.assert_partitioned(DEFAULT_PARTITIONS)
    db.assert_found_by_owners(DEFAULT_PARTITIONS)


def test_executions_moved_during_a_batch_are_read_again(db: Db) -> None:
    to_layout_2(db)
    step = STEPS[3]
    stale = list(db.exes.find({}, step.up_projection).sort("_id", 1))
    store = db.store()
    moved = store.load("x01")
    assert moved is not None
    store.commit(moved, [])  # after the read: the guarded write meets a newer version
    store.close()

    async def run() -> int:
        client: Any = pymongo.AsyncMongoClient(db.url)
        try:
            return await step.up_batch(Migrator(client[db.name], DEFAULT_PREFIX), stale)
        finally:
            await client.close()

    assert asyncio.run(run()) == len(stale)
    assert db.exes.count_documents({"part": None}) == 0
    assert db.exes.find_one({"_id": "x01"})["version"] == moved.version


# --- down, and up again ---------------------------------------------------------------------


def _raw(db: Db) -> dict[str, Any]:
    return {
        "executions": list(db.exes.find().sort("_id", 1)),
        "queues": list(db.queues.find().sort("_id", 1)),
        "overflow": list(db.overflow.find().sort("_id", 1)),
        "counters": list(db.counters.find({"_id": {"$ne": PROGRESS_ID}}).sort("_id", 1)),
        "indexes": [sorted(ix["name"] for ix in c.list_indexes()) for c in (db.exes, db.queues)],
    }


def test_down_then_up_again_round_trips(db: Db) -> None:
    db.migrate("up")  # at 3 already: nothing to do
    written = _raw(db)

    [down] = db.migrate("down")
    assert (down.version, down.direction, down.updated) == (3, "down", db.exes.count_documents({}))
    assert db.unpartitioned() == sum(c.count_documents({}) for c in (db.exes, db.queues, db.overflow))
    # version 2 recorded; the count kept, for the stores of this version still running
    assert db.marker()["n"] == 2 and db.marker()["parts"] == DEFAULT_PARTITIONS
    assert not set(PARTITION_INDEXES) & {ix["name"] for ix in db.exes.list_indexes()}
    assert not set(QUEUE_INDEXES) & {ix["name"] for ix in db.queues.list_indexes()}

    # what each execution is counted as goes with the counts (layout 2 has none), `cdirty`
    # included: the first fold after `up` counts every document anew
    counting = ("cc", "cseq", "cdirty", "leaving")
    assert not any(f in d for d in db.exes.find() for f in counting)
    # up to this package's layout, which ends by building the counts (each execution counted,
    # its `quiet` set), then back to 3: layout 4 only drops an index (migrate.lean_indexes)
    db.migrate("up", to=SCHEMA_VERSION)
    db.migrate("down", to=3)
    marks = (*counting, "quiet")
    written["executions"] = [{k: v for k, v in d.items() if k not in marks} for d in written["executions"]]
    again = _raw(db)
    again["executions"] = [{k: v for k, v in d.items() if k not in marks} for d in again["executions"]]
    # the counters' epoch (core.counting, Rule 6) outlives the counts by design: a build after
    # the next `up` must start above every seq the ones dropped reached
    again["counters"] = [d for d in again["counters"] if d["_id"] != EPOCH_ID]
    assert again == written
    assert all("cc" in d for d in db.exes.find())  # every one counted by `up`'s build
    db.assert_found_by_owners(DEFAULT_PARTITIONS)


def test_down_drops_the_index_an_earlier_release_made_under_this_version(db: Db) -> None:
    """A database an earlier release set up holds `hb_part_pending` (part, _id), which
    `hb_pending_part` replaced: going down drops it with the other indexes led by `part`."""
    db.exes.create_index([("part", 1), ("_id", 1)], name="hb_part_pending", partialFilterExpression={"pending": True})
    db.migrate("down")
    names = {ix["name"] for ix in db.exes.list_indexes()}
    assert not (set(PARTITION_INDEXES) | set(RETIRED_INDEXES)) & names, names


# --- interrupted --------------------------------------------------------------------------


def test_an_interrupted_step_finishes_when_run_again(db: Db) -> None:
    to_layout_2(db, parts=None)
    total = db.exes.count_documents({})
    with pytest.raises(KeyboardInterrupt):
        db.migrate("up", batch_size=3, on_batch=_stop_after(2))
    progress = db.counters.find_one({"_id": PROGRESS_ID})
    assert (progress["step"], progress["direction"]) == (3, "up") and progress["after"] is not None
    # not at version 3 yet, but the count that every `part` is written from is recorded
    assert db.marker()["n"] == 2 and db.marker()["parts"] == DEFAULT_PARTITIONS
    assert db.exes.count_documents({"part": {"$ne": None}}) == 6
    store = db.store()
    store.init()  # a store of this version opens the half-converted database
    store.close()

    [report] = db.migrate("up", batch_size=3)
    assert report.resumed_after == progress["after"] and report.read == total - 6
    assert db.counters.find_one({"_id": PROGRESS_ID}) is None
    assert db.marker()["n"] == 3
    db.assert_partitioned(DEFAULT_PARTITIONS)

    with pytest.raises(KeyboardInterrupt):
        db.migrate("down", batch_size=3, on_batch=_stop_after(1))
    assert db.marker()["n"] == 2  # recorded before down starts
    assert db.counters.find_one({"_id": PROGRESS_ID})["direction"] == "down"
    assert db.exes.count_documents({"part": None}) == 3
    [report] = db.migrate("down", batch_size=3)
    assert report.resumed_after is not None and report.read == total - 3
    assert db.unpartitioned() == sum(c.count_documents({}) for c in (db.exes, db.queues, db.overflow))

    db.migrate("up")
    db.assert_partitioned(DEFAULT_PARTITIONS)
    db.assert_found_by_owners(DEFAULT_PARTITIONS)
