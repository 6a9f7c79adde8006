"""One network-fault run: a server, workers on their own links, a client recording a
history, faults on the links, and the checker's verdict at the end.

What runs where. The server (SecantusDB as a one-member replica set, test commands on) runs
in its own network namespace (or on loopback: tests/support/netfaults/topology.py). Each worker is
the real `harel-beanie worker` command (harel's `AsyncWorker` on this package's store, on the
transport the run names) in a namespace of its own, reaching the server through the fault
proxy, started with `--history` so its store writes every create, commit and read it makes
to a history file. This process is the client: harel's `AsyncDistributedRunner` on a
recording store creates the `Tally` executions (tests/support/netfaults/models) and sends them
events, writing each send to the history (invoke, then ok / fail / unknown); a reader loads
executions now and then. While the client sends, the scenario's faults come and go
(`faults.py`) and workers are SIGKILLed and started again.

Then every fault is lifted, the client sends once more each event whose outcome it never
learned (same id: harel dedupes it), and the run waits until nothing is left to do: every
execution settled, no outbox entry, spawn, timer or transport message. The final state of
every execution and what is left pending go into the history, the workers stop, the counts
every reader shows are compared with a count of the documents (`tests/support/exact_counts.py`:
`Outcome.counts`, which each run's test asserts), and the checker (`harel_beanie.history`)
reads all the files: nothing lost, nothing doubled, one
version chain per execution, no stale read, the final states equal harel's in-memory run of
the accepted events, everything drained, and each group's messages delivered and applied in
the order they were published (every publish and delivery is recorded, the client's and the
workers').
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pymongo
from harel.engine.aio.distributed import AsyncDistributedRunner
from harel.spec.states import Event

from harel_beanie.deploy.embedded import EmbeddedServer, free_port
from harel_beanie.deploy.loader import load_models
from harel_beanie.deploy.stack import open_transport, queued
from harel_beanie.deploy.where import Target
from harel_beanie.history.checker import Verdict, check
from harel_beanie.history.recording import RecordingStore, RecordingTransport
from harel_beanie.history.records import HistoryWriter, read_history
from harel_beanie.history.replay import replay
from harel_beanie.history.story import stories
from harel_beanie.store.async_store import AsyncMongoStore
from harel_beanie.store.connect import RetryPolicy
from tests.support.exact_counts import CountCheck, exact_counts
from tests.support.netfaults.faults import LINK, PROXY, Fault, Injector
from tests.support.netfaults.proxy import FaultProxy
from tests.support.netfaults.topology import Network, make_network
from tests.support.processes import terminate

ROOT = Path(__file__).resolve().parents[3]
MODELS = Path(__file__).resolve().parent / "models"
PREFIX = "harel"
DB = "netfaults"
# The drivers' timeouts: a reply later than SOCKET_MS is a timeout whose write may have landed
SOCKET_MS, CONNECT_MS, SELECT_S = 2000, 2000, 3.0
VISIBILITY = 4.0  # a worker's lease on an event in flight, seconds
SETTLE_TIMEOUT = 150.0  # the longest the run waits for the work to drain after the faults
RESTART = 15.0  # seconds a SIGKILLed worker may take to be back at work, on a loaded machine


@dataclass(frozen=True)
class Scenario:
    name: str
    faults: tuple[Fault, ...]
    kills: int = 1  # worker SIGKILLs on top of the faults
    workers: int = 3
    executions: int = 6
    rate: float = 10.0  # events the client sends per second
    seconds: float = 20.0  # how long it sends
    echo_share: float = 0.2
    resend_share: float = 0.1  # events the client sends a second time, same id (an at-least-once producer)
    # the worker command: the real one, or a module that breaks it on purpose
    worker: tuple[str, ...] = ("harel_beanie", "worker")


@dataclass
class Outcome:
    scenario: str
    layer: str
    fallback_reason: str
    transport: str
    faults: list[dict[str, Any]] = field(default_factory=list)
    kills: int = 0
    worker_starts: int = 0
    exits: list[str] = field(default_factory=list)  # workers that ended by themselves: name and code
    late: int = 0  # operations that took longer than the drivers' socket timeout
    #: driver network errors the workers logged: the faults' reach into what the history does
    #: not record (harel's transport's claims and acks are not store operations)
    worker_network_errors: int = 0
    sends: dict[str, dict[str, Any]] = field(default_factory=dict)  # event id -> exe, kind, outcomes
    verdict: Optional[Verdict] = None
    history: Optional[Path] = None
    seconds: float = 0.0
    settled: bool = False
    #: the counts every reader shows against the documents, once the workers stopped
    counts: Optional[CountCheck] = None

    def count_problems(self) -> list[str]:
        """Every difference between a reader's counts and the documents' (a run that never
        got as far as comparing them says so)."""
        if self.counts is None:
            return ["the counts were never compared (the run ended before its workers stopped)"]
        return self.counts.problems

    def told(self) -> str:
        """The stories of the first events the anomalies name (`harel_beanie.history.story`):
        what a failure in CI, whose history goes with its machine, prints to start from."""
        if self.history is None or self.verdict is None or self.verdict.ok:
            return ""
        return stories(read_history([self.history]), self.verdict)

    def figures(self) -> dict[str, Any]:
        assert self.verdict is not None
        by_kind = Counter(f["kind"] for f in self.faults)
        return {
            "scenario": self.scenario,
            "layer": self.layer + (f" ({self.fallback_reason})" if self.fallback_reason else ""),
            "transport": self.transport,
            "faults": dict(by_kind),
            "worker_kills": self.kills,
            "worker_exits": len(self.exits),
            **{k: v for k, v in self.verdict.figures.items() if isinstance(v, (int, float))},
            "late_operations": self.late,
            "worker_network_errors": self.worker_network_errors,
            "anomalies": len(self.verdict.anomalies),
            **(self.counts.figures() if self.counts is not None else {}),
            "seconds": round(self.seconds, 1),
        }


def url_of(host: str, port: int) -> str:
    return (
        f"mongodb://{host}:{port}/?directConnection=true&socketTimeoutMS={SOCKET_MS}"
        f"&connectTimeoutMS={CONNECT_MS}&serverSelectionTimeoutMS={int(SELECT_S * 1000)}"
    )


class WorkerProcess:
    """`harel-beanie worker` on one host, started again after each kill under a new name
    (each incarnation writes its own history file)."""

    def __init__(self, run: "Run", host: str) -> None:
        self.run, self.host = run, host
        self.incarnation = 0
        self.killed = False
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.ready = asyncio.Event()
        self._reader: Optional[asyncio.Task[None]] = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def ended_by_itself(self) -> Optional[str]:
        """`name: code` if the current incarnation exited without being told to."""
        if self.proc is None or self.proc.returncode is None or self.killed:
            return None
        return f"{self.host}-{self.incarnation}: {self.proc.returncode}"

    async def start(self) -> None:
        self.incarnation += 1
        self.killed = False
        name = f"{self.host}-{self.incarnation}"
        place = self.run.network.hosts[self.host]
        argv = [
            *place.prefix,
            sys.executable,
            "-m",
            *self.run.scenario.worker,
            "--url",
            url_of(place.url_host, place.url_port),
            "--db",
            DB,
            "--prefix",
            PREFIX,
            "--definitions",
            str(MODELS),
            "--transport",
            self.run.transport,
            "--worker-id",
            name,
            "--visibility",
            str(VISIBILITY),
            "--sweep-every",
            "1",
            "--concurrency",
            "4",
            "--connect-attempts",
            "600",
            "--connect-timeout",
            str(SELECT_S),
            "--history",
            str(self.run.histories / f"{name}.jsonl"),
            *self.run.worker_flags(self.host, name),
        ]
        log = open(self.run.tmp / f"{self.host}.log", "ab")
        self.proc = await asyncio.create_subprocess_exec(
            *argv, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=log, env={**os.environ, "HAREL_BEANIE_DEBUG": "1"}
        )
        log.close()
        self.run.outcome.worker_starts += 1
        self.ready.clear()
        self._reader = asyncio.create_task(self._read(self.proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        with open(self.run.tmp / f"{self.host}.log", "ab") as log:
            while line := await proc.stdout.readline():
                log.write(line)
                log.flush()
                if b" ready:" in line and proc is self.proc:
                    self.ready.set()

    async def kill(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.killed = True
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def stop(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.killed = True  # told to
            await terminate(self.proc)
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


class Run:
    """One scenario on one transport; `go()` returns its `Outcome` (the verdict in it)."""

    def __init__(
        self, scenario: Scenario, tmp: Path, *, transport: str = "beanie", layer: Optional[str] = None, seed: int = 1
    ) -> None:
        self.scenario, self.tmp, self.transport, self.layer = scenario, tmp, transport, layer
        self.rng = random.Random(seed)
        self.seed = seed
        self.histories = tmp / "history"
        self.histories.mkdir(parents=True, exist_ok=True)
        self.outcome = Outcome(scenario.name, "", "", transport)
        self.network: Network
        self.server: EmbeddedServer
        self.workers: dict[str, WorkerProcess] = {}
        self.sends = self.outcome.sends
        self.sending = asyncio.Semaphore(8)

    def worker_flags(self, host: str, name: str) -> list[str]:
        """Flags added to the command of worker incarnation `name` on `host`: none for the
        real command; a run whose scenario starts another module may pass that module's own."""
        return []

    # --- the pieces ----------------------------------------------------------------------

    async def go(self) -> Outcome:
        started = time.monotonic()
        proxy = FaultProxy(self.seed)
        self.network, why = make_network(proxy, free_port(), layer=self.layer)
        self.outcome.layer, self.outcome.fallback_reason = self.network.layer, why
        try:
            self.server = EmbeddedServer(
                self.tmp / "data",
                port=self.network.server_addr[1],
                standalone=False,
                test_commands=True,
                log_path=self.tmp / "server.log",
                bind=self.network.server_bind,
                reach=self.network.server_addr[0],
                wrapper=self.network.server_prefix,
            )
            await asyncio.to_thread(self.server.start)
            for i in range(self.scenario.workers):
                self.network.add_host(f"w{i + 1}")
            # the client's own route, for the faults that meet publishers too (no nft here:
            # it shares this process's namespace)
            self.client_addr = self.network.proxy.add_route("client", "127.0.0.1", self.network.server_addr)
            await self._client_run()
        finally:
            for worker in self.workers.values():
                await worker.kill()
            self.server.stop() if hasattr(self, "server") else None
            self.network.close()
            proxy.close()
        self.outcome.seconds = time.monotonic() - started
        return self.outcome

    async def _client_run(self) -> None:
        url = url_of(*self.client_addr)
        direct = url_of(*self.network.server_addr)  # the injector's, past the proxy
        client: Any = pymongo.AsyncMongoClient(url)
        writer = HistoryWriter(self.histories / "client.jsonl", "client")
        base = AsyncMongoStore(client, DB, prefix=PREFIX)
        store: Any = RecordingStore(base, writer)
        target = Target(
            url=url, db=DB, prefix=PREFIX, retry=RetryPolicy(120, 0.5, int(SELECT_S * 1000)), source="--url"
        )
        transport = None
        injector = Injector(self.network, self.server, direct, writer)
        try:
            await base.init()
            transport = await open_transport(target, kind=self.transport)
            definitions = load_models(MODELS)
            runner = AsyncDistributedRunner(store, RecordingTransport(transport, writer), dict(definitions))
            for host in self.network.hosts:
                self.workers[host] = WorkerProcess(self, host)
                await self.workers[host].start()
            for worker in self.workers.values():
                await asyncio.wait_for(worker.ready.wait(), timeout=120)
            exes = [f"{self.scenario.name}-x{k}" for k in range(self.scenario.executions)]
            for exe in exes:
                await self._create(runner, writer, exe)

            window = asyncio.create_task(self._send_window(runner, writer, exes))
            chaos = asyncio.create_task(self._kills())
            reads = asyncio.create_task(self._reads(store, exes, window))
            await injector.play(self.scenario.faults)
            await window
            await chaos
            await reads
            await injector.heal_all()
            self.outcome.faults = injector.log
            for worker in self.workers.values():
                if not worker.alive:
                    self._exited(worker)
                    await worker.start()
            await self._resend_unknown(runner, writer)
            self.outcome.settled = await self._settle(base, client[DB], exes)
            for worker in self.workers.values():
                self._exited(worker)
            await self._observe(base, client[DB], writer)
            for worker in self.workers.values():
                await worker.stop()  # nothing writes while the counts are compared
            self.outcome.counts = await exact_counts(base, direct)
        finally:
            for worker in self.workers.values():
                await worker.stop()
            if transport is not None:
                await transport.close()
            await base.close()
            writer.close()
        merged = read_history(sorted(self.histories.glob("*.jsonl")))
        self.outcome.late = late_operations(merged, SOCKET_MS / 1000)
        self.outcome.worker_network_errors = sum(network_errors(log) for log in self.tmp.glob("w*.log"))
        self.outcome.history = self.tmp / "history.jsonl"
        self.outcome.history.write_text("".join(json.dumps(r) + "\n" for r in merged))
        self.outcome.verdict = check(merged, replay=lambda case: replay(case, load_models(MODELS)))

    # --- the client's operations ---------------------------------------------------------

    async def _create(self, runner: Any, writer: HistoryWriter, exe: str) -> None:
        """Create `exe`, retrying a lost reply; 'already exists' after one means it landed.
        The recording store writes the create itself."""
        from harel.engine.store import ExecutionAlreadyExists

        for _ in range(60):
            try:
                await runner.create("Tally", {}, execution_id=exe)
                return
            except ExecutionAlreadyExists:
                return
            except pymongo.errors.PyMongoError:
                await asyncio.sleep(0.5)
        raise AssertionError(f"could not create {exe}")

    async def _send(self, runner: Any, writer: HistoryWriter, exe: str, kind: str, eid: str) -> str:
        """One send of event `eid` to `exe`, recorded; its outcome."""
        async with self.sending:
            i = writer.invoke("send", exe=exe, event=eid, kind=kind, data={})
            try:
                await runner.send(exe, Event(kind=kind, id=eid, data={}))
            except pymongo.errors.PyMongoError as exc:
                writer.complete(i, "unknown", error=f"{type(exc).__name__}: {str(exc)[:200]}")
                outcome = "unknown"
            else:
                writer.complete(i, "ok")
                outcome = "ok"
            self.sends.setdefault(eid, {"exe": exe, "kind": kind, "outcomes": []})["outcomes"].append(outcome)
            return outcome

    async def _send_window(self, runner: Any, writer: HistoryWriter, exes: list[str]) -> None:
        sc = self.scenario
        tasks = []
        deadline = time.monotonic() + sc.seconds
        n = 0
        while time.monotonic() < deadline:
            exe = self.rng.choice(exes)
            kind = "Echo" if self.rng.random() < sc.echo_share else "Bump"
            eid = f"{sc.name}-e{n:05d}"
            tasks.append(asyncio.create_task(self._send(runner, writer, exe, kind, eid)))
            if self.rng.random() < sc.resend_share:
                tasks.append(asyncio.create_task(self._resend_later(runner, writer, exe, kind, eid)))
            n += 1
            await asyncio.sleep(1.0 / sc.rate)
        await asyncio.gather(*tasks)

    async def _resend_later(self, runner: Any, writer: HistoryWriter, exe: str, kind: str, eid: str) -> None:
        await asyncio.sleep(self.rng.uniform(0.05, 2.0))
        await self._send(runner, writer, exe, kind, eid)

    async def _resend_unknown(self, runner: Any, writer: HistoryWriter) -> None:
        """After the faults: send again, once, each event no send of which came back ok."""
        for eid, sent in sorted(self.sends.items()):
            if "ok" not in sent["outcomes"]:
                await self._send(runner, writer, sent["exe"], sent["kind"], eid)

    async def _reads(self, store: Any, exes: list[str], window: asyncio.Task[None]) -> None:
        """Load an execution now and then (the recording store writes each read)."""
        while not window.done():
            try:
                await store.load(self.rng.choice(exes))
            except pymongo.errors.PyMongoError:
                pass
            await asyncio.sleep(0.25)

    async def _kills(self) -> None:
        """SIGKILL a random worker at random moments of the window; start it again soon after."""
        sc = self.scenario
        kills = sorted(self._kill() for _ in range(sc.kills))
        begun = time.monotonic()
        for at, victim in kills:
            await asyncio.sleep(max(0.0, begun + at - time.monotonic()))
            worker = self.workers[victim]
            if not worker.alive:
                self._exited(worker)
            else:
                await worker.kill()
                self.outcome.kills += 1
            await asyncio.sleep(self.rng.uniform(0.3, 1.5))
            await worker.start()

    def _kill(self) -> tuple[float, str]:
        """A moment of the window and a worker to SIGKILL then: one that no fault on hosts
        targets from then until RESTART seconds later where the draws find one (a fault on a
        worker that is not running acts on nothing, and its evidence, read on that worker's
        own traffic, would rightly say so), else any."""
        sc = self.scenario
        for _ in range(100):
            at = self.rng.uniform(0.1, 0.9) * sc.seconds
            busy = {
                h
                for f in sc.faults
                if f.kind in LINK + PROXY and f.at < at + RESTART and at < f.at + f.hold
                for h in f.hosts
            }
            free = sorted(set(self.workers) - busy)
            if free:
                return at, self.rng.choice(free)
        return at, self.rng.choice(sorted(self.workers))

    def _exited(self, worker: WorkerProcess) -> None:
        gone = worker.ended_by_itself()
        if gone is not None:
            self.outcome.exits.append(gone)

    # --- the end -------------------------------------------------------------------------

    async def _quiet(self, store: AsyncMongoStore, db: Any, exes: list[str]) -> bool:
        for exe in exes:
            found = await store.load(exe)
            if found is None or found.active_path != "Settled" or found.deferred:
                return False
        if await store.pending_outbox() or await store.pending_spawns():
            return False
        if await store.due_timers(time.time() + 10 * 365 * 86400):
            return False
        return not await queued(db, PREFIX, self.transport)

    async def _settle(self, store: AsyncMongoStore, db: Any, exes: list[str]) -> bool:
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while time.monotonic() < deadline:
            try:
                if await self._quiet(store, db, exes):
                    return True
            except pymongo.errors.PyMongoError:
                pass
            await asyncio.sleep(0.5)
        return False

    async def _observe(self, store: AsyncMongoStore, db: Any, writer: HistoryWriter) -> None:
        """The final records: every execution as it is, and what is left to do."""
        for exe_id in sorted(await store.ids_with_prefix(f"{self.scenario.name}-")):
            exe = await store.load(exe_id)
            if exe is None:
                continue
            writer.write(
                {
                    "f": "final",
                    "type": "ok",
                    "exe": exe.id,
                    "definition": exe.definition_id,
                    "parent": exe.parent_id,
                    "version": exe.version,
                    "status": str(getattr(exe.status, "value", exe.status)),
                    "active_path": exe.active_path,
                    "context": exe.context,
                    "deferred": len(exe.deferred or []),
                }
            )
        writer.write(
            {
                "f": "drain",
                "type": "ok",
                "outbox": len(await store.pending_outbox()),
                "spawns": len(await store.pending_spawns()),
                "timers": len(await store.due_timers(time.time() + 10 * 365 * 86400)),
                "queued": await queued(db, PREFIX, self.transport),
                "leased": await leased(db, self.transport),
            }
        )


