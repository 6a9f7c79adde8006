"""Every index earns its place: docs/INDEXES.md lists every index of every collection the
package declares or creates, the reads it serves (the filters recorded on the wire while the
store, the transport, a worker, the dashboard, the backlog, prune and the archive do real
work, matched against the index's key and partial filter: `tests.support.index_use`) and
what it costs a write on the embedded server (bench/store/indexes.json, written by
`python -m bench.store.indexes`; nothing is timed here).

The test fails on an index no recorded read uses (the `_id` index and a TTL index are exempt:
the lookups by `_id` and the server's expiry read them; a unique index only with the rule it
enforces named in `ENFORCES`), and on one whose key is a prefix of another's on the same
collection under the same partial filter (every read it serves, the longer one serves).
The page is the render of what was recorded: `HB_WRITE_DOCS=1 pytest
tests/store/test_index_use.py` rewrites it, and the test fails while the page says anything
else.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pymongo
import pytest
from harel.engine.execution import Execution, Status
from harel.spec.states import Event

from harel_beanie import AsyncMongoStore, MongoStore, queries, retention
from harel_beanie.core.documents import ExecutionDocument, index_models
from harel_beanie.core.partitions import PartitionScope
from harel_beanie.transport import AsyncMongoTransport, MongoTransport
from harel_beanie.transport.documents import INLINE_MAX, OverflowDocument, QueueDocument
from harel_beanie.transport.ownership import PartitionOwner
from tests.sharding.audit import OP, Labelled
from tests.support.contracts import SYNC
from tests.support.index_use import Index, Query, Recorder, bounded_fields, by_id, sort_follows
from tests.support.shop_day import shop_day

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "INDEXES.md"
COSTS = ROOT / "bench" / "store" / "indexes.json"
REGENERATE = "HB_WRITE_DOCS=1 pytest tests/store/test_index_use.py"

#: the document classes that declare indexes (Beanie's `Settings.indexes`), by collection
#: (without the default prefix, as the recorders name them)
DECLARED = {
    cls.Settings.name.removeprefix("harel_"): cls for cls in (ExecutionDocument, QueueDocument, OverflowDocument)
}

#: indexes no recorded read needs, and why each is kept
EXEMPT_KINDS = {
    "_id": "every collection's own: the lookups, updates and deletes by `_id`",
    "ttl": "a TTL index: the server's expiry monitor reads it, no query",
}
#: a unique index is exempt only with the rule it enforces (none is declared today)
ENFORCES: dict[str, str] = {}

#: the commit kinds whose measured cost the page shows (bench/store/indexes.py's COMMIT_KINDS)
SHOWN_KINDS = ("create", "state", "emit", "timer")

#: the archive's collection in these runs (`retention.CollectionArchive`: the operator names it)
ARCHIVE = "hbt_archive"


def _fresh() -> str:
    return "hbt_ixuse_" + uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def recorded(mongo_url: str, client: pymongo.MongoClient[Any]) -> Iterator[list[Recorder]]:
    made: list[Recorder] = []
    yield made
    for r in made:
        client.drop_database(r.db_name)


def _recorder(recorded: list[Recorder]) -> Recorder:
    recorded.append(Recorder(_fresh()))
    return recorded[-1]


def test_the_store_under_harels_contracts(mongo_url: str, recorded: list[Recorder]) -> None:
    for contract, ns in (("outbox", "O-"), ("purge", "P-"), ("listing", "L-")):
        rec = _recorder(recorded)
        store = Labelled(MongoStore(pymongo.MongoClient(mongo_url, event_listeners=[rec]), rec.db_name))
        store.init()
        SYNC[contract](store, ns)
        store.close()
        assert rec.queries


def test_the_transport_over_every_partition(mongo_url: str, recorded: list[Recorder]) -> None:
    rec = _recorder(recorded)
    t = Labelled(
        MongoTransport(
            pymongo.MongoClient(mongo_url, event_listeners=[rec]), rec.db_name, partitions=PartitionScope(held=None)
        )
    )
    t.init()
    for g in ("a", "b", "c:1:2"):
        t.publish(g, Event(kind="e"))
    for n in range(INLINE_MAX + 3):  # past the inline bound: the group spills to overflow
        t.publish("deep", Event(kind=f"d{n}"))
    handled = 0
    while (lease := t.claim("w", 30.0)) is not None:
        (t.nack if handled % 7 == 3 else t.ack)(lease)
        handled += 1
    assert handled > INLINE_MAX + 6
    t.close()


def test_the_transport_as_it_claims_through_a_mongos(mongo_url: str, recorded: list[Recorder]) -> None:
    """The claim's mongos path (`sharded=True`: one partition a claim, the whole shard key
    named), sent to this server as it would be to a mongos: what `hb_part_claim` serves."""
    rec = _recorder(recorded)
    client: Any = pymongo.MongoClient(mongo_url, event_listeners=[rec])
    t = Labelled(MongoTransport(client, rec.db_name, sharded=True, partitions=PartitionScope(held=None)))
    t.init()
    for g in ("a", "b", "c"):
        t.publish(g, Event(kind="e"))
    handled = 0
    while (lease := t.claim("w", 30.0)) is not None:
        t.ack(lease)
        handled += 1
    assert handled == 3
    t.close()


async def test_a_worker_owning_its_partitions_running_the_shop(mongo_url: str, recorded: list[Recorder]) -> None:
    """harel's worker logic on a store and a transport behind partition leases (so its
    claims, sweeps and folds name the partitions it owns), running the shop's models."""
    rec = _recorder(recorded)
    scope = PartitionScope(held={})
    client: Any = pymongo.AsyncMongoClient(mongo_url, event_listeners=[rec])
    store = AsyncMongoStore(client, rec.db_name, partitions=scope)
    transport = AsyncMongoTransport(client, rec.db_name, partitions=scope)
    ls, lt = Labelled(store), Labelled(transport)
    await ls.init()
    await lt.init()
    owner = Labelled(PartitionOwner(transport.partition_leases, "w", scope, lease_seconds=600.0))
    await owner.tick()
    handled, _ = await shop_day(ls, lt, client[rec.db_name]["harel_executions"])
    await owner.release()
    assert handled >= 5
    await ls.close()
    await lt.close()


