"""Events/s through harel's engine, the run's main figures: the server's ceiling (bare updates
by `_id`) that the rates are read against, the sync DurableRunner, and AsyncWorker over harel's
Mongo transport. Each engine measurement is timed through the wire tally, so every rate comes
with the round trips and the wire time behind it."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Optional

import pymongo
from harel.definition.model import Definition
from harel.engine.aio.distributed import AsyncDistributedRunner, AsyncWorker
from harel.engine.aio_transport.mongo import AsyncMongoTransport
from harel.engine.durable import DurableRunner
from harel.engine.execution import Status
from harel.engine.schema import Names
from harel.spec.states import Event

from bench.common.harness import (
    EVENTS_PER_EXECUTION,
    EXECUTIONS,
    STACK_PREFIX,
    STEPS,
    TRACED,
    Cell,
    Wire,
    async_store,
    split_runner,
    sync_store,
)
from bench.common.wire import TALLY
from harel_beanie.core.documents import ExecutionDocument, index_models
from harel_beanie.core.names import queue_names
from harel_beanie.transport import AsyncMongoTransport as BeanieTransport
from harel_beanie.transport.settings import DEFAULT_IDLE_WAIT

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
            getattr(self._inner, "wake", lambda: None)()  # a claim waiting for work returns now

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


async def open_transport(kind: str, url: str, db: str, prefix: str, store: Any) -> Any:
    """The transport a measurement runs on: harel's `AsyncMongoTransport` as harel.worker builds
    it, or this package's as the production stack builds it (idle claims wait for a wake-up,
    and for the store's next timer)."""
    if kind == "harel":
        return await AsyncMongoTransport.from_url(url, db, prefix=prefix)
    transport = BeanieTransport(
        pymongo.AsyncMongoClient(url), db, prefix=prefix, idle_wait=DEFAULT_IDLE_WAIT, timers=store.next_timer
    )
    await transport.init()
    return transport


def drop_transport(url: str, db: str, kind: str, prefix: str) -> None:
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    names = Names(prefix)
    collections = (
        [names.messages, names.transport_locks, names.transport_counters]
        if kind == "harel"
        else list(queue_names(prefix))
    )
    for coll in collections:
        client[db].drop_collection(coll)
    client.close()


async def _measure_worker(
    kind: str,
    url: str,
    db: str,
    defs: dict[str, Definition],
    concurrency: int,
    cap: int,
    budget: float,
    trace: bool,
    transport_kind: str = "harel",
) -> tuple[Cell, list[str]]:
    """One cell through harel's AsyncWorker: a warm-up execution, then waves of work, each
    submitted (timed apart) and drained (the figure), until `cap` events or `budget` seconds.
    Kept whole: the warm-up, the waves and the clean-up share one store, transport and runner,
    and the wave loop's five running totals become the cell; apart, they would be passed back
    and forth as a tuple."""
    store = await async_store(kind, url, db)
    prefix = "hbq" + uuid.uuid4().hex[:8]  # a queue of its own: nothing left over from another cell
    inner = await open_transport(transport_kind, url, db, prefix, store)
    transport = CountingTransport(inner)
    runner = AsyncDistributedRunner(store, transport, defs, trace=trace)
    ids = await _submit(runner, 1)  # warm-up, untimed: one execution through the whole path
    await _drain(store, transport, defs, concurrency, EVENTS_PER_EXECUTION, max(budget, 30.0), trace)

    # in waves, so the queue stays as short for one store as for the other: submit a wave
    # (create the executions, each queueing its Start, and queue their four events; timed
    # apart), then let the worker drain it (the figure). A wave holds max(4, concurrency)
    # executions, enough to keep every slot of the worker busy.
    wave = max(4, concurrency)
    handled = submitted = 0
    drain_seconds = submit_seconds = 0.0
    wire, submit_wire = Wire(), Wire()
    mine: list[str] = []
    while handled < cap and drain_seconds + submit_seconds < budget:
        n = min(wave, -(-(cap - handled) // EVENTS_PER_EXECUTION))
        with TALLY.timed(submit_wire):  # the producer's part of an event's cost (bench/common/cost.py)
            t = time.perf_counter()
            batch = await _submit(runner, n)
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
    drop_transport(url, db, transport_kind, prefix)
    runner_name = f"worker-{concurrency}" + (TRACED if trace else "")
    cell = Cell(
        runner_name, "", kind, handled, drain_seconds, submit_events=submitted, submit_seconds=submit_seconds, wire=wire
    )
    cell.submit_wire = submit_wire
    return cell, ids


async def _submit(runner: AsyncDistributedRunner, n: int) -> list[str]:
    """`n` Parcels created, each queueing its Start, and their four further events queued."""
    batch = [(await runner.create("Parcel")).id for _ in range(n)]
    for eid in batch:
        for step in STEPS:
            await runner.send(eid, Event(kind=step))
    return batch


def measure(kind: str, runner: str, url: str, db: str, defs: dict[str, Definition], cap: int, budget: float) -> Cell:
    """One cell. `kind` is a store (harel's transport under it) or a stack (`STACK_PREFIX` +
    "harel" or "beanie": that store on that transport)."""
    base, trace = split_runner(runner)
    store_kind, transport_kind = (
        (kind.removeprefix(STACK_PREFIX),) * 2 if kind.startswith(STACK_PREFIX) else (kind, "harel")
    )
    if base == "durable":
        cell, ids = measure_durable(kind, url, db, defs, cap, budget, trace)
        cell.runner = runner
    else:
        concurrency = int(base.split("-")[1])
        cell, ids = asyncio.run(
            _measure_worker(store_kind, url, db, defs, concurrency, cap, budget, trace, transport_kind)
        )
        cell.store = kind
    # leave the database as it was: drop the executions this cell created
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    client[db][EXECUTIONS].delete_many({"_id": {"$in": ids}})
    client.close()
    return cell
