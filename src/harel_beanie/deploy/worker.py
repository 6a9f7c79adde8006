"""`Worker`: harel's distributed worker on this store and a transport, as one object an app
awaits in its own process, and what `harel-beanie worker` runs.

Why this module exists: a bare harel 0.9 `AsyncWorker` with more than one event in flight
lets two relays race for one child, and lets a relay create another machine's region with
the wrong definition (`harel_beanie.deploy.relay` says how). Running it safely takes the
scoped relay, a sweep of what relays leave behind, a share of the partitions, a loop that
rides out the server's outages and a clean stop: the pieces of `deploy.serving`, put
together here once, so that the command and an app's own process run the same code.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from typing import Any, Callable, Mapping, Optional

from beanie.exceptions import CollectionWasNotInitialized
from harel.engine.schema import Names
from pymongo.errors import ConnectionFailure

from harel_beanie.core.arguments import (
    BadArgument,
    BadArgumentType,
    require_bool,
    require_choice,
    require_int,
    require_seconds,
    require_str,
)
from harel_beanie.core.documents import bind
from harel_beanie.core.limits import MAX_IDLE_WAIT, MAX_VISIBILITY
from harel_beanie.core.partitions import PartitionScope
from harel_beanie.deploy import seam
from harel_beanie.deploy.relay import sweep
from harel_beanie.deploy.serving import first_look, give_back, run_through_outages, share, sweep_forever
from harel_beanie.deploy.stack import TRANSPORTS, CountingWorker, open_client, open_transport, refuse_if_stranded
from harel_beanie.deploy.where import DEFAULT_DB, Target
from harel_beanie.queries.samples import sample_if_due, samples_name
from harel_beanie.retention.archive import Archive, CollectionArchive
from harel_beanie.retention.schedule import (
    MAX_RETAIN_EVERY,
    RETAIN_EVERY,
    Retention,
    retain_forever,
    retention_of,
)
from harel_beanie.store.async_store import AsyncMongoStore
from harel_beanie.store.connect import RetryPolicy
from harel_beanie.store.settings import StoreSettings
from harel_beanie.transport.ownership import PartitionOwner
from harel_beanie.transport.prefetch import PREFETCH_CAP
from harel_beanie.transport.settings import DEFAULT_IDLE_WAIT

log = logging.getLogger("harel_beanie.worker")

#: the store's default collection prefix, as harel names collections
DEFAULT_PREFIX = "harel"


class Worker:
    """harel's `AsyncWorker` on an `AsyncMongoStore` and a transport of `url`'s database,
    safe at any `concurrency` on harel 0.9: each event's relay sees only its own
    execution's tree, a sweep every `sweep_every` seconds (and once at start) relays what a
    lost race or a crash left pending, each with its owner's definition.

    `await Worker(url, definitions).run(stop)` opens its own clients, claims and handles
    events until `stop` is set, lets those in flight finish, gives its partitions back and
    closes; cancel the task to stop at once (events in flight come back after their
    `visibility` lease). On this package's transport (`transport="beanie"`, the default) it
    leases a share of the database's partitions, so N workers divide the work; on harel's
    (`transport_kind="harel"`) every worker sweeps everything.

    `definitions`: the machines by id (`harel_beanie.deploy.load_models(dir)`). `wrap_store`
    and `wrap_transport` wrap what it opens (e.g. in
    `harel_beanie.telemetry.instrument.InstrumentedStore`). It binds the store's Beanie
    classes to its own client unless the app bound them to that database already (so the
    app's typed queries keep the app's client). `on_ready` is called once it
    claims; `say` gets the lines a person should read (a lost server, leftovers relayed),
    logged at WARNING by default.

    `retain` (an age with its unit, `"30d"`) makes it remove, about every `retain_every`
    seconds, the executions that finished longer ago than that, in the partitions it
    leases, through prune's flow (`harel_beanie.retention.schedule`): the counts stay exact
    and each removal goes once to `archive` (an `Archive`) or to the collection
    `archive_collection` of its database, when given. It leans on a private method of harel's `AsyncWorker`:
    building one checks that it is there, raising `HarelSeamChanged` naming what changed."""

    def __init__(
        self,
        url: str,
        definitions: Mapping[str, Any],
        *,
        db_name: str = DEFAULT_DB,
        prefix: str = DEFAULT_PREFIX,
        concurrency: int = 16,
        worker_id: Optional[str] = None,
        visibility: float = 30.0,
        trace: bool = False,
        trace_max: Optional[int] = None,
        create_schema: bool = True,
        transport_kind: str = TRANSPORTS[0],
        idle_wait: float = DEFAULT_IDLE_WAIT,
        sweep_every: float = 5.0,
        retry: RetryPolicy = RetryPolicy(),
        clock: Callable[[], float] = time.time,
        wrap_store: Optional[Callable[[Any], Any]] = None,
        wrap_transport: Optional[Callable[[Any], Any]] = None,
        on_ready: Optional[Callable[["Worker"], None]] = None,
        say: Optional[Callable[[str], None]] = None,
        retain: Optional[str] = None,
        retain_every: float = RETAIN_EVERY,
        archive: Optional[Archive] = None,
        archive_collection: Optional[str] = None,
    ) -> None:
        seam.check()  # before anything is opened: a harel without the seam is refused at once
        if not isinstance(definitions, Mapping) or not definitions:
            raise BadArgumentType("definitions", "a non-empty mapping of machine id to definition", definitions)
        url = require_str("url", url)
        db, prefix = _db_and_prefix(db_name, prefix)
        self.target = Target(url=url, db=db, prefix=prefix, retry=retry, source="url")
        self.definitions = dict(definitions)
        self.concurrency = require_int("concurrency", concurrency, low=1)
        self.worker_id = require_str("worker_id", worker_id or f"{socket.gethostname()}-{os.getpid()}")
        self.visibility = require_seconds("visibility", visibility, positive=True, high=MAX_VISIBILITY)
        self.trace = require_bool("trace", trace)
        self.trace_max = None if trace_max is None else require_int("trace_max", trace_max, low=0)
        self.create_schema = require_bool("create_schema", create_schema)
        self.transport_kind = require_choice("transport_kind", transport_kind, TRANSPORTS)
        self.idle_wait = require_seconds("idle_wait", idle_wait, positive=True, high=MAX_IDLE_WAIT)
        self.sweep_every = require_seconds("sweep_every", sweep_every, positive=True)
        self.clock, self._wrap_store, self._wrap_transport, self._on_ready = clock, wrap_store, wrap_transport, on_ready
        self._say = say or log.warning
        self._retain = _retention(retain, retain_every, archive, archive_collection)
        self.archive_collection = archive_collection
        self._worker: Optional[CountingWorker] = None
        self._transport: Any = None
        self._owner: Optional[PartitionOwner] = None

    @property
    def in_flight(self) -> int:
        """Events being handled now."""
        return self._worker.in_flight if self._worker is not None else 0

    @property
    def handled(self) -> int:
        """Events handled since `run` began."""
        return self._worker.handled if self._worker is not None else 0

    def describe(self) -> str:
        """How it runs, as `harel-beanie worker`'s ready line says it."""
        wakeups = getattr(self._transport, "wakeups", None)
        wake = (
            ""
            if wakeups is None
            else f" (idle claims wait up to {self.idle_wait:g}s, woken by a change stream where the server has one)"
        )
        return (
            f"concurrency {self.concurrency}, visibility {self.visibility:g}s, transport {self.transport_kind}{wake}, "
            f"trace {'on' if self.trace else 'off'}{share(self._owner)}{self._retaining()}"
        )

    def _retaining(self) -> str:
        """The retention, as the ready line says it."""
        if self._retain is None:
            return ""
        into = self.archive_collection or ("an archive" if self._retain.archive is not None else "no archive")
        return f", retaining {self._retain.age:g}s (every ~{self._retain.every:g}s, into {into})"

    async def run(self, stop: asyncio.Event) -> None:
        """Open the store and the transport, take a share of the partitions, relay what
        earlier workers left, and handle events until `stop` is set (see the class)."""
        target = self.target
        client = await open_client(target)
        # on this package's transport the store, the transport and the partition owner share
        # one scope: the leases the owner holds are what the sweeps and claims read
        scope = PartitionScope(held={}, clock=self.clock) if self.transport_kind == TRANSPORTS[0] else None
        options: dict[str, Any] = {} if self.trace_max is None else {"trace_max": self.trace_max}
        # the document classes (its per-minute sample reads through them) are bound to this
        # client only if the app has not bound them to this database itself: the app's typed
        # queries must not go through, nor outlive, a client the worker closes when it stops
        options["beanie"] = not _bound_to(bind(target.prefix)[0], target.db)
        store: Any = AsyncMongoStore(
            client, target.db, prefix=target.prefix, create_schema=self.create_schema, partitions=scope, **options
        )
        if self._wrap_store is not None:
            store = self._wrap_store(store)
        transport: Any = None
        try:
            transport = await self._start(store, client, scope)
            if scope is not None:
                self._owner = PartitionOwner(transport.partition_leases, self.worker_id, scope, clock=self.clock)
                await first_look(self._owner)
            if self._wrap_transport is not None:
                transport = self._wrap_transport(transport)
            self._transport = transport
            executions = client[target.db][Names(target.prefix).executions]
            self._worker = CountingWorker(
                store,
                transport,
                self.definitions,
                worker_id=self.worker_id,
                visibility=self.visibility,
                concurrency=self.concurrency,
                trace=self.trace,
                executions=executions,
                clock=self.clock,
            )
            await self._relay_leftovers(store, transport, executions)
            await self._serve(stop, store, transport, executions, self._worker)
        finally:
            await store.close()
            if transport is not None:
                await transport.close()

    async def _start(self, store: Any, client: Any, scope: Optional[PartitionScope]) -> Any:
        """The store's set-up, the stranded-messages check and the transport, tried again
        (per `retry`) when the connection breaks meanwhile: the first ping answering is no
        promise that the next command will, and a worker that exits on a blip during its
        start-up is one a supervisor must restart for nothing."""
        target = self.target
        failure: Optional[ConnectionFailure] = None
        for pause in target.retry.pauses():
            if failure is not None:
                self._say(
                    f"worker {self.worker_id}: lost the server while starting ({type(failure).__name__}); "
                    f"retrying in {pause:g}s"
                )
                await asyncio.sleep(pause)
            try:
                await store.init()
                await refuse_if_stranded(client[target.db], target.prefix, self.transport_kind)
                return await open_transport(
                    target,
                    kind=self.transport_kind,
                    create_schema=self.create_schema,
                    idle_wait=self.idle_wait,
                    timers=store.next_timer,
                    partitions=scope,
                    clock=self.clock,
                    prefetch=min(self.concurrency, PREFETCH_CAP),
                )
            except ConnectionFailure as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def _relay_leftovers(self, store: Any, transport: Any, executions: Any) -> None:
        """The pending work earlier workers left, relayed before this one starts claiming."""
        try:
            leftover = await sweep(store, transport, executions, self.definitions, self.clock, trace=self.trace)
        except ConnectionFailure:  # the periodic sweep will do it once the server answers again
            leftover = 0
        if leftover:
            self._say(
                f"worker {self.worker_id}: relayed the pending work of {leftover} execution(s) left by earlier workers"
            )

    async def _serve(self, stop: asyncio.Event, store: Any, transport: Any, executions: Any, worker: Any) -> None:
        """harel's loop, the sweeps and the leases, until `stop` (in-flight events finish) or
        a cancel (they come back after their lease; the partitions lapse by themselves)."""
        samples = executions.database[samples_name(self.target.prefix)]
        doc = bind(self.target.prefix)[0]
        sample = lambda: sample_if_due(doc, samples)  # noqa: E731
        every, trace = self.sweep_every, self.trace
        tasks = [
            asyncio.create_task(sweep_forever(store, transport, executions, worker, every, stop, trace, sample=sample)),
            asyncio.create_task(_wake_on(stop, transport)),
        ]
        if self._owner is not None:
            tasks.append(asyncio.create_task(self._owner.run(stop)))
        if self._retain is not None:
            tasks.append(asyncio.create_task(self._retain_forever(executions, stop)))
        if self._on_ready is not None:
            self._on_ready(self)
        cancelled = False
        try:
            await run_through_outages(worker, stop, self.worker_id, say=self._say)
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._owner is not None and not cancelled:
                await give_back(self._owner, self.worker_id)

    async def _retain_forever(self, executions: Any, stop: asyncio.Event) -> None:
        """Retention on its schedule, over the partitions this worker leases (its owner's scope)."""
        retention = self._retain
        assert retention is not None
        if self.archive_collection is not None:  # on this worker's own client
            archive = CollectionArchive(executions.database, self.archive_collection, clock=self.clock)
            retention = Retention(retention.age, archive, retention.every, retention.batch_size)
        scope = self._owner.state.scope if self._owner is not None else None
        await retain_forever(
            executions, retention, scope, stop, clock=self.clock, say=self._say, name=f"worker {self.worker_id}"
        )


