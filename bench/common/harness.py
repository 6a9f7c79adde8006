"""What every part of the benchmark shares: the workload (models/models/bench/parcel.stm), the stores and
runners it compares, the stores built as harel.worker and this package's from_url build them,
the records a run's figures are kept in, and the server and machine they come from. Kept in one
place so the measurements and the report name a runner, a store and a database state alike."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

import pymongo
from harel.definition.model import Definition
from harel.dsl import definition_from_dsl_file
from harel.engine.aio_store.mongo import AsyncMongoStore as HarelAsyncMongoStore
from harel.engine.schema import Names
from harel.engine.store.mongo import MongoStore as HarelMongoStore
from pymongo.write_concern import WriteConcern

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.core.documents import ExecutionDocument, index_models
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, part_of
from harel_beanie.deploy.embedded import EmbeddedServer

#: the benchmark's folder (bench/): RESULTS.md is there; the repository's top is its parent
HERE = Path(__file__).resolve().parents[1]
#: the workloads the benchmark runs, kept with the other models (models/bench/)
MODELS = HERE.parent / "models" / "bench"
MODEL = MODELS / "parcel.stm"
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
OWN_INDEXES = ("hb_pending_part", "hb_timer_pending")
# this store at harel's write concern (the client default, w:1, no journal wait) instead of its
# own default (w: majority, j: true): both stores at equal durability, in the same rounds
EQUAL = "beanie-w1"
EQUAL_RUNNERS = RUNNERS
# what this store aims for: its events/s on an empty database as a ratio to harel's store's,
# untraced / traced (a trace step adds no round trip to this store's commit)
TARGET = {False: 1.0, True: 1.2}
LABEL[EQUAL] = "harel-beanie at w:1"

T = TypeVar("T")


def split_runner(runner: str) -> tuple[str, bool]:
    """("worker-16+trace") -> ("worker-16", True)."""
    return runner.removesuffix(TRACED), runner.endswith(TRACED)


# the production stacks side by side: each store on its own transport, harel's AsyncMongoStore
# on harel's AsyncMongoTransport against harel-beanie's store on harel-beanie's transport, under
# harel's AsyncWorker; what a MongoDB team picks between
STACK_PREFIX = "stack-"
STACKS = (STACK_PREFIX + "harel", STACK_PREFIX + "beanie")
LABEL[STACKS[0]] = "harel's store + harel's transport"
LABEL[STACKS[1]] = "harel-beanie's store + transport"
STACK_BASE_RUNNERS = ("worker-1", "worker-16", "worker-64")
STACK_RUNNERS = STACK_BASE_RUNNERS + tuple(r + TRACED for r in STACK_BASE_RUNNERS)
RUNNER_LABEL.update(
    {"worker-64": "AsyncWorker, concurrency 64", "worker-64" + TRACED: "AsyncWorker, concurrency 64, traced"}
)
#: what the stack aims for, in every row: its events/s as a ratio to harel's stack's
STACK_TARGET = 1.5

STATES = ("empty", "stored")
EXECUTIONS = Names("harel").executions

# what each index declared in documents.py serves (the benchmark measures what it costs)
INDEX_PURPOSE = {
    "hb_definition": "list_executions(definition_id=...) keyset pages; dashboards per model",
    "hb_status": "list_executions(status=...) keyset pages",
    "hb_status_updated": "dashboard queries (harel_beanie.queries: failed since, running but silent); no store operation",
    "hb_parent": "list_executions(roots_only=True); the children of an execution",
    "hb_pending_part": "a relay pass's one read of pending outbox entries and spawns (documents flagged pending only, every partition or those a worker owns, or one family); acks without an owner hint; purge finds the entries addressed to it",
    "hb_timer_pending": "due_timers reads only documents with a timer due",
    "hb_quiet": "the stuck list (status, the backlog, /failed, /metrics) reads only executions waiting on nothing (partial: a key only while RUNNING with no timer and nothing pending, set by the counts' fold); no store operation",
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
    # every command sent meanwhile, whatever it addressed, by kind of work (bench/common/kinds.py)
    kinds: dict[str, int] = field(default_factory=dict)
    kind_seconds: dict[str, float] = field(default_factory=dict)  # ... and its time on the wire

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
    submit_wire: Wire = field(default_factory=Wire)  # ... and the submitting of their work (worker runners)

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
    trips: dict[str, dict[str, float]] = field(default_factory=dict)  # transport -> operation -> commands per message
    latencies: list[Any] = field(default_factory=list)  # latency.Latency, per setup
    profile: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # store -> (function, ms per event)

    def rates(self, runner: str, state: str, store: str) -> list[float]:
        return [c.rate for c in self.cells if (c.runner, c.state, c.store) == (runner, state, store)]

    def rate(self, runner: str, state: str, store: str) -> Optional[float]:
        r = self.rates(runner, state, store)
        return statistics.median(r) if r else None

    def paired(self, runner: str, state: str, store: str = "beanie", base: str = "harel") -> list[float]:
        """harel-beanie's rate over harel's (`store` over `base`), round by round: the two cells
        of a round ran back to back, so the machine's drift over the run cancels out of each ratio."""
        out = []
        for r in sorted({c.round for c in self.cells}):
            h = [c.rate for c in self.cells if (c.runner, c.state, c.store, c.round) == (runner, state, base, r)]
            b = [c.rate for c in self.cells if (c.runner, c.state, c.store, c.round) == (runner, state, store, r)]
            if h and b and h[0] > 0:
                out.append(b[0] / h[0])
        return out

    def ratio(self, runner: str, state: str, store: str = "beanie", base: str = "harel") -> Optional[float]:
        r = self.paired(runner, state, store, base)
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


# --- the run's options -----------------------------------------------------------------------


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
    stack_rounds: int = 3
    latency_events: int = 60
    timers: int = 20
    profile_events: int = 300


def one_server_options(p: argparse.ArgumentParser) -> None:
    """The options of a benchmark that runs on one server and writes one section: `--url`
    (a server to use instead of a fresh embedded one) and `--out` (the file the section goes in)."""
    p.add_argument("--url", help="a server to use instead of a fresh embedded one")
    p.add_argument("--out", default=str(HERE / "RESULTS.md"), help="the file the section goes in")


def on_one_server(url: Optional[str], run: Callable[[str], T]) -> T:
    """`run(url)` on the server at `url`, or on a fresh embedded one (stopped after)."""
    if url:
        return run(url)
    with EmbeddedServer() as server:
        return run(server.url)


#: how far apart cloned queue groups' claim keys are: publishes one after another get keys
#: that far apart or more, and copied keys would all tie, which a claim reads on past
#: (transport/claim_walk.py, BOOST): 1.2 s a claim with 10,000 queued, against 5 ms spaced
CLONE_KEY_STEP = 1e-3


def queue_clone(group: dict[str, Any], gid: str, head: dict[str, Any], at: float) -> dict[str, Any]:
    """A copy of queue document `group` as group `gid` (in its own partition), holding the
    one message `head`, its claim key `at`."""
    return {**group, "_id": gid, "part": part_of(gid, DEFAULT_PARTITIONS), "q": [head], "available_at": at}
