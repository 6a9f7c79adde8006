"""The counts after their counters collection is dropped and built again, as the CHANGELOG
tells an operator to (drop `<prefix>_hb_counts`, then `harel-beanie migrate up`), or by
`migrate up` after `migrate down`: exact after the next fold, although the documents carry
marks of the dropped counters (`harel_beanie.core.counting`, Rule 6).

The fault this holds: the rebuilt counter restarted at seq 0 while the documents carried a
`cseq` above it, so every fold's marks were refused and each fold applied the same change
again (drop, migrate up, 10 status changes, three folds: DONE 23 where 10 were).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pymongo
from harel.engine.execution import Execution, Status
from harel.engine.schema import DEFAULT_PREFIX
from harel.engine.store.base import Step

from harel_beanie.commands import cli
from harel_beanie.core.count_documents import counts_collection
from harel_beanie.core.counting import COUNTED_SEQ, DIRTY
from harel_beanie.core.documents import SCHEMA_MARKER_ID
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, part_of
from harel_beanie.retention import pruning as retention
from harel_beanie.store.sync_store import MongoStore
from tests.store.test_counts import EXES, full_counts

DONE = Step(cause="event", from_status=Status.RUNNING, to_status=Status.DONE)
N = 30


def _finish(store: MongoStore, ids: list[str]) -> None:
    for i in ids:
        exe = store.load(i)
        assert exe is not None
        exe.status = Status.DONE
        store.commit(exe, [], step=DONE)


def _exact(store: MongoStore, db: Any, when: str) -> None:
    counts = store.read_counts()
    assert counts is not None and not counts.unbuilt, when
    per, purged = full_counts(db)
    assert (counts.per, counts.purged) == (per, purged), f"{when}: counters {counts.per}, documents {per}"


async def _prune(mongo_url: str, db_name: str) -> None:
    aclient: Any = pymongo.AsyncMongoClient(mongo_url)
    try:
        await retention.prune(aclient[db_name][EXES], before=2e9)
    finally:
        await aclient.close()


def _seeded(mongo_url: str, db_name: str) -> MongoStore:
    """`N` executions RUNNING, folded, then a few folds more so the documents carry marks
    of seqs above 1."""
    store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
    store.init()
    for i in range(N):
        store.save(Execution(id=f"r-{i:02d}", definition_id="D", status=Status.RUNNING))
        if i % 5 == 4:
            store.fold_counts()
    store.fold_counts()
    return store


def test_counts_dropped_and_rebuilt_by_migrate_up_are_exact_after_the_next_fold(
    mongo_url: str, client: Any, db_name: str
) -> None:
    store = _seeded(mongo_url, db_name)
    db = client[db_name]
    try:
        assert db[EXES].count_documents({COUNTED_SEQ: {"$gt": 1}}) > 0  # marks above a fresh seq
        db.drop_collection(counts_collection(DEFAULT_PREFIX))
        assert cli.main(["migrate", "up", "--url", mongo_url, "--db", db_name]) == 0
        _exact(store, db, "rebuilt")
        _finish(store, [f"r-{i:02d}" for i in range(10)])
        _exact(store, db, "10 finished, not folded")
        for n in range(3):
            store.fold_counts()
            _exact(store, db, f"after fold {n + 1}")
        assert store.read_counts().per == {"D": {"DONE": 10, "RUNNING": N - 10}}  # type: ignore[union-attr]
        assert db[EXES].count_documents({DIRTY: True}) == 0  # every mark landed
    finally:
        store.close()


def test_counts_rebuilt_by_migrate_up_after_down_are_exact_after_the_next_fold(
    mongo_url: str, client: Any, db_name: str
) -> None:
    store = _seeded(mongo_url, db_name)
    db = client[db_name]
    try:
        assert cli.main(["migrate", "down", "--to", "2", "--url", mongo_url, "--db", db_name]) == 0
        assert cli.main(["migrate", "up", "--url", mongo_url, "--db", db_name]) == 0
        store.close()
        store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
        store.init()
        _finish(store, [f"r-{i:02d}" for i in range(10)])
        for n in range(2):
            store.fold_counts()
            _exact(store, db, f"after fold {n + 1}")
        assert db[EXES].count_documents({DIRTY: True}) == 0
    finally:
        store.close()


def test_a_late_mark_of_a_dropped_counter_cannot_change_what_the_rebuilt_one_counted(
    mongo_url: str, client: Any, db_name: str
) -> None:
    """Rule 6's raised `cseq`: a fold of the dropped counter whose mark arrives after the
    rebuild counted the document (the worker folding while the operator drops the
    collection) is refused, and the next fold counts the document's change once."""
    store = _seeded(mongo_url, db_name)
    db = client[db_name]
    try:
        _finish(store, ["r-00"])
        doc = db[EXES].find_one({"_id": "r-00"})
        counter = db[counts_collection(DEFAULT_PREFIX)].find_one({"_id": doc["part"]})
        late_seq = int(counter["seq"]) + 1  # the batch a fold of the dropped counter applied
        db.drop_collection(counts_collection(DEFAULT_PREFIX))
        assert cli.main(["migrate", "up", "--url", mongo_url, "--db", db_name]) == 0
        # that fold's mark, arriving now: as `_mark` sends it
        late = db[EXES].update_one(
            {"_id": "r-00", COUNTED_SEQ: {"$not": {"$gte": late_seq}}, "version": doc["version"]},
            {"$set": {"cc": {"d": "D", "s": "DONE"}, COUNTED_SEQ: late_seq}, "$unset": {DIRTY: ""}},
        )
        assert late.matched_count == 0
        store.fold_counts()
        _exact(store, db, "after the fold")
    finally:
        store.close()


def test_a_prune_racing_migrate_up_after_down_builds_no_counter_before_the_layout(
    mongo_url: str, client: Any, db_name: str
) -> None:
    """After `migrate down --to 2`, `migrate up` gives every execution its partition in
    batches and builds the counters last; a prune's fold met the counters unbuilt half-way
    and built them over the executions partitioned so far: those given their partition
    after it were never counted (RUNNING 107 where 157 were, in 1 run of 7). A build waits
    for the layout to be recorded whole."""
    store = _seeded(mongo_url, db_name)
    for i in range(16):  # prune's work, over many partitions
        store.save(Execution(id=f"d-{i:02d}", definition_id="D", status=Status.DONE, finished_at=1.0))
    db = client[db_name]
    try:
        assert cli.main(["migrate", "down", "--to", "2", "--url", mongo_url, "--db", db_name]) == 0
        # the partition step half-way: half the executions given their partition
        marker = db["harel_counters"].find_one({"_id": SCHEMA_MARKER_ID})
        parts = int(marker.get("parts") or DEFAULT_PARTITIONS)
        for i in [*(f"r-{i:02d}" for i in range(0, N, 2)), *(f"d-{i:02d}" for i in range(16))]:
            db[EXES].update_one({"_id": i}, {"$set": {"part": part_of(i, parts)}})
        asyncio.run(_prune(mongo_url, db_name))  # it meets the counters unbuilt, as a fold would
        assert cli.main(["migrate", "up", "--url", mongo_url, "--db", db_name]) == 0
        store.close()
        store = MongoStore(pymongo.MongoClient(mongo_url), db_name)
        store.init()
        _exact(store, db, "after migrate up")
        store.fold_counts()
        _exact(store, db, "after a fold")
    finally:
        store.close()
