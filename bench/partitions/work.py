"""Work per background operation with partitions: what a claim, a post-commit relay read, a
timer sweep and a relay sweep select and cost, owning one partition, owning all of them, and
on a store and transport without partition filtering (how they read before partitions), on
a database with no other pending work and on one with a backlog.

How the database is seeded, fast and with documents this store writes: one Parcel is driven
to DONE through the store by harel's engine, one execution holding pending outbox entries and
a timer is committed through the store, one message is published through the transport; each
is then cloned under new ids with insert_many, every clone given what the store would have
written for its own id (its partition, its id inside `data`, fresh event ids, outbox seqs of
its own from a range the store's mint never reaches, a timer bound equal to its timers).

What "selected" means: the documents the operation's filter selects, counted with
`count_documents` on the very filters the operation sent (recorded on the wire), which are
the keys mongod's index scan examines for a sweep or a relay read (the filters match the
partial indexes' keys). For a claim it is the candidates the claim picks the oldest of: mongod
walks its sorted claim index and stops at the first, so that count bounds its work. This
server's `explain` is synthesised and cannot say what it examined.
"""

from __future__ import annotations

import statistics
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pymongo
from harel.definition.model import Definition
from harel.engine.durable import DurableRunner
from harel.engine.execution import Execution, Status
from harel.engine.store.base import TimerOp
from harel.spec.states import Event
from pymongo import monitoring

from bench.common.harness import CLONE_KEY_STEP, EXECUTIONS, STEPS, queue_clone
from harel_beanie import MongoStore
from harel_beanie.core.names import queue_names
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, Held, PartitionScope, part_of
from harel_beanie.transport import MongoTransport

QUEUES = queue_names("harel")[0]
STATES = ("empty", "backlog")
SCOPES = ("one", "all", "none")
SCOPE_LABEL = {
    "one": f"1 of {DEFAULT_PARTITIONS} owned",
    "all": f"{DEFAULT_PARTITIONS} of {DEFAULT_PARTITIONS} owned",
    "none": "no partitions (before)",
}
OPS = ("claim", "relay read", "timer sweep", "relay sweep")
OP_LABEL = {
    "claim": "claim (transport)",
    "relay read": "post-commit relay read of one family",
    "timer sweep": "timer sweep (`due_timers`)",
    "relay sweep": "relay sweep (`pending_outbox()`)",
}
#: the partition the measured execution lives in, and the one a 1-partition scope owns
OWN_PART = 5
ENTRIES = 5  # outbox entries per pending execution (the measured one and each of the backlog)
DUE, LATER, NOW = 100.0, 1e9, 1000.0  # a backlog timer is due at the sweep's `now`, or far later
FAR = 4e9  # a lease end no run reaches
SEQ_BASE = 1 << 62  # the clones' outbox seqs: above anything the store's mint hands out here


@dataclass
class Sizes:
    stored: int = 20_000  # finished executions
    backlog: int = 10_000  # pending outbox entries, ENTRIES per execution
    queued: int = 10_000  # queued messages, one per group
    reps: int = 15  # timed repetitions per operation (fewer once `budget` seconds are spent)
    budget: float = 3.0


@dataclass
class WorkCell:
    state: str
    scope: str
    op: str
    selected: int  # documents the operation's filters select (count_documents)
    ms: float  # median per operation
    commands: float  # round trips per operation
    reps: int


class Filters(monitoring.CommandListener):
    """The read filters each operation sends (finds and claims), while `on`."""

    def __init__(self) -> None:
        self.on = False
        self.seen: list[tuple[str, dict[str, Any]]] = []
        self.commands = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if not self.on:
            return
        self.commands += 1
        cmd = event.command
        if event.command_name == "find":
            self.seen.append((cmd["find"], dict(cmd.get("filter") or {})))
        elif event.command_name == "findAndModify":
            self.seen.append((cmd["findAndModify"], dict(cmd.get("query") or {})))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


