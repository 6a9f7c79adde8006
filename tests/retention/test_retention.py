"""Retention (harel_beanie.retention.pruning, `harel-beanie prune`): only finished executions older
than the cut-off go, never one whose parent is still going or that has work to hand on; a
dry run changes nothing; the archive holds exactly what was removed; an interrupted run,
re-run, completes; the retired TTL index is dropped."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson import json_util
from harel.engine.execution import Execution, Status
from harel.spec.states import Event
from pymongo import monitoring

from harel_beanie import MongoStore, retention
from harel_beanie.retention import archive as archive_internals
from harel_beanie.retention import pruning as prune_internals
from tests.commands.test_cli import run_cli

NOW = 1_800_000_000.0
OLD = NOW - 40 * 86400  # finished 40 days ago
CUT = NOW - 30 * 86400


def _exe(i: str, status: Status, finished: float | None, parent: str | None = None) -> Execution:
    return Execution(
        id=i,
        definition_id="Order",
        status=status,
        updated_at=finished or NOW,
        finished_at=finished,
        parent_id=parent,
        context={"n": i},
    )


async def seed(astore: Any) -> set[str]:
    """Executions of every kind; returns the ids prune may remove."""
    removable = set()
    for k in range(12):  # plain old finished roots, DONE and CANCELLED
        eid = f"old-{k:02d}"
        await astore.save(_exe(eid, Status.DONE if k % 3 else Status.CANCELLED, OLD))
        removable.add(eid)
    await astore.save(_exe("recent", Status.DONE, NOW - 86400))  # finished after the cut-off
    await astore.save(_exe("failed", Status.FAILED, None))  # a dead letter: kept
    await astore.save(_exe("failed-dated", Status.FAILED, OLD))  # even with a finish time
    await astore.save(_exe("running", Status.RUNNING, None))
    await astore.save(_exe("running:A:0", Status.DONE, OLD, parent="running"))  # parent going: kept
    await astore.save(_exe("failed:A:0", Status.DONE, OLD, parent="failed"))  # parent redrivable: kept
    await astore.save(_exe("old-00:A:0", Status.DONE, OLD, parent="old-00"))  # parent finished: goes
    removable.add("old-00:A:0")
    await astore.save(_exe("orphan:A:0", Status.CANCELLED, OLD, parent="gone-long-ago"))  # parent absent: goes
    removable.add("orphan:A:0")
    busy = _exe("busy", Status.DONE, OLD)  # finished, but its last event is not relayed yet
    await astore.commit(busy, [("old-01", Event(kind="Bye"))])
    return removable


def _ids(client: pymongo.MongoClient[Any], db: str) -> set[str]:
    return {d["_id"] for d in client[db].harel_executions.find({}, {"_id": 1})}


async def test_dry_run_changes_nothing_and_counts_what_would_go(astore, client, db_name) -> None:
    removable = await seed(astore)
    before = _ids(client, db_name)
    coll = astore._colls["executions"]
    report = await retention.prune(coll, CUT, dry_run=True, batch_size=5)
    assert set(report.removed_ids) == removable and report.removed == len(removable)
    assert report.kept_parent == 2
    assert _ids(client, db_name) == before


async def test_prune_removes_exactly_the_finished_and_archives_them(astore, client, db_name, tmp_path: Path) -> None:
    removable = await seed(astore)
    before = _ids(client, db_name)
    full = {d["_id"]: d for d in client[db_name].harel_executions.find({"_id": {"$in": sorted(removable)}})}
    archive = tmp_path / "pruned.jsonl"
    report = await retention.prune(
        astore._colls["executions"], CUT, archive=retention.JsonlArchive(archive), batch_size=4
    )
    assert report.removed == len(removable) and report.moved_on == 0
    left = _ids(client, db_name)
    assert left == before - removable
    assert {"recent", "failed", "failed-dated", "running", "running:A:0", "failed:A:0", "busy"} <= left
    lines = [json_util.loads(line) for line in archive.read_text().splitlines()]
    removals = retention.read_jsonl(archive).removals
    assert len(lines) == len(removals) == len({r.key for r in removals})
    assert sorted(r.execution_id for r in removals) == sorted(removable)  # each once
    assert all(r.document == full[r.execution_id] and r.incarnation == 1 for r in removals)  # whole, as stored
    assert not archive.with_name("pruned.jsonl.pending").exists()
    # nothing more to do: a second run removes nothing and archives nothing
    again = await retention.prune(astore._colls["executions"], CUT, archive=retention.JsonlArchive(archive))
    assert again.removed == 0 and len(archive.read_text().splitlines()) == len(removable)


async def test_a_changed_execution_is_not_removed(astore, client, db_name) -> None:
    await astore.save(_exe("old-x", Status.DONE, OLD))
    coll = astore._colls["executions"]
    batch = await coll.find({"_id": "old-x"}).to_list(None)
    await coll.update_one({"_id": "old-x"}, {"$inc": {"version": 1}})  # another writer, after the read
    report = retention.PruneReport(before=CUT, dry_run=False)
    await prune_internals._prune_batch(coll, batch, report, None, False)
    assert report.removed == 0 and report.moved_on == 1 and _ids(client, db_name) == {"old-x"}


@pytest.mark.parametrize("kind", ["file", "collection"])
async def test_an_interrupted_run_rerun_completes_and_archives_once(
    astore, client, db_name, tmp_path: Path, kind: str
) -> None:
    removable = await seed(astore)
    coll = astore._colls["executions"]

    def archive() -> Any:
        if kind == "file":
            return retention.JsonlArchive(tmp_path / "a.jsonl")
        return retention.CollectionArchive(astore._client[db_name], "pruned")

    # stopped after two batches, as an interruption would
    first = await retention.prune(coll, CUT, archive=archive(), batch_size=3, stop_after_batches=2)
    assert 0 < first.removed < len(removable)

    # interrupted mid-batch: the journal written, the deletes done, the archive not yet
    class Crash(Exception):
        pass

    broken = archive()

    async def crash(removed: list[dict[str, Any]]) -> None:
        raise Crash

    broken.finish = crash  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await retention.prune(coll, CUT, archive=broken, batch_size=3)

    rest = await retention.prune(coll, CUT, archive=archive(), batch_size=3)
    assert rest.recovered > 0
    assert _ids(client, db_name).isdisjoint(removable)
    if kind == "file":
        read = retention.read_jsonl(tmp_path / "a.jsonl")
        assert not (tmp_path / "a.jsonl.pending").exists()
    else:
        read = await archive().read()
        assert client[db_name].pruned_pending.count_documents({}) == 0
    archived = [r.execution_id for r in read.removals]
    assert sorted(archived) == sorted(removable)


async def test_the_retired_ttl_index_is_dropped_idempotently(astore, client, db_name) -> None:
    """An older release's `prune --ttl` left a TTL index letting the server delete finished
    executions behind the counters' back: `drop_ttl` (`prune --ttl off`) removes it."""
    await astore.init()
    coll = astore._colls["executions"]
    names = lambda: {ix["name"] for ix in client[db_name].harel_executions.list_indexes()}  # noqa: E731
    client[db_name].harel_executions.create_index(
        [("finished_on", 1)],
        name=retention.TTL_INDEX,
        expireAfterSeconds=86400,
        partialFilterExpression={"status": "DONE"},
    )
    assert retention.TTL_INDEX in names()
    assert "dropped" in await retention.drop_ttl(coll)
    assert retention.TTL_INDEX not in names()
    assert "nothing" in await retention.drop_ttl(coll)


