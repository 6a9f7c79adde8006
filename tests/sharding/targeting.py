"""Which shards a recorded command would reach on a cluster sharded as the shard plan says,
and which of MongoDB's rules for sharded collections it breaks: the audit's classifier.

No cluster runs beside the default suite, so the tests record the commands the store and
the transport send (PyMongo `CommandStartedEvent`s) and judge each one here, by a small
restatement of how a mongos routes, from the MongoDB manual:

- "Targeted Operations vs. Broadcast Operations" (Sharded Cluster Query Routing,
  https://www.mongodb.com/docs/manual/core/sharded-cluster-query-router/) and the shard
  key page's query isolation (https://www.mongodb.com/docs/manual/core/sharding-shard-key/):
  a mongos sends an operation only to the shards whose chunks can hold what its filter
  allows of the shard key. A filter fixing every field of the key reaches one chunk, so
  one shard; one fixing a prefix of a compound key (here `part`) reaches the chunks of that
  prefix's values; `$in` on a key field reaches the union of its values' chunks; a filter
  that does not bound the key's first field is broadcast to every shard holding chunks.
- "findAndModify: Sharded Collections"
  (https://www.mongodb.com/docs/manual/reference/command/findAndModify/#sharded-collections):
  before MongoDB 7.1 the query must hold an equality condition on the full shard key;
  7.1 and later accept one without it and run a two-phase write whose first phase is a
  query sent to every shard. Either way a claim without the key is a broadcast.
- updateOne / deleteOne on a sharded collection
  (https://www.mongodb.com/docs/manual/reference/method/db.collection.updateOne/#sharded-collections,
  .../db.collection.deleteOne/#sharded-collections): an upsert must hold an equality on the
  full shard key; a single-document update or delete without the full key must fix `_id`
  by equality (then it is sent to every shard, each asked for that one `_id`), otherwise
  servers before 7.1 refuse it and later ones broadcast a query first.
- Inserts are routed by each document's own shard key. Since MongoDB 4.4 a document may lack
  key fields (they count as null), so the server accepts it, but every such document lands
  in the chunk of null and the partition-scoped reads never find it: a violation here.

What "equality" means. The shard key extraction behind the write rules accepts `{f: v}` and
`{f: {$eq: v}}` only (the server's own description of it: SERVER-44422). Whether a
one-element `$in` passes it is not stated in the manual, and versions differ in when they
simplify one to an equality; `harel_beanie.core.partitions.route` sends it as a plain
equality once it knows it talks to a mongos. So here a one-element `$in` is a set of values
(it targets its value's chunks) but never the equality a write needs, and never enough for
`one-shard`. A regex, an operator document or a top-level `$or` are not equalities either;
`$and` at the top is read through. Where the classifier cannot prove a narrower target it
answers `all-shards`: the audit may over-report, never under-report.

Kinds, per operation (an `update` with three statements is three operations):
`one-shard` (equality on the full shard key), `partition-scoped` (the key's first field,
`part`, fixed or bounded by `$in`: the chunks of those partitions), `all-shards`, and
`unsharded` (a collection outside the plan: whole on the primary shard, so one shard).

Beside the kind, each operation on a partitioned collection says which partitions it can
reach (`parts`: the values its filter allows `part`, None for any): `part: {$in: [every
partition]}` is `partition-scoped` to a mongos, yet reaches every shard all the same. The
audit holds that set to what the caller owns (`tests.sharding.audit`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from bson.regex import Regex

from harel_beanie.core.partitions import SHARD_PLAN
from harel_beanie.store.sharding import plan_collections

ONE_SHARD = "one-shard"
PARTITION_SCOPED = "partition-scoped"
ALL_SHARDS = "all-shards"
UNSHARDED = "unsharded"

#: Commands that address no collection's documents, or that follow another (a getMore
#: continues the cursor of the find or aggregate that opened it, on the same shards).
SKIPPED = frozenset(
    {
        "hello",
        "ismaster",
        "ping",
        "endsessions",
        "buildinfo",
        "getmore",
        "killcursors",
        "createindexes",
        "listindexes",
        "dropindexes",
        "listcollections",
        "listdatabases",
        "create",
        "drop",
        "dropdatabase",
        "collmod",
        "serverstatus",
        "committransaction",
        "aborttransaction",
        "configurefailpoint",
        "dbstats",
        "collstats",
        "explain",
    }
)


@dataclass
class Classified:
    """One operation of a recorded command: the collection, where it goes, what it breaks."""

    command: str
    collection: str
    kind: str
    violations: list[str] = field(default_factory=list)
    #: what the kind rests on, for a failure message
    detail: str = ""
    #: the partitions the operation can reach (the values its filter allows `part`, or its
    #: documents carry); None: any partition, or a collection outside the plan
    parts: Optional[frozenset[Any]] = None

    @property
    def flagged(self) -> bool:
        """What a hot-path audit reports: a broken rule, or a broadcast."""
        return bool(self.violations) or self.kind == ALL_SHARDS


def _is_equality(condition: Any) -> bool:
    if isinstance(condition, (re.Pattern, Regex)):
        return False  # a pattern match, however it is written
    if isinstance(condition, Mapping):
        if set(condition) == {"$eq"}:
            return _is_equality(condition["$eq"])
        return not any(str(k).startswith("$") for k in condition)  # an embedded document's equality
    return True


def _values(condition: Any) -> Optional[int]:
    """How many values a condition allows for targeting: 1 for an equality, n for `$in` of n
    values, None when it is a range or anything else (no narrower target)."""
    if _is_equality(condition):
        return 1
    if isinstance(condition, Mapping) and set(condition) == {"$in"} and isinstance(condition["$in"], list):
        return len(condition["$in"]) or None
    return None


def _conditions(filter_: Optional[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Field -> the conditions a filter puts on it at the top (through `$and`)."""
    found: dict[str, list[Any]] = {}
    for key, condition in (filter_ or {}).items():
        if key == "$and" and isinstance(condition, list):
            for part in condition:
                if isinstance(part, Mapping):
                    for k, v in _conditions(part).items():
                        found.setdefault(k, []).extend(v)
        elif not key.startswith("$"):
            found.setdefault(key, []).append(condition)
    return found


