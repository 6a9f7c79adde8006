"""The targeting audit: every command the store, the transport, the partition leases and a
worker send while they do real work, each classified against the shard plan by MongoDB's
targeting rules (`tests/sharding/targeting.py`, which cites them), through a store and a
transport that route as they do behind a mongos (`sharded=True`: the embedded server is no
mongos, so what is audited is exactly what they would send to one).

The audit fails on any hot-path command that would reach every shard and on any command
that breaks a rule a sharded cluster enforces (a `findAndModify` or an upsert without the
whole shard key, an insert without `part`), and, for a worker, on a claim, sweep or counts
fold that reaches a partition the worker does not own. It fails on the transport as it was
before partitions and on a sweep and a fold widened to every partition (shown below), and
docs/SCALING.md's operation table is this audit's output: `HB_WRITE_DOCS=1` rewrites it, and
the test fails while the page says anything else.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path
from typing import Any, Callable, Optional

import pymongo
import pytest
from harel.engine.aio.distributed import AsyncDistributedRunner
from harel.engine.store.base import TimerOp
from harel.spec.states import Event

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, PartitionScope
from harel_beanie.deploy.loader import load_models
from harel_beanie.deploy.relay import sweep
from harel_beanie.transport import AsyncMongoTransport, MongoTransport
from harel_beanie.transport.documents import INLINE_MAX
from harel_beanie.transport.ownership import PartitionOwner
from tests.commands.test_cli import MODELS
from tests.sharding.audit import OP, OWNED, Audit, Labelled, markdown
from tests.sharding.targeting import PARTITION_SCOPED
from tests.support.contracts import SYNC
from tests.support.shop_day import shop_day

SCALING = Path(__file__).resolve().parents[2] / "docs" / "SCALING.md"
BEGIN, END = "<!-- targeting audit: begin -->", "<!-- targeting audit: end -->"


def _fresh() -> str:
    return "hbt_audit_" + uuid.uuid4().hex[:10]


#: a worker's leases in these tests outlast any run of them on a loaded machine: what a
#: command is held to is what the worker owned when it sent it, never a lease that ran out
LONG_LEASE = 600.0


@pytest.fixture(scope="module")
def audits(mongo_url: str, client: pymongo.MongoClient[Any]) -> Any:
    made: list[str] = []
    results: dict[str, Audit] = {}

    def new(name: str, owned: Optional[Callable[[], Any]] = None) -> tuple[str, Audit]:
        made.append(_fresh())
        results[name] = Audit(made[-1], owned=owned)
        return made[-1], results[name]

    yield new, results
    for name in made:
        client.drop_database(name)


def test_the_store_under_harels_contracts(mongo_url: str, audits: Any) -> None:
    new, _ = audits
    for contract, ns in (("outbox", "O-"), ("purge", "P-"), ("listing", "L-")):
        db, audit = new(f"store-{contract}")
        store = Labelled(MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[audit]), db, sharded=True))
        store.init()
        SYNC[contract](store, ns)
        store.close()
        assert audit.seen and not audit.problems(), "\n".join(audit.problems())


def test_the_transport_inline_spilling_and_overflow(mongo_url: str, audits: Any) -> None:
    new, _ = audits
    db, audit = new("transport")
    scope = PartitionScope(held=None)
    t = Labelled(
        MongoTransport(pymongo.MongoClient(mongo_url, event_listeners=[audit]), db, sharded=True, partitions=scope)
    )
    t.init()
    for g in ("a", "b", "c:1:2"):
        t.publish(g, Event(kind="e"))
    for n in range(INLINE_MAX + 3):  # past the inline bound: the group spills to overflow
        t.publish("deep", Event(kind=f"d{n}"))
    handled = 0
    while (lease := t.claim("w", 30.0)) is not None:
        if handled % 7 == 3:
            t.nack(lease)  # back at once: claimed again
        else:
            t.ack(lease)
        handled += 1
    assert handled > INLINE_MAX + 6
    assert not audit.problems(), "\n".join(audit.problems())
    assert any(c.command == "findAndModify" and "overflow" in c.collection for _, c, _ in audit.seen)


async def test_a_worker_running_the_shop(mongo_url: str, audits: Any) -> None:
    """harel's own worker logic (with the post-commit relay kept to its family) on a store and
    a transport behind partition leases, running the shop's models: creates, starts, events
    relayed between executions, children spawned by forks and invoked machines, timers."""
    new, _ = audits
    scope = PartitionScope(held={})
    db, audit = new("worker", owned=scope.owned)
    client: Any = pymongo.AsyncMongoClient(mongo_url, event_listeners=[audit])
    store = AsyncMongoStore(client, db, sharded=True, partitions=scope)
    transport = AsyncMongoTransport(client, db, sharded=True, partitions=scope)
    await Labelled(store).init()
    await Labelled(transport).init()
    owner = PartitionOwner(transport.partition_leases, "w", scope, lease_seconds=LONG_LEASE)
    await Labelled(owner).tick()
    assert sorted(scope.owned() or {}) == list(range(DEFAULT_PARTITIONS))
    ls, lt = Labelled(store), Labelled(transport)
    handled, folded = await shop_day(ls, lt, client[db]["harel_executions"])
    assert folded > 0
    await Labelled(owner).release()
    assert handled >= 5
    await ls.close()
    await lt.close()
    assert not audit.problems(), "\n".join(audit.problems())


async def _half_owner(client: Any, db: str, scope: PartitionScope) -> tuple[Any, Any]:
    """A worker's store and transport (labelled) on `scope`, holding half the partitions by
    lease, the other half held by a second worker: as two workers share them after a few
    looks."""
    store = AsyncMongoStore(client, db, sharded=True, partitions=scope)
    transport = AsyncMongoTransport(client, db, sharded=True, partitions=scope)
    await Labelled(store).init()
    await Labelled(transport).init()
    mine = Labelled(PartitionOwner(transport.partition_leases, "w", scope, lease_seconds=LONG_LEASE))
    other = Labelled(PartitionOwner(transport.partition_leases, "x", PartitionScope(held={}), lease_seconds=LONG_LEASE))
    # w takes all; x joins and finds none free; w gives back above its share; x takes them
    for look in (mine.tick, other.tick, mine.tick, other.tick):
        await look()
    held = sorted(scope.owned() or {})
    assert len(held) == DEFAULT_PARTITIONS // 2, held
    return Labelled(store), Labelled(transport)


async def _work_in_every_partition(store: Any, transport: Any) -> list[str]:
    """Executions (with pending outbox, timers and unfolded counts) and queued events in
    every partition, written as a sender writes them: by id, whoever owns it."""
    definitions = load_models(MODELS)
    sender = AsyncDistributedRunner(store, transport, dict(definitions))
    ids, n = [], 0
    while len({store.partitions.part_of(i) for i in ids}) < DEFAULT_PARTITIONS:
        ids.append(f"pay-{n}")
        n += 1
    for i in ids:
        await sender.create("Payment", {"order_id": i, "amount": 5.0}, execution_id=i)
        exe = await store.load(i)
        await store.commit(exe, [], timers=(TimerOp("schedule", "W.ait", 1.0),))
        await transport.publish(i, Event(kind="Poke"))
    return ids


async def test_a_worker_owning_half_the_partitions_reads_and_folds_only_those(mongo_url: str, audits: Any) -> None:
    """A worker holding 8 of the 16 partitions, with work stored and queued in all 16: its
    claims, timer sweep, idle wait, relay sweep and counts fold each name only partitions it
    owns (asked at each command), and each of them ran."""
    new, _ = audits
    scope = PartitionScope(held={})
    db, audit = new("worker-half", owned=scope.owned)
    client: Any = pymongo.AsyncMongoClient(mongo_url, event_listeners=[audit])
    ls, lt = await _half_owner(client, db, scope)
    await _work_in_every_partition(ls, lt)
    mine = set(scope.owned() or {})
    claimed = []
    while (lease := await lt.claim("w", 30.0)) is not None:
        claimed.append(scope.part_of(lease.group_id))
        await lt.ack(lease)
    assert claimed and set(claimed) <= mine, (claimed, mine)
    assert await ls.due_timers(2e9)
    await ls.next_timer(0.0)
    token = OP.set("sweep")
    try:
        await sweep(ls, lt, client[db]["harel_executions"], dict(load_models(MODELS)))
    finally:
        OP.reset(token)
    assert await ls.fold_counts() > 0
    await ls.close()
    await lt.close()
    assert not audit.problems(), "\n".join(audit.problems())
    reached: dict[str, set[Any]] = {op: set() for op in OWNED}
    for (op, c, _), held in zip(audit.seen, audit.held):
        if op in OWNED and c.parts is not None:
            assert held == mine, (op, held, mine)  # what the audit held each command to
            reached[op] |= c.parts
    assert all(reached.values()), reached  # every owned-scoped operation sent its reads
    assert set().union(*reached.values()) == mine, reached


async def test_the_audit_fails_on_a_sweep_and_a_fold_widened_to_every_partition(mongo_url: str, client: Any) -> None:
    """The same worker, its relay sweep run on a store that ignores its leases (a scope of
    every partition, as a sweep widened to all 16) and its fold asked for every partition:
    through a mongos both read `part: {$in: [0..15]}`, which MongoDB's targeting calls
    partition-scoped, so only the ownership check flags them, naming the partitions it does
    not own."""
    db = _fresh()
    try:
        scope = PartitionScope(held={})
        audit = Audit(db, owned=scope.owned)
        watched: Any = pymongo.AsyncMongoClient(mongo_url, event_listeners=[audit])
        ls, lt = await _half_owner(watched, db, scope)
        await _work_in_every_partition(ls, lt)
        wide = Labelled(AsyncMongoStore(watched, db, sharded=True, partitions=PartitionScope(held=None)))
        token = OP.set("sweep")
        try:
            await sweep(wide, lt, watched[db]["harel_executions"], dict(load_models(MODELS)))
        finally:
            OP.reset(token)
        await ls.fold_counts(list(range(DEFAULT_PARTITIONS)))
        await ls.close()
        await lt.close()
        flagged = audit.problems()
        foreign = sorted(set(range(DEFAULT_PARTITIONS)) - set(scope.owned() or {}))
        # the widened sweep's read, naming every partition it does not own
        assert any(line.startswith("sweep: ") and f"reaches partitions {foreign} " in line for line in flagged), flagged
        # the fold of every partition: its counters are built (at the fresh database's set-up),
        # so it reads each partition's dirty documents in turn, each foreign one flagged
        folded = [line for line in flagged if line.startswith("fold_counts: ")]
        reached = {
            int(n)
            for line in folded
            for m in re.findall(r"reaches partitions \[([\d, ]+)\]", line)
            for n in m.split(",")
        }
        assert reached >= set(foreign), (reached, flagged)
        widened = [c for op, c, _ in audit.seen if op == "sweep" and c.parts == frozenset(range(DEFAULT_PARTITIONS))]
        assert widened and all(c.kind == PARTITION_SCOPED for c in widened), widened  # the kind alone passes it
    finally:
        client.drop_database(db)


async def test_migrate_transport_both_ways(mongo_url: str, audits: Any) -> None:
    """`harel-beanie migrate-transport`: harel's transport's messages (a group deep enough to
    spill) into this package's queues and back, each write naming its group's partition."""
    from harel_beanie.harness.drivers import open_mongo_transport
    from harel_beanie.transport import moving

    new, _ = audits
    db, audit = new("migrate-transport")
    harels = await open_mongo_transport(mongo_url, db)
    for n in range(INLINE_MAX + 2):
        await harels.publish("deep", Event(kind=f"d{n}"))
    await harels.publish("shallow", Event(kind="s"))
    client: Any = pymongo.AsyncMongoClient(mongo_url, event_listeners=[audit])
    for name, move in (("migrate-transport up", moving.up), ("migrate-transport down", moving.down)):
        token = OP.set(name)
        try:
            report = await move(client[db], "harel", say=lambda _: None, sharded=True)
        finally:
            OP.reset(token)
        assert report.messages == INLINE_MAX + 3
    await client.close()
    assert not audit.problems(), "\n".join(audit.problems())


async def test_the_operators_side(mongo_url: str, audits: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard's pages and JSON, its Prometheus figures, `status`'s backlog and prune,
    on a store routing as behind a mongos: they may read every shard (they are not the hot
    path), but none may break a rule a cluster enforces."""
    import time

    import httpx
    from fastapi import FastAPI
    from harel.engine.execution import Execution, Status
    from prometheus_client import CollectorRegistry

    from harel_beanie.dashboard import charts, dashboard_router, no_auth
    from harel_beanie.queries import backlog
    from harel_beanie.retention.pruning import prune
    from harel_beanie.telemetry.metrics import StoreMetrics

    new, _ = audits
    db, audit = new("operator")
    client: Any = pymongo.AsyncMongoClient(mongo_url, event_listeners=[audit])
    store = AsyncMongoStore(client, db, sharded=True)
    await Labelled(store).init()
    now = time.time()
    for i in range(6):
        status = (Status.DONE, Status.FAILED, Status.RUNNING)[i % 3]
        finished = now - 86400 * 30 if status is Status.DONE else None
        exe = Execution(
            id=f"op-{i}", definition_id="Payment", status=status, updated_at=now - 86400 * 30, finished_at=finished
        )
        await store.save(exe)
    monkeypatch.setattr(charts, "FIRST_AFTER", 0.0)  # the charts' sampler's writes are audited too
    app = FastAPI()
    app.include_router(dashboard_router(store, auth=no_auth, metrics=StoreMetrics(CollectorRegistry())))
    token = OP.set("dashboard")
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
            for path in (
                "/",
                "/failed",
                "/backlog",
                "/api/executions",
                "/api/failed",
                "/metrics",
                "/execution?id=op-1",
            ):
                assert (await http.get(path)).status_code == 200, path
        await backlog()  # on the Beanie classes the store bound to this database
    finally:
        OP.reset(token)
    token = OP.set("prune")
    try:
        pruned = await prune(client[db]["harel_executions"], now)
    finally:
        OP.reset(token)
    assert pruned.removed == 2, pruned  # its deletes are among the audited commands
    await client.close()
    assert not audit.problems(), "\n".join(audit.problems())


