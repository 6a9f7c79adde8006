"""Reading and keeping a windowed read's start (`harel_beanie.core.start_documents`) beside
the executions it reads.

Why this module exists: the listing (`queries.parts`) and the smallest values
(`queries.lowest`) remember where their last read began, in the process and here; both
read and write it the same way, and neither may fail for it: a server error, or a role that
may not write, leaves the read as it would be without a start.
"""

from __future__ import annotations

from typing import Any, Optional

from pymongo.errors import PyMongoError

from harel_beanie.core.names import prefix_of
from harel_beanie.core.start_documents import starts_collection


def _starts(executions: Any) -> Optional[Any]:
    prefix = prefix_of(executions.name)
    if prefix is None:
        return None  # not a store's executions: nowhere to keep a start
    return executions.database[starts_collection(prefix)]


async def recall(executions: Any, key: str) -> Optional[dict[str, Any]]:
    """The start kept under `key` beside the async collection `executions`, or None."""
    starts = _starts(executions)
    if starts is None:
        return None
    try:
        found = await starts.find_one({"_id": key})
    except PyMongoError:
        return None
    return dict(found) if isinstance(found, dict) else None


async def keep(executions: Any, key: str, fields: dict[str, Any]) -> None:
    """Keep `fields` as the start under `key` (one upsert by `_id`)."""
    starts = _starts(executions)
    if starts is None:
        return
    try:
        await starts.update_one({"_id": key}, {"$set": fields}, upsert=True)
    except PyMongoError:
        pass
