"""What a message costs and how soon it is handled, both transports side by side: round trips
per message for publish, claim and ack; event-to-handler latency at a low steady rate, with
idle workers, for harel's stack (its worker polls every few milliseconds), harel-beanie's
stack polling (a standalone server) and harel-beanie's stack woken by change streams (a
replica set); how late a durable timer fires; and where the client's time goes per event (a
profile of each store under harel's transport).

Latency and lateness are wall-clock figures of one machine: the report gives them side by
side from one run and never as targets."""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import statistics
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import motor.motor_asyncio
import pymongo
from harel.dsl import definition_from_dsl_file
from harel.engine.aio.distributed import AsyncDistributedRunner
from harel.engine.aio_transport.mongo import AsyncMongoTransport
from harel.spec.states import Event
from pymongo import monitoring

from bench.common.harness import EVENTS_PER_EXECUTION, MODELS, STEPS, async_store
from bench.store.throughput import CountingTransport, _drain, open_transport
from harel_beanie.transport import AsyncMongoTransport as BeanieTransport

#: the setups whose latency is compared: (label, store, transport, needs change streams)
SETUPS = (
    ("harel's stack (its worker polls every 5 ms)", "harel", "harel", False),
    ("harel-beanie's stack, polling (a standalone server)", "beanie", "beanie", False),
    ("harel-beanie's stack, change-stream wake-ups (a replica set)", "beanie", "beanie", True),
)


@dataclass
class Latency:
    label: str
    handler_ms: list[float] = field(default_factory=list)  # publish to the worker's claim of it
    timer_ms: list[float] = field(default_factory=list)  # a timer's fire time to the claim of its Timeout
    idle_commands_per_s: float = 0.0  # what an idle worker sends the server


class _Counter(monitoring.CommandListener):
    def __init__(self) -> None:
        self.by_command: dict[str, int] = {}

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name not in ("hello", "ismaster", "isMaster", "endSessions"):
            self.by_command[event.command_name] = self.by_command.get(event.command_name, 0) + 1

    def succeeded(self, event: Any) -> None:
        pass

    def failed(self, event: Any) -> None:
        pass

    def total(self) -> int:
        return sum(self.by_command.values())


def round_trips(url: str, messages: int = 50) -> dict[str, dict[str, float]]:
    """Commands per message for publish, claim and ack, each transport, one group per message
    (the common case: an execution with one message waiting)."""

    async def one(kind: str) -> dict[str, float]:
        counter = _Counter()
        db = "hbbench_rt_" + uuid.uuid4().hex[:6]
        if kind == "harel":
            client: Any = motor.motor_asyncio.AsyncIOMotorClient(url, event_listeners=[counter])
            t: Any = AsyncMongoTransport(client, db)
            await t._locks.create_index("available_at")
            await t._counters.update_one({"_id": "seq"}, {"$inc": {"n": 0}}, upsert=True)
        else:
            t = BeanieTransport(pymongo.AsyncMongoClient(url, event_listeners=[counter]), db)
            await t.init()
        out: dict[str, float] = {}
        leases = []
        for phase in ("publish", "claim", "ack"):
            before = counter.total()
            for i in range(messages):
                if phase == "publish":
                    await t.publish(f"g{i}", Event(kind="M"))
                elif phase == "claim":
                    leases.append(await t.claim("w", 60))
                else:
                    await t.ack(leases[i])
            out[phase] = (counter.total() - before) / messages
        assert all(lease is not None for lease in leases)
        await t.close()
        pymongo.MongoClient(url).drop_database(db)
        return out

    return {kind: asyncio.run(one(kind)) for kind in ("harel", "beanie")}


class _Timed(CountingTransport):
    """The transport under the idle worker, noting when each message is published and first
    claimed (by group and event kind), and how late each timer's Timeout is claimed in `out`."""

    def __init__(self, inner: Any, out: Latency) -> None:
        super().__init__(inner)
        self.out = out
        self.published: dict[str, float] = {}
        self.claimed: dict[str, float] = {}

    async def publish(self, group_id: str, event: Event, priority: int = 0) -> None:
        self.published.setdefault(f"{group_id}:{event.kind}", time.perf_counter())
        await super().publish(group_id, event, priority)

    async def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Any:
        lease = await super().claim(worker_id, visibility, min_priority)
        if lease is not None:
            self.claimed.setdefault(f"{lease.group_id}:{lease.event.kind}", time.perf_counter())
            fire_at = (lease.event.data or {}).get("fire_at") if lease.event.kind == "Timeout" else None
            if isinstance(fire_at, (int, float)):  # harel's Timeout carries its timer's fire time
                self.out.timer_ms.append(1000 * (time.time() - fire_at))
        return lease


