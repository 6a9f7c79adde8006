"""The counts' flows: a partition's fold (built first if it is not yet), and the exact read.

The rules they keep are `harel_beanie.core.counting`'s; this module only sends them. A fold
runs on the worker that owns the partition, every sweep, and on any reader that finds many
dirty documents; a read costs three commands whatever the collection holds, plus the dirty
documents it reads (those changed since the last fold).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from harel_beanie.core.arguments import BadArgumentType, require_int, require_str
from harel_beanie.core.calls import Aggregate, Find, FindOne, Flow, UpdateMany, UpdateOne
from harel_beanie.core.counting import (
    COUNTED,
    COUNTED_SEQ,
    DIRTY,
    DIRTY_PROJECTION,
    FOLD_BATCH,
    Counts,
    build_pipeline,
    build_sums,
    built_counter,
    combine,
    fold_low,
    lineage,
    marked,
    plan_fold,
    sums_by_part,
    unchanged,
)
from harel_beanie.core.documents import SCHEMA_MARKER_ID, SCHEMA_VERSION
from harel_beanie.core.partitions import PART, PartitionScope

#: how many times a read starts again when a fold lands between its reads (Rule 4)
READ_TRIES = 3


def _parts(scope: PartitionScope, only: Optional[Sequence[int]]) -> list[int]:
    if only is not None:
        if not isinstance(only, (list, tuple)):
            raise BadArgumentType("parts", "a list of partition numbers", only)
        return sorted({require_int("parts", n, low=0, high=scope.parts - 1) for n in only})
    owned = scope.owned()
    return list(range(scope.parts)) if owned is None else sorted(owned)


def fold_counts(
    scope: PartitionScope, parts: Optional[Sequence[int]] = None, *, ids: Optional[Sequence[str]] = None
) -> Flow[int]:
    """Fold the dirty documents of `parts` (default: the partitions `scope` works on) into
    their counters, building a counter not built yet; `ids` limits the fold to those
    documents (prune folds what it is about to delete). Returns the documents folded."""
    if ids is not None:
        if not isinstance(ids, (list, tuple)):
            raise BadArgumentType("ids", "a list of execution ids", ids)
        ids = [require_str("ids", i) for i in ids]
    folded = 0
    chosen = _parts(scope, parts)
    # every chosen counter in one read: the unbuilt are built together (one read of the
    # executions for all of them), and each partition's first batch starts from it
    counters = yield from _counters(chosen)
    unbuilt = [p for p in chosen if not counters.get(p, {}).get("built")]
    if unbuilt:
        yield from build(unbuilt)
        counters.update((yield from _counters(unbuilt)))
    for part in chosen:
        known = counters.get(part)
        while True:
            n = yield from _fold_batch(part, ids, known)
            known = None  # a later batch reads the counter its predecessor moved
            folded += n
            if n < FOLD_BATCH:
                break
    return folded


def _counters(parts: Sequence[int]) -> Flow[dict[int, dict[str, Any]]]:
    found = yield Find("counts", {"_id": {"$in": list(parts)}})
    return {c["_id"]: c for c in found}


def _fold_batch(part: int, ids: Optional[Sequence[str]], counter: Optional[dict[str, Any]] = None) -> Flow[int]:
    """One batch of one partition (Rule 3), from `counter` as just read (None: read it)."""
    if counter is None:
        counter = yield FindOne("counts", {"_id": part})
    if counter is None or not counter.get("built"):
        yield from build([part])  # a counter dropped since the fold began
        counter = yield FindOne("counts", {"_id": part})
        if counter is None or not counter.get("built"):
            return 0
    seq = int(counter.get("seq") or 0)
    if counter.get("last") and not counter.get("marked"):
        yield from _mark(part, seq, counter["last"])
    query: dict[str, Any] = {PART: part, DIRTY: True}
    if ids is not None:
        query["_id"] = {"$in": list(ids)}
    docs = yield Find("executions", query, DIRTY_PROJECTION, sort=[("_id", 1)], limit=FOLD_BATCH)
    if not docs:
        return 0
    inc, entries = plan_fold(docs, counter)
    update = {"$inc": {**inc, "seq": 1}, "$set": {"last": entries, "marked": False}, **fold_low(docs, counter)}
    if not (yield UpdateOne("counts", {"_id": part, "seq": seq}, update)):
        return 0  # another folder applied a batch first: its documents are its to mark
    yield from _mark(part, seq + 1, entries)
    return len(docs)


def _mark(part: int, seq: int, entries: list[dict[str, Any]]) -> Flow[None]:
    """Mark each document of batch `seq` as counted (Rule 3), then the batch as marked."""
    for entry in entries:
        base = {"_id": entry["_id"], PART: part, COUNTED_SEQ: {"$not": {"$gte": seq}}}
        counted = {COUNTED: entry["cc"], COUNTED_SEQ: seq}
        sets, unsets = marked(entry)
        if not (
            yield UpdateOne("executions", {**base, **unchanged(entry)}, {"$set": {**counted, **sets}, "$unset": unsets})
        ):
            # changed since: stays dirty, and counted as the batch says while it is of the
            # lineage read (an id prune deleted and created again is not: Rule 3)
            for form in lineage(entry):
                if (yield UpdateOne("executions", {**base, **form}, {"$set": counted})):
                    break
    yield UpdateOne("counts", {"_id": part, "seq": seq}, {"$set": {"marked": True}})


def build(parts: Sequence[int]) -> Flow[None]:
    """Build the counters of `parts`: every document of theirs not yet counted gets its `cc`
    (one server-side update for all of them), each counter the sums of its partition's `cc`
    (one aggregation for all of them). Once per partition, O(the partitions' documents); a
    builder racing another leaves one result (both sum the same `cc`: only folds change a
    `cc` once set, and they wait for the build)."""
    todo = sorted(set(parts))
    if not todo:
        return
    for part in todo:
        fresh = {"part": part, "seq": 0, "n": {}, "t": 0, "last": [], "built": False}
        yield UpdateOne("counts", {"_id": part}, {"$setOnInsert": fresh}, upsert=True)
    # never a dirty document: every one this package writes is dirty from its creation on,
    # and the readers count it by its state until a fold gives it its `cc`
    only = todo[0] if len(todo) == 1 else {"$in": todo}
    stale = {PART: only, COUNTED: {"$exists": False}, DIRTY: {"$exists": False}}
    yield UpdateMany("executions", stale, build_pipeline())
    groups = yield Aggregate("executions", build_sums(todo))
    for part, its in sums_by_part(groups, todo).items():
        yield UpdateOne("counts", {"_id": part, "built": False, "seq": 0}, {"$set": built_counter(its)})


def read_counts(scope: PartitionScope) -> Flow[Optional[tuple[Counts, int]]]:
    """Exact counts (Rule 4) and how many dirty documents the read met, or None where the
    counters cannot answer: a layout other than this package's, or a partition whose
    counter is not built yet (the caller counts the collection instead)."""
    marker = yield FindOne("counters", {"_id": SCHEMA_MARKER_ID})
    if marker is None or marker.get("n") != SCHEMA_VERSION:
        return None
    parts = list(range(int(marker.get("parts") or scope.parts)))
    every = {"_id": {"$in": parts}}
    for _ in range(READ_TRIES):
        counters = yield Find("counts", every)
        if len(counters) < len(parts) or not all(c.get("built") for c in counters):
            return None
        dirty = yield Find("executions", {PART: {"$in": parts}, DIRTY: True}, DIRTY_PROJECTION)
        again = yield Find("counts", every, {"seq": 1})
        if {c["_id"]: c.get("seq") for c in again} == {c["_id"]: c.get("seq") for c in counters}:
            return combine(counters, dirty, PART), len(dirty)
    return None
