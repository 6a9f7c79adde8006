"""Contention: many writers advancing the same executions at once, on the real server.

Every writer loads, mutates and commits; on `StoreConflict` it reloads and tries again with
a fresh attempt tag. Each attempt's tag is unique and goes everywhere the commit writes
(context, emitted event id and payload, processed id, timer path, spawned child id, trace
step), so afterwards the stored documents show exactly which attempts landed. Relays and a
timer sweeper run beside the writers, as workers would. The checks:

- every version of every execution was won exactly once (no duplicate, no gap) and the
  final version is the number of wins;
- the context, the dedupe window, the trace, the outbox, the spawns and the timers hold the
  winners' tags, in version order, and never a loser's;
- outbox and spawn seqs are unique across the database and increase with the version on
  each execution;
- nothing pending is lost: every winner's emit, spawn and timer was either handled by a
  relay/sweeper or is still pending, never both, never neither.

The default run is a short version of each; `make soak` runs the large ones.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

import pymongo
import pytest
from harel.engine.execution import Execution
from harel.engine.store.base import StoreConflict, TimerOp
from harel.spec.states import Event

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.core.counting import COUNTED, COUNTED_SEQ, DIRTY

FIRE_CUTOFF = 50.0  # the sweeper fires timers due by this time; tags decide each fire time


def fire_time(tag: str) -> float:
    return float(random.Random(tag).randrange(100))


@dataclass
class Ledger:
    """What the writers and relays saw, recorded under a lock."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    wins: list[tuple[str, int, str, list[int]]] = field(default_factory=list)  # exe, version, tag, seqs
    losses: list[str] = field(default_factory=list)
    delivered: list[tuple[int, Optional[str], str]] = field(default_factory=list)  # seq, target, tag
    spawned: list[tuple[int, str, str]] = field(default_factory=list)  # seq, parent, child
    fired: list[tuple[str, str, float]] = field(default_factory=list)  # exe, path, fire_at

    def add(self, name: str, item: Any) -> None:
        with self.lock:
            getattr(self, name).append(item)


def attempt_tag(writer: int, win: int, attempt: int) -> str:
    # delimited so that no tag is a substring of another
    return f"<w{writer:03d}.{win:04d}.{attempt:04d}>"


def advance(exe: Execution, tag: str) -> dict[str, Any]:
    """Mutate the loaded execution and return the commit's arguments for attempt `tag`."""
    exe.context["log"] = exe.context.get("log", []) + [tag]
    exe.context["n"] = exe.context.get("n", 0) + 1
    return dict(
        emits=[(exe.id, Event(id="ev" + tag, kind="Tick", data={"tag": tag}))],
        processed_event_id="in" + tag,
        timers=(TimerOp("schedule", "T." + tag, fire_time(tag)),),
        spawns=(("child" + tag, "Fork.R", {"tag": tag}),),
        trace={"tag": tag},
    )


def make_executions(store: MongoStore, ids: list[str]) -> None:
    for i in ids:
        store.commit(Execution(id=i, definition_id="saga", context={"log": [], "n": 0}), [])


