"""Migrations on the real server: a database harel's own MongoStore wrote, with executions
mid-flight, is migrated up and finished on this store, or migrated back down and finished on
harel's store, with the same final executions as a run on harel's store alone.

The scenario: executions of one small machine (a timed state, an orthogonal fork whose
regions are child executions, a join) are left mid-flight the ways a crashed worker leaves
them: a timer armed, spawns committed but not relayed (the worker died right after the
commit), a region's `Finished` committed to the outbox but not delivered, one suspended.
Every run uses the same clock and the same ids, so the executions of two runs are equal
field for field, and so are their traces.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pymongo
import pytest
from harel import DurableRunner, Event, definition_from_dsl
from harel.engine.execution import Execution
from harel.engine.schema import DEFAULT_PREFIX, Names
from harel.engine.store import MongoStore as HarelMongoStore

from harel_beanie import MongoStore, SchemaMismatch
from harel_beanie.commands import cli
from harel_beanie.core.documents import PARTITION_INDEXES, SCHEMA_MARKER_ID, SCHEMA_VERSION, bind, index_models
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, part_of
from harel_beanie.migrate import (
    ADDED_FIELDS,
    PROGRESS_ID,
    STEPS,
    MigrationError,
    Migrator,
    StepReport,
)
from tests.support import migrate_actions


def main(argv: list[str]) -> int:
    """`harel-beanie migrate` with `argv`, in this process."""
    return cli.main(["migrate", *argv])


# harel's default prefix, as most deployments of harel's store use; the Beanie CLI test
# uses another one
PREFIX = DEFAULT_PREFIX
OTHER_PREFIX = "legacy"
ROOT = Path(__file__).resolve().parents[2]

DSL = """
bind { step = tests.support.migrate_actions.record }

event Kick {}
event Go {}