def test_parse_before() -> None:
    assert retention.parse_before("30d", now=NOW) == NOW - 30 * 86400
    assert retention.parse_before("12h", now=NOW) == NOW - 12 * 3600
    assert retention.parse_before("@1700000000") == 1_700_000_000.0
    assert retention.parse_before("2024-01-01") == 1_704_067_200.0
    assert retention.parse_before("2024-01-01T01:00:00+01:00") == 1_704_067_200.0
    with pytest.raises(ValueError):
        retention.parse_before("last tuesday")


def _progress(stdout: str) -> list[str]:
    """The words of the progress bar's last line, without the bar and the elapsed time."""
    line = [line for line in stdout.splitlines() if line.startswith("examining")][-1]
    return [w for w in line.split() if not set(w) <= set("━─╸╺") and not re.fullmatch(r"\d+:\d\d:\d\d", w)]


def test_prune_command_dry_run_then_for_real(tmp_path: Path, mongo_url: str, client, db_name) -> None:
    coll = client[db_name].harel_executions
    import time

    for k in range(7):
        exe = Execution(id=f"p-{k}", definition_id="Order", status=Status.DONE, finished_at=time.time() - 40 * 86400)
        coll.insert_one(
            {
                "_id": exe.id,
                "definition_id": "Order",
                "version": 1,
                "data": exe.model_dump_json(),
                "status": "DONE",
                "finished_at": exe.finished_at,
                "parent_id": None,
            }
        )
    args = ("prune", "--url", mongo_url, "--db", db_name, "--finished-before", "30d", "--batch-size", "3")
    dry = run_cli(*args, "--dry-run", "--json", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["removed"] == 7 and coll.count_documents({}) == 7
    shown = run_cli(*args, "--dry-run", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert _progress(shown.stdout) == ["examining", "7/7", "7", "to", "remove"]
    real = run_cli(*args, "--yes", "--archive", str(tmp_path / "out.jsonl"), cwd=tmp_path)
    assert real.returncode == 0, real.stderr
    # the progress line's count column once printed "7 removingd"
    assert _progress(real.stdout) == ["examining", "7/7", "7", "removed"]
    assert "7 removed of 7" in real.stdout and coll.count_documents({}) == 0
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 7
    bad = run_cli("prune", "--url", mongo_url, "--db", db_name, "--finished-before", "soon", cwd=tmp_path)
    assert bad.returncode == 2 and "expected an age" in bad.stderr


# --- reused ids: every removal of every incarnation ---------------------------------------------


def _incarnation(i: str, n: int) -> Execution:
    context = {"incarnation": n}
    return Execution(id=i, definition_id="Order", status=Status.DONE, updated_at=OLD, finished_at=OLD, context=context)


async def test_a_reused_id_keeps_every_removal_in_a_collection_archive(astore, client, db_name) -> None:
    """An id may be created again once prune removed it (prune leaves no tombstone). The
    collection archive used to replace by the execution id, so pruning a re-created id
    overwrote its earlier removal: no kill needed to lose one."""
    coll = astore._colls["executions"]
    stored = []
    for n in (1, 2, 3):
        await astore.save(_incarnation("x", n))
        stored.append(client[db_name].harel_executions.find_one({"_id": "x"}))
        report = await retention.prune(
            coll, CUT, archive=retention.CollectionArchive(astore._client[db_name], "pruned")
        )
        assert report.removed == 1
    assert client[db_name].pruned.count_documents({}) == 3  # one record per removal
    read = await retention.CollectionArchive(astore._client[db_name], "pruned").read()
    assert [(r.execution_id, r.incarnation, r.document) for r in read.removals] == [
        ("x", n, stored[n - 1]) for n in (1, 2, 3)
    ]
    assert len({r.key for r in read.removals}) == 3
    assert any(ix["key"] == {"execution_id": 1, "pruned_at": 1} for ix in client[db_name].pruned.list_indexes())


@pytest.mark.parametrize("kind", ["file", "collection"])
async def test_a_reused_ids_removal_interrupted_after_its_deletes_is_recovered(
    astore, client, db_name, tmp_path: Path, kind: str
) -> None:
    """Prune x, create x again, and interrupt the second prune after its deletes: recovery
    used to skip the journal's record because an x was already in the archive, then clear
    the journal, so the second removal was in no archive."""
    coll = astore._colls["executions"]

    def archive() -> Any:
        if kind == "file":
            return retention.JsonlArchive(tmp_path / "a.jsonl")
        return retention.CollectionArchive(astore._client[db_name], "pruned")

    await astore.save(_incarnation("x", 1))
    first = client[db_name].harel_executions.find_one({"_id": "x"})
    await retention.prune(coll, CUT, archive=archive())
    await astore.save(_incarnation("x", 2))
    second = client[db_name].harel_executions.find_one({"_id": "x"})

    class Crash(Exception):
        pass

    broken = archive()
    fired = []

    async def crash(removed: list[dict[str, Any]]) -> None:
        fired.append([d["_id"] for d in removed])
        raise Crash

    broken.finish = crash  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await retention.prune(coll, CUT, archive=broken)
    assert fired == [["x"]] and _ids(client, db_name) == set()  # deleted, not yet archived

    rest = await retention.prune(coll, CUT, archive=archive())
    assert rest.recovered == 1
    if kind == "file":
        records = retention.read_jsonl(tmp_path / "a.jsonl").records
    else:
        records = list(client[db_name].pruned.find({}))
    assert len(records) == 2, records  # both removals
    read = retention.read_jsonl(tmp_path / "a.jsonl") if kind == "file" else await archive().read()
    assert [(r.incarnation, r.document) for r in read.removals] == [(1, first), (2, second)]


async def test_an_id_created_again_between_the_read_and_the_delete_is_not_removed(
    astore, client, db_name, tmp_path: Path
) -> None:
    """The delete was guarded on `_id`, `version` and `status` only: an id removed and created
    again between prune's read and its delete (same version, same status) was deleted in
    place of the one read, and the archive got the one read, so the new one was lost."""
    await astore.save(_incarnation("x", 1))
    coll = astore._colls["executions"]
    batch = await coll.find({"_id": "x"}).to_list(None)
    await coll.delete_one({"_id": "x"})  # removed by another run...
    await astore.save(_incarnation("x", 2))  # ...and created again, at the same version
    again = client[db_name].harel_executions.find_one({"_id": "x"})
    assert again["version"] == batch[0]["version"] and again["born"] != batch[0]["born"]
    report = retention.PruneReport(before=CUT, dry_run=False)
    archive = retention.JsonlArchive(tmp_path / "a.jsonl")
    await prune_internals._prune_batch(coll, batch, report, archive, False)
    # still stored (the counts' fold of the ids prune marked may have counted it)
    counted = ("cc", "cseq", "cdirty")
    now = client[db_name].harel_executions.find_one({"_id": "x"})
    assert {k: v for k, v in now.items() if k not in counted} == {k: v for k, v in again.items() if k not in counted}
    # the one read is gone by another run's hand: that run's to archive, not this one's
    # (two prunes at once archive each removal once: retention.removal)
    assert retention.read_jsonl(tmp_path / "a.jsonl").removals == [] and report.removed == 0


async def test_an_execution_purged_during_a_prune_is_archived_by_neither(
    astore, client, db_name, tmp_path: Path
) -> None:
    """A purge between prune's read and its deletes: prune's read-back took the tombstone for
    "gone" and archived the execution as removed. A purge is no removal: its tombstone buries
    the incarnation read (`archive.gone_among`), and prune neither archives nor reports it."""
    await astore.save(_exe("old-p", Status.DONE, OLD))
    await astore.save(_exe("old-q", Status.DONE, OLD))
    coll = astore._colls["executions"]
    batch = await coll.find({"_id": {"$in": ["old-p", "old-q"]}}).to_list(None)
    assert await astore.purge("old-p", batch[0]["version"])  # purged after prune's read
    report = retention.PruneReport(before=CUT, dry_run=False)
    archive = retention.JsonlArchive(tmp_path / "a.jsonl")
    await prune_internals._prune_batch(coll, batch, report, archive, False)
    archived = [r.execution_id for r in retention.read_jsonl(tmp_path / "a.jsonl").removals]
    assert archived == ["old-q"] and report.removed == 1 and report.removed_ids == ["old-q"]
    assert client[db_name].harel_executions.find_one({"_id": "old-p"})["tomb"]


def test_prune_ttl_is_retired_naming_worker_retain_and_off_drops_the_index(
    tmp_path: Path, mongo_url: str, store, client, db_name
) -> None:
    """`prune --ttl 30d` created a TTL index whose expiries drifted the counts for good: it is
    refused in one line naming `worker --retain`, before any server is reached, and
    `--ttl off` still drops an index an older release made."""
    out = run_cli("prune", "--url", "mongodb://127.0.0.1:1", "--db", db_name, "--ttl", "30d", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "worker --retain" in out.stderr, out.stderr
    store.save(_exe("dated", Status.DONE, OLD))
    client[db_name].harel_executions.create_index([("finished_on", 1)], name="hb_finished_ttl", expireAfterSeconds=60)
    out = run_cli("prune", "--url", mongo_url, "--db", db_name, "--ttl", "off", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "dropped the TTL index hb_finished_ttl" in " ".join(out.stdout.split())
    assert "hb_finished_ttl" not in {ix["name"] for ix in client[db_name].harel_executions.list_indexes()}


def test_the_reader_numbers_incarnations_across_an_older_archive(tmp_path: Path) -> None:
    """An archive written before removal keys holds the stored documents themselves; appended
    to by this release, each of its lines still reads as one removal of its id."""
    path = tmp_path / "old.jsonl"
    older = {"_id": "x", "version": 3, "data": "{}"}
    archive = retention.JsonlArchive(path)
    archive._append([older])
    newer = archive_internals.removal_record({"_id": "x", "version": 1, "data": "{}", "born": "b2"}, NOW)
    archive._append([newer])
    removals = archive.read().removals
    assert [(r.key, r.execution_id, r.incarnation, r.pruned_at) for r in removals] == [
        ("x", "x", 1, None),
        (newer["_id"], "x", 2, NOW),
    ]
    assert [r.document for r in removals] == [older, newer["document"]]


# --- the cost of a batch ---------------------------------------------------------------------


class _Reads(monitoring.CommandListener):
    """The filters of the reads a client sends to the executions (find, and an aggregate's
    first `$match`, the part a server plans with)."""

    def __init__(self) -> None:
        self.filters: list[dict[str, Any]] = []

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        cmd = event.command
        if event.command_name == "find" and cmd["find"] == "harel_executions":
            self.filters.append(dict(cmd.get("filter", {})))
        elif event.command_name == "aggregate" and cmd["aggregate"] == "harel_executions":
            self.filters.append(dict(cmd["pipeline"][0].get("$match", {})))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        pass

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass


async def test_each_batch_reads_about_a_batch_however_many_remain(mongo_url: str, client, db_name) -> None:
    """A server may read every match of a query whatever its limit (SecantusDB does), so what
    a batch costs is what its reads' filters match, not what they return. Prune once read each
    batch as "the next 500 finished after the last id": at 100,000 executions, 122 a second and
    slower at every batch. Here every read prune sends, counted against the database as it was
    before the run (a copy), matches at most a few batches' worth, at the first batch and the
    last alike, and every finished execution before the cut-off is removed."""
    batch, n = 50, 1_500
    rows = []
    for i in range(n):  # finished over the 60 days before NOW, evenly, in a shuffled id order
        at = NOW - 60 * 86400 * (i + 0.5) / n
        exe = _exe(f"e-{(i * 7919) % n:05d}", Status.DONE if i % 5 else Status.CANCELLED, at)
        rows.append(
            {
                "_id": exe.id,
                "definition_id": "Order",
                "version": 1,
                "data": exe.model_dump_json(),
                "status": exe.status.value,
                "finished_at": at,
                "updated_at": at,
                "parent_id": None,
            }
        )
    MongoStore(pymongo.MongoClient(mongo_url), db_name).init()  # the indexes, as on a store in use
    client[db_name].harel_executions.insert_many(rows)
    client[db_name].before_the_run.insert_many(rows)
    reads = _Reads()
    watched = pymongo.AsyncMongoClient(mongo_url, event_listeners=[reads])
    try:
        report = await retention.prune(watched[db_name].harel_executions, CUT, batch_size=batch)
    finally:
        await watched.close()
    old = {r["_id"] for r in rows if r["finished_at"] < CUT}
    assert report.removed == len(old) > 10 * batch and _ids(client, db_name) == {r["_id"] for r in rows} - old
    matched = [client[db_name].before_the_run.count_documents(f) for f in reads.filters]
    assert max(matched) <= 4 * batch, sorted(matched)[-5:]
