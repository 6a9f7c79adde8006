"""Every store operation, written once as a flow of database calls.

A flow is a generator: it yields a call from `harel_beanie.calls`, the store makes it and
sends the result back in (or throws the driver's error in), and the flow's return value is
the operation's result. The logic of an operation (what it asks, in what order, what the
answers mean, what is retried) lives only here; `MongoStore` and `AsyncMongoStore` only make
the calls, one with PyMongo's sync client and one awaiting the async client. harel's engine
drives its own steps the same way (`yield from store(...)`).

`StoreState` is what a store instance knows between operations: its settings, its seq mint
(set up on first use), whether the database is a not-yet-migrated harel layout, and which
document holds each outbox/spawn seq it has seen, so an ack is addressed by `_id`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional

from harel.engine.execution import Execution, ExecutionPage, Status
from harel.engine.store.base import OutboxEntry, SpawnEntry, Step, StoreConflict, TimerOp
from harel.spec.states import Event
from pymongo.errors import (
    ConnectionFailure,
    DocumentTooLarge,
    DuplicateKeyError,
    ExecutionTimeout,
    PyMongoError,
    WriteError,
)

from harel_beanie import records
from harel_beanie.calls import (
    CreateIndexes,
    DeleteOne,
    Find,
    FindOne,
    Flow,
    Increment,
    InsertOne,
    UpdateMany,
    UpdateOne,
)
from harel_beanie.commit import CommitPlan, append_trace_update, plan_commit
from harel_beanie.documents import (
    NODE_COUNTER_ID,
    SCHEMA_MARKER_ID,
    SCHEMA_VERSION,
    LoadView,
    OutboxView,
    SpawnView,
    TimerView,
    TraceView,
    VersionView,
    projection,
)
from harel_beanie.errors import ExecutionTooLarge, SchemaMismatch
from harel_beanie.keys import ANY_SEQ, prefix_range, require_int, require_str, require_time, timer_field
from harel_beanie.listing import listing_page, listing_query
from harel_beanie.seqs import NODES, SeqMint

log = logging.getLogger("harel_beanie")

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
# what a commit may put in `data`, leaving room for the rest of the document
MAX_DATA_BYTES = MAX_DOCUMENT_BYTES - 1024 * 1024
# the server's codes for a document or update over the size limit
_TOO_LARGE_CODES = {10334, 17419, 17420, 13134}
_OWNERS_MAX = 100_000  # seq -> owner hints kept for addressing acks by _id
UNKNOWN_OUTCOME_RETRIES = 3  # re-sends of a commit whose reply was lost and that did not land


@dataclass
class StoreState:
    trace_max: int
    dedupe_window: int
    create_schema: bool
    where: str  # "db <name>, prefix <p>" for messages
    indexes: list[Any]
    ready: bool = False
    compat: bool = False  # the database is harel's MongoStore layout, not migrated
    mint: Optional[SeqMint] = None
    owners: dict[int, str] = field(default_factory=dict)

    def remember(self, owners: dict[int, str]) -> None:
        if len(self.owners) + len(owners) > _OWNERS_MAX:
            self.owners.clear()  # only hints: an ack without one finds its entry by index
        self.owners.update(owners)


# --- set-up -------------------------------------------------------------------------------


def setup(st: StoreState) -> Flow[None]:
    """Indexes (when create_schema), the layout check, and this instance's seq node."""
    if st.create_schema:
        yield CreateIndexes("executions", st.indexes)
    marker = yield FindOne("counters", {"_id": SCHEMA_MARKER_ID})
    if marker is None:
        some = yield FindOne("executions", {}, {"_id": 1})
        if some is not None:
            st.compat = True
            log.warning(
                "%s holds executions in harel's MongoStore layout; they load and advance, "
                "but listing and timer sweeps scan them until `harel-beanie migrate up` runs",
                st.where,
            )
        elif st.create_schema:
            yield UpdateOne("counters", {"_id": SCHEMA_MARKER_ID}, {"$setOnInsert": {"n": SCHEMA_VERSION}}, upsert=True)
    elif marker.get("n") != SCHEMA_VERSION:
        raise SchemaMismatch(int(marker.get("n") or 0), SCHEMA_VERSION, st.where)
    counter = None
    for _ in range(5):  # SecantusDB may answer None to a concurrent first upsert
        counter = yield Increment("counters", NODE_COUNTER_ID, "n")
        if counter is not None:
            break
    if counter is None:
        raise RuntimeError(f"could not take a seq node number from {st.where}")
    st.mint = SeqMint((int(counter["n"]) - 1) % NODES)
    st.ready = True