def id_in(part: int, stem: str) -> str:
    """The first id `<stem><n>` in partition `part`."""
    n = 0
    while part_of(f"{stem}{n}", DEFAULT_PARTITIONS) != part:
        n += 1
    return f"{stem}{n}"


def _clone_execution(doc: dict[str, Any], new: str, n: int) -> dict[str, Any]:
    """`doc` as the store would have written it for id `new` (the `n`th clone)."""
    out = {**doc, "_id": new, "data": doc["data"].replace(doc["_id"], new), "part": part_of(new, DEFAULT_PARTITIONS)}
    if doc.get("outbox"):
        out["outbox"] = [
            {**e, "seq": SEQ_BASE + n * ENTRIES + i, "target_id": new, "event": _new_event_id(e["event"])}
            for i, e in enumerate(doc["outbox"])
        ]
        out["seq_hi"] = out["outbox"][-1]["seq"]
    if doc.get("timers"):
        fire = DUE if n % 2 == 0 else LATER  # half of the backlog's timers are due at NOW
        out["timers"] = {k: fire for k in doc["timers"]}
        out["next_fire"] = fire
    return out


def _new_event_id(text: str) -> str:
    event = Event.model_validate_json(text)
    return event.model_copy(update={"id": uuid.uuid4().hex}).model_dump_json()


def _insert(coll: Any, docs: list[dict[str, Any]]) -> None:
    for i in range(0, len(docs), 2_000):
        coll.insert_many(docs[i : i + 2_000], ordered=False)


def seed_stored(url: str, db: str, defs: dict[str, Definition], n: int) -> str:
    """`n` finished Parcels; and the measured execution: pending entries, a due timer, one
    queued message. Returns its id."""
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    store = MongoStore(client, db)
    store.init()
    runner = DurableRunner(store, defs)
    done = runner.create("Parcel")
    for step in STEPS:
        runner.process(done.id, Event(kind=step))
    coll = client[db][EXECUTIONS]
    tpl = coll.find_one({"_id": done.id})
    assert tpl is not None and tpl["status"] == Status.DONE.value, tpl
    _insert(coll, [_clone_execution(tpl, uuid.uuid4().hex, k) for k in range(n - 1)])
    own = id_in(OWN_PART, "own-")
    _pending(store, own, DUE)
    transport = MongoTransport(client, db)
    transport.init()
    transport.publish(own, Event(kind="Pay"))
    client.close()
    return own


def _pending(store: MongoStore, eid: str, fire: float) -> None:
    exe = Execution(id=eid, definition_id="Parcel", status=Status.RUNNING, version=0)
    store.commit(exe, [(eid, Event(kind="Pay")) for _ in range(ENTRIES)], timers=(TimerOp("schedule", "W", fire),))