machine Job {
  context { n: int = 1 }
  initial Working

  state Working {
    on enter step
    timeout 60
  }

  orthogonal Split {
    with { n: n }
    state Left {
      initial L1
      state L1 {
        on enter step
        timeout 300
      }
      final LDone success
      from L1 to LDone on Go
      from L1 to LDone on Timeout
    }
    state Right {
      initial R1
      state R1 { on enter step }
      final RDone success { on enter step }
      from R1 to RDone
    }
  }

  final Done success { on enter step }
  final Broken failed

  from Working to Split on Timeout
  from Working to Split on Kick
  from Split join all to Done else to Broken
}
"""
DEFINITIONS = {"Job": definition_from_dsl(DSL)}


class Crash(Exception):
    """A worker dying right after a commit, before relaying what it committed."""


class Recorder:
    """A store as harel's runner sees it: `crashing` makes the relay's first read fail, and
    every commit that processes an event is recorded, so a test can tell that none was
    processed twice."""

    def __init__(self, inner: Any, processed: list[tuple[str, str]]) -> None:
        self.inner = inner
        self.crashing = False
        self.processed = processed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def pending_spawns(self) -> Any:
        if self.crashing:
            raise Crash()
        return self.inner.pending_spawns()

    def commit(self, exe: Any, emits: Any, processed_event_id: Optional[str] = None, *args: Any, **kwargs: Any) -> Any:
        seqs = self.inner.commit(exe, emits, processed_event_id, *args, **kwargs)
        if processed_event_id is not None:
            self.processed.append((exe.id, processed_event_id))
        return seqs


class World:
    """One database, a clock, and stores of either kind on it."""

    def __init__(self, client: pymongo.MongoClient[Any], url: str, db: str, prefix: str = PREFIX) -> None:
        self.client, self.url, self.db, self.prefix = client, url, db, prefix
        self.now = 1000.0
        self.processed: list[tuple[str, str]] = []
        self.calls_from = len(migrate_actions.CALLS)  # the action calls of this world's run

    def harel(self) -> Recorder:
        return Recorder(HarelMongoStore(self.client, self.db, prefix=self.prefix), self.processed)

    def ours(self) -> Recorder:
        return Recorder(MongoStore(self.client, self.db, prefix=self.prefix), self.processed)

    def runner(self, store: Recorder) -> DurableRunner:
        return DurableRunner(store, DEFINITIONS, clock=lambda: self.now, trace=True, execution="inline")

    @property
    def executions(self) -> Any:
        return self.client[self.db][Names(self.prefix).executions]

    @property
    def counters(self) -> Any:
        return self.client[self.db][Names(self.prefix).counters]

    def migrate(self, direction: str, **kw: Any) -> list[StepReport]:
        return asyncio.run(_migrate(self.url, self.db, self.prefix, direction, **kw))


async def _migrate(
    url: str, db: str, prefix: str, direction: str, to: Optional[int] = None, **kw: Any
) -> list[StepReport]:
    client: Any = pymongo.AsyncMongoClient(url)
    try:
        m = Migrator(client[db], prefix, say=lambda line: None, **kw)
        return await (m.up(SCHEMA_VERSION if to is None else to) if direction == "up" else m.down(to))
    finally:
        await client.close()


def ev(kind: str, execution_id: str) -> Event:
    return Event(kind=kind, id=f"{execution_id}-{kind}")


def crash(store: Recorder, call: Callable[[], Any]) -> None:
    store.crashing = True
    try:
        with pytest.raises(Crash):
            call()
    finally:
        store.crashing = False


# --- the scenario, in three phases, each on whichever store a test gives it -----------------


def populate(w: World, store: Recorder) -> None:
    """What harel's store holds when the switch happens: executions mid-flight. The relay
    drains every pending entry of the database, so the crashes come last."""
    r = w.runner(store)
    w.now = 1000.0
    r.create("Job", execution_id="t1")  # a timer armed
    r.create("Job", execution_id="p1")
    r.suspend("p1")  # suspended, its timer left armed
    r.create("Job", execution_id="o1")
    r.process("o1", ev("Kick", "o1"))
    r.create("Job", execution_id="s1")
    crash(store, lambda: r.process("s1", ev("Kick", "s1")))  # the fork's spawns not relayed
    crash(store, lambda: r.process("o1", ev("Go", "o1")))  # a region's Finished not delivered


def advance(w: World, store: Recorder) -> None:
    """More of the same, written by the store in use after the switch (its first relay
    also delivers what `populate` left pending)."""
    r = w.runner(store)
    w.now = 1010.0
    r.create("Job", execution_id="m3")
    r.create("Job", execution_id="m2")
    r.process("m2", ev("Kick", "m2"))
    r.create("Job", execution_id="m1")
    crash(store, lambda: r.process("m1", ev("Kick", "m1")))
    crash(store, lambda: r.process("m2", ev("Go", "m2")))


def finish(w: World, store: Recorder) -> None:
    """Bring every execution to its end."""
    r = w.runner(store)
    w.now = 1030.0
    r.recover("Job")  # relays the spawns and the outbox entries left pending
    r.resume("p1")
    w.now = 1100.0
    assert r.fire_due_timers() == 3  # t1, p1, m3 leave Working
    w.now = 1200.0
    for eid in ("s1", "m1"):
        r.process(eid, ev("Go", eid))
    w.now = 1500.0
    assert r.fire_due_timers() == 3  # the Left regions of t1, p1, m3 time out


ROOTS = ("t1", "s1", "o1", "p1", "m1", "m2", "m3")


def outcome(w: World, store: Recorder) -> dict[str, Any]:
    """Every execution and its trace, checked to be finished with nothing left pending."""
    ids = sorted(d["_id"] for d in w.executions.find({}, {"_id": 1}))
    assert set(ROOTS) <= set(ids) and len(ids) == 3 * len(ROOTS)  # each root and its 2 regions
    out = {}
    for eid in ids:
        exe = store.load(eid)
        assert exe is not None and exe.status.value == "DONE", (eid, exe)
        out[eid] = {"execution": exe.model_dump(mode="json"), "trace": store.read_trace(eid)}
    assert store.pending_outbox() == [] and store.pending_spawns() == []
    assert store.due_timers(10**12) == []
    return out


def assert_nothing_twice(w: World) -> None:
    assert len(set(w.processed)) == len(w.processed), "an event was processed twice"
    calls = migrate_actions.CALLS[w.calls_from :]
    assert calls and len(set(calls)) == len(calls), "a step's actions ran twice"


def pending(store: Recorder) -> dict[str, Any]:
    return {
        "outbox": sorted((e.seq, e.target_id, e.event.id) for e in store.pending_outbox()),
        "spawns": sorted(
            (s.seq, s.parent_id, s.child_id, s.root_path, json.dumps(s.context)) for s in store.pending_spawns()
        ),
        "timers": sorted(store.due_timers(10**12)),
    }


@pytest.fixture
def world(client: pymongo.MongoClient[Any], mongo_url: str, db_name: str) -> World:
    return World(client, mongo_url, db_name)


@pytest.fixture(scope="module")
def reference(client: pymongo.MongoClient[Any], mongo_url: str) -> Iterator[dict[str, Any]]:
    """The whole scenario on harel's store alone."""
    w = World(client, mongo_url, "hbt_migrate_reference")
    client.drop_database(w.db)
    populate(w, w.harel())
    advance(w, w.harel())
    finish(w, w.harel())
    assert_nothing_twice(w)
    yield outcome(w, w.harel())
    client.drop_database(w.db)


