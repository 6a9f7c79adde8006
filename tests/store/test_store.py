"""The store's own promises beyond harel's contracts, on both stores, on the real server:
conflicts leave nothing behind, awkward strings round-trip, bad input is refused clearly,
oversized executions are refused whole, an unreachable server is reported safely."""

from __future__ import annotations

import threading
import time
from typing import Any

import pymongo
import pytest
from harel.engine.execution import Execution, Status
from harel.engine.store.base import StoreConflict, TimerOp
from harel.spec.states import Event

from harel_beanie import AsyncMongoStore, ExecutionTooLarge, MongoStore, RetryPolicy, SchemaMismatch, StoreUnavailable
from harel_beanie.core.documents import SCHEMA_MARKER_ID, SCHEMA_VERSION
from harel_beanie.core.flows.state import LIVE_MIGRATION_FROM
from harel_beanie.deploy.embedded import EmbeddedServer, free_port

AWKWARD = [
    "a.b",
    "$where",
    "a\uff0eb",
    "a\uff05b",
    "\uff05",
    "日本語.ü",
    "emoji🙂",
    "sp ace",
    "tab\t",
    "nul\x00x",
    "%2E",
]


def raw(client: pymongo.MongoClient[Any], db_name: str, exe_id: str) -> Any:
    return client[db_name]["harel_executions"].find_one({"_id": exe_id})


def test_stale_write_conflicts_and_leaves_the_document_untouched(either, client, db_name):
    either.commit(Execution(id="x", definition_id="d"), [])
    a, b = either.load("x"), either.load("x")
    either.commit(a, [(None, Event(kind="A"))], processed_event_id="ev-a", timers=(TimerOp("schedule", "T", 5.0),))
    before = raw(client, db_name, "x")
    with pytest.raises(StoreConflict) as err:
        either.commit(b, [(None, Event(kind="B"))], processed_event_id="ev-b", timers=(TimerOp("schedule", "U", 1.0),))
    assert (err.value.expected, err.value.found) == (1, 2)
    assert b.version == 1  # the loser's copy is not bumped
    assert raw(client, db_name, "x") == before
    # a second "new" execution with a taken id is a conflict too, and writes nothing
    with pytest.raises(StoreConflict):
        either.commit(Execution(id="x", definition_id="other"), [(None, Event(kind="C"))])
    assert raw(client, db_name, "x") == before


def test_a_purged_execution_is_not_resurrected_by_a_stale_copy(either, client, db_name):
    exe = Execution(id="gone", definition_id="d")
    either.commit(exe, [])
    stale = either.load("gone")
    assert either.purge("gone", 1) is True
    with pytest.raises(StoreConflict) as err:
        either.commit(stale, [])
    # (and the counts' mark: the tombstone is counted at the next fold, core.counting)
    assert err.value.found is None and set(raw(client, db_name, "gone")) == {
        "_id",
        "tomb",
        "part",
        "cdirty",
    }  # only its tombstone
    either.commit(Execution(id="gone", definition_id="d"), [])  # a brand-new one may reuse the id
    assert either.load("gone").version == 1