def _allowed(condition: Any) -> Optional[frozenset[Any]]:
    """The values one condition allows a field, where it names them (an equality, `$in`)."""
    if _is_equality(condition):
        value = condition["$eq"] if isinstance(condition, Mapping) and set(condition) == {"$eq"} else condition
        return frozenset([_hashable(value)])
    if isinstance(condition, Mapping) and set(condition) == {"$in"} and isinstance(condition["$in"], list):
        return frozenset(_hashable(v) for v in condition["$in"])
    return None


def _hashable(value: Any) -> Any:
    return value if isinstance(value, (int, str, float, type(None))) else repr(value)


def _parts_of(conditions: Mapping[str, list[Any]], name: str) -> Optional[frozenset[Any]]:
    """The values every condition on `name` allows together (None: any value)."""
    found: Optional[frozenset[Any]] = None
    for condition in conditions.get(name, []):
        allowed = _allowed(condition)
        if allowed is not None:
            found = allowed if found is None else found & allowed
    return found


def _equal_on(conditions: Mapping[str, list[Any]], name: str) -> bool:
    return any(_is_equality(c) for c in conditions.get(name, []))


def _bounded(conditions: Mapping[str, list[Any]], name: str) -> bool:
    return any(_values(c) is not None for c in conditions.get(name, []))


@dataclass(frozen=True)
class _Key:
    fields: tuple[str, ...]

    def full_equality(self, conditions: Mapping[str, list[Any]]) -> bool:
        return all(_equal_on(conditions, f) for f in self.fields)

    def kind(self, conditions: Mapping[str, list[Any]]) -> str:
        if self.full_equality(conditions):
            return ONE_SHARD
        if _bounded(conditions, self.fields[0]):
            return PARTITION_SCOPED
        return ALL_SHARDS


def _keys(prefix: str) -> dict[str, _Key]:
    return {name: _Key(tuple(SHARD_PLAN[plan][0])) for plan, name in plan_collections(prefix).items()}


def classify(
    command_name: str, command: Mapping[str, Any], database: str, db_name: str, prefix: str
) -> list[Classified]:
    """The operations of one recorded command (`CommandStartedEvent.command_name`,
    `.command`, `.database_name`) on database `db_name` with collections under `prefix`;
    an empty list for a command that addresses no documents (see `SKIPPED`) or another
    database."""
    name = command_name.lower()
    if name in SKIPPED or database != db_name:
        return []
    collection = command.get(command_name)
    if not isinstance(collection, str):
        return []  # a database-wide aggregate and the like: nothing of the plan
    key = _keys(prefix).get(collection)
    if key is None:
        return [Classified(command_name, collection, UNSHARDED, detail="not in the shard plan: on the primary shard")]
    judge = _JUDGES.get(name)
    if judge is None:
        return [Classified(command_name, collection, ALL_SHARDS, detail="a command the classifier does not know")]
    return judge(command_name, collection, command, key)