def check(client: pymongo.MongoClient[Any], db_name: str, ids: list[str], ledger: Ledger) -> dict[str, int]:
    """Every invariant of the module docstring, from the raw documents and the ledger."""
    coll = client[db_name]["harel_executions"]
    docs = {d["_id"]: d for d in coll.find({"_id": {"$in": ids}})}
    assert set(docs) == set(ids)
    all_seqs: list[int] = []
    loser_tags = set(ledger.losses)
    assert not loser_tags & {t for _, _, t, _ in ledger.wins}, "a tag both won and lost"
    for exe_id in ids:
        doc = docs[exe_id]
        wins = sorted((v, tag, seqs) for e, v, tag, seqs in ledger.wins if e == exe_id)
        versions = [v for v, _, _ in wins]
        # every version won exactly once: no duplicate, no gap, the last is the count
        assert versions == list(range(2, 2 + len(wins))), (exe_id, versions)
        assert doc["version"] == 1 + len(wins)
        tags = [t for _, t, _ in wins]
        data = json.loads(doc["data"])
        assert data["version"] == doc["version"]
        assert data["context"] == {"log": tags, "n": len(tags)}
        assert doc["processed"] == ["in" + t for t in tags]
        assert [json.loads(s["t"])["tag"] for s in doc["trace"]] == tags and doc["trace_n"] == len(tags)
        # the outbox: what a relay took plus what is still pending is exactly the winners'
        returned = [s for _, _, seqs in wins for s in seqs]
        assert all(len(seqs) == 1 for _, _, seqs in wins)
        assert returned == sorted(returned), "seqs must increase with the version"
        delivered = {seq: tag for seq, target, tag in ledger.delivered if target == exe_id}
        pending = {e["seq"]: json.loads(e["event"])["data"]["tag"] for e in doc["outbox"]}
        assert not set(delivered) & set(pending), "an entry both acked and still pending"
        assert {**delivered, **pending} == {s: t for (_, t, seqs) in wins for s in seqs}
        all_seqs += returned
        # spawns: acked or pending, exactly the winners' children
        spawned = {child for _, parent, child in ledger.spawned if parent == exe_id}
        spawn_pending = {s["child_id"] for s in doc["spawns"]}
        assert not spawned & spawn_pending
        assert spawned | spawn_pending == {"child" + t for t in tags}
        all_seqs += [seq for seq, parent, _ in ledger.spawned if parent == exe_id] + [s["seq"] for s in doc["spawns"]]
        # timers: fired (and deleted) or still armed, exactly the winners', never both
        fired = {(p, at) for e, p, at in ledger.fired if e == exe_id}
        from harel_beanie.core.keys import decode_path

        armed = {(decode_path(k), at) for k, at in doc.get("timers", {}).items()}
        assert not fired & armed
        assert fired | armed == {("T." + t, fire_time(t)) for t in tags}
        assert all(at <= FIRE_CUTOFF for _, at in fired)
        if armed:  # the sweep's bound never hides an armed timer
            assert doc["next_fire"] <= min(at for _, at in armed)
        # losers left no trace anywhere in the document
        text = json.dumps(doc, default=str)
        leaked = [t for t in loser_tags if t in text]
        assert not leaked, f"losing attempts left traces in {exe_id}: {leaked[:5]}"
    assert len(all_seqs) == len(set(all_seqs)), "a seq was issued twice"
    delivered_seqs = [seq for seq, _, _ in ledger.delivered]
    assert len(delivered_seqs) == len(set(delivered_seqs)), "an entry was delivered twice with no failure"
    return {
        "executions": len(ids),
        "wins": len(ledger.wins),
        "conflicts": len(ledger.losses),
        "delivered": len(ledger.delivered),
        "spawned": len(ledger.spawned),
        "fired": len(ledger.fired),
    }


# --- sync: threads on MongoStore ------------------------------------------------------------


def sync_writer(store: MongoStore, writer: int, targets: list[str], ledger: Ledger, start: threading.Barrier) -> None:
    start.wait()
    for win, exe_id in enumerate(targets):
        attempt = 0
        while True:
            tag = attempt_tag(writer, win, attempt)
            exe = store.load(exe_id)
            assert exe is not None
            args = advance(exe, tag)
            try:
                seqs = store.commit(exe, **args)
            except StoreConflict:
                ledger.add("losses", tag)
                attempt += 1
                continue
            ledger.add("wins", (exe_id, exe.version, tag, seqs))
            break


def sync_relay(store: MongoStore, ledger: Ledger, stop: threading.Event) -> None:
    """An outbox relay, a spawn relay and a timer sweeper in one loop, until `stop` and one
    final pass after it (so every entry committed before `stop` is seen)."""
    last = False
    while True:
        last = stop.is_set()
        for e in store.pending_outbox():
            store.ack_outbox(e.seq)
            ledger.add("delivered", (e.seq, e.target_id, e.event.data["tag"]))
        for s in store.pending_spawns():
            store.ack_spawn(s.seq)
            ledger.add("spawned", (s.seq, s.parent_id, s.child_id))
        for exe_id, path, at in store.due_timers(FIRE_CUTOFF):
            store.delete_timer(exe_id, path, at)
            ledger.add("fired", (exe_id, path, at))
        if last:
            return
        time.sleep(0.005)