@pytest.mark.parametrize("exe_id", AWKWARD)
def test_awkward_ids_paths_keys_and_payloads_round_trip(either, exe_id):
    context = {"a.b": 1, "$set": {"x.y": [1, 2.5, None]}, "\uff0e": "fullwidth", "ü": {"$": True}}
    exe = Execution(id=exe_id, definition_id="def.$x", context=context)
    paths = [p for p in AWKWARD if "\x00" not in p] + ["", ".", "Fork.A.B", "$a.$b", "a$b"]
    timers = tuple(TimerOp("schedule", p, 1.0 + i) for i, p in enumerate(paths))
    payload = {"k.ey": "v", "$op": 1, "\uff0e": [exe_id]}
    spawn_ctx = {"$inc": {"a.b": 1}, "\uff05": "pct"}
    either.commit(
        exe,
        [(exe_id, Event(kind="Ping", data=payload))],
        processed_event_id=exe_id + "-ev",
        timers=timers,
        spawns=((exe_id + ":child", "Fork.A", spawn_ctx),),
        trace={"event": "Ping", "context_out": context},
    )
    loaded = either.load(exe_id)
    assert loaded.id == exe_id and loaded.context == context and loaded.definition_id == "def.$x"
    assert either.is_processed(exe_id, exe_id + "-ev") and not either.is_processed(exe_id, exe_id + "-ev2")
    due = [(i, p) for i, p, _ in either.due_timers(1000.0) if i == exe_id]
    assert sorted(due) == sorted((exe_id, p) for p in paths)
    out = [e for e in either.pending_outbox() if e.target_id == exe_id]
    assert [e.event.data for e in out] == [payload]
    spawns = [s for s in either.pending_spawns() if s.parent_id == exe_id]
    assert [(s.child_id, s.root_path, s.context) for s in spawns] == [(exe_id + ":child", "Fork.A", spawn_ctx)]
    assert either.read_trace(exe_id) == [{"event": "Ping", "context_out": context, "index": 0}]
    for _, path, fire_at in either.due_timers(1000.0):
        either.delete_timer(exe_id, path, fire_at)
    assert either.due_timers(1000.0) == []


def test_id_prefix_search_is_literal(either):
    for i in ["a.b1", "a.b2", "axb", "a\uff0eb", "$where", "$wherever", "[a-z]*", "a", "b"]:
        either.save(Execution(id=i, definition_id="d"))
    assert sorted(either.ids_with_prefix("a.")) == ["a.b1", "a.b2"]
    assert sorted(either.ids_with_prefix("$where")) == ["$where", "$wherever"]
    assert either.ids_with_prefix("[a-z]") == ["[a-z]*"]
    assert either.ids_with_prefix(".*") == []
    assert len(either.ids_with_prefix("")) == 9


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.load({"$gt": ""}),
        lambda s: s.is_processed("x", {"$exists": True}),
        lambda s: s.ids_with_prefix({"$ne": None}),
        lambda s: s.purge({"$gt": ""}, 1),
        lambda s: s.purge("x", {"$gt": 0}),
        lambda s: s.ack_outbox({"$gt": 0}),
        lambda s: s.ack_spawn("1"),
        lambda s: s.load_for_event("x", {"$ne": "y"}),
        lambda s: s.delete_timer({"$ne": ""}, "P", 1.0),
    ],
)
def test_operator_injection_is_refused(either, call):
    either.save(Execution(id="x", definition_id="d"))
    with pytest.raises(TypeError):
        call(either)
    assert either.load("x").version == 1


def test_a_foreign_cursor_is_refused(either):
    for bad in ["garbage", "eyJ4IjogMX0=", "eyJhZnRlciI6IDF9"]:  # not b64 json / no "after" / not a str
        with pytest.raises(ValueError, match="cursor"):
            either.list_executions(cursor=bad)


def test_an_execution_too_large_is_refused_whole(either, client, db_name):
    exe = Execution(id="big", definition_id="d", context={"small": 1})
    either.commit(exe, [])
    before = raw(client, db_name, "big")
    exe.context = {"blob": "x" * 17_000_000}
    with pytest.raises(ExecutionTooLarge, match="'big'"):
        either.commit(exe, [])
    assert exe.version == 1 and raw(client, db_name, "big") == before
    # under the limit on its own, but the document would outgrow 16 MB: the server refuses
    exe.context = {"small": 2}
    either.commit(exe, [(None, Event(kind="Big", data={"b": "y" * 8_000_000}))])
    before = raw(client, db_name, "big")
    with pytest.raises(ExecutionTooLarge, match="'big'"):
        either.commit(exe, [(None, Event(kind="Bigger", data={"b": "z" * 9_000_000}))])
    assert exe.version == 2 and raw(client, db_name, "big") == before


