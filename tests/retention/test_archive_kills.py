"""The prune archive survives any kill, for reused ids: `harel-beanie prune` with `--archive`
or `--archive-collection` is SIGKILLed at every step of a batch (tests/support/crash_prune.py names
them), in a loop, on the real server, while it removes the second incarnation of every id
(the first already pruned and archived: prune leaves no tombstone, so an id may be created
again); then a later run's recovery is killed half-way through its own append; then a run
completes. The archive then holds each removal of each incarnation exactly once, whole
(equal to the stored document), in the order the incarnations were removed, on lines that
all parse as Extended JSON, and nothing removed is missing from it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pymongo
import pytest
from harel.engine.execution import Execution, Status

from harel_beanie import MongoStore, retention
from harel_beanie.retention.archive import LEASE
from tests.support.crash_prune import POINTS

OLD = 1_700_000_000.0
CUT = 1_800_000_000.0
REMOVABLE = 10
BATCH = 4  # 10 removable: batches of 4, 4 and 2
KINDS = ("file", "collection")
ARCHIVE_COLLECTION = "pruned"
REPO = Path(__file__).resolve().parents[2]
TEXT = 'ünïcode "quoted" \\ and a\nnewline'


def _seed(mongo_url: str, db_name: str, incarnation: int) -> dict[str, dict[str, Any]]:
    """The removable executions (created again under the same ids for a later incarnation),
    as stored."""
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    try:
        for i in range(REMOVABLE):
            context = {"n": i, "incarnation": incarnation, "text": TEXT}
            store.save(
                Execution(
                    id=f"old-{i:02d}", definition_id="Order", status=Status.DONE, finished_at=OLD, context=context
                )
            )
        if incarnation == 1:
            store.save(Execution(id="failed", definition_id="Order", status=Status.FAILED))
            store.save(Execution(id="running", definition_id="Order", status=Status.RUNNING))
    finally:
        store.close()
    coll = pymongo.MongoClient(mongo_url)[db_name].harel_executions
    return {d["_id"]: d for d in coll.find({"status": "DONE"})}


def _archive(kind: str, path: Path, db: Any) -> Any:
    if kind == "file":
        return retention.JsonlArchive(path)
    return retention.CollectionArchive(db, ARCHIVE_COLLECTION)


async def _prune_here(
    mongo_url: str, db_name: str, kind: str, path: Path, *, later: bool = False
) -> retention.PruneReport:
    """A whole run in this process: what `harel-beanie prune` runs, without its start-up; on
    a clock past `LEASE`, when a killed run's leaving marks no longer hold what it marked."""
    client: pymongo.AsyncMongoClient[Any] = pymongo.AsyncMongoClient(mongo_url)
    at = time.time() + (LEASE + 1 if later else 0)
    try:
        archive = _archive(kind, path, client[db_name])
        coll = client[db_name].harel_executions
        return await retention.prune(coll, CUT, archive=archive, batch_size=BATCH, clock=lambda: at)
    finally:
        await client.close()


def _prune_killed(mongo_url: str, db_name: str, kind: str, path: Path, *kill: str) -> subprocess.CompletedProcess[str]:
    to = ["--archive", str(path)] if kind == "file" else ["--archive-collection", ARCHIVE_COLLECTION]
    flags = ["--url", mongo_url, "--db", db_name, "--finished-before", f"@{CUT:.0f}", *to, "--batch-size", str(BATCH)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "tests.support.crash_prune", *kill, *flags]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def _contents(kind: str, path: Path, db: Any) -> tuple[retention.ArchiveContents, list[dict[str, Any]]]:
    """What the archive holds, and what its journal holds."""
    if kind == "file":
        return retention.read_jsonl(path), retention.read_jsonl(path.with_name(path.name + ".pending")).records
    records = list(db[ARCHIVE_COLLECTION].find({}).sort([("pruned_at", 1), ("_id", 1)]))
    return retention.ArchiveContents(records=records), list(db[ARCHIVE_COLLECTION + "_pending"].find({}))