def seed_backlog(url: str, db: str, entries: int, queued: int) -> None:
    """`entries` pending outbox entries over entries / ENTRIES executions (each with a timer,
    half of them due), and `queued` messages over as many groups."""
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    store = MongoStore(client, db)
    transport = MongoTransport(client, db)
    tpl_id = "template-" + uuid.uuid4().hex
    _pending(store, tpl_id, DUE)
    transport.publish(tpl_id, Event(kind="Pay"))
    execs, queues = client[db][EXECUTIONS], client[db][QUEUES]
    tpl = execs.find_one_and_delete({"_id": tpl_id})
    group = queues.find_one_and_delete({"_id": tpl_id})
    assert tpl is not None and group is not None
    _insert(execs, [_clone_execution(tpl, "b" + uuid.uuid4().hex, k) for k in range(max(1, entries // ENTRIES))])
    clones = []
    for k in range(queued):
        gid = "q" + uuid.uuid4().hex
        head = {**group["q"][0], "e": _new_event_id(group["q"][0]["e"])}
        clones.append(queue_clone(group, gid, head, group["available_at"] + k * CLONE_KEY_STEP))
    _insert(queues, clones)
    client.close()


def scope_of(kind: str) -> PartitionScope:
    if kind == "one":
        return PartitionScope(held={OWN_PART: Held(1, FAR)})
    if kind == "all":
        return PartitionScope(held={p: Held(1, FAR) for p in range(DEFAULT_PARTITIONS)})
    return PartitionScope(held=None)


def _operations(store: MongoStore, transport: MongoTransport, own: str, scoped: bool) -> dict[str, Callable[[], Any]]:
    """Each measured operation, as one call. Before partitions the relay read asked for
    every pending document (`within` was applied after the read): `pending_spawns()`."""

    def relay_read() -> Any:
        if scoped:
            return store.pending_spawns(within=own), store.pending_outbox(within=own)
        return store.pending_spawns(), store.pending_outbox()

    return {
        "claim": lambda: transport.claim("bench", 60.0),
        "relay read": relay_read,
        "timer sweep": lambda: store.due_timers(NOW),
        "relay sweep": lambda: store.pending_outbox(),
    }


def measure_state(url: str, db: str, state: str, own: str, sizes: Sizes, say: Any) -> list[WorkCell]:
    cells = []
    for kind in SCOPES:
        rec = Filters()
        client: pymongo.MongoClient[Any] = pymongo.MongoClient(url, event_listeners=[rec])
        scope = scope_of(kind)
        store = MongoStore(client, db, partitions=scope)
        store.init()
        transport = MongoTransport(client, db, partitions=scope)
        transport.init()
        ops = _operations(store, transport, own, scoped=kind != "none")
        for op in OPS:
            cell = _measure(ops[op], rec, transport, client[db], sizes)
            cell.state, cell.scope, cell.op = state, kind, op
            cells.append(cell)
            say(f"{state:7s} {SCOPE_LABEL[kind]:22s} {op:12s} {cell.selected:6d} selected {cell.ms:8.2f} ms")
        store.close()
        transport.close()
    return cells


def _measure(run: Callable[[], Any], rec: Filters, transport: MongoTransport, database: Any, sizes: Sizes) -> WorkCell:
    def once(timed: list[float]) -> None:
        rec.on = True
        t = time.perf_counter()
        out = run()
        timed.append(time.perf_counter() - t)
        rec.on = False
        if out is not None and hasattr(out, "token"):
            transport.nack(out)  # the claimed group goes back: every claim sees the same queue

    rec.seen.clear()
    once([])  # warm-up; its filters are the ones counted
    filters = list(rec.seen)
    selected = sum(database[coll].count_documents(f) for coll, f in filters)
    rec.commands = 0
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < sizes.reps and (len(times) < 3 or time.perf_counter() - start < sizes.budget):
        once(times)
    return WorkCell("", "", "", selected, 1000 * statistics.median(times), rec.commands / len(times), len(times))


def run_work(url: str, defs: dict[str, Definition], sizes: Sizes, say: Any) -> tuple[list[WorkCell], dict[str, float]]:
    """Both states on one database: measured before the backlog is added, then after."""
    db = "hbbench_parts_" + uuid.uuid4().hex[:6]
    seeding: dict[str, float] = {}
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    try:
        t = time.perf_counter()
        own = seed_stored(url, db, defs, sizes.stored)
        seeding["stored"] = time.perf_counter() - t
        say(f"seeded {sizes.stored} finished executions in {seeding['stored']:.1f}s")
        cells = measure_state(url, db, "empty", own, sizes, say)
        t = time.perf_counter()
        seed_backlog(url, db, sizes.backlog, sizes.queued)
        seeding["backlog"] = time.perf_counter() - t
        say(f"seeded the backlog in {seeding['backlog']:.1f}s")
        cells += measure_state(url, db, "backlog", own, sizes, say)
    finally:
        client.drop_database(db)
        client.close()
    return cells, seeding


def cell(cells: list[WorkCell], state: str, scope: str, op: str) -> Optional[WorkCell]:
    return next((c for c in cells if (c.state, c.scope, c.op) == (state, scope, op)), None)
