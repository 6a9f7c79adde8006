"""The benchmark: harel's own MongoStore / AsyncMongoStore against harel-beanie's, in one run.

    python bench/run.py              # the full run; writes bench/RESULTS.md
    python bench/run.py --quick      # a smoke run at tiny sizes (writes nothing unless --out)

It runs on the embedded server (SecantusDB, started here as a child process) and, when
MONGODB_URL is set (or --url is given), on that server too. For each server:

- the ceiling: bare single-document `update_one` by `_id`, one at a time and 16 in flight,
  measured at the start and at the end of the run;
- events/s through harel's engine for both stores, interleaved (each round alternates which
  store goes first): the sync `DurableRunner`, and `AsyncWorker` at concurrency 1 and 16 over
  harel's `AsyncMongoTransport` (the pure-Mongo stack, built as `harel.worker` builds it);
  each on an empty database and on one already holding --stored finished executions;
- this store also at harel's write concern (w:1, the client default) next to its own default
  (w: majority, j: true), on the empty database: both stores at equal durability;
- what each commit kind costs (create, state-only, traced, with an emit and its ack, with a
  spawn and its ack, arming a timer and deleting it): ms with every index, with none, with
  all but one, and harel's store doing the same; and the index keys each kind writes.

The workload is bench/parcel.stm: five events (Start, then four steps) take an execution from
PENDING to DONE, each one engine step and one commit. Every runner runs twice: as harel builds
it by default, and traced (`trace=True`: the engine writes one trace step per commit, the step
log `harel-beanie status` and dashboards read), because that is where harel's store pays an
extra counter round trip per commit and this one pays none. For a worker, work goes in waves of
max(4, concurrency) executions: a wave is created and its events queued (timed apart, as
"submit"), then the worker drains it (the figure), so the queue is equally short for both stores.
Speed is the embedded server's, a Python server far slower than mongod: compare the two stores
side by side, and each with the ceiling measured in the same run, never across machines.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.metadata
import logging
import math
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pymongo
from harel.definition.model import Definition
from harel.dsl import definition_from_dsl_file
from harel.engine.aio.distributed import AsyncDistributedRunner, AsyncWorker
from harel.engine.aio_store.mongo import AsyncMongoStore as HarelAsyncMongoStore
from harel.engine.aio_transport.mongo import AsyncMongoTransport
from harel.engine.durable import DurableRunner
from harel.engine.execution import Execution, Status
from harel.engine.schema import Names
from harel.engine.store.base import TimerOp
from harel.engine.store.mongo import MongoStore as HarelMongoStore
from harel.spec.states import Event
from pymongo import monitoring
from pymongo.write_concern import WriteConcern

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.core.documents import ExecutionDocument, index_models
from harel_beanie.ops.embedded import EmbeddedServer

HERE = Path(__file__).resolve().parent
MODEL = HERE / "parcel.stm"
STEPS = ("Pay", "Pack", "Ship", "Deliver")
EVENTS_PER_EXECUTION = 1 + len(STEPS)
STORES = ("harel", "beanie")
LABEL = {"harel": "harel MongoStore", "beanie": "harel-beanie"}
BASE_RUNNERS = ("durable", "worker-1", "worker-16")
TRACED = "+trace"  # the same runner with harel's trace on: one trace step per commit
RUNNERS = BASE_RUNNERS + tuple(r + TRACED for r in BASE_RUNNERS)
_BASE_LABEL = {
    "durable": "DurableRunner (sync)",
    "worker-1": "AsyncWorker, concurrency 1",
    "worker-16": "AsyncWorker, concurrency 16",
}
RUNNER_LABEL = {**_BASE_LABEL, **{r + TRACED: label + ", traced" for r, label in _BASE_LABEL.items()}}
# this store with only `_id` (create_schema off): none of its reads index-backed, so no use in
# production, but it shows how much of the gap to harel on this server the indexes account for
BARE = "bare"
BARE_RUNNERS = RUNNERS
# this store with only the indexes its own operations read (the relay's and the timer sweep's
# partial ones), none of the listing and dashboard indexes: what the store would cost here if
# nobody listed executions, between BARE and its full index set
OWN = "own"
OWN_INDEXES = ("hb_pending", "hb_timer_pending")
# this store at harel's write concern (the client default, w:1, no journal wait) instead of its
# own default (w: majority, j: true): both stores at equal durability, in the same rounds
EQUAL = "beanie-w1"
EQUAL_RUNNERS = RUNNERS
# what this store aims for: its events/s on an empty database as a ratio to harel's store's,
# untraced / traced (a trace step adds no round trip to this store's commit)
TARGET = {False: 1.0, True: 1.2}
LABEL[EQUAL] = "harel-beanie at w:1"


def split_runner(runner: str) -> tuple[str, bool]:
    """("worker-16+trace") -> ("worker-16", True)."""
    return runner.removesuffix(TRACED), runner.endswith(TRACED)


STATES = ("empty", "stored")
EXECUTIONS = Names("harel").executions

# what each index declared in documents.py serves (the benchmark measures what it costs)
INDEX_PURPOSE = {
    "hb_definition": "list_executions(definition_id=...) keyset pages; dashboards per model",
    "hb_status": "list_executions(status=...) keyset pages",
    "hb_status_updated": "dashboard queries (harel_beanie.queries: failed since, running but silent); no store operation",
    "hb_parent": "list_executions(roots_only=True); the children of an execution",
    "hb_pending": "a relay pass's one read of pending outbox entries and spawns (documents flagged pending only); acks without an owner hint; purge finds the entries addressed to it",
    "hb_timer_pending": "due_timers reads only documents with a timer due",
}

log = logging.getLogger("bench")


def load_definitions() -> dict[str, Definition]:
    defn = definition_from_dsl_file(MODEL, "Parcel", validate=True)
    return {defn.id: defn}


# --- stores, as harel.worker and this package's from_url build them ------------------------


def _own_indexes(kind: str, url: str, db: str) -> None:
    """For OWN, create the indexes of OWN_INDEXES (the store itself was set up without any)."""
    if kind != OWN:
        return
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    try:
        client[db][EXECUTIONS].create_indexes(
            [ix for ix in index_models(ExecutionDocument) if ix.document["name"] in OWN_INDEXES]
        )
    finally:
        client.close()


def sync_store(kind: str, url: str, db: str) -> Any:
    if kind == "harel":
        return HarelMongoStore.from_url(url, db)
    if kind in (BARE, OWN):
        bare = MongoStore.from_url(url, db, create_schema=False)
        bare.init()
        _own_indexes(kind, url, db)
        return bare
    store = MongoStore.from_url(url, db, **concern(kind))
    store.init()
    return store


def concern(kind: str) -> dict[str, Any]:
    """This store's options for `kind`: its defaults, or harel's write concern (EQUAL)."""
    return {"write_concern": WriteConcern(w=1)} if kind == EQUAL else {}


async def async_store(kind: str, url: str, db: str) -> Any:
    if kind == "harel":
        return await HarelAsyncMongoStore.from_url(url, db)
    if kind in (BARE, OWN):
        bare = await AsyncMongoStore.from_url(url, db, create_schema=False)
        await bare.init()
        _own_indexes(kind, url, db)
        return bare
    store = await AsyncMongoStore.from_url(url, db, **concern(kind))
    await store.init()
    return store


# --- results --------------------------------------------------------------------------------


@dataclass
class Wire:
    """What one timed section sent: commands by side, and the time each side's commands spent
    on the wire (sent until answered, as the driver reports it), by command name."""

    store: int = 0
    transport: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # "store update" -> seconds
    client_cpu: float = 0.0  # CPU seconds of this process (all its threads) inside the sections
    server_cpu: Optional[float] = None  # ... and of the server's process, when it runs here

    def side(self, side: str) -> float:
        return sum(v for k, v in self.seconds.items() if k.startswith(side + " "))


@dataclass
class Cell:
    runner: str
    state: str
    store: str
    events: int
    seconds: float
    submit_events: int = 0  # worker: the create + send calls that queued the work
    submit_seconds: float = 0.0
    round: int = 0
    wire: Wire = field(default_factory=Wire)  # what the timed sections sent

    def per_event(self, calls: int) -> float:
        return calls / self.events if self.events else 0.0

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    @property
    def submit_rate(self) -> float:
        return self.submit_events / self.submit_seconds if self.submit_seconds > 0 else 0.0


@dataclass
class ServerRun:
    name: str
    url: str
    info: dict[str, str] = field(default_factory=dict)
    ceiling: list[tuple[float, float, float]] = field(default_factory=list)  # sequential, 16 in flight, indexed
    cells: list[Cell] = field(default_factory=list)
    index_costs: dict[str, dict[str, float]] = field(default_factory=dict)  # variant -> kind -> ms per op
    keys: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)  # kind -> index -> keys written
    stored: int = 0
    load: list[tuple[float, float, float]] = field(default_factory=list)  # os.getloadavg() at start, end

    def rates(self, runner: str, state: str, store: str) -> list[float]:
        return [c.rate for c in self.cells if (c.runner, c.state, c.store) == (runner, state, store)]

    def rate(self, runner: str, state: str, store: str) -> Optional[float]:
        r = self.rates(runner, state, store)
        return statistics.median(r) if r else None

    def paired(self, runner: str, state: str, store: str = "beanie") -> list[float]:
        """harel-beanie's rate over harel's, round by round: the two cells of a round ran back
        to back, so the machine's drift over the run cancels out of each ratio."""
        out = []
        for r in sorted({c.round for c in self.cells}):
            h = [c.rate for c in self.cells if (c.runner, c.state, c.store, c.round) == (runner, state, "harel", r)]
            b = [c.rate for c in self.cells if (c.runner, c.state, c.store, c.round) == (runner, state, store, r)]
            if h and b and h[0] > 0:
                out.append(b[0] / h[0])
        return out

    def ratio(self, runner: str, state: str, store: str = "beanie") -> Optional[float]:
        r = self.paired(runner, state, store)
        return statistics.median(r) if r else None

    def calls(self, runner: str, state: str, store: str) -> Optional[tuple[float, float]]:
        """Median round trips per event: (to the store, to the transport)."""
        cs = [c for c in self.cells if (c.runner, c.state, c.store) == (runner, state, store) and c.events]
        if not cs:
            return None
        return (
            statistics.median(c.per_event(c.wire.store) for c in cs),
            statistics.median(c.per_event(c.wire.transport) for c in cs),
        )

    def split(self, runner: str, state: str, store: str) -> Optional[dict[str, float]]:
        """Where an event's time went, ms per event (median over rounds of each part): the
        wall time, the store's commands on the wire (and of them its updates), the transport's,
        and the rest, spent in the client (harel's engine, the drivers, the worker's loop). The
        parts add up only where the commands run one at a time (the DurableRunner and
        concurrency 1)."""
        cs = [c for c in self.cells if (c.runner, c.state, c.store) == (runner, state, store) and c.events]
        if not cs:
            return None

        def part(f: Callable[[Cell], float]) -> float:
            return statistics.median(f(c) * 1000 / c.events for c in cs)

        return {
            "wall": part(lambda c: c.seconds),
            "store": part(lambda c: c.wire.side("store")),
            "store update": part(lambda c: c.wire.seconds.get("store update", 0.0)),
            "transport": part(lambda c: c.wire.side("transport")),
            "client": part(lambda c: c.seconds - c.wire.side("store") - c.wire.side("transport")),
            "client cpu": part(lambda c: c.wire.client_cpu),
            # NaN where the server runs elsewhere (its CPU time is not readable from here)
            "server cpu": part(lambda c: c.wire.server_cpu if c.wire.server_cpu is not None else float("nan")),
        }

    def submit(self, runner: str, state: str, store: str) -> Optional[float]:
        r = [
            c.submit_rate
            for c in self.cells
            if (c.runner, c.state, c.store) == (runner, state, store) and c.submit_seconds
        ]
        return statistics.median(r) if r else None