def test_dedupe_window_and_trace_ring_stay_bounded(mongo_url, db_name, client):
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name, dedupe_window=3, trace_max=3)
    exe = Execution(id="w", definition_id="d")
    for i in range(6):
        store.commit(exe, [], processed_event_id=f"e{i}", trace={"n": i})
    assert [store.is_processed("w", f"e{i}") for i in range(6)] == [False] * 3 + [True] * 3
    assert store.read_trace("w") == [{"n": i, "index": i} for i in (3, 4, 5)]
    doc = raw(client, db_name, "w")
    assert doc["processed"] == ["e3", "e4", "e5"] and doc["trace_n"] == 6
    store.close()


def test_load_for_event_answers_both_in_one_read(either):
    either.commit(Execution(id="l", definition_id="d"), [], processed_event_id="seen")
    exe, hit = either.load_for_event("l", "seen")
    assert exe.id == "l" and hit is True
    assert either.load_for_event("l", "new")[1] is False
    assert either.load_for_event("nobody", "seen") == (None, False)


def test_seqs_keep_increasing_per_execution_when_a_writer_clock_is_behind(mongo_url, db_name):
    from harel_beanie.core.seqs import SeqMint

    ahead = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    behind = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    behind._state.mint = SeqMint(clock_ms=lambda: 1000)  # a clock years behind
    exe = Execution(id="m", definition_id="d")
    first = ahead.commit(exe, [("t", Event(kind="A"))])
    again = behind.load("m")
    second = behind.commit(again, [("t", Event(kind="B"))])
    assert second[0] > first[0]
    assert [e.event.kind for e in ahead.pending_outbox()] == ["A", "B"]


def test_schema_version_is_checked(mongo_url, db_name, client):
    MongoStore(pymongo.MongoClient(mongo_url), db_name).init()  # a fresh database gets the marker
    counters = client[db_name]["harel_counters"]
    assert counters.find_one({"_id": SCHEMA_MARKER_ID})["n"] == SCHEMA_VERSION
    counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": 99}})
    with pytest.raises(SchemaMismatch, match="newer harel-beanie"):
        MongoStore(pymongo.MongoClient(mongo_url), db_name).load("x")
    counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": 0}})
    with pytest.raises(SchemaMismatch, match="harel-beanie migrate up"):
        MongoStore(pymongo.MongoClient(mongo_url), db_name).load("x")
    # a database older than every layout `migrate up` brings up live: refused before any of
    # this layout's indexes is made
    assert sorted(LIVE_MIGRATION_FROM) == [SCHEMA_VERSION - 2, SCHEMA_VERSION - 1]
    counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": SCHEMA_VERSION - 3}})
    before = {ix["name"] for ix in client[db_name]["harel_executions"].list_indexes()}
    client[db_name]["harel_executions"].drop_indexes()
    with pytest.raises(SchemaMismatch, match="harel-beanie migrate up"):
        MongoStore(pymongo.MongoClient(mongo_url), db_name).load("x")
    assert {ix["name"] for ix in client[db_name]["harel_executions"].list_indexes()} == {"_id_"} < before
    # the layout before partitions is brought up live: it runs, but never through a mongos,
    # where its documents without a partition could not be routed
    counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": SCHEMA_VERSION - 2}})
    assert MongoStore(pymongo.MongoClient(mongo_url), db_name).load("x") is None
    with pytest.raises(SchemaMismatch, match="harel-beanie migrate up"):
        MongoStore(pymongo.MongoClient(mongo_url), db_name, sharded=True).load("x")
    # the layout just before differs by an index only: it runs, through a mongos too
    counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": SCHEMA_VERSION - 1}})
    assert MongoStore(pymongo.MongoClient(mongo_url), db_name).load("x") is None
    assert MongoStore(pymongo.MongoClient(mongo_url), db_name, sharded=True).load("x") is None


