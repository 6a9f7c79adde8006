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
4. one read of the batch's ids: what is gone (`gone_among`) and was still this removal's
   before its deletes is what it removed.

Each removal is its own (`LEAVER`, a token minted for it): its leaving marks carry the token,
guarded on the one read (a removal that read another's mark takes it over only once that mark
is older than `LEASE`: a killed removal's), its deletes are guarded on it, and it reads which
documents carry it after its marks (`hold`: what prune journals) and again just before they go. So two removals of one batch (two prunes at
once, a worker's retention beside a manual prune) never both count, or both archive, one
execution's removal: a document the other marked is not this one's to mark, and a delete
the other made is not this one's to claim. An execution purged in between is not removed
by either (its tombstone buries the incarnation read: `gone_among`).
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Optional

from bson import ObjectId

from harel_beanie.core.calls import BulkWrite, DeleteOne, Find, Flow, UpdateOne
from harel_beanie.core.counting import DIRTY, LEAVING, removable
from harel_beanie.core.flows import fold_counts
from harel_beanie.core.partitions import PART, PartitionScope
from harel_beanie.retention.archive import GONE_PROJECTION, LEASE, LEAVER, LEFT_AT, gone_among, identity

#: folds of a batch whose documents a racing folder keeps leaving dirty (step 2)
FOLD_TRIES = 3
#: what a removal may find pending on a document it was about to remove: nothing
NOTHING_PENDING = {"outbox.0": {"$exists": False}, "spawns.0": {"$exists": False}}
#: what a removal reads of a document beside what prune reads: whose leaving mark it holds
CLAIM_FIELDS = (LEAVING, LEAVER, LEFT_AT)


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


def claim(seen: Mapping[str, Any], now: float) -> Optional[dict[str, Any]]:
    """The guard term under which a removal may mark a document whose leaving mark was read
    as `seen` (its `CLAIM_FIELDS`): that mark still there, or none; None where another
    removal's mark, younger than `LEASE`, holds it."""
    token = seen.get(LEAVER)
    if token is None:
        return {LEAVER: {"$exists": False}}
    at = seen.get(LEFT_AT)
    held = seen.get(LEAVING) and isinstance(at, (int, float)) and now - at < LEASE
    return None if held else {LEAVER: token}


def removal(
    scope: PartitionScope,
    chosen: list[dict[str, Any]],
    seen: Optional[Mapping[Any, Mapping[str, Any]]] = None,
    *,
    token: Optional[str] = None,
    now: Optional[float] = None,
) -> Flow[list[dict[str, Any]]]:
    """Remove `chosen` (documents as prune read them; `seen`, each id's leaving mark as read,
    `CLAIM_FIELDS`): the ones this removal removed, in `chosen`'s order. `token` names the
    removal (default: a new ObjectId's), `now` its clock (default: the time). With an
    archive, prune journals what `hold` returns before `remove_held`."""
    token = str(ObjectId()) if token is None else token
    held = yield from hold(chosen, seen, token=token, now=now)
    return (yield from remove_held(scope, held, token))


def hold(
    chosen: list[dict[str, Any]],
    seen: Optional[Mapping[Any, Mapping[str, Any]]],
    *,
    token: str,
    now: Optional[float] = None,
) -> Flow[list[dict[str, Any]]]:
    """Step 1: mark `chosen` leaving under `token`, each guarded on what prune read and on
    the leaving mark read (`claim`); the ones this removal holds, in `chosen`'s order."""
    seen = seen or {}
    now = time.time() if now is None else now
    terms = {d["_id"]: claim(seen.get(d["_id"]) or {}, now) for d in chosen}
    chosen = [d for d in chosen if terms[d["_id"]] is not None]  # the rest another is removing
    if not chosen:
        return []
    mark = {"$set": {LEAVING: True, DIRTY: True, LEAVER: token, LEFT_AT: now}}
    yield BulkWrite(
        "executions", tuple(UpdateOne("executions", {**guard(d), **(terms[d["_id"]] or {})}, mark) for d in chosen)
    )
    held = yield Find("executions", {"_id": {"$in": sorted({d["_id"] for d in chosen})}, LEAVER: token}, {"_id": 1})
    ours = {d["_id"] for d in held}
    return [d for d in chosen if d["_id"] in ours]


def remove_held(scope: PartitionScope, held: list[dict[str, Any]], token: str) -> Flow[list[dict[str, Any]]]:
    """Steps 2 to 4 over what `hold` returned: the ones this removal removed."""
    if not held:
        return []
    yield from fold_leaving(scope, held)
    ids = sorted({d["_id"] for d in held})
    still = yield Find("executions", {"_id": {"$in": ids}, LEAVER: token}, {"_id": 1})
    ours = {d["_id"] for d in still}  # a commit keeps the mark's token; a take-over does not
    deletes = tuple(
        DeleteOne("executions", {**g, **deletable(g), LEAVER: token}) for g in map(guard, held) if g["_id"] in ours
    )
    if not deletes:
        return []
    deleted = yield BulkWrite("executions", deletes)
    found = yield Find("executions", {"_id": {"$in": sorted(ours)}}, GONE_PROJECTION)
    gone = [d for d, went in zip(held, gone_among(found, held)) if went and d["_id"] in ours]
    # a removal that deleted nothing removed nothing, whatever went meanwhile: one that took
    # over its marks past `LEASE` (this one stalled) removed them, and archives them
    return gone if deleted else []


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
        # by `_id` first, the batch's ids: the embedded server (SecantusDB) answers nothing to
        # this read led by `part $in` or `cdirty` through the partial index hb_part_cdirty,
        # so the fold was never tried again
        left = yield Find("executions", {"_id": {"$in": ids}, DIRTY: True}, {"_id": 1})
        if not left:
            break
        ids = sorted(d["_id"] for d in left)
    return folded