# --- differential tests ---------------------------------------------------------------------


def test_up_then_this_store_finishes_what_harels_store_left(world: World, reference: dict[str, Any]) -> None:
    populate(world, world.harel())
    before = pending(world.harel())
    assert before["outbox"] and before["spawns"] and before["timers"]
    assert world.harel().load("p1").status.value == "SUSPENDED"

    [report, indexes, parts, lean] = world.migrate("up")
    assert (report.version, report.direction, report.read) == (1, "up", 6)
    # step 2 flags exactly the documents holding entries, and swaps the indexes
    holding = {d["_id"] for d in world.executions.find() if d.get("outbox") or d.get("spawns")}
    assert (indexes.version, indexes.direction, indexes.updated) == (2, "up", len(holding)) and holding
    assert {d["_id"] for d in world.executions.find({"pending": True})} == holding
    names = {ix["name"] for ix in world.executions.list_indexes()}
    assert {"hb_pending_part", "hb_timer_pending"} <= names
    assert not names & {"hb_outbox_seq", "hb_spawn_seq", "hb_next_fire"}
    # step 3 gives every document its partition
    assert (parts.version, parts.direction, parts.updated) == (3, "up", 6)
    # step 4 reads no document and drops the index `hb_pending_part` leads with
    assert (lean.version, lean.direction, lean.read) == (4, "up", 0) and "hb_pending" not in names
    assert all(d["part"] == part_of(d["_id"], DEFAULT_PARTITIONS) for d in world.executions.find())
    assert world.counters.find_one({"_id": SCHEMA_MARKER_ID})["parts"] == DEFAULT_PARTITIONS

    ours = world.ours()
    assert pending(ours) == before  # every entry, seq and timer carried over as it was
    doc = world.executions.find_one({"_id": "s1"})
    assert (
        doc["status"] == "RUNNING"
        and doc["active_path"] == "Split"
        and doc["seq_hi"] == max(s["seq"] for s in doc["spawns"])
    )
    assert world.executions.find_one({"_id": "t1"})["next_fire"] == 1060.0
    assert world.counters.find_one({"_id": SCHEMA_MARKER_ID})["n"] == SCHEMA_VERSION
    assert world.counters.count_documents({"_id": {"$regex": "^trace:"}}) == 0  # folded into trace_n
    names = {ix["name"] for ix in world.executions.list_indexes()}
    assert {ix.document["name"] for ix in index_models(bind(PREFIX)[0])} <= names

    advance(world, ours)
    finish(world, ours)
    assert_nothing_twice(world)
    assert outcome(world, world.ours()) == reference


def test_down_leaves_a_database_harels_store_finishes(world: World, reference: dict[str, Any]) -> None:
    populate(world, world.harel())
    harels_fields = {key for doc in world.executions.find() for key in doc}  # harel's own layout
    world.migrate("up")
    advance(world, world.ours())  # leaves entries in this store's forms, with its seqs
    left = pending(world.ours())
    assert any(seq > 2**40 for seq, *_ in left["outbox"]) and any(seq > 2**40 for seq, *_ in left["spawns"])
    # a purged execution leaves a tombstone under this store: harel's store can't read one
    gone = Execution(id="purged-before-down", definition_id="d")
    world.ours().commit(gone, [])
    assert world.ours().purge(gone.id, 1) and world.executions.find_one({"_id": gone.id})["tomb"]

    [lean, parts, indexes, report] = world.migrate("down", to=0)
    assert (lean.version, lean.direction, lean.read) == (4, "down", 0)
    assert (parts.version, parts.direction) == (3, "down") and parts.updated == parts.read
    assert (indexes.version, indexes.direction) == (2, "down") and indexes.updated > 0
    assert world.executions.count_documents({"part": {"$exists": True}}) == 0
    assert world.executions.count_documents({"pending": {"$exists": True}}) == 0
    assert world.executions.find_one({"_id": gone.id}) is None
    assert world.counters.count_documents({"_id": {"$regex": "^harel_beanie:node:"}}) == 0  # the seq leases
    assert (report.version, report.direction) == (1, "down")
    assert world.counters.find_one({"_id": SCHEMA_MARKER_ID}) is None
    assert {ix["name"] for ix in world.executions.list_indexes()} == {"_id_"}
    for doc in world.executions.find():
        assert not set(ADDED_FIELDS) & set(doc), doc["_id"]
        # exactly harel's layout: no field of this store's left (`cdirty` on a document
        # written and not yet counted was)
        assert set(doc) <= harels_fields, (doc["_id"], set(doc) - harels_fields)
        assert all(isinstance(s["context"], dict) for s in doc.get("spawns", []))
        assert all(isinstance(step.get("index"), int) for step in doc.get("trace", []))
    # harel's counters now hand out seqs above every pending one
    for counter, kind in (("outbox", "outbox"), ("spawn", "spawns")):
        assert world.counters.find_one({"_id": counter})["n"] >= max(seq for seq, *_ in left[kind])

    harel = world.harel()
    assert pending(harel) == left  # harel's store reads every entry this store wrote
    finish(world, harel)
    assert_nothing_twice(world)
    assert outcome(world, world.harel()) == reference


