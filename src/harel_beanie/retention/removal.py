"""Prune's removal of one batch, as a flow of database calls: mark it leaving, fold it out of
the counts, delete it, read back what went.

Why this module exists: the removal is where the counts' Rule 5 (`harel_beanie.core.counting`)
is kept, the one place an execution leaves the database, and a flow (`harel_beanie.core.calls`)
is what a test can run one call at a time against folds, commits and purges in every order
(tests/support/explore.py). `prune` drives it with the async client, one batch at a time, and
keeps the archive and the report around it.

The steps, each a round trip whatever the batch holds:
1. one bulk write marking every document of the batch `leaving` (and dirty), each guarded on
   what prune read (version, status, incarnation, nothing pending);
2. the fold of those documents (`fold_counts` with their ids), then a read of the ones still
   dirty: a folder racing this one applied a batch that read them before the mark, and its
   mark leaves them dirty, so they are folded again (at most `FOLD_TRIES` times; one still
   dirty then is not deleted, and the next run takes it);
3. one bulk write of guarded deletes: the guard of step 1, plus `removable()` (leaving,
   clean, counted as nothing), so a commit in between, or a fold not yet marked on the
   document, keeps it (a document from before partitions, which no counter holds, needs
   only its leaving mark);
4. one read of the batch's ids: what is gone (`gone_among`) is what was removed.
"""

from __future__ import annotations

from typing import Any

from harel_beanie.core.calls import BulkWrite, DeleteOne, Find, Flow, UpdateOne
from harel_beanie.core.counting import DIRTY, LEAVING, removable
from harel_beanie.core.flows import fold_counts
from harel_beanie.core.partitions import PART, PartitionScope
from harel_beanie.retention.archive import GONE_PROJECTION, gone_among, identity

#: folds of a batch whose documents a racing folder keeps leaving dirty (step 2)
FOLD_TRIES = 3
#: what a removal may find pending on a document it was about to remove: nothing
NOTHING_PENDING = {"outbox.0": {"$exists": False}, "spawns.0": {"$exists": False}}


def guard(doc: dict[str, Any]) -> dict[str, Any]:
    """The filter matching `doc` only while it is as prune read it: that version, status and
    incarnation, nothing pending; with its partition, so that on a sharded cluster each write
    names the whole shard key and reaches one shard."""
    return {
        "_id": doc["_id"],
        **({PART: doc[PART]} if PART in doc else {}),
        "version": doc["version"],
        "status": doc["status"],
        **identity(doc),
        **NOTHING_PENDING,
    }


def removal(scope: PartitionScope, chosen: list[dict[str, Any]]) -> Flow[list[dict[str, Any]]]:
    """Remove `chosen` (documents as prune read them): the ones removed, in `chosen`'s order."""
    if not chosen:
        return []
    guards = [guard(d) for d in chosen]
    marks = tuple(UpdateOne("executions", g, {"$set": {LEAVING: True, DIRTY: True}}) for g in guards)
    yield BulkWrite("executions", marks)
    yield from fold_leaving(scope, chosen)
    yield BulkWrite("executions", tuple(DeleteOne("executions", {**g, **deletable(g)}) for g in guards))
    found = yield Find("executions", {"_id": {"$in": sorted({d["_id"] for d in chosen})}}, GONE_PROJECTION)
    return [d for d, gone in zip(chosen, gone_among(found, chosen)) if gone]


def deletable(guard: dict[str, Any]) -> dict[str, Any]:
    """What a delete adds to a document's guard: Rule 5's `removable` for a document of a
    partition; only the leaving mark for one from before partitions, which no counter holds."""
    if PART in guard:
        return removable()
    return {LEAVING: True, PART: {"$exists": False}}


def fold_leaving(scope: PartitionScope, docs: list[dict[str, Any]]) -> Flow[int]:
    """Fold `docs` into their partitions' counts (a counter not built yet is built first)
    until none is dirty, or `FOLD_TRIES` folds: the documents folded."""
    parts = sorted({d[PART] for d in docs if isinstance(d.get(PART), int)})
    if not parts:
        return 0  # documents from before partitions: no counter holds them
    ids = sorted({d["_id"] for d in docs})
    folded = 0
    for _ in range(FOLD_TRIES):
        folded += yield from fold_counts(scope, parts, ids=ids)
        # `part` named first: the partial index hb_part_cdirty may serve this read
        left = yield Find("executions", {PART: {"$in": parts}, DIRTY: True, "_id": {"$in": ids}}, {"_id": 1})
        if not left:
            break
        ids = sorted(d["_id"] for d in left)
    return folded
