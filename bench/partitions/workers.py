"""Worker processes against one server: events/s with 1, 2 and 4 of them on each stack, and
the time from a worker's SIGKILL until its partitions are owned by the survivor and their
queued work is claimed again.

The stacks: `harel-beanie worker --transport beanie` (this package's transport, partitions on),
`harel-beanie worker --transport harel` (harel's Mongo transport, every worker sweeping
everything; the store is this package's in both), and harel's own `python -m harel.worker`
(harel's Mongo store and transport). Each configuration gets a fresh database; its workers
are started and, on this package's transport, left to share the partitions evenly before a
few warm-up executions go through; then M Parcels are created and their events published
(8 at a time, each execution's in order) and the clock runs from the first publish until
every one of them is DONE."""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pymongo
from harel.engine.aio.distributed import AsyncDistributedRunner
from harel.spec.states import Event

from bench.common import tally_child
from bench.common.cost import Cost, between
from bench.common.harness import (
    EVENTS_PER_EXECUTION,
    EXECUTIONS,
    HERE,
    MODEL,
    STEPS,
    Wire,
    async_store,
    load_definitions,
)
from bench.common.kinds import OBSERVER
from bench.common.wire import TALLY, process_cpu_seconds
from bench.store.throughput import open_transport
from harel_beanie.core.names import partition_collection, queue_names
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, part_of

STACKS = ("beanie", "harel", "harel-own")
STACK_LABEL = {
    "beanie": "`harel-beanie worker --transport beanie` (partitions)",
    "harel": "`harel-beanie worker --transport harel`",
    "harel-own": "`python -m harel.worker` (harel's store and transport)",
}
START_S = 60.0  # a worker process's start, bounded
CONCURRENCY = 16  # events in flight per worker process, on every stack
PUBLISHERS = 8  # executions created and published at once
DONE = {"data": {"$regex": '"status":"DONE"'}}  # in `data`, where both stores keep the execution
POLL = 0.05


@dataclass
class Rate:
    stack: str
    workers: int
    executions: int
    events: int
    seconds: float
    drained: bool
    server_cpu: Optional[float] = None  # CPU seconds the server spent while it ran (embedded only)
    cost: Optional[Cost] = None  # what one event cost, by kind of work (bench/common/cost.py)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    @property
    def server_ms_per_event(self) -> Optional[float]:
        """The server's CPU per event handled (ms), if measured."""
        return None if self.server_cpu is None or not self.events else self.server_cpu / self.events * 1000

    @property
    def server_busy(self) -> Optional[float]:
        """The server's CPU over the run, as a share of one CPU, if measured."""
        return None if self.server_cpu is None or self.seconds <= 0 else self.server_cpu / self.seconds


@dataclass
class Takeover:
    lost: int  # partitions the killed worker held
    lease_left: float  # the least time its leases had left when it died
    owned: float  # seconds from the kill until the survivor owned every one of them
    first_claim: float  # ... until its first queued message there was claimed
    all_claimed: float  # ... until every one was
    epochs_bumped: bool = True