def run_sync(
    mongo_url: str, db_name: str, *, executions: int, instances: int, writers: int, wins: int, relay: bool
) -> tuple[list[str], Ledger]:
    stores = [MongoStore(pymongo.MongoClient(mongo_url), db_name, trace_max=0) for _ in range(instances)]
    ids = [f"exe.{i}" for i in range(executions)]
    make_executions(stores[0], ids)
    rng = random.Random(1234)
    ledger = Ledger()
    start = threading.Barrier(writers)
    threads = [
        threading.Thread(
            target=sync_writer, args=(stores[w % instances], w, [rng.choice(ids) for _ in range(wins)], ledger, start)
        )
        for w in range(writers)
    ]
    stop = threading.Event()
    relay_store = MongoStore(pymongo.MongoClient(mongo_url), db_name, trace_max=0)
    relays = [threading.Thread(target=sync_relay, args=(relay_store, ledger, stop))] if relay else []
    errors: list[BaseException] = []

    def guarded(t: threading.Thread) -> threading.Thread:
        run = t.run

        def wrapped() -> None:
            try:
                run()
            except BaseException as exc:  # reported by the test, not swallowed by the thread
                errors.append(exc)

        t.run = wrapped  # type: ignore[method-assign]
        return t

    for t in threads + relays:
        guarded(t).start()
    for t in threads:
        t.join(timeout=300)
    stop.set()
    for t in relays:
        t.join(timeout=300)
    for s in stores + [relay_store]:
        s.close()
    assert not errors, errors
    return ids, ledger


def test_sync_writers_race_on_shared_executions(mongo_url, db_name, client, figures):
    """12 threads over 3 `MongoStore` instances, 72 wins on 3 executions: every version won
    exactly once (no duplicate, no gap, final version = wins); context, dedupe window,
    trace, outbox, spawns and timers hold the winners' tags in version order and never a
    loser's; seqs unique across the database and increasing with the version; every winner's
    emit, spawn and timer either handled by a relay or still pending, never both, never
    neither."""
    ids, ledger = run_sync(mongo_url, db_name, executions=3, instances=3, writers=12, wins=6, relay=True)
    result = check(client, db_name, ids, ledger)
    assert result["wins"] == 12 * 6
    figures.set(**result)


@pytest.mark.soak
def test_sync_writers_race_on_shared_executions_soak(mongo_url, db_name, client, figures):
    """The sync race at soak size: 32 threads over 4 instances, 800 wins on 5 executions."""
    ids, ledger = run_sync(mongo_url, db_name, executions=5, instances=4, writers=32, wins=25, relay=True)
    result = check(client, db_name, ids, ledger)
    assert result["wins"] == 32 * 25
    figures.set(**result)


# --- async: tasks on AsyncMongoStore --------------------------------------------------------


async def async_writer(
    store: AsyncMongoStore, writer: int, targets: list[str], ledger: Ledger, start: asyncio.Event
) -> None:
    await start.wait()
    for win, exe_id in enumerate(targets):
        attempt = 0
        while True:
            tag = attempt_tag(writer, win, attempt)
            exe = await store.load(exe_id)
            assert exe is not None
            args = advance(exe, tag)
            try:
                seqs = await store.commit(exe, **args)
            except StoreConflict:
                ledger.add("losses", tag)
                attempt += 1
                continue
            ledger.add("wins", (exe_id, exe.version, tag, seqs))
            break


async def async_relay(store: AsyncMongoStore, ledger: Ledger, stop: asyncio.Event) -> None:
    while True:
        last = stop.is_set()
        for e in await store.pending_outbox():
            await store.ack_outbox(e.seq)
            ledger.add("delivered", (e.seq, e.target_id, e.event.data["tag"]))
        for s in await store.pending_spawns():
            await store.ack_spawn(s.seq)
            ledger.add("spawned", (s.seq, s.parent_id, s.child_id))
        for exe_id, path, at in await store.due_timers(FIRE_CUTOFF):
            await store.delete_timer(exe_id, path, at)
            ledger.add("fired", (exe_id, path, at))
        if last:
            return
        await asyncio.sleep(0.005)


async def run_async(
    mongo_url: str, db_name: str, *, executions: int, instances: int, writers: int, wins: int
) -> tuple[list[str], Ledger]:
    stores = [AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name, trace_max=0) for _ in range(instances)]
    ids = [f"exe.{i}" for i in range(executions)]
    for i in ids:
        await stores[0].commit(Execution(id=i, definition_id="saga", context={"log": [], "n": 0}), [])
    rng = random.Random(4321)
    ledger = Ledger()
    start, stop = asyncio.Event(), asyncio.Event()
    relay_store = AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name, trace_max=0)
    tasks = [
        asyncio.create_task(
            async_writer(stores[w % instances], w, [rng.choice(ids) for _ in range(wins)], ledger, start)
        )
        for w in range(writers)
    ]
    relay = asyncio.create_task(async_relay(relay_store, ledger, stop))
    start.set()
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=300)
    finally:
        stop.set()
        await asyncio.wait_for(relay, timeout=300)
        for s in stores + [relay_store]:
            await s.close()
    return ids, ledger