async def test_the_operators_side(mongo_url: str, recorded: list[Recorder], monkeypatch: pytest.MonkeyPatch) -> None:
    """The dashboard's pages and JSON (each filter and a time search, a second page), its
    charts and Prometheus figures, the backlog (`status`), the stuck list, the query helpers
    `harel_beanie.queries` exports, prune with a collection archive."""
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry

    from harel_beanie.dashboard import charts, dashboard_router, no_auth
    from harel_beanie.telemetry.metrics import StoreMetrics

    rec = _recorder(recorded)
    client: Any = pymongo.AsyncMongoClient(mongo_url, event_listeners=[rec])
    store = AsyncMongoStore(client, rec.db_name)
    await Labelled(store).init()
    now = time.time()
    for i in range(12):
        status = (Status.DONE, Status.FAILED, Status.RUNNING)[i % 3]
        finished = now - 86400 * 30 if status is Status.DONE else None
        exe = Execution(
            id=f"op-{i:02d}",
            definition_id="Payment",
            status=status,
            updated_at=now - 86400 * 30 + i,
            finished_at=finished,
            parent_id="op-00" if i in (3, 4) else None,
        )
        await store.save(exe)
    monkeypatch.setattr(charts, "FIRST_AFTER", 0.0)  # the charts' sampler runs (and makes its index) at once
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
                "/api/executions?limit=2",
                "/api/executions?status=FAILED",
                "/api/executions?status=DONE&limit=2",
                "/api/executions?definition=Payment&limit=2",
                "/api/executions?roots=true",
                "/api/executions?parent=op-00",
                "/api/executions?prefix=op-0",
                "/api/executions?within=3600",
                f"/api/executions?updated_after={now - 86400 * 31}&updated_before={now}&limit=2",
                f"/api/executions?status=FAILED&updated_after={now - 86400 * 31}",
                "/api/failed",
                "/api/backlog",
                "/api/charts",
                "/metrics",
                "/execution?id=op-01",
                "/api/execution?id=op-03",
            ):
                reply = await http.get(path)
                assert reply.status_code == 200, (path, reply.text[:300])
                body = reply.json() if path.startswith("/api/executions?") and "limit=2" in path else None
                if body and body.get("next_after"):  # the second page of each paged search
                    assert (await http.get(f"{path}&after={body['next_after']}")).status_code == 200
            # the charts' sampler, started by the first page: its first sample written (its
            # reads are the backlog's, below), so what it sent is the same in every run
            samples = client[rec.db_name]["harel_hb_samples"]
            for _ in range(300):
                if await samples.count_documents({}):
                    break
                await asyncio.sleep(0.1)
            assert await samples.count_documents({}), "the charts' sampler took no sample"
    finally:
        OP.reset(token)
    token = OP.set("queries")  # `harel_beanie.queries`, on the classes the store bound
    try:
        await queries.backlog(stuck_after=1.0)  # what `harel-beanie status` reads
        await queries.stuck(after=1.0)
        for read in (
            queries.failed_since(now - 86400 * 40),
            queries.stuck_running(60.0),
            queries.children_of("op-00"),
            queries.waiting_on_timer(before=now),
            queries.by_status("FAILED"),
        ):
            await read.to_list()
        await queries.execution_detail("op-01")
    finally:
        OP.reset(token)
    token = OP.set("prune")
    try:
        coll = client[rec.db_name]["harel_executions"]
        archive = retention.CollectionArchive(client[rec.db_name], ARCHIVE)
        pruned = await retention.prune(coll, now, archive=archive, batch_size=2)
        assert (await archive.read("op-00")).records  # what was removed of one execution
    finally:
        OP.reset(token)
    assert pruned.removed == 4, pruned
    await store.close()


