"""The schema: the Beanie documents this store keeps, their indexes and the projections it reads.

Everything else in the package (both stores, the migrations, the dashboard queries) takes
collection names, field names, indexes and projections from here, so the layout is declared
once. The field names of the executions document are harel's own MongoStore's, so a database
that store wrote opens as it is; the fields this store adds are all optional, so a document
that lacks them still loads and advances.

Collections are named by harel's `Names(prefix)`. Beanie binds a document class to one
collection, so `bind(prefix)` builds (once per prefix) a subclass whose only difference is the
collection name; the classes exported at module level are those of the default prefix.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any, ClassVar, Optional, Union

from beanie import Document
from beanie.odm.utils.projection import get_projection
from harel.engine.schema import DEFAULT_PREFIX, Names
from pydantic import BaseModel, ConfigDict, Field
from pymongo import ASCENDING, IndexModel

from harel_beanie.core.arguments import BadArgumentType, require_str
from harel_beanie.core.keys import ANY_SEQ, ANY_TIME
from harel_beanie.core.stuck import QUIET, QUIET_FILTER
from harel_beanie.core.unbound import StoreDocument

#: The layout version this package writes and reads; recorded in the counters collection.
#: Bump it with every migration in migrations/. Version 2: the `pending` flag and the partial
#: pending-work indexes in place of `LAYOUT_1_INDEXES`. Version 3: partitions (`part` on
#: every execution and queue document, the number of them in the schema marker, and the
#: pending-work indexes led by `part` beside the others, `PARTITION_INDEXES`). Version 4:
#: without `hb_pending`, whose key was a prefix of `hb_pending_part`'s under the same partial
#: filter (`LAYOUT_3_INDEXES`; docs/INDEXES.md, tests/store/test_index_use.py).
SCHEMA_VERSION = 4

#: The filter selecting the documents that hold outbox entries or spawns (see `pending`); and the partial filters
#: of `hb_outbox_oldest` and `hb_spawn_oldest`, which serve only the oldest holders' read (`queries.oldest`, Rule 3)
PENDING: dict[str, Any] = {"pending": True}
OLDEST_OUTBOX, OLDEST_SPAWN = {**PENDING, "outbox.0.seq": ANY_SEQ}, {**PENDING, "spawns.0.seq": ANY_SEQ}

#: The filter selecting the documents the counts have not folded yet (`core.counting`).
DIRTY_MARK: dict[str, Any] = {"cdirty": True}

#: The `_id` of the counters-collection document holding the recorded layout version.
SCHEMA_MARKER_ID = "harel_beanie:schema"
#: The `_id` of the counter that spreads store instances over the seq nodes when they take
#: a lease (each node's lease has a document of its own: `harel_beanie.core.seqs.lease_id`).
NODE_COUNTER_ID = "harel_beanie:node"


class OutboxItem(BaseModel):
    """A deferred event awaiting delivery (harel's `OutboxEntry`, `event` as its JSON)."""

    seq: int
    target_id: Optional[str] = None
    event: str


class SpawnItem(BaseModel):
    """A pending child creation (harel's `SpawnEntry`). This store writes `context` as JSON
    text, because a user's keys may hold `.` or start with `$`; harel's store wrote a dict."""

    seq: int
    parent_id: str
    child_id: str
    root_path: str
    context: Union[str, dict[str, Any]]


class SummaryFields(BaseModel):
    """harel's `ExecutionSummary` but its version, as the executions document holds it: the
    key, the definition, and the summary fields this store copies out of `data` at each
    commit (`commit.summary_fields`) so that listings and dashboards never parse `data`.
    Those copies are optional: a document harel's store wrote has none until it is written
    again or migrated. The executions document and the listing rows derive from this."""

    id: str = Field(alias="_id")
    definition_id: str
    status: Optional[str] = None
    outcome: Optional[str] = None
    active_path: Optional[str] = None
    parent_id: Optional[str] = None
    finished_at: Optional[float] = None


class ExecutionDocument(StoreDocument, SummaryFields):
    """One execution and everything that must commit atomically with it.

    Its `_id`, `definition_id`, `version`, `data`, `outbox`, `spawns`, `processed`, `timers`
    and `trace` are harel's MongoStore layout. The rest is what this store adds so that
    listing, sweeps and dashboards are served by indexes instead of parsing `data`: copies
    of the execution's summary fields (`SummaryFields`, and its creation and update times),
    a lower bound of its earliest timer, the count of trace steps ever written and the
    highest seq it has issued."""

    # (mypy sees Beanie's `model_config` as an instance variable, pydantic's as a class one)
    model_config = ConfigDict(extra="allow")  # type: ignore[misc]

    id: str = Field(alias="_id")  # type: ignore[assignment]  # Beanie's own `id` is an ObjectId
    version: int
    data: str  # the Execution as JSON, exactly what harel's `Execution.model_dump_json` gives
    outbox: list[OutboxItem] = []
    spawns: list[SpawnItem] = []
    processed: list[str] = []  # dedupe window: the most recent event ids handled
    timers: dict[str, float] = {}  # encoded node path -> fire_at (see harel_beanie.paths)
    trace: list[dict[str, Any]] = []

    created_at: Optional[float] = None
    updated_at: Optional[float] = None
    finished_on: Optional[datetime] = None  # `finished_at` as a date: what a TTL index expires
    next_fire: Optional[float] = None  # <= every armed timer's fire_at; absent (never null) when none
    trace_n: int = 0  # trace steps ever appended; stamps the 0-based index of a ring entry
    seq_hi: Optional[int] = None  # the highest outbox/spawn seq this execution has issued
    commit_tokens: list[str] = []  # random ids of the last commits (see harel_beanie.core.commit)
    born: Optional[str] = None  # the token of the commit that created this incarnation
    buried: list[str] = []  # `born` of earlier incarnations of this id, purged (see flows)
    # true exactly while `outbox` or `spawns` holds an entry, absent otherwise: set by the
    # commit that adds entries, cleared by the write that removes the last (an update
    # pipeline recomputes it; see flows.ack_outbox). The one index the relays read.
    pending: Optional[bool] = None
    # the execution's partition, a function of its id (`harel_beanie.core.partitions`): what
    # a worker's sweeps select on, and on a sharded cluster the shard key's first field
    part: Optional[int] = None
    # the counts kept up to date (harel_beanie.core.counting): what the counters count this
    # document as, the fold that set it, whether a write changed it since (the one index
    # the folds read), and whether prune has begun removing it
    cc: Optional[dict[str, Any]] = None
    cseq: Optional[int] = None
    cdirty: Optional[bool] = None
    leaving: Optional[bool] = None
    # `updated_at` while the execution is RUNNING with no timer armed and nothing pending, as
    # of the counts' last fold (absent otherwise): what the stuck list reads (core.stuck)
    quiet: Optional[float] = None

    class Settings:
        name = Names(DEFAULT_PREFIX).executions
        use_state_management = False
        validate_on_save = False
        # Each index below names the read it serves; bench/RESULTS.md gives what it costs.
        indexes: ClassVar[list[IndexModel]] = [
            # list_executions(definition_id=...) pages by _id; dashboards per model
            IndexModel([("definition_id", ASCENDING), ("_id", ASCENDING)], name="hb_definition"),
            # list_executions(status=...) pages by _id. Not merged into hb_status_updated as one
            # (status, updated_at, _id): every listing that bounds only `_id` (the whole
            # listing, an id prefix, an outcome) is read as one `_id` window per status here
            # (queries/parts.py), because SecantusDB reads the whole collection for a range
            # of `_id` alone, and no key with `updated_at` second bounds an `_id` range
            IndexModel([("status", ASCENDING), ("_id", ASCENDING)], name="hb_status"),
            # "failed in the last hour, newest first", "running but silent for too long", and a
            # listing's time range (the dashboard's "updated within" / from-to search)
            IndexModel([("status", ASCENDING), ("updated_at", ASCENDING)], name="hb_status_updated"),
            # roots_only (parent_id null) and the children of an execution
            IndexModel([("parent_id", ASCENDING), ("_id", ASCENDING)], name="hb_parent"),
            # The pending-work indexes are partial: a document has a key in them only while it
            # holds that work, so the many documents holding none write no key there on any
            # commit (and, on SecantusDB, skip their upkeep). Every read of pending work names
            # the filter (`PENDING`, `ANY_TIME`), so the server may use them.
            # due_timers over every partition reads only documents with a timer due by now;
            # the dashboard's "waiting on a timer"
            IndexModel(
                [("next_fire", ASCENDING)], name="hb_timer_pending", partialFilterExpression={"next_fire": ANY_TIME}
            ),
            # Outbox entries and spawns, one index for both: a relay over every partition reads
            # both in one round trip (`{pending}`), ack_outbox / ack_spawn without an owner hint,
            # purge finds the entries addressed to the purged execution among these documents,
            # the backlog sums them; a worker that owns some partitions sweeps only theirs
            # (`{pending, part: {$in}}`), and the post-commit relay reads one family by `_id`
            # range within its partition (`{pending, part, _id range}`). `pending` leads
            # although it is the same in every key: a server that plans a filter's equalities
            # only on an index led by exactly those fields (SecantusDB) then walks one range
            # for each of those shapes; on (part, _id) it read every pending document for each
            # family read (0.36 s at a million executions holding 10,000 pending). `{pending}`
            # alone is a range of its first field, planned there too (tests/store/
            # test_structure.py explains each shape), so layout 4 dropped `hb_pending`, led by
            # `pending` alone (`LAYOUT_3_INDEXES`).
            IndexModel(
                [("pending", ASCENDING), ("part", ASCENDING), ("_id", ASCENDING)],
                name="hb_pending_part",
                partialFilterExpression=PENDING,
            ),
            IndexModel([("outbox.0.seq", ASCENDING)], name="hb_outbox_oldest", partialFilterExpression=OLDEST_OUTBOX),
            IndexModel([("spawns.0.seq", ASCENDING)], name="hb_spawn_oldest", partialFilterExpression=OLDEST_SPAWN),
            IndexModel(
                [("part", ASCENDING), ("next_fire", ASCENDING)],
                name="hb_part_timer",
                partialFilterExpression={"next_fire": ANY_TIME},
            ),
            # the counts: the documents written since their partition's last fold, which the
            # fold and every exact read of the counts read (core.counting, Rule 2)
            # (led by `part` then the mark, for the reason given for hb_pending_part)
            IndexModel(
                [("part", ASCENDING), ("cdirty", ASCENDING), ("_id", ASCENDING)],
                name="hb_part_cdirty",
                partialFilterExpression=DIRTY_MARK,
            ),
            # the stuck list's silent executions (core.stuck): only those RUNNING with no timer
            # armed and nothing pending have a key, so the executions waiting on a timer, most
            # of the RUNNING ones, are never read for it (they were: 80,000 at a million)
            IndexModel([(QUIET, ASCENDING)], name="hb_quiet", partialFilterExpression=QUIET_FILTER),
        ]


#: The pending-work indexes of layout version 1 (full, not partial: a key for every document,
#: even one holding no work). Layout version 2 replaced them; its migration drops them on the
#: way up and creates them again on the way down.
LAYOUT_1_INDEXES: list[IndexModel] = [
    IndexModel([("outbox.seq", ASCENDING)], name="hb_outbox_seq"),
    IndexModel([("spawns.seq", ASCENDING)], name="hb_spawn_seq"),
    IndexModel([("next_fire", ASCENDING)], name="hb_next_fire", sparse=True),
]


#: The index layout version 4 dropped: `hb_pending` (pending), a prefix of `hb_pending_part`
#: under the same partial filter, which serves every read it served (docs/INDEXES.md). Layouts
#: 2 and 3 have it; version 4's migration drops it on the way up and creates it again on the
#: way down.
LAYOUT_3_INDEXES: list[IndexModel] = [
    IndexModel([("pending", ASCENDING)], name="hb_pending", partialFilterExpression=PENDING),
]


#: The indexes layout version 3 added: its migration creates them on the way up, drops them down.
PARTITION_INDEXES = ("hb_pending_part", "hb_part_timer")

#: Indexes an earlier release made under layout 3 and this one no longer declares: `hb_part_pending` (part, _id),
#: which `hb_pending_part` replaces. A store never reads through them; `migrate down` drops them with the others,
#: and a database keeps one until it is dropped (CHANGELOG: one `dropIndex`), paying upkeep on documents holding work.
RETIRED_INDEXES = ("hb_part_pending",)


class Tombstone(BaseModel):
    """What a purged execution leaves under its id (a document with only `_id` and `tomb`):
    it holds the id, so a late or re-sent creation can't bring the execution back."""

    at: float  # when it was purged (epoch seconds)
    buried: list[str] = []  # the creation tokens of every incarnation purged under this id
    # the token of the purge that wrote it: a purge whose reply said "nothing matched" (the
    # driver's own retry, after its first attempt landed) learns from it that it was its own
    by: Optional[str] = None


class CounterDocument(StoreDocument):
    """harel's counters collection. harel's MongoStore keeps its global outbox/spawn seq
    counters here; this store keeps its layout version and its seq node counter."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(alias="_id")  # type: ignore[assignment]
    n: int = 0

    class Settings:
        name = Names(DEFAULT_PREFIX).counters
        use_state_management = False


# --- projection models: what each read fetches, never more -------------------------------------


class LoadView(BaseModel):
    """`load`: the snapshot only."""

    data: str


class VersionView(BaseModel):
    """The CAS loser's question: where is the stored version now?"""

    id: str = Field(alias="_id")
    version: Optional[int] = None
    seq_hi: Optional[int] = None
    commit_tokens: list[str] = []
    tomb: Optional[Tombstone] = None
    # what the counts count the document as: a creation over a tombstone carries them on
    cc: Optional[dict[str, Any]] = None
    cseq: Optional[int] = None


class SummaryView(SummaryFields):
    """A row of `list_executions`: harel's `ExecutionSummary`, read from promoted fields."""

    version: int = 0


class LegacySummaryView(SummaryView):
    """A listing row maybe from harel's store (no promoted fields yet): falls back to `data`."""

    data: Optional[str] = None


class OutboxView(BaseModel):
    """`pending_outbox`: the entries, and the holder's parent (is it in the tree a scoped
    relay asked for? `pending_outbox(within=...)`)."""

    id: str = Field(alias="_id")
    parent_id: Optional[str] = None
    outbox: list[OutboxItem] = []


class PendingView(BaseModel):
    """A relay pass's one read: both kinds of entry of a document holding any, and the
    holder's parent (a scoped relay's tree, as for `OutboxView`)."""

    id: str = Field(alias="_id")
    parent_id: Optional[str] = None
    outbox: list[OutboxItem] = []
    spawns: list[SpawnItem] = []


class SpawnView(BaseModel):
    """`pending_spawns`, as `OutboxView`."""

    id: str = Field(alias="_id")
    parent_id: Optional[str] = None
    spawns: list[SpawnItem] = []


class TimerView(BaseModel):
    id: str = Field(alias="_id")
    version: int = 0
    timers: dict[str, float] = {}
    next_fire: Optional[float] = None


class TraceView(BaseModel):
    trace: list[dict[str, Any]] = []
    trace_n: Optional[int] = None


def projection(model: type[BaseModel]) -> dict[str, Any]:
    """The find projection of a projection model, as Beanie's `.project(model)` builds it."""
    proj = get_projection(model)
    assert proj is not None, model
    return dict(proj)


def bind(prefix: str = DEFAULT_PREFIX) -> tuple[type[ExecutionDocument], type[CounterDocument]]:
    """The document classes for the collections under `prefix` (validated as harel does).

    Pass them to your own `init_beanie(document_models=[...])` to query the store's data
    with Beanie; the stores use the same classes."""
    # checked before the cache, which would refuse a dict as unhashable without naming it
    return _bind(require_str("prefix", prefix))


@lru_cache(maxsize=None)
def _bind(prefix: str) -> tuple[type[ExecutionDocument], type[CounterDocument]]:
    names = Names(prefix)  # raises ValueError on a prefix harel would refuse
    if prefix == DEFAULT_PREFIX:
        return ExecutionDocument, CounterDocument
    return bound_class(ExecutionDocument, prefix, names.executions), bound_class(
        CounterDocument, prefix, names.counters
    )


def bound_class(base: type[Document], prefix: str, collection: str) -> Any:
    """A subclass of the document class `base` whose only difference is its collection: how
    a class of the default prefix is bound to another prefix (`bind`, `bind_queues`)."""
    stem = "".join(part.capitalize() for part in prefix.split("_")) or "Prefixed"
    cls_name = f"{stem}{base.__name__}"
    # pydantic wants nested classes to look as if declared in the class body
    settings = type(
        "Settings",
        (base.Settings,),  # type: ignore[attr-defined]
        {"name": collection, "__qualname__": f"{cls_name}.Settings", "__module__": base.__module__},
    )
    return type(cls_name, (base,), {"Settings": settings, "__module__": base.__module__, "__qualname__": cls_name})


def executions_class(what: str, doc: Any) -> type[ExecutionDocument]:
    """`doc` if it is the executions class of some prefix: `ExecutionDocument` or
    `bind(prefix)[0]`. A user's own subclass or another Document class would read another
    collection (or another shape) under the store's name: refused, naming `what`."""
    name = getattr(getattr(doc, "Settings", None), "name", None)
    suffix = "_executions"
    if isinstance(doc, type) and issubclass(doc, ExecutionDocument) and isinstance(name, str) and name.endswith(suffix):
        try:
            if bind(name[: -len(suffix)])[0] is doc:
                return doc
        except ValueError:  # not a prefix harel accepts: not one of ours
            pass
    raise BadArgumentType(what, "ExecutionDocument or the executions class of bind(prefix)", doc)


def index_models(doc: type[Document]) -> list[IndexModel]:
    """The indexes declared on a document class (Beanie's `Settings.indexes`)."""
    return list(getattr(doc.Settings, "indexes", []))  # type: ignore[attr-defined]


def document_models(prefix: str = DEFAULT_PREFIX) -> list[type[Document]]:
    """The store's document classes for `prefix`, to add to the app's own
    `init_beanie(document_models=[*my_models, *document_models()])`."""
    return list(bind(prefix))


#: The store's document classes for the default prefix (`document_models()`).
DOCUMENT_MODELS: list[type[Document]] = document_models()