# --- reads --------------------------------------------------------------------------------


def load(st: StoreState, execution_id: str) -> Flow[Optional[Execution]]:
    doc = yield FindOne("executions", {"_id": require_str("execution id", execution_id)}, projection(LoadView))
    return records.execution(doc)


def load_for_event(st: StoreState, execution_id: str, event_id: str) -> Flow[tuple[Optional[Execution], bool]]:
    """The execution and whether it already processed `event_id`, in one round trip: the
    `$elemMatch` projection returns at most the one matching id, never the whole window."""
    require_str("event id", event_id)
    proj = {**projection(LoadView), "processed": {"$elemMatch": {"$eq": event_id}}}
    doc = yield FindOne("executions", {"_id": require_str("execution id", execution_id)}, proj)
    if doc is None:
        return None, False
    return records.execution(doc), bool(doc.get("processed"))


def is_processed(st: StoreState, execution_id: str, event_id: str) -> Flow[bool]:
    # a point read by _id projecting the one matching id, as load_for_event does: cheaper
    # on some servers than a filter on the array
    proj = {"_id": 1, "processed": {"$elemMatch": {"$eq": require_str("event id", event_id)}}}
    doc = yield FindOne("executions", {"_id": require_str("execution id", execution_id)}, proj)
    return bool(doc and doc.get("processed"))


def list_executions(
    st: StoreState,
    status: Optional[Iterable[Status]],
    definition_id: Optional[str],
    roots_only: bool,
    limit: int,
    cursor: Optional[str],
) -> Flow[ExecutionPage]:
    q = listing_query(status, definition_id, roots_only, limit, cursor, compat=st.compat)
    docs = yield Find("executions", q.filter, q.projection, sort=[("_id", 1)], limit=q.limit)
    return listing_page(q, docs)


def read_trace(st: StoreState, execution_id: str) -> Flow[list[dict[str, Any]]]:
    doc = yield FindOne("executions", {"_id": require_str("execution id", execution_id)}, projection(TraceView))
    return records.trace_steps(doc)


def ids_with_prefix(st: StoreState, prefix: str) -> Flow[list[str]]:
    docs = yield Find("executions", prefix_range(prefix), {"_id": 1})
    return [d["_id"] for d in docs]


# --- the commit ---------------------------------------------------------------------------