# --- the table ----------------------------------------------------------------------------------


def _declared() -> list[Index]:
    return [Index.model(coll, ix) for coll, cls in DECLARED.items() for ix in index_models(cls)]


def _all_indexes(recorders: list[Recorder]) -> list[Index]:
    """The declared indexes, then every other one the code asked to create (one per
    collection and name, the first request's)."""
    seen: dict[tuple[str, str], Index] = {(ix.collection, ix.name): ix for ix in _declared()}
    for r in recorders:
        for ix in r.created:
            seen.setdefault((ix.collection, ix.name), ix)
    return sorted(seen.values(), key=lambda ix: (ix.collection, ix.name))


def _served(indexes: list[Index], recorders: list[Recorder]) -> dict[tuple[str, str], set[tuple[str, str, int]]]:
    """(collection, index) -> the (operation, shape, fields bounded) of each read it serves: a
    read goes to the indexes of its collection that bound the most fields of it, and among
    those to the ones that also give its sort (a planner picks among what is left); none
    when no index bounds any, or the read names its documents by `_id` (the `_id` index's)."""
    out: dict[tuple[str, str], set[tuple[str, str, int]]] = {(ix.collection, ix.name): set() for ix in indexes}
    for q in (q for r in recorders for q in r.queries):
        if by_id(q):
            continue
        scored = [((bounded_fields(ix, q), sort_follows(ix, q)), ix) for ix in indexes if ix.collection == q.collection]
        best = max((score for score, _ in scored), default=(0, False))
        if best[0] == 0:
            continue
        for score, ix in scored:
            if score == best:
                out[(ix.collection, ix.name)].add((q.op, q.shape(), score[0]))
    return out


def _exempt(ix: Index) -> str:
    if ix.ttl is not None:
        return EXEMPT_KINDS["ttl"]
    if ix.unique and ix.name in ENFORCES:
        return f"unique: {ENFORCES[ix.name]}"
    return ""


def _dominated(indexes: list[Index]) -> list[str]:
    """Indexes whose key is a prefix of another's on the same collection, same partial filter."""
    out = []
    for a in indexes:
        for b in indexes:
            if (
                a is not b
                and a.collection == b.collection
                and (a.partial or None) == (b.partial or None)
                and len(a.key) < len(b.key)
                and b.key[: len(a.key)] == a.key
            ):
                out.append(f"{a.collection}.{a.name} {a.describe()} is a prefix of {b.name} {b.describe()}")
    return out


def _costs() -> dict[str, Any]:
    if not COSTS.exists():
        return {"run": "no run recorded", "costs": {}, "keys": {}}
    return json.loads(COSTS.read_text(encoding="utf-8"))


