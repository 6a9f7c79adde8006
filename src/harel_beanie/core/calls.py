"""The I/O vocabulary: the database calls a store operation asks its store to make.

Each store operation is written once, in `harel_beanie.core.flows`, as a generator that yields
these calls and receives their results. The sync store makes each call with PyMongo's
`MongoClient`, the async store awaits it with `AsyncMongoClient` (or Motor), both through
`harel_beanie.store.dispatch`; neither holds any logic of its own. The result each call sends
back is given on the class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generator, Literal, Optional, TypeVar, Union

# "confirm" is the executions collection read at the level writes are acknowledged at (the
# reads that decide a commit landed or an event was seen); "leases" is the counters
# collection at majority, whatever the store's concerns (the seq leases, harel_beanie.core.seqs);
# "queues" and "overflow" are the transport's (harel_beanie.transport.documents), "enqueue"
# the queues at the concern publishes are written with (a lease's writes need less);
# "partitions" the workers' partition leases (harel_beanie.transport.ownership); "counts" the
# executions' counter documents, one per partition (harel_beanie.core.counting)
Target = Literal["executions", "confirm", "counters", "leases", "queues", "enqueue", "overflow", "partitions", "counts"]


@dataclass(frozen=True)
class FindOne:
    """-> the document (a dict) or None."""

    target: Target
    filter: dict[str, Any]
    projection: Optional[dict[str, Any]] = None


@dataclass(frozen=True)
class Find:
    """-> a list of documents."""

    target: Target
    filter: dict[str, Any]
    projection: Optional[dict[str, Any]] = None
    sort: Optional[list[tuple[str, int]]] = None
    limit: int = 0


@dataclass(frozen=True)
class InsertOne:
    """-> None; raises DuplicateKeyError when the `_id` is taken."""

    target: Target
    document: dict[str, Any]


@dataclass(frozen=True)
class UpdateOne:
    """-> the matched count (0 or 1). `update` may be an aggregation pipeline (a list)."""

    target: Target
    filter: dict[str, Any]
    update: Union[dict[str, Any], list[dict[str, Any]]]
    upsert: bool = False


@dataclass(frozen=True)
class UpdateMany:
    """-> the matched count. `update` may be an aggregation pipeline (a list)."""

    target: Target
    filter: dict[str, Any]
    update: Union[dict[str, Any], list[dict[str, Any]]]


@dataclass(frozen=True)
class Aggregate:
    """-> a list of documents: the pipeline's output (its first stage a `$match`, which
    is what names the partitions it reads)."""

    target: Target
    pipeline: list[dict[str, Any]]


@dataclass(frozen=True)
class ReplaceOne:
    """-> the matched count (0 or 1)."""

    target: Target
    filter: dict[str, Any]
    replacement: dict[str, Any]


@dataclass(frozen=True)
class DeleteOne:
    """-> the deleted count (0 or 1)."""

    target: Target
    filter: dict[str, Any]


@dataclass(frozen=True)
class BulkWrite:
    """-> the documents matched by its updates plus those deleted by its deletes. One
    unordered bulk write of `UpdateOne`s and `DeleteOne`s on `target` (each op's own
    target is ignored): one round trip for a batch of independent conditional writes, each
    still atomic on its own document and none waiting for another."""

    target: Target
    ops: tuple[Union[UpdateOne, DeleteOne], ...]


@dataclass(frozen=True)
class Increment:
    """`find_one_and_update` with `$inc` and upsert -> the counter document after it, or
    None (SecantusDB may answer None to a concurrent first upsert)."""

    target: Target
    id: str
    field: str
    by: int = 1


@dataclass(frozen=True)
class FindOneAndUpdate:
    """-> the document before the update (or after it, with `after`), projected, or None
    when nothing matched. The first match in `sort` order is the one updated."""

    target: Target
    filter: dict[str, Any]
    update: dict[str, Any]
    sort: Optional[list[tuple[str, int]]] = None
    projection: Optional[dict[str, Any]] = None
    after: bool = False
    upsert: bool = False


@dataclass(frozen=True)
class CreateIndexes:
    """-> None; creates the indexes declared on the document classes (idempotent)."""

    target: Target
    indexes: list[Any] = field(default_factory=list)


Call = Union[
    FindOne,
    Find,
    InsertOne,
    UpdateOne,
    ReplaceOne,
    UpdateMany,
    DeleteOne,
    BulkWrite,
    Increment,
    FindOneAndUpdate,
    CreateIndexes,
    Aggregate,
]
T = TypeVar("T")
Flow = Generator[Call, Any, T]
