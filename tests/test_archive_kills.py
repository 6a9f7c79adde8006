"""The prune archive survives any kill: `harel-beanie prune --archive` is SIGKILLed at every step
of a batch (tests/crash_prune.py names them), in a loop, on the real server; then a later
run's recovery is killed half-way through its own append; then a run completes. Every time,
the archive holds each removed execution exactly once, whole (equal to the stored document),
on lines that all parse as Extended JSON, and nothing removed is missing from it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pymongo
import pytest
from harel.engine.execution import Execution, Status

from harel_beanie import MongoStore, retention
from tests.crash_prune import POINTS

OLD = 1_700_000_000.0
REMOVABLE = 10
BATCH = 4  # 10 removable: batches of 4, 4 and 2
REPO = Path(__file__).resolve().parents[1]


def _seed(mongo_url: str, db_name: str) -> dict[str, dict[str, Any]]:
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    try:
        for i in range(REMOVABLE):
            store.save(Execution(id=f"old-{i:02d}", definition_id="Order", status=Status.DONE, finished_at=OLD,
                                 context={"n": i, "text": "ünïcode \"quoted\" \\ and a\nnewline"}))  # fmt: skip
        store.save(Execution(id="failed", definition_id="Order", status=Status.FAILED))
        store.save(Execution(id="running", definition_id="Order", status=Status.RUNNING))
    finally:
        store.close()
    coll = pymongo.MongoClient(mongo_url)[db_name].harel_executions
    return {d["_id"]: d for d in coll.find({"status": "DONE"})}


def _prune(mongo_url: str, db_name: str, archive: Path, *kill: str) -> subprocess.CompletedProcess[str]:
    flags = ["--url", mongo_url, "--db", db_name, "--finished-before", "@1800000000",
             "--archive", str(archive), "--batch-size", str(BATCH)]  # fmt: skip
    command = ["-m", "tests.crash_prune", *kill, *flags] if kill else ["-m", "harel_beanie", "prune", *flags]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def _check(archive: Path, removable: dict[str, dict[str, Any]], gone: set[str]) -> None:
    read = retention.read_jsonl(archive)
    assert read.corrupt == [], read.corrupt
    ids = [r["_id"] for r in read.records]
    assert len(ids) == len(set(ids)), f"archived twice: {sorted(i for i in ids if ids.count(i) > 1)}"
    assert set(ids) == gone, f"removed but not archived: {sorted(gone - set(ids))}; archived but not removed: {sorted(set(ids) - gone)}"  # fmt: skip
    for record in read.records:
        assert record == removable[record["_id"]], record["_id"]  # whole, as stored
    assert not archive.exists() or archive.read_bytes().endswith(b"\n")


def _gone(client: pymongo.MongoClient[Any], db_name: str, removable: dict[str, Any]) -> set[str]:
    present = {d["_id"] for d in client[db_name].harel_executions.find({}, {"_id": 1})}
    return set(removable) - present


def _scenario(client: pymongo.MongoClient[Any], mongo_url: str, tmp_path: Path, point: str, batch: int) -> int:
    """One kill at `point` of `batch`, a recovery killed half-way when it has something to
    append, then a run to the end; the archive checked after each. Returns the kills made."""
    db_name = f"hbt_kill_{uuid.uuid4().hex[:10]}"
    archive = tmp_path / f"{point}-{batch}.jsonl"
    try:
        removable = _seed(mongo_url, db_name)
        killed = _prune(mongo_url, db_name, archive, point, str(batch))
        assert killed.returncode == -9 and f"KILLED {point}" in killed.stderr, (point, batch, killed.stderr[-2000:])
        kills = 1
        journal = archive.with_name(archive.name + ".pending")
        gone = _gone(client, db_name, removable)
        must_append = journal.exists() and bool(gone - {r["_id"] for r in retention.read_jsonl(archive).records})
        if must_append:
            again = _prune(mongo_url, db_name, archive, "recover-torn", "0")
            assert again.returncode == -9 and "KILLED recover-torn" in again.stderr, again.stderr[-2000:]
            kills += 1
        done = _prune(mongo_url, db_name, archive)
        assert done.returncode == 0, done.stderr[-2000:]
        gone = _gone(client, db_name, removable)
        assert gone == set(removable), sorted(set(removable) - gone)  # the resumed run completed it
        _check(archive, removable, gone)
        assert not journal.exists()
        return kills
    finally:
        client.drop_database(db_name)


def _loop(client: pymongo.MongoClient[Any], mongo_url: str, tmp_path: Path, batches: tuple[int, ...]) -> int:
    kills = 0
    for point in POINTS:
        if point == "recover-torn":  # made inside each scenario, when a recovery has work
            continue
        for batch in batches:
            kills += _scenario(client, mongo_url, tmp_path, point, batch)
    return kills


def test_the_archive_survives_a_kill_at_every_step_of_a_batch(client, mongo_url, tmp_path, figures) -> None:
    """Every step of the middle batch (its journal, its deletes, its append, between batches),
    and a recovery killed during its own append wherever it has one to make."""
    kills = _loop(client, mongo_url, tmp_path, batches=(1,))
    figures.set(kills=kills, steps=len(POINTS) - 1)


@pytest.mark.soak
def test_the_archive_survives_a_kill_at_every_step_of_every_batch(client, mongo_url, tmp_path, figures) -> None:
    kills = _loop(client, mongo_url, tmp_path, batches=(0, 1, 2))
    figures.set(kills=kills, steps=len(POINTS) - 1)