# --- round trips, counted on the wire ----------------------------------------------------------


class Tally(monitoring.CommandListener):
    """Counts and times the commands sent while a timed section runs, by what they address:
    the store's collections (`<prefix>_executions`, `<prefix>_counters`) or the transport's.
    Both stores' clients (PyMongo, PyMongo async, Motor) report here, so the figures compare
    like for like."""

    def __init__(self) -> None:
        self.wire: Optional[Wire] = None
        self.server_pid: Optional[int] = None  # the embedded server's process, to read its CPU time
        self._open: dict[tuple[Any, int], str] = {}  # (connection, request id) -> "side command"
        self._lock = threading.Lock()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        wire = self.wire
        if wire is None:
            return
        target = event.command.get(event.command_name)
        if not isinstance(target, str):
            target = event.command.get("collection")  # getMore names its collection here
        if not isinstance(target, str):
            return
        if "_transport_" in target:  # first: the transport's counters end in _counters too
            side = "transport"
        elif target.endswith(("_executions", "_counters")):
            side = "store"
        else:
            return
        with self._lock:
            setattr(wire, side, getattr(wire, side) + 1)
            self._open[(event.connection_id, event.request_id)] = f"{side} {event.command_name}"

    def _answered(self, event: Any) -> None:
        with self._lock:
            key = self._open.pop((event.connection_id, event.request_id), None)
            wire = self.wire
            if key is not None and wire is not None:
                wire.seconds[key] = wire.seconds.get(key, 0.0) + event.duration_micros / 1e6

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self._answered(event)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._answered(event)

    @contextlib.contextmanager
    def timed(self, wire: Wire) -> Iterator[None]:
        """Count and time into `wire` the commands sent while inside (one section at a time),
        and add the CPU time this process and the server's spent meanwhile."""
        client, server = time.process_time(), _cpu_seconds(self.server_pid)
        self.wire = wire
        try:
            yield
        finally:
            self.wire = None
            wire.client_cpu += time.process_time() - client
            after = _cpu_seconds(self.server_pid)
            if server is not None and after is not None:
                wire.server_cpu = (wire.server_cpu or 0.0) + after - server
            with self._lock:
                self._open.clear()


def _cpu_seconds(pid: Optional[int]) -> Optional[float]:
    """CPU seconds the live threads of process `pid` have run (Linux, nanosecond counters), or
    None. A timed section keeps its connections, so the server's threads serving it live
    through it."""
    if pid is None:
        return None
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
    return total / 1e9


TALLY = Tally()
monitoring.register(TALLY)


# --- the server's ceiling ---------------------------------------------------------------------


def _bare_updates(coll: Any, updates: int) -> float:
    for i in range(min(50, updates)):  # warm-up
        coll.update_one({"_id": i % 64}, {"$inc": {"n": 1}})
    t = time.perf_counter()
    for i in range(updates):
        coll.update_one({"_id": i % 64}, {"$inc": {"n": 1}})
    return updates / (time.perf_counter() - t)