def _check(kind: str, path: Path, db: Any, incarnations: list[dict[str, dict[str, Any]]]) -> None:
    read, journal = _contents(kind, path, db)
    assert journal == [] and not path.with_name(path.name + ".pending").exists()
    assert read.corrupt == [], read.corrupt
    keys = [r.key for r in read.removals]
    assert len(keys) == len(set(keys)), "a removal key archived twice"
    found = {(r.execution_id, r.incarnation): r.document for r in read.removals}
    expected = {(i, n): stored[i] for n, stored in enumerate(incarnations, start=1) for i in stored}
    assert len(found) == len(read.removals), "a removal archived twice"
    assert found.keys() == expected.keys(), (
        f"removed but not archived: {sorted(expected.keys() - found.keys())}; "
        f"archived but not removed: {sorted(found.keys() - expected.keys())}"
    )
    for key, document in found.items():
        assert document == expected[key], key  # whole, as stored, and the right incarnation
    if kind == "file":
        assert path.read_bytes().endswith(b"\n")


def _scenario(
    client: pymongo.MongoClient[Any], mongo_url: str, tmp_path: Path, point: str, batch: int, kind: str
) -> int:
    """Every id pruned once, created again, then one kill at `point` of `batch` while the
    second incarnations go; a recovery killed half-way when it has something to append; a
    run to the end; the archive checked. Returns the kills made."""
    db_name = f"hbt_kill_{uuid.uuid4().hex[:10]}"
    db = client[db_name]
    path = tmp_path / f"{kind}-{point}-{batch}.jsonl"
    try:
        first = _seed(mongo_url, db_name, 1)
        assert asyncio.run(_prune_here(mongo_url, db_name, kind, path)).removed == REMOVABLE
        second = _seed(mongo_url, db_name, 2)
        killed = _prune_killed(mongo_url, db_name, kind, path, point, str(batch))
        assert killed.returncode == -9 and f"KILLED {point}" in killed.stderr, (point, batch, killed.stderr[-2000:])
        kills = 1
        present = {d["_id"] for d in db.harel_executions.find({}, {"_id": 1})}
        read, journal = _contents(kind, path, db)
        must_append = [r for r in journal if r["execution_id"] not in present and r["_id"] not in read.keys()]
        if must_append:
            again = _prune_killed(mongo_url, db_name, kind, path, "recover-torn", "0")
            assert again.returncode == -9 and "KILLED recover-torn" in again.stderr, again.stderr[-2000:]
            kills += 1
        asyncio.run(_prune_here(mongo_url, db_name, kind, path, later=True))
        assert db.harel_executions.count_documents({"_id": {"$in": sorted(second)}}) == 0  # completed
        _check(kind, path, db, [first, second])
        return kills
    finally:
        client.drop_database(db_name)


def _loop(client: pymongo.MongoClient[Any], mongo_url: str, tmp_path: Path, batches: tuple[int, ...]) -> int:
    kills = 0
    for kind in KINDS:
        for point in POINTS:
            if point == "recover-torn":  # made inside each scenario, when a recovery has work
                continue
            for batch in batches:
                kills += _scenario(client, mongo_url, tmp_path, point, batch, kind)
    return kills


def test_the_archive_survives_a_kill_at_every_step_of_a_batch(client, mongo_url, tmp_path, figures) -> None:
    """Every step of the middle batch (its journal, its deletes, its append, between batches),
    for a file and a collection, and a recovery killed during its own append wherever it has
    one to make."""
    kills = _loop(client, mongo_url, tmp_path, batches=(1,))
    figures.set(kills=kills, steps=len(POINTS) - 1, kinds=len(KINDS))


@pytest.mark.soak
def test_the_archive_survives_a_kill_at_every_step_of_every_batch(client, mongo_url, tmp_path, figures) -> None:
    kills = _loop(client, mongo_url, tmp_path, batches=(0, 1, 2))
    figures.set(kills=kills, steps=len(POINTS) - 1, kinds=len(KINDS))