def _retention(retain: Any, every: Any, archive: Optional[Archive], archive_collection: Any) -> Optional[Retention]:
    """The worker's retention, or None; an archive without a retention, or two archives, refused."""
    if archive_collection is not None:
        require_str("archive_collection", archive_collection)
        if archive is not None:
            raise BadArgument("archive_collection", "and archive: choose one")
    if retain is None:
        require_seconds("retain_every", every, positive=True, high=MAX_RETAIN_EVERY)
        for name, value in (("archive", archive), ("archive_collection", archive_collection)):
            if value is not None:
                raise BadArgument(name, "is where retention archives: give retain too (an age, e.g. '30d')")
        return None
    return retention_of(retain, every, archive)


def _bound_to(doc: Any, db: str) -> bool:
    """Whether Beanie has bound the document class `doc` to a database named `db`."""
    try:
        return bool(doc.get_pymongo_collection().database.name == db)
    except CollectionWasNotInitialized:
        return False


def _db_and_prefix(db_name: Any, prefix: Any) -> tuple[str, str]:
    """The database and prefix, refused (naming the argument) as the store would refuse them."""
    db, prefix = require_str("db_name", db_name), require_str("prefix", prefix)
    try:
        StoreSettings(db_name=db)
    except ValueError:
        raise BadArgument("db_name", f"{db!r} is not a MongoDB database name") from None
    try:
        Names(prefix)
    except ValueError as exc:
        raise BadArgument("prefix", f"{prefix!r} is refused: {exc}") from None
    return db, prefix


async def _wake_on(stop: asyncio.Event, transport: Any) -> None:
    """Once `stop` is set, wake a claim waiting for work, so the loop sees it now rather than
    at the end of its idle wait."""
    await stop.wait()
    getattr(transport, "wake", lambda: None)()
