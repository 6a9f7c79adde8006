"""Where the operator's windowed reads start: one small document per kind of read, in
`<prefix>_hb_starts`.

Why this module exists: on a server whose `limit` bounds nothing (SecantusDB), a listing's
first page and the backlog's soonest timers are read in windows from where the last such
read began (`harel_beanie.queries.parts`, `harel_beanie.queries.lowest`); with no such point
a read takes every match once. Kept in the database, the point outlives the process that
found it: `harel-beanie status` (a new process each time) and a restarted dashboard start
where the last reader did. A cost hint only: a read returns the same rows without it, and a
reader that may not write (a read-only role) goes on without keeping it.
"""

from __future__ import annotations

import hashlib
from typing import Any, Optional

from beanie import Document
from harel.engine.schema import DEFAULT_PREFIX, Names
from pydantic import ConfigDict, Field

from harel_beanie.core.arguments import require_str


class StartDocument(Document):
    """One kind of read's start: `_id` a digest of the collection, the read's field and the
    shape of its filter (`start_key`); `at` where its last read began (an execution id for a
    listing, a field's value for the smallest values); `size` the width or the id position its
    windows filled at; `share` how many rows each part of a listing gave."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(alias="_id")  # type: ignore[assignment]
    at: Any = None
    size: Optional[float] = None
    share: list[int] = []

    class Settings:
        name = f"{DEFAULT_PREFIX}_hb_starts"
        use_state_management = False


def starts_collection(prefix: str) -> str:
    """The collection of the read starts of the executions under `prefix`."""
    Names(require_str("prefix", prefix))  # raises ValueError on a prefix harel would refuse
    return f"{prefix}_hb_starts"


def start_key(*parts: str) -> str:
    """A document id for one kind of read, from what tells it apart (a digest: the filter's
    shape may hold any text, and an id must stay short)."""
    return hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:32]