def test_the_audit_fails_on_the_transport_before_partitions(mongo_url: str, client: Any) -> None:
    """The transport as it is on one server (as it was before partitions) sends its claim with
    no shard key: the audit flags it (its window read reaching every shard, and its lease, an
    update by `_id` alone, reaching every shard too)."""
    db = _fresh()
    audit = Audit(db)
    try:
        t = Labelled(MongoTransport(pymongo.MongoClient(mongo_url, event_listeners=[audit]), db, sharded=False))
        t.init()
        t.publish("a", Event(kind="e"))
        assert t.claim("w", 30.0) is not None
        flagged = audit.problems()
        assert any(line.startswith("claim: find on") and "every shard" in line for line in flagged), flagged
        assert any(line.startswith("claim: update on") and "every shard" in line for line in flagged), flagged
    finally:
        client.drop_database(db)


def test_scaling_md_shows_the_audit(audits: Any) -> None:
    """Runs last in this module: the operation table of docs/SCALING.md is the audits'."""
    _, results = audits
    assert {"store-outbox", "transport", "worker", "worker-half", "migrate-transport", "operator"} <= set(results), (
        "run the module"
    )
    table = markdown([a.table() for a in results.values()])
    text = SCALING.read_text()
    section = f"{BEGIN}\n{table}{END}"
    if os.environ.get("HB_WRITE_DOCS") == "1":
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: section, text, flags=re.S)
        SCALING.write_text(text)
    assert section in text, "docs/SCALING.md's table is not the audit's: HB_WRITE_DOCS=1 pytest tests/sharding"
