"""The scale benchmark's store-side measurements: the ExecutionStore operations a worker makes
(load, a state-only commit, load for an event, the relay's reads, an ack, the timer sweep)
on this package's MongoStore and on harel's, and this package's transport's claim with as many
queue documents as executions. Also the timing rule every part of bench/scale/run.py uses: the
median wall time of a few repeats, bounded by a time budget, after one warm-up."""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any, Callable, Optional

import pymongo
from harel.engine.store.mongo import MongoStore as HarelMongoStore
from harel.spec.states import Event

from bench.common.harness import CLONE_KEY_STEP, queue_clone
from bench.scale.seed import BATCH, EXECUTIONS, Cloner
from harel_beanie import MongoStore
from harel_beanie.transport import MongoTransport
from harel_beanie.transport.claim_walk import SERVED_FLOOR

#: store operations measured, in the table's order; "harel" where harel's store has it
STORE_OPS = ("load", "commit", "load_for_event", "relay read", "relay sweep", "ack", "due_timers")
STORE_LABEL = {
    "load": "store: `load`",
    "commit": "store: state-only `commit`",
    "load_for_event": "store: `load_for_event` (harel: `load` + `is_processed`)",
    "relay read": "store: post-commit relay read of one family (harel: of every pending entry)",
    "relay sweep": "store: relay sweep `pending_outbox()`",
    "ack": "store: `ack_outbox` of one entry",
    "due_timers": "store: `due_timers(now)`",
    "claim": "transport: `claim` (then `nack`), one queue document per execution",
}


def median_ms(
    run: Callable[[Any], Any], reps: int, budget: float, prepare: Callable[[int], Any] = lambda i: i
) -> tuple[float, int]:
    """Median ms of `run(prepare(i))` (only `run` timed) over up to `reps` repeats after one
    warm-up; stops early once `budget` seconds are spent, after one timed repeat at least.
    Returns (median, repeats)."""
    t0 = time.perf_counter()
    run(prepare(0))
    if (warm := time.perf_counter() - t0) > budget:
        return 1000 * warm, 1  # one repeat already spent the budget: it is the figure
    times: list[float] = []
    start = time.perf_counter()
    for i in range(1, reps + 1):
        arg = prepare(i)
        t = time.perf_counter()
        run(arg)
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget:
            break
    return 1000 * statistics.median(times), len(times)


class Picks:
    """Ids to measure on, picked from the clones as they were made (so no query has to find
    them): roots of each kind."""

    def __init__(self, cloner: Cloner) -> None:
        self.cloner = cloner

    def of(self, kind: str, i: int) -> str:
        ids = self.cloner.picked[kind]
        return ids[i % len(ids)]


def _store(layout: str, url: str, db: str, timeout: float) -> Any:
    if layout == "harel":  # its scans grow with the database: one may take longer than `timeout`
        return HarelMongoStore(pymongo.MongoClient(url, socketTimeoutMS=int(timeout * 1000)), db)
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    store = MongoStore(client, db, create_schema=False)
    store.init()
    return store


def store_ops(
    layout: str, url: str, db: str, picks: Picks, reps: int, budget: float, timeout: float
) -> dict[str, float]:
    """Median ms of each of STORE_OPS on `layout`'s store over database `db` (NaN: one call of
    harel's store took longer than `timeout` seconds)."""
    store = _store(layout, url, db, timeout)
    ours = layout == "beanie"
    out: dict[str, float] = {}
    now = time.time()

    def for_event(i: int) -> Any:
        eid = picks.of("finished", i)
        if ours:
            return store.load_for_event(eid, uuid.uuid4().hex)
        return store.load(eid), store.is_processed(eid, uuid.uuid4().hex)

    def relay_read(i: int) -> Any:
        if ours:
            owner = picks.of("outbox", i)
            return store.pending_spawns(within=owner), store.pending_outbox(within=owner)
        return store.pending_spawns(), store.pending_outbox()

    ops: dict[str, Callable[[int], Any]] = {
        "load": lambda i: store.load(picks.of("finished", i)),
        "load_for_event": for_event,
        "relay read": relay_read,
        "relay sweep": lambda i: store.pending_outbox(),
        "due_timers": lambda i: store.due_timers(now),
    }
    for op, run in ops.items():
        out[op] = _or_nan(lambda: median_ms(run, reps, budget)[0])
    # a commit of the state just loaded (only the commit timed), and an ack of one pending
    # entry after its owner's relay read, as a relay makes it (only the ack timed)
    out["commit"] = _or_nan(
        lambda: median_ms(lambda exe: store.commit(exe, []), reps, budget, lambda i: store.load(picks.of("timer", i)))[
            0
        ]
    )
    out["ack"] = _or_nan(
        lambda: median_ms(
            lambda seq: seq is None or store.ack_outbox(seq),
            reps,
            budget,
            lambda i: _entry(store, ours, picks.of("outbox", i)),
        )[0]
    )
    store.close()
    return out


