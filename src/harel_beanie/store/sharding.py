"""Whether a client talks to a mongos, and whether the cluster's collections are sharded as
the shard plan (`harel_beanie.core.partitions.SHARD_PLAN`) says.

Why this module exists: a store or transport on a sharded cluster only reaches one shard
per operation if each partitioned collection is sharded on the plan's key, and the cluster
says nothing when it is not (a command on another key is broadcast, or, for a claim's
`findAndModify` before MongoDB 7.1, refused deep inside a run). So the plan is checked
where it can be checked: here, once, from what `config.collections` records, with one
message per problem naming the collection and the fix. The comparison is pure
(`plan_problems`, `plan_notes`); the reads are small sync and async helpers.

A partitioned collection a mongos reports as unsharded is not a problem: it lives whole on
the database's primary shard, where every command reaches one shard. It is a note, since
its load is not spread.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping, Optional

from harel.engine.schema import Names

from harel_beanie.core.errors import ShardPlanError
from harel_beanie.core.names import queue_names
from harel_beanie.core.partitions import PART, SHARD_PLAN

#: A shard key as `config.collections` records it, or None for an unsharded collection.
ShardKey = Optional[Mapping[str, Any]]

#: Why each partitioned collection must be sharded on exactly its plan's key.
_WHY = {
    "executions": "so that a command naming one execution reaches one shard and a partition's sweep "
    "only that partition's chunks",
    "queues": "a claim is a findAndModify that names only the partition: on another key MongoDB before 7.1 "
    "refuses it and later versions send it to every shard",
    "overflow": "an overflow read names its group's partition: on another key it reaches every shard",
}


def is_mongos(hello_reply: Mapping[str, Any]) -> bool:
    """Whether a `hello` reply comes from a mongos router (what a sharded cluster's clients
    talk to): mongos alone answers `msg: "isdbgrid"`."""
    return hello_reply.get("msg") == "isdbgrid"


def on_mongos(client: Any) -> bool:
    """Whether a PyMongo client's server is a mongos (one `hello`)."""
    return is_mongos(client.admin.command("hello"))


async def on_mongos_async(client: Any) -> bool:
    """`on_mongos` for an async client (PyMongo's async client or Motor)."""
    reply = client.admin.command("hello")
    return is_mongos(await reply if inspect.isawaitable(reply) else reply)


def plan_collections(prefix: str) -> dict[str, str]:
    """The plan's name of each partitioned collection -> its collection name under `prefix`."""
    queues, overflow = queue_names(prefix)
    return {"executions": Names(prefix).executions, "queues": queues, "overflow": overflow}


def config_filter(db_name: str, prefix: str) -> dict[str, Any]:
    """The filter on `config.collections` selecting the partitioned collections' records
    (a record of a dropped collection, which servers before 5.0 keep, is no shard key)."""
    names = [f"{db_name}.{name}" for name in plan_collections(prefix).values()]
    return {"_id": {"$in": names}, "dropped": {"$ne": True}}


def live_keys(records: Any, db_name: str, prefix: str) -> dict[str, ShardKey]:
    """Collection name -> its shard key (None: not sharded), from `config.collections`
    records (`{_id: "<db>.<collection>", key: {...}}`)."""
    keys: dict[str, ShardKey] = {name: None for name in plan_collections(prefix).values()}
    for record in records:
        db, _, name = str(record.get("_id", "")).partition(".")
        if db == db_name and name in keys and not record.get("dropped"):
            keys[name] = record.get("key")
    return keys


def read_live_keys(client: Any, db_name: str, prefix: str) -> dict[str, ShardKey]:
    """The partitioned collections' shard keys, read from the cluster's `config.collections`
    through a mongos (sync PyMongo client)."""
    return live_keys(client["config"]["collections"].find(config_filter(db_name, prefix)), db_name, prefix)


async def read_live_keys_async(client: Any, db_name: str, prefix: str) -> dict[str, ShardKey]:
    """`read_live_keys` for an async client."""
    cursor = client["config"]["collections"].find(config_filter(db_name, prefix))
    return live_keys(await cursor.to_list(None), db_name, prefix)


def format_key(key: Mapping[str, Any]) -> str:
    """A shard key as a person writes it: `{part: 1, _id: 1}`, `{_id: 'hashed'}`."""
    fields = []
    for name, value in key.items():
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        fields.append(f"{name}: {value!r}")
    return "{" + ", ".join(fields) + "}"


def same_key(live: ShardKey, planned: Mapping[str, Any]) -> bool:
    """Whether a live shard key is the planned one: the same fields in the same order with
    the same kinds (a server may record `1` as `1.0`)."""
    if live is None:
        return False
    return list(live.items()) == list(planned.items())


def _unique_per_shard(key: Mapping[str, Any], source: str) -> bool:
    """Whether `_id` would be unique per shard only: the key holds a field that is neither
    `_id`, the plan's `part` (a function of the id) nor the field `part` is computed from,
    so one id could land in two chunks."""
    return any(name not in ("_id", PART, source) for name in key)


def plan_problems(db_name: str, prefix: str, live: Mapping[str, ShardKey]) -> list[str]:
    """One message per partitioned collection sharded on a key other than its plan's, naming
    the collection, both keys, why it matters and the fix. `live` maps collection names to
    their shard keys (missing or None: unsharded, which is no problem: see `plan_notes`)."""
    problems = []
    for plan_name, name in plan_collections(prefix).items():
        key = live.get(name)
        planned, source = SHARD_PLAN[plan_name]
        if key is None or same_key(key, planned):
            continue
        uniqueness = " (and ids would be unique per shard only)" if _unique_per_shard(key, source) else ""
        problems.append(
            f"collection {name} of database {db_name} is sharded on {format_key(key)}; it must be sharded on "
            f"{format_key(planned)}{uniqueness}: {_WHY[plan_name]}. Reshard it with "
            f"db.adminCommand({{reshardCollection: '{db_name}.{name}', key: {format_key(planned)}}}) "
            f"(MongoDB 5.0+), then run `harel-beanie shard` to check the rest"
        )
    return problems


def plan_notes(db_name: str, prefix: str, live: Mapping[str, ShardKey]) -> list[str]:
    """One note per partitioned collection a mongos reports as unsharded: it works (every
    command reaches the primary shard alone) but its load is not spread."""
    notes = []
    for plan_name, name in plan_collections(prefix).items():
        if live.get(name) is None:
            planned, _ = SHARD_PLAN[plan_name]
            notes.append(
                f"collection {name} of database {db_name} is not sharded: it lives whole on the database's primary "
                f"shard; `harel-beanie shard` shards it on {format_key(planned)} to spread it over the shards"
            )
    return notes


def check_plan(db_name: str, prefix: str, live: Mapping[str, ShardKey]) -> list[str]:
    """The notes on the live shard keys, or `ShardPlanError` when any collection is sharded
    against the plan."""
    problems = plan_problems(db_name, prefix, live)
    if problems:
        raise ShardPlanError(problems)
    return plan_notes(db_name, prefix, live)


def routing_check(client: Any, db_name: str, prefix: str) -> bool:
    """At a store's or transport's start: whether its commands go through a mongos, and if
    so, `ShardPlanError` unless the live shard keys are ones it can route."""
    if not on_mongos(client):
        return False
    check_plan(db_name, prefix, read_live_keys(client, db_name, prefix))
    return True


async def routing_check_async(client: Any, db_name: str, prefix: str) -> bool:
    """`routing_check` for an async client."""
    if not await on_mongos_async(client):
        return False
    check_plan(db_name, prefix, await read_live_keys_async(client, db_name, prefix))
    return True