def test_an_interrupted_step_finishes_when_run_again(world: World, reference: dict[str, Any]) -> None:
    populate(world, world.harel())

    def stop_after(n: int) -> Callable[[int, str, int], None]:
        def hook(version: int, direction: str, batches: int) -> None:
            if batches == n:
                raise KeyboardInterrupt

        return hook

    with pytest.raises(KeyboardInterrupt):
        world.migrate("up", batch_size=2, on_batch=stop_after(2))
    progress = world.counters.find_one({"_id": PROGRESS_ID})
    assert progress["direction"] == "up" and progress["after"] is not None
    assert world.counters.find_one({"_id": SCHEMA_MARKER_ID}) is None  # not at version 1 yet
    assert world.executions.count_documents({"status": {"$exists": True}}) == 4

    [report, _, _, _] = world.migrate("up", batch_size=2)
    assert report.resumed_after == progress["after"] and report.read == 2
    assert world.counters.find_one({"_id": PROGRESS_ID}) is None
    assert world.migrate("up") == []  # at version 1: nothing to do

    advance(world, world.ours())
    world.migrate("down", to=1)  # the partition and index steps, then step 1 interrupted
    with pytest.raises(KeyboardInterrupt):
        world.migrate("down", batch_size=3, on_batch=stop_after(1))
    assert world.counters.find_one({"_id": SCHEMA_MARKER_ID}) is None  # the store reads both layouts meanwhile
    assert world.counters.find_one({"_id": PROGRESS_ID})["direction"] == "down"
    [report] = world.migrate("down", batch_size=3)
    assert report.resumed_after is not None and report.read == 13 - 3

    finish(world, world.harel())
    assert_nothing_twice(world)
    assert outcome(world, world.harel()) == reference


# --- properties of the steps ----------------------------------------------------------------


def _raw(w: World) -> dict[str, Any]:
    return {
        "executions": list(w.executions.find().sort("_id", 1)),
        "counters": list(w.counters.find({"_id": {"$ne": PROGRESS_ID}}).sort("_id", 1)),
        "indexes": sorted(ix["name"] for ix in w.executions.list_indexes()),
    }


def test_running_a_step_again_changes_nothing(world: World) -> None:
    populate(world, world.harel())
    advance(world, world.harel())
    world.migrate("up")
    after_up = _raw(world)
    # as if the first run stopped just before recording the version: the whole pass again
    world.counters.delete_one({"_id": SCHEMA_MARKER_ID})
    [again, _, _, _] = world.migrate("up", batch_size=4)
    assert again.read == 13 and again.updated == 0
    assert _raw(world) == after_up

    advance_more = world.ours()
    world.now = 1020.0
    world.runner(advance_more).create("Job", execution_id="x1")  # one written by this store
    world.migrate("down", to=0)
    after_down = _raw(world)
    world.counters.insert_one({"_id": PROGRESS_ID, "step": 1, "direction": "down", "after": None})
    [again] = world.migrate("down")
    assert again.read == world.executions.count_documents({}) and again.updated == 0
    assert _raw(world) == after_down


