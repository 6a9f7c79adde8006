"""The pure-Mongo deployment stack the commands run: our `AsyncMongoStore` and a transport on
one server (this package's own, `harel_beanie.transport`, or harel's `AsyncMongoTransport`),
with their round trips counted.

Why this module exists: `demo`, `worker` and the dashboard's actions all open the store and
the transport for a `Target` (see `harel_beanie.deploy.where`), wait for the server with the
CLI's short retry policy, and want to know what the run cost in round trips. The `from_url`
constructors build their own clients, with no way to attach a PyMongo `CommandListener`, so
the clients are built here and handed to the store and the transport. Which transport is
`TRANSPORTS[0]` unless a command is told otherwise; `queued` counts what each holds, so a
command can refuse to start on one while messages wait in the other.

- `CommandCounter`: a PyMongo command listener counting commands by the label in the
  `LABEL` context variable. PyMongo's async client calls it in the task that sent the
  command, so a label set around a piece of work counts exactly that work's round trips.
  (Motor runs commands on a thread pool, where the label is not visible: the transport's
  counter only counts a total.)
- `CountingWorker`: harel's `AsyncWorker`, labelling each event it handles with the
  execution it is for, counting the events, and keeping each event's relay to that
  execution (see `harel_beanie.deploy.relay`).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections import Counter
from typing import Any, Callable, Optional, Sequence
from urllib.parse import parse_qsl, urlsplit

from harel.engine.aio.distributed import AsyncWorker
from harel.engine.flow import run_async
from harel.engine.schema import Names
from pymongo import monitoring
from pymongo.errors import ConfigurationError

from harel_beanie.core.errors import ConfigError
from harel_beanie.core.names import queue_names
from harel_beanie.core.partitions import PartitionScope
from harel_beanie.deploy import seam
from harel_beanie.deploy.relay import ScopedStore
from harel_beanie.deploy.where import Target
from harel_beanie.store.async_store import AsyncMongoStore
from harel_beanie.store.connect import await_server
from harel_beanie.transport.async_transport import AsyncMongoTransport
from harel_beanie.transport.documents import WAITING
from harel_beanie.transport.settings import DEFAULT_IDLE_WAIT

#: What the commands sent now are for: an execution id while a worker handles its event, a
#: phase name while a driver sends, None otherwise (claims, timer sweeps, idle polling).
LABEL: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar("harel_beanie_label", default=None)


class CommandCounter(monitoring.CommandListener):
    """Counts the commands a client sends, by the `LABEL` current when each was sent."""

    def __init__(self) -> None:
        self.by_label: Counter[Optional[str]] = Counter()
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        return sum(self.by_label.values())

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name in ("hello", "ismaster", "isMaster", "endSessions"):
            return  # the driver's own monitoring, not the work's
        label = LABEL.get()
        with self._lock:
            self.by_label[label] += 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


class CountingWorker(AsyncWorker):
    """harel's `AsyncWorker`, with two changes to how it handles one event (its `run` loop,
    claims, timer sweeps and everything it commits are harel's):

    - the relay that follows the event's commit sees only the handled execution's pending
      outbox and spawns (`harel_beanie.deploy.relay.ScopedStore`; why, see that module);
    - the event runs under `LABEL` = its execution id and is counted in `events` once handled.

    `executions` is the store's executions collection on an async client."""

    def __init__(self, *args: Any, executions: Any, **kwargs: Any) -> None:
        seam.check()  # the `_handle` below replaces a private method of harel's: refused if it is gone
        super().__init__(*args, **kwargs)
        self.executions = executions
        # the worker's time, which its relay sweeps take too: a child a sweep starts arms
        # its timers on the clock the worker fires them by
        self.clock: Callable[[], float] = kwargs.get("clock") or time.time
        self.events: Counter[str] = Counter()
        self.in_flight = 0

    @property
    def handled(self) -> int:
        return sum(self.events.values())

    async def _handle(self, lease: Any) -> bool:
        token = LABEL.set(lease.group_id)
        self.in_flight += 1
        try:
            ports = {"store": ScopedStore(self.store, lease.group_id), "transport": self.transport}
            result = await run_async(self.handle_flow(lease, combined_load=True), ports)
            self.events[lease.group_id] += 1
            return bool(result)
        finally:
            self.in_flight -= 1
            LABEL.reset(token)


def _client_error(target: Target, exc: BaseException) -> ConfigError:
    return ConfigError(f"cannot use {target.masked_url}: {exc}")


async def open_client(target: Target, *, listeners: Sequence[Any] = ()) -> Any:
    """A PyMongo `AsyncMongoClient` for the target, once the server answers a ping
    (retried per `target.retry`; `StoreUnavailable` naming the masked URL if it never does)."""
    from pymongo import AsyncMongoClient

    def make() -> Any:
        return AsyncMongoClient(target.url, **target.retry.client_settings({"event_listeners": list(listeners)}))

    try:
        return await await_server(make, target.url, target.retry)
    except (ConfigurationError, ValueError, TypeError) as exc:  # a malformed URL: no point retrying
        raise _client_error(target, exc) from None


async def open_store(
    target: Target, *, listeners: Sequence[Any] = (), create_schema: bool = True, **options: Any
) -> AsyncMongoStore:
    """Our async store on a new client for the target (see `open_client`)."""
    client = await open_client(target, listeners=listeners)
    return AsyncMongoStore(client, target.db, prefix=target.prefix, create_schema=create_schema, **options)