def commit(
    st: StoreState,
    exe: Execution,
    emits: list[tuple[Optional[str], Event]],
    processed_event_id: Optional[str] = None,
    timers: tuple[TimerOp, ...] = (),
    spawns: tuple[tuple[str, str, dict[str, Any]], ...] = (),
    trace: Optional[dict[str, Any]] = None,
    step: Optional[Step] = None,
) -> Flow[list[int]]:
    """One write: the CAS update (or the insert of a new execution). A second round trip
    happens only when the write did not land, or its reply was lost, to learn why.

    A lost reply (the connection dropped, the server timed the operation out) leaves
    the outcome unknown: the write may have been applied. The stored `commit_token` says
    whether it was this write; if the stored version is still the loaded one, it was not
    applied and is sent again (the CAS makes a second application impossible)."""
    floor = 0
    retries_left = UNKNOWN_OUTCOME_RETRIES
    unsure: dict[str, CommitPlan] = {}  # sends whose outcome we never learned, by token
    plan: Optional[CommitPlan] = None
    while True:
        if plan is None:
            plan = plan_commit(
                exe, emits, processed_event_id, timers, spawns, trace,
                mint=st.mint, seq_floor=floor, trace_max=st.trace_max, dedupe_window=st.dedupe_window,
            )  # fmt: skip
        if plan.data_bytes > MAX_DATA_BYTES:
            raise ExecutionTooLarge(exe.id, plan.data_bytes, MAX_DOCUMENT_BYTES)
        landed = False
        lost: Optional[PyMongoError] = None
        try:
            if plan.insert is not None:
                yield InsertOne("executions", plan.insert)
                landed = True
            else:
                landed = (yield UpdateOne("executions", plan.filter, plan.update)) == 1
        except DuplicateKeyError:
            pass  # a concurrent creator won the insert (or an earlier send of ours did)
        except DocumentTooLarge:
            raise ExecutionTooLarge(exe.id, plan.data_bytes, MAX_DOCUMENT_BYTES) from None
        except WriteError as err:
            if err.code in _TOO_LARGE_CODES:
                raise ExecutionTooLarge(exe.id, plan.data_bytes, MAX_DOCUMENT_BYTES) from None
            raise
        except (ConnectionFailure, ExecutionTimeout) as err:
            lost = err
            unsure[plan.token] = plan
        if landed:
            return _landed(st, exe, plan)
        found = yield from _read_version(exe.id, lost)
        if found is not None and found.get("commit_token") in unsure:
            # an earlier send landed, perhaps after we stopped waiting for it
            return _landed(st, exe, unsure[found["commit_token"]])
        stored = None if found is None else found.get("version")
        expected = None if plan.insert is not None else plan.old_version
        if lost is not None and stored == expected:
            if not retries_left:
                raise lost
            retries_left -= 1
            continue  # not applied (yet): send the same write again; the CAS admits one
        hi = None if found is None else found.get("seq_hi")
        if plan.insert is None and stored == plan.old_version and hi is not None and hi > floor:
            floor = hi  # our clock is behind this execution's last seq: mint above it, retry
            plan = None
            continue
        raise StoreConflict(exe.id, expected=plan.old_version, found=stored)


def _landed(st: StoreState, exe: Execution, plan: CommitPlan) -> list[int]:
    exe.version = plan.old_version + 1
    st.remember({s: exe.id for s in plan.seqs + plan.spawn_seqs})
    return plan.seqs


def _read_version(execution_id: str, lost: Optional[PyMongoError]) -> Flow[Optional[dict[str, Any]]]:
    """The stored version, seq floor and commit token. After a lost reply the server may
    still be unreachable for a moment: try a few times before giving up with the original
    error (the caller then knows nothing was confirmed, and harel redelivers)."""
    attempts = UNKNOWN_OUTCOME_RETRIES + 1 if lost is not None else 1
    for attempt in range(attempts):
        try:
            return (yield FindOne("executions", {"_id": execution_id}, projection(VersionView)))
        except ConnectionFailure:
            if attempt == attempts - 1:
                raise lost if lost is not None else ConnectionFailure("lost") from None
    return None


def append_trace(st: StoreState, execution_id: str, entry: dict[str, Any]) -> Flow[None]:
    query = {"_id": require_str("execution id", execution_id)}
    yield UpdateOne("executions", query, append_trace_update(entry, st.trace_max))


# --- relays and sweeps --------------------------------------------------------------------


class _Unknown:
    """The parent of a document not read yet (or written by harel's store, not migrated)."""


_UNKNOWN = _Unknown()


