"""Layout version 3 (`0003_partitions`): every execution, queue and overflow document carries
its partition (`harel_beanie.core.partitions`), and the count of partitions is recorded.

- up: records the count in the schema marker where it has none (`DEFAULT_PARTITIONS`, the
  count every process assumes while it is absent, so running stores and the record agree),
  creates the indexes led by `part` first (a worker that owns partitions sweeps through them
  while the pass runs), writes `part` on each execution, then on the queue and overflow
  documents, then once more on executions still without one (created meanwhile by a worker
  of an older version, which writes none), and records version 3 last.
- down: records version 2 first, removes `part` everywhere, and drops the indexes led by it.
  The recorded count stays: stores of this version still run on layout 2 and write `part`
  on every new document from that count, so every process must keep reading the same one,
  and going up again keeps it.

A store of this version runs on layout 2 (`core.flows.state.LIVE_MIGRATION_FROM`): there the
owner of partition 0 also sweeps the documents without `part`, so no work is lost while
this step runs alongside the workers.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Optional

from pymongo import UpdateMany, UpdateOne

from harel_beanie.core.count_documents import counts_collection
from harel_beanie.core.counting import COUNTED, COUNTED_SEQ, DIRTY, LEAVING
from harel_beanie.core.documents import (
    PARTITION_INDEXES,
    RETIRED_INDEXES,
    SCHEMA_MARKER_ID,
    ExecutionDocument,
    index_models,
)
from harel_beanie.core.errors import SchemaMismatch
from harel_beanie.core.flows.state import marker_parts
from harel_beanie.core.names import queue_names
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, PART, part_of
from harel_beanie.core.stuck import QUIET
from harel_beanie.migrate.step import Migration, MigrationError, Step
from harel_beanie.transport.documents import QueueDocument

_EXECUTION_INDEXES = [ix for ix in index_models(ExecutionDocument) if ix.document["name"] in PARTITION_INDEXES]
_QUEUE_INDEXES = [ix for ix in index_models(QueueDocument) if ix.document["name"] == "hb_part_claim"]
#: Documents without a partition (the field absent, or null).
_UNPARTITIONED: dict[str, Any] = {PART: None}


class Partitions(Step):
    """Version 3: the partition of every document, and the indexes led by it."""

    version = 3
    name = "0003_partitions"
    up_projection = {"version": 1, PART: 1}
    down_projection = {"version": 1, PART: 1}

    # --- up ---------------------------------------------------------------------------------

    async def before_up(self, m: Migration) -> None:
        # the marker exists: version 2 is recorded in it
        await m.counters.update_one(
            {"_id": SCHEMA_MARKER_ID, "parts": {"$exists": False}}, {"$set": {"parts": DEFAULT_PARTITIONS}}
        )
        await _recorded_parts(m)  # refuse a count no store would accept before writing any
        await m.exes.create_indexes(_EXECUTION_INDEXES)
        await _queues(m).create_indexes(_QUEUE_INDEXES)

    async def up_batch(self, m: Migration, docs: list[dict[str, Any]]) -> int:
        parts = await _recorded_parts(m)
        return await m.write_guarded(docs, lambda d: part_update(d, parts), self.up_projection)

    async def after_up(self, m: Migration) -> None:
        parts = await _recorded_parts(m)
        queues, overflow = _queues(m), _overflow(m)
        # the queues hold only waiting work: a pass each, by group
        async for batch in _batches(queues.find(_UNPARTITIONED, {"_id": 1}), m.batch_size):
            queued = [
                UpdateOne({"_id": d["_id"], **_UNPARTITIONED}, {"$set": {PART: part_of(d["_id"], parts)}})
                for d in batch
            ]
            await queues.bulk_write(queued, ordered=False)
        async for batch in _batches(overflow.find(_UNPARTITIONED, {"g": 1}), m.batch_size):
            groups = sorted({d["g"] for d in batch})
            spilled = [UpdateMany({"g": g, **_UNPARTITIONED}, {"$set": {PART: part_of(g, parts)}}) for g in groups]
            await overflow.bulk_write(spilled, ordered=False)
        # executions a worker of an older version created behind the cursor
        async for batch in _batches(m.exes.find(_UNPARTITIONED, self.up_projection), m.batch_size):
            await m.write_guarded(batch, lambda d: part_update(d, parts), self.up_projection)
        await m.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": self.version}}, upsert=True)

    # --- down -------------------------------------------------------------------------------

    async def before_down(self, m: Migration) -> None:
        # a store of this version started meanwhile runs on layout 2 as on a database being
        # migrated up (it finds documents without `part`); a sharded one refuses to start
        await m.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": self.version - 1}}, upsert=True)

    async def down_batch(self, m: Migration, docs: list[dict[str, Any]]) -> int:
        return await m.write_guarded(
            docs, lambda d: {"$unset": {PART: ""}} if PART in d else None, self.down_projection
        )

    async def after_down(self, m: Migration) -> None:
        # the queues hold only waiting work: one update each
        queues, overflow = _queues(m), _overflow(m)
        for coll in (queues, overflow):
            await coll.update_many({PART: {"$exists": True}}, {"$unset": {PART: ""}})
        # the counts are per partition: dropped, with what each execution was counted as, so
        # that the first fold after the next `migrate up` builds them anew
        await m.exes.database.drop_collection(counts_collection(m.prefix))
        forget = {COUNTED: "", COUNTED_SEQ: "", DIRTY: "", LEAVING: "", QUIET: ""}
        # any of them, not only `cc`: a document written and not yet folded has `cdirty` alone;
        # `quiet` is the fold's mark too (core.stuck)
        await m.exes.update_many({"$or": [{f: {"$exists": True}} for f in forget]}, {"$unset": forget})
        # last: a worker that owns partitions sweeps through them until the pass is done
        await _drop_named(m.exes, [*PARTITION_INDEXES, *RETIRED_INDEXES])
        await _drop_named(queues, [ix.document["name"] for ix in _QUEUE_INDEXES])


def part_update(doc: dict[str, Any], parts: int) -> Optional[dict[str, Any]]:
    """The update setting a document's `part` from its `_id` (None: already so)."""
    want, held = part_of(doc["_id"], parts), doc.get(PART)
    return None if type(held) is int and held == want else {"$set": {PART: want}}


async def _recorded_parts(m: Migration) -> int:
    marker = await m.counters.find_one({"_id": SCHEMA_MARKER_ID})
    try:
        return marker_parts(marker)
    except SchemaMismatch:
        raise MigrationError(
            f"the schema marker of {m.where} records {(marker or {}).get('parts')!r} partitions, "
            "not a count this store can use: correct its `parts`, then run the migration again"
        ) from None


def _queues(m: Migration) -> Any:
    return m.exes.database.get_collection(queue_names(m.prefix)[0], write_concern=m.exes.write_concern)


def _overflow(m: Migration) -> Any:
    return m.exes.database.get_collection(queue_names(m.prefix)[1], write_concern=m.exes.write_concern)


async def _batches(cursor: Any, size: int) -> AsyncIterator[list[dict[str, Any]]]:
    """The documents of `cursor` in lists of `size` (the last one shorter)."""
    batch: list[dict[str, Any]] = []
    async for doc in cursor.batch_size(size):
        batch.append(doc)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


async def _drop_named(coll: Any, names: list[str]) -> None:
    present = {ix["name"] async for ix in await coll.list_indexes()}
    for name in names:
        if name in present:
            await coll.drop_index(name)