def open_sync_store(target: Target, **options: Any) -> Any:
    """Our sync `MongoStore` for the target (what harel's monitor reads through)."""
    from harel_beanie.store.sync_store import MongoStore

    try:
        return MongoStore.from_url(target.url, target.db, retry=target.retry, prefix=target.prefix, **options)
    except (ConfigurationError, ValueError, TypeError) as exc:
        raise _client_error(target, exc) from None


#: the transports a command can run on: this package's own (the default), or harel's
TRANSPORTS = ("beanie", "harel")


async def open_transport(
    target: Target,
    *,
    kind: str = TRANSPORTS[0],
    clock: Callable[[], float] = time.time,
    listeners: Sequence[Any] = (),
    create_schema: bool = True,
    idle_wait: float = DEFAULT_IDLE_WAIT,
    timers: Optional[Callable[[float], Any]] = None,
    partitions: Optional[PartitionScope] = None,
    prefetch: int = 1,
) -> Any:
    """The transport `kind` on the target's database and prefix, on a client of its own, its
        indexes created unless `create_schema` is off. This package's own waits up to `idle_wait`
        in a claim that finds nothing (woken by a change stream where the server has one, and at
        `timers`' next timer: pass the store's `next_timer`). `partitions`: the scope shared with
        the store and the process's partition owner, and `prefetch`: the worker's concurrency, the
    groups one claim may lease for its next claims (`harel_beanie.transport.prefetch`; this
    package's transport only). Call after
        `open_store`, which has already waited for the server."""
    if kind == "harel":
        return await _open_harel_transport(target, clock, listeners, create_schema)
    if kind != "beanie":
        raise ConfigError(f"unknown transport {kind!r}: one of {', '.join(TRANSPORTS)}")
    client = await open_client(target, listeners=listeners)
    transport = AsyncMongoTransport(
        client,
        target.db,
        clock,
        prefix=target.prefix,
        create_schema=create_schema,
        idle_wait=idle_wait,
        timers=timers,
        partitions=partitions,
        prefetch=prefetch,
    )
    await transport.init()
    return transport


async def _open_harel_transport(
    target: Target, clock: Callable[[], float], listeners: Sequence[Any], create_schema: bool
) -> Any:
    """harel's `AsyncMongoTransport` (Motor, as `harel[mongo]` ships it)."""
    import motor.motor_asyncio
    from harel.engine.aio_transport import AsyncMongoTransport as HarelTransport

    try:
        client: Any = motor.motor_asyncio.AsyncIOMotorClient(
            target.url, **target.retry.client_settings({"event_listeners": list(listeners), **_durable(target.url)})
        )
    except (ConfigurationError, ValueError, TypeError) as exc:
        raise _client_error(target, exc) from None
    transport = HarelTransport(client, target.db, clock=clock, prefix=target.prefix)
    db = client[target.db]
    if create_schema:
        await db[Names(target.prefix).transport_locks].create_index("available_at")
    # The transport mints message ids with an upserting $inc on one counter document. Two
    # first publishes racing to create it can get no document back on SecantusDB (the store
    # works around the same thing for its node counter); create it before any publish.
    await db[Names(target.prefix).transport_counters].update_one({"_id": "seq"}, {"$inc": {"n": 0}}, upsert=True)
    return transport


def _durable(url: str) -> dict[str, Any]:
    """harel's transport writes at its client's write concern, and a client's default is
    w: 1 without the journal: a publish acknowledged just before the server crashes can be
    lost when the server is killed. Unless the URL
    names a write concern of its own, the client writes as this package's store and
    transport do, w: majority, journaled."""
    named = {key.lower() for key, _ in parse_qsl(urlsplit(url).query)}
    return {} if named & {"w", "journal", "wtimeoutms"} else {"w": "majority", "journal": True}


async def queued(db: Any, prefix: str, kind: str) -> int:
    """How many messages wait in transport `kind`'s collections of `db` (an async database)."""
    if kind == "harel":
        return int(await db[Names(prefix).messages].count_documents({}))
    queues, overflow = queue_names(prefix)
    rows = await (
        await db[queues].aggregate(
            [
                {"$match": WAITING},
                {"$group": {"_id": None, "n": {"$sum": "$qn"}}},
            ]
        )
    ).to_list(None)
    return (int(rows[0]["n"]) if rows else 0) + int(await db[overflow].count_documents({}))


async def refuse_if_stranded(db: Any, prefix: str, kind: str) -> None:
    """Refuse to run on transport `kind` while messages wait in the other one: they would
    never be delivered. The message names the command that moves them."""
    other = TRANSPORTS[1] if kind == TRANSPORTS[0] else TRANSPORTS[0]
    n = await queued(db, prefix, other)
    if n:
        raise ConfigError(
            f"{n} message(s) wait in the {other} transport's collections, which --transport {kind} does not read: "
            f"move them with `harel-beanie migrate-transport {'up' if kind == 'beanie' else 'down'}` (workers "
            f"stopped), or run with --transport {other}"
        )


def transport_collections(prefix: str) -> list[str]:
    """The collections harel's Mongo transport keeps under `prefix`."""
    names = Names(prefix)
    return [names.messages, names.transport_locks, names.transport_counters]
