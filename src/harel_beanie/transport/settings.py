"""A transport's settings and the collections they select, shared by the sync and the async
transport.

Concerns: a publish is the message's only copy once harel's relay acks the outbox entry it
came from, so it is written as the store writes a commit (`w="majority"`, `j=True` unless
given). A lease's writes (claim, ack, nack) are written at `w=1`: one lost in a failover only
lets the message be delivered again, which harel's dedupe window absorbs, and the store's
version check keeps a second handler from committing over the first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from harel.engine.schema import DEFAULT_PREFIX, Names
from pymongo.write_concern import WriteConcern

from harel_beanie.core.arguments import require_bool, require_seconds
from harel_beanie.core.documents import index_models
from harel_beanie.core.limits import MAX_IDLE_WAIT, MAX_POLL_INTERVAL
from harel_beanie.core.names import partition_collection, queue_names
from harel_beanie.store.settings import DEFAULT_WRITE_CONCERN, StoreSettings
from harel_beanie.transport.documents import bind_queues

#: what a lease's writes are acknowledged at (see the module docstring)
LEASE_WRITE_CONCERN = WriteConcern(w=1)
#: how long an idle claim waits for a wake-up before it answers "nothing" (the safety net under
#: the change stream: the worker's loop gets control back at least this often)
DEFAULT_IDLE_WAIT = 1.0
#: how often an idle claim looks again where the server has no change streams
DEFAULT_POLL_INTERVAL = 0.05


@dataclass(frozen=True)
class TransportSettings:
    db_name: str = "harel"
    prefix: str = DEFAULT_PREFIX
    create_schema: bool = True
    write_concern: Optional[WriteConcern] = None  # a publish's; None: DEFAULT_WRITE_CONCERN
    idle_wait: float = 0.0  # 0: a claim answers at once (harel's own behaviour)
    poll_interval: float = DEFAULT_POLL_INTERVAL

    def __post_init__(self) -> None:
        # the database and prefix rules are the store's: one place decides them
        StoreSettings(self.db_name, self.prefix)
        require_bool("create_schema", self.create_schema)
        queue_names(self.prefix)
        require_seconds("idle_wait", self.idle_wait, high=MAX_IDLE_WAIT)
        require_seconds("poll_interval", self.poll_interval, positive=True, high=MAX_POLL_INTERVAL)
        if self.write_concern is not None and not self.write_concern.acknowledged:
            raise ValueError(f"write_concern must be acknowledged (not w=0), got {self.write_concern!r}")


def queue_collections(client: Any, s: TransportSettings) -> dict[str, Any]:
    """The collections a transport's calls address, with their concerns applied."""
    queues, overflow = bind_queues(s.prefix)
    db = client[s.db_name]
    durable = {"write_concern": s.write_concern or DEFAULT_WRITE_CONCERN}
    return {
        "queues": db.get_collection(queues.Settings.name, write_concern=LEASE_WRITE_CONCERN),
        "enqueue": db.get_collection(queues.Settings.name, **durable),
        "overflow": db.get_collection(overflow.Settings.name, **durable),
        # the schema marker (how many partitions) and the workers' partition leases
        "counters": db.get_collection(Names(s.prefix).counters, **durable),
        "partitions": db.get_collection(partition_collection(s.prefix), **durable),
    }


Clock = Callable[[], float]
DEFAULT_CLOCK: Clock = time.time


def setup_indexes(s: TransportSettings) -> tuple[list[Any], list[Any]]:
    """The indexes a transport's set-up creates: its documents' own with `create_schema`, none
    without."""
    if not s.create_schema:
        return [], []
    queue_cls, overflow_cls = bind_queues(s.prefix)
    return index_models(queue_cls), index_models(overflow_cls)
