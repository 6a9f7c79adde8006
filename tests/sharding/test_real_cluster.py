"""On a real sharded cluster (opt in: `MONGODB_SHARDED_URL=mongodb://mongos:27017 make
test-sharded`; skipped otherwise): `harel-beanie shard` leaves the live keys as the plan
says, a short workload through the store and the transport reaches one shard (or one
partition's chunks) with every command and breaks no rule of tests/sharding/targeting.py,
and the server's own `explain` agrees for each hot-path shape.

Each run works in a database of its own, dropped at the end. The explain checks need at
least two shards: the partitions' chunks are split at each partition and dealt round the
shards first, so that a broadcast would show (a control shape, `_id` alone, must span
several shards, or the check proves nothing).
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any, Iterator

import pymongo
import pytest
from bson.min_key import MinKey
from harel.engine.execution import Execution
from harel.spec.states import Event
from pymongo import monitoring
from pymongo.errors import OperationFailure

from harel_beanie.core.documents import SCHEMA_MARKER_ID
from harel_beanie.core.partitions import part_of
from harel_beanie.store.sharding import plan_collections, plan_problems, read_live_keys
from tests.sharding.targeting import ALL_SHARDS, ONE_SHARD, PARTITION_SCOPED, classify

URL = os.environ.get("MONGODB_SHARDED_URL", "")
PREFIX = "harel"

pytestmark = pytest.mark.skipif(not URL, reason="no sharded cluster: set MONGODB_SHARDED_URL to a mongos")


class Sent(monitoring.CommandListener):
    """(command name, command, database) of every command a client sends."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, dict[str, Any], str]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        self.commands.append((event.command_name, dict(event.command), event.database_name))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


@pytest.fixture(scope="module")
def admin() -> Iterator[pymongo.MongoClient[Any]]:
    c: pymongo.MongoClient[Any] = pymongo.MongoClient(URL)
    yield c
    c.close()


@pytest.fixture(scope="module")
def cluster_db(admin: pymongo.MongoClient[Any]) -> Iterator[str]:
    """A database for this run, with the store's and the transport's schema, sharded by
    `harel-beanie shard`."""
    from harel_beanie import MongoStore, MongoTransport
    from harel_beanie.commands import cli

    name = "hbshard_" + uuid.uuid4().hex[:10]
    store = MongoStore.from_url(URL, name, sharded=None)
    store.init()
    store.close()
    transport = MongoTransport(pymongo.MongoClient(URL), name)
    transport.init()
    transport.close()
    try:
        assert cli.main(["shard", "--url", URL, "--db", name, "--prefix", PREFIX]) == 0
        assert cli.main(["shard", "--url", URL, "--db", name, "--prefix", PREFIX]) == 0  # again: nothing to do
        yield name
    finally:
        admin.drop_database(name)


@pytest.fixture(scope="module")
def parts(admin: pymongo.MongoClient[Any], cluster_db: str) -> int:
    from harel.engine.schema import Names

    marker = admin[cluster_db][Names(PREFIX).counters].find_one({"_id": SCHEMA_MARKER_ID})
    assert marker is not None and marker.get("parts"), marker
    return int(marker["parts"])


def test_the_live_keys_follow_the_plan(admin: pymongo.MongoClient[Any], cluster_db: str) -> None:
    live = read_live_keys(admin, cluster_db, PREFIX)
    assert plan_problems(cluster_db, PREFIX, live) == []
    assert None not in live.values(), live


