"""Retention: remove (optionally archive first) finished executions older than a cut-off.

Why this module exists: nothing else ever removes an execution, so a database in use for a
year holds every execution it ever ran. `prune` is the one way, run from `harel-beanie
prune` by hand or on a schedule by a worker (`harel-beanie worker --retain`,
`harel_beanie.retention.schedule`). The TTL index that once let the server delete finished
executions by age is retired: its deletes went behind the counters' back, so the counts
drifted for good; `drop_ttl` removes one an older release created.

What `prune` removes, and why only that:

- **Finished means DONE or CANCELLED**, the statuses harel stamps `finished_at` on and the
  only ones its own purge accepts. A FAILED execution is a dead letter waiting for a fix and
  a redrive; it is kept until someone terminates it (then it is CANCELLED and ages out).
- **finished before the cut-off**, by `finished_at`;
- **nothing left to hand on**: no pending outbox entry or spawn (an event emitted by the
  last step and not yet relayed would be lost with the document);
- **no parent still going**: an execution whose parent exists and is not DONE/CANCELLED is
  kept, so a running (or failed, redrivable) parent never loses a region or submachine
  record it may read; a parent already removed does not hold its children back;
- only documents that hold an execution (`data`): a purge's tombstone is not an execution
  and is left alone, so it keeps doing its job.

How: one status at a time, windows of `updated_at` over the (status, updated_at) index, from
the cut-off down (`harel_beanie.core.windows`), each sized from the last to hold about a
batch: a window is a bounded range of the index on every server, so a batch costs the same
at the end of a run as at the start, even where `limit` does not bound the server's work
(SecantusDB reads every match of a query before keeping N). A window's read names only the
status and the range (more fields, and SecantusDB reads every execution of the status); the
rest (finished before the cut-off, holding an execution, nothing pending) is checked on the
documents it returns. A finished execution's `updated_at` is its finishing commit's (nothing
else writes it), so one that finished before the cut-off was updated before it too; one whose
clock put `updated_at` past the cut-off is taken by a later run. Each batch is removed with one round trip of conditional deletes, each addressed by `_id` and guarded
on the `version`, `status` and incarnation (`born`) that were read (and on the pending work
still being absent), so an execution that moved on between the read and the delete, or an id
created again in between, is not removed. Which ones went is then read back (`_id $in` the
batch, compared by incarnation).

Prune leaves no tombstone, so an id it removed may be created again, and removed again.
Archive: each removal, once and whole (the stored document inside a record keyed by a
removal key minted for it; Extended JSON for a file, as is for a collection), to a JSON Lines
file or a collection, through a journal, so that the archive holds exactly what was removed,
once per removal, whatever instant a run is killed at (`harel_beanie.retention.archive` states the
protocol). Re-running continues: what was removed is gone, and what is left is
examined again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from bson import ObjectId
from harel.engine.schema import Names

from harel_beanie.core.arguments import (
    BadArgumentType,
    optional_str,
    require_bool,
    require_int,
    require_str,
    require_time,
)
from harel_beanie.core.count_documents import counts_collection
from harel_beanie.core.names import prefix_of
from harel_beanie.core.partitions import PartitionScope
from harel_beanie.core.windows import DownwardWalk, Window
from harel_beanie.retention.archive import Archive
from harel_beanie.retention.removal import CLAIM_FIELDS, claim, hold, remove_held
from harel_beanie.store.dispatch import acall, adrive

#: what harel counts as finished for good (harel.engine.execution stamps finished_at on these)
FINISHED = ("DONE", "CANCELLED")
#: name of the retired TTL index on finished_on (`drop_ttl` removes it)
TTL_INDEX = "hb_finished_ttl"
#: the first window's width, in seconds of `updated_at` (an empty window doubles it)
FIRST_WIDTH = 1.0
#: what a dry run reads of each execution (a real run with an archive reads it whole)
_PROJECTION = {
    "_id": 1,
    "version": 1,
    "status": 1,
    "parent_id": 1,
    "born": 1,
    "created_at": 1,
    "part": 1,
    "finished_at": 1,
    "outbox": {"$slice": [{"$ifNull": ["$outbox", []]}, 1]},
    "spawns": {"$slice": [{"$ifNull": ["$spawns", []]}, 1]},
    "hb_holds_data": {"$ne": [{"$type": "$data"}, "missing"]},
    **{f: 1 for f in CLAIM_FIELDS},
}


@dataclass
class PruneReport:
    before: float
    dry_run: bool
    examined: int = 0  # finished before the cut-off
    removed: int = 0  # (or, on a dry run, would be)
    kept_parent: int = 0  # its parent still going
    kept_pending: int = 0  # outbox entries or spawns not yet handed on
    moved_on: int = 0  # changed between the read and the delete: left alone
    recovered: int = 0  # archived from an interrupted run's journal
    batches: int = 0
    removed_ids: list[str] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        out = dict(vars(self))
        out.pop("removed_ids")
        return out


def candidates_filter(status: str, before: float, after: Optional[str]) -> dict[str, Any]:
    """A batch's read: one finished status, finished before the cut-off, holding an execution,
    nothing pending, after the last `_id` seen. Index: hb_status (status, _id)."""
    # each goes into the filter: a dict would be an operator, a NaN cut-off would match nothing
    status, before, after = require_str("status", status), require_time("before", before), optional_str("after", after)
    q: dict[str, Any] = {"status": status, "finished_at": {"$lt": before}, "data": {"$exists": True}}
    if after is not None:
        q["_id"] = {"$gt": after}
    return q


async def prune(
    executions: Any,
    before: float,
    *,
    archive: Optional[Archive] = None,
    dry_run: bool = False,
    batch_size: int = 500,
    on_batch: Callable[[PruneReport], None] = lambda r: None,
    stop_after_batches: Optional[int] = None,
    clock: Callable[[], float] = time.time,
    partitions: Optional[PartitionScope] = None,
) -> PruneReport:
    """Remove the finished executions of `executions` (an async PyMongo collection) that
    finished before `before` (epoch seconds); see the module docstring for what is kept.
    `on_batch` is called after each batch (a progress bar). `stop_after_batches` stops early,
    as an interruption would (the tests use it). `clock` dates the leaving marks, and decides
    whether another removal's mark still holds (`retention.removal.LEASE`). `partitions`
    (a worker's scope) keeps the run to the partitions it works on, as each window is read:
    a lease lost meanwhile stops its partition's reads, and a scope holding none ends the run.
    Kept whole: the batch's steps (choose, mark, fold, archive, delete) must run in this order for a killed run to be finished by the next."""
    before = require_time("before", before)
    batch_size = require_int("batch_size", batch_size, low=1, high=2**31 - 1)
    dry_run = require_bool("dry_run", dry_run)
    if stop_after_batches is not None:
        stop_after_batches = require_int("stop_after_batches", stop_after_batches, low=0)
    if partitions is not None and not isinstance(partitions, PartitionScope):
        raise BadArgumentType("partitions", "a PartitionScope", partitions)
    report = PruneReport(before=before, dry_run=dry_run)
    # the removal's fold names the batch's own partitions, whoever leases them: the removal's
    # guards, not ownership, keep two removals of one document apart
    fold = None if partitions is None else PartitionScope(parts=partitions.parts, sharded=partitions.sharded)
    if archive is not None and not dry_run:
        report.recovered = await archive.recover(executions, clock())
    whole = archive is not None and not dry_run
    for status in FINISHED:
        walk = DownwardWalk(before, target=batch_size, width=FIRST_WIDTH)
        while True:
            # the windows down from the cut-off, then the executions with no `updated_at`
            window = None if walk.done else walk.next()
            where = {} if partitions is None else partitions.sweep_filter()
            if where is None:
                return report  # no partition held now: the worker's next run takes them
            docs = await read_window(executions, status, window, whole=whole, where=where)
            if window is not None:
                walk.saw(len(docs))
            chosen = [d for d in docs if is_candidate(d, before)]
            for i in range(0, len(chosen), batch_size):
                if stop_after_batches is not None and report.batches >= stop_after_batches:
                    return report
                batch = chosen[i : i + batch_size]
                # a leaving mark (this run's, another's, an interrupted one's) is the
                # removal's, not the execution's: kept apart from what is archived
                seen = {d["_id"]: {f: d.pop(f) for f in CLAIM_FIELDS if f in d} for d in batch}
                report.batches += 1
                report.examined += len(batch)
                await _prune_batch(executions, batch, report, archive, dry_run, seen, clock(), fold)
                on_batch(report)
            if window is None:
                break
    return report


def window_filter(status: str, window: Optional[Window]) -> dict[str, Any]:
    """A window's read: one status and a range of `updated_at` (None: the executions of the
    status with no `updated_at`). Index: hb_status_updated, a bounded range of it."""
    status = require_str("status", status)
    return {"status": status, **(window.query("updated_at") if window is not None else {"updated_at": None})}


async def read_window(
    executions: Any, status: str, window: Optional[Window], *, whole: bool, where: Optional[dict[str, Any]] = None
) -> list[dict[str, Any]]:
    """Every execution of `status` in `window` (and `where`: a worker's partitions): the whole
    documents (for an archive) or what prune looks at. All of them, unsorted and unlimited:
    the server reads them all anyway."""
    pipeline: list[dict[str, Any]] = [{"$match": {**window_filter(status, window), **(where or {})}}]
    if not whole:
        pipeline.append({"$project": _PROJECTION})
    docs: list[dict[str, Any]] = await (await executions.aggregate(pipeline)).to_list(None)
    return docs


def is_candidate(doc: dict[str, Any], before: float) -> bool:
    """What `candidates_filter` asks beyond the status, checked on a document a window read:
    finished before the cut-off, holding an execution, nothing pending."""
    finished = doc.get("finished_at")
    if isinstance(finished, bool) or not isinstance(finished, (int, float)) or not finished < before:
        return False
    holds = doc.pop("hb_holds_data") if "hb_holds_data" in doc else "data" in doc
    return bool(holds) and not doc.get("outbox") and not doc.get("spawns")


async def _prune_batch(
    executions: Any,
    batch: list[dict[str, Any]],
    report: PruneReport,
    archive: Optional[Archive],
    dry_run: bool,
    seen: Optional[dict[Any, dict[str, Any]]] = None,
    now: Optional[float] = None,
    fold: Optional[PartitionScope] = None,
) -> None:
    seen, now = seen or {}, (time.time() if now is None else now)
    # the read filter already excludes pending work; kept in the count for a document whose
    # projection shows some (a document written between the plan and the read)
    ready = [d for d in batch if not d.get("outbox") and not d.get("spawns")]
    report.kept_pending += len(batch) - len(ready)
    parents = sorted({d["parent_id"] for d in ready if d.get("parent_id")})
    going: set[str] = set()
    if parents:
        rows = await executions.find({"_id": {"$in": parents}}, {"_id": 1, "status": 1}).to_list(None)
        going = {r["_id"] for r in rows if r.get("status") not in FINISHED}
    chosen = [d for d in ready if d.get("parent_id") not in going]
    report.kept_parent += len(ready) - len(chosen)
    # what another removal (a prune at the same time) holds is its to remove, and to archive
    held = [d for d in chosen if claim(seen.get(d["_id"]) or {}, now) is None]
    report.moved_on += len(held)
    chosen = [d for d in chosen if claim(seen.get(d["_id"]) or {}, now) is not None]
    if not chosen:
        return
    if dry_run:
        report.removed += len(chosen)
        report.removed_ids += [d["_id"] for d in chosen]
        return
    # marked leaving (what this removal holds is journaled), folded out of the counts,
    # deleted while still leaving and counted as nothing, read back
    # (harel_beanie.retention.removal; core.counting, Rule 5): a commit in between unmarks a
    # document and it stays; what another removal (a prune at the same time) marked or
    # deleted is not this one's, to journal, archive or report
    colls = _collections(executions)
    token = str(ObjectId())
    held = await adrive(hold(chosen, seen, token=token, now=now), lambda c: acall(colls, c))
    if archive is not None and held:
        await archive.begin(held)
    removed = await adrive(remove_held(fold or PartitionScope(), held, token), lambda c: acall(colls, c))
    if archive is not None and held:
        await archive.finish(removed)
    report.removed += len(removed)
    report.moved_on += len(chosen) - len(removed)  # held by another, or changed meanwhile
    report.removed_ids += [d["_id"] for d in removed]


def _collections(executions: Any) -> dict[str, Any]:
    """The collections a removal's calls name: the executions, their counters, and harel's
    counters (where a counter built anew takes its epoch: core.counting, Rule 6)."""
    prefix = prefix_of(executions.name) or executions.name  # another name: it stands for the prefix
    db = executions.database
    return {"executions": executions, "counts": db[counts_collection(prefix)], "counters": db[Names(prefix).counters]}


async def has_ttl(executions: Any) -> bool:
    """Whether the retired TTL index is still on `executions`."""
    async for ix in await executions.list_indexes():
        if ix["name"] == TTL_INDEX:
            return True
    return False


async def drop_ttl(executions: Any) -> str:
    """Drop the TTL index an older release created (`prune --ttl`), idempotently; what it did.
    The server's expiries went behind the counters' back (a count of DONE kept an execution
    the server had deleted), so the index is retired in favour of a worker's retention
    (`harel-beanie worker --retain`), which removes through prune's flow."""
    if not await has_ttl(executions):
        return "no TTL index: nothing to drop"
    await executions.drop_index(TTL_INDEX)
    return f"dropped the TTL index {TTL_INDEX}"


def dumps_report(report: PruneReport) -> str:
    return json.dumps(report.as_dict(), indent=2, sort_keys=True)