def test_a_document_moved_during_a_batch_is_read_again(world: World) -> None:
    populate(world, world.harel())
    step = STEPS[1]
    stale = list(world.executions.find({}, step.up_projection).sort("_id", 1))
    harel = world.harel()
    crash(harel, lambda: world.runner(harel).process("t1", ev("Kick", "t1")))  # t1 moves on after the read

    async def run() -> int:
        client: Any = pymongo.AsyncMongoClient(world.url)
        try:
            return await step.up_batch(Migrator(client[world.db], PREFIX), stale)
        finally:
            await client.close()

    assert asyncio.run(run()) == 6
    t1 = world.executions.find_one({"_id": "t1"})
    assert t1["active_path"] == "Split" and t1["version"] == 2 and "next_fire" not in t1
    assert t1["seq_hi"] == max(s["seq"] for s in t1["spawns"])


def test_up_refuses_when_harels_counter_reaches_this_stores_seqs(world: World) -> None:
    populate(world, world.harel())
    world.counters.update_one({"_id": "outbox"}, {"$set": {"n": 2**62}})
    with pytest.raises(MigrationError, match="collide"):
        world.migrate("up")
    assert world.executions.count_documents({"status": {"$exists": True}}) == 0


def test_the_store_checks_the_recorded_version(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    populate(world, world.harel())
    world.migrate("up")
    world.ours().init()  # at the version it needs: opens

    world.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": 0}})
    with pytest.raises(SchemaMismatch, match="harel-beanie migrate up"):
        world.ours().init()

    world.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": SCHEMA_VERSION + 1}})
    with pytest.raises(SchemaMismatch, match="newer"):
        world.ours().init()
    for action in ("up", "down"):
        assert main([action, "--url", world.url, "--db", world.db, "--prefix", PREFIX]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "newer" in err[0]


# --- the command line -----------------------------------------------------------------------


def test_migrate_command(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    populate(world, world.harel())
    args = ["--url", world.url, "--db", world.db, "--prefix", PREFIX]
    assert main(["status", *args]) == 0
    assert "layout version 0" in capsys.readouterr().out
    assert main(["up", *args, "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "6 executions read in 3 batches" in out and f"at layout version {SCHEMA_VERSION}" in out
    assert main(["status", *args]) == 0
    assert "up to date" in capsys.readouterr().out
    assert main(["down", *args, "--to", "0"]) == 0
    assert "at layout version 0" in capsys.readouterr().out
    world.harel().load("t1")  # harel's store reads it again


def test_a_document_that_is_not_an_execution_stops_up_naming_it(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    populate(world, world.harel())
    world.executions.update_one({"_id": "s1"}, {"$set": {"data": "{not json"}})
    assert main(["up", "--url", world.url, "--db", world.db, "--prefix", PREFIX]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'s1'" in err[0] and "not an Execution" in err[0]
    assert world.counters.find_one({"_id": SCHEMA_MARKER_ID}) is None  # not recorded as migrated
    assert main(["status", "--url", world.url, "--db", world.db, "--prefix", PREFIX]) == 0
    assert "interrupted: 0001_adopt_harel_mongostore up" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sideways", "--url", "mongodb://x"], "invalid choice"),
        (["up"], "no MongoDB URL"),
        (["up", "--url", "mongodb://x", "--prefix", "no-dash"], "--prefix"),
        (["up", "--url", "mongodb://x", "--db", "a.b"], "--db"),
        (["up", "--url", "mongodb://x", "--batch-size", "0"], "--batch-size"),
        (["up", "--url", "mongodb://x", "--batch-size", "lots"], "expected a whole number"),
        (["up", "--url", "mongodb://x", "--to", "7"], "--to"),
        (["status", "--url", "mongodb://x", "--to", "0"], "--to"),
        (["up", "--url", "http://nowhere"], "--url"),
        (["up", "--url", "mongodb://user:secret@127.0.0.1:1", "--timeout", "0.3"], "did not answer a ping"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MONGODB_URL", raising=False)
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("harel-beanie migrate:"), lines
    assert "secret" not in captured.err and "Traceback" not in captured.err


def test_beanies_cli_runs_the_migration_files(client: pymongo.MongoClient[Any], mongo_url: str, db_name: str) -> None:
    # under a prefix other than harel's default, which Beanie's CLI gets from HAREL_PREFIX
    world = World(client, mongo_url, db_name, prefix=OTHER_PREFIX)
    populate(world, world.harel())
    beanie = Path(sys.executable).with_name("beanie")
    command = [str(beanie)] if beanie.exists() else [sys.executable, "-m", "beanie.executors.migrate"]
    env = {**os.environ, "HAREL_PREFIX": OTHER_PREFIX, "HAREL_MIGRATE_BATCH_SIZE": "4"}

    def beanie_migrate(*extra: str) -> None:
        run = subprocess.run(
            [
                *command,
                "migrate",
                "-p",
                "migrations",
                "-uri",
                world.url,
                "-db",
                world.db,
                "--no-use-transaction",
                *extra,
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr

    beanie_migrate()
    assert world.counters.find_one({"_id": SCHEMA_MARKER_ID})["n"] == SCHEMA_VERSION
    assert world.executions.count_documents({"status": {"$exists": True}}) == 6
    assert client[db_name][Names(PREFIX).counters].find_one({"_id": SCHEMA_MARKER_ID}) is None  # only that prefix
    beanie_migrate("--backward", "-d", str(SCHEMA_VERSION))
    assert world.counters.find_one({"_id": SCHEMA_MARKER_ID}) is None
    assert world.executions.count_documents({"status": {"$exists": True}}) == 0
    finish_part = world.runner(world.harel())
    world.now = 1030.0
    finish_part.recover("Job")  # harel's store runs it again
    assert world.harel().load("o1").status.value == "DONE"


def test_this_store_finishes_a_database_migrated_under_another_prefix(
    client: pymongo.MongoClient[Any], mongo_url: str, db_name: str
) -> None:
    world = World(client, mongo_url, db_name, prefix=OTHER_PREFIX)
    populate(world, world.harel())
    world.migrate("up")
    world.now = 1030.0
    world.runner(world.ours()).recover("Job")
    assert world.ours().load("o1").status.value == "DONE"


def test_every_step_has_its_migration_file() -> None:
    """In the package (a pip user's Beanie CLI is given `BEANIE_MIGRATIONS`), and at the top
    of a clone (`migrations/`, a link to it)."""
    from harel_beanie.migrate import BEANIE_MIGRATIONS

    files = sorted(p.stem for p in BEANIE_MIGRATIONS.glob("[!_]*.py"))
    assert files == [STEPS[v].name for v in sorted(STEPS)]
    assert (ROOT / "migrations").resolve() == BEANIE_MIGRATIONS.resolve()


def test_layout_1_with_pending_work_goes_up_to_2(
    client: pymongo.MongoClient[Any], mongo_url: str, db_name: str
) -> None:
    """A database this store wrote at layout 1 (no `pending` flag, full pending indexes):
    refused until migrated, then every entry it held is relayed through the flag's index."""
    from harel_beanie.core.documents import LAYOUT_1_INDEXES

    store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    exe = Execution(id="v1", definition_id="d")
    store.commit(exe, [])
    store.commit(exe, [("peer", Event(kind="Hi"))], spawns=(("v1:c", "Fork.A", {}),))
    store.close()
    # as layout 1 left it
    exes, counters = client[db_name][Names(PREFIX).executions], client[db_name][Names(PREFIX).counters]
    exes.update_many({}, {"$unset": {"pending": ""}})
    exes.drop_indexes()
    exes.create_indexes([ix for ix in index_models(bind(PREFIX)[0]) if "partialFilterExpression" not in ix.document])
    exes.create_indexes(LAYOUT_1_INDEXES)
    counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": 1}})
    with pytest.raises(SchemaMismatch):
        MongoStore(pymongo.MongoClient(mongo_url), db_name).pending_outbox()

    [report] = asyncio.run(_migrate(mongo_url, db_name, PREFIX, "up", to=2))
    assert (report.version, report.updated) == (2, 1)
    # version 2's indexes, without those led by `part` that version 3 adds
    assert not set(PARTITION_INDEXES) & {ix["name"] for ix in exes.list_indexes()}
    ours = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    assert [s.child_id for s in ours.pending_spawns()] == ["v1:c"]
    assert [e.event.kind for e in ours.pending_outbox()] == ["Hi"]
    ours.close()
    # and down to 1 again: the flag goes, the full indexes come back
    asyncio.run(_migrate(mongo_url, db_name, PREFIX, "down"))
    assert exes.count_documents({"pending": {"$exists": True}}) == 0
    assert {ix.document["name"] for ix in LAYOUT_1_INDEXES} <= {ix["name"] for ix in exes.list_indexes()}
    assert counters.find_one({"_id": SCHEMA_MARKER_ID})["n"] == 1