async def test_a_workload_sends_nothing_broadcast_and_breaks_no_rule(cluster_db: str, parts: int) -> None:
    from harel_beanie import MongoStore
    from harel_beanie.transport import AsyncMongoTransport

    sent = Sent()
    store = MongoStore.from_url(URL, cluster_db, sharded=None, client_options={"event_listeners": [sent]})
    transport = AsyncMongoTransport(pymongo.AsyncMongoClient(URL, event_listeners=[sent]), cluster_db)
    try:
        store.init()
        await transport.init()
        sent.commands.clear()
        for i in range(2 * parts):
            root = f"order-{i}"
            store.commit(Execution(id=root, definition_id="d"), [])
            store.commit(Execution(id=f"{root}:pay:1", definition_id="d"), [])
            exe = store.load(root)
            assert exe is not None
            store.commit(exe, [(None, Event(kind="A"))], processed_event_id=f"ev-{i}")
            await transport.publish(root, Event(kind="Go"))
        claimed = 0
        for _ in range(4 * parts * parts):  # a claim may look at one partition only, and find it empty
            lease = await transport.claim("w", 30)
            if lease is not None:
                await transport.ack(lease)
                claimed += 1
            if claimed == 2 * parts:
                break
        assert claimed == 2 * parts
    finally:
        store.close()
        await transport.close()
    judged = [c for name, command, db in sent.commands for c in classify(name, command, db, cluster_db, PREFIX)]
    assert judged, "the workload sent nothing the classifier judges"
    assert [c for c in judged if c.violations] == []
    assert [c for c in judged if c.kind == ALL_SHARDS] == []


def _deal_partitions(admin: pymongo.MongoClient[Any], db: str, parts: int) -> list[str]:
    """Split each partitioned collection at every partition and move partition p's chunk to
    shard p mod n: the shards each partition lives on, known."""
    shards = [s["_id"] for s in admin.admin.command("listShards")["shards"]]
    if len(shards) < 2:
        pytest.skip("the explain checks need a cluster of two shards or more")
    for name in plan_collections(PREFIX).values():
        ns = f"{db}.{name}"
        with_id = name == plan_collections(PREFIX)["executions"]
        for p in range(parts):
            point: dict[str, Any] = {"part": p, "_id": MinKey()} if with_id else {"part": p}
            if p:
                try:
                    admin.admin.command("split", ns, middle=point)
                except OperationFailure:
                    pass  # already a chunk boundary: a run before split it
            try:
                admin.admin.command("moveChunk", ns, find=point, to=shards[p % len(shards)])
            except OperationFailure as exc:
                if "already" not in str(exc):
                    raise
    return shards


def _shards_of(admin: pymongo.MongoClient[Any], db: str, command: dict[str, Any]) -> list[str]:
    plan = admin[db].command("explain", command, verbosity="queryPlanner")["queryPlanner"]["winningPlan"]
    assert plan["stage"] in ("SINGLE_SHARD", "SHARD_MERGE", "SHARD_WRITE"), plan["stage"]
    return [s.get("shardName") for s in plan.get("shards", [])]


def test_explain_sends_each_hot_path_shape_to_one_shard(
    admin: pymongo.MongoClient[Any], cluster_db: str, parts: int
) -> None:
    _deal_partitions(admin, cluster_db, parts)
    names = plan_collections(PREFIX)
    executions, queues = names["executions"], names["queues"]
    exe_id = "order-7"
    p = part_of(exe_id, parts)
    family = {"$or": [{"_id": exe_id}, {"_id": {"$gte": exe_id + ":", "$lt": exe_id + ";"}}]}
    shapes = {
        "load": ({"find": executions, "filter": {"_id": exe_id, "part": p}}, ONE_SHARD),
        "commit": (
            {
                "update": executions,
                "updates": [{"q": {"_id": exe_id, "part": p, "version": 3}, "u": {"$set": {"version": 4}}}],
            },
            ONE_SHARD,
        ),
        "claim": (
            {
                "findAndModify": queues,
                "query": {
                    "part": p,
                    "pending": {"$gt": 0},
                    "available_at": {"$lte": time.time()},
                    "priority": {"$gte": 0},
                },
                "sort": {"available_at": 1, "priority": 1},
                "update": {"$set": {"token": "t"}},
            },
            ONE_SHARD,
        ),
        "family read": ({"find": executions, "filter": {"part": p, "pending": True, **family}}, PARTITION_SCOPED),
    }
    for what, (command, kind) in shapes.items():
        name = next(iter(command))
        assert [c.kind for c in classify(name, command, cluster_db, cluster_db, PREFIX)] == [kind], what
        assert len(_shards_of(admin, cluster_db, command)) == 1, what
    # the control: the check can fail, since `_id` alone reaches every shard owning chunks
    control = {"find": executions, "filter": {"_id": exe_id}}
    assert [c.kind for c in classify("find", control, cluster_db, cluster_db, PREFIX)] == [ALL_SHARDS]
    assert len(_shards_of(admin, cluster_db, control)) > 1