@dataclass
class Workers:
    url: str
    db: str
    models: Path
    logs: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    asked: int = 0  # the last request for the workers' command counts

    @property
    def tally(self) -> Path:
        folder = self.logs / "tally"
        folder.mkdir(exist_ok=True)
        return folder

    def counted(self) -> dict[str, Any]:
        """What the live workers sent so far, by kind: {"counts": ..., "seconds": ...}."""
        self.asked += 1
        live = sum(1 for p in self.procs.values() if p.poll() is None)
        return tally_child.read(self.tally, live, self.asked)

    def start(self, stack: str, name: str) -> None:
        # each worker counts its commands by kind and answers the benchmark's requests for the
        # sums (bench/common/tally_child.py), run from the repository's top wherever this runs
        env = dict(os.environ, **{tally_child.ENV: str(self.tally)})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH")) if p)
        counted = [sys.executable, "-m", "bench.common.tally_child"]
        if stack == "harel-own":
            argv = [*counted, "harel.worker"]
            env.update(
                HAREL_STORE_BACKEND="mongo",
                HAREL_TRANSPORT_BACKEND="mongo",
                HAREL_MONGO_URL=self.url,
                HAREL_MONGO_DB=self.db,
                HAREL_DEFINITIONS_DIR=str(self.models),
                HAREL_WORKER_ID=name,
                HAREL_CONCURRENCY=str(CONCURRENCY),
                HAREL_PREFIX="harel",
            )
        else:
            argv = [
                *counted,
                "harel_beanie",
                "worker",
                "--url",
                self.url,
                "--db",
                self.db,
                "--prefix",
                "harel",
                "--definitions",
                str(self.models),
                "--transport",
                stack,
                "--worker-id",
                name,
                "--concurrency",
                str(CONCURRENCY),
            ]
        with open(self.logs / f"{name}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)

    def ready(self, name: str) -> bool:
        return b" ready:" in (self.logs / f"{name}.log").read_bytes()

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def tails(logs: Path, lines: int = 15) -> str:
    """The last lines of every worker's log: what a stalled configuration prints, so that a
    run on a machine nobody can log into (CI) still says where its workers stood."""
    out = []
    for log in sorted(logs.glob("*.log")):
        text = log.read_text(errors="replace").splitlines()[-lines:]
        out.append(f"--- {log.name} (last {len(text)} lines)\n" + "\n".join(text))
    return "\n".join(out) or "(no worker logs)"


def _wait(predicate: Any, timeout: float, what: str, logs: Optional[Path] = None) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise TimeoutError(f"waited {timeout:g}s for {what}" + (f"\n{tails(logs)}" if logs else ""))
        time.sleep(0.1)


def leases(client: pymongo.MongoClient[Any], db: str) -> dict[int, dict[str, Any]]:
    return {d["_id"]: d for d in client[db][partition_collection("harel")].find({"_id": {"$type": "int"}})}


def balanced(client: pymongo.MongoClient[Any], db: str, n: int) -> bool:
    """Every partition leased, to `n` owners, none above its fair share."""
    now = time.time()
    owners = Counter(d["owner"] for d in leases(client, db).values() if d.get("owner") and d["until"] > now)
    return (
        sum(owners.values()) == DEFAULT_PARTITIONS
        and len(owners) == n
        and max(owners.values()) <= math.ceil(DEFAULT_PARTITIONS / n)
    )


def _start(stack: str, n: int, url: str, db: str, tmp: Path, stem: str) -> Workers:
    models = tmp / "models"
    models.mkdir(exist_ok=True)
    shutil.copy(MODEL, models / MODEL.name)
    workers = Workers(url, db, models, tmp)
    names = [f"{stem}{i}" for i in range(n)]
    for name in names:
        workers.start(stack, name)
    if stack != "harel-own":  # harel's worker says nothing when it is up: the warm-up tells
        _wait(lambda: all(workers.ready(x) for x in names), START_S, "the workers' ready lines", tmp)
    if stack == "beanie":
        client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
        _wait(lambda: balanced(client, db, n), 60, "the partitions shared evenly", tmp)
        client.close()
    return workers


async def _stack(stack: str, url: str, db: str) -> tuple[Any, Any]:
    store = await async_store("harel" if stack == "harel-own" else "beanie", url, db)
    transport = await open_transport("beanie" if stack == "beanie" else "harel", url, db, "harel", store)
    return store, transport


async def _drive(
    stack: str, url: str, db: str, executions: int, budget: float, ids: Optional[list[str]] = None
) -> Rate:
    """Create `executions` Parcels and publish their events; time until all are DONE."""
    store, transport = await _stack(stack, url, db)
    runner = AsyncDistributedRunner(store, transport, load_definitions())
    client: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(url)
    coll = client[db][EXECUTIONS]
    made: list[str] = []
    gate = asyncio.Semaphore(PUBLISHERS)

    async def one() -> None:
        async with gate:
            exe = await runner.create("Parcel")
            made.append(exe.id)
            for step in STEPS:
                await runner.send(exe.id, Event(kind=step))

    t = time.perf_counter()
    publishing = asyncio.gather(*(one() for _ in range(executions)))
    done = 0
    while time.perf_counter() - t < budget:
        await asyncio.sleep(POLL)
        if publishing.done() and len(made) == executions:
            # the benchmark's own read, counted apart from the stack's commands
            done = await coll.count_documents({"_id": {"$in": made}, **DONE}, comment=OBSERVER)
            if done == executions:
                break
    seconds = time.perf_counter() - t
    if not publishing.done():
        publishing.cancel()
    await asyncio.gather(publishing, return_exceptions=True)
    await store.close()
    await transport.close()
    await client.close()
    return Rate(stack, 0, executions, done * EVENTS_PER_EXECUTION, seconds, done == executions)


def events_per_second(
    stack: str, n: int, url: str, executions: int, budget: float, say: Any, server_pid: Optional[int] = None
) -> Rate:
    db = "hbbench_pw_" + uuid.uuid4().hex[:6]
    tmp = Path(tempfile.mkdtemp(prefix="hbbench-workers-"))
    workers = _start(stack, n, url, db, tmp, "w")
    try:
        # harel's worker prints no ready line, so its warm-up also covers its start: it gets the
        # 60 s the other stacks get for their ready lines on top of the budget (a loaded 2-core
        # CI machine took over 30 s to start it and drain two executions)
        warm_budget = budget + (START_S if stack == "harel-own" else 0)
        warm = asyncio.run(_drive(stack, url, db, 2 * n, warm_budget))
        if not warm.drained:  # reported as such, the logs kept: one stack's failure ends no run
            say(
                f"{stack} x{n}: the warm-up did not drain in {warm_budget:g} s; worker logs kept in {tmp}\n{tails(tmp)}"
            )
            return Rate(stack, n, executions, 0, 0.0, False)
        counted, producer = workers.counted(), Wire()
        cpu = process_cpu_seconds(server_pid)
        with TALLY.timed(producer):
            rate = asyncio.run(_drive(stack, url, db, executions, budget))
        after = process_cpu_seconds(server_pid)
        rate.workers = n
        rate.server_cpu = None if cpu is None or after is None else after - cpu
        rate.cost = between(rate.events, rate.server_cpu, counted, workers.counted(), producer)
        say(f"{stack:9s} x{n}: {rate.rate:7.1f} events/s ({rate.events} in {rate.seconds:.1f}s)")
        if not rate.drained:
            say(f"{stack} x{n}: did not drain in {budget:g} s; worker logs kept in {tmp}\n{tails(tmp)}")
            return rate
        shutil.rmtree(tmp, ignore_errors=True)
        return rate
    finally:
        workers.stop_all()
        pymongo.MongoClient(url).drop_database(db)


def takeover(url: str, say: Any) -> Takeover:
    """Two workers on this package's transport; one SIGKILLed while idle; then one message
    published to an execution in each of its partitions. Kept whole: the polling measures
    against the moment of the kill and what was read just before it (the leases held, the
    messages acked), and the figures come from all three; apart, they would travel as seven
    arguments."""
    db = "hbbench_pk_" + uuid.uuid4().hex[:6]
    tmp = Path(tempfile.mkdtemp(prefix="hbbench-kill-"))
    client: pymongo.MongoClient[Any] = pymongo.MongoClient(url)
    workers = _start("beanie", 2, url, db, tmp, "k")
    try:
        held = leases(client, db)
        lost = sorted(p for p, d in held.items() if str(d.get("owner") or "").startswith("k0:"))
        ids = [_id_in(p) for p in lost]
        asyncio.run(_create(url, db, ids))
        queues = client[db][queue_names("harel")[0]]
        settled = {"_id": {"$in": ids}, "pending": 0, "token": None}
        _wait(lambda: queues.count_documents(settled) == len(ids), 60, "the Starts handled")
        acked = {d["_id"]: d.get("acked", 0) for d in queues.find({"_id": {"$in": ids}})}
        held = leases(client, db)
        workers.kill("k0")
        killed = time.time()
        asyncio.run(_send(url, db, ids))
        owned: dict[int, float] = {}
        claimed: dict[str, float] = {}
        while len(claimed) < len(ids) and time.time() - killed < 60:
            now = leases(client, db)
            for p in lost:
                d = now.get(p, {})
                if p not in owned and str(d.get("owner") or "").startswith("k1:"):
                    owned[p] = time.time() - killed
            for doc in queues.find({"_id": {"$in": ids}}):
                if doc["_id"] not in claimed and (doc.get("token") or doc.get("acked", 0) > acked[doc["_id"]]):
                    claimed[doc["_id"]] = time.time() - killed
            time.sleep(POLL)
        final = leases(client, db)
        result = Takeover(
            lost=len(lost),
            lease_left=min(held[p]["until"] for p in lost) - killed,
            owned=max(owned.values()) if len(owned) == len(lost) else float("nan"),
            first_claim=min(claimed.values()) if claimed else float("nan"),
            all_claimed=max(claimed.values()) if len(claimed) == len(ids) else float("nan"),
            epochs_bumped=all(final[p].get("epoch", 0) > held[p].get("epoch", 0) for p in lost),
        )
        say(
            f"takeover: {len(lost)} partitions owned again after {result.owned:.1f}s, claimed after "
            f"{result.first_claim:.1f}-{result.all_claimed:.1f}s (lease left at the kill {result.lease_left:.1f}s)"
        )
        return result
    finally:
        workers.stop_all()
        client.drop_database(db)
        client.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _id_in(part: int) -> str:
    n = 0
    while part_of(f"victim-{n}", DEFAULT_PARTITIONS) != part:
        n += 1
    return f"victim-{n}"


async def _create(url: str, db: str, ids: list[str]) -> None:
    store, transport = await _stack("beanie", url, db)
    runner = AsyncDistributedRunner(store, transport, load_definitions())
    for eid in ids:
        await runner.create("Parcel", execution_id=eid)
    await store.close()
    await transport.close()


async def _send(url: str, db: str, ids: list[str]) -> None:
    store, transport = await _stack("beanie", url, db)
    runner = AsyncDistributedRunner(store, transport, load_definitions())
    for eid in ids:
        await runner.send(eid, Event(kind=STEPS[0]))
    await store.close()
    await transport.close()
