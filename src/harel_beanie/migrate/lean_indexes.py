"""Layout version 4 (`0004_lean_indexes`): the executions' indexes without one whose key is a
prefix of another's under the same partial filter.

`hb_pending` (pending) led `hb_pending_part` (pending, part, _id), both partial on
`{pending: true}`: every read it served, the longer one serves (docs/INDEXES.md lists them,
tests/store/test_index_use.py fails on such a pair), and on the embedded server every index
is maintained and planned over on every write. No document changes, so the step reads none:

- up: creates every index this version declares (all there already on a database at layout
  3; a database another way there gets them first), drops `LAYOUT_3_INDEXES`, records 4.
- down: creates `LAYOUT_3_INDEXES` again first (a store of the earlier version reads through
  them), then records 3.

A store of this version runs on layout 3 as on 4 (`core.flows.state.LIVE_MIGRATION_FROM`):
it never names the dropped index, and the server keeps it up to date until it is dropped.
"""

from __future__ import annotations

from typing import Any

from harel_beanie.core.documents import LAYOUT_3_INDEXES, SCHEMA_MARKER_ID, ExecutionDocument, index_models
from harel_beanie.migrate.step import Migration, Step


class LeanIndexes(Step):
    """Version 4: `hb_pending` dropped, `hb_pending_part` serving its reads."""

    version = 4
    name = "0004_lean_indexes"
    up_projection: dict[str, Any] = {"_id": 1}
    down_projection: dict[str, Any] = {"_id": 1}
    documents = False

    async def after_up(self, m: Migration) -> None:
        await m.exes.create_indexes(index_models(ExecutionDocument))
        present = {ix["name"] async for ix in await m.exes.list_indexes()}
        for ix in LAYOUT_3_INDEXES:
            if ix.document["name"] in present:
                await m.exes.drop_index(ix.document["name"])
        await m.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": self.version}}, upsert=True)

    async def after_down(self, m: Migration) -> None:
        await m.exes.create_indexes(LAYOUT_3_INDEXES)
        await m.counters.update_one({"_id": SCHEMA_MARKER_ID}, {"$set": {"n": self.version - 1}}, upsert=True)
