"""`stuck()`: the RUNNING executions that are stuck, not waiting (`harel_beanie.core.stuck`
says which are which), the most silent first: what the backlog, the failed page,
`/metrics` and `harel-beanie status` list.

Why this module exists: the list was every RUNNING execution silent for five minutes, read
through `(status, updated_at)`, and on a server where `limit` bounds nothing that read every
execution waiting on a timer days ahead (80,000 at a million, on every scrape). Here it is
three reads, each of candidates only, each bounded by what is shown:

- the silent with nothing to wake them: the lowest of `hb_quiet` (`queries.lowest`: about
  `show` documents once a process has read it once);
- the due timer bounds: the lowest of `hb_timer_pending` up to now (due timers the sweep
  did not fire, and bounds a removed timer left too low, which the sweep repairs: few on a
  healthy deployment);
- the documents marked for the counts' fold since the last one, silent for longer than the
  threshold: their `quiet` is not decided yet (`hb_part_cdirty`: what the exact counts read
  anyway); a commit that keeps the status sets its `quiet` itself and is not marked
  (`core.stuck`).
"""

from __future__ import annotations

import time
from typing import Any, Optional

from harel.engine.schema import Names

from harel_beanie.core.arguments import require_int, require_seconds, require_time
from harel_beanie.core.documents import SCHEMA_MARKER_ID, ExecutionDocument
from harel_beanie.core.names import prefix_of
from harel_beanie.core.partitions import DEFAULT_PARTITIONS, MAX_PARTITIONS
from harel_beanie.core.stuck import QUIET, dirty_query, due_query, quiet_query, stuck_rows
from harel_beanie.queries.lowest import lowest
from harel_beanie.queries.rows import Executions, StuckRow, checked_doc

#: the most rows a stuck list may ask for
MAX_STUCK = 10_000


async def stuck(
    *, after: float = 300.0, now: Optional[float] = None, show: int = 10, doc: Executions = ExecutionDocument
) -> list[dict[str, Any]]:
    """The stuck executions at `now` for a threshold of `after` seconds, the most silent
    first, at most `show`: each as `{id, definition_id, active_path, silent_for,
    overdue_for}` (`overdue_for`: how long its earliest timer has been due, None without one)."""
    doc = checked_doc(doc)
    after = require_seconds("after", after)
    now = time.time() if now is None else require_time("now", now)
    show = require_int("show", show, low=0, high=MAX_STUCK)
    if not show:
        return []
    quiet = await lowest(doc, quiet_query(after, now), QUIET, show, StuckRow)
    overdue = await lowest(doc, due_query(now), "next_fire", show, StuckRow, kind=" overdue")
    parts = await _parts(doc)
    coll = doc.get_pymongo_collection()
    fields = {k: 1 for k in StuckRow.model_fields if k != "id"}
    written = await coll.find(dirty_query(parts), fields).to_list(None) if parts else []
    rows = [r.model_dump(by_alias=True) for r in quiet + overdue] + written
    return stuck_rows(rows, after=after, now=now, show=show)


async def _parts(doc: Executions) -> int:
    """The partitions the schema marker records (0: no marker, another layout: no document
    of it carries the dirty mark)."""
    coll = doc.get_pymongo_collection()
    prefix = prefix_of(coll.name) or coll.name
    marker = await coll.database[Names(prefix).counters].find_one({"_id": SCHEMA_MARKER_ID}, {"parts": 1})
    if marker is None:
        return 0
    parts = marker.get("parts")
    return (
        parts
        if isinstance(parts, int) and not isinstance(parts, bool) and 0 < parts <= MAX_PARTITIONS
        else DEFAULT_PARTITIONS
    )
