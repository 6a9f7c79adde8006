"""The counts' flows: a partition's build in batches, its fold, and the exact read.

The rules they keep are `harel_beanie.core.counting`'s; this module only sends them. A fold
runs on the worker that owns the partition, every sweep, and on any reader that finds many
dirty documents; a read costs three commands whatever the collection holds, plus the dirty
documents it reads (those changed since the last fold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from harel_beanie.core.arguments import BadArgumentType, require_int, require_str
from harel_beanie.core.calls import Aggregate, BulkWrite, Find, FindOne, Flow, Increment, UpdateMany, UpdateOne
from harel_beanie.core.count_build import (
    EPOCH_ID,
    batch_increment,
    build_pipeline,
    build_sums,
    epoch_base,
    raise_seq,
    sums_by_part,
)
from harel_beanie.core.counting import (
    COUNTED,
    COUNTED_SEQ,
    DIRTY,
    DIRTY_PROJECTION,
    FOLD_BATCH,
    LOW,
    NO_ID,
    Counts,
    combine,
    fold_low,
    lineage,
    marked,
    plan_fold,
    unchanged,
)
from harel_beanie.core.documents import SCHEMA_MARKER_ID, SCHEMA_VERSION
from harel_beanie.core.partitions import PART, PartitionScope

#: how many times a read starts again when a fold lands between its reads (Rule 4)
READ_TRIES = 3
#: the documents one build batch reads (core.counting's last paragraph)
BUILD_BATCH = 2000
#: an unbuilt counter's cursor: the highest id its sums cover
UPTO = "upto"


def _parts(scope: PartitionScope, only: Optional[Sequence[int]]) -> list[int]:
    if only is not None:
        if not isinstance(only, (list, tuple)):
            raise BadArgumentType("parts", "a list of partition numbers", only)
        return sorted({require_int("parts", n, low=0, high=scope.parts - 1) for n in only})
    owned = scope.owned()
    return list(range(scope.parts)) if owned is None else sorted(owned)


def fold_counts(
    scope: PartitionScope,
    parts: Optional[Sequence[int]] = None,
    *,
    ids: Optional[Sequence[str]] = None,
    build_batches: Optional[int] = None,
    build_batch: Optional[int] = None,
) -> Flow[int]:
    """Fold the dirty documents of `parts` (default: the partitions `scope` works on) into
    their counters, building a counter not built yet first (at most `build_batches` batches
    of `build_batch` documents, as `build` takes them; None: all; a partition still unbuilt
    after them is not folded); `ids` limits the fold to those documents (prune folds what
    it is about to delete). Returns the documents folded."""
    if ids is not None:
        if not isinstance(ids, (list, tuple)):
            raise BadArgumentType("ids", "a list of execution ids", ids)
        ids = [require_str("ids", i) for i in ids]
    if build_batches is not None:
        build_batches = require_int("build_batches", build_batches, low=0)
    if build_batch is not None:
        build_batch = require_int("build_batch", build_batch, low=0)
    folded = 0
    chosen = _parts(scope, parts)
    # every chosen counter in one read: the unbuilt are built together (one batch reads the
    # executions of all of them), and each partition's first batch starts from it
    counters = yield from _counters(chosen)
    unbuilt = [p for p in chosen if not counters.get(p, {}).get("built")]
    if unbuilt and build_batches != 0:
        yield from build(unbuilt, batch=build_batch, batches=build_batches)
        counters.update((yield from _counters(unbuilt)))
    for part in chosen:
        known = counters.get(part)
        if not (known or {}).get("built"):
            continue  # its build is not over: no fold before it (core.counting)
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
        return 0  # a counter dropped since the fold began: its build comes first
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
    """Mark each document of batch `seq` as counted (Rule 3), then the batch as marked.
    The usual case, every document unchanged since the fold read it, is one bulk write for
    the whole batch (a round trip per document made prune's cost per execution); where some
    mark missed, each document is marked in turn as before: one the bulk write marked
    already has `cseq` at `seq`, which every guard below refuses, so it is not marked twice."""
    if not entries:
        yield UpdateOne("counts", {"_id": part, "seq": seq}, {"$set": {"marked": True}})
        return
    bulk = []
    for entry in entries:
        base = {"_id": entry["_id"], PART: part, COUNTED_SEQ: {"$not": {"$gte": seq}}}
        sets, unsets = marked(entry)
        update = {"$set": {COUNTED: entry["cc"], COUNTED_SEQ: seq, **sets}, "$unset": unsets}
        bulk.append(UpdateOne("executions", {**base, **unchanged(entry)}, update))
    if (yield BulkWrite("executions", tuple(bulk))) < len(entries):
        yield from _mark_each(part, seq, entries)
    yield UpdateOne("counts", {"_id": part, "seq": seq}, {"$set": {"marked": True}})


def _mark_each(part: int, seq: int, entries: list[dict[str, Any]]) -> Flow[None]:
    """`_mark`'s documents one at a time, each tried as unchanged, then by its lineage."""
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


@dataclass
class Built:
    """What build batches did: the partitions built now and in all, the documents the
    batches read (each counted then, or dirty and counted by the first fold)."""

    built: int = 0
    of: int = 0
    read: int = 0

    @property
    def done(self) -> bool:
        return self.built == self.of


def build(parts: Sequence[int], *, batch: Optional[int] = None, batches: Optional[int] = None) -> Flow[Built]:
    """Build the counters of `parts` (core.counting's last paragraph): at most `batches`
    batches of `batch` documents (None: `BUILD_BATCH`; 0: all of them in one pass, for a
    server where `limit` bounds no work; `batches` None: until every one is built). Each
    batch reads `batch` ids above the cursor, then updates and sums only those ids; on
    mongod that is a range of the `_id` index, on a server where `limit` bounds nothing
    (SecantusDB) the id read reads the collection, hence the one pass there. Resumable: each
    counter keeps its cursor, moved only with the sums of the batch that reached it."""
    batch = BUILD_BATCH if batch is None else require_int("batch", batch, low=0)
    todo = sorted(set(parts))
    out = Built(of=len(todo))
    if not todo:
        return out
    # never during `migrate up`: until the layout is recorded whole, executions are still
    # being given their partition, and one given it behind a build's cursor would never be
    # counted (a prune's fold racing the migration built the counters so)
    marker = yield FindOne("counters", {"_id": SCHEMA_MARKER_ID}, {"n": 1})
    if (marker or {}).get("n") != SCHEMA_VERSION:
        return out
    counters = yield from _counters(todo)
    missing = [p for p in todo if p not in counters]
    if missing:
        yield from fresh_counters(missing, built=False)
    done = 0
    while batches is None or done < batches:
        if done or len(counters) < len(todo):
            counters = yield from _counters(todo)
        left = [p for p in todo if not counters.get(p, {}).get("built")]
        if not left:
            break
        done += 1
        out.read += yield from _build_batch(left, counters, batch)
    counters = yield from _counters(todo)
    out.built = sum(1 for p in todo if counters.get(p, {}).get("built"))
    return out


def _build_batch(left: list[int], counters: dict[int, dict[str, Any]], batch: int) -> Flow[int]:
    """One batch over the unbuilt partitions whose cursor is the lowest (they move
    together; a partition a killed builder moved on waits for them). Returns the ids read."""
    lowest = min((counters.get(p, {}).get(UPTO) for p in left), key=lambda c: (c is not None, c or ""))
    group = [p for p in left if counters.get(p, {}).get(UPTO) == lowest]
    query: dict[str, Any] = {PART: group[0] if len(group) == 1 else {"$in": group}}
    if lowest is not None:
        query["_id"] = {"$gt": lowest}
    if batch == 0:
        # the rest in one pass: on a server where `limit` bounds no work (SecantusDB) each
        # batch's id read would read the collection, and this reads it twice in all
        ids: list[Any] = []
        span: Optional[dict[str, Any]] = query.get("_id")
        last = True
    else:
        found = yield Find("executions", query, {"_id": 1}, sort=[("_id", 1)], limit=batch)
        ids = [d["_id"] for d in found]
        span = {"$in": ids}
        last = len(ids) < batch  # the rest of these partitions: every document after is new (dirty)
    groups: Any = []
    if ids or batch == 0:
        # never a dirty document: every one this package writes is dirty from its creation
        # on, and the readers count it by its state until a fold gives it its `cc`
        stale = {**query, COUNTED: {"$exists": False}, DIRTY: {"$exists": False}}
        if span is not None:
            stale["_id"] = span
        bases = {p: bases_of(counters, p) for p in group}
        yield UpdateMany("executions", stale, build_pipeline(bases))
        # Rule 6: every mark an older counter made is raised to this counter's epoch before
        # the batch is summed, so a late mark of that counter's folds can no longer land
        if max(bases.values()):
            older = {**query, COUNTED_SEQ: {"$lt": max(bases.values())}}
            if span is not None:
                older["_id"] = span
            yield UpdateMany("executions", older, raise_seq(bases))
        groups = yield Aggregate("executions", build_sums(group, span))
    at = {UPTO: lowest} if lowest is not None else {UPTO: {"$exists": False}}
    for part, its in sums_by_part(groups, group).items():
        inc, low = batch_increment(its)
        update: dict[str, Any] = {"$min": {LOW: low}}
        if inc:
            update["$inc"] = inc
        update["$set"] = {"built": True} if last else {UPTO: ids[-1]}
        # only where the cursor still is: a racing builder's batch, or a killed one's
        # resumed, lands once
        yield UpdateOne("counts", {"_id": part, "built": False, "seq": bases_of(counters, part), **at}, update)
    return len(ids) if batch else sum(int(g.get("n") or 0) for g in groups)


def bases_of(counters: dict[int, dict[str, Any]], part: int) -> int:
    """The seq an unbuilt counter was created at (its epoch's base, Rule 6), which its build
    batches keep."""
    return int(counters.get(part, {}).get("seq") or 0)


def fresh_counters(parts: Sequence[int], *, built: bool) -> Flow[None]:
    """The counters of `parts` where there are none: unbuilt, or (`built`, for a database
    holding no execution yet) built already, counting nothing. One upsert each and not a
    bulk write: this runs at a store's set-up, which an in-memory fake (mongomock, whose bulk
    writes refuse PyMongo's operations) must pass too. An unbuilt counter starts its seq at
    a new epoch's base (Rule 6): the documents may carry marks of a counter dropped before it."""
    base = 0
    if not built:
        epoch = yield Increment("counters", EPOCH_ID, "n")
        if epoch is None:  # SecantusDB's answer to a racing first upsert: the one that won
            epoch = yield FindOne("counters", {"_id": EPOCH_ID})
        base = epoch_base(int((epoch or {}).get("n") or 1))
    for part in sorted(set(parts)):
        fresh: dict[str, Any] = {"part": part, "seq": base, "n": {}, "t": 0, "last": [], "built": built}
        if built:
            fresh[LOW] = NO_ID
        yield UpdateOne("counts", {"_id": part}, {"$setOnInsert": fresh}, upsert=True)


def _pins(counters: list[dict[str, Any]]) -> dict[Any, tuple[Any, Any]]:
    """What a reader's second read of the counters must find unchanged: each one's seq (a
    fold in between, Rule 4) and whether it is built (a build finished in between)."""
    return {c["_id"]: (c.get("seq"), c.get("built")) for c in counters}


def read_counts(scope: PartitionScope) -> Flow[Optional[tuple[Counts, int]]]:
    """Exact counts (Rule 4) and how many dirty documents the read met, or None where the
    counters cannot answer (a layout other than this package's: the caller counts the
    collection instead). While some partitions' counters are not built, the counts are
    those of the built ones, with the others named in `Counts.unbuilt` (never a build: a
    reader reads a few documents whatever the collection holds)."""
    marker = yield FindOne("counters", {"_id": SCHEMA_MARKER_ID})
    if marker is None or marker.get("n") != SCHEMA_VERSION:
        return None
    parts = list(range(int(marker.get("parts") or scope.parts)))
    every = {"_id": {"$in": parts}}
    for _ in range(READ_TRIES):
        counters = yield Find("counts", every)
        built = [c for c in counters if c.get("built")]
        done = sorted(c["_id"] for c in built)
        unbuilt = sorted(set(parts) - set(done))
        dirty: Any = []
        if done:
            dirty = yield Find("executions", {PART: {"$in": done}, DIRTY: True}, DIRTY_PROJECTION)
        again = yield Find("counts", every, {"seq": 1, "built": 1})
        if _pins(again) == _pins(counters):
            counts = combine(built, dirty, PART)
            if unbuilt:
                counts.unbuilt = unbuilt
                counts.low = None  # the unbuilt partitions' lowest ids are not known
            return counts, len(dirty)
    return None