async def test_async_tasks_race_on_shared_executions(mongo_url, db_name, client, figures):
    """The same race with 12 asyncio tasks on 2 `AsyncMongoStore` instances, 72 wins on 3
    executions."""
    ids, ledger = await run_async(mongo_url, db_name, executions=3, instances=2, writers=12, wins=6)
    result = check(client, db_name, ids, ledger)
    assert result["wins"] == 12 * 6
    figures.set(**result)


@pytest.mark.soak
async def test_async_tasks_race_on_shared_executions_soak(mongo_url, db_name, client, figures):
    """The async race at soak size: 32 tasks on 3 instances, 800 wins on 5 executions."""
    ids, ledger = await run_async(mongo_url, db_name, executions=5, instances=3, writers=32, wins=25)
    result = check(client, db_name, ids, ledger)
    assert result["wins"] == 32 * 25
    figures.set(**result)


# --- one saga, many concurrent messages (NServiceBus's high-contention test) --------------


def handle(store: MongoStore, saga: str, message: Event, outcome: Counter[str], lock: threading.Lock) -> None:
    """A message handler as harel's engine runs one: load with the dedupe answer, skip a
    message already handled, else advance and commit; on a conflict reload and try again."""
    while True:
        exe, seen = store.load_for_event(saga, message.id)
        assert exe is not None
        if seen:
            with lock:
                outcome["duplicate"] += 1
            return
        exe.context["got"] = exe.context.get("got", []) + [message.data["n"]]
        try:
            store.commit(
                exe,
                [(None, Event(id="reply-" + message.id, kind="Reply", data={"n": message.data["n"]}))],
                processed_event_id=message.id,
                timers=(TimerOp("schedule", f"Timeout.{message.id}", 1000.0 + message.data["n"]),),
            )
        except StoreConflict:
            with lock:
                outcome["conflict"] += 1
            continue
        with lock:
            outcome["handled"] += 1
        return


def check_saga(client: pymongo.MongoClient[Any], db_name: str, messages: list[Event]) -> None:
    doc = client[db_name]["harel_executions"].find_one({"_id": "saga"})
    ns = sorted(m.data["n"] for m in messages)
    assert doc["version"] == 1 + len(messages)
    assert sorted(json.loads(doc["data"])["context"]["got"]) == ns
    assert sorted(doc["processed"]) == sorted(m.id for m in messages)
    replies = [json.loads(e["event"]) for e in doc["outbox"]]
    assert sorted(r["data"]["n"] for r in replies) == ns  # one reply per message, none doubled
    assert len({e["seq"] for e in doc["outbox"]}) == len(messages)
    assert len(doc["timers"]) == len(messages)


def run_saga_sync(mongo_url: str, db_name: str, messages: int, duplicates: int) -> Counter[str]:
    stores = [MongoStore(pymongo.MongoClient(mongo_url), db_name) for _ in range(4)]
    stores[0].commit(Execution(id="saga", definition_id="saga"), [])
    msgs = [Event(id=f"msg-{i:03d}", kind="Order", data={"n": i}) for i in range(messages)]
    deliveries = msgs + msgs[:duplicates]  # at-least-once: some delivered twice, concurrently
    outcome: Counter[str] = Counter()
    lock = threading.Lock()
    start = threading.Barrier(len(deliveries))
    errors: list[BaseException] = []

    def deliver(i: int, m: Event) -> None:
        try:
            start.wait()
            handle(stores[i % len(stores)], "saga", m, outcome, lock)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=deliver, args=(i, m)) for i, m in enumerate(deliveries)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for s in stores:
        s.close()
    assert not errors, errors
    assert outcome["handled"] == messages and outcome["duplicate"] == duplicates
    return outcome


def test_twenty_concurrent_messages_to_one_saga(mongo_url, db_name, client, figures):
    """NServiceBus's high-contention test: 20 messages to one saga at once, 10 of them
    delivered twice concurrently; each handled exactly once (dedupe by event id), one reply
    each, version 21."""
    outcome = run_saga_sync(mongo_url, db_name, messages=20, duplicates=10)
    check_saga(client, db_name, [Event(id=f"msg-{i:03d}", kind="Order", data={"n": i}) for i in range(20)])
    figures.set(**outcome)


