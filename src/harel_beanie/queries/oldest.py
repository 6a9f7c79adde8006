"""The executions holding the oldest pending entries: the backlog's "oldest 2h old", by name.

Why this module exists: the backlog counts the pending outbox entries and spawns and gives the
oldest one's age, and an execution holding an entry is waiting, not stuck (`core.stuck`), so
no stuck list shows it. An operator who reads "oldest 2h" needs the executions behind it:
`status`, `/backlog` and its JSON list the N holding the oldest entries of each kind.

Rule 1: an execution's first entry in `outbox` (in `spawns`) is its oldest there. Each
    execution's seqs only grow (`core.seqs`: the commit's CAS on `seq_hi`), entries are
    appended in the order they were minted, and acks and purges remove entries without
    reordering the rest; harel's own store appended in its counter's order too.
Rule 2: so the executions holding the N oldest entries of a kind are the first N documents in
    the order of that array's first seq: `hb_outbox_oldest` and `hb_spawn_oldest` key each
    document holding an entry of their kind by it, one key a document, and `queries.lowest`
    reads the first N (one sorted, limited read where `limit` bounds the work, windows of
    that key where it does not), never every document holding an entry, which the counts
    read. Each row still shows the smallest seq it holds, so a document out of Rule 1's
    order is shown as old as it is, only listed in its first entry's place.
Rule 3: those indexes are partial on `core.documents.OLDEST_OUTBOX` / `OLDEST_SPAWN`, the
    document holding work with a first entry in that array, and this read names that filter
    whole. A server uses a partial index only for a filter that implies its partial filter
    (MongoDB's documented rule; SecantusDB's planner checks the same), and no other read
    names an array's first seq, so the relay's, the sweep's and purge's `{pending, ...}`
    reads cannot plan on them and keep `hb_pending_part` (with the indexes partial on
    `pending` alone, SecantusDB, which takes the shortest key whose partial filter holds a
    filter's equalities, read the relay's `{pending: true}` through `hb_outbox_oldest`). On
    mongod this read may also plan on `hb_pending_part`; MongoDB ranks candidates by a trial
    run, in which the plan through the sorted key returns its N rows while the other still
    sorts (tests/queries/test_oldest_pending.py asserts the plan there). A commit
    writes a key there only on a document holding an entry of that kind (docs/INDEXES.md).

The list is read when the view is: where the counts come from a minute's sample
(`queries.samples`), the list is still read now (it is bounded), so it may name an entry the
sample did not count yet, or none that it counted and a relay has delivered since.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Iterable, Optional

from pydantic import BaseModel, Field

from harel_beanie.core.documents import OLDEST_OUTBOX, OLDEST_SPAWN
from harel_beanie.core.seqs import MS_SHIFT, age_of
from harel_beanie.queries.lowest import WIDEST, lowest

#: how many executions of each kind the views list (`backlog(oldest=...)`), and the most one may ask
OLDEST = 5
MAX_OLDEST = 100
#: the widest window of seqs the walk reads before its last one is open above: as long in
#: time as the walk's default over seconds (a seq's millisecond sits above its low bits)
SEQ_WIDEST = WIDEST * 1000 * (1 << MS_SHIFT)
#: the kinds of pending entry, by the array holding them
ARRAYS = {"outbox": "outbox", "spawn": "spawns"}
#: each array's read: its index's partial filter (`core.documents`), which bounds its first
#: seq from below and so leaves out a document holding only the other kind
_FILTERS = {"outbox": OLDEST_OUTBOX, "spawns": OLDEST_SPAWN}


class _Seq(BaseModel):
    seq: int


class _Holder(BaseModel):
    """A document holding pending entries: its id, definition and its entries' seqs only."""

    id: str = Field(alias="_id")
    definition_id: Optional[str] = None
    outbox: list[_Seq] = []
    spawns: list[_Seq] = []


class _OutboxHolder(_Holder):
    class Settings:
        projection = {"_id": 1, "definition_id": 1, "outbox.seq": 1}


class _SpawnHolder(_Holder):
    class Settings:
        projection = {"_id": 1, "definition_id": 1, "spawns.seq": 1}


_MODELS: dict[str, type[_Holder]] = {"outbox": _OutboxHolder, "spawns": _SpawnHolder}


class PendingHolder(BaseModel):
    """One row of the list: an execution holding pending entries of one kind ("outbox" or
    "spawn"), its oldest one's seq and age in seconds (None for a seq harel's own counter
    handed out: it carries no time), and how many of that kind it holds. `page` is the
    execution's page on a dashboard, where the view showing the row knows it."""

    id: str
    definition_id: Optional[str] = None
    kind: str
    seq: int
    age: Optional[float] = None
    entries: int
    page: Optional[str] = None


def holder_row(
    kind: str, execution_id: str, definition_id: Optional[str], seqs: list[int], now: float
) -> dict[str, Any]:
    """One row of the list (`PendingHolder`, as plain data)."""
    low = min(seqs)
    row = PendingHolder(
        id=execution_id, definition_id=definition_id, kind=kind, seq=low, age=age_of(low, now), entries=len(seqs)
    )
    return row.model_dump(exclude={"page"})


async def oldest_holders(doc: Any, n: int, now: float) -> dict[str, list[dict[str, Any]]]:
    """The executions holding the `n` oldest pending entries of each kind (Rule 2), oldest
    first: kind ("outbox", "spawn") -> rows (`holder_row`)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for kind, array in ARRAYS.items():
        field = f"{array}.0.seq"
        # the index's partial filter whole, so the server may read through it (the walk's
        # windows only narrow the first seq's bound)
        query = {**_FILTERS[array], field: dict(_FILTERS[array][field])}
        model, first = _MODELS[array], partial(_first, array=array)
        rows = await lowest(doc, query, field, n, model, value=first, widest=SEQ_WIDEST, whole=True)
        out[kind] = [
            holder_row(kind, r.id, r.definition_id, [e.seq for e in getattr(r, array)], now)
            for r in rows
            if getattr(r, array)  # the filter asked for a first entry: never empty, kept safe
        ]
    return out


def _first(row: _Holder, *, array: str) -> float:
    entries = getattr(row, array)
    return float(entries[0].seq) if entries else float("inf")


def oldest_of(
    found: Iterable[tuple[str, str, Optional[str], list[int]]], n: int, now: float
) -> dict[str, list[dict[str, Any]]]:
    """The same rows from documents read whole (a database still in harel's layout, which the
    backlog reads in full there anyway): `found` holds (kind, id, definition, seqs)."""
    rows = [holder_row(kind, eid, definition, seqs, now) for kind, eid, definition, seqs in found if seqs]
    return {kind: sorted((r for r in rows if r["kind"] == kind), key=lambda r: r["seq"])[:n] for kind in ARRAYS}
