"""The counts' build as the last part of `harel-beanie migrate up`: every partition's counter
built (`harel_beanie.core.counting`'s last paragraph) in batches, with a line of progress
every few batches.

Why this module exists: at a million executions the counters' first build took minutes, and
it ran inside whichever request met it first; a reader no longer builds (it answers partial
counts and says so), so the operator's command builds them, where minutes are expected and
shown. The workers build the partitions they own as well, a batch a sweep: this command and
they can run at once (each batch lands only where the counter's cursor still is).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from harel_beanie.core.count_documents import counts_collection
from harel_beanie.core.documents import SCHEMA_MARKER_ID
from harel_beanie.core.flows.counting import BUILD_BATCH, Built, build
from harel_beanie.core.flows.state import marker_parts
from harel_beanie.queries.server import server_of
from harel_beanie.store.dispatch import acall, adrive

#: build batches between two lines of progress, and the documents of each
SAY_EVERY = 10
BATCH = BUILD_BATCH


async def build_counts(
    exes: Any, counters: Any, prefix: str, say: Callable[[str], None], *, batch: Optional[int] = None
) -> Built:
    """Build every partition's counter of the executions `exes` (async PyMongo collections,
    `counters` harel's counters collection holding the schema marker), saying progress:
    partitions built of all, executions read so far. Batches of `batch` (None: `BATCH`, or
    on a server where `limit` bounds no work, SecantusDB, the whole build in one pass: there
    each batch's read of its ids reads the collection). Resumes where a killed run stopped."""
    # harel's counters too: a counter built anew takes its epoch there (core.counting, Rule 6)
    colls = {"executions": exes, "counts": exes.database[counts_collection(prefix)], "counters": counters}
    parts = marker_parts(await counters.find_one({"_id": SCHEMA_MARKER_ID}))
    if batch is None and not (await server_of(exes)).limit_bounds_work:
        batch = 0  # each batch's id read would read the collection: the rest in one pass
    total = Built(of=parts)
    while True:
        flow = build(range(parts), batch=BATCH if batch is None else batch, batches=SAY_EVERY)
        step = await adrive(flow, lambda c: acall(colls, c))
        total.read += step.read
        total.built = step.built
        say(f"counts: {total.built}/{parts} partitions built, {total.read} executions read")
        if step.done:
            return total