#: the executions' indexes the recorded cost run predates: which commits write their keys
_KEYS_WRITTEN = {
    name: (
        f"not measured yet; keys: none on a document holding no {what}, so no create, state or timer"
        f" commit on one writes any; an {how} adds the document's key, an ack of its first entry"
        " moves it, of its last removes it"
    )
    for name, what, how in (
        ("hb_outbox_oldest", "outbox entry", "emit on a document holding none"),
        ("hb_spawn_oldest", "spawn", "spawn on a document holding none"),
    )
}


def _cost_text(ix: Index, costs: dict[str, Any]) -> str:
    per = costs["costs"].get(ix.name) if ix.collection == "executions" else None
    if per is None and ix.name in _KEYS_WRITTEN:
        return _KEYS_WRITTEN[ix.name]
    if per is None:
        return "not measured (bench/store/indexes.py times the executions' indexes, on commits)"
    keys = costs["keys"].get(ix.name, {})
    return ", ".join(f"{kind} {per[kind]:+.2f} ms ({keys[kind][0]} keys)" for kind in SHOWN_KINDS)


def _collection(name: str) -> str:
    return "<archive>" if name == ARCHIVE else f"<prefix>_{name}"


def _totals(costs: dict[str, Any]) -> str:
    if "every_index" not in costs:
        return "no figures"
    kinds = ", ".join(f"{k} {costs['every_index'][k]:.2f} / {costs['id_only'][k]:.2f} ms" for k in SHOWN_KINDS)
    return f"every index / `_id` only in the same run: {kinds}; kinds: " + "; ".join(
        f"{k}: {costs['kinds'][k]}" for k in SHOWN_KINDS
    )


def render(
    indexes: list[Index], served: dict[tuple[str, str], set[tuple[str, str, int]]], costs: dict[str, Any]
) -> str:
    lines = [
        "# Every index, the reads it serves and what it costs a write",
        "",
        "Generated by `tests/store/test_index_use.py` (`" + REGENERATE + "` rewrites it; the test fails while",
        "this page differs). Every index of every collection the package declares or creates, with the",
        "query shapes the code sends that use it, recorded on the wire while the store, the transport,",
        "a worker owning its partitions, the dashboard, the backlog (`harel-beanie status`), prune and",
        "its archive did real work. A read uses an index when its filter implies the index's partial",
        "filter and its equalities (then at most one range) bound a prefix of the key; it is listed",
        "under the indexes that bound the most of its fields (*bounds*: how many). Values are elided,",
        "constants a partial filter names are kept. The `_id` index of each collection is not listed",
        "(exempt: " + EXEMPT_KINDS["_id"] + "), nor the reads naming their documents by `_id`, which",
        "are its. The archive's collection is the one `retention.CollectionArchive` is given.",
        "",
        "The cost per write is the embedded server's (SecantusDB maintains and plans over every",
        "secondary index on every write, whether or not the write changes its fields): ms an index",
        "adds to each commit kind, the median over blocks of the time with every index minus the time",
        "without it, and the keys the kind's writes remove and add there on such a server; from",
        f"`bench/store/indexes.json` ({costs['run']}; {_totals(costs)}). The test fails on an index no recorded read uses (a TTL",
        "index is exempt: its reader is the server's expiry; a unique one only with the rule it",
        "enforces) and on one whose key is a prefix of another's under the same partial filter.",
        "",
        "| collection | index | key | reads it serves (operation: shape, bounds) | cost per write, embedded server |",
        "|---|---|---|---|---|",
    ]
    for ix in indexes:
        reads = sorted(served[(ix.collection, ix.name)])
        shown = "<br>".join(f"`{op}`: `{shape}`, {n}" for op, shape, n in reads)
        if not reads:
            shown = _exempt(ix) or "**none**"
        elif _exempt(ix):
            shown = _exempt(ix) + "<br>" + shown
        lines.append(
            f"| `{_collection(ix.collection)}` | `{ix.name}` | `{ix.describe()}` | {shown} | {_cost_text(ix, costs)} |"
        )
    return "\n".join(lines) + "\n"


