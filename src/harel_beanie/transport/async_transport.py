"""`AsyncMongoTransport`: harel's `AsyncTransport` on the store's database, for `AsyncWorker`,
harel's distributed runtime and `harel-beanie worker`. A thin shell: it awaits the calls the
operations of `harel_beanie.transport.queues` ask for, and, given `idle_wait`, lets a claim
that finds nothing wait for a wake-up (`harel_beanie.transport.wakeups`) instead of
answering at once, so an idle worker neither polls nor answers a publish late.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Optional

from harel.engine.transport import Lease
from harel.spec.states import Event
from pymongo.errors import PyMongoError

from harel_beanie.core import calls
from harel_beanie.core.arguments import require_int
from harel_beanie.core.calls import Flow, T
from harel_beanie.core.documents import bind
from harel_beanie.core.partitions import PartitionScope
from harel_beanie.store.connect import RetryPolicy, await_server
from harel_beanie.store.dispatch import acall, adrive, maybe_await
from harel_beanie.store.settings import is_in_memory
from harel_beanie.store.sharding import routing_check_async
from harel_beanie.transport import claiming, queues
from harel_beanie.transport.prefetch import Prefetch
from harel_beanie.transport.queues import QueueLease, queue_state
from harel_beanie.transport.settings import (
    DEFAULT_CLOCK,
    Clock,
    TransportSettings,
    queue_collections,
    setup_indexes,
)
from harel_beanie.transport.wakeups import Wakeups, transport_pipeline

#: the store's next timer after a time (`AsyncMongoStore.next_timer`): an idle claim wakes then
TimerSource = Callable[[float], Awaitable[Optional[float]]]


class AsyncMongoTransport:
    """harel's `AsyncTransport` on MongoDB: one queue document per group, each operation one
    round trip while the group's messages fit inline (every path's count:
    `harel_beanie.transport.queues`).

    `client` is PyMongo's `AsyncMongoClient` (or a Motor / mongomock-motor client). `idle_wait`
    (seconds, default 0: answer at once, as harel's transports do) lets a claim that finds
    nothing wait for a publish, the end of a lease or park, or `timers()`'s next timer; the
    production stack (`harel_beanie.deploy.stack`) sets it. `timers` is the store's
    `next_timer`. `sharded` and `partitions` as for the store (`harel_beanie.AsyncMongoStore`).
    `prefetch` (default 1: none) is the worker's concurrency: a claim that finds no lease
    kept leases as many groups as the worker has slots free in one claim (round trips:
    `harel_beanie.transport.queues`, Rule 8) and keeps the others for its next claims
    (`harel_beanie.transport.prefetch`); `close()` gives back those never handed out.

    Every lease, park and wait is bounded (`harel_beanie.transport.settings`): a claim's
    `visibility` at most a day, a nack's `delay` at most a week, `idle_wait` at most an hour
    and `poll_interval` at most a minute; a larger value is refused naming it."""

    def __init__(
        self,
        client: Any,
        db_name: str = "harel",
        clock: Clock = DEFAULT_CLOCK,
        *,
        prefix: str = "harel",
        create_schema: bool = True,
        write_concern: Any = None,
        idle_wait: float = 0.0,
        poll_interval: Optional[float] = None,
        timers: Optional[TimerSource] = None,
        sharded: Optional[bool] = None,
        partitions: Optional[PartitionScope] = None,
        prefetch: int = 1,
    ) -> None:
        extra = {} if poll_interval is None else {"poll_interval": poll_interval}
        self.settings = TransportSettings(db_name, prefix, create_schema, write_concern, idle_wait, **extra)
        self._client = client
        self._colls = queue_collections(client, self.settings)
        self._state = queue_state(clock, sharded, partitions)
        self._detect_mongos = sharded is None and not is_in_memory(client)
        self._timers = timers
        self._ready = False
        self._setup_lock: Optional[asyncio.Lock] = None
        self._woken = 0  # calls of `wake()`: a waiting claim that sees it change returns
        self._prefetch = Prefetch(require_int("prefetch", prefetch, low=1, high=queues.MAX_PREFETCH))
        self.wakeups: Optional[Wakeups] = None
        if idle_wait > 0:
            executions = bind(prefix)[0].Settings.name  # type: ignore[attr-defined]
            pipeline = transport_pipeline(self._colls["queues"].name, executions)
            self.wakeups = Wakeups(client[db_name], pipeline, self.settings.poll_interval)

    @classmethod
    async def from_url(
        cls,
        url: str,
        db_name: str = "harel",
        *,
        retry: RetryPolicy = RetryPolicy(),
        client_options: Optional[dict[str, Any]] = None,
        **options: Any,
    ) -> "AsyncMongoTransport":
        """Build an `AsyncMongoClient` for `url`, wait until the server answers a ping
        (retrying per `retry`), and return a transport on it; `options` as for the class."""
        from pymongo import AsyncMongoClient

        settings = retry.client_settings(client_options)
        return cls(await await_server(lambda: AsyncMongoClient(url, **settings), url, retry), db_name, **options)

    async def init(self) -> None:
        """Create the indexes (with `create_schema`) and start the wake-ups, now instead of on
        first use."""
        if self._setup_lock is None:
            self._setup_lock = asyncio.Lock()
        async with self._setup_lock:
            if self._ready:
                return
            if self._detect_mongos:
                db, prefix = self.settings.db_name, self.settings.prefix
                self._state.scope.sharded = await routing_check_async(self._client, db, prefix)
                self._detect_mongos = False
            await self._drive(queues.setup(self._state, *setup_indexes(self.settings)))
            if self.wakeups is not None:
                self.wakeups.start()
            self._ready = True

    async def _run(self, flow: Flow[T]) -> T:
        if not self._ready:
            await self.init()
        return await self._drive(flow)

    async def _drive(self, flow: Flow[T]) -> T:
        return await adrive(flow, self._call)

    async def _call(self, c: calls.Call) -> Any:
        return await acall(self._colls, c, self._state.scope)

    @property
    def partition_leases(self) -> Any:
        """The collection of the workers' partition leases (`harel_beanie.transport.ownership`)."""
        return self._colls["partitions"]

    @property
    def partitions(self) -> PartitionScope:
        """The partitions this transport's claims read (see `harel_beanie.core.partitions`)."""
        return self._state.scope

    def wake(self) -> None:
        """Make every claim waiting in this process look once more and return (a shutdown, or
        a test's clock that moved: the worker then sweeps its timers)."""
        if self.wakeups is not None:
            self._woken += 1
            self.wakeups.notify()

    def _notify(self) -> None:
        """Something this process did may have made work: its waiting claims look again."""
        if self.wakeups is not None:
            self.wakeups.notify()

    # --- AsyncTransport ------------------------------------------------------------------------

    async def publish(self, group_id: str, event: Event, priority: int = 0) -> None:
        await self._run(queues.publish(self._state, group_id, event, priority))
        self._notify()  # a claimer of this process need not wait for the stream

    async def claim_many(self, worker_id: str, visibility: float, k: int, min_priority: int = 0) -> list[QueueLease]:
        """Up to `k` due groups at once, each leased as `claim` leases one, first in the claim
        order; fewer (or none) when fewer are due. It does not wait."""
        return await self._run(claiming.claim_many(self._state, worker_id, visibility, k, min_priority))

    async def _claim_now(self, worker_id: str, visibility: float, min_priority: int) -> Optional[QueueLease]:
        """One lease: a prefetched one that suits, else a claim of as many groups as the
        worker has slots free (`prefetch`), the rest kept for its next claims."""
        now = self._state.clock()
        lease = self._prefetch.take(worker_id, visibility, min_priority, now)
        if lease is not None:
            return lease
        k = self._prefetch.room(now)
        leases = await self._run(claiming.claim_many(self._state, worker_id, visibility, k, min_priority))
        return self._prefetch.keep(worker_id, leases, now + visibility)

    async def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Optional[QueueLease]:
        waiting = self.wakeups
        seen = waiting.generation if waiting is not None else 0
        woken = self._woken
        lease = await self._claim_now(worker_id, visibility, min_priority)
        if lease is not None or waiting is None:
            return lease
        # wait, at most until the next lease or park ends, the store's next timer is due, or
        # `idle_wait` passes (measured on the monotonic clock: the transport's own clock may be
        # a test's, which only moves when told)
        now = self._state.clock()
        budget = self.settings.idle_wait
        ends = await self._run(queues.next_due(self._state))
        timer = await self._timers(now) if self._timers is not None else None
        for at in (ends, timer):
            if at is not None:
                budget = min(budget, at - now)
        until = time.monotonic() + budget
        while (left := until - time.monotonic()) > 0:
            await waiting.wait(seen, left)  # a notification, or the poll interval without a stream
            seen = waiting.generation
            lease = await self._claim_now(worker_id, visibility, min_priority)
            if lease is not None or self._woken != woken:  # `wake()`: back to the caller now
                return lease
        return None

    async def ack(self, lease: Lease) -> None:
        self._prefetch.done(lease)
        await self._run(queues.ack(self._state, lease))
        self._notify()  # the group may hold a message published while its head was in flight

    async def nack(self, lease: Lease, delay: float = 0.0) -> None:
        self._prefetch.done(lease)
        await self._run(queues.nack(self._state, lease, delay))
        if not delay:
            self._notify()

    async def close(self) -> None:
        for lease in self._prefetch.drain():
            try:  # back to the queue now, not when its lease ends
                await self._run(queues.nack(self._state, lease))
            except PyMongoError:
                pass  # it comes back when its lease ends
        if self.wakeups is not None:
            await self.wakeups.close()
        await maybe_await(self._client.close())
