"""The counters collection dropped on a live database and built again by `harel-beanie
migrate up`, as the CHANGELOG tells an operator to, while a `harel-beanie worker` folds and
two `harel-beanie prune` runs remove the same finished executions into one archive, each
its own process through the real commands, and this process commits status changes
throughout. Then every source of the counts (`harel-beanie status --json`, the store's
queries, the dashboard) equals a count of the documents after the next fold, and the
archive holds each removal once, the prunes' reports adding up to what was removed.

The faults this holds: the rebuilt counter restarted at seq 0 while the documents carried
marks above it, so every fold's marks were refused and the counts drifted with each fold
(core/counting.py, Rule 6); two prunes both archived and reported what one removed
(retention/removal.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pymongo
from harel.engine.execution import Execution, Status
from harel.engine.store.base import Step

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.core.count_documents import counts_collection
from harel_beanie.deploy.loader import default_models_dir
from tests.support.exact_counts import exact_counts
from tests.support.processes import terminate

REPO = Path(__file__).resolve().parents[2]
OLD = 1_700_000_000.0
CUT = 1_750_000_000.0
#: finished long ago (the prunes' work), running (the status changes' work)
FINISHED, RUNNING = 40, 30
ARCHIVE = "pruned"


def _seed(url: str, db: str) -> None:
    store = MongoStore(pymongo.MongoClient(url), db)
    try:
        store.init()
        for i in range(FINISHED):
            store.save(Execution(id=f"old-{i:02d}", definition_id="Order", status=Status.DONE, finished_at=OLD))
            if i % 8 == 7:
                store.fold_counts()  # marks of several seqs, as a database in use carries
        for i in range(RUNNING):
            store.save(Execution(id=f"run-{i:02d}", definition_id="Order", status=Status.RUNNING))
        store.fold_counts()
    finally:
        store.close()


def _finish_some(url: str, db: str, ids: list[str]) -> None:
    store = MongoStore(pymongo.MongoClient(url), db)
    try:
        for i in ids:
            exe = store.load(i)
            assert exe is not None
            exe.status, exe.finished_at = Status.DONE, 2e9  # finished now: not prunable
            store.commit(exe, [], step=Step(cause="event", from_status=Status.RUNNING, to_status=Status.DONE))
    finally:
        store.close()


async def _command(*argv: str, log: Path) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = open(log, "wb")
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "harel_beanie", *argv, stdout=out, stderr=asyncio.subprocess.STDOUT, env=env, cwd=REPO
    )


async def _ready(log: Path, proc: asyncio.subprocess.Process) -> None:
    for _ in range(600):
        if b" ready:" in log.read_bytes():
            return
        assert proc.returncode is None, log.read_text()[-2000:]
        await asyncio.sleep(0.1)
    raise AssertionError(f"the worker never said it was ready: {log.read_text()[-2000:]}")


async def _run(url: str, db: str, tmp: Path) -> None:
    _seed(url, db)
    where = ["--url", url, "--db", db]
    worker_log = tmp / "worker.log"
    worker = await _command(
        "worker", "--definitions", str(default_models_dir()), *where, "--sweep-every", "0.5", log=worker_log
    )
    try:
        await _ready(worker_log, worker)
        await asyncio.to_thread(_finish_some, url, db, [f"run-{i:02d}" for i in range(10)])
        pymongo.MongoClient(url)[db].drop_collection(counts_collection("harel"))
        prune = ["prune", *where, "--finished-before", f"@{CUT:.0f}", "--archive-collection", ARCHIVE, "--yes"]
        procs = [
            await _command("migrate", "up", *where, log=tmp / "migrate.log"),
            await _command(*prune, "--batch-size", "4", "--json", log=tmp / "prune1.log"),
            await _command(*prune, "--batch-size", "6", "--json", log=tmp / "prune2.log"),
        ]
        await asyncio.to_thread(_finish_some, url, db, [f"run-{i:02d}" for i in range(10, 20)])
        codes = [await asyncio.wait_for(p.wait(), timeout=300) for p in procs]
        logs = [(tmp / n).read_text() for n in ("migrate.log", "prune1.log", "prune2.log")]
        assert codes == [0, 0, 0], logs
    finally:
        await terminate(worker)
    reports = [json.loads(text[text.index("{") :]) for text in logs[1:]]
    client: Any = pymongo.AsyncMongoClient(url)
    store = AsyncMongoStore(client, db)
    try:
        await store.init()
        check = await exact_counts(store, url)  # as left, then after a fold of every partition
        assert not check.problems, "\n".join(check.problems)
        sync = pymongo.MongoClient(url)[db]
        left = sync.harel_executions.count_documents({"_id": {"$regex": "^old-"}})
        records = list(sync[ARCHIVE].find({}, {"execution_id": 1, "document.born": 1}))
        archived = Counter((r["execution_id"], r["document"].get("born")) for r in records)
        twice = {k: n for k, n in archived.items() if n > 1}
        assert not twice, f"archived more than once: {twice}"
        assert len(archived) == FINISHED - left, (len(archived), FINISHED, left)
        assert sum(r["removed"] for r in reports) == len(archived), reports
        assert sync.harel_executions.count_documents({"cdirty": True}) == 0  # the fold marked all
    finally:
        await client.close()


def test_counters_dropped_and_rebuilt_beside_a_worker_and_two_prunes_are_exact(
    mongo_url: str, client: Any, tmp_path: Path
) -> None:
    db = f"hbt_rebuild_{uuid.uuid4().hex[:10]}"
    try:
        asyncio.run(_run(mongo_url, db, tmp_path))
    finally:
        client.drop_database(db)