def _entry(store: Any, ours: bool, owner: str) -> Optional[int]:
    """The seq of a pending entry of `owner`'s family, read as its relay reads it."""
    entries = store.pending_outbox(within=owner) if ours else store.pending_outbox()
    mine = [e for e in entries if e.target_id.startswith(owner)]
    return mine[0].seq if mine else None


# --- the transport's claim -------------------------------------------------------------------


def seed_queue(url: str, db: str, target: int, say: Callable[[str], None]) -> float:
    """Queue documents up to `target`, one a group: one message published through the
    transport, then cloned under new group ids (and their partitions). Seconds taken."""
    t = time.perf_counter()
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    transport = MongoTransport(client, db)
    transport.init()
    queue = client[db]["harel_hb_queues"]
    queue.drop_indexes()  # built again at the end: several times faster here than inserting into them
    have = queue.estimated_document_count()
    if have == 0:
        transport.publish("q-template", Event(kind="Scan", data={"hub": "HUB-1"}))
        have = 1
    tpl = queue.find_one({})
    assert tpl is not None
    # each clone its own claim key, after the last fresh one (CLONE_KEY_STEP says why)
    last = queue.find_one({"available_at": {"$lt": SERVED_FLOOR}}, sort=[("available_at", -1)])
    at = float((last or tpl)["available_at"])
    batch = []
    while have < target:
        gid = "q" + uuid.uuid4().hex
        head = {**tpl["q"][0], "e": Event(kind="Scan", data={"hub": "HUB-1"}).model_dump_json()}
        at += CLONE_KEY_STEP
        batch.append(queue_clone(tpl, gid, head, at))
        have += 1
        if len(batch) >= BATCH or have >= target:
            queue.insert_many(batch, ordered=False)
            batch = []
    say(f"  queue: {have:,} documents, building the indexes")
    MongoTransport(client, db).init()
    client.close()
    return time.perf_counter() - t


def claim_ms(url: str, db: str, reps: int, budget: float, timeout: float) -> float:
    """Median ms of a claim; each claimed group goes back (nack), so every claim sees the same
    queue. NaN: one claim took longer than `timeout` seconds."""
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url, socketTimeoutMS=int(timeout * 1000))
    transport = MongoTransport(client, db, create_schema=False)

    def once(i: int) -> None:
        lease = transport.claim("bench-scale", 60.0)
        if lease is not None:
            transport.nack(lease)

    try:
        ms = _or_nan(lambda: median_ms(once, reps, budget)[0])
    finally:
        client.close()
    if ms != ms:  # timed out: the server goes on with it, and would slow what is measured next
        waited = server_finished(url, "findAndModify")
        print(f"  a claim timed out after {timeout:g} s; the server finished it {waited:.0f} s later", flush=True)
    return ms


def server_finished(url: str, command: str, limit: float = 3600.0) -> float:
    """Wait until the server runs no `command` any more (a timed-out client's command goes on
    on the server: SecantusDB cannot stop one, and shares one interpreter lock between its
    connections, so every figure taken meanwhile would carry it); seconds waited."""
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < limit:
            ops = client.admin.command("currentOp").get("inprog", [])
            if not any(op.get("active") and command in (op.get("op"), *op.get("command", {})) for op in ops):
                break
            time.sleep(1.0)
        return time.perf_counter() - started
    finally:
        client.close()


def _or_nan(measure: Callable[[], float]) -> float:
    try:
        return measure()
    except pymongo.errors.NetworkTimeout:
        return float("nan")


def count_statuses(url: str, db: str) -> dict[str, int]:
    """The seeded mix, counted once per size (for the report, not timed)."""
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    try:
        rows = client[db][EXECUTIONS].aggregate([{"$group": {"_id": "$status", "n": {"$sum": 1}}}])
        return {str(r["_id"]): int(r["n"]) for r in rows}
    finally:
        client.close()
