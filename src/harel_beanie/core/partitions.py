"""Partitions: which slice of the database each execution and each queue group belongs to,
which slices a process works on, and the shard plan that maps slices to a cluster's shards.

Why this module exists. Background work (claims, relays, timer sweeps) must not read the
whole database from every worker: on a sharded cluster that is a query to every shard per
worker, and on one server it is O(all pending work) per pass. So every execution and every
queue group carries `part`, a pure function of its id, and a worker works only on the
partitions it owns (`harel_beanie.transport.ownership` leases them). The rules:

Rule 1. `part_of(id, P)` hashes the id's *family key*, the text before its first `:`.
        harel names every child `<parent id>:<path>:<n>`, so a whole fork family (a root
        and all its descendants) shares one key and one partition: the post-commit relay,
        which reads the handled execution's family, stays inside one partition. A root the
        user named `a:b` hashes as `a`: the key is only a hash input, never a parent link.
Rule 2. The hash is BLAKE2b of the key's UTF-8 bytes (lone surrogates passed through),
        read as a big-endian integer, modulo P. It depends on nothing but the bytes, so it
        is the same in every process, version and platform. `PARTITION_VECTORS` pins it.
Rule 3. P is fixed when the schema is created and recorded in the schema marker (`parts`).
        Every process reads it from there; changing it is a migration, since it moves ids.
Rule 4. On a sharded cluster every command that addresses one execution or one group
        names its partition beside its id (`route`), so mongos sends it to one shard; a
        sweep names the partitions it owns. On one server the same commands work without
        the extra field, and documents written before partitions existed (no `part`) are
        still found: there the owner of partition 0 also sweeps the documents with none.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

#: Partitions of a new database. A worker owns a share of them, so this bounds how many
#: workers share the background work (a 17th worker would own nothing) and how many shards
#: the queues spread over; on a cluster an idle worker's claim looks at each partition it
#: owns, so more partitions than workers cost idle round trips. Raise it with a migration.
DEFAULT_PARTITIONS = 16
#: The most a database may be created with: more partitions only add idle leases.
MAX_PARTITIONS = 4096

#: (family key, P, partition): fixed forever (Rule 2). A test checks `part_of` against them.
PARTITION_VECTORS = (
    ("order-1", 16, 13),
    ("", 16, 4),
    ("ord-0009", 64, 62),
    ("é", 16, 15),
    ("a:b:c", 16, 15),
)

#: The field every execution, queue document and overflow document carries.
PART = "part"

#: How each partitioned collection is sharded: the shard key, and the field of a filter the
#: partition is computed from. Executions: `{part, _id}`: a point operation names both (one
#: shard), a family or sweep read names `part` (the chunks of its partitions), and chunks
#: still split a large partition by `_id`. Queues and overflow: `{part}` alone, because a
#: claim is a `findAndModify` that must name the whole shard key without knowing the group
#: it will take (MongoDB before 7.1 refuses it otherwise; from 7.1 it broadcasts first).
#: They hold only waiting work, so P chunks are plenty. Every other collection (counters,
#: partition leases, samples, tombstone-free small ones) stays unsharded on the primary shard.
SHARD_PLAN: dict[str, tuple[dict[str, int], str]] = {
    "executions": ({PART: 1, "_id": 1}, "_id"),
    "queues": ({PART: 1}, "_id"),
    "overflow": ({PART: 1}, "g"),
}
#: The collection each call target of the flows addresses ("confirm" is the executions
#: collection read at majority).
TARGETS = {
    "executions": "executions",
    "confirm": "executions",
    "queues": "queues",
    "enqueue": "queues",
    "overflow": "overflow",
}


def family_key(execution_id: str) -> str:
    """The part of an id that all of its fork family shares (Rule 1)."""
    return execution_id.split(":", 1)[0]


def part_of(execution_id: str, parts: int) -> int:
    """The partition of an execution or queue group with this id (Rules 1 and 2)."""
    digest = hashlib.blake2b(family_key(execution_id).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % parts


@dataclass(frozen=True)
class Held:
    """One partition lease this process holds: its fencing epoch, and until when (by this
    process's clock, less the safety margin) it may act on the partition."""

    epoch: int
    until: float


@dataclass
class PartitionScope:
    """What a store or transport knows of partitions: how many there are, whether its
    commands go through a mongos (then every command names its partition), and which
    partitions it works on. `held` None means all of them (a store or transport used
    without ownership, as harel's own tests and a single app use it); otherwise only the
    leases in `held` still valid by `clock`."""

    parts: int = DEFAULT_PARTITIONS
    sharded: bool = False
    held: Optional[dict[int, Held]] = None
    clock: Callable[[], float] = time.time
    # the next partition a sharded claim looks at first (claims go round the partitions)
    turn: int = field(default=0, repr=False)

    def owned(self) -> Optional[dict[int, int]]:
        """Partition -> epoch of the leases valid now; None: every partition, unfenced."""
        if self.held is None:
            return None
        now = self.clock()
        return {p: h.epoch for p, h in self.held.items() if h.until > now}

    def part_of(self, execution_id: str) -> int:
        return part_of(execution_id, self.parts)

    def sweep_filter(self) -> Optional[dict[str, Any]]:
        """The filter a sweep adds to read only its own partitions: {} for all of them,
        None when it owns none now (the sweep reads nothing)."""
        owned = self.owned()
        if owned is None:
            return {PART: {"$in": list(range(self.parts))}} if self.sharded else {}
        if not owned:
            return None
        keys: list[Any] = sorted(owned)
        if 0 in owned and not self.sharded:
            keys.append(None)  # written before partitions existed: partition 0's (Rule 4)
        return {PART: {"$in": keys}}

    def family_filter(self, execution_id: str, *, partitioned: bool = True) -> dict[str, Any]:
        """The documents a key finds of `execution_id`'s own fork family: itself and every id
        below it (`<id>:...`), in its partition where the documents carry one (`partitioned`;
        always through a mongos). One `_id` range, from the id up to the id followed by `;`
        (the character after `:`), so the read is one index range (an `$or` of the id and its
        descendants' range would be two, and some servers scan the collection for an `$or`).
        The range also holds ids that merely start with this one followed by a character
        below `;` (`order-1` holds `order-10`): the caller drops them by the `parent_id`
        chain. With `part` fixed they are only those of the same partition, and the read
        names pending work, so they cost next to nothing."""
        family: dict[str, Any] = {"_id": {"$gte": execution_id, "$lt": execution_id + ";"}}
        if partitioned or self.sharded:
            family[PART] = self.part_of(execution_id)
        return family


def _equal_value(condition: Any) -> tuple[bool, Any]:
    """(True, v) if a filter condition is an equality on v (plain or a one-element `$in`)."""
    if isinstance(condition, Mapping):
        if set(condition) == {"$in"} and isinstance(condition["$in"], list) and len(condition["$in"]) == 1:
            return True, condition["$in"][0]
        if set(condition) == {"$eq"}:
            return True, condition["$eq"]
        return False, None
    return True, condition


def route(target: str, filter_: Optional[dict[str, Any]], scope: PartitionScope) -> Optional[dict[str, Any]]:
    """`filter_` as a mongos can send to one shard (Rule 4): when the commands go through a
    mongos and the filter fixes the id a partitioned collection computes `part` from, the
    filter also names `part`; a one-element `$in` on any top-level field becomes a plain
    equality (mongod plans both alike, and the shard-key extraction of a write needs an
    equality). Anything else is returned as it is."""
    collection = TARGETS.get(target)
    if not scope.sharded or filter_ is None or collection is None:
        return filter_
    routed: dict[str, Any] = {}
    for key, condition in filter_.items():
        equal, value = _equal_value(condition)
        routed[key] = value if equal and not key.startswith("$") else condition
    _, source = SHARD_PLAN[collection]
    if PART not in routed and source in filter_:
        equal, value = _equal_value(filter_[source])
        if equal and isinstance(value, str):
            routed[PART] = scope.part_of(value)
        elif isinstance(filter_[source], Mapping) and isinstance(filter_[source].get("$in"), list):
            parts = sorted({scope.part_of(v) for v in filter_[source]["$in"] if isinstance(v, str)})
            routed[PART] = parts[0] if len(parts) == 1 else {"$in": parts}
    return routed
