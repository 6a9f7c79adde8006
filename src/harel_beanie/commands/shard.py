"""`harel-beanie shard`: shard a database's partitioned collections on a cluster, through a
mongos, as the shard plan says (`harel_beanie.core.partitions.SHARD_PLAN`).

Why this module exists: the plan's keys must be in place before the workers run on a
cluster (`harel_beanie.store.sharding` says why each matters), and getting them right by
hand takes four commands a collection. The command is safe to run again at any time:

- it refuses, changing nothing, when the server is not a mongos, when the database's layout
  is not this package's (the partitioned layout: every document must carry `part` first,
  which `harel-beanie migrate up` gives it), or when a collection is already sharded on
  another key (a reshard is a decision for a person: the message names the command);
- sharding already enabled, an index already there and a collection already sharded on
  its plan's key are each left as they are.

Every other collection (counters, leases, samples) stays unsharded, on the primary shard.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from harel_beanie.core.errors import ConfigError, SchemaMismatch, ShardPlanError

if TYPE_CHECKING:
    from harel_beanie.deploy.where import Target

NAME = "shard"
HELP = "shard the store's and transport's collections on a cluster, as planned"
DESCRIPTION = (
    "Through a mongos: enable sharding on the database and shard the executions ({part: 1, _id: 1}), queues and "
    "overflow ({part: 1}) collections on the shard plan's keys, creating their key indexes; every other collection "
    "stays on the primary shard. Refuses when the server is not a mongos, the layout is not this package's, or a "
    "collection is sharded on another key. Safe to run again."
)
WHERE = "url"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No flags beyond where the data lives."""


#: The name of the index each partitioned collection's shard key is served by.
SHARD_KEY_INDEX = "hb_shard_key"
#: The server's answers meaning "already so", left alone on a re-run: sharding already
#: enabled (AlreadyInitialized, before 6.0), an index on that key under another name
#: (IndexOptionsConflict).
_ALREADY_ENABLED = 23
_INDEX_UNDER_ANOTHER_NAME = 85


@dataclass
class ShardReport:
    """What one run found and did: a line per step, and the partitions of the database."""

    db: str
    parts: int
    steps: list[str] = field(default_factory=list)


def _refuse_unless_mongos(client: Any, where: str) -> None:
    from harel_beanie.store.sharding import is_mongos

    hello = client.admin.command("hello")
    if not is_mongos(hello):
        kind = "a replica set member" if hello.get("setName") else "a standalone server"
        raise ConfigError(
            f"{where} is not a mongos ({kind}): shard runs through the mongos router of a sharded cluster"
        )


def _parts_of_layout(client: Any, db_name: str, prefix: str, where: str) -> int:
    """The partitions the schema marker records, once the layout is this package's."""
    from harel.engine.schema import Names

    from harel_beanie.core.documents import SCHEMA_MARKER_ID, SCHEMA_VERSION
    from harel_beanie.core.partitions import DEFAULT_PARTITIONS

    marker = client[db_name][Names(prefix).counters].find_one({"_id": SCHEMA_MARKER_ID})
    if marker is None:
        raise ConfigError(
            f"database {db_name} (prefix {prefix}) holds no harel-beanie schema: open a store on it once (it "
            f"creates the schema) or run `harel-beanie migrate up`, then shard it"
        )
    found = int(marker.get("n", 0))
    if found != SCHEMA_VERSION:
        raise SchemaMismatch(found, SCHEMA_VERSION, where)
    return int(marker.get("parts", DEFAULT_PARTITIONS))  # what a store reads where none is recorded


def _enable_sharding(client: Any, db_name: str) -> str:
    from pymongo.errors import OperationFailure

    try:
        client.admin.command({"enableSharding": db_name})
    except OperationFailure as exc:
        if exc.code != _ALREADY_ENABLED:
            raise
        return f"database {db_name}: sharding already enabled"
    return f"database {db_name}: sharding enabled"


def _create_key_index(client: Any, db_name: str, name: str, key: dict[str, int]) -> None:
    from pymongo.errors import OperationFailure

    index = {"key": dict(key), "name": SHARD_KEY_INDEX}
    try:
        client[db_name].command({"createIndexes": name, "indexes": [index]})
    except OperationFailure as exc:
        # an index on the key exists under another name: shardCollection uses it if it can
        # (a partial one it cannot, and says so)
        if exc.code != _INDEX_UNDER_ANOTHER_NAME:
            raise


def apply_plan(client: Any, db_name: str, prefix: str, where: str, say: Callable[[str], None] = print) -> ShardReport:
    """Shard `db_name`'s partitioned collections under `prefix` on their plan's keys, through
    the mongos `client` (a sync PyMongo client) talks to; `where` names the server in
    refusals. Each step is said as it is done. Raises `ConfigError` (not a mongos, no
    schema), `SchemaMismatch` (another layout) or `ShardPlanError` (a collection on another
    key), in each case before changing anything."""
    from harel_beanie.core.partitions import SHARD_PLAN
    from harel_beanie.store.sharding import format_key, plan_collections, plan_problems, read_live_keys

    _refuse_unless_mongos(client, where)
    report = ShardReport(db_name, _parts_of_layout(client, db_name, prefix, where))
    live = read_live_keys(client, db_name, prefix)
    problems = plan_problems(db_name, prefix, live)
    if problems:
        raise ShardPlanError(problems)

    def step(line: str) -> None:
        report.steps.append(line)
        say(line)

    step(_enable_sharding(client, db_name))
    for plan_name, name in plan_collections(prefix).items():
        key, _ = SHARD_PLAN[plan_name]
        if live.get(name) is not None:
            step(f"{name}: already sharded on {format_key(key)}")
            continue
        _create_key_index(client, db_name, name, key)
        client.admin.command({"shardCollection": f"{db_name}.{name}", "key": dict(key)})
        step(f"{name}: sharded on {format_key(key)} (index {SHARD_KEY_INDEX})")
    after = read_live_keys(client, db_name, prefix)
    problems = plan_problems(db_name, prefix, after) + [
        f"collection {name} is still not sharded" for name, key in after.items() if key is None
    ]
    if problems:
        raise ShardPlanError(problems)
    return report


def main(args: Any, target: Target) -> int:
    from pymongo import MongoClient

    from harel_beanie.store.connect import wait_for_server

    def make() -> Any:
        return MongoClient(target.url, **target.retry.client_settings({}))

    client = wait_for_server(make, target.url, target.retry)
    try:
        report = apply_plan(client, target.db, target.prefix, target.masked_url)
    finally:
        client.close()
    print(
        f"{report.db}: the partitioned collections follow the shard plan ({report.parts} partitions); "
        "the others stay on the primary shard"
    )
    return 0