async def _latency(
    label: str, store_kind: str, transport_kind: str, url: str, defs: dict[str, Any], n: int, rate: float, timers: int
) -> Latency:
    """`n` Parcels started at `rate` per second onto an idle worker (concurrency 16), then
    `timers` Waiters whose one-second timer fires while the worker idles."""
    out = Latency(label)
    db = "hbbench_lat_" + uuid.uuid4().hex[:6]
    store = await async_store(store_kind, url, db)
    prefix = "hbq" + uuid.uuid4().hex[:6]
    inner = await open_transport(transport_kind, url, db, prefix, store)
    transport = _Timed(inner, out)
    runner = AsyncDistributedRunner(store, transport, defs)
    worker = runner.worker(worker_id="lat", concurrency=16)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await asyncio.sleep(1.0)  # the worker idles
    counter = _idle_counter(url)
    idle_from, idle_t = counter(), time.perf_counter()
    await asyncio.sleep(2.0)
    out.idle_commands_per_s = (counter() - idle_from) / (time.perf_counter() - idle_t)
    for _ in range(n):
        exe = await runner.create("Parcel")
        await asyncio.sleep(1.0 / rate)
        out.handler_ms.append(
            1000
            * (transport.claimed.get(f"{exe.id}:Start", time.perf_counter()) - transport.published[f"{exe.id}:Start"])
        )
    await asyncio.sleep(1.0)
    for _ in range(timers):
        await runner.create("Waiter")
        await asyncio.sleep(0.25)
    await asyncio.sleep(3.0)
    stop.set()
    getattr(inner, "wake", lambda: None)()
    await task
    await store.close()
    await transport.close()
    pymongo.MongoClient(url).drop_database(db)
    return out


def _idle_counter(url: str) -> Any:
    """The server's command count (serverStatus opcounters): what every client sent it."""
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)

    def read() -> int:
        ops = client.admin.command("serverStatus").get("opcounters", {})
        return int(sum(v for k, v in ops.items() if k in ("query", "insert", "update", "delete", "getmore", "command")))

    return read


def latencies(standalone_url: str, replica_url: str, defs: dict[str, Any], n: int, timers: int) -> list[Latency]:
    waiter = definition_from_dsl_file(MODELS / "waiter.stm", validate=True)
    defs = {**defs, "Waiter": waiter}
    out = []
    for label, store_kind, transport_kind, streams in SETUPS:
        url = replica_url if streams else standalone_url
        out.append(asyncio.run(_latency(label, store_kind, transport_kind, url, defs, n, 10.0, timers)))
    return out


def percentile(values: list[float], p: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def profile(url: str, defs: dict[str, Any], events: int, top: int = 12) -> dict[str, list[tuple[str, float]]]:
    """Each store under harel's transport, AsyncWorker at concurrency 1: the client's own
    functions by their time per event (cProfile, tottime), the `top` of them."""

    async def one(kind: str) -> tuple[cProfile.Profile, int]:
        db = "hbbench_prof_" + uuid.uuid4().hex[:6]
        store = await async_store(kind, url, db)
        prefix = "hbq" + uuid.uuid4().hex[:6]
        transport = CountingTransport(await open_transport("harel", url, db, prefix, store))
        runner = AsyncDistributedRunner(store, transport, defs)
        n = max(1, events // EVENTS_PER_EXECUTION)
        for _ in range(n):
            exe = await runner.create("Parcel")
            for step in STEPS:
                await runner.send(exe.id, Event(kind=step))
        prof = cProfile.Profile()
        prof.enable()
        got, _ = await _drain(store, transport, defs, 1, n * EVENTS_PER_EXECUTION, 600.0, False)
        prof.disable()
        await store.close()
        await transport.close()
        pymongo.MongoClient(url).drop_database(db)
        return prof, got

    out = {}
    for kind in ("harel", "beanie"):
        prof, got = asyncio.run(one(kind))
        stats = pstats.Stats(prof)
        rows = []
        for (filename, line, func), (_cc, _nc, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
            where = "/".join(Path(filename).parts[-2:]) if filename != "~" else "(built-in)"
            rows.append((f"{where}:{line} {func}", 1000 * tottime / max(got, 1)))
        rows.sort(key=lambda r: -r[1])
        out[kind] = rows[:top]
    return out


def summary(values: list[float]) -> tuple[Optional[float], Optional[float], Optional[float]]:
    """p50, p99 and max, in ms."""
    return (
        statistics.median(values) if values else None,
        percentile(values, 99),
        max(values) if values else None,
    )
