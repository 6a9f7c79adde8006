"""`execution_counts()`: executions by definition and status, exact, read from the counters the
store keeps up to date (`harel_beanie.core.counting`) instead of a count over every execution.

Why this module exists: the front page, `/metrics` and `harel-beanie status` show these counts
on every view and scrape; a count over the collection costs O(executions) on any server, the
counters cost O(partitions + executions written since the last fold). A reader that meets
many unfolded documents folds them itself, so the next read is cheap even where no worker
runs; a reader without the right to write just reads. A reader never builds a counter (at a
million executions the first build took minutes inside whichever request met it): until
the workers or `harel-beanie migrate up` have built them all, the counts are partial and say
which partitions they leave out (`Counts.unbuilt`).
"""

from __future__ import annotations

from typing import Any, Optional

from harel.engine.schema import Names
from pymongo.errors import OperationFailure

from harel_beanie.core.arguments import require_bool
from harel_beanie.core.count_documents import counts_collection
from harel_beanie.core.counting import FOLD_BATCH, Counts
from harel_beanie.core.documents import SCHEMA_MARKER_ID, SCHEMA_VERSION, ExecutionDocument
from harel_beanie.core.flows import fold_counts, read_counts
from harel_beanie.core.names import prefix_of
from harel_beanie.core.partitions import PartitionScope
from harel_beanie.queries.rows import Executions, checked_doc
from harel_beanie.store.dispatch import acall, adrive


def _collections(doc: Executions) -> dict[str, Any]:
    coll = checked_doc(doc).get_pymongo_collection()
    prefix = prefix_of(coll.name) or coll.name  # another name: it stands for the prefix
    db = coll.database
    return {
        "executions": coll,
        "confirm": coll,
        "counters": db[Names(prefix).counters],
        "counts": db[counts_collection(prefix)],
    }


async def execution_counts(*, doc: Executions = ExecutionDocument, fold: bool = True) -> Optional[Counts]:
    """Exact counts of the executions of `doc`'s collection, or None where the counters
    cannot answer (a layout other than this package's: count the collection instead). While
    a partition's counter is not built yet (the workers and `harel-beanie migrate up` build
    them, in batches), the counts leave its executions out and name it in `Counts.unbuilt`:
    a request never builds one. With `fold`, a read meeting more than a fold's batch of
    unfolded documents folds them (in the built partitions) before the counts are read
    again."""
    fold = require_bool("fold", fold)
    colls = _collections(doc)

    async def run(flow: Any) -> Any:
        return await adrive(flow, lambda c: acall(colls, c))

    scope = PartitionScope()
    read = await run(read_counts(scope))
    if fold and read is not None and read[1] > FOLD_BATCH:
        marker = await colls["counters"].find_one({"_id": SCHEMA_MARKER_ID}, {"n": 1, "parts": 1})
        if marker is None or marker.get("n") != SCHEMA_VERSION:
            return None  # another layout: its migration comes first
        if isinstance(marker.get("parts"), int):
            scope.parts = marker["parts"]
        try:
            await run(fold_counts(scope, list(range(scope.parts)), build_batches=0))
        except OperationFailure:
            pass  # a reader may not write: it reads what the workers folded
        read = await run(read_counts(scope))
    return None if read is None else read[0]


async def unbuilt_partitions(*, doc: Executions = ExecutionDocument) -> tuple[list[int], int]:
    """The partitions whose counters are not built yet (their executions left out of the
    counts), and how many partitions there are: two reads of O(partitions) documents; ([], 0)
    on another layout, whose counts are a count of the collection."""
    colls = _collections(doc)
    marker = await colls["counters"].find_one({"_id": SCHEMA_MARKER_ID}, {"n": 1, "parts": 1})
    if marker is None or marker.get("n") != SCHEMA_VERSION:
        return [], 0
    parts = marker["parts"] if isinstance(marker.get("parts"), int) else PartitionScope().parts
    built = await colls["counts"].find({"_id": {"$in": list(range(parts))}, "built": True}, {"_id": 1}).to_list(None)
    done = {c["_id"] for c in built}
    return [p for p in range(parts) if p not in done], parts


async def definition_ids(*, doc: Executions = ExecutionDocument) -> list[str]:
    """The definitions that have executions stored, for a page's choice of definition: read
    from the counters (O(partitions)), or, where they cannot answer, a `distinct` over the
    leading field of `hb_definition` (one key per definition on mongod, every key on a server
    that walks the whole index)."""
    counts = await execution_counts(doc=doc)
    # partial counts too (a definition only unbuilt partitions hold is missing until they
    # are built): a distinct would read every key of the index on some servers
    if counts is not None:
        return sorted(d for d, per in counts.per.items() if any(n > 0 for n in per.values()))
    found = await checked_doc(doc).get_pymongo_collection().distinct("definition_id")
    return sorted(d for d in found if isinstance(d, str))
