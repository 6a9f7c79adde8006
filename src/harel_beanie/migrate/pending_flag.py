"""Layout version 2: the `pending` flag and partial pending-work indexes.

Documents holding outbox entries or spawns are flagged `pending`, and the pending-work
indexes become partial: `hb_pending` (the flag: both kinds of entry, one relay read) and
`hb_timer_pending` replace `documents.LAYOUT_1_INDEXES`. A document holding no work then
writes no key in them on any commit. No other field changes, so the step is a pass that
sets or clears the flag, then an index swap; down is the reverse.
"""

from __future__ import annotations

from typing import Any, Optional

from harel_beanie.core.documents import (
    LAYOUT_1_INDEXES,
    LAYOUT_3_INDEXES,
    PARTITION_INDEXES,
    SCHEMA_MARKER_ID,
    ExecutionDocument,
    index_models,
)
from harel_beanie.migrate.step import Migration, Step

# version 2's indexes: today's, without those version 3 added, with the one version 4 dropped
_INDEXES = [
    ix for ix in index_models(ExecutionDocument) if ix.document["name"] not in PARTITION_INDEXES
] + LAYOUT_3_INDEXES


class PendingFlag(Step):
    version = 2
    name = "0002_pending_flag_partial_indexes"
    up_projection = {"version": 1, "pending": 1, "outbox.seq": 1, "spawns.seq": 1}
    down_projection = {"version": 1, "pending": 1}

    async def up_batch(self, m: Migration, docs: list[dict[str, Any]]) -> int:
        return await m.write_guarded(docs, pending_update, self.up_projection)

    async def after_up(self, m: Migration) -> None:
        await m.exes.create_indexes(_INDEXES)
        await _drop_named(m, [ix.document["name"] for ix in LAYOUT_1_INDEXES])
        await m.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": self.version}}, upsert=True)

    async def before_down(self, m: Migration) -> None:
        # version 1's indexes first: its stores must find their reads index-backed
        await m.exes.create_indexes(LAYOUT_1_INDEXES)
        await _drop_named(m, [ix.document["name"] for ix in _INDEXES if "partialFilterExpression" in ix.document])

    async def down_batch(self, m: Migration, docs: list[dict[str, Any]]) -> int:
        return await m.write_guarded(
            docs, lambda d: {"$unset": {"pending": ""}} if "pending" in d else None, self.down_projection
        )

    async def after_down(self, m: Migration) -> None:
        await m.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": self.version - 1}}, upsert=True)


def pending_update(doc: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The update setting `pending` as the document's entries say (None: already so)."""
    holds = bool(doc.get("outbox") or doc.get("spawns"))
    if holds and doc.get("pending") is not True:
        return {"$set": {"pending": True}}
    if not holds and "pending" in doc:
        return {"$unset": {"pending": ""}}
    return None


async def _drop_named(m: Migration, names: list[str]) -> None:
    present = {ix["name"] async for ix in await m.exes.list_indexes()}
    for name in names:
        if name in present:
            await m.exes.drop_index(name)
