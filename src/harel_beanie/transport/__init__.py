"""harel's transport on the store's database: `MongoTransport` (sync) and
`AsyncMongoTransport` (async), each operation one round trip while a group's messages fit
inline (the round trips of every path: `harel_beanie.transport.queues`), FIFO per group with one
message of a group in flight, leases that expire, parked nacks and priorities, on bounded
documents whatever a group's backlog; idle async claims wake on a change stream where the
server has one. The queues are Beanie documents beside the store's
(`harel_beanie.transport.documents`: `bind_queues(prefix)` for your own queries).

    store = await AsyncMongoStore.from_url(url, "shop")
    transport = await AsyncMongoTransport.from_url(url, "shop", idle_wait=1.0, timers=store.next_timer)
    worker = AsyncWorker(store, transport, definitions)
"""

from harel_beanie.transport.async_transport import AsyncMongoTransport
from harel_beanie.transport.documents import OverflowDocument, QueueDocument, bind_queues
from harel_beanie.transport.queues import QueueLease
from harel_beanie.transport.sync_transport import MongoTransport

__all__ = [
    "AsyncMongoTransport",
    "MongoTransport",
    "OverflowDocument",
    "QueueDocument",
    "QueueLease",
    "bind_queues",
]