def test_a_database_written_by_harels_mongostore_opens_as_it_is(mongo_url, db_name, client):
    from harel.engine.store import MongoStore as HarelMongoStore

    theirs = HarelMongoStore(pymongo.MongoClient(mongo_url), db_name)
    exe = Execution(id="old", definition_id="d", status=Status.RUNNING, context={"k": 1})
    theirs.commit(
        exe, [("peer", Event(kind="Hi"))], processed_event_id="ev0", timers=(TimerOp("schedule", "W.ait", 5.0),)
    )
    ours = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    loaded = ours.load("old")
    assert loaded.context == {"k": 1} and ours.is_processed("old", "ev0")
    assert [(i, p) for i, p, _ in ours.due_timers(10.0)] == [("old", "W.ait")]
    assert [e.event.kind for e in ours.pending_outbox()] == ["Hi"]
    assert [s.id for s in ours.list_executions(status=[Status.RUNNING]).items] == ["old"]
    loaded.context["k"] = 2
    ours.commit(loaded, [], timers=(TimerOp("cancel", "W.ait"),))
    assert ours.load("old").context == {"k": 2} and ours.due_timers(10.0) == []
    assert theirs.load("old").version == 2  # and harel's store still reads it


def test_from_url_reports_an_unreachable_server_with_the_password_masked():
    url = f"mongodb://alice:s3cret@127.0.0.1:{free_port()}/"
    quick = RetryPolicy(attempts=2, delay=0.05, timeout_ms=200)
    with pytest.raises(StoreUnavailable) as err:
        MongoStore.from_url(url, retry=quick)
    assert "alice:***@127.0.0.1" in str(err.value) and "s3cret" not in str(err.value)
    assert "2 attempts" in str(err.value)


async def test_async_from_url_reports_an_unreachable_server_with_the_password_masked():
    url = f"mongodb://alice:s3cret@127.0.0.1:{free_port()}/"
    with pytest.raises(StoreUnavailable) as err:
        await AsyncMongoStore.from_url(url, retry=RetryPolicy(attempts=2, delay=0.05, timeout_ms=200))
    assert "alice:***@127.0.0.1" in str(err.value) and "s3cret" not in str(err.value)


def test_from_url_waits_for_a_server_that_starts_late(tmp_path):
    server = EmbeddedServer(tmp_path / "late")
    starter = threading.Timer(1.5, server.start)
    starter.start()
    try:
        t0 = time.monotonic()
        store = MongoStore.from_url(server.url, "late", retry=RetryPolicy(attempts=60, delay=0.25, timeout_ms=250))
        assert time.monotonic() - t0 >= 1.0  # it really waited (a fact of the test, not a speed claim)
        store.save(Execution(id="e", definition_id="d"))
        assert store.load("e").version == 1
        store.close()
    finally:
        starter.join()
        server.stop()


def test_a_commit_whose_reply_is_lost_is_resolved_by_its_token(mongo_url, db_name, client):
    from pymongo.errors import AutoReconnect

    from harel_beanie.core import calls

    class LosesOneReply(MongoStore):
        lose: list[str] = []

        def _call(self, c: calls.Call) -> Any:
            result = super()._call(c)
            if isinstance(c, (calls.UpdateOne, calls.InsertOne)) and c.target == "executions" and self.lose:
                self.lose.pop()
                raise AutoReconnect("connection closed after the write")  # applied, reply lost
            return result

    store = LosesOneReply(pymongo.MongoClient(mongo_url), db_name)
    exe = Execution(id="lost", definition_id="d")
    store.lose = ["insert"]
    assert store.commit(exe, [("t", Event(kind="A"))]) != [] and exe.version == 1
    store.lose = ["update"]
    seqs = store.commit(exe, [("t", Event(kind="B"))], processed_event_id="ev")
    assert exe.version == 2 and len(seqs) == 1
    doc = raw(client, db_name, "lost")
    assert doc["version"] == 2 and [e["seq"] for e in doc["outbox"]][-1] == seqs[0]
    assert len(doc["outbox"]) == 2 and doc["processed"] == ["ev"]  # nothing doubled
    store.close()