def _read(command_name: str, collection: str, filter_: Any, key: _Key) -> Classified:
    conditions = _conditions(filter_ if isinstance(filter_, Mapping) else None)
    parts = _parts_of(conditions, key.fields[0])
    return Classified(command_name, collection, key.kind(conditions), detail=f"filter {filter_!r}", parts=parts)


def _find(name: str, collection: str, command: Mapping[str, Any], key: _Key) -> list[Classified]:
    return [_read(name, collection, command.get("filter"), key)]


def _count(name: str, collection: str, command: Mapping[str, Any], key: _Key) -> list[Classified]:
    return [_read(name, collection, command.get("query"), key)]


def _aggregate(name: str, collection: str, command: Mapping[str, Any], key: _Key) -> list[Classified]:
    pipeline = command.get("pipeline") or []
    first = pipeline[0] if pipeline and isinstance(pipeline[0], Mapping) else {}
    if "$match" in first:
        return [_read(name, collection, first["$match"], key)]
    return [Classified(name, collection, ALL_SHARDS, detail=f"pipeline starts with {next(iter(first), 'nothing')}")]


def _find_and_modify(name: str, collection: str, command: Mapping[str, Any], key: _Key) -> list[Classified]:
    result = _read(name, collection, command.get("query"), key)
    if not key.full_equality(_conditions(command.get("query"))):
        result.violations.append(
            f"findAndModify on {collection} without an equality on the full shard key {list(key.fields)}: "
            "refused before MongoDB 7.1, a two-phase write broadcasting a query after"
        )
    return [result]


def _update(name: str, collection: str, command: Mapping[str, Any], key: _Key) -> list[Classified]:
    results = []
    for i, statement in enumerate(command.get("updates") or []):
        filter_ = statement.get("q")
        conditions = _conditions(filter_)
        result = _read(name, collection, filter_, key)
        result.detail = f"updates[{i}]: " + result.detail
        full = key.full_equality(conditions)
        if statement.get("upsert") and not full:
            result.violations.append(f"updates[{i}]: an upsert on {collection} without the full shard key")
        elif not statement.get("multi") and not full and not _equal_on(conditions, "_id"):
            result.violations.append(
                f"updates[{i}]: a single-document update on {collection} with neither the full shard key "
                "nor an _id equality"
            )
        results.append(result)
    return results


def _delete(name: str, collection: str, command: Mapping[str, Any], key: _Key) -> list[Classified]:
    results = []
    for i, statement in enumerate(command.get("deletes") or []):
        filter_ = statement.get("q")
        conditions = _conditions(filter_)
        result = _read(name, collection, filter_, key)
        result.detail = f"deletes[{i}]: " + result.detail
        if statement.get("limit") == 1 and not key.full_equality(conditions) and not _equal_on(conditions, "_id"):
            result.violations.append(
                f"deletes[{i}]: a single-document delete on {collection} with neither the full shard key "
                "nor an _id equality"
            )
        results.append(result)
    return results


def _insert(name: str, collection: str, command: Mapping[str, Any], key: _Key) -> list[Classified]:
    """Each document goes to the shard of its own key (a batch is split by the mongos), so an
    insert whose every document carries the key is `one-shard` per document."""
    documents = command.get("documents") or []
    parts = frozenset(_hashable(d.get(key.fields[0])) for d in documents if key.fields[0] in d)
    result = Classified(name, collection, ONE_SHARD, detail="routed by each document's key", parts=parts)
    for i, document in enumerate(documents):
        missing = [f for f in key.fields if f not in document]
        if missing:
            result.violations.append(f"insert without {', '.join(missing)}: documents[{i}] of {collection}")
    return [result]


_JUDGES = {
    "find": _find,
    "count": _count,
    "distinct": _count,
    "aggregate": _aggregate,
    "findandmodify": _find_and_modify,
    "update": _update,
    "delete": _delete,
    "insert": _insert,
}


def classify_event(event: Any, db_name: str, prefix: str) -> list[Classified]:
    """`classify` for a PyMongo `CommandStartedEvent`."""
    return classify(event.command_name, event.command, event.database_name, db_name, prefix)