def ceiling(url: str, updates: int) -> tuple[float, float, float]:
    """Bare `update_one` by `_id` per second: one at a time, 16 in flight, and one at a time
    on a collection carrying this store's indexes (the update changes no indexed field: a
    server that only maintains the keys an update changes runs it as fast as the first)."""
    db = "hbbench_ceiling_" + uuid.uuid4().hex[:6]
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    coll = client[db]["docs"]
    coll.insert_many([{"_id": i, "n": 0} for i in range(64)])
    indexed = client[db]["indexed"]
    indexed.create_indexes(index_models(ExecutionDocument))
    indexed.insert_many(
        [{"_id": i, "n": 0, "definition_id": "D", "status": "RUNNING", "parent_id": None} for i in range(64)]
    )
    sequential = _bare_updates(coll, updates)
    with_indexes = _bare_updates(indexed, updates)

    async def parallel() -> float:
        aclient: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(url)
        acoll = aclient[db]["docs"]
        await acoll.update_one({"_id": 0}, {"$inc": {"n": 1}})
        per = max(1, updates // 16)

        async def one(k: int) -> None:
            for i in range(per):
                await acoll.update_one({"_id": k}, {"$inc": {"n": 1}})

        t = time.perf_counter()
        await asyncio.gather(*(one(k) for k in range(16)))
        rate = per * 16 / (time.perf_counter() - t)
        await aclient.close()
        return rate

    in_flight = asyncio.run(parallel())
    client.drop_database(db)
    client.close()
    return sequential, in_flight, with_indexes


# --- a database in use: finished executions, shaped as each store writes them ----------------


def finished_template(kind: str, url: str, defs: dict[str, Definition]) -> dict[str, Any]:
    """The document `kind`'s store leaves for a finished Parcel, written by harel's engine."""
    db = "hbbench_tpl_" + uuid.uuid4().hex[:6]
    store = sync_store(kind, url, db)
    runner = DurableRunner(store, defs)
    exe = runner.create("Parcel")
    for step in STEPS:
        runner.process(exe.id, Event(kind=step))
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    doc = client[db][EXECUTIONS].find_one({"_id": exe.id})
    assert doc is not None and Execution.model_validate_json(doc["data"]).status is Status.DONE
    client.drop_database(db)
    client.close()
    store.close()
    return doc


def seed(kind: str, url: str, db: str, n: int, template: dict[str, Any]) -> float:
    """`n` copies of a finished execution under new ids; the store's own set-up first (for
    this package: its indexes), then insert_many. Returns the seconds it took."""
    t = time.perf_counter()
    store = sync_store(kind, url, db)
    old = template["_id"]
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    coll = client[db][EXECUTIONS]
    batch = []
    for _ in range(n):
        new = uuid.uuid4().hex
        batch.append({**template, "_id": new, "data": template["data"].replace(old, new)})
        if len(batch) == 2_000:
            coll.insert_many(batch, ordered=False)
            batch = []
    if batch:
        coll.insert_many(batch, ordered=False)
    assert coll.count_documents({}) == n
    client.close()
    store.close()
    return time.perf_counter() - t


# --- the measurements -------------------------------------------------------------------------


def measure_durable(
    kind: str, url: str, db: str, defs: dict[str, Definition], cap: int, budget: float, trace: bool
) -> tuple[Cell, list[str]]:
    """Create and drive Parcels with the sync DurableRunner until `cap` events or `budget`
    seconds; one execution first, untimed, as warm-up."""
    store = sync_store(kind, url, db)
    runner = DurableRunner(store, defs, trace=trace)
    ids = []
    warm = runner.create("Parcel")
    ids.append(warm.id)
    for step in STEPS:
        runner.process(warm.id, Event(kind=step))
    events = 0
    wire = Wire()
    with TALLY.timed(wire):
        t = time.perf_counter()
        while events < cap and time.perf_counter() - t < budget:
            exe = runner.create("Parcel")
            ids.append(exe.id)
            events += 1
            for step in STEPS:
                if events >= cap or time.perf_counter() - t >= budget:
                    break
                runner.process(exe.id, Event(kind=step))
                events += 1
        seconds = time.perf_counter() - t
    last = store.load(ids[-1])
    assert last is not None and (last.status is Status.DONE or events % EVENTS_PER_EXECUTION), last
    store.close()
    return Cell("durable", "", kind, events, seconds, wire=wire), ids


class CountingTransport:
    """harel's transport, counting acks (a handled message is acked) to tell when the
    queued work is done; everything else is passed through."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.acks = 0
        self._target: Optional[int] = None
        self._done: Optional[asyncio.Event] = None
        self.done_at = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def until(self, acks: int, done: asyncio.Event) -> None:
        self._target, self._done = acks, done
        if self.acks >= acks:
            done.set()

    async def publish(self, group_id: str, event: Event, priority: int = 0) -> None:
        await self._inner.publish(group_id, event, priority=priority)

    async def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Any:
        return await self._inner.claim(worker_id, visibility, min_priority)

    async def ack(self, lease: Any) -> None:
        await self._inner.ack(lease)
        self.acks += 1
        if (
            self._target is not None
            and self._done is not None
            and self.acks >= self._target
            and not self._done.is_set()
        ):
            self.done_at = time.perf_counter()
            self._done.set()

    async def nack(self, lease: Any, delay: float = 0.0) -> None:
        await self._inner.nack(lease, delay)

    async def close(self) -> None:
        await self._inner.close()


async def _drain(
    store: Any,
    transport: CountingTransport,
    defs: dict[str, Definition],
    concurrency: int,
    acks: int,
    budget: float,
    trace: bool,
) -> tuple[int, float]:
    """Run an AsyncWorker until `acks` more messages are handled or `budget` seconds pass."""
    stop = asyncio.Event()
    base = transport.acks
    worker = AsyncWorker(
        store, transport, defs, worker_id="bench", visibility=60.0, concurrency=concurrency, trace=trace
    )
    t = time.perf_counter()
    transport.until(base + acks, stop)
    task = asyncio.create_task(worker.run(stop, idle_sleep=0.002))
    try:
        await asyncio.wait_for(stop.wait(), timeout=budget)
        end = transport.done_at
    except asyncio.TimeoutError:
        end = time.perf_counter()
        stop.set()
    await task
    return transport.acks - base, end - t


async def _measure_worker(
    kind: str, url: str, db: str, defs: dict[str, Definition], concurrency: int, cap: int, budget: float, trace: bool
) -> tuple[Cell, list[str]]:
    store = await async_store(kind, url, db)
    prefix = "hbq" + uuid.uuid4().hex[:8]  # a queue of its own: nothing left over from another cell
    inner = await AsyncMongoTransport.from_url(url, db, prefix=prefix)
    transport = CountingTransport(inner)
    runner = AsyncDistributedRunner(store, transport, defs, trace=trace)
    ids: list[str] = []
    # warm-up, untimed: one execution through the whole path
    warm = await runner.create("Parcel")
    ids.append(warm.id)
    for step in STEPS:
        await runner.send(warm.id, Event(kind=step))
    await _drain(store, transport, defs, concurrency, EVENTS_PER_EXECUTION, max(budget, 30.0), trace)

    # in waves, so the queue stays as short for one store as for the other: submit a wave
    # (create the executions, each queueing its Start, and queue their four events; timed
    # apart), then let the worker drain it (the figure). A wave holds max(4, concurrency)
    # executions, enough to keep every slot of the worker busy.
    wave = max(4, concurrency)
    handled = submitted = 0
    drain_seconds = submit_seconds = 0.0
    wire = Wire()
    mine: list[str] = []
    while handled < cap and drain_seconds + submit_seconds < budget:
        n = min(wave, -(-(cap - handled) // EVENTS_PER_EXECUTION))
        t = time.perf_counter()
        batch = [(await runner.create("Parcel")).id for _ in range(n)]
        for eid in batch:
            for step in STEPS:
                await runner.send(eid, Event(kind=step))
        submit_seconds += time.perf_counter() - t
        submitted += EVENTS_PER_EXECUTION * n
        mine += batch
        ids += batch
        with TALLY.timed(wire):
            got, seconds = await _drain(store, transport, defs, concurrency, EVENTS_PER_EXECUTION * n, budget, trace)
        handled += got
        drain_seconds += seconds
        if got < EVENTS_PER_EXECUTION * n:
            break  # out of time inside a drain
    if handled == submitted:
        last = await store.load(mine[-1])
        assert last is not None and last.status is Status.DONE, last
    await store.close()
    await transport.close()
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    names = Names(prefix)
    for coll in (names.messages, names.transport_locks, names.transport_counters):
        client[db].drop_collection(coll)
    client.close()
    runner_name = f"worker-{concurrency}" + (TRACED if trace else "")
    cell = Cell(runner_name, "", kind, handled, drain_seconds, submit_events=submitted, submit_seconds=submit_seconds,
                wire=wire)  # fmt: skip
    return cell, ids


def measure(kind: str, runner: str, url: str, db: str, defs: dict[str, Definition], cap: int, budget: float) -> Cell:
    base, trace = split_runner(runner)
    if base == "durable":
        cell, ids = measure_durable(kind, url, db, defs, cap, budget, trace)
        cell.runner = runner
    else:
        cell, ids = asyncio.run(_measure_worker(kind, url, db, defs, int(base.split("-")[1]), cap, budget, trace))
    # leave the database as it was: drop the executions this cell created
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    client[db][EXECUTIONS].delete_many({"_id": {"$in": ids}})
    client.close()
    return cell


# --- what each index costs a commit ---------------------------------------------------------


#: the commit kinds the per-commit table measures, and what each operation does
COMMIT_KINDS = {
    "create": "the first commit of a new execution (an insert)",
    "state": "a state-only commit (what an event costs)",
    "trace": "a state-only commit with a trace step",
    "emit": "a commit with one emit, then its ack",
    "spawn": "a commit with one spawn, then its ack",
    "timer": "a commit arming a timer, then the timer's delete",
}


class _Variant:
    """A store on a collection holding exactly `indexes` (plus `_id`), with one running
    execution whose dedupe window is already full, so every block measures the same work."""

    WINDOW = 100  # a short window, filled in the warm-up: array sizes stay constant

    def __init__(self, url: str, indexes: list[Any], harel: bool = False) -> None:
        self.db = "hbbench_ix_" + uuid.uuid4().hex[:6]
        self.client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
        self.coll = self.client[self.db][EXECUTIONS]
        if indexes:
            self.coll.create_indexes(indexes)
        self.store: Any
        if harel:  # the reference: harel's own store (its dedupe set is not a window: it grows)
            self.store = HarelMongoStore(pymongo.MongoClient(url), self.db)
        else:
            self.store = MongoStore(pymongo.MongoClient(url), self.db, create_schema=False, dedupe_window=self.WINDOW)
            self.store.init()
        self.made: list[str] = []  # executions the "create" operations made
        self.exe = Execution(definition_id="Parcel", status=Status.RUNNING, active_path="Ordered")
        self.store.commit(self.exe, [])
        for _ in range(self.WINDOW + 10):
            self.store.commit(self.exe, [], processed_event_id=uuid.uuid4().hex)

    def op(self, kind: str, record: Optional[Callable[[], None]] = None) -> None:
        """One operation of `kind`; `record()` is called after each write it makes (the
        per-commit table reads the document there to count index keys)."""
        note = record or (lambda: None)
        exe, store = self.exe, self.store
        exe.updated_at = time.time()  # as harel's engine stamps every commit
        if kind == "create":
            fresh = Execution(definition_id="Parcel", status=Status.PENDING, active_path="Ordered")
            store.commit(fresh, [], processed_event_id=uuid.uuid4().hex)
            self.created = fresh.id
            self.made.append(fresh.id)
            note()
        elif kind in ("state", "trace"):
            trace = {"cause": "event", "event_kind": "Pay", "to_path": "Paid"} if kind == "trace" else None
            store.commit(exe, [], processed_event_id=uuid.uuid4().hex, trace=trace)
            note()
        elif kind == "emit":
            seqs = store.commit(exe, [(exe.id, Event(kind="Pay"))], processed_event_id=uuid.uuid4().hex)
            note()
            store.ack_outbox(seqs[0])
            note()
        elif kind == "spawn":
            child = f"{exe.id}:Fork.A:{uuid.uuid4().hex[:6]}"
            store.commit(exe, [], processed_event_id=uuid.uuid4().hex, spawns=((child, "Fork.A", {"n": 1}),))
            note()
            [entry] = [e for e in store.pending_spawns() if e.child_id == child]
            store.ack_spawn(entry.seq)
            note()
        elif kind == "timer":
            at = time.time() + 3600.0
            store.commit(exe, [], processed_event_id=uuid.uuid4().hex, timers=(TimerOp("schedule", "Ordered", at),))
            note()
            store.delete_timer(exe.id, "Ordered", at)
            note()
        else:
            raise ValueError(kind)

    def block(self, commits: int) -> dict[str, float]:
        """ms per operation of each kind."""
        out = {}
        for kind in COMMIT_KINDS:
            n = commits if kind in ("state", "trace", "create") else max(1, commits // 2)
            t = time.perf_counter()
            for _ in range(n):
                self.op(kind)
            out[kind] = (time.perf_counter() - t) / n * 1000
            if self.made:  # untimed: the collection keeps one execution for every block
                self.coll.delete_many({"_id": {"$in": self.made}})
                self.made.clear()
        return out

    def close(self) -> None:
        self.store.close()
        self.client.drop_database(self.db)
        self.client.close()


def index_costs(url: str, commits: int, blocks: int) -> dict[str, dict[str, float]]:
    """Per variant (every index, none, all but one), ms per operation of each commit kind; and
    per index, what it adds: the median over blocks of (all - all but it), the two measured
    back to back in the same block (the order turning each block), so drift and the
    machine's other load cancel."""
    declared = index_models(ExecutionDocument)
    names = [ix.document["name"] for ix in declared]
    variants = {"all": _Variant(url, declared), "none": _Variant(url, []), "harel": _Variant(url, [], harel=True)}
    for name in names:
        variants[f"-{name}"] = _Variant(url, [ix for ix in declared if ix.document["name"] != name])
    keys = list(variants)
    per: dict[str, list[dict[str, float]]] = {k: [] for k in keys}
    try:
        for b in range(blocks):
            order = keys[b % len(keys) :] + keys[: b % len(keys)]
            if b % 2:
                order.reverse()
            for k in order:
                per[k].append(variants[k].block(commits))
    finally:
        for v in variants.values():
            v.close()
    out: dict[str, dict[str, float]] = {}
    for k in keys:
        out[k] = {kind: statistics.median(x[kind] for x in per[k]) for kind in COMMIT_KINDS}
    for k in keys:
        if k.startswith("-"):
            out["cost" + k] = {
                kind: statistics.median(a[kind] - m[kind] for a, m in zip(per["all"], per[k])) for kind in COMMIT_KINDS
            }
    out["cost_all"] = {
        kind: statistics.median(a[kind] - m[kind] for a, m in zip(per["all"], per["none"])) for kind in COMMIT_KINDS
    }
    return out


# --- index keys each commit kind writes ---------------------------------------------------------


def _path_values(doc: Any, path: str) -> list[Any]:
    """The values an index key on `path` takes in `doc` (arrays fan out; an empty array is
    one key, a missing field one null key), as MongoDB indexes them."""
    head, _, rest = path.partition(".")
    value = doc.get(head, None) if isinstance(doc, dict) else None
    if isinstance(value, list):
        if not value:
            return ["<empty>"]
        return [v for item in value for v in (_path_values(item, rest) if rest else [item])]
    if rest:
        return _path_values(value, rest) if isinstance(value, dict) else [None]
    return [value]


def _partial_match(doc: dict[str, Any], pfe: dict[str, Any]) -> bool:
    """The partial filters this store declares: an equality, or a `$gte` bound."""
    for path, cond in pfe.items():
        values = [v for v in _path_values(doc, path) if v not in (None, "<empty>")]
        if isinstance(cond, dict):
            low = cond["$gte"]
            if not any(isinstance(v, (int, float)) and v >= low for v in values):
                return False
        elif cond not in values:
            return False
    return True


def index_keys(doc: Optional[dict[str, Any]], ix: Any) -> set[tuple[Any, ...]]:
    """The keys `doc` holds in index `ix` (an IndexModel)."""
    if doc is None:
        return set()
    spec = ix.document
    pfe = spec.get("partialFilterExpression")
    if pfe and not _partial_match(doc, pfe):
        return set()
    fields = list(dict(spec["key"]))
    if spec.get("sparse") and all(doc.get(f.split(".")[0]) is None for f in fields):
        return set()
    keys: list[tuple[Any, ...]] = [()]
    for f in fields:
        keys = [k + (repr(v),) for k in keys for v in _path_values(doc, f)]
    return set(keys)


def keys_written(url: str) -> dict[str, dict[str, tuple[int, int]]]:
    """For each commit kind and each declared index: (keys a server that rewrites every
    entry of a changed document writes - SecantusDB: every old entry removed, every new one
    added; keys a server that writes only what changed writes - mongod), summed over the
    kind's writes, read from the documents as the store left them after each write."""
    declared = index_models(ExecutionDocument)
    v = _Variant(url, declared)
    out: dict[str, dict[str, tuple[int, int]]] = {}
    try:
        for kind in COMMIT_KINDS:
            docs: list[Optional[dict[str, Any]]] = []
            target = [v.exe.id]

            def record() -> None:
                docs.append(v.coll.find_one({"_id": getattr(v, "created", None) if kind == "create" else target[0]}))

            before = None if kind == "create" else v.coll.find_one({"_id": v.exe.id})
            v.op(kind, record)
            out[kind] = {}
            for ix in declared:
                every = changed = 0
                prev = before
                for doc in docs:
                    old, new = index_keys(prev, ix), index_keys(doc, ix)
                    every += len(old) + len(new)
                    changed += len(old ^ new)
                    prev = doc
                out[kind][ix.document["name"]] = (every, changed)
    finally:
        v.close()
    return out


# --- server and machine ---------------------------------------------------------------------


def server_info(name: str, url: str) -> dict[str, str]:
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    build = client.admin.command("buildInfo")
    hello = client.admin.command("hello")
    client.close()
    info = {"reports": f"MongoDB {build.get('version', '?')}"}
    if name == "embedded":
        try:
            info["server"] = f"SecantusDB {importlib.metadata.version('secantusdb')} (embedded, child process)"
        except importlib.metadata.PackageNotFoundError:
            info["server"] = "SecantusDB (embedded, child process)"
    else:
        info["server"] = f"MongoDB {build.get('version', '?')} (MONGODB_URL)"
    info["topology"] = "replica set " + hello["setName"] if hello.get("setName") else "standalone"
    return info


def machine() -> dict[str, str]:
    model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {p: importlib.metadata.version(p) for p in ("harel", "pymongo", "motor", "beanie")}
    return {
        "cpus": str(os.cpu_count()),
        "cpu": model,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        **versions,
    }


# --- the run ----------------------------------------------------------------------------------


@dataclass
class Options:
    events: int
    seconds: float
    stored: int
    rounds: int
    ceiling_updates: int
    index_commits: int
    index_blocks: int
    quick: bool


def run_server(name: str, url: str, opts: Options, defs: dict[str, Definition]) -> ServerRun:
    run = ServerRun(name, url, info=server_info(name, url), stored=opts.stored)
    say = lambda msg: print(f"[{name}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    tag = uuid.uuid4().hex[:6]
    run.load.append(os.getloadavg())
    say(f"{run.info['server']}; ceiling ...")
    run.ceiling.append(ceiling(url, opts.ceiling_updates))
    say(
        f"ceiling {run.ceiling[-1][0]:.0f} updates/s sequential, {run.ceiling[-1][1]:.0f} with 16 in flight, "
        f"{run.ceiling[-1][2]:.0f} on an indexed collection"
    )
    stored_db = {}
    for kind in STORES:
        stored_db[kind] = f"hbbench_{tag}_{kind}_stored"
        seconds = seed(kind, url, stored_db[kind], opts.stored, finished_template(kind, url, defs))
        say(f"seeded {opts.stored} finished executions for {kind} in {seconds:.1f}s")
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    try:
        for r in range(opts.rounds):
            for state in STATES:
                for runner in RUNNERS:
                    kinds = STORES + ((BARE, OWN) if state == "empty" and runner in BARE_RUNNERS else ())
                    kinds += (EQUAL,) if state == "empty" and runner in EQUAL_RUNNERS else ()
                    order = kinds if r % 2 == 0 else tuple(reversed(kinds))
                    for kind in order:
                        db = (
                            stored_db[kind]
                            if state == "stored"
                            else f"hbbench_{tag}_{kind}_empty_{uuid.uuid4().hex[:4]}"
                        )
                        cell = measure(kind, runner, url, db, defs, opts.events, opts.seconds)
                        cell.state, cell.round = state, r
                        run.cells.append(cell)
                        if state == "empty":
                            client.drop_database(db)
                        say(
                            f"round {r + 1} {runner:9s} {state:6s} {kind:6s} {cell.rate:8.1f} events/s ({cell.events} in {cell.seconds:.1f}s)"
                        )
        run.ceiling.append(ceiling(url, opts.ceiling_updates))
        run.load.append(os.getloadavg())
        say(f"ceiling again {run.ceiling[-1][0]:.0f} / {run.ceiling[-1][1]:.0f}")
        if opts.index_commits:
            say("index costs ...")
            run.index_costs = index_costs(url, opts.index_commits, opts.index_blocks)
            run.keys = keys_written(url)
    finally:
        for db in stored_db.values():
            client.drop_database(db)
        client.close()
    return run


# --- the report -------------------------------------------------------------------------------


def _f(x: Optional[float], digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _x(ratio: Optional[float]) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _pct(a: Optional[float], b: Optional[float]) -> str:
    return "-" if a is None or b is None or b == 0 else f"{100 * a / b:.1f}%"


def reading(run: ServerRun) -> list[str]:
    """What explains the ratios, in this run's own numbers."""
    out = []
    seq = statistics.mean(c[0] for c in run.ceiling)
    indexed = statistics.mean(c[2] for c in run.ceiling)
    out.append(
        f"- The server's cost model. A bare update by `_id` runs at {seq:,.0f}/s on a collection with only `_id`, "
        f"and at {indexed:,.0f}/s on one carrying this store's {len(index_models(ExecutionDocument))} indexes, "
        "although it changes no indexed field. "
        + ("This server maintains and plans over every secondary index on every write (mongod only rewrites "
           "the keys that change), so each index this store declares is paid on every commit, insert and ack "
           "here, whatever the commit changes. harel's store has no secondary index to pay for."
           if run.name == "embedded" else "")
    )  # fmt: skip
    bare = [(r, run.ratio(r, "empty", BARE), run.ratio(r, "empty")) for r in RUNNERS]
    bare = [(r, z, x) for r, z, x in bare if z is not None and x is not None]
    if bare:
        out.append(
            "- The indexes' share. With only `_id`, against harel's on an empty database (with its indexes in "
            "brackets): "
            + "; ".join(f"{RUNNER_LABEL[r]} {z:.2f}x ({x:.2f}x)" for r, z, x in bare)
            + ". With only the two indexes its own operations read: "
            + "; ".join(f"{RUNNER_LABEL[r]} {_x(run.ratio(r, 'empty', OWN))}" for r, _, _ in bare)
            + ". Where a runner reaches its target only with fewer indexes, the index set (the tables at the end) "
            "is what this server makes every write pay; the listing and dashboard indexes are needed by the "
            "reads this store promises, so they stay."
        )
    hp, bp = run.calls("durable", "empty", "harel"), run.calls("durable", "empty", "beanie")
    ht, bt = run.calls("durable" + TRACED, "empty", "harel"), run.calls("durable" + TRACED, "empty", "beanie")
    if hp and bp and ht and bt:
        out.append(
            f"- Round trips. With the DurableRunner, {hp[0]:.1f} per event on harel's store and {bp[0]:.1f} on this "
            f"one untraced, {ht[0]:.1f} and {bt[0]:.1f} traced: this store answers a relay pass (pending spawns, then "
            "pending outbox entries) with one read where harel's makes two, and takes no counter round trip for a "
            "trace step."
        )
    if run.index_costs:
        h, a, n = run.index_costs["harel"], run.index_costs["all"], run.index_costs["none"]
        out.append(
            f"- The commit. A state-only commit costs {h['state']:.2f} ms on harel's store, {a['state']:.2f} ms on this "
            f"one with its {len(index_models(ExecutionDocument))} indexes and {n['state']:.2f} ms with only `_id` (the "
            "table at the end): the indexes the listing and dashboard reads need are what a commit pays here."
        )
    w = run.calls("worker-1", "empty", "harel")
    if w is not None:
        out.append(
            f"- Workers. An AsyncWorker event also makes about {w[1]:.1f} round trips to harel's Mongo transport "
            f"(claim, lock, read, ack), the same for both stores, against {w[0]:.1f} to the store: the transport "
            "sets the pace, so a cheaper store moves the worker figures less than the DurableRunner's."
        )
    for runner in ("worker-1", "worker-1" + TRACED):
        sh, sz, sb = (run.split(runner, "empty", k) for k in ("harel", BARE, "beanie"))
        if sh is None or sb is None:
            continue
        d = {k: sb[k] - sh[k] for k in sb}
        text = (
            f"- Where the {RUNNER_LABEL[runner]}'s time goes (the time table above). An event takes "
            f"{sb['wall']:.2f} ms on this store against {sh['wall']:.2f} ms on harel's ({d['wall']:+.2f}): its "
            f"commits {d['store update']:+.2f} ms, the store's other commands {d['store'] - d['store update']:+.2f}, "
            f"the transport's commands {d['transport']:+.2f} and the client's own work {d['client']:+.2f}. The "
            "commits' difference alone would make the ratio "
            f"{sh['wall'] / (sh['wall'] + d['store update']):.2f}x; measured, {_x(run.ratio(runner, 'empty'))}."
        )
        if sz is not None:
            text += (
                f" With only `_id` the commits take {sz['store update'] - sh['store update']:+.2f} ms against "
                f"harel's, so the index set is {sb['store update'] - sz['store update']:.2f} ms of each event's "
                "commit."
            )
        if sz is not None and not any(math.isnan(x["server cpu"]) for x in (sh, sz, sb)):
            text += (
                f" The server's CPU per event: {sh['server cpu']:.2f} ms for harel's store, "
                f"{sz['server cpu']:.2f} ms for this one with only `_id` and {sb['server cpu']:.2f} ms with its "
                f"indexes: the index set adds {sb['server cpu'] - sz['server cpu']:.2f} ms, and with the commands "
                "going one at a time, the server's work is on each event's path."
            )
        out.append(text)
    for runner in ("worker-16", "worker-16" + TRACED):
        sh, sz, sb = (run.split(runner, "empty", k) for k in ("harel", BARE, "beanie"))
        if sh is None or sz is None or sb is None or any(math.isnan(x["server cpu"]) for x in (sh, sz, sb)):
            continue
        cpu = {k: x["client cpu"] + x["server cpu"] for k, x in (("harel", sh), (BARE, sz), ("beanie", sb))}
        out.append(
            f"- The {RUNNER_LABEL[runner]}: the commands overlap, and the client and the server share this "
            f"machine's {os.cpu_count()} CPUs. Their CPU per event, client + server: {cpu['harel']:.2f} ms for "
            f"harel's store, {cpu[BARE]:.2f} ms for this one with only `_id` and {cpu['beanie']:.2f} ms with its "
            f"indexes (the server's part {sh['server cpu']:.2f}, {sz['server cpu']:.2f} and "
            f"{sb['server cpu']:.2f} ms). Were the CPUs the bound, the ratio would be "
            f"{cpu['harel'] / cpu['beanie']:.2f}x; measured, {_x(run.ratio(runner, 'empty'))}."
        )
    out.append(
        "- A database in use. harel's store answers the relay's reads (pending outbox entries and spawns) by "
        "reading every execution document, and the DurableRunner relays after every event, so its rate falls "
        f"with the {run.stored:,} stored. This store's reads follow pending work through its indexes, and its "
        "rate holds (the *stored / empty* column)."
    )
    out.append(
        "- What was tried for a runner below its target, each lever measured, and what bounds it: "
        "[LEVERS.md](LEVERS.md), written by hand from these runs and from micro-benchmarks."
    )
    return out


def report_server(run: ServerRun) -> str:
    seq = statistics.mean(c[0] for c in run.ceiling)
    par = statistics.mean(c[1] for c in run.ceiling)
    lines = [f"## {run.info['server']}", ""]
    lines.append(f"Reports itself as {run.info['reports']}, {run.info['topology']}. Load average (1/5/15 min) "
                 + " at the start, ".join("/".join(f"{x:.2f}" for x in la) for la in run.load)
                 + " at the end of the measurements (the machine's other work shares its CPUs).")  # fmt: skip
    lines.append("")
    lines.append(
        "Ceiling (bare `update_one` by `_id`, write concern w:1): "
        + ", ".join(f"{s:,.0f}" for s, _, _ in run.ceiling) + " updates/s one at a time (start, end of run); "
        + ", ".join(f"{p:,.0f}" for _, p, _ in run.ceiling) + " with 16 in flight. The same update one at a "
        f"time on a collection carrying this store's {len(index_models(ExecutionDocument))} indexes (it changes no "
        "indexed field): "
        + ", ".join(f"{x:,.0f}" for _, _, x in run.ceiling) + " updates/s."
    )  # fmt: skip
    lines += ["", "### Events/s through harel's engine", ""]
    lines.append(
        f"Median of {len(run.rates(RUNNERS[0], 'empty', 'beanie'))} interleaved round(s); *ratio* is the median of "
        "the rounds' own ratios (the two stores of a round run back to back). *stored*: the database "
        f"already holds {run.stored:,} finished executions. *ceiling*: the event rate as a share of the bare "
        "update rate (sequential ceiling for the DurableRunner and concurrency 1, 16-in-flight for concurrency 16)."
    )
    lines.append("")
    lines.append(
        "| runner | database | harel MongoStore | harel-beanie | ratio | harel-beanie stored / empty | ceiling: harel / harel-beanie |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|")
    for runner in RUNNERS:
        roof = par if split_runner(runner)[0] == "worker-16" else seq
        for state in STATES:
            h = run.rate(runner, state, "harel")
            b = run.rate(runner, state, "beanie")
            keep = _pct(b, run.rate(runner, "empty", "beanie")) if state == "stored" else ""
            lines.append(
                f"| {RUNNER_LABEL[runner]} | {state} | {_f(h)} | {_f(b)} | {_x(run.ratio(runner, state))} | {keep} | {_pct(h, roof)} / {_pct(b, roof)} |"
            )
    lines += ["", "Every measurement, events/s (round by round, in run order):", ""]
    lines.append("| runner | database | harel MongoStore | harel-beanie | ratio |")
    lines.append("|---|---|---|---|---|")
    for runner in RUNNERS:
        for state in STATES:
            h_all = ", ".join(f"{x:,.1f}" for x in run.rates(runner, state, "harel"))
            b_all = ", ".join(f"{x:,.1f}" for x in run.rates(runner, state, "beanie"))
            ratios = ", ".join(f"{x:.2f}x" for x in run.paired(runner, state))
            lines.append(f"| {RUNNER_LABEL[runner]} | {state} | {h_all} | {b_all} | {ratios} |")
    lines += [
        "",
        "Round trips per event while timed, counted on the wire by a PyMongo CommandListener (median "
        "over rounds): to the store's collections, and for a worker also to harel's transport, which is "
        "the same for both stores.",
        "",
    ]
    lines.append(
        "| runner | database | store: harel MongoStore | store: harel-beanie | transport: harel / harel-beanie |"
    )
    lines.append("|---|---|---:|---:|---:|")
    for runner in RUNNERS:
        for state in STATES:
            hc, bc = run.calls(runner, state, "harel"), run.calls(runner, state, "beanie")
            tr = "" if split_runner(runner)[0] == "durable" else f"{_f(hc and hc[1], 2)} / {_f(bc and bc[1], 2)}"
            lines.append(f"| {RUNNER_LABEL[runner]} | {state} | {_f(hc and hc[0], 2)} | {_f(bc and bc[0], 2)} | {tr} |")
    lines += ["", "Submitting the worker's work (create + send, one at a time, not in the figures above), calls/s:", ""]
    lines.append("| runner | database | harel MongoStore | harel-beanie | ratio |")
    lines.append("|---|---|---:|---:|---:|")
    for runner in RUNNERS:
        if split_runner(runner)[0] == "durable":
            continue
        for state in STATES:
            h, b = run.submit(runner, state, "harel"), run.submit(runner, state, "beanie")
            lines.append(f"| {RUNNER_LABEL[runner]} | {state} | {_f(h)} | {_f(b)} | {_ratio(b, h)} |")
    if any(c.store == EQUAL for c in run.cells):
        lines += ["", "### At equal write concern", ""]
        lines.append(
            "The same rounds, empty database: harel-beanie at its default (w: majority, j: true) and at harel's "
            "(the client default, w:1), against harel's store at its default. *ratio* as above, paired by round."
        )
        lines.append("")
        lines.append(
            "| runner | harel MongoStore (w:1) | harel-beanie (majority, j) | ratio | harel-beanie at w:1 | ratio |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|")
        for runner in EQUAL_RUNNERS:
            h, b, e = (run.rate(runner, "empty", k) for k in ("harel", "beanie", EQUAL))
            lines.append(f"| {RUNNER_LABEL[runner]} | {_f(h)} | {_f(b)} | {_x(run.ratio(runner, 'empty'))} | "
                         f"{_f(e)} | {_x(run.ratio(runner, 'empty', EQUAL))} |")  # fmt: skip
    lines += ["", "### Targets", ""]
    lines.append(
        f"What this store aims for: on an empty database, at least {TARGET[False]:.1f}x harel's rate untraced "
        f"and {TARGET[True]:.1f}x traced."
    )
    lines.append("")
    for runner in RUNNERS:
        x, xe = run.ratio(runner, "empty"), run.ratio(runner, "empty", EQUAL)
        b, bs = run.rate(runner, "empty", "beanie"), run.rate(runner, "stored", "beanie")
        goal = TARGET[split_runner(runner)[1]]
        ok1 = "met" if x and x >= goal else "NOT met"
        ok3 = "met" if xe and xe >= goal else "NOT met"
        lines.append(f"- {RUNNER_LABEL[runner]}: empty database {_x(x)} harel's at the stores' defaults (target {goal:.1f}x: "
                     f"{ok1}), {_x(xe)} at equal write concern ({ok3}); with {run.stored:,} stored {_x(run.ratio(runner, 'stored'))} "
                     f"harel's, {_pct(bs, b)} of its own empty-database rate.")  # fmt: skip
    if any(c.store == BARE for c in run.cells):
        lines += ["", "### With fewer indexes", ""]
        lines.append(
            "The same store measured in the same rounds on an empty database, set up with fewer indexes "
            "(`create_schema=False`, then only the ones named): with only `_id`, none of its reads is "
            "index-backed; with only the two partial indexes its own operations read (the relay's pending "
            f"work, `{OWN_INDEXES[0]}`, and the timer sweep's, `{OWN_INDEXES[1]}`), its listing and dashboard "
            "reads are not. Neither is a configuration to run; together they show what each part of the index "
            "set costs this store on this server."
        )
        lines.append("")
        lines.append(
            "| runner | harel MongoStore | `_id` only | ratio | its own reads' indexes | ratio | every index | ratio |"
        )
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
        for runner in BARE_RUNNERS:
            row = [RUNNER_LABEL[runner], _f(run.rate(runner, "empty", "harel"))]
            for kind in (BARE, OWN, "beanie"):
                row += [_f(run.rate(runner, "empty", kind)), _x(run.ratio(runner, "empty", kind))]
            lines.append("| " + " | ".join(row) + " |")
    sequential = [r for r in RUNNERS if split_runner(r)[0] in ("durable", "worker-1")]
    if any(run.split(r, "empty", "harel") for r in sequential):
        lines += ["", "### Where an event's time goes", ""]
        lines.append(
            "Empty database, runners whose commands go one at a time, ms per event (median over rounds of each "
            "part): the store's commands from sent to answered as the driver reports them (of which its "
            "updates, the commits), harel's transport's commands, and the rest, spent in the client process "
            "(harel's engine, the drivers, the worker's loop); then the CPU time the client process and the "
            "server spent per event (all their threads; the server's only when it runs on this machine). In "
            "brackets, the difference to harel's store."
        )
        lines.append("")
        lines.append(
            "| runner | store | event | store's commands | of which updates | transport's commands | client "
            "| CPU: client | CPU: server |"
        )
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for runner in sequential:
            base = run.split(runner, "empty", "harel")
            for kind, label in (("harel", "harel MongoStore"), (BARE, "harel-beanie, `_id` only"),
                                ("beanie", "harel-beanie")):  # fmt: skip
                got = run.split(runner, "empty", kind)
                if got is None or base is None:
                    continue
                cells = [
                    "-"
                    if math.isnan(got[k])
                    else f"{got[k]:.2f}" + ("" if kind == "harel" else f" ({got[k] - base[k]:+.2f})")
                    for k in ("wall", "store", "store update", "transport", "client", "client cpu", "server cpu")
                ]
                lines.append(f"| {RUNNER_LABEL[runner]} | {label} | " + " | ".join(cells) + " |")
    lines += ["", "### Reading these figures", ""]
    lines += reading(run)
    if run.index_costs:
        lines += ["", "### What each commit kind costs, and each index", ""]
        costs = run.index_costs
        lines.append(
            "harel-beanie's store committing directly (no engine; a dedupe window of 100, full), ms per "
            "operation, median over blocks: with every index, with only `_id`, and harel's MongoStore doing the "
            "same operation in the same blocks. An index's cost is the median, over blocks, of the time with "
            "every index minus the time with all but that one, measured back to back in each block (noise: a "
            "few hundredths of a ms either way). *keys* is what the operation's writes do to the index's "
            "entries, counted from the documents after each write: entries removed plus entries added by a "
            "server that rewrites every entry of a changed document (SecantusDB) / by one that writes only "
            "the entries that change (mongod)."
        )
        lines.append("")
        lines.append(
            "| operation | harel MongoStore, ms | harel-beanie, every index, ms | harel-beanie, `_id` only, ms | the index set, ms |"
        )
        lines.append("|---|---:|---:|---:|---:|")
        for kind, what in COMMIT_KINDS.items():
            lines.append(f"| {kind}: {what} | {costs['harel'][kind]:.2f} | {costs['all'][kind]:.2f} | "
                         f"{costs['none'][kind]:.2f} | {costs['cost_all'][kind]:+.2f} |")  # fmt: skip
        lines.append("")
        lines.append("Per index: ms it adds, and keys written (SecantusDB / mongod), per operation.")
        lines.append("")
        lines.append("| index | serves | " + " | ".join(COMMIT_KINDS) + " |")
        lines.append("|---|---|" + "---:|" * len(COMMIT_KINDS))
        for ix in index_models(ExecutionDocument):
            name = ix.document["name"]
            cost = costs.get(f"cost-{name}")
            if cost is None:
                continue
            keys = ", ".join(f"{k} {v}" for k, v in dict(ix.document["key"]).items())
            extra = " sparse" if ix.document.get("sparse") else ""
            extra += " partial" if ix.document.get("partialFilterExpression") else ""
            cells = []
            for kind in COMMIT_KINDS:
                every, changed = run.keys.get(kind, {}).get(name, (0, 0))
                cells.append(f"{cost[kind]:+.2f} ms, {every} / {changed} keys")
            lines.append(
                f"| `{name}` ({keys}){extra} | {INDEX_PURPOSE.get(name, '(not described)')} | "
                + " | ".join(cells)
                + " |"
            )
    return "\n".join(lines)


def report(runs: list[ServerRun], opts: Options, started: datetime.datetime, wall: float) -> str:
    m = machine()
    lines = ["# Benchmark results", ""]
    lines.append(f"Run {started:%Y-%m-%d %H:%M} UTC with `python bench/run.py"
                 + (" --quick" if opts.quick else "") + f"` in {wall / 60:.1f} min.")  # fmt: skip
    lines.append(
        f"Machine: {m['cpus']} CPUs, {m['cpu']}; {m['os']}; Python {m['python']}; harel {m['harel']}, "
        f"pymongo {m['pymongo']}, motor {m['motor']}, beanie {m['beanie']}."
    )
    lines.append(
        f"Per measurement: up to {opts.events} events or {opts.seconds:g} s; {opts.rounds} round(s); "
        f"workload bench/parcel.stm ({EVENTS_PER_EXECUTION} events per execution), each runner untraced (harel's "
        "default) and traced (`trace=True`, one trace step per commit); each store built with "
        "its own `from_url` and defaults (harel-beanie writes with w: majority, j: true; harel's store with "
        "the client default, w:1), and harel-beanie once more at w:1 on the empty database (equal write concern)."
    )
    for run in runs:
        lines += ["", report_server(run)]
    return "\n".join(lines) + "\n"


def parse_args(argv: Optional[list[str]] = None) -> tuple[Options, argparse.Namespace]:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a smoke run at tiny sizes (writes no RESULTS.md unless --out)")
    p.add_argument("--events", type=int, help="events per measurement (default 400; quick 10)")
    p.add_argument("--seconds", type=float, help="time budget per measurement (default 15; quick 5)")
    p.add_argument("--stored", type=int, help="finished executions in the 'stored' database (default 20000; quick 100)")
    p.add_argument("--rounds", type=int, help="interleaved rounds (default 5; quick 1)")
    p.add_argument(
        "--index-commits", type=int, help="commits per index variant and block (default 40; quick 4; 0 skips)"
    )
    p.add_argument(
        "--url", default=os.environ.get("MONGODB_URL"), help="also run on this server (default $MONGODB_URL)"
    )
    p.add_argument("--no-embedded", action="store_true", help="skip the embedded server (needs --url)")
    p.add_argument("--out", help="write the markdown here (default bench/RESULTS.md; quick: nowhere)")
    a = p.parse_args(argv)
    q = a.quick
    opts = Options(
        events=a.events or (10 if q else 400),
        seconds=a.seconds or (5.0 if q else 15.0),
        stored=a.stored if a.stored is not None else (100 if q else 20_000),
        rounds=a.rounds or (1 if q else 5),
        ceiling_updates=50 if q else 2_000,
        index_commits=a.index_commits if a.index_commits is not None else (4 if q else 40),
        index_blocks=2 if q else 12,
        quick=q,
    )
    return opts, a


def main(argv: Optional[list[str]] = None) -> int:
    logging.basicConfig(level=logging.ERROR)
    opts, a = parse_args(argv)
    if a.no_embedded and not a.url:
        print("--no-embedded needs --url or MONGODB_URL", file=sys.stderr)
        return 2
    defs = load_definitions()
    started = datetime.datetime.now(datetime.timezone.utc)
    t = time.perf_counter()
    runs = []
    if not a.no_embedded:
        with EmbeddedServer() as server:
            TALLY.server_pid = server.proc.pid if server.proc is not None else None
            try:
                runs.append(run_server("embedded", server.url, opts, defs))
            finally:
                TALLY.server_pid = None
    if a.url:
        runs.append(run_server("url", a.url, opts, defs))
    text = report(runs, opts, started.replace(tzinfo=None), time.perf_counter() - t)
    print(text)
    out = a.out or (None if opts.quick else str(HERE / "RESULTS.md"))
    if out:
        Path(out).write_text(text)
        print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