def test_the_timer_sweep_finds_every_armed_timer_through_its_lifecycle(either, client, db_name):
    exe = Execution(id="tl", definition_id="d")
    either.commit(exe, [])  # created with no timer: no bound at all
    assert "next_fire" not in raw(client, db_name, "tl")
    either.commit(exe, [], timers=(TimerOp("schedule", "A", 10.0),))
    assert either.due_timers(10.0) == [("tl", "A", 10.0)]
    either.commit(exe, [], timers=(TimerOp("cancel", "A"), TimerOp("schedule", "B", 30.0)))
    assert either.due_timers(20.0) == []  # A's stale bound is read once and repaired...
    assert raw(client, db_name, "tl")["next_fire"] == 30.0
    either.delete_timer("tl", "B", 30.0)  # ...and the last timer's removal drops the bound
    assert "next_fire" not in raw(client, db_name, "tl")
    either.commit(exe, [], timers=(TimerOp("schedule", "C", 40.0), TimerOp("schedule", "A", 50.0)))
    assert either.due_timers(60.0) == [("tl", "C", 40.0), ("tl", "A", 50.0)]
    either.delete_timer("tl", "C", 39.0)  # a stale sweep's delete leaves the timer alone
    either.delete_timer("tl", "C", 40.0)
    assert raw(client, db_name, "tl")["next_fire"] == 50.0
    # re-arming the same node replaces its time
    either.commit(exe, [], timers=(TimerOp("schedule", "A", 5.0),))
    assert either.due_timers(60.0) == [("tl", "A", 5.0)]


def test_another_prefix_gets_its_own_collections(mongo_url, db_name, client):
    from harel.testing import assert_listing_contract, assert_outbox_contract

    store = MongoStore(pymongo.MongoClient(mongo_url), db_name, prefix="legacy")
    assert_listing_contract(store, ordered=True)
    assert_outbox_contract(store)
    assert client[db_name]["legacy_executions"].count_documents({"tomb": {"$exists": False}}) == 12
    assert "harel_executions" not in client[db_name].list_collection_names()
    store.close()


def test_unmigrated_harel_documents_keep_their_timers_and_trace_order(mongo_url, db_name):
    from harel.engine.store import MongoStore as HarelMongoStore

    theirs = HarelMongoStore(pymongo.MongoClient(mongo_url), db_name)
    exe = Execution(id="h", definition_id="d")
    theirs.commit(exe, [], timers=(TimerOp("schedule", "Old", 1060.0),), trace={"step": "a"})
    theirs.commit(exe, [], trace={"step": "b"})
    ours = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    mine = ours.load("h")
    ours.commit(mine, [], timers=(TimerOp("schedule", "New", 2000.0),), trace={"step": "c"})
    assert ours.due_timers(1100.0) == [("h", "Old", 1060.0)]  # not hidden behind New's bound
    assert [(s["step"], s["index"]) for s in ours.read_trace("h")] == [("a", 0), ("b", 1), ("c", 2)]


def test_pending_work_within_one_execution_tree(either):
    # a tree is its parent_id chain, as harel writes it (tests/reliability/test_reliability_ids.py: any id)
    parents = {"o1": None, "o1:Fork.A:0": "o1", "o1:Fork.A:0:Pick:1": "o1:Fork.A:0", "o10": None, "o2": None}
    for i, parent in parents.items():
        exe = Execution(id=i, definition_id="d", parent_id=parent)
        either.commit(exe, [(None, Event(kind=i))], spawns=((i + ":c", "C", {}),))
    tree = {"o1", "o1:Fork.A:0", "o1:Fork.A:0:Pick:1"}
    assert {e.event.kind for e in either.pending_outbox(within="o1")} == tree
    assert {s.parent_id for s in either.pending_spawns(within="o1")} == tree
    assert {e.event.kind for e in either.pending_outbox(within="o1:Fork.A:0")} == tree - {"o1"}
    assert len(either.pending_outbox()) == 5 and either.pending_spawns(within="nobody") == []