def test_the_rules_fail_on_what_they_name() -> None:
    """The matching and the two failures on planted indexes and queries (no server): a read
    goes to the index bounding most of its fields, and only where it implies the partial
    filter; a key that is a prefix of another's under the same filter is flagged, under
    another filter not; an index no read uses is flagged unless TTL, or unique with its rule
    named."""
    x = Index("c", "x", (("x", 1),))
    xy = Index("c", "xy", (("x", 1), ("y", 1)))
    part = Index("c", "xy_p", (("x", 1), ("y", 1)), partial={"p": True})
    timer = Index("c", "t", (("t", 1),), partial={"t": {"$gte": float("-inf")}})
    waiting = Index("c", "w", (("a", 1),), partial={"n": {"$gt": 0}})

    def q(f: dict[str, Any]) -> Query:
        return Query("c", "find", "op", f)

    assert bounded_fields(xy, q({"x": 1, "y": {"$gt": 2}})) == 2
    assert bounded_fields(xy, q({"y": 2})) == 0  # not led by its first field
    assert bounded_fields(xy, q({"x": {"$gt": 1}, "y": 2})) == 1  # a range ends the prefix
    assert bounded_fields(part, q({"x": 1})) == 0 and bounded_fields(part, q({"x": 1, "p": True})) == 1
    assert bounded_fields(timer, q({"t": {"$lte": 5}})) == 0  # misses the partial filter
    assert bounded_fields(timer, q({"t": {"$gte": float("-inf"), "$lte": 5}})) == 1
    assert bounded_fields(waiting, q({"n": {"$gt": 0}, "a": {"$lte": 1}})) == 1
    assert bounded_fields(waiting, q({"n": {"$gte": 0}, "a": {"$lte": 1}})) == 0
    assert bounded_fields(xy, q({"$or": [{"x": 1}, {"x": 2, "y": 3}]})) == 1
    assert bounded_fields(xy, q({"$or": [{"x": 1}, {"y": 3}]})) == 0

    rec = Recorder("d")
    rec.queries.append(q({"x": 1, "y": 2}))
    served = _served([x, xy], [rec])
    assert not served[("c", "x")] and served[("c", "xy")]  # the longer bound wins
    xz = Index("c", "xz", (("x", 1), ("z", 1)))
    rec.queries[:] = [Query("c", "find", "op", {"x": 1}, ("z",)), q({"_id": "a", "x": 1})]
    served = _served([xy, xz], [rec])  # the one giving the sort; the read by `_id` is neither's
    assert not served[("c", "xy")] and served[("c", "xz")] == {("op", "find {x: =} sort z", 1)}
    assert _dominated([x, xy]) and not _dominated([x, part]) and not _dominated([xy, part])
    assert _exempt(Index("c", "ttl", (("at", 1),), ttl=60))
    assert not _exempt(Index("c", "u", (("k", 1),), unique=True)) and not _exempt(x)


def test_every_index_earns_its_place(recorded: list[Recorder]) -> None:
    """Runs last in this module: every index is used by a recorded read or exempt with its
    reason, none is a prefix of another under the same partial filter, and docs/INDEXES.md
    is the render of what was recorded."""
    assert len(recorded) >= 6, "run the module"
    indexes = _all_indexes(recorded)
    names = {(ix.collection, ix.name) for ix in indexes}
    # every collection the package made an index on is here, the archive's and the samples' too
    made = {("hb_samples", "hb_sample_ttl"), (ARCHIVE, "hb_archive_execution")}
    assert made <= names, made - names
    served = _served(indexes, recorded)
    unused = [
        f"{c}.{n}"
        for (c, n), reads in served.items()
        if not reads and not _exempt(next(ix for ix in indexes if (ix.collection, ix.name) == (c, n)))
    ]
    assert not unused, f"indexes no recorded read uses: {unused}"
    assert not _dominated(indexes), _dominated(indexes)
    page = render(indexes, served, _costs())
    if os.environ.get("HB_WRITE_DOCS") == "1":
        PAGE.write_text(page, encoding="utf-8")
    assert PAGE.exists() and PAGE.read_text(encoding="utf-8") == page, (
        f"docs/INDEXES.md is not the render: {REGENERATE}"
    )