def _parent_of(doc: Mapping[str, Any]) -> Optional[str] | _Unknown:
    """A document's parent id: the promoted field, else (a document harel's store wrote)
    the one inside `data`, else unknown."""
    if "parent_id" in doc:
        parent = doc["parent_id"]
        return parent if parent is None or isinstance(parent, str) else None
    if isinstance(doc.get("data"), str):
        parent = json.loads(doc["data"]).get("parent_id")
        return parent if isinstance(parent, str) else None
    return _UNKNOWN


def in_tree(execution_id: str, parents: Mapping[str, Optional[str] | _Unknown]) -> Callable[[str], Optional[bool] | str]:
    """Whether the execution with a given id is `execution_id` or one of its descendants,
    decided by the `parent_id` chain in `parents` (id -> parent id): True, False, or the id
    of the ancestor whose parent must be read first.

    An id says nothing by itself: a user may name a root `a:b`, which is no child of `a`.
    It only rules out: harel names every child `<parent id>:<path>:<n>`, so the id of each
    descendant, and of each ancestor between it and `execution_id`, starts with
    `execution_id + ":"`. A chain leaving that prefix, ending at a root or at a document
    that no longer exists is outside the tree."""
    below = execution_id + ":"
    verdicts: dict[str, bool] = {execution_id: True}

    def decide(doc_id: str) -> Optional[bool] | str:
        chain: list[str] = []
        at: Optional[str] = doc_id
        while True:
            if at is not None and at in verdicts:
                verdict = verdicts[at]
                break
            if at is None or not at.startswith(below) or at in chain:
                verdict = False  # a root, another tree, or a cycle (never written by harel)
                break
            parent = parents.get(at, _UNKNOWN)
            if isinstance(parent, _Unknown):
                return at  # read its parent, then ask again
            chain.append(at)
            at = parent
        for member in chain:
            verdicts[member] = verdict
        return verdict

    return decide


def tree_docs(st: StoreState, within: Optional[str], docs: list[dict[str, Any]]) -> Flow[list[dict[str, Any]]]:
    """The documents among `docs` (each with `_id` and, promoted, `parent_id`) that are
    `within` or its descendants; all of them for None.

    The parent of each document is in `docs` already, so a child of `within`, or a
    descendant whose ancestors below `within` hold pending work too, is decided without
    I/O. Only an id that starts like a descendant's but whose parent is neither `within`
    nor among `docs` costs a read: one `_id` point read of the missing ancestors per level
    of the tree, projecting their parent only."""
    if within is None:
        return docs
    require_str("execution id", within)
    below = within + ":"
    candidates = [d for d in docs if d["_id"] == within or str(d["_id"]).startswith(below)]
    if not candidates:
        return []
    parents: dict[str, Optional[str] | _Unknown] = {d["_id"]: _parent_of(d) for d in docs}
    decide = in_tree(within, parents)
    proj = {"parent_id": 1, "data": 1} if st.compat else {"parent_id": 1}
    while True:
        verdicts = {d["_id"]: decide(d["_id"]) for d in candidates}
        missing = sorted({v for v in verdicts.values() if isinstance(v, str)})
        if not missing:
            return [d for d in candidates if verdicts[d["_id"]] is True]
        found = yield Find("executions", {"_id": {"$in": missing}}, proj)
        for doc_id in missing:
            parents[doc_id] = None  # gone (purged): the chain ends outside the tree
        for doc in found:
            parent = _parent_of(doc)
            parents[doc["_id"]] = None if isinstance(parent, _Unknown) else parent


def pending_outbox(st: StoreState, within: Optional[str] = None) -> Flow[list[OutboxEntry]]:
    docs = yield Find("executions", {"outbox.seq": ANY_SEQ}, projection(OutboxView))
    entries, owners = records.outbox_entries((yield from tree_docs(st, within, docs)))
    st.remember(owners)
    return entries


def ack_outbox(st: StoreState, seq: int) -> Flow[None]:
    yield UpdateOne("executions", _by_entry(st, "outbox", seq), {"$pull": {"outbox": {"seq": seq}}})