async def leased(db: Any, transport: str) -> int:
    """Groups of messages some worker holds a lease on (harel's locks, this package's queues)."""
    from harel.engine.schema import Names

    from harel_beanie.core.names import queue_names

    if transport == "harel":
        return int(await db[Names(PREFIX).transport_locks].count_documents({"token": {"$ne": None}}))
    return int(await db[queue_names(PREFIX)[0]].count_documents({"token": {"$ne": None}, "pending": {"$gt": 0}}))


#: how PyMongo names an operation lost to the network in a traceback's last line
NETWORK_ERRORS = re.compile(r"^pymongo\.errors\.(NetworkTimeout|AutoReconnect|ServerSelectionTimeoutError)\b", re.M)


def network_errors(log: Path) -> int:
    return len(NETWORK_ERRORS.findall(log.read_text(errors="replace")))


def late_operations(records: list[dict[str, Any]], seconds: float) -> int:
    """Operations whose completion came `seconds` or more after their invoke."""
    invoked = {(r["p"], r["i"]): r["t"] for r in records if r["type"] == "invoke"}
    return sum(
        1
        for r in records
        if r["type"] in ("ok", "fail", "unknown")
        and (r["p"], r["i"]) in invoked
        and r["t"] - invoked[(r["p"], r["i"])] >= seconds * 1e9
    )
