"""The transport's schema: its Beanie documents, their indexes and the bounds of a queue.

Why this module exists: the transport (`harel_beanie.transport`) keeps its queues in the same
database, under the same prefix, as the store, and its collections are declared the way the
store's are (`harel_beanie.core.documents`): once, as Beanie documents, with each index
naming the read it serves, so the transport, the migrations and an app's own queries take
them from one place.

A queue is one document per group (per execution): its waiting messages inline, in order,
up to `INLINE_MAX` of them and `INLINE_BYTES` of their JSON, with the group's lease (`token`,
`available_at`) and priority beside them. That is what makes each operation one round trip
(a claim two) while a group's messages fit inline:
a publish is one conditional upsert that appends, a claim a read of a window of due groups
with their heads and one conditional update that leases one (or k at once), an ack one
update that pops it. A group whose backlog
outgrows the inline bounds keeps its later messages in `OverflowDocument`s, one each, in
publish order, until it drains: every document stays bounded whatever the backlog.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, ClassVar, Optional

from beanie import Document
from harel.engine.schema import DEFAULT_PREFIX
from pydantic import BaseModel, ConfigDict, Field
from pymongo import ASCENDING, IndexModel

from harel_beanie.core.arguments import require_str
from harel_beanie.core.documents import bound_class
from harel_beanie.core.names import queue_names

#: A group keeps at most this many messages inline; later ones go to overflow documents.
INLINE_MAX = 64
#: ... and at most this many bytes of their JSON (a larger single message goes to overflow).
INLINE_BYTES = 256 * 1024
#: A drained queue document (no message waiting) is removed by the server this long after
#: its last ack, where the server runs TTL monitors; until then it is a few dozen bytes.
DRAINED_TTL_SECONDS = 24 * 3600

#: The filter of the documents holding a message: the claim reads only these.
WAITING: dict[str, Any] = {"pending": {"$gt": 0}}


class QueuedMessage(BaseModel):
    """One message waiting inline: the event as harel's `Event.model_dump_json` gives it."""

    e: str


class QueueDocument(Document):
    """One group's queue (a group is an execution, by harel's transport contract)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(alias="_id")  # type: ignore[assignment]
    q: list[QueuedMessage] = []  # the head of the group's FIFO, in order
    qn: int = 0  # messages in `q`
    qb: int = 0  # bytes of their JSON
    pending: int = 0  # the inline messages, plus one while the group spills (it stays claimable)
    spill: bool = False  # true from the first message sent to overflow until a claim finds it drained
    spilled: int = 0  # overflow documents the group has been told of (a claim's reset waits for none new)
    available_at: float = 0.0  # claimable from then on (epoch seconds): a lease or a park ends
    token: Optional[str] = None  # the lease: who holds the head
    priority: int = 0  # set by the publish that finds the group drained, as harel's transports do
    acked: int = 0  # messages acked ever: the head's ordinal is `acked + 1` (`Lease.seq`)
    published: int = 0  # messages published ever
    wake: int = 0  # bumped by every write that makes the group claimable now (the streams' cue)
    part: Optional[int] = None  # the group's partition (`harel_beanie.core.partitions`), its execution's
    ep: Optional[int] = None  # on a cluster: the epoch of the partition lease its last claim held (a fence)

    class Settings:
        name = queue_names()[0]
        use_state_management = False
        validate_on_save = False
        indexes: ClassVar[list[IndexModel]] = [
            # claim: a window of the claim key among the groups holding a message, read with
            # exactly this partial filter, which is what SecantusDB plans a range on
            # (transport.queues, Rule 3; its `priority` is read by no filter now, and stays
            # for the databases that have it: a new key would be a new index to build)
            IndexModel(
                [("available_at", ASCENDING), ("priority", ASCENDING)],
                name="hb_claim",
                partialFilterExpression=WAITING,
            ),
            # claim through a mongos: a window of one partition's claim key (Rule 7)
            IndexModel(
                [("part", ASCENDING), ("available_at", ASCENDING), ("priority", ASCENDING)],
                name="hb_part_claim",
                partialFilterExpression=WAITING,
            ),
            # a drained queue goes once it has been quiet for a day (where TTL monitors run)
            IndexModel(
                [("touched", ASCENDING)],
                name="hb_drained_ttl",
                expireAfterSeconds=DRAINED_TTL_SECONDS,
                partialFilterExpression={"pending": 0},
            ),
        ]


class OverflowDocument(Document):
    """One message of a group whose backlog outgrew its queue document, in publish order
    (`_id` is an ObjectId: increasing for each publisher). `tok` is the lease that holds it
    while it is the group's head."""

    model_config = ConfigDict(extra="allow")

    g: str
    e: str
    tok: Optional[str] = None
    part: Optional[int] = None  # its group's partition

    class Settings:
        name = queue_names()[1]
        use_state_management = False
        validate_on_save = False
        indexes: ClassVar[list[IndexModel]] = [
            # the head of a group's overflow: its oldest message
            IndexModel([("g", ASCENDING), ("_id", ASCENDING)], name="hb_overflow_fifo"),
        ]


def bind_queues(prefix: str = DEFAULT_PREFIX) -> tuple[type[QueueDocument], type[OverflowDocument]]:
    """The queue document classes for the collections under `prefix` (as `bind` does for the
    store's): pass them to your own `init_beanie` to query the queues."""
    # checked before the cache, which would refuse a dict as unhashable without naming it
    return _bind_queues(require_str("prefix", prefix))


@lru_cache(maxsize=None)
def _bind_queues(prefix: str) -> tuple[type[QueueDocument], type[OverflowDocument]]:
    queues, overflow = queue_names(prefix)
    if prefix == DEFAULT_PREFIX:
        return QueueDocument, OverflowDocument
    return bound_class(QueueDocument, prefix, queues), bound_class(OverflowDocument, prefix, overflow)