def pending_spawns(st: StoreState, within: Optional[str] = None) -> Flow[list[SpawnEntry]]:
    docs = yield Find("executions", {"spawns.seq": ANY_SEQ}, projection(SpawnView))
    entries, owners = records.spawn_entries((yield from tree_docs(st, within, docs)))
    st.remember(owners)
    return entries


def ack_spawn(st: StoreState, seq: int) -> Flow[None]:
    yield UpdateOne("executions", _by_entry(st, "spawns", seq), {"$pull": {"spawns": {"seq": seq}}})


def _by_entry(st: StoreState, array: str, seq: int) -> dict[str, Any]:
    """The filter reaching the document holding entry `seq`: by `_id` alone when this store
    has seen the entry, else by the seq index. `_id` alone is enough because an entry never
    leaves the document it was committed in (a `$pull` of one already gone changes nothing),
    and it is the cheapest write there is: mongod's `_id` fast path, on a sharded cluster
    routed to one shard, and on SecantusDB no index planning."""
    require_int("seq", seq)
    owner = st.owners.pop(seq, None)
    return {"_id": owner} if owner is not None else {f"{array}.seq": seq}


def due_timers(st: StoreState, now: float) -> Flow[list[tuple[str, str, float]]]:
    due_now: dict[str, Any] = {"next_fire": {"$lte": require_time("now", now, infinite_ok=True)}}
    if st.compat:
        # harel's documents carry no bound, and a commit of ours sets one from its own
        # timers only: until the database is migrated, every document with a timer is read
        due_now = {"$or": [due_now, {"timers": {"$nin": [{}, None]}}]}
    docs = yield Find("executions", due_now, projection(TimerView))
    due, repairs = records.due_timers(docs, now)
    for fix in repairs:
        yield UpdateOne("executions", fix["filter"], fix["update"])
    return due


def delete_timer(st: StoreState, execution_id: str, path: str, fire_at: float) -> Flow[None]:
    """Remove the timer if it still holds `fire_at`, and reset the execution's `next_fire`
    to its earliest remaining timer in the same write (an update pipeline)."""
    key = timer_field(path)
    guard = {"_id": require_str("execution id", execution_id), key: require_time("fire_at", fire_at)}
    earliest: dict[str, Any] = {"$min": {"$map": {"input": {"$objectToArray": {"$ifNull": ["$timers", {}]}}, "in": "$$this.v"}}}
    earliest = {"$ifNull": [earliest, "$$REMOVE"]}  # none left: no bound at all, never a null one
    yield UpdateOne("executions", guard, [{"$project": {key: 0}}, {"$set": {"next_fire": earliest}}])


def purge(st: StoreState, execution_id: str, expected_version: int) -> Flow[bool]:
    require_str("execution id", execution_id)
    require_int("expected version", expected_version)
    deleted = yield DeleteOne("executions", {"_id": execution_id, "version": expected_version})
    if not deleted and (yield FindOne("executions", {"_id": execution_id}, {"_id": 1})) is not None:
        return False  # it moved on: touch nothing
    # entries other executions addressed to it (the ones it issued went with its document)
    # only documents holding entries can hold one for it: the seq index finds those, and the
    # pull is addressed by _id (an index on target_id would cost every commit with an emit,
    # for the sake of a rare purge)
    pending = yield Find("executions", {"outbox.seq": ANY_SEQ}, {"outbox.target_id": 1})
    holders = [d["_id"] for d in pending if any(e.get("target_id") == execution_id for e in d.get("outbox") or ())]
    if holders:
        query = {"_id": {"$in": holders}, "outbox.target_id": execution_id}
        yield UpdateMany("executions", query, {"$pull": {"outbox": {"target_id": execution_id}}})
    if st.compat:
        yield DeleteOne("counters", {"_id": "trace:" + execution_id})  # harel's trace counter
    return bool(deleted)