@pytest.mark.soak
def test_many_concurrent_messages_to_one_saga_soak(mongo_url, db_name, client, figures):
    """The saga test at soak size: 200 messages, 100 of them delivered twice, from 300 threads."""
    outcome = run_saga_sync(mongo_url, db_name, messages=200, duplicates=100)
    check_saga(client, db_name, [Event(id=f"msg-{i:03d}", kind="Order", data={"n": i}) for i in range(200)])
    figures.set(**outcome)


async def test_twenty_concurrent_messages_to_one_saga_async(mongo_url, db_name, client, figures):
    """The saga test on `AsyncMongoStore`: 20 messages and 10 concurrent duplicates from
    asyncio tasks on 2 instances; each handled once, one reply each."""
    stores = [AsyncMongoStore(pymongo.AsyncMongoClient(mongo_url), db_name) for _ in range(2)]
    await stores[0].commit(Execution(id="saga", definition_id="saga"), [])
    msgs = [Event(id=f"msg-{i:03d}", kind="Order", data={"n": i}) for i in range(20)]
    outcome: Counter[str] = Counter()

    async def deliver(i: int, m: Event) -> None:
        store = stores[i % 2]
        while True:
            exe, seen = await store.load_for_event("saga", m.id)
            if seen:
                outcome["duplicate"] += 1
                return
            exe.context["got"] = exe.context.get("got", []) + [m.data["n"]]
            try:
                await store.commit(
                    exe,
                    [(None, Event(id="reply-" + m.id, kind="Reply", data={"n": m.data["n"]}))],
                    processed_event_id=m.id,
                    timers=(TimerOp("schedule", f"Timeout.{m.id}", 1000.0 + m.data["n"]),),
                )
            except StoreConflict:
                outcome["conflict"] += 1
                continue
            outcome["handled"] += 1
            return

    await asyncio.gather(*(deliver(i, m) for i, m in enumerate(msgs + msgs[:10])))
    for s in stores:
        await s.close()
    assert outcome["handled"] == 20 and outcome["duplicate"] == 10
    check_saga(client, db_name, msgs)
    figures.set(**outcome)


# --- purge racing a commit ------------------------------------------------------------------


def test_a_purge_racing_a_commit_has_exactly_one_winner(mongo_url, db_name, client, figures):
    """Each round a purge at version 1 and a commit from version 1 race: either the
    execution is gone (with the entries addressed to it) and the commit conflicts with
    `found=None`, or the commit landed whole and the purge touched nothing."""
    purger = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    writer = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    coll = client[db_name]["harel_executions"]
    tally: Counter[str] = Counter()
    for r in range(20):
        victim = f"v{r}"
        writer.commit(Execution(id=victim, definition_id="d"), [])
        peer = Execution(id=f"peer{r}", definition_id="d")
        writer.commit(peer, [(victim, Event(kind="ToVictim")), ("elsewhere", Event(kind="Keep"))])
        copy = writer.load(victim)
        start = threading.Barrier(2)
        result: dict[str, Any] = {}

        def do_purge(victim: str, start: threading.Barrier, result: dict[str, Any]) -> None:
            start.wait()
            result["purged"] = purger.purge(victim, 1)

        def do_commit(copy: Execution, start: threading.Barrier, result: dict[str, Any]) -> None:
            start.wait()
            try:
                writer.commit(copy, [(None, Event(kind="Late"))], processed_event_id="late", spawns=(("kid", "R", {}),))
                result["committed"] = True
            except StoreConflict as err:
                result["committed"] = False
                result["found"] = err.found

        ts = [
            threading.Thread(target=do_purge, args=(victim, start, result)),
            threading.Thread(target=do_commit, args=(copy, start, result)),
        ]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=60)
        doc = coll.find_one({"_id": victim})
        peer_kinds = sorted(json.loads(e["event"])["kind"] for e in coll.find_one({"_id": peer.id})["outbox"])
        if result["purged"]:
            assert result["committed"] is False and result["found"] is None
            # only its tombstone (and the counts' bookkeeping, until the next fold counts it)
            assert set(doc) - {DIRTY, COUNTED, COUNTED_SEQ} == {"_id", "tomb", "part"} and peer_kinds == ["Keep"]
            tally["purge won"] += 1
        else:
            assert result["committed"] is True
            assert doc["version"] == 2 and doc["processed"] == ["late"] and len(doc["spawns"]) == 1
            assert peer_kinds == ["Keep", "ToVictim"]
            tally["commit won"] += 1
    purger.close()
    writer.close()
    assert sum(tally.values()) == 20
    figures.set(**tally)
