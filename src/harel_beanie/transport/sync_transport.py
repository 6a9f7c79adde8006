"""`MongoTransport`: harel's sync `Transport` on the store's database, for harel's sync
distributed runtime. A thin shell: it makes the calls the operations of
`harel_beanie.transport.queues` ask for. A claim answers at once (harel's sync worker loop
does its own waiting).
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from harel.engine.transport import Lease
from harel.spec.states import Event

from harel_beanie.core import calls
from harel_beanie.core.calls import Flow, T
from harel_beanie.core.partitions import PartitionScope
from harel_beanie.store.connect import RetryPolicy, wait_for_server
from harel_beanie.store.dispatch import call, drive
from harel_beanie.store.settings import is_in_memory
from harel_beanie.store.sharding import routing_check
from harel_beanie.transport import claiming, queues
from harel_beanie.transport.queues import QueueLease, queue_state
from harel_beanie.transport.settings import (
    DEFAULT_CLOCK,
    Clock,
    TransportSettings,
    queue_collections,
    setup_indexes,
)


class MongoTransport:
    """harel's `Transport` on MongoDB: one queue document per group, each operation one round
    trip while the group's messages fit inline (every path's count:
    `harel_beanie.transport.queues`). `client` is a `pymongo.MongoClient` (or a mongomock
    one). A claim's `visibility` is at most a day and a nack's `delay` at most a week
    (`MAX_VISIBILITY`, `MAX_PARK` in `harel_beanie.transport.settings`): a lease or a park
    that outlives every worker would strand its group."""

    _setup_lock = threading.Lock()

    def __init__(
        self,
        client: Any,
        db_name: str = "harel",
        clock: Clock = DEFAULT_CLOCK,
        *,
        prefix: str = "harel",
        create_schema: bool = True,
        write_concern: Any = None,
        sharded: Optional[bool] = None,
        partitions: Optional[PartitionScope] = None,
    ) -> None:
        """`sharded` and `partitions` as for the store (`harel_beanie.MongoStore`)."""
        self.settings = TransportSettings(db_name, prefix, create_schema, write_concern)
        self._client = client
        self._colls = queue_collections(client, self.settings)
        self._state = queue_state(clock, sharded, partitions)
        self._detect_mongos = sharded is None and not is_in_memory(client)
        self._ready = False

    @property
    def partitions(self) -> PartitionScope:
        """The partitions this transport's claims read (see `harel_beanie.core.partitions`)."""
        return self._state.scope

    @classmethod
    def from_url(
        cls,
        url: str,
        db_name: str = "harel",
        *,
        retry: RetryPolicy = RetryPolicy(),
        client_options: Optional[dict[str, Any]] = None,
        **options: Any,
    ) -> "MongoTransport":
        """Build a `MongoClient` for `url`, wait until the server answers a ping (retrying per
        `retry`), and return a transport on it; `options` as for the class."""
        from pymongo import MongoClient

        settings = retry.client_settings(client_options)
        return cls(wait_for_server(lambda: MongoClient(url, **settings), url, retry), db_name, **options)

    def init(self) -> None:
        """Create the indexes (with `create_schema`) and read the database's partitions now
        instead of on first use."""
        with self._setup_lock:
            if self._ready:
                return
            if self._detect_mongos:
                self._state.scope.sharded = routing_check(self._client, self.settings.db_name, self.settings.prefix)
                self._detect_mongos = False
            self._drive(queues.setup(self._state, *setup_indexes(self.settings)))
            self._ready = True

    def _run(self, flow: Flow[T]) -> T:
        if not self._ready:
            self.init()
        return self._drive(flow)

    def _drive(self, flow: Flow[T]) -> T:
        return drive(flow, self._call)

    def _call(self, c: calls.Call) -> Any:
        return call(self._colls, c, self._state.scope)

    # --- Transport -----------------------------------------------------------------------------

    def publish(self, group_id: str, event: Event, priority: int = 0) -> None:
        self._run(queues.publish(self._state, group_id, event, priority))

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Optional[QueueLease]:
        return self._run(claiming.claim(self._state, worker_id, visibility, min_priority))

    def claim_many(self, worker_id: str, visibility: float, k: int, min_priority: int = 0) -> list[QueueLease]:
        """Up to `k` due groups at once, each leased as `claim` leases one, first in the claim
        order (`harel_beanie.transport.queues`, Rule 8); fewer (or none) when fewer are due."""
        return self._run(claiming.claim_many(self._state, worker_id, visibility, k, min_priority))

    def ack(self, lease: Lease) -> None:
        self._run(queues.ack(self._state, lease))

    def nack(self, lease: Lease, delay: float = 0.0) -> None:
        self._run(queues.nack(self._state, lease, delay))

    def close(self) -> None:
        self._client.close()
