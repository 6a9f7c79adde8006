"""Several `harel-beanie worker --retain 30d` processes retaining at once into one archive
collection, beside a manual `harel-beanie prune` into the same archive, while this process
stores executions that finished long ago (new ids, and ids removed once created again),
finishes running ones now, and kills workers mid-run (SIGKILL) and starts them again. Each
party is its own process through the real commands.

Then: every execution a retention of 30 days may remove is gone (progress: whatever a kill
left marked leaving is taken by the next removal once its lease has passed, here by a prune
whose clock is past it), the rest is all there; the archive holds each removal (each
incarnation of an id) exactly once; every source of the counts equals a count of the
documents, as left and after a fold (tests/support/exact_counts.py).

The faults this holds: the TTL index, which this retention replaces, let the server delete
finished executions behind the counters' back, and the counts drifted for good; two
removals of one batch (two retaining workers whose leases moved, a worker and a manual
prune) each archived and reported what one removed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymongo
import pytest
from harel.engine.execution import Execution, Status
from harel.engine.store.base import Step

from harel_beanie import AsyncMongoStore, MongoStore
from harel_beanie.deploy.loader import default_models_dir
from harel_beanie.retention import CollectionArchive, prune
from harel_beanie.retention.archive import LEASE
from harel_beanie.transport.ownership import TAKEOVER_BOUND
from tests.support.exact_counts import exact_counts
from tests.support.processes import terminate

REPO = Path(__file__).resolve().parents[2]
DAY = 86400.0
ARCHIVE = "pruned"
#: beyond the partitions' takeover, what the retaining runs and the sweeps take to finish
ALLOWANCE = 30.0


@dataclass(frozen=True)
class Plan:
    workers: int  # retaining at once
    rounds: int  # of new old-finished executions (and re-creations), one every `pause` seconds
    per_round: int
    kills: int  # SIGKILLs of a worker, each started again
    pause: float


DEFAULT = Plan(workers=3, rounds=8, per_round=6, kills=1, pause=0.5)
SOAK = Plan(workers=4, rounds=40, per_round=12, kills=6, pause=0.5)


def _exe(i: str, status: Status, finished: float | None, parent: str | None = None) -> Execution:
    at = finished or time.time()
    return Execution(id=i, definition_id="Order", status=status, updated_at=at, finished_at=finished, parent_id=parent)


class Writer:
    """This process's writes: old-finished executions (the retention's work), ids removed
    once created again, running ones finished now (kept), and what must stay."""

    def __init__(self, url: str, db: str, rng: random.Random) -> None:
        self.store = MongoStore(pymongo.MongoClient(url), db)
        self.store.init()
        self.rng = rng
        self.created: Counter[str] = Counter()  # incarnations created of each removable id
        self.kept: set[str] = set()
        self.n = 0

    def seed(self) -> None:
        old = time.time() - 40 * DAY
        for i in range(6):
            self.store.save(_exe(f"run-{i}", Status.RUNNING, None))
            self.kept.add(f"run-{i}")
            # a child finished long ago whose parent is still going: kept
            self.store.save(_exe(f"run-{i}:A:0", Status.DONE, old, parent=f"run-{i}"))
            self.kept.add(f"run-{i}:A:0")
            self.store.save(_exe(f"live-{i}", Status.RUNNING, None))  # finished now, by a round: kept
            self.kept.add(f"live-{i}")
        self.store.save(_exe("failed", Status.FAILED, None))
        self.store.save(_exe("recent", Status.DONE, time.time() - DAY))  # inside the retention
        self.kept |= {"failed", "recent"}

    def round(self, per: int) -> None:
        old = time.time() - 40 * DAY
        coll = self.store._colls["executions"]
        stored = {d["_id"] for d in coll.find({"_id": {"$in": list(self.created)}}, {"_id": 1})}
        gone = sorted(i for i in self.created if i not in stored)
        for _ in range(per):
            if gone and self.rng.random() < 0.25:
                eid = gone.pop(self.rng.randrange(len(gone)))  # removed once: created again, removed again
            else:
                eid, self.n = f"old-{self.n:04d}", self.n + 1
            self.store.save(_exe(eid, Status.DONE if self.rng.random() < 0.7 else Status.CANCELLED, old))
            self.created[eid] += 1
        running = sorted(i for i in self.kept if i.startswith("live-"))
        exe = self.store.load(self.rng.choice(running))
        if exe is not None and exe.status == Status.RUNNING and self.rng.random() < 0.3:
            exe.status, exe.finished_at = Status.DONE, time.time()  # finished now: kept
            self.store.commit(exe, [], step=Step(cause="event", from_status=Status.RUNNING, to_status=Status.DONE))

    def close(self) -> None:
        self.store.close()


async def _command(*argv: str, log: Path) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    out = open(log, "ab")
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "harel_beanie", *argv, stdout=out, stderr=asyncio.subprocess.STDOUT, env=env, cwd=REPO
    )


def _gone(client: Any, db: str, ids: list[str]) -> list[str]:
    stored = {d["_id"] for d in client[db].harel_executions.find({"_id": {"$in": ids}}, {"_id": 1})}
    return [i for i in ids if i not in stored]


async def _run(url: str, db: str, tmp: Path, plan: Plan, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    writer = Writer(url, db, rng)
    sync = pymongo.MongoClient(url)
    writer.seed()
    where = ["--url", url, "--db", db]
    retain = ["--retain", "30d", "--retain-every", "0.5", "--archive-collection", ARCHIVE, "--sweep-every", "0.5"]

    async def start(k: int) -> asyncio.subprocess.Process:
        wid = f"w{k}"
        return await _command(
            "worker",
            "--definitions",
            str(default_models_dir()),
            *where,
            "--worker-id",
            wid,
            *retain,
            log=tmp / f"{wid}.log",
        )

    workers = [await start(k) for k in range(plan.workers)]
    prunes: list[asyncio.subprocess.Process] = []
    # the first kill early, so that its partitions' takeover overlaps the rounds that follow
    kills_at = sorted([1, *rng.sample(range(2, plan.rounds), plan.kills - 1)])
    killed = 0
    began = time.monotonic()
    try:
        for r in range(plan.rounds):
            await asyncio.to_thread(writer.round, plan.per_round)
            if r == plan.rounds - 3:  # a manual prune beside the retaining workers, into the same archive
                argv = ["prune", *where, "--finished-before", "30d", "--archive-collection", ARCHIVE, "--yes", "--json"]
                prunes.append(await _command(*argv, "--batch-size", "5", log=tmp / "prune.log"))
            while kills_at and kills_at[0] == r:
                kills_at.pop(0)
                k = rng.randrange(plan.workers)
                workers[k].send_signal(signal.SIGKILL)  # mid-run: whatever it held is left as it was
                await workers[k].wait()
                workers[k] = await start(k)
                killed += 1
            await asyncio.sleep(plan.pause)
        codes = [await asyncio.wait_for(p.wait(), timeout=300) for p in prunes]
        assert codes == [0] * len(prunes), (tmp / "prune.log").read_text()[-2000:]
        # progress: the workers remove everything due, a killed one's partitions taken over
        removable = list(writer.created)
        rounds_s = time.monotonic() - began
        deadline = time.monotonic() + TAKEOVER_BOUND + ALLOWANCE
        while len(_gone(sync, db, removable)) < len(removable) and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        settle_s = time.monotonic() - began - rounds_s
    finally:
        await asyncio.gather(*(terminate(w) for w in workers))
        writer.close()
    client: Any = pymongo.AsyncMongoClient(url)
    store = AsyncMongoStore(client, db)
    try:
        await store.init()
        left = [i for i in removable if i not in _gone(sync, db, removable)]
        held = sync[db].harel_executions.count_documents({"_id": {"$in": left}, "leaving": True})
        # what a kill left marked leaving is another removal's once its mark's lease passed
        coll = client[db].harel_executions
        late = await prune(
            coll,
            time.time() - 30 * DAY,
            archive=CollectionArchive(client[db], ARCHIVE),
            clock=lambda: time.time() + LEASE + 1,
        )
        still = [i for i in removable if i not in _gone(sync, db, removable)]
        assert not still, f"due and never removed: {still} (of which {held} held by a killed removal)"
        stored = {d["_id"] for d in sync[db].harel_executions.find({}, {"_id": 1})}
        assert writer.kept <= stored, writer.kept - stored
        records = list(sync[db][ARCHIVE].find({}, {"execution_id": 1, "document.born": 1}))
        archived = Counter((r["execution_id"], r["document"].get("born")) for r in records)
        twice = {k: n for k, n in archived.items() if n > 1}
        assert not twice, f"archived more than once: {twice}"
        by_id = Counter(i for i, _ in archived)
        assert by_id == writer.created, (by_id - writer.created, writer.created - by_id)  # each incarnation once
        check = await exact_counts(store, url)
        assert not check.problems, "\n".join(check.problems)
        report = json.loads((tmp / "prune.log").read_text()[(tmp / "prune.log").read_text().index("{") :])
        said = sum(
            int(line.split("retention removed ")[1].split()[0])
            for k in range(plan.workers)
            for line in (tmp / f"w{k}.log").read_text().splitlines()
            if "retention removed " in line
        )
        # a killed worker may have removed what it never said; nobody says more than went
        assert report["removed"] + said + late.removed <= len(records), (report, said, late.removed, len(records))
        return {
            "workers": plan.workers,
            "kills": killed,
            "incarnations": sum(writer.created.values()),
            "by_prune": report["removed"],
            "by_workers_said": said,
            "held_by_a_kill": held,
            "rounds_s": round(rounds_s, 1),
            "settle_s": round(settle_s, 1),
        }
    finally:
        await client.close()
        sync.close()


def _scenario(mongo_url: str, client: Any, tmp_path: Path, plan: Plan, seed: int, figures: Any) -> None:
    db = f"hbt_retain_{uuid.uuid4().hex[:10]}"
    try:
        got = asyncio.run(_run(mongo_url, db, tmp_path, plan, seed))
        figures.set(seed=seed, **got)
    finally:
        client.drop_database(db)


def test_retaining_workers_killed_beside_a_manual_prune_keep_the_counts_and_the_archive_exact(
    mongo_url: str, client: Any, tmp_path: Path, figures: Any
) -> None:
    """Three `worker --retain 30d` processes into one archive collection beside a manual `prune`, a worker killed and started again: every due execution removed, each removal archived once, the counts exact."""
    _scenario(mongo_url, client, tmp_path, DEFAULT, 1, figures)


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(3))
def test_retaining_workers_soak(mongo_url: str, client: Any, tmp_path: Path, figures: Any, seed: int) -> None:
    """Four retaining workers, six kills, a manual prune, forty rounds of old executions and re-created ids: as the default run, per seed."""
    _scenario(mongo_url, client, tmp_path, SOAK, seed, figures)
